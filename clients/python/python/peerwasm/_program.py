"""The program each job of a Python function runs in the sandbox: the
result encoder (`_wire`), the function's module's imports and the
definitions it uses (`_travel`), its data globals (`_globals`), its
source, and a main that reads the item's pickled arguments on stdin and
replies with its value as data on stdout (`_DRIVER`). `program` makes it
for a plain function, a decorated one, a bound method (`_arguments.Method`)
or a library's function (imported there by its names).

What crosses is source, not pickled code: the caller's Python and the
sandbox's (3.15) need not match, and code pickled by value does not
survive that.
"""

import ast
import inspect
import os
import sys

from . import _arguments, _arrays, _globals, _nested, _sources, _travel, _wire, _wire_tables


# The program each job runs: the result encoder (`_wire`, in a module of
# its own so that its names never meet the function's), the function's
# imports and source, then a main that reads the pickled arguments on stdin
# and writes the reply, as data, on stdout. What the function prints goes to
# stderr, so it cannot spoil the reply. A raised exception is replied with
# its type, message and traceback, and exit code 1 (so a map stops at it,
# or retries it).
_DRIVER = """\
import io as _pw_io
import pickle as _pw_pickle
import sys as _pw_sys
import traceback as _pw_traceback
import types as _pw_types
_pw_wire = _pw_types.ModuleType("_pw_wire")
exec(compile({wire_source!r}, "peerwasm/_wire.py", "exec"), _pw_wire.__dict__)
_pw_wire.HOME = {home!r}

class _pw_Missing:
    # A name the function's module imports that the sandbox could not (or
    # a global whose value does not load here): unused, it costs nothing
    # (a host-only import); used, it raises the error, saying what failed.
    def __init__(self, what, error, why=None):
        object.__setattr__(self, "_pw_why", (what, error, why or f"{{type(error).__name__}}: {{error}}"))
    def _pw_raise(self, *_args, **_kwargs):
        what, error, why = object.__getattribute__(self, "_pw_why")
        message = f"the sandbox could not {{what}} ({{why}}), and the function uses it"
        try:
            raised = type(error)(message)
        except Exception:
            raised = RuntimeError(message)
        raise raised
    __getattr__ = __call__ = __getitem__ = __iter__ = __len__ = __bool__ = _pw_raise

def _pw_guarded(source, path):
    # A module of the caller's own (a file beside the function's module, or
    # one of a package of theirs), compiled with its top-level imports
    # guarded as the function's module's are: one the sandbox cannot do
    # (a host-only package) binds a stand-in that raises its error when
    # used, instead of failing every item of a function that never uses it.
    import ast
    tree = ast.parse(source, path)
    body = []
    for node in tree.body:
        if not isinstance(node, (ast.Import, ast.ImportFrom)) or getattr(node, "module", None) == "__future__":
            body.append(node)
            continue
        for alias in node.names:
            one = ast.Import(names=[alias]) if isinstance(node, ast.Import) else ast.ImportFrom(
                module=node.module, names=[alias], level=node.level)
            name = (alias.asname or alias.name.split(".")[0]) if isinstance(node, ast.Import) else (
                alias.asname or alias.name)
            stand_in = ast.parse(
                "pass" if alias.name == "*" else
                f"{{name}} = _pw_Missing({{'run `' + ast.unparse(one) + '`'!r}}, _pw_e)").body
            guard = ast.Try(body=[one], handlers=[ast.ExceptHandler(ast.Name("ImportError", ast.Load()), "_pw_e",
                            stand_in)], orelse=[], finalbody=[])
            for n in ast.walk(guard):
                ast.copy_location(n, node)
            body.append(guard)
    tree.body = body
    return compile(ast.fix_missing_locations(tree), path, "exec")

def _pw_guard_own(paths):
    # The caller's own packages (`paths`, put on sys.path) load through
    # `_pw_guarded`; other packages as they are.
    import importlib.machinery as machinery
    class Loader(machinery.SourceFileLoader):
        def source_to_code(self, data, path, *_args, **_kwargs):
            return _pw_guarded(data, path)
        def exec_module(self, module):
            module.__dict__.setdefault("_pw_Missing", _pw_Missing)
            super().exec_module(module)
    def hook(path):
        if not any(path == p or path.startswith(p + "/") for p in paths):
            raise ImportError("not a package of the caller's own")
        return machinery.FileFinder(path, (Loader, machinery.SOURCE_SUFFIXES))
    _pw_sys.path_hooks.insert(0, hook)
    for p in list(_pw_sys.path_importer_cache):
        if any(p == q or p.startswith(q + "/") for q in paths):
            del _pw_sys.path_importer_cache[p]

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

    # A class or function of the caller's module (`mymodule.Point` in an
    # argument) is this program's own copy: its definition travelled with
    # the function.
    def find_class(self, module, name):
        own = globals().get(name) if module == _pw_wire.HOME else None
        if (isinstance(own, type) or callable(own)) and type(own) is not _pw_Missing:
            return own
        try:
            return super().find_class(module, name)
        except (ImportError, AttributeError):
            found = globals().get(name)
            if (isinstance(found, type) or callable(found)) and type(found) is not _pw_Missing:
                return found
            raise

def _pw_unpickling(error, what="an argument"):
    # Why a pickle of the caller's (an argument, a data global: `what`)
    # does not load here, and what to do: its class's package is not in
    # the sandbox, or the sandbox's version of it reads it differently.
    if isinstance(error, ModuleNotFoundError) and error.name == "pyarrow":
        return (
            f"pyarrow is not in the sandbox ({{what}} holds pandas data kept in pyarrow, `dtype=...[pyarrow]`): "
            "convert it to numpy's first, `.convert_dtypes(dtype_backend='numpy_nullable')` (text is converted "
            "for you)"
        )
    if isinstance(error, AttributeError) and "has no attribute" in str(error):
        return (
            f"{{error}} ({{what}} names a function or class of the caller's that did not come with the function: "
            "define it at the top level of the script, or of a module of yours)"
        )
    if isinstance(error, ModuleNotFoundError) and error.name:
        return (
            f"{{error.name!r}} is not in the sandbox ({{what}} is an object of one of its classes): give "
            "it with packages= if it is pure Python, or pass plainer data (numbers, strings, numpy arrays, "
            "lists, dicts, pandas frames): a compiled library other than numpy, scipy, pandas and "
            "scikit-learn cannot run in the sandbox"
        )
    loaded = [f"{{m}} {{_pw_sys.modules[m].__version__}}" for m in ("numpy", "pandas") if m in _pw_sys.modules]
    return (
        f"{{type(error).__name__}}: {{error}} (the sandbox has Python {{_pw_sys.version.split()[0]}}"
        + "".join(", " + v for v in loaded)
        + "; an object pickled by a newer version of its library than the sandbox's may not load: pass "
        "plainer data, or match the versions)"
    )

def _pw_load(name, data, kind):
    # A data global of the function's module, as the caller has it
    # (peerwasm/_globals.py); a set was sent sorted.
    try:
        value = _pw_Unpickler(_pw_io.BytesIO(data)).load()
        return {{"set": set, "frozenset": frozenset}}[kind](value) if kind else value
    except Exception as error:
        return _pw_Missing(f"load {{name}} as the caller has it", error, _pw_unpickling(error, name))

def _pw_value(name, kind):
    # One of the program's own, bound where its statement stood.
    return _pw_load(name, _pw_values.pop(name), kind)

{values}
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

def _pw_hint(error):
    # What to do about an error the sandbox itself caused, said after it.
    # A path outside what the function was given does not exist for it
    # (WASI opens only under the directories granted): reading the
    # caller's `data.csv`, or writing a figure, failed with a bare "No
    # such file or directory" for a file the caller can see.
    if isinstance(error, OSError) and error.filename is not None and error.errno in _pw_NOT_GIVEN:
        return (
            " (peerwasm: the function sees only the directories it is given, nothing else of the machine that "
            "called it: files=[the directory] to read from one, at the same path; outputs=[the directory] to "
            "write into one)"
        )
    return _pw_parallel(error)

import errno as _pw_errno
_pw_NOT_GIVEN = {{_pw_errno.ENOENT, _pw_errno.EACCES, _pw_errno.EPERM, _pw_errno.EROFS, getattr(_pw_errno, "ENOTCAPABLE", -1)}}

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

def _pw_main():
    reply_to = _pw_sys.stdout.buffer
    _pw_sys.stdout = _pw_sys.stderr
    code = 0
    try:
        given = _pw_sys.stdin.buffer
        args, kwargs = _pw_Unpickler(given).load()
        # The data globals that came with the item (after its arguments).
        rest = given.read()
        for name, (data, kind) in (_pw_pickle.loads(rest) if rest else {{}}).items():
            globals()[name] = _pw_load(name, data, kind)
    except Exception as e:
        why = "the sandbox could not unpickle the item's arguments: " + _pw_unpickling(e)
        reply, code = (False, _pw_error_reply(e, why)), 1
    else:
        try:
            reply = (True, {name}(*args, **kwargs))
        except BaseException as e:
            reply, code = (False, _pw_error_reply(e, str(e) + _pw_hint(e))), 1
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
    """`_wire` and `_wire_tables` as the one module the guest runs."""
    texts = []
    for module in (_wire, _wire_tables):
        with open(module.__file__, encoding="utf-8") as f:
            texts.append(f.read())
    return "\n\n".join(texts)


def _classes_of(fn, classes):
    """Names of `classes` (the classes and functions those arguments'
    pickles name) that `fn`'s own module defines at its top level: they
    travel with it."""
    return {
        t.__name__
        for t in classes
        if getattr(t, "__module__", None) == fn.__module__ and "." not in getattr(t, "__qualname__", ".")
    }


def program(fn, values=(), sys_path=(), classes=None, workdir=None, arrays=None, carried=None, own_path=()):
    """The program that runs `fn` in the sandbox (see `_DRIVER`): its
    source, its module's imports, and the module's definitions it uses (and
    the classes of `values`, its arguments) — its data globals as their
    values (`_globals`) — with `sys_path` (the guest paths of its
    `packages=`; `own_path`: those of the caller's own packages, whose
    imports are guarded) first on `sys.path`, in `workdir` (the caller's working
    directory, when the sandbox sees it: `_mounts`). `arrays`: the
    `_arrays.Arrays` of the arguments, not yet finished, which the data
    globals' own large arrays join; when it holds any, numpy is imported as
    the program loads (each item's arguments then load them: in a map,
    from its snapshot). Raises TypeError for what has no source of its own
    to send. `classes`: those the arguments' pickles name, when they were
    pickled already (else found in `values`). `carried`: a list when the
    small data globals may go with each item instead (`_globals.ByValue.split`):
    the bytes to append to each item's input are put in it."""
    place = f"_pw_guard_own({list(own_path)!r})\n" if own_path else ""
    place += f"_pw_sys.path[:0] = {list(sys_path)!r}\n"
    if workdir is not None:
        place += f"__import__('os').chdir({workdir!r})\n"
    if classes is None:
        classes = set()
        _arguments.pickled(tuple(values), classes)
    path = None if isinstance(fn, _arguments.Method) else _import_path(fn)
    if isinstance(fn, _arguments.Method):
        home = fn.func if not _travel.installed(fn.func) else _callers_own(classes)
    else:
        home = _callers_own(classes) if path is not None else fn
    by_value = _globals.ByValue(home, arrays, carried is not None) if inspect.isfunction(home) else None
    if isinstance(fn, _arguments.Method):
        source = _method_program(fn, home, classes, place, by_value)
    elif path is not None:
        source = _import_program(path, home, classes, place, by_value)
    elif (inner := _decorated_def(fn)) is not None:
        source = _program_of(inner, classes, place, by_value, decorated=True)
    else:
        source = _program_of(fn, classes, place, by_value, decorated=False)
    loader = by_value.loader() if by_value is not None else "_pw_values = {}"
    if arrays is not None and arrays.moved:
        loader = "__import__('numpy')\n" + loader
    if carried is not None:
        carried.append(by_value.with_each_item() if by_value is not None else b"")
    return source.replace(_VALUES_HERE, loader, 1)


