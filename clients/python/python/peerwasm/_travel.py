"""What of a function's module travels with it into the sandbox: the
module's top-level imports (guarded, so that a host-only one is named when
used, never skipped), the user's own modules beside it (packages too:
`local_packages`, mounted as `packages=` are), and the top-level
definitions the function uses — helpers, constants, classes — as the text
that defines them *as they run now* (a module's file or a prompt's history
can hold definitions that no longer do).

Source travels, not pickled code: the caller's Python and the sandbox's
(3.15) need not match (see `_functions`).
"""

import ast
import functools
import inspect
import os
import symtable
import sys
import sysconfig
import textwrap

from . import _nested, _sources


def imports(fn):
    """The top-level import statements of `fn`'s module (or of the notebook
    cells it was defined among: `_sources.module_trees`), each guarded: the
    names of one the sandbox cannot import (a host-only package) are bound
    to a stand-in that raises its ImportError, naming it, when used — never
    skipped in silence."""
    guarded, seen = [_local_modules(fn)], set()
    for node in (n for tree in _sources.module_trees(fn) for n in _one_name_each(tree.body)):
        if isinstance(node, (ast.Import, ast.ImportFrom)) and not (
            isinstance(node, ast.ImportFrom) and node.module == "__future__"
        ):
            statement = ast.unparse(node)
            if statement in seen:
                continue
            seen.add(statement)
            if isinstance(node, ast.Import):
                names = [a.asname or a.name.split(".")[0] for a in node.names]
            else:
                names = [a.asname or a.name for a in node.names if a.name != "*"]
            guarded.append(guarded_import(statement, names))
    return "\n".join(guarded)


def guarded_import(statement, names):
    """`statement`, an import binding `names`, as code that binds each to a
    stand-in raising the import's error when used if the sandbox cannot do
    it (`_program._DRIVER`'s `_pw_Missing`)."""
    stand_ins = [f"    {name} = _pw_Missing({'run `' + statement + '`'!r}, _pw_e)" for name in names] or [
        # `from m import *` names nothing to stand in for: said.
        f"    _pw_sys.stderr.write('peerwasm: the sandbox could not run ' + {statement!r} + ': ' + str(_pw_e) + '\\n')"
    ]
    return "try:\n" + textwrap.indent(statement, "    ") + "\nexcept ImportError as _pw_e:\n" + "\n".join(stand_ins)


