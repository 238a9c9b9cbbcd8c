"""Results cross back as data (`peerwasm._wire`), decoded without running
code: what a result may be round-trips, and hostile bytes are refused with
a WireError, never executed and never allowed to allocate what they claim."""

import collections
import dataclasses
import datetime
import decimal
import enum
import fractions
import pathlib
import pickle
import sys
import uuid

import numpy as np
import pytest

from peerwasm import _wire


@pytest.mark.parametrize(
    "value",
    [
        None, True, 0, -(2**70), 2**200, 1.5, 1 + 2j, "héllo", b"\x00x", bytearray(b"y"),
        [1, [2, (3,)]], {"a": {1: {2, 3}}, (1, 2): frozenset([1])},
        datetime.datetime(2020, 1, 2, 3, 4, 5, 6), datetime.date(2020, 1, 1), datetime.time(1, 2),
        datetime.timedelta(days=-1, seconds=5), decimal.Decimal("1.10"), fractions.Fraction(-2, 6),
        uuid.UUID(int=12345), pathlib.Path("/a/b.png"), pathlib.PurePosixPath("c/d"),
    ],
)
def test_plain_values_round_trip(value):
    assert repr(_wire.loads(_wire.dumps(value))) == repr(value)


def test_long_lists_of_numbers_go_as_one_block_and_come_back_as_they_were():
    floats = [float(i) / 3 for i in range(1000)] + [float("inf"), -0.0, 1e-310]
    ints = list(range(-500, 500)) + [2**63 - 1, -(2**63)]
    for value in (floats, tuple(floats), ints, tuple(ints)):
        data = _wire.dumps(value)
        assert data[4:5] == b"L" and len(data) < 8 * len(value) + 16, data[:8]
        back = _wire.loads(data)
        assert type(back) is type(value) and back == value
        assert [type(x) for x in back] == [type(x) for x in value]
    assert str(_wire.loads(_wire.dumps([float("nan")] * 20))[0]) == "nan"
    # Anything else goes item by item, as it is: a big int, bools, a mix.
    for value in ([2**64] + list(range(20)), [True] * 20, [1.0] * 10 + [1] * 10, [1] * 15):
        data = _wire.dumps(value)
        assert data[4:5] == b"l"
        back = _wire.loads(data)
        assert back == value and [type(x) for x in back] == [type(x) for x in value]


def test_numpy_arrays_and_scalars_round_trip_with_their_dtype():
    for a in [np.arange(6.0).reshape(2, 3), np.array([1, 2], dtype=">i4"), np.array(["ab", "c"]),
              np.array(["2020-01-01"], dtype="M8[D]"), np.zeros((0, 3)), np.arange(12).reshape(3, 4).T,
              np.float32(1.5), np.int64(3)]:
        back = _wire.loads(_wire.dumps(a))
        assert type(back) is type(a) and np.asarray(back).dtype == np.asarray(a).dtype
        np.testing.assert_array_equal(back, a)


def test_pandas_frames_round_trip():
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame(
        {"x": [1, 2, 3], "y": ["a", None, "c"], "z": pd.Categorical(["u", "v", "u"]),
         "t": pd.date_range("2020", periods=3, tz="Europe/Berlin"), "n": pd.array([1, None, 3], dtype="Int64")},
        index=pd.Index([10, 20, 30], name="id"),
    )
    pd.testing.assert_frame_equal(_wire.loads(_wire.dumps(df)), df)
    s = pd.Series([1.0, 2.0], name="s", index=pd.MultiIndex.from_tuples([("a", 1), ("b", 2)], names=["k", "v"]))
    pd.testing.assert_series_equal(_wire.loads(_wire.dumps(s)), s)


