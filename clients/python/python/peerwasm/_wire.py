"""Results as data: the encoding a Python job's reply crosses back in.

Past 600 lines because the encoder and the decoder are one file on
purpose: it is sent whole into the sandbox as the guest's encoder (numpy's
and pandas' values are in `_wire_tables`, sent with it and run in this
module's namespace there).

A job's reply is bytes the guest chose. A guest whose code was taken over by
the data it parses (or a worker that answers in its place) chooses them to
hurt, so the caller must decode them with something that cannot run code:
never `pickle.loads` (any reduction in a pickle is a call the pickle names).
This module is that decoder, and the encoder the guest runs; the same file
is sent into the sandbox as part of the job's program, so the two never
drift apart.

What a result may be (anything else is a clear `TypeError` in the guest,
naming the type and where it sits in the result):

* None, bool, int, float, complex, str, bytes, bytearray;
* list, tuple, dict, set, frozenset, deque of those (dict keys and set
  members hashable), nested up to `MAX_DEPTH` deep; range;
* datetime.date, datetime.datetime (naive, with a fixed UTC offset, or in
  a `zoneinfo` zone: by its name), datetime.time, datetime.timedelta,
  decimal.Decimal;
* numpy arrays and scalars of a plain dtype (booleans, integers, floats,
  complex, datetime64/timedelta64, fixed-width bytes and unicode): dtype,
  shape and raw bytes; structured arrays (and record arrays) whose fields
  are of plain dtypes (their names, dtypes and offsets, then the raw
  records: no field may be an object, so the bytes hold no pointers);
  object arrays, element by
  element as values; masked arrays (data, mask, fill value);
* pandas DataFrame, Series and Index (also RangeIndex, MultiIndex,
  categorical, timezone-aware, interval and period columns, and the
  nullable extension dtypes), column by column as the above, with their
  `attrs`; pandas' Timestamp, Timedelta, NaT, NA, Period and Interval;
* fractions.Fraction, uuid.UUID, pathlib paths;
* an exception returned (not raised): a `RemoteError` as a raised one
  becomes (`_remote`: an instance of its own class too when that is safe);
* dict subclasses: made of Python classes (`OptimizeResult`, `Bunch`,
  `Counter`), rebuilt as the caller's loaded class by `dict.__new__` and
  `dict.update`, else (not loaded; `OrderedDict`, `defaultdict`) a plain
  dict of their items;
* instances of dataclasses, named tuples and Enums (a Flag's combined
  members too): their class's module and name, and their fields as the
  above. The caller rebuilds one only as a class it has loaded itself
  (nothing is imported, no constructor, `__post_init__` or property runs:
  `_record`; a Flag's combination is made by enum's own code only), so
  the bytes choose among the caller's own classes of those three kinds,
  never code. A named tuple whose class the caller has not loaded (made
  by `namedtuple()` in the function) comes back as one made here with
  its name and fields.

The decoder checks every length against the bytes it has, every dtype
against a plain-dtype pattern, every shape against the bytes it covers, and
the nesting depth; what fails is a `WireError` naming what is wrong.
numpy and pandas are imported only when a value needs them.

Layout: `b"PWV1"`, then one value: a tag byte, then the tag's fields. Sizes
and counts are unsigned LEB128 varints.
"""

import array as _pyarray
from collections import deque as _deque
import dataclasses as _dataclasses
import datetime as _datetime
import decimal as _decimal
import enum as _enum
import fractions as _fractions
import inspect as _inspect
import pathlib as _pathlib
import re as _re
import struct as _struct
import sys as _sys
import uuid as _uuid

MAGIC = b"PWV1"

#: How deep containers may nest (the decoder refuses deeper bytes).
MAX_DEPTH = 200

#: Lists and tuples of numbers this long or longer go as one block
#: (`_packed`).
_PACKED_FROM = 16