def _one_name_each(body):
    """The statements of `body`, an import of several names split into one
    import per name (`import dataclasses, peerwasm` → two), so that a name
    the sandbox cannot import (here `peerwasm`, a host-only package) stands
    in for itself alone, not for the others of its statement too."""
    for node in body:
        if isinstance(node, ast.Import) and len(node.names) > 1:
            yield from (ast.Import(names=[alias]) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and len(node.names) > 1:
            yield from (ast.ImportFrom(module=node.module, names=[alias], level=node.level) for alias in node.names)
        else:
            yield node


def module_name(fn):
    """The name `fn`'s module is imported by: its own, except for a script
    run as `python -m pkg.script` — `__main__` then, though its relative
    imports and its package are `pkg.script`'s (the name it was run by)."""
    if fn.__module__ == "__main__" and "get_ipython" not in fn.__globals__:
        main = sys.modules.get("__main__")
        spec = getattr(main, "__spec__", None)
        if spec is not None and getattr(main, "__dict__", None) is fn.__globals__ and spec.name:
            return spec.name
    return fn.__module__


def package_of(fn):
    """The package a script run as `python -m pkg.script` belongs to
    (`pkg`), which its relative imports (`from .helpers import f`) are
    resolved in — in the sandbox too, where the package travels
    (`local_packages`); None for anything else."""
    if fn.__module__ != "__main__" or module_name(fn) == "__main__":
        return None
    return sys.modules["__main__"].__spec__.parent or None


def _home(fn):
    """The directory of the user's own code beside `fn`: its module's (for
    a function of a package of theirs, the directory holding the package),
    or the working directory for a notebook."""
    if fn.__module__ == "__main__" and "get_ipython" in fn.__globals__:
        return os.getcwd()
    module = sys.modules.get(fn.__module__)
    file = getattr(module, "__file__", None) or ""
    home = os.path.dirname(os.path.abspath(file or os.path.join(os.getcwd(), "x")))
    for _ in range(module_name(fn).count(".") + (os.path.basename(file) == "__init__.py")):
        home = os.path.dirname(home)
    return home


def _local_package(name):
    """The directory of `name`'s top-level package when it is one of the
    user's own — a directory with `__init__.py` outside every place Python
    and installed packages live (`_installed_path`): beside the script, in
    a project's `src/`, an editable install, a checkout on PYTHONPATH —
    else None."""
    top = sys.modules.get(name.split(".")[0])
    file = getattr(top, "__file__", None)
    if not file or os.path.basename(file) != "__init__.py":
        return None
    package = os.path.dirname(os.path.abspath(file))
    return None if _installed_path(package) else package


def _installed_path(path):
    """Whether `path` lies where Python and installed packages live: the
    standard library, this environment's and the user's site-packages, the
    interpreter's prefixes' `lib` directories."""
    return _under(path, _roots(everywhere=True))


@functools.lru_cache(maxsize=2)
def _roots(everywhere):
    """Where this interpreter keeps the standard library and installed
    packages (`sysconfig`); `everywhere`: also the user's site-packages and
    the prefixes' `lib` directories. Real paths; one interpreter's for its
    life, so found once."""
    roots = {sysconfig.get_path(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    if everywhere:
        import site

        for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}:
            roots.update(os.path.join(prefix, lib) for lib in ("lib", "lib64"))
        try:
            roots.add(site.getusersitepackages())
        except Exception:
            pass
    return tuple(os.path.realpath(r) for r in roots if r)


def _under(path, roots):
    path = os.path.realpath(path)
    return any((path + os.sep).startswith(root + os.sep) for root in roots)


def _local(fn):
    """The user's own modules and packages `fn`'s module imports (and those
    its local modules import in turn): `(modules, packages)` — single `.py`
    files beside it, `{name: (path, source)}` in the order found, and the
    directories of packages of the user's own (`_local_package`)."""
    home = _home(fn)
    found, packages, todo = {}, set(), [t for t in _sources.module_trees(fn)]
    own = _local_package(module_name(fn))
    if own is not None:
        packages.add(own)
    while todo:
        for node in ast.walk(todo.pop()):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom) and node.module and not node.level
                else []
            )
            for name in names:
                package = _local_package(name)
                if package is not None:
                    packages.add(package)
                    continue
                path = getattr(sys.modules.get(name), "__file__", None)
                if (
                    name in found
                    or not path
                    or not path.endswith(".py")
                    or os.path.basename(path) == "__init__.py"
                    or os.path.dirname(os.path.abspath(path)) != home
                ):
                    continue
                with open(path, encoding="utf-8") as f:
                    found[name] = (path, f.read())
                todo.append(ast.parse(found[name][1]))
    return found, sorted(packages)


def local_packages(fn):
    """The directories of the user's own packages `fn` needs (see
    `_local`): mounted for its jobs as `packages=` are, sources only."""
    return _local(fn)[1]


def in_local_package(fn):
    """Whether `fn` is defined in a package of the user's own: the package
    travels (`local_packages`), and `fn` is imported there by its names."""
    return _local_package(fn.__module__) is not None


def _local_modules(fn):
    """The single-file modules of the user's own that `fn`'s module imports
    (see `_local`), as code that makes each one in the guest before the
    imports run, so that `import mylib` finds it there — its own top-level
    imports guarded as the function's module's are (`_pw_guarded`, in
    `_program._DRIVER`)."""
    found = _local(fn)[0]
    # Made in reverse order of discovery: what a module imports exists first.
    return "\n".join(
        f"_pw_sys.modules[{name!r}] = _pw_m = _pw_types.ModuleType({name!r})\n"
        f"_pw_m.__file__ = {os.path.abspath(path)!r}\n"
        f"_pw_m._pw_Missing = _pw_Missing\n"
        f"exec(_pw_guarded({source!r}, {path!r}), _pw_m.__dict__)"
        for name, (path, source) in reversed(list(found.items()))
    )