# Where the program's data globals are made ready (`_DRIVER`'s `{values}`):
# known only once its definitions are.
_VALUES_HERE = "# <peerwasm: the data globals' pickles>"


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


def _program_of(fn, classes, place, by_value, decorated):
    """`program` of a plain function: its `def` with its decorators when
    `decorated` (the module's name for it is what they made), else alone."""
    _refuse_unsendable(fn)
    if _nested.is_nested(fn):
        # A lambda, or a function defined inside another: its own text, and
        # the variables it reads of the functions around it (`_nested`).
        node, source, defaults = _nested.definition(fn)
        closure = {**_nested.closure(fn), **defaults}
        label = "the lambda" if fn.__name__ == "<lambda>" else fn.__qualname__
        return _driver(
            fn, node, source, _nested.name_of(fn), classes, place, label=label, by_value=by_value, closure=closure
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
    return _driver(fn, node, source, fn.__name__, classes, place, by_value=by_value)


def _method_program(method, home, classes, place, by_value):
    """`program` of a bound method: a function that calls it on its
    instance or class (the call's first argument) by name, so that the
    method runs as its class — which travels with it — defines it. `home`:
    the function whose module's definitions travel (`program`)."""
    _refuse_unsendable(method.func)
    source = f"def _pw_method(_pw_self, *args, **kwargs):\n    return getattr(_pw_self, {method.attr!r})(*args, **kwargs)\n"
    # A class of the standard library or an installed package (a fitted
    # model's `predict`) comes by import in the sandbox, as its instance's
    # pickle names it: nothing of its module is sent (but what of the
    # caller's its instance names: `home`).
    node = ast.parse(source).body[0]
    return _driver(home, node, source, "_pw_method", classes, place, home is not None, method.func.__qualname__, by_value)


def _callers_own(classes):
    """A function of the caller's own code among what the arguments'
    pickles name — `partial(minimize, my_loss)` names `my_loss` — or a
    method of a class of theirs there: its module's definitions then
    travel with a library's function as they do with the caller's own
    (else the guest cannot find `__main__.my_loss`). None when the pickles
    name nothing of the caller's. The first by name, so that the same
    arguments make the same program."""
    own = sorted(
        (t for t in classes if (inspect.isfunction(t) or inspect.isclass(t)) and _of_the_callers(t)),
        key=lambda t: (t.__module__, t.__qualname__),
    )
    for t in own:
        if inspect.isfunction(t):
            return t
    for cls in own:
        for member in vars(cls).values():
            if inspect.isfunction(member) and member.__module__ == cls.__module__:
                return member
    return None


def _of_the_callers(t):
    """Whether the function or class `t` is the caller's own code, not
    Python's or an installed package's."""
    module = getattr(t, "__module__", None)
    if not isinstance(module, str) or module == "builtins" or module.split(".")[0] in sys.stdlib_module_names:
        return False
    return not _travel.installed(t)


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


def _import_program(path, home, classes, place, by_value):
    """`program` of a library function (or one of a package of the
    caller's own, which travels: `_travel.local_packages`): imported in the
    sandbox by its names (`_import_path`) as the program loads — so a
    map's snapshot holds the import, not each item — and called; nothing
    of its module is sent, but what of the caller's its arguments name
    (`partial(minimize, my_loss)`): `home`'s module's definitions."""
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
    return _driver(
        home, ast.parse(source), source, "_pw_imported", classes, place, own=home is not None,
        label=f"{module}.{qualname}", by_value=by_value,
    )


def _driver(fn, node, source, name, classes, place, own=True, label=None, by_value=None, closure=None):
    """`_DRIVER` filled for calling `name`, defined by `source` (parsed:
    `node`), with what it uses of `fn`'s module when that is the caller's
    `own` code (else `fn` and `node` are not read), placed by `place` (its
    `sys.path` and working directory: `program`); `label`: what its
    messages call it (`name`)."""
    made, reads = _made_in_arguments(fn, classes, own, label or name)
    definitions = (
        _travel.definitions(fn, node, _classes_of(fn, classes) | reads, own=name, values=by_value, closure=closure)
        + "".join(f"\n\n{ast.unparse(n)}" for n in made)
        if own
        else ""
    )
    # What the functions import as they run, for a map's snapshot to hold
    # (`_warm`): read from their text, not run here.
    imports = _travel.imports(fn) if own else ""
    inner, reached = _inner_imports([node, *made], definitions, imports)
    definitions += f"\n\n_pw_inner_imports = {inner!r}\n_pw_reached = {reached!r}"
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
        imports=imports,
        definitions=definitions,
        values=_VALUES_HERE,
        source=source,
        home=fn.__module__ if own else None,
        name=name,
        label=label or name,
        place=place,
        array_tag=_arrays.TAG,
        arrays_dir=_arrays.GUEST,
    )