#: A time zone's name (`Europe/Berlin`, `Etc/GMT+5`), as tzdata spells
#: them: what else the bytes name is not looked for.
_ZONE = _re.compile(r"^[A-Za-z0-9_+-]{1,40}(/[A-Za-z0-9_+-]{1,40}){0,3}$")

#: A fixed offset as pandas names one (`str(datetime.timezone(...))`).
_OFFSET = _re.compile(r"^UTC([+-][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]{1,6})?)?)?$")


WHAT_IT_MAY_BE = (
    "a result may be numbers, strings, bytes, lists, tuples, dicts, sets, dates and times, Decimals, Fractions, "
    "UUIDs, paths, numpy arrays (of plain, structured or object dtypes, masked or not), pandas frames, series "
    "and indexes, exceptions, and dataclasses, named tuples and Enums"
)

#: The module the caller knows the guest program's own definitions by
#: (they run in the guest's `__main__`; the caller's function may live in
#: `mymodule`). Set by the program in the guest; None elsewhere.
HOME = None


class WireError(ValueError):
    """Bytes that are not a well-formed result."""


# --- encoding (run in the guest; also by the host's tests) -----------------


def _varint(n, out):
    if n < 0x80:
        out.append(n)
        return
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return


def _blob(data, out):
    _varint(len(data), out)
    out += data


def dumps(value):
    """`value` as bytes; TypeError naming what is not data."""
    out = bytearray(MAGIC)
    _encode(value, out, "result", 0)
    return bytes(out)


def dumps_reply(ok, value):
    """A job's reply, `(ok, value)`, as `dumps` writes it — what is not data
    in `value` named from the value itself (`result[2]`), not the pair."""
    out = bytearray(MAGIC)
    out += b"t\x02" + (b"T" if ok else b"F")
    _encode(value, out, "result", 1)
    return bytes(out)


# Where a value sits in the result, said only when something is wrong
# with it: a str, or `(where its container sits, step)` — an index, a
# dict key as `(key,)`, `_MEMBER` (of a set), `_KEY` (of a dict) — so that
# a million items do not each format their place.
_MEMBER, _KEY = object(), object()


def _place(where):
    if type(where) is str:
        return where
    parent, step = where
    if step is _MEMBER:
        return f"a member of {_place(parent)}"
    if step is _KEY:
        return f"a key of {_place(parent)}"
    if type(step) is tuple:
        return f"{_place(parent)}[{step[0]!r}]"
    return f"{_place(parent)}[{step}]"


def _not_data(value, where, why=""):
    module, qualname = class_name(type(value))
    name = qualname if module in ("builtins", None) else f"{module}.{qualname}"
    hint = "Convert it to one of those first (e.g. a dict of its fields)"
    if callable(getattr(value, "fit", None)) and callable(getattr(value, "get_params", None)):
        # A scikit-learn estimator, the object most often sent back so.
        hint = (
            "Return what you need of it instead: its predictions or scores, or its fitted arrays (coef_, "
            "feature_importances_, ...) — what comes back is read as data here, never unpickled, since a "
            "function taken over by its input would choose those bytes"
        )
    raise TypeError(f"{_place(where)} is a {name}{why}, which cannot be sent back: {WHAT_IT_MAY_BE}. {hint}")


def class_name(t):
    """`(module, qualname)` of the class `t` as the caller knows it: one of
    the guest program's own (`__main__` there) by `HOME`."""
    return (HOME if t.__module__ == "__main__" and HOME else t.__module__), t.__qualname__