def _defined(node):
    """The names a top-level statement binds: a def's or class's name, an
    assignment's targets (each of `a, b = ...`) — not a name only indexed
    or given an attribute (`TABLE[1] = 5`: see `_changed`)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, _BLOCKS):
        return [] if _is_main_guard(node) else sorted(_bound_within(node))
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) and node.value else []
    return [name for t in targets for name in _bound(t)]


# Top-level statements that bind names inside them (`try: import ujson as
# json` / `except ImportError: import json`; `if FAST: MODE = ...`): such a
# statement travels whole when the function uses a name it binds.
_BLOCKS = tuple(
    getattr(ast, kind)
    for kind in ("If", "Try", "TryStar", "With", "AsyncWith", "For", "AsyncFor", "While", "Match")
    if hasattr(ast, kind)
)


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _inside_scope(statement, block):
    """Whether `statement` lies in a function or class defined in `block`
    (its changes are that scope's, not the module's)."""
    for scope in ast.walk(block):
        if isinstance(scope, _SCOPES) and any(n is statement for n in ast.walk(scope)):
            return True
    return False


def _is_main_guard(node):
    """`if __name__ == "__main__":` — the script's own run, never sent."""
    test = node.test if isinstance(node, ast.If) else None
    return isinstance(test, ast.Compare) and {
        n.id for n in ast.walk(test) if isinstance(n, ast.Name)
    } == {"__name__"} and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in ast.walk(test))


def _bound_within(block):
    """The names a block binds at its module's level (not those local to a
    function or class inside it: only their own names)."""
    names = set()
    for child in ast.iter_child_nodes(block):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(child.name)
            continue
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in child.names if a.name != "*")
        elif isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store):
            names.add(child.id)
        elif isinstance(child, ast.ExceptHandler) and child.name:
            names.add(child.name)
        if not isinstance(child, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            names |= _bound_within(child)
    return names


def _bound(target):
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for element in target.elts:
            yield from _bound(element)
    elif isinstance(target, ast.Starred):
        yield from _bound(target.value)


def _changed(node):
    """The names a top-level statement changes without binding them anew —
    `N += 1`, `TABLE[1] = 5`, `CONFIG.path = p`, `del CACHE[k]`,
    `ITEMS.append(x)`: each goes with the definition it changes, after it,
    so that the sandbox computes the value the caller's module holds. A
    block (`for x in DATA: ITEMS.append(x)`) goes whole with what any of its
    statements changes."""
    if isinstance(node, _BLOCKS):
        if _is_main_guard(node):
            return []
        inner = [n for n in ast.walk(node) if isinstance(n, ast.stmt) and n is not node and not isinstance(n, _SCOPES)]
        return sorted({name for n in inner if not _inside_scope(n, node) for name in _changed(n)})
    if isinstance(node, ast.AugAssign):
        targets = [node.target]
    elif isinstance(node, (ast.Assign, ast.Delete)):
        targets = [t for t in node.targets if not isinstance(t, ast.Name)]
    elif isinstance(node, ast.AnnAssign) and node.value is not None:
        targets = [node.target]
    elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Attribute):
        targets = [node.value.func.value]  # a method called on it
    else:
        return []
    names = []
    for target in targets:
        while isinstance(target, (ast.Subscript, ast.Attribute, ast.Starred)):
            target = target.value
        if isinstance(target, ast.Name) and (target is not getattr(node, "target", None) or isinstance(node, ast.AugAssign)):
            names.append(target.id)
    return names


# Scopes whose code runs where they stand: a comprehension's, at its
# statement's run (a generator expression's maybe later: counted too).
_RUN_IN_PLACE = {"listcomp", "setcomp", "dictcomp", "genexpr"}


def _names_in(node, as_loading=False):
    """The module-level names a top-level statement reads: every name read
    at the top level, and within a function or class only those it does not
    bind itself — a parameter or local named like a module global (`def
    f(df)` beside a global `df`) is not that global, and the global's
    definition does not travel for it. `as_loading`: only those it reads
    as its module loads, not within the functions (and lambdas) it
    defines — a class body's, a decorator's, a default value's."""
    try:
        table = symtable.symtable(ast.unparse(node), "<definition>", "exec")
    except SyntaxError:
        return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    names = set()

    def read(scope, top):
        for symbol in scope.get_symbols():
            if symbol.is_referenced() if top else symbol.is_global():
                names.add(symbol.get_name())
        for inner in scope.get_children():
            if not as_loading or inner.get_type() == "class" or inner.get_name() in _RUN_IN_PLACE:
                read(inner, False)

    read(table, True)
    return names