def test_pandas_scalars_and_interval_and_period_columns_round_trip():
    pd = pytest.importorskip("pandas")
    stamps = pd.Series(pd.date_range("2020-03-29", periods=4, freq="h", tz="Europe/Berlin"))
    scalars = [stamps.max(), stamps.max().tz_localize(None).as_unit("s"), stamps.max() - stamps.min(), pd.NaT,
               pd.Period("2020-03", "M"), pd.Interval(0.5, 2.0, "left")]
    back = _wire.loads(_wire.dumps(scalars))
    assert back == scalars and [type(b) for b in back] == [type(v) for v in scalars]
    assert back[0].tz is not None and str(back[0].tz) == "Europe/Berlin" and back[1].unit == "s"
    assert back[3] is pd.NaT
    # `describe()` of a frame with times: an object column of Timestamps.
    frame = pd.DataFrame({"t": stamps, "x": [1.0, 2.0, 3.0, None]})
    pd.testing.assert_frame_equal(_wire.loads(_wire.dumps(frame.describe(include="all"))), frame.describe(include="all"))
    # `pd.cut(...).value_counts()`: an index of intervals; periods by month.
    counts = pd.cut(pd.Series([1, 2, 3, 7, 9]), 3).value_counts()
    pd.testing.assert_series_equal(_wire.loads(_wire.dumps(counts)), counts)
    monthly = pd.Series([1, 2], index=pd.period_range("2020-01", periods=2, freq="M"))
    pd.testing.assert_series_equal(_wire.loads(_wire.dumps(monthly)), monthly)
    with pytest.raises(_wire.WireError, match="closed on 'sideways'"):
        _wire.loads(b"PWV1V" + _wire.dumps(1)[4:] + _wire.dumps(2)[4:] + _wire.dumps("sideways")[4:])


def test_what_is_not_data_is_refused_naming_its_type_and_place():
    class Reduces:
        def __reduce__(self):
            return (eval, ("1",))

    with pytest.raises(TypeError, match=r"result\['a'\]\[0\] is a .*Reduces"):
        _wire.dumps({"a": [Reduces()]})
    # An object array goes element by element: one that is not data is
    # named by its place.
    with pytest.raises(TypeError, match=r"result\[1\] is a object"):
        _wire.dumps(np.array([1, object()]))
    with pytest.raises(TypeError, match="a field of a dtype that is not plain"):
        _wire.dumps(np.zeros(2, dtype=[("a", "f8", (3,))]))


@pytest.mark.parametrize(
    "junk, why",
    [
        (pickle.dumps((True, 1)), "does not start with PWV1"),
        (b"cos\nsystem\n(S'true'\ntR.", "does not start with PWV1"),
        (b"PWV1", "truncated"),
        (b"PWV1l\xff\xff\xff\xff\x0f", "claims 4294967295 items"),
        (b"PWV1" + b"l\x01" * 1000 + b"N", "deeper than"),
        (b"PWV1a\x03|O8\x01\x01\x00", "not a plain dtype"),
        (b"PWV1a\x03<f8\x01\xff\xff\xff\xff\x0f\x00", "needs 34359738360 bytes"),
        (b"PWV1e\x01l\x00", "unhashable"),
        (b"PWV1NN", "after the value"),
        (b"PWV1Q", "unknown tag"),
        (b"PWV1Lxd\x00", "packed list of kind"),
        (b"PWV1Lld\x03abc", "not 8 per number"),
        (b"PWV1Llq\xff\xff\xff\xff\x0f", "truncated"),
    ],
)
def test_hostile_bytes_are_refused_as_data(junk, why):
    with pytest.raises(_wire.WireError, match=why):
        _wire.loads(junk)


@dataclasses.dataclass
class Point:
    x: float
    tags: list = dataclasses.field(default_factory=list)

    def __post_init__(self):
        Point.made += 1


Point.made = 0


@dataclasses.dataclass(frozen=True, slots=True)
class Frozen:
    a: int
    b: str


class Color(enum.Enum):
    RED = "r"
    BLUE = "b"


Pair = collections.namedtuple("Pair", "left right")


class Perm(enum.Flag):
    R = 4
    W = 2
    X = 1


class Missing(enum.Flag):
    """A Flag whose own `_missing_` would run: bytes naming a combination
    of its members are refused."""

    A = 1
    B = 2

    @classmethod
    def _missing_(cls, value):
        raise AssertionError("never called")


class Guarded:
    """Not a dataclass, named tuple or Enum: bytes naming it are refused."""

    def __init__(self):
        raise AssertionError("never called")


def test_dataclasses_named_tuples_and_enums_round_trip_as_this_processs_own_classes():
    value = {"p": Point(1.5, [Color.RED]), "f": Frozen(2, "x"), "pair": Pair(Color.BLUE, (1, 2)), "e": Color.BLUE}
    made = Point.made
    back = _wire.loads(_wire.dumps(value))
    assert back == value
    assert type(back["p"]) is Point and type(back["f"]) is Frozen and type(back["pair"]) is Pair
    assert back["e"] is Color.BLUE and back["p"].tags[0] is Color.RED
    # Rebuilt without running the class's code: no __post_init__.
    assert Point.made == made
    with pytest.raises(dataclasses.FrozenInstanceError):
        back["f"].a = 3


