"""numpy arrays and pandas frames, series, indexes and scalars as results:
`_wire`'s encoding of them and its decoding (see `_wire` for the whole of
it, and why nothing decoded here may run code: every dtype is checked
against a plain-dtype pattern, every shape against the bytes it covers,
every name against what it may be before a library reads it).

In a file of its own, beside `_wire` rather than in it: the two are sent
into the sandbox together and run there as one module, so neither imports
the other in the guest; on the host each imports what it uses of the other.
numpy and pandas are imported only when a value needs them.
"""

import re as _re

try:  # (imported by `_wire`, at its end; in the guest its names are this module's own)
    from ._wire import (
        WHAT_IT_MAY_BE, WireError, _blob, _decode, _encode, _encode_record, _int, _not_data, _place, _str, _varint, _zone,
    )
except ImportError:
    if __package__:
        raise


#: A plain numpy dtype: byte order, kind, item size, and a datetime unit.
#: No object ('O'), void or structured dtypes: raw bytes of those are not
#: values (structured arrays of plain fields: `_structured`).
_PLAIN_DTYPE = _re.compile(r"^[<>|=]?[biufcmMSU][0-9]{1,4}(\[[0-9]*[a-zA-Z]{1,2}\])?$")


#: The sides an interval may be closed on.
_CLOSED = frozenset(["left", "right", "both", "neither"])


#: pandas extension dtypes a column may have, by name (rebuilt with
#: `pd.array(values, dtype=name)`: a registry look-up, no code).
_PANDAS_DTYPES = frozenset(
    ["string", "str", "boolean", "Int8", "Int16", "Int32", "Int64", "UInt8", "UInt16", "UInt32", "UInt64", "Float32", "Float64"]
)


def _encode_numpy(v, out, where, depth):
    import numpy as np

    if type(v) is np.ma.MaskedArray:
        # Its data, its mask (every element's), its fill value.
        out += b"H"
        _encode_numpy(np.asarray(v.data), out, where, depth)
        _encode_numpy(np.ma.getmaskarray(v), out, where, depth)
        _encode(v.fill_value, out, f"{_place(where)}.fill_value", depth + 1)
        return
    if type(v) is np.ndarray or (type(v) is np.recarray and v.dtype.names is not None):
        scalar = False
    elif isinstance(v, np.generic):
        scalar, v = True, np.asarray(v)
    else:  # numpy's named tuples (`np.linalg.eig`'s `EigResult`), or not data
        return _encode_record(v, out, where, depth)
    dtype = v.dtype
    if dtype == object and not scalar:
        # Each element as a value of its own.
        out += b"Y"
        _shape(v, out)
        _encode(list(v.ravel(order="C")), out, where, depth + 1)
        return
    if dtype.names is not None:
        # Structured: each field's name, plain dtype and offset, then the
        # raw records.
        fields = [(name, *dtype.fields[name][:2]) for name in dtype.names]
        if not all(_PLAIN_DTYPE.match(f.str) for _, f, _ in fields):
            _not_data(v, where, f" of dtype {dtype} (a field of a dtype that is not plain)")
        # A record array (`DataFrame.to_records()`) comes back as one.
        out += b"U" + (b"g" if scalar else b"r" if type(v) is np.recarray else b"a")
        _encode([[name, f.str, offset] for name, f, offset in fields], out, where, depth + 1)
        _encode(bool(dtype.isalignedstruct), out, where, depth + 1)
        _varint(dtype.itemsize, out)
    elif _PLAIN_DTYPE.match(dtype.str):
        out += b"g" if scalar else b"a"
        _blob(dtype.str.encode(), out)
    else:
        _not_data(v, where, f" of dtype {dtype}")
    _shape(v, out)
    _blob(np.ascontiguousarray(v).tobytes(), out)


def _shape(v, out):
    _varint(v.ndim, out)
    for n in v.shape:
        _varint(n, out)


def _encode_pandas(v, out, where, depth):
    import pandas as pd

    if isinstance(v, pd.DataFrame):
        out += b"P"
        _encode_index(v.columns, out, f"{_place(where)}.columns", depth)
        _encode_index(v.index, out, f"{_place(where)}.index", depth)
        _varint(v.shape[1], out)
        for i in range(v.shape[1]):
            _encode_values(v.iloc[:, i], out, f"{_place(where)} column {v.columns[i]!r}", depth)
        _encode(dict(v.attrs), out, f"{_place(where)}.attrs", depth + 1)
    elif isinstance(v, pd.Series):
        out += b"S"
        _encode(v.name, out, f"{_place(where)}.name", depth + 1)
        _encode_index(v.index, out, f"{_place(where)}.index", depth)
        _encode_values(v, out, where, depth)
        _encode(dict(v.attrs), out, f"{_place(where)}.attrs", depth + 1)
    elif isinstance(v, pd.Index):
        out += b"I"
        _encode_index(v, out, where, depth)
    else:
        _encode_pandas_scalar(v, out, where, depth)


