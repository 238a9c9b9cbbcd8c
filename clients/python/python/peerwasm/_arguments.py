"""What a call's arguments become on their way into the sandbox: what
binds arguments to the function taken off (`unbind`: a partial's, a bound
method's instance), each call's arguments pickled — the classes they name
noted, to travel with the function, and large numpy arrays moved as files
(`_arrays`) — checked against what a job's input may be, and the mounts
the jobs are given (`inputs`).

Pickles go only this way, into the sandbox, where a pickle can do no more
than the function itself; results come back as data (`_wire`).
"""

import collections
import copyreg
import functools
import importlib
import inspect
import io
import pickle
import sys

from . import _arrays, _mounts, _nested, _peerwasm, _travel


PROTOCOL = 4


class ClassFinder(pickle.Pickler):
    """A pickler that notes the class of every object it pickles (and every
    class and function pickled by its name): what an argument's pickle will
    ask the guest to find, however deep in it — an attribute's attribute, a
    dict's value."""

    def __init__(self, file, found, arrays=None):
        super().__init__(file, protocol=PROTOCOL)
        self.found, self.arrays = found, arrays

    def persistent_id(self, obj):
        # A large array goes as a file, by its content's hash (`_arrays`).
        return self.arrays.persistent_id(obj) if self.arrays is not None else None

    def reducer_override(self, obj):
        if type(obj) in (_InProgram, _Program):
            return obj.__reduce__()
        self.found.add(obj if isinstance(obj, type) or inspect.isroutine(obj) else type(obj))
        if isinstance(obj, type) and _made_on_the_fly(obj):
            # Made again in the sandbox, once per pickle (pickle memoizes it).
            return collections.namedtuple, (obj.__name__, obj._fields)
        if made_again(obj):
            return _made_again(obj)
        if inspect.ismodule(obj) and sys.modules.get(obj.__name__) is obj:
            # A module (a closure's `np`): imported there by its name.
            return importlib.import_module, (obj.__name__,)
        return _as_the_sandbox_reads(obj)


def made_again(obj):
    """Whether `obj` is a function pickle cannot find again by its names
    (a lambda, one made inside another), which the sandbox's program makes
    again from its text when an argument holds it (`_made_again`)."""
    return inspect.isfunction(obj) and _travel.found_by_name(obj.__module__, obj.__qualname__) is not obj


def _made_again(fn):
    """A lambda, or a function made inside another, that an argument holds
    (`partial(sorted, key=lambda r: r[1])`, a closure in a dict): as a call
    of the program's function that makes it again from its text
    (`_nested.factory`, which the program defines for each such function
    the pickles name), given its default values and the values it reads of
    the functions around it — pickled here in turn, as cloudpickle sends a
    closure's cells."""
    cells = _nested.closure(fn)
    if any(value is fn for value in cells.values()):
        raise TypeError(
            f"{fn.__qualname__}, which an argument holds, reads itself through a variable of the function around "
            "it: define it with `def` at the top level of a module"
        )
    made = (fn.__defaults__, fn.__kwdefaults__, *(cells[name] for name in fn.__code__.co_freevars))
    return _InProgram(_nested.factory_name(fn)), made


class _Program:
    """Pickles as the sandbox's program module (its `__main__`)."""

    def __reduce__(self):
        return importlib.import_module, ("__main__",)


class _InProgram:
    """Pickles as what the sandbox's program defines as `name`."""

    def __init__(self, name):
        self.name = name

    def __reduce__(self):
        return getattr, (_Program(), self.name)

    def __call__(self, *args, **kwargs):  # (pickle asks that a reduction's first item be callable)
        raise RuntimeError(f"{self.name} is the sandbox's, called only there")