def _encode(v, out, where, depth):
    if depth > MAX_DEPTH:
        raise TypeError(f"{_place(where)} nests deeper than {MAX_DEPTH} levels")
    t = type(v)
    if t is str:
        data = v.encode("utf-8", "surrogatepass")
        if len(data) < 0x80:  # its length one byte: most strings
            out += b"s" + bytes([len(data)]) + data
        else:
            out += b"s"
            _blob(data, out)
    elif v is None:
        out += b"N"
    elif t is bool:
        out += b"T" if v else b"F"
    elif t is int:
        out += b"i"
        _blob(v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True), out)
    elif t is float:
        out += b"f" + _struct.pack("<d", v)
    elif t is complex:
        out += b"c" + _struct.pack("<dd", v.real, v.imag)
    elif t is bytes or t is bytearray:
        out += b"b" if t is bytes else b"B"
        _blob(bytes(v), out)
    elif t in (list, tuple) and len(v) >= _PACKED_FROM and _packed(v, out):
        pass
    elif t in (list, tuple, set, frozenset):
        out += {list: b"l", tuple: b"t", set: b"e", frozenset: b"z"}[t]
        _varint(len(v), out)
        for i, item in enumerate(v):
            _encode(item, out, (where, i if t in (list, tuple) else _MEMBER), depth + 1)
    elif t is dict:
        out += b"d"
        _varint(len(v), out)
        for key, item in v.items():
            _encode(key, out, (where, _KEY), depth + 1)
            _encode(item, out, (where, (key,)), depth + 1)
    elif t is _datetime.datetime:
        if v.tzinfo is not None and v.utcoffset() is None:
            _not_data(v, where, " with a time zone that has no fixed offset")
        key = getattr(v.tzinfo, "key", None) if type(v.tzinfo).__module__ == "zoneinfo" else None
        # In a named zone (`ZoneInfo("Europe/Berlin")`): the instant, and
        # the zone's name, so that it comes back in that zone.
        out += b"D" if key is None else b"E"
        _blob(v.isoformat().encode(), out)
        if key is not None:
            _blob(key.encode(), out)
    elif t is _datetime.date:
        out += b"y"
        _blob(v.isoformat().encode(), out)
    elif t is _datetime.time:
        out += b"h"
        _blob(v.isoformat().encode(), out)
    elif t is _datetime.timedelta:
        out += b"j"
        for part in (v.days, v.seconds, v.microseconds):
            _encode(part, out, where, depth + 1)
    elif t is _decimal.Decimal:
        out += b"m"
        _blob(str(v).encode(), out)
    elif t is _fractions.Fraction:
        out += b"q"
        _encode(v.numerator, out, where, depth + 1)
        _encode(v.denominator, out, where, depth + 1)
    elif t is _uuid.UUID:
        out += b"u"
        _blob(v.bytes, out)
    elif t is _deque:
        out += b"K"
        _encode(v.maxlen, out, where, depth + 1)
        _encode(list(v), out, where, depth + 1)
    elif t is range:
        out += b"G"
        for part in (v.start, v.stop, v.step):
            _encode(part, out, where, depth + 1)
    elif t in _PATHS:
        out += b"p" if isinstance(v, _pathlib.Path) else b"o"
        _blob(str(v).encode("utf-8", "surrogateescape"), out)
    elif t.__module__.split(".")[0] == "numpy":
        _encode_numpy(v, out, where, depth)
    elif t.__module__.split(".")[0] == "pandas":
        _encode_pandas(v, out, where, depth)
    else:
        _encode_record(v, out, where, depth)


def _packed(v, out):
    """A long list or tuple of floats only, or of ints only that fit in 64
    bits, as one block of 8-byte numbers (tag `L`: its kind, `l` or `t`,
    then `d` or `q`), not item by item — a million floats in milliseconds,
    not seconds. False (nothing written) for any other."""
    first = type(v[0])
    if first is float and all(type(x) is float for x in v):
        code = "d"
    elif first is int and all(type(x) is int for x in v):
        code = "q"
    else:
        return False
    try:
        block = _pyarray.array(code, v)
    except OverflowError:
        return False
    if _sys.byteorder != "little":
        block.byteswap()
    out += b"L" + (b"l" if type(v) is list else b"t") + code.encode()
    _blob(block.tobytes(), out)
    return True