def _record(kind, module, qualname, fields):
    out = bytearray(b"PWV1R" + kind)
    for text in (module, qualname):
        _wire._blob(text.encode(), out)
    return bytes(out) + _wire.dumps(fields)[4:]


@pytest.mark.parametrize(
    "kind, module, qualname, fields, why",
    [
        # A class of a module this process has not loaded: never imported.
        (b"C", "antigravity", "Anything", {}, "not a class of that kind"),
        # Loaded, but not of the kind the bytes claim: not built.
        (b"C", "os", "_wrap_close", {}, "not a class of that kind|not a dataclass"),
        (b"C", __name__, "Guarded", {}, "not a dataclass"),
        (b"Q", "subprocess", "Popen", ["true"], "not a class of that kind"),
        (b"E", __name__, "Point", "x", "not a class of that kind"),
        # Functions are not classes, whatever the bytes call them.
        (b"C", "os", "system", {"command": "true"}, "not a class of that kind"),
        # Fields the class does not declare, members it does not have.
        (b"C", __name__, "Point", {"x": 1, "__class__": 2}, "not a dataclass with those fields"),
        (b"E", __name__, "Color", "GREEN", "no member 'GREEN'"),
        (b"Q", __name__, "Pair", (["left"], [1]), "not a named tuple of 1 fields"),
        (b"Q", __name__, "Pair", (["right", "left"], [1, 2]), "not a named tuple of 2 fields"),
        # An int names a combination of a Flag's members only.
        (b"E", __name__, "Color", 6, "no member 6"),
        (b"E", __name__, "Perm", 8, "no member 8"),
        (b"E", __name__, "Perm", -1, "no member -1"),
        (b"E", __name__, "Missing", 3, "no member 3"),
    ],
)
def test_records_naming_what_is_not_the_callers_own_kind_are_refused(kind, module, qualname, fields, why):
    assert "antigravity" not in sys.modules
    with pytest.raises(_wire.WireError, match=why):
        _wire.loads(_record(kind, module, qualname, fields))
    assert "antigravity" not in sys.modules


class _Counting(type):
    """A metaclass whose code would run if the class were hashed or
    combined: an error naming its class must not."""

    ran = 0

    def __hash__(cls):
        _Counting.ran += 1
        return 1


class Metered(Exception, metaclass=_Counting):
    pass


def test_an_errors_class_is_made_catchable_only_without_running_code_of_the_callers():
    from peerwasm import _remote

    def error(kind):
        return _remote.remote_error("E", "m", "tb", None, kind)

    assert isinstance(error("builtins:ValueError"), ValueError)
    for kind in (f"{__name__}:Metered", f"{__name__}:Guarded", "os:system", "antigravity:Fly", "builtins:SystemExit"):
        assert type(error(kind)) is _remote.RemoteError, kind
    assert _Counting.ran == 0 and "antigravity" not in sys.modules


class Bunch(dict):
    """A dict with attribute access, as scipy's `OptimizeResult` and
    scikit-learn's `Bunch` are: rebuilt without its `__init__`."""

    def __init__(self, **fields):
        raise AssertionError("never called")

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def test_dict_subclasses_come_back_as_their_class_or_as_a_plain_dict():
    bunch = dict.__new__(Bunch)
    dict.update(bunch, x=np.arange(3.0), success=True)
    back = _wire.loads(_wire.dumps(bunch))
    assert type(back) is Bunch and back.success is True and np.array_equal(back.x, bunch.x)
    counts = collections.Counter("abracadabra")
    assert _wire.loads(_wire.dumps(counts)) == counts and type(_wire.loads(_wire.dumps(counts))) is collections.Counter
    # Classes written in C keep state of their own: their items, as a dict.
    for value in (collections.OrderedDict(a=1, b=2), collections.defaultdict(list, a=[1])):
        back = _wire.loads(_wire.dumps(value))
        assert type(back) is dict and back == value
    # A class this process has not loaded (a library only the sandbox
    # imported), or one named by hostile bytes that dict.__new__ must not
    # make: the items alone.
    items = _wire.dumps(({"x": 1}, {}))[4:]
    for module, qualname in (("antigravity", "Result"), ("collections", "OrderedDict"), ("os", "environ")):
        out = bytearray(b"PWV1RM")
        for text in (module, qualname):
            _wire._blob(text.encode(), out)
        back = _wire.loads(bytes(out) + items)
        assert type(back) is dict and back == {"x": 1}, (module, back)
    assert "antigravity" not in sys.modules