def _inner_imports(nodes, definitions, imports):
    """`(imported, reached)`: what the functions among `nodes` and
    `definitions` (source) import as they run, for a map's snapshot to
    hold (`_warm`), in the order first met. `imported`: the modules they
    import inside their bodies (`def fit(...): from sklearn.linear_model
    import LogisticRegression`), absolute ones — for `from m import n`,
    `m` and `m.n`, which may be a submodule. `reached`: `(module, a[, b])`
    for each `m.a.b` they read of a module the program's `imports` bind —
    a library that loads its submodules on first use (`scipy.stats` after
    `import scipy`) loads it then; one that does not is not made to. Each
    item paid again for such an import, since each starts from the
    snapshot (scikit-learn's: 1.75 s of each fit; scipy.stats': ~1 s)."""
    trees = [*nodes, *_sources._parsed([definitions])]
    modules = {}  # a name the imports bind -> the module it may be
    for n in (n for tree in _sources._parsed([imports]) for n in ast.walk(tree)):
        if isinstance(n, ast.Import):
            modules.update({a.asname or a.name.split(".")[0]: a.name if a.asname else a.name.split(".")[0] for a in n.names})
        elif isinstance(n, ast.ImportFrom) and not n.level and n.module:
            modules.update({a.asname or a.name: f"{n.module}.{a.name}" for a in n.names if a.name != "*"})
    names, reached = [], []
    for tree in trees:
        for scope in ast.walk(tree):
            if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            for n in ast.walk(scope):
                if isinstance(n, ast.Import):
                    names += [a.name for a in n.names]
                elif isinstance(n, ast.ImportFrom) and not n.level and n.module and n.module != "__future__":
                    names += [n.module, *(f"{n.module}.{a.name}" for a in n.names if a.name != "*")]
                elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in modules:
                    reached.append((modules[n.value.id], n.attr))
                elif (
                    isinstance(n, ast.Attribute)
                    and isinstance(n.value, ast.Attribute)
                    and isinstance(n.value.value, ast.Name)
                    and n.value.value.id in modules
                ):
                    reached.append((modules[n.value.value.id], n.value.attr, n.attr))
    return list(dict.fromkeys(names)), list(dict.fromkeys(reached))