def _encode_record(v, out, where, depth):
    """An Enum member (by name), a named tuple (its items) or a dataclass
    instance (its fields by name), after its class's module and name."""
    t = type(v)
    if isinstance(v, _enum.Enum):
        # A member by its name; a Flag's combination of members (`R|W`)
        # or its empty value by the int it stands for.
        combined = isinstance(v, _enum.Flag) and t._member_map_.get(v.name) is not v
        kind, fields = b"E", int(v._value_) if combined else v.name
    elif isinstance(v, tuple) and isinstance(getattr(t, "_fields", None), tuple):
        # Its fields' names too: the caller may not have the class (one
        # made by `namedtuple(...)` inside the function).
        kind, fields = b"Q", (list(t._fields), list(v))
    elif _dataclasses.is_dataclass(t):
        kind, fields = b"C", {f.name: getattr(v, f.name) for f in _dataclasses.fields(v) if hasattr(v, f.name)}
    elif isinstance(v, BaseException):
        # Returned, not raised (`except OSError as e: return e`): as the
        # caller meets a raised one, its type's name, message and traceback.
        kind, fields = b"X", _error_fields(v)
    elif isinstance(v, dict):
        if not _python_mapping(t):  # OrderedDict, defaultdict: a plain dict
            return _encode(dict(v), out, where, depth)
        kind, fields = b"M", (dict(v), dict(getattr(v, "__dict__", {})))
    else:
        _not_data(v, where)
    if "<locals>" in t.__qualname__ and kind != b"X":
        _not_data(v, where, " (a class defined inside a function)")
    out += b"R" + kind
    for name in class_name(t):
        _blob(name.encode(), out)
    _encode(fields, out, where, depth + 1)


def _error_fields(error):
    """An exception's type name, message and traceback (where it was
    raised, when it was)."""
    try:
        message = str(error)
    except Exception:
        message = f"<{type(error).__name__}: its message could not be made>"
    if error.__traceback__ is None:
        traceback = "(returned by the function, not raised)\n"
    else:
        import traceback as _traceback

        traceback = "".join(_traceback.format_exception(type(error), error, error.__traceback__))
    return (type(error).__name__, message, traceback)


def _python_mapping(cls):
    """Whether `cls` is a dict subclass made of Python classes only (scipy's
    `OptimizeResult`, scikit-learn's `Bunch`, `Counter`) — one a dict's
    items and an instance's attributes are all of, which `dict.__new__`
    can make. A class written in C (`OrderedDict`, `defaultdict`) keeps
    state of its own there."""
    if type(cls) is not type or not issubclass(cls, dict):
        return False
    for c in cls.__mro__:
        if c is dict:
            return True
        # A class of C: a static type, or (Python 3.12 and later make many
        # of them heap types: `defaultdict`) one whose methods are C's.
        if not c.__flags__ & _HEAP_TYPE or any(type(m) in _C_METHODS for m in vars(c).values()):
            return False
    return False


# `Py_TPFLAGS_HEAPTYPE`: a class made by a `class` statement, or by C code
# that asks for one.
_HEAP_TYPE = 1 << 9
# What a class written in C holds for its methods: slot wrappers, method
# and class-method descriptors.
_C_METHODS = (type(dict.__init__), type(dict.keys), type(dict.__dict__["fromkeys"]))
# The paths sent as such (their module is `pathlib._local` on Python 3.13).
_PATHS = tuple(
    getattr(_pathlib, n) for n in ("PurePath", "PurePosixPath", "PureWindowsPath", "Path", "PosixPath", "WindowsPath")
)


# --- decoding (run by the caller: bytes a guest chose) ---------------------