def _encode_pandas_scalar(v, out, where, depth):
    """pandas' own scalars: `Timestamp` (nanoseconds since the epoch, in
    UTC when it has a zone, its unit and zone), `Timedelta`, `NaT`,
    `Period` (its ordinal and frequency), `Interval` (its ends and side)."""
    import pandas as pd

    if v is pd.NaT:
        out += b"Z"
    elif v is pd.NA:
        out += b"A"
    elif isinstance(v, pd.Timestamp):
        out += b"W"
        for part in (int(v.value), v.unit, None if v.tz is None else str(v.tz)):
            _encode(part, out, where, depth + 1)
    elif isinstance(v, pd.Timedelta):
        out += b"J"
        _encode(int(v.value), out, where, depth + 1)
    elif isinstance(v, pd.Period):
        out += b"O"
        _encode(int(v.ordinal), out, where, depth + 1)
        _encode(v.freqstr, out, where, depth + 1)
    elif isinstance(v, pd.Interval):
        out += b"V"
        for part in (v.left, v.right, v.closed):
            _encode(part, out, where, depth + 1)
    else:
        _encode_record(v, out, where, depth)


def _encode_index(index, out, where, depth):
    import pandas as pd

    if isinstance(index, pd.RangeIndex):
        out += b"r"
        for part in (index.start, index.stop, index.step):
            _encode(int(part), out, where, depth + 1)
        _encode(index.name, out, f"{_place(where)}.name", depth + 1)
    elif isinstance(index, pd.MultiIndex):
        out += b"x"
        _varint(index.nlevels, out)
        for i in range(index.nlevels):
            _encode_values(index.get_level_values(i), out, f"{_place(where)} level {i}", depth)
        _encode(list(index.names), out, f"{_place(where)}.names", depth + 1)
    else:
        out += b"v"
        _encode_values(index, out, where, depth)
        _encode(index.name, out, f"{_place(where)}.name", depth + 1)


def _encode_values(values, out, where, depth):
    """A column's (or an index's) values with their dtype."""
    import numpy as np
    import pandas as pd

    dtype = values.dtype
    if isinstance(dtype, pd.CategoricalDtype):
        out += b"k"
        cat = pd.Categorical(values)
        _encode_index(cat.categories, out, f"{_place(where)} categories", depth)
        _encode_numpy(np.asarray(cat.codes), out, where, depth)
        _encode(bool(cat.ordered), out, where, depth + 1)
    elif isinstance(dtype, pd.DatetimeTZDtype):
        out += b"w"
        _encode(str(dtype.tz), out, where, depth + 1)
        _encode(str(dtype.unit), out, where, depth + 1)
        utc = pd.DatetimeIndex(values).tz_convert("UTC").tz_localize(None)
        _encode_numpy(np.asarray(utc.asi8), out, where, depth)
    elif isinstance(dtype, np.dtype) and dtype != object:
        out += b"n"
        _encode_numpy(np.asarray(values), out, where, depth)
    elif isinstance(dtype, pd.IntervalDtype):
        out += b"i"
        intervals = pd.arrays.IntervalArray(values)
        _encode(intervals.closed, out, where, depth + 1)
        _encode_values(intervals.left, out, f"{_place(where)} left ends", depth)
        _encode_values(intervals.right, out, f"{_place(where)} right ends", depth)
    elif isinstance(dtype, pd.PeriodDtype):
        out += b"d"
        # As `Period` spells it ("M"; the offset's own spelling is "ME").
        _encode(str(dtype)[len("period[") : -1], out, where, depth + 1)
        _encode_numpy(np.asarray(pd.arrays.PeriodArray(values).asi8), out, where, depth)
    elif str(dtype) in _PANDAS_DTYPES or dtype == object:
        out += b"o"
        _encode(str(dtype), out, where, depth + 1)
        items = [None if (x is pd.NA or (isinstance(x, float) and x != x and dtype != object)) else x for x in values]
        _encode(items, out, where, depth + 1)
    else:
        raise TypeError(
            f"{_place(where)} has pandas dtype {dtype}, which cannot be sent back: {WHAT_IT_MAY_BE} "
            "(convert the column, e.g. with .astype(float) or .astype(object))"
        )