def _made_in_arguments(fn, classes, own, label):
    """`(factories, reads)`: the program's functions that make again the
    lambdas and functions made inside another that the arguments hold
    (`_nested.factory`; the pickles call them: `_arguments._made_again`),
    in a stable order, and the global names they read. They must be of
    `fn`'s module, the caller's `own` code, whose definitions travel."""
    held = sorted(filter(_arguments.made_again, classes), key=_nested.factory_name)
    factories, reads = [], set()
    for t in held:
        if not own or t.__module__ != fn.__module__:
            raise TypeError(
                f"an argument holds a lambda or a function defined inside another ({t.__qualname__} of "
                f"{t.__module__}), which travels only from the module of the function run ({label}): define it "
                "there or at the top level of a module, or pass the values it needs"
            )
        node, names = _nested.factory(t)
        factories.append(node)
        reads.update(names)
    return factories, reads


def _refuse_unsendable(fn):
    """TypeError, saying why, for what cannot run as itself in the sandbox:
    not a plain function, an async or generator function."""
    if not inspect.isfunction(fn):
        raise TypeError(f"{fn!r} is not a plain Python function: give a `def` function (or a .wasm path)")
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        raise TypeError(
            f"{fn.__name__} is an async function: give a plain `def` (one that calls asyncio.run itself if it awaits)"
        )
    if inspect.isgeneratorfunction(fn):
        raise TypeError(
            f"{fn.__name__} is a generator function: what it yields cannot come back one by one; "
            "return a list (`return list(...)`) instead"
        )