class _Reader:
    def __init__(self, data):
        self.data = memoryview(data)
        self.pos = 0

    def take(self, n, what):
        pos = self.pos
        if n > len(self.data) - pos:
            raise WireError(f"truncated: {what} needs {n} bytes, {len(self.data) - pos} are left")
        self.pos = pos + n
        return self.data[pos : pos + n]

    def byte(self, what):
        pos = self.pos
        if pos >= len(self.data):
            raise WireError(f"truncated: {what} needs 1 bytes, 0 are left")
        self.pos = pos + 1
        return self.data[pos]

    def varint(self, what):
        # One byte for any size under 128: most of them.
        pos = self.pos
        if pos < len(self.data) and self.data[pos] < 0x80:
            self.pos = pos + 1
            return self.data[pos]
        n, shift = 0, 0
        while True:
            byte = self.byte(what)
            n |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return n
            shift += 7
            if shift > 63:
                raise WireError(f"{what}: a size past 2^64")

    def sized(self, what):
        """The bytes its length prefix announces, as a view; a length of
        one byte (most of them) read inline."""
        data, pos = self.data, self.pos
        if pos < len(data) and data[pos] < 0x80 and pos + 1 + data[pos] <= len(data):
            end = pos + 1 + data[pos]
            self.pos = end
            return data[pos + 1 : end]
        return self.take(self.varint(what), what)

    def blob(self, what):
        return bytes(self.sized(what))

    def text(self, what):
        try:
            return str(self.sized(what), "utf-8", "surrogatepass")
        except UnicodeDecodeError as e:
            raise WireError(f"{what} is not UTF-8: {e}") from None

    def count(self, what):
        # Every item takes at least one byte: a count past what is left is
        # a lie, refused before anything is allocated for it.
        n = self.varint(what)
        if n > len(self.data) - self.pos:
            raise WireError(f"truncated: {what} claims {n} items, {len(self.data) - self.pos} bytes are left")
        return n


def loads(data):
    """The value `data` encodes; WireError if it is not a well-formed result."""
    if bytes(data[: len(MAGIC)]) != MAGIC:
        raise WireError("not a peerwasm result (it does not start with PWV1)")
    r = _Reader(data)
    r.pos = len(MAGIC)
    try:
        value = _decode(r, 0)
    except WireError:
        raise
    except Exception as e:  # whatever the bytes made a constructor raise: they are not a result
        raise WireError(f"{type(e).__name__}: {e}"[:1000]) from None
    if r.pos != len(r.data):
        raise WireError(f"{len(r.data) - r.pos} bytes after the value")
    return value