def _pandas_scalar(tag, r, depth):
    """`_encode_pandas_scalar`'s scalars."""
    pd = _pandas()
    if tag == b"Z":
        return pd.NaT
    if tag == b"A":
        return pd.NA
    if tag == b"W":
        ns, unit, tz = _int(r, depth), _str(r, depth), _decode(r, depth + 1)
        if unit not in ("s", "ms", "us", "ns") or not (tz is None or type(tz) is str):
            raise WireError(f"a Timestamp of unit {unit!r} and zone {tz!r}")
        stamp = pd.Timestamp(ns, unit="ns")
        stamp = stamp if tz is None else stamp.tz_localize("UTC").tz_convert(_zone(tz))
        return stamp.as_unit(unit)
    if tag == b"J":
        return pd.Timedelta(_int(r, depth), unit="ns")
    if tag == b"O":
        return pd.Period(ordinal=_int(r, depth), freq=_str(r, depth))
    left, right, closed = _decode(r, depth + 1), _decode(r, depth + 1), _str(r, depth)
    if closed not in _CLOSED:
        raise WireError(f"an interval closed on {closed!r}")
    return pd.Interval(left, right, closed)


def _numpy():
    try:
        import numpy
    except ImportError:
        raise WireError("the result holds a numpy array: install numpy to read it") from None
    return numpy


def _pandas():
    try:
        import pandas
    except ImportError:
        raise WireError("the result holds a pandas object: install pandas to read it") from None
    return pandas


def _array(r, dtype=None):
    """An array of a plain dtype (named in the bytes), or of the structured
    `dtype` `_structured` read."""
    np = _numpy()
    if dtype is None:
        descr = r.text("a dtype")
        if not _PLAIN_DTYPE.match(descr):
            raise WireError(f"dtype {descr!r} is not a plain dtype")
        dtype = np.dtype(descr)
    shape = _read_shape(r)
    data = r.blob("an array's data")
    count = 1
    for n in shape:
        count *= n
    if count * dtype.itemsize != len(data):
        raise WireError(f"shape {shape} of {dtype} needs {count * dtype.itemsize} bytes, the array has {len(data)}")
    return np.frombuffer(data, dtype=dtype).reshape(shape).copy()


def _read_shape(r):
    ndim = r.varint("an array's dimensions")
    if ndim > 64:
        raise WireError(f"{ndim} dimensions")
    return tuple(r.varint("an array's shape") for _ in range(ndim))


def _structured(r, depth):
    """A structured array (or scalar): its fields' names, plain dtypes and
    offsets make its dtype — none of them an object, so the raw records
    hold no pointers — then its records."""
    np = _numpy()
    scalar = bytes([r.byte("a structured array's kind")])
    fields, aligned, itemsize = _decode(r, depth + 1), _decode(r, depth + 1), r.varint("a record's size")
    if scalar not in (b"a", b"g", b"r") or type(fields) is not list or not fields or type(aligned) is not bool:
        raise WireError("a structured array's fields are not a list")
    for field in fields:
        if not (type(field) is list and len(field) == 3 and type(field[0]) is str and type(field[1]) is str
                and type(field[2]) is int and _PLAIN_DTYPE.match(field[1])):
            raise WireError(f"a structured array's field is not (name, plain dtype, offset): {field!r}"[:200])
    names, formats, offsets = ([f[i] for f in fields] for i in range(3))
    dtype = np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": itemsize}, align=aligned)
    if dtype.hasobject:
        raise WireError("a structured array of objects")
    array = _array(r, dtype)
    return array[()] if scalar == b"g" else array.view(np.recarray) if scalar == b"r" else array


def _objects(r, depth):
    """An array of objects: its shape, then its elements as values."""
    np = _numpy()
    shape = _read_shape(r)
    items = _decode(r, depth + 1)
    count = 1
    for n in shape:
        count *= n
    if type(items) is not list or len(items) != count:
        raise WireError(f"an object array of shape {shape} holds {len(items) if type(items) is list else 'no'} items")
    out = np.empty(count, dtype=object)
    out[:] = items
    return out.reshape(shape)