def _as_the_sandbox_reads(obj):
    """pandas objects pickled so that the sandbox's pandas reads them, when
    this process's pickles them in a way it would not (NotImplemented for
    anything else):

    - time indexes (`DatetimeIndex`, `TimedeltaIndex`) by their public
      constructor, from their values, frequency and name: pandas pickles
      them through private functions that change between releases (a
      pandas newer than the sandbox's — 3.1 against 3.0 — stores the
      frequency elsewhere, and the sandbox failed to unpickle every series
      with a regular time index: `pd.date_range(...)`, `resample`);
    - strings held by pyarrow (`_without_arrow`)."""
    pd = sys.modules.get("pandas")
    if pd is None:
        return NotImplemented
    if type(obj) in (pd.DatetimeIndex, pd.TimedeltaIndex):
        return copyreg.__newobj_ex__, (type(obj), (obj.array,), {"freq": obj.freq, "name": obj.name})
    return _without_arrow(obj, pd)


def _without_arrow(obj, pd):
    """pandas' strings held by pyarrow — its default `str` dtype wherever
    pyarrow is installed, as it is in most scientists' environments — as
    the same strings held by Python objects, the storage the sandbox has
    (it has no pyarrow, a compiled library): else every DataFrame with a
    column or an index of text failed to unpickle there. NotImplemented
    for anything else."""
    if type(obj) is pd.StringDtype and obj.storage == "pyarrow":
        return pd.StringDtype, ("python", obj.na_value)
    arrow_strings = getattr(getattr(pd, "arrays", None), "ArrowStringArray", None)
    if arrow_strings is not None and isinstance(obj, arrow_strings):
        return pd.array, (obj.to_numpy(dtype=object), pd.StringDtype("python", obj.dtype.na_value))
    return NotImplemented


def _made_on_the_fly(cls):
    """Whether `cls` is a named tuple class that cannot be found again by
    its names — made at run time, as `DataFrame.itertuples()` makes its
    rows' — which pickle would refuse: it travels as its name and fields."""
    if not (issubclass(cls, tuple) and isinstance(getattr(cls, "_fields", None), tuple)):
        return False
    return _travel.found_by_name(cls.__module__, cls.__qualname__) is not cls


def pickled(obj, found, arrays=None):
    """`obj`'s pickle, the classes in it added to `found`, its large arrays
    to `arrays` (an `_arrays.Arrays`; none: all inside the pickle)."""
    out = io.BytesIO()
    ClassFinder(out, found, arrays).dump(obj)
    return out.getvalue()


class Method:
    """A bound method's function (of an instance, or a class method's of
    its class), called on what it is bound to by name in the sandbox
    (`_method_program`)."""

    def __init__(self, method):
        owner = method.__self__
        self.func, cls = method.__func__, owner if isinstance(owner, type) else type(owner)
        self.attr = _travel.mangled(cls, self.func.__name__)
        if "." in cls.__qualname__:
            raise TypeError(
                f"{method!r} is a method of {cls.__qualname__}, a class defined inside a function: "
                "define the class at the top level of a module"
            )


def unbind(fn):
    """`fn` without what binds arguments to it — `functools.partial`
    layers, a bound method's instance, an object called as a function (its
    `__call__`): the function (a bound method's as a `Method`), and the
    arguments bound before each call's own (their keywords under the
    call's), which then travel with each call's arguments — as a process
    pool pickles them with each task."""
    bound, keywords = (), {}
    while True:
        if isinstance(fn, functools.partial):
            bound, keywords = (*fn.args, *bound), {**fn.keywords, **keywords}
            fn = fn.func
        elif inspect.ismethod(fn) and inspect.isfunction(fn.__func__):
            bound = (fn.__self__, *bound)
            return Method(fn), bound, keywords
        elif _called_as_instance(fn):
            # An object called as a function (`map(Analysis(params), xs)`):
            # its `__call__`, bound to it, as a process pool pickles it.
            fn = fn.__call__
        else:
            return fn, bound, keywords


def _called_as_instance(fn):
    """Whether `fn` is an instance of a class whose `__call__` is a Python
    function — not a function, a class, a builtin or a partial itself."""
    if isinstance(fn, type) or inspect.isroutine(fn) or isinstance(fn, functools.partial):
        return False
    return inspect.isfunction(getattr(type(fn), "__call__", None))