def _decode(r, depth):
    if depth > MAX_DEPTH:
        raise WireError(f"nested deeper than {MAX_DEPTH} levels")
    pos = r.pos
    if pos >= len(r.data):
        raise WireError("truncated: a tag needs 1 bytes, 0 are left")
    r.pos = pos + 1
    code = r.data[pos]
    common = _COMMON.get(code)
    if common is not None:
        return common(r, depth)
    tag = bytes([code])
    if tag == b"c":
        re_, im = _struct.unpack("<dd", r.take(16, "a complex"))
        return complex(re_, im)
    if tag == b"b":
        return r.blob("bytes")
    if tag == b"B":
        return bytearray(r.blob("a bytearray"))
    if tag == b"L":
        return _unpacked(r)
    if tag in (b"e", b"z"):
        return (set if tag == b"e" else frozenset)(_items(r, depth))
    if tag == b"D":
        return _datetime.datetime.fromisoformat(r.text("a datetime"))
    if tag == b"E":
        instant, key = _datetime.datetime.fromisoformat(r.text("a datetime")), r.text("a time zone")
        if instant.utcoffset() is None or not _ZONE.match(key):
            raise WireError(f"a datetime in a zone named {key[:100]!r}, or with no offset")
        import zoneinfo  # its keys are names of files under its zone directories, checked as such

        return instant.astimezone(zoneinfo.ZoneInfo(key))
    if tag == b"y":
        return _datetime.date.fromisoformat(r.text("a date"))
    if tag == b"h":
        return _datetime.time.fromisoformat(r.text("a time"))
    if tag == b"j":
        days, seconds, micros = (_int(r, depth) for _ in range(3))
        return _datetime.timedelta(days=days, seconds=seconds, microseconds=micros)
    if tag == b"m":
        return _decimal.Decimal(r.text("a Decimal"))
    if tag == b"q":
        numerator, denominator = _int(r, depth), _int(r, depth)
        return _fractions.Fraction(numerator, denominator)
    if tag == b"u":
        return _uuid.UUID(bytes=r.blob("a UUID"))
    if tag in (b"p", b"o"):
        text = r.blob("a path").decode("utf-8", "surrogateescape")
        return (_pathlib.Path if tag == b"p" else _pathlib.PurePosixPath)(text)
    if tag == b"K":
        maxlen, items = _decode(r, depth + 1), _decode(r, depth + 1)
        if not (maxlen is None or type(maxlen) is int) or type(items) is not list:
            raise WireError("a deque is not (maxlen, items)")
        return _deque(items, maxlen)
    if tag == b"G":
        return range(_int(r, depth), _int(r, depth), _int(r, depth))
    if tag == b"R":
        return _record(r, depth)
    if tag == b"a":
        return _array(r)
    if tag == b"g":
        return _array(r)[()]
    if tag == b"U":
        return _structured(r, depth)
    if tag == b"Y":
        return _objects(r, depth)
    if tag == b"H":
        return _masked(r, depth)
    if tag == b"P":
        return _frame(r, depth)
    if tag == b"S":
        pd = _pandas()
        name = _decode(r, depth + 1)
        index = _index(r, depth)
        series = pd.Series(_values(r, depth), index=index, name=name, copy=False)
        return _with_attrs(series, r, depth)
    if tag == b"I":
        return _index(r, depth)
    if tag in (b"Z", b"A", b"W", b"J", b"O", b"V"):
        return _pandas_scalar(tag, r, depth)
    raise WireError(f"unknown tag {tag!r}")


def _items(r, depth):
    """A container's items."""
    return [_decode(r, depth + 1) for _ in range(r.count("a container"))]


def _dict(r, depth):
    out = {}
    for _ in range(r.count("a dict")):
        key = _decode(r, depth + 1)
        out[key] = _decode(r, depth + 1)
    return out


#: The tags most values are made of, each decoded without the others'
#: tests (decoding a million-item dict: 3.1 s -> 1.8 s).
_COMMON = {
    ord("N"): lambda r, depth: None,
    ord("T"): lambda r, depth: True,
    ord("F"): lambda r, depth: False,
    ord("i"): lambda r, depth: int.from_bytes(r.sized("an int"), "little", signed=True),
    ord("f"): lambda r, depth: _struct.unpack("<d", r.take(8, "a float"))[0],
    ord("s"): lambda r, depth: r.text("a str"),
    ord("l"): _items,
    ord("t"): lambda r, depth: tuple(_items(r, depth)),
    ord("d"): _dict,
}


def _unpacked(r):
    """A list or tuple `_packed` wrote."""
    kind, code = bytes([r.byte("a packed list's kind")]), chr(r.byte("a packed list's numbers"))
    if kind not in (b"l", b"t") or code not in ("d", "q"):
        raise WireError(f"a packed list of kind {kind!r} and numbers {code!r}")
    data = r.blob("a packed list")
    if len(data) % 8:
        raise WireError(f"a packed list of {len(data)} bytes, not 8 per number")
    block = _pyarray.array(code)
    block.frombytes(data)
    if _sys.byteorder != "little":
        block.byteswap()
    return block.tolist() if kind == b"l" else tuple(block)


def _zone(name):
    """A pandas time zone's name as the bytes give it, when it is one: a
    tzdata name or a fixed offset (`UTC+01:00`). Anything else is refused
    before pandas reads it: it opens and parses whatever regular file of
    the caller's a `dateutil/<path>` name names."""
    if not (_ZONE.match(name) or _OFFSET.match(name)):
        raise WireError(f"a time zone named {name[:100]!r}")
    return name