def test_datetimes_in_named_zones_come_back_in_their_zone():
    zoneinfo = pytest.importorskip("zoneinfo")
    try:
        berlin = zoneinfo.ZoneInfo("Europe/Berlin")
    except zoneinfo.ZoneInfoNotFoundError:
        pytest.skip("no time zone data here")
    # The hour a clock goes back: the second 02:30 (fold=1) stays itself.
    for moment in (datetime.datetime(2024, 10, 27, 2, 30, fold=1, tzinfo=berlin),
                   datetime.datetime(2024, 7, 1, 12, tzinfo=berlin)):
        back = _wire.loads(_wire.dumps(moment))
        assert back.tzinfo is berlin and back == moment and back.utcoffset() == moment.utcoffset()
    for key, why in (("../../etc/passwd", "zone named"), ("No/Such_Zone", "No time zone"), ("Europe", "Is a directory"),
                     ("a" * 5000, "zone named"), ("Etc/./UTC", "zone named")):
        junk = b"PWV1E" + _wire.dumps("2024-01-01T00:00:00+00:00")[5:] + _wire.dumps(key)[5:]
        with pytest.raises(_wire.WireError, match=why):
            _wire.loads(junk)


def test_pandas_time_zones_are_names_never_paths():
    pd = pytest.importorskip("pandas")
    fixed = pd.Series(pd.date_range("2024", periods=2, tz=datetime.timezone(datetime.timedelta(hours=-3, minutes=-30))))
    pd.testing.assert_series_equal(_wire.loads(_wire.dumps(fixed)), fixed)
    # pandas opens and parses the file a `dateutil/<path>` zone names: the
    # bytes may not name one of the caller's files.
    stamp = _wire.dumps(pd.Timestamp("2024-01-01", tz="UTC"))
    for tz in ("dateutil//dev/stdin", "dateutil/../../etc/passwd", "/etc/localtime"):
        junk = stamp.replace(b"\x03UTC", bytes([len(tz)]) + tz.encode())
        assert junk != stamp
        with pytest.raises(_wire.WireError, match="a time zone named"):
            _wire.loads(junk)
    frame = _wire.dumps(pd.DataFrame({"t": pd.date_range("2024", periods=2, tz="UTC")}))
    with pytest.raises(_wire.WireError, match="a time zone named"):
        _wire.loads(frame.replace(b"\x03UTC", b"\x13dateutil//dev/stdin"))


def test_flags_deques_ranges_and_na_round_trip():
    pd = pytest.importorskip("pandas")
    value = [Perm.R | Perm.W, Perm(0), Perm.X, collections.deque([1, "a"], maxlen=5), range(2, 11, 3), pd.NA]
    back = _wire.loads(_wire.dumps(value))
    assert back[:5] == value[:5] and back[5] is pd.NA
    assert [type(b) for b in back[:5]] == [type(v) for v in value[:5]] and back[3].maxlen == 5


def test_named_tuples_of_classes_not_loaded_here_come_back_made_with_their_fields():
    data = _wire.dumps([Pair(1, 2), Pair(3, 4)]).replace(b"test_wire", b"elsewhere")
    first, second = _wire.loads(data)
    assert first == (1, 2) and first.right == 2 and type(first).__name__ == "Pair" and type(first) is not Pair
    assert type(second) is type(first) and type(_wire.loads(data)[0]) is type(first)
    # Names that are not identifiers are never made into code.
    with pytest.raises(_wire.WireError, match="identifiers"):
        _wire.loads(_record(b"Q", "nowhere", "T", (["x=__import__('os')"], [1])))


def test_numpys_named_tuples_come_back_as_numpys():
    eig, svd = np.linalg.eig(np.diag([2.0, 3.0])), np.linalg.svd(np.eye(2))
    back = _wire.loads(_wire.dumps([eig, svd]))
    assert type(back[0]) is type(eig) and back[0].eigenvalues.tolist() == [2.0, 3.0]
    assert type(back[1]) is type(svd) and back[1].S.tolist() == [1.0, 1.0]
    with pytest.raises(TypeError, match="numpy.nditer"):
        _wire.dumps(np.nditer(np.zeros(2)))