def definitions(fn, fn_node, extra=(), own=None, values=None, closure=None):
    """The top-level definitions of `fn`'s module (or notebook) that it
    uses — helpers, constants, classes, and what they use in turn, each
    with the statements after it that change it (`_changed`) — and those
    named in `extra` (classes of its arguments), as source, in the order
    they were written; not `own` (the name the program defines itself:
    `fn`'s, unless given). The last definition of a name wins, as it would
    at run time. With `values` (a `_globals.ByValue`), a data global goes
    as its value instead, bound where its statement stood (one bound under
    the main guard: after every definition). `closure`: the variables of
    the functions around `fn` it reads (`_nested.closure`), bound after
    every definition, as `_nested.bound` says."""
    closure = dict(closure or {})
    defs, changes, imported, order = {}, {}, set(), 0
    for tree in _sources.module_trees(fn):
        context = _sources.import_context(tree)
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                imported.update((a.asname or a.name).split(".")[0] for a in node.names)
            for name in _defined(node):
                defs.setdefault(name, []).append((order, node, context))
            for name in _changed(node):
                changes.setdefault(name, []).append((order, node))
            order += 1
    needed, todo, late = {}, [*_names_in(fn_node), *extra], order
    while todo:
        name = todo.pop()
        if name in needed or name == (own or fn.__name__):
            continue
        if name in closure:
            bound = _nested.bound(name, closure[name], fn, closure, values)
            if bound is None:  # the module's own global of that name
                del closure[name]
                todo.append(name)
                continue
            statements, names = bound
            # Functions after every value and import: a default value or a
            # decorator of one reads them as it is defined.
            needed[name] = [
                (late + i / 10 + (_AFTER_VALUES if isinstance(statements[0], _FUNCTIONS) else 0), statement)
                for i, statement in enumerate(statements)
            ]
            late += 1
            todo.extend(names)
            for statement in statements:
                todo.extend(_names_in(statement))
            continue
        if values is not None and name in fn.__globals__ and (name in defs or name not in imported):
            taken = _by_value(fn, name, defs.get(name, ()), values)
            if taken is not None:
                (at, statement), refers = taken
                if at is None:
                    at, late = late, late + 1
                # Just after its statement, which may travel for another
                # name it binds (a block): the value is the one that counts.
                needed[name] = [(at + 0.5, statement)]
                todo.extend(refers)
                continue
        if name not in defs:
            continue
        running = _as_running(fn, name, defs[name])
        if running is None:
            continue
        rebound = min((o for o, _, _ in defs[name] if o > running[0]), default=order)
        needed[name] = [running[:2], *((o, n) for o, n in changes.get(name, ()) if running[0] < o < rebound)]
        for _, node in needed[name]:
            reads = _names_in(node)
            _refuse_shadowed(fn, name, reads, closure)
            todo.extend(reads)
    nodes = {id(node): (o, node) for statements in needed.values() for o, node in statements}
    if values is not None:
        loading = set().union(*(_names_in(n, as_loading=True) for n in [fn_node, *(n for _, n in nodes.values())]))
        for name in values.split(loading):
            del nodes[id(needed[name][0][1])]
    return "\n\n".join(ast.unparse(node) for _, node in sorted(nodes.values(), key=lambda x: x[0]))


def _refuse_shadowed(fn, name, reads, closure):
    """TypeError when the module's definition of `name` reads a global
    that a variable of the functions around `fn` shadows: both would be
    one global in the sandbox."""
    for shadowed in sorted(reads & closure.keys()):
        if shadowed in fn.__globals__:
            raise TypeError(
                f"{fn.__qualname__} reads {shadowed} of the function around it, and {name} of its module reads "
                f"the module's own {shadowed}: rename one of them"
            )


def _by_value(fn, name, candidates, values):
    """`((order, statement), refers)` when the global `name` of `fn`'s
    module travels as its value (`values.take`): where its binding goes
    (None: after every definition), and the names its value refers to."""
    value = fn.__globals__[name]
    if _code(value) is not None:
        return None  # code: its definition travels (checked by `_as_running`)
    running = _as_running(fn, name, candidates) if candidates else None
    taken = values.take(name, value, running[1] if running else None)
    if taken is None:
        return None
    statement, refers = taken
    return ((running[0] if running else None), statement), refers