def _int(r, depth):
    v = _decode(r, depth + 1)
    if type(v) is not int:
        raise WireError(f"expected an int, found a {type(v).__name__}")
    return v


def _str(r, depth):
    v = _decode(r, depth + 1)
    if type(v) is not str:
        raise WireError(f"expected a str, found a {type(v).__name__}")
    return v


def loaded_class(module, qualname):
    """The class `module.qualname` names among the modules this process
    has loaded — looked up in their namespaces: never imported, no module
    `__getattr__` run — or None."""
    found = _sys.modules.get(module)
    for part in qualname.split("."):
        found = vars(found).get(part) if found is not None and hasattr(found, "__dict__") else None
    return found if isinstance(found, type) else None


def _record(r, depth):
    """A dataclass instance, named tuple or Enum member, rebuilt as the
    class of that module and name this process has loaded — looked up in
    namespaces, never imported, never run: no `__init__`, `__new__` or
    `__post_init__` is called, fields are stored as they are (a slot's
    own descriptor, else the instance's dict)."""
    kind = bytes([r.byte("a record's kind")])
    module, qualname = r.text("a module"), r.text("a class name")
    cls = loaded_class(module, qualname)
    fields = _decode(r, depth + 1)
    if kind == b"M":
        return _mapping(cls, fields)
    if kind == b"X":
        return _error_value(module, qualname, fields)
    if kind == b"Q" and cls is None:
        return _made_tuple(module, qualname, fields)
    want = {b"E": _enum.Enum, b"Q": tuple, b"C": object}.get(kind)
    if want is None or not isinstance(cls, type) or not issubclass(cls, want):
        raise WireError(
            f"the result holds a {module}.{qualname}, which is not a class of that kind this process has loaded "
            f"(import {module} to read it)"
        )
    if kind == b"E":
        member = vars(cls).get("_member_map_", {}).get(fields) if type(fields) is str else _flag(cls, fields)
        if member is None:
            raise WireError(f"{qualname} has no member {fields!r}")
        return member
    if kind == b"Q":
        names = _inspect.getattr_static(cls, "_fields", None)
        if not isinstance(names, tuple) or not _tuple_fields(fields) or tuple(fields[0]) != names:
            count = len(fields[1]) if _tuple_fields(fields) else "those"
            raise WireError(f"{qualname} is not a named tuple of {count} fields here")
        return tuple.__new__(cls, fields[1])
    declared = _inspect.getattr_static(cls, "__dataclass_fields__", None)
    if type(declared) is not dict or type(fields) is not dict or not set(fields) <= set(declared):
        raise WireError(f"{qualname} is not a dataclass with those fields here")
    obj = object.__new__(cls)
    for name, value in fields.items():
        slot = _inspect.getattr_static(cls, name, None)
        if type(slot).__name__ == "member_descriptor":
            slot.__set__(obj, value)
        else:
            vars(obj)[name] = value
    return obj


def _flag(cls, value):
    """The combination of `cls`'s members (or its empty value) that the int
    `value` stands for, when `cls` is a Flag made by enum's own code (no
    metaclass, `_missing_` or `__new__` of the caller's runs) and `value`
    holds only its members' bits; else None. Made as `cls(value)` makes it."""
    if type(value) is not int or type(cls) is not _enum.EnumMeta or not issubclass(cls, _enum.Flag):
        return None
    if _inspect.getattr_static(cls, "_missing_", None) is not _OWN_MISSING:
        return None
    if _inspect.getattr_static(cls, "__new__", None) not in _OWN_NEW:
        return None
    mask = 0
    for member in vars(cls).get("_member_map_", {}).values():
        mask |= member._value_ if type(member._value_) is int else 0
    if value < 0 or value & ~mask:
        return None
    known = vars(cls).get("_value2member_map_", {}).get(value)
    if known is not None:
        return known
    # enum keeps every combination it makes for good: a reply naming ever
    # new ones would grow that without end.
    global _FLAGS_MADE
    if _FLAGS_MADE >= _FLAGS_MOST:
        return None
    _FLAGS_MADE += 1
    return cls(value)