def test_structured_object_and_masked_arrays_round_trip():
    aligned = np.dtype([("a", "i1"), ("b", "<f8")], align=True)
    arrays = [
        np.array([(1, 2.5), (3, -1.0)], dtype=[("a", "<i4"), ("b", ">f8")]),
        np.zeros(3, dtype=aligned),
        np.array([1, "a", None, [2, 3]], dtype=object),
        np.array([[1, 2.5], [None, "x"]], dtype=object),
        np.ma.array([1.0, 2.0, 3.0], mask=[False, True, False], fill_value=-9.0),
    ]
    for a in arrays:
        back = _wire.loads(_wire.dumps(a))
        assert type(back) is type(a) and back.dtype == a.dtype and back.shape == a.shape
        assert back.tolist() == a.tolist()
    masked = _wire.loads(_wire.dumps(arrays[-1]))
    assert masked.mask.tolist() == [False, True, False] and masked.fill_value == -9.0
    record = _wire.loads(_wire.dumps(arrays[0][1]))
    assert type(record) is np.void and record["a"] == 3 and record["b"] == -1.0
    # `DataFrame.to_records()`: a record array, its fields as attributes.
    records = _wire.loads(_wire.dumps(arrays[0].view(np.recarray)))
    assert type(records) is np.recarray and records.b.tolist() == [2.5, -1.0]


def test_frames_keep_their_attrs():
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"x": [1.0]})
    frame.attrs = {"units": "mV", "rate": 1000}
    back = _wire.loads(_wire.dumps({"f": frame, "s": frame["x"]}))
    assert back["f"].attrs == {"units": "mV", "rate": 1000} and back["s"].attrs == frame["x"].attrs


def test_returned_exceptions_come_back_as_remote_errors_of_their_class():
    from peerwasm import RemoteError

    try:
        {}["missing"]
    except KeyError as e:
        caught = e
    back = _wire.loads(_wire.dumps({"ok": 1, "errors": [caught, ValueError("bad row")]}))
    raised, returned = back["errors"]
    assert isinstance(raised, KeyError) and isinstance(raised, RemoteError) and raised.index is None
    assert "'missing'" in raised.message and "Traceback" in raised.traceback
    assert isinstance(returned, ValueError) and returned.message == "bad row"
    assert "returned by the function" in returned.traceback


@pytest.mark.parametrize(
    "junk, why",
    [
        # A structured array's fields must be plain: an object field would
        # make raw bytes into pointers.
        (b"PWV1Ua" + _wire.dumps([["a", "|O", 0]])[4:] + b"F\x08\x01\x01\x08" + b"\x00" * 8, "plain dtype"),
        (b"PWV1Ua" + _wire.dumps([["a", "<f8", 0]])[4:] + b"F\x08\x01\x02\x08" + b"\x00" * 8, "needs 16 bytes"),
        (b"PWV1Y\x01\x03" + _wire.dumps([1, 2])[4:], "shape \\(3,\\) holds 2 items"),
        (b"PWV1H" + _wire.dumps(np.zeros(2))[4:] + _wire.dumps(np.zeros(3, bool))[4:] + b"N", "mask of its shape"),
        (b"PWV1K" + _wire.dumps("x")[4:] + _wire.dumps([])[4:], "not \\(maxlen, items\\)"),
        (b"PWV1G" + _wire.dumps(1)[4:] + _wire.dumps(2)[4:] + _wire.dumps(0)[4:], "must not be zero"),
    ],
)
def test_hostile_bytes_of_the_newer_kinds_are_refused(junk, why):
    with pytest.raises(_wire.WireError, match=why):
        _wire.loads(junk)


def test_named_tuple_classes_made_here_are_bounded():
    made = dict(_wire._MADE)
    try:
        for i in range(_wire._MADE_MOST + 10):
            back = _wire.loads(_record(b"Q", "nowhere", f"T{i}", (["x"], [i])))
        assert len(_wire._MADE) == _wire._MADE_MOST and type(back) is tuple and back == (_wire._MADE_MOST + 9,)
    finally:
        _wire._MADE.clear()
        _wire._MADE.update(made)
    wide = [f"f{i}" for i in range(_wire._MADE_FIELDS + 1)]
    assert type(_wire.loads(_record(b"Q", "nowhere", "Wide", (wide, list(range(len(wide))))))) is tuple


def test_flag_combinations_made_here_are_bounded():
    Wide = enum.IntFlag("Wide", [f"B{i}" for i in range(20)], module=__name__)
    globals()["Wide"] = Wide
    made = _wire._FLAGS_MADE
    try:
        _wire._FLAGS_MADE = _wire._FLAGS_MOST - 2
        for value in (3, 5, 3):  # a combination made once is reused
            assert _wire.loads(_record(b"E", __name__, "Wide", value)) == value
        with pytest.raises(_wire.WireError, match="no member 6"):
            _wire.loads(_record(b"E", __name__, "Wide", 6))
    finally:
        _wire._FLAGS_MADE = made
        del globals()["Wide"]
