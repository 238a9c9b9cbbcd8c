"""Results cross back as data (`peerwasm._wire`), decoded without running
code: what a result may be round-trips, and hostile bytes are refused with
a WireError, never executed and never allowed to allocate what they claim."""

import datetime
import decimal
import pickle

import numpy as np
import pytest

from peerwasm import _wire


@pytest.mark.parametrize(
    "value",
    [
        None, True, 0, -(2**70), 2**200, 1.5, 1 + 2j, "héllo", b"\x00x", bytearray(b"y"),
        [1, [2, (3,)]], {"a": {1: {2, 3}}, (1, 2): frozenset([1])},
        datetime.datetime(2020, 1, 2, 3, 4, 5, 6), datetime.date(2020, 1, 1), datetime.time(1, 2),
        datetime.timedelta(days=-1, seconds=5), decimal.Decimal("1.10"),
    ],
)
def test_plain_values_round_trip(value):
    assert repr(_wire.loads(_wire.dumps(value))) == repr(value)


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


def test_what_is_not_data_is_refused_naming_its_type_and_place():
    class Reduces:
        def __reduce__(self):
            return (eval, ("1",))

    with pytest.raises(TypeError, match=r"result\['a'\]\[0\] is a .*Reduces"):
        _wire.dumps({"a": [Reduces()]})
    with pytest.raises(TypeError, match="dtype object"):
        _wire.dumps(np.array([object()]))


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
    ],
)
def test_hostile_bytes_are_refused_as_data(junk, why):
    with pytest.raises(_wire.WireError, match=why):
        _wire.loads(junk)