# What enum's own Flags are made by (as a class's attribute, as its dict
# holds it).
_OWN_MISSING = _enum.Flag.__dict__["_missing_"]
_OWN_NEW = (_enum.Enum.__dict__["__new__"], getattr(_enum.Enum.__dict__["__new__"], "__func__", None))
#: Flag combinations made here for results (enum keeps each one), and the
#: most this process makes.
_FLAGS_MADE, _FLAGS_MOST = 0, 4096


def _tuple_fields(fields):
    """Whether a named tuple's fields are `(names, values)`, as many names
    as values, the names strs."""
    return (
        type(fields) is tuple
        and len(fields) == 2
        and all(type(f) is list for f in fields)
        and len(fields[0]) == len(fields[1])
        and all(type(n) is str for n in fields[0])
    )


#: Named tuple classes made for results whose class this process has not
#: loaded, by module, name and fields; at most `_MADE_MOST` of at most
#: `_MADE_FIELDS` fields (past that a plain tuple), so that replies naming
#: ever new ones cannot fill memory.
_MADE = {}
_MADE_MOST, _MADE_FIELDS = 256, 256


def _made_tuple(module, qualname, fields):
    """A named tuple whose class this process has not loaded (made by
    `namedtuple(...)` inside the function, or a module only the sandbox
    has): one made here with its name and fields, as `namedtuple` makes
    them (the names must be identifiers: nothing is evaluated from them)."""
    if not _tuple_fields(fields):
        raise WireError(f"a named tuple {qualname} is not (names, values)")
    names, values = fields
    key = (module, qualname, tuple(names))
    cls = _MADE.get(key)
    if cls is None:
        if len(_MADE) >= _MADE_MOST or len(names) > _MADE_FIELDS:
            return tuple(values)
        import collections

        cls = collections.namedtuple(qualname.rpartition(".")[2], names, module=module)
        _MADE[key] = cls
    return tuple.__new__(cls, values)


def _error_value(module, qualname, fields):
    """An exception returned as (or inside) a value: a `RemoteError`, an
    instance of its own class too when this process has it and may make it
    (`_remote`)."""
    if type(fields) is not tuple or len(fields) != 3 or not all(type(f) is str for f in fields):
        raise WireError("an exception is not (type, message, traceback)")
    from . import _remote

    type_name, message, traceback = fields
    return _remote.remote_error(type_name, message, traceback, None, f"{module}:{qualname}")


def _mapping(cls, fields):
    """A dict subclass's instance: made by `dict.__new__` and filled by
    `dict.update` (neither runs the class's code) when this process has
    loaded it and it is made of Python classes; else its items as a plain
    dict (`OptimizeResult` of a scipy this process never imported: `res["x"]`)."""
    if type(fields) is not tuple or len(fields) != 2 or not all(type(f) is dict for f in fields):
        raise WireError("a mapping is not (items, attributes)")
    items, attributes = fields
    if cls is None or not _python_mapping(cls):
        return items
    obj = dict.__new__(cls)
    dict.update(obj, items)
    if attributes:
        if not all(type(k) is str for k in attributes) or not hasattr(obj, "__dict__"):
            raise WireError(f"{cls.__qualname__}'s attributes cannot be set here")
        vars(obj).update(attributes)
    return obj


# numpy's and pandas' values (`_wire_tables`). In the guest the program runs
# both files as one module, and this import has no package to come from.
try:
    from ._wire_tables import (  # noqa: E402
        _array, _encode_numpy, _encode_pandas, _frame, _index, _masked, _objects, _pandas, _pandas_scalar,
        _structured, _values, _with_attrs,
    )
except ImportError:
    if __package__:  # on the host it must be there
        raise