def inputs(fn, calls, files, packages, outputs, pool=False, indexed=False):
    """Each call's `(args, kwargs)` pickled — its large numpy arrays moved
    as files (`_arrays`; on a `pool`, only those calls share, or too large
    to go inside: `_pool_pickles`) — the classes they name, and the mounts
    the jobs of `fn` are given (with the packages of the caller's own it
    needs): to be finished once the program is made (its data globals'
    arrays join the arguments': `Mounts.finish`), and closed after the jobs
    are done. `indexed`: the calls are a map's items, and an error names
    the item."""
    classes, arrays = set(), _arrays.Arrays()
    try:
        calls = list(calls)
        if pool:
            pickles = _pool_pickles(calls, classes, arrays, indexed)
        else:
            pickles = [_pickled_call(i, call, classes, arrays, indexed) for i, call in enumerate(calls)]
        check_inputs(pickles)
        mounts = _mounts.Mounts(files, packages, outputs, arrays=arrays, local=_local_packages(fn))
    except BaseException:
        arrays.close()
        raise
    return pickles, classes, mounts


def _pickled_call(index, call, found, arrays, indexed):
    """`pickled(call, ...)`, its failure said as what cannot go to the
    sandbox and, for a map's item, which item it is."""
    try:
        return pickled(call, found, arrays)
    except (pickle.PicklingError, TypeError, AttributeError) as e:
        where = f"item {index} of the map: " if indexed else ""
        if isinstance(e, AttributeError) and "local object" not in str(e):
            # The object's own pickling failed: its error, placed.
            raise AttributeError(f"{where}{e}") from e
        if isinstance(e, TypeError) and not str(e).startswith("cannot pickle"):
            raise TypeError(f"{where}{e}") from e  # said already (a lambda refused, ...): placed
        what = (
            "holds a function or class defined inside another, which pickle cannot find again"
            if "local object" in str(e)
            else "holds what does not pickle (an open file, a lock, a generator, a connection)"
        )
        raise TypeError(
            f"{where}the arguments cannot go to the sandbox ({e}): an argument, or an object the function is bound "
            f"to, {what} — pass the values it needs, or define it at the top level of a module"
        ) from e


def _pool_pickles(calls, classes, arrays, indexed):
    """Each call pickled for a pool: a large array that several calls share
    goes as a file, once per worker; one only its own call has goes inside
    that call's pickle (so only to the worker that runs it), unless the
    pickle would then be over what an input may be — then as a file too.
    Calls without a large array are pickled once; the others twice (the
    first time with each array a stand-in: `_arrays.Census`)."""
    census, first = _arrays.Census(), []
    for i, call in enumerate(calls):
        census.begin()
        first.append(_pickled_call(i, call, classes, census, indexed))
    shared = census.shared()
    out = []
    for call, data, mine in zip(calls, first, census.per_call):
        if mine:
            data = pickled(call, classes, _arrays.Only(arrays, shared))
            if len(data) > _peerwasm.MAX_INPUT_BYTES:
                data = pickled(call, classes, arrays)
        out.append(data)
    return out


def _local_packages(fn):
    """The directories of the caller's own packages `fn` imports or is
    defined in (`_travel.local_packages`); none for a library's function."""
    target = fn.func if isinstance(fn, Method) else fn
    if not inspect.isfunction(target) or _travel.installed(target):
        return []
    return _travel.local_packages(target)


def check_inputs(inputs):
    """Refuses, before any job starts, an item whose pickled arguments are
    over what a job's input may be — embedded as on a pool, so that a map
    that works here works on a pool too."""
    limit = _peerwasm.MAX_INPUT_BYTES
    for i, data in enumerate(inputs):
        if len(data) > limit:
            where = "the arguments" if len(inputs) == 1 else f"item {i}'s arguments"
            raise ValueError(
                f"{where} pickle to {len(data) / 2**20:.1f} MiB besides the numpy arrays moved as files; "
                f"a job's input is at most {limit >> 20} MiB, embedded and on a pool alike: make large data "
                "a numpy array, or put it in a directory given as files= and pass its path"
            )