def _masked(r, depth):
    """A masked array: its data, mask and fill value."""
    np = _numpy()
    data, mask = _decode(r, depth + 1), _decode(r, depth + 1)
    fill = _decode(r, depth + 1)
    if type(data) is not np.ndarray or type(mask) is not np.ndarray or mask.dtype != bool or mask.shape != data.shape:
        raise WireError("a masked array is not (data, a mask of its shape, fill value)")
    return np.ma.MaskedArray(data, mask=mask, fill_value=fill)


def _values(r, depth):
    """A column's values as `_encode_values` wrote them."""
    np, pd = _numpy(), _pandas()

    kind = bytes([r.byte("a column's kind")])
    if kind == b"n":
        if bytes([r.byte("an array")]) not in (b"a", b"g"):
            raise WireError("a column's values are not an array")
        return _array(r)
    if kind == b"k":
        categories = _index(r, depth)
        if bytes([r.byte("an array")]) != b"a":
            raise WireError("a categorical's codes are not an array")
        codes = _array(r)
        ordered = _decode(r, depth + 1)
        return pd.Categorical.from_codes(codes, categories=categories, ordered=bool(ordered))
    if kind == b"w":
        tz, unit = _str(r, depth), _str(r, depth)
        if bytes([r.byte("an array")]) != b"a":
            raise WireError("a datetime column's values are not an array")
        ns = _array(r)
        if ns.dtype.kind != "i":
            raise WireError("a datetime column's values are not integers")
        if unit not in ("s", "ms", "us", "ns"):
            raise WireError(f"datetime unit {unit!r}")
        return pd.DatetimeIndex(ns.astype(f"datetime64[{unit}]")).tz_localize("UTC").tz_convert(_zone(tz))
    if kind == b"o":
        dtype = _str(r, depth)
        items = _decode(r, depth + 1)
        if type(items) is not list:
            raise WireError("a column's items are not a list")
        if dtype == "object":
            out = np.empty(len(items), dtype=object)
            out[:] = items
            return out
        if dtype not in _PANDAS_DTYPES:
            raise WireError(f"pandas dtype {dtype!r} is not one a result may have")
        return pd.array(items, dtype=dtype)
    if kind == b"i":
        closed = _str(r, depth)
        if closed not in _CLOSED:
            raise WireError(f"intervals closed on {closed!r}")
        left, right = _values(r, depth), _values(r, depth)
        return pd.arrays.IntervalArray.from_arrays(left, right, closed=closed)
    if kind == b"d":
        freq = _str(r, depth)
        if bytes([r.byte("an array")]) != b"a":
            raise WireError("a period column's values are not an array")
        ordinals = _array(r)
        if ordinals.dtype != np.int64:
            raise WireError("a period column's ordinals are not 64-bit integers")
        return pd.arrays.PeriodArray(ordinals, dtype=pd.PeriodDtype(freq))
    raise WireError(f"unknown column kind {kind!r}")


def _index(r, depth):
    pd = _pandas()

    kind = bytes([r.byte("an index's kind")])
    if kind == b"r":
        start, stop, step = (_int(r, depth) for _ in range(3))
        return pd.RangeIndex(start, stop, step, name=_decode(r, depth + 1))
    if kind == b"x":
        n = r.count("a MultiIndex's levels")
        levels = [_values(r, depth) for _ in range(n)]
        names = _decode(r, depth + 1)
        return pd.MultiIndex.from_arrays(levels, names=names)
    if kind == b"v":
        values = _values(r, depth)
        return pd.Index(values, name=_decode(r, depth + 1))
    raise WireError(f"unknown index kind {kind!r}")


def _frame(r, depth):
    pd = _pandas()

    columns = _index(r, depth)
    index = _index(r, depth)
    n = r.count("a frame's columns")
    if n != len(columns):
        raise WireError(f"a frame of {len(columns)} columns sent {n}")
    data = [_values(r, depth) for _ in range(n)]
    for v in data:
        if len(v) != len(index):
            raise WireError(f"a column of {len(v)} values in a frame of {len(index)} rows")
    frame = pd.DataFrame({i: v for i, v in enumerate(data)}, index=index)
    frame.columns = columns
    return _with_attrs(frame, r, depth)


def _with_attrs(obj, r, depth):
    """A frame or series with the `attrs` (a dict) that follow it."""
    attrs = _decode(r, depth + 1)
    if type(attrs) is not dict:
        raise WireError("a frame's attrs are not a dict")
    if attrs:
        obj.attrs = attrs
    return obj