def _as_running(fn, name, candidates):
    """Which of `candidates` — the definitions of `name` in `fn`'s module
    text, oldest first, each `(order, node, the imports of its text)` — is
    the one `fn` would find now, or None when none should travel. The text can hold definitions that do not run: a
    prompt's history keeps earlier sessions' lines, and a module's file can
    change after it was imported. So a name `fn`'s globals do not hold is
    not sent (the guest then fails as the host would); a function must
    compile to the very code that runs, and a class's methods to its
    methods; a function or class that came from elsewhere (an import) is
    left to its import. Raises TypeError when the running definition of a
    helper of `fn`'s own is not in the text."""
    namespace = fn.__globals__
    if name not in namespace:
        return None
    live = namespace[name]
    code = _code(live)
    target = live if code is None else inspect.unwrap(code) if inspect.isfunction(code) else code
    ours = getattr(target, "__module__", None) == fn.__module__
    named = getattr(target, "__name__", None) == name
    if inspect.isfunction(target) and named:
        matches = [
            c for c in candidates
            if isinstance(c[1], _FUNCTIONS)
            and _sources.same_code(ast.unparse(c[1]), target, c[2])
        ]
    elif inspect.isclass(target) and named:
        flags = fn.__code__.co_flags & _sources.FUTURE_FLAGS
        matches = [c for c in candidates if isinstance(c[1], ast.ClassDef) and _same_methods(c[1], target, flags, c[2])]
    elif inspect.isfunction(target) or inspect.isclass(target):
        # A wrapper a decorator made, or another function bound to the
        # name: nothing to check it against; sent as written.
        return candidates[-1]
    else:
        return next((c for c in reversed(candidates) if not isinstance(c[1], _DEFINITIONS)), None)
    if matches:
        return matches[-1]
    if not isinstance(candidates[-1][1], _DEFINITIONS):
        # Bound last by an assignment (`helper = cache(helper)`), which
        # cannot be checked: sent as written, as before any check.
        return candidates[-1]
    if not ours:
        return None
    raise TypeError(
        f"{fn.__name__} uses {name}, whose source as it runs now cannot be read (the text found defines it "
        "otherwise: an earlier session's history, or a file changed since it was imported): "
        "define them in a file, and import it afresh"
    )


def _code(value):
    """`value` when it is code whose definition travels — a function, a
    class — or the function a decorator's wrapper object holds
    (`functools.lru_cache`'s, `functools.cache`'s: its `__wrapped__`), whose
    `def` then travels with its decorators; else None. (Such a helper was
    not sent at all: the function failed with NameError in the sandbox.)"""
    if inspect.isfunction(value) or inspect.isclass(value):
        return value
    if not callable(value) or not hasattr(value, "__wrapped__"):
        return None
    try:
        inner = inspect.unwrap(value)
    except ValueError:  # a cycle of __wrapped__
        return None
    return inner if inspect.isfunction(inner) else None


_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


# Where a closure's functions go, after its values (`definitions`).
_AFTER_VALUES = 1 << 20


_DEFINITIONS = (*_FUNCTIONS, ast.ClassDef)


def _same_methods(node, cls, flags, context):
    """Whether the class `node` defines is `cls` as it runs: the same name,
    the same methods, each compiled to `cls`'s own code (compiled within
    the class, as `super()` needs, after `context`, the imports of its
    text)."""
    if node.name != cls.__name__:
        return False
    try:
        module = compile(context + ast.unparse(node), "<class>", "exec", flags=flags, dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    body = next((c for c in module.co_consts if inspect.iscode(c) and c.co_name == node.name), None)
    if body is None:
        return False
    for code in (c for c in body.co_consts if inspect.iscode(c) and c.co_name.isidentifier()):
        attr = mangled(cls, code.co_name)
        if attr not in cls.__dict__:
            return False
        method = cls.__dict__[attr]
        method = getattr(method, "__func__", method)
        if inspect.isfunction(method) and not _sources.alike(code, inspect.unwrap(method).__code__):
            return False
    return True


def mangled(cls, name):
    """The attribute `name`, defined in `cls`'s body, is stored as: a
    private `__name` as `_Class__name`."""
    if name.startswith("__") and not name.endswith("__"):
        return f"_{cls.__name__.lstrip('_')}{name}"
    return name


def found_by_name(module, qualname):
    """What `module.qualname` names in this process (as pickle finds a
    function or class again), or None; `module` is not imported."""
    found = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return found


def installed(fn):
    """Whether `fn` comes from the standard library or an installed package
    rather than the caller's own code (a script, a notebook, a project's
    modules, an editable install)."""
    file = getattr(sys.modules.get(fn.__module__), "__file__", None)
    return bool(file) and _under(file, _roots(everywhere=False))
