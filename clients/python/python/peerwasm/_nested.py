"""Functions that are not a module's top-level `def`: lambdas, and
functions defined inside another that read its variables (closures) —
what users of joblib, Dask and Ray pass without a second thought
(`map(lambda f: analyze(f, 0.3), files)`, a `def work(i)` inside
`main()` that reads `main`'s `data`), which cloudpickle sends by value.

How they travel: the function's own text is found in its module's text
(its file, its notebook cell, a script without a file: `_sources`) where
its code starts, and checked by compiling it as it stood — inside a
function that binds the same variables — to the very code that runs. In
the sandbox it is a top-level function (a lambda is bound to
`LAMBDA_NAME`), and the variables it reads of the functions around it
become globals of the program: data by value (`_globals`, as cloudpickle
sends a closure's cells), a function among them as its own text in the
same way, a module as its import (`_travel.definitions`).

One that an argument holds (`partial(sorted, key=lambda r: r[1])`) is
made again by a function of the program (`factory`) that the argument's
pickle calls with its default values and its variables' values
(`_arguments._made_again`).

Refused, saying why: a function that assigns those variables
(`nonlocal`: the sandbox's copy could not change the caller's), one that
reads a variable not yet bound, or a class defined inside the function.
"""

import ast
import hashlib
import inspect
import linecache
import textwrap

from . import _globals, _sources

# The name a lambda is bound to in the sandbox's program.
LAMBDA_NAME = "_pw_lambda"


def is_nested(fn):
    """Whether `fn` is a lambda or a function defined inside another (or
    reads variables of one): not a module's top-level `def`."""
    return fn.__name__ == "<lambda>" or "<locals>" in fn.__qualname__ or bool(fn.__closure__)


def name_of(fn):
    """The name `fn` is defined by in the sandbox's program."""
    return LAMBDA_NAME if fn.__name__ == "<lambda>" else fn.__name__


def definition(fn):
    """`(node, source, defaults)`: the top-level statement that defines
    `fn` in the sandbox's program — its `def` dedented, or `_pw_lambda =
    <the lambda>` — checked to compile, where it stood, to `fn`'s code;
    its default values that are not constants read from `defaults`
    (`{name: value}`, to bind as globals: they were computed where it was
    made, `lambda x, k=k: ...`). Raises TypeError, saying what to do, when
    its text cannot be found or it assigns a variable of the function
    around it."""
    for text in _texts(fn):
        found = _found_in(text, fn)
        if found is not None:
            node, _ = found
            if any(isinstance(n, ast.Nonlocal) for n in ast.walk(node)):
                raise TypeError(
                    f"{_label(fn)} assigns variables of the function around it (`nonlocal`), which the sandbox's "
                    "copy cannot change for the caller: return what it computes instead"
                )
            defaults = _defaults_read(fn, node)
            return node, ast.unparse(node) + "\n", defaults
    raise TypeError(
        f"the source of {_label(fn)} cannot be read: define it in a file, a notebook cell or a script "
        "(for a lambda: on a line of its own, not beside another lambda of other code)"
    )


def closure(fn):
    """The variables `fn` reads of the functions around it: `{name:
    value}`. Raises TypeError for one not yet bound (the function around
    it binds it later) and for a class made inside a function (`super()`
    in a method reads it so)."""
    values = {}
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        if name == "__class__":
            raise TypeError(
                f"{_label(fn)} is a method of a class defined inside a function: define the class at the top "
                "level of a module"
            )
        try:
            values[name] = cell.cell_contents
        except ValueError:
            raise TypeError(
                f"{_label(fn)} reads {name}, a variable of the function around it that is not bound yet: "
                "bind it before the map, or pass it as an argument"
            ) from None
    return values


def factory_name(fn):
    """The name of the function that makes `fn` again in the sandbox when
    an argument holds it (`factory`): the same for the same code at the
    same place, so that the same arguments make the same program."""
    code = fn.__code__
    key = f"{fn.__module__}:{fn.__qualname__}:{code.co_firstlineno}:{code.co_code.hex()}"
    return "_pw_made_" + hashlib.sha256(key.encode()).hexdigest()[:16]


def factory(fn):
    """`(node, reads)`: for a lambda or a function defined inside another
    that an argument holds (`key=lambda r: r[1]`, a closure in a
    `partial`), a top-level `def` named `factory_name(fn)` that makes it
    again from its text — called in the sandbox with its default values
    and the values of the variables it reads of the functions around it,
    both pickled with the argument (`_arguments`) — and the global names
    the text reads (its module's definitions that must travel). Raises
    TypeError, saying what to do, as `definition` does."""
    node = None
    for text in _texts(fn):
        found = _found_in(text, fn)
        if found is not None:
            node = found[0]
            break
    if node is None:
        raise TypeError(
            f"the source of {_label(fn)}, which an argument holds, cannot be read: define it in a file, a "
            "notebook cell or a script (a lambda on a line of its own, not beside another lambda)"
        )
    if any(isinstance(n, ast.Nonlocal) for n in ast.walk(node)):
        raise TypeError(
            f"{_label(fn)}, which an argument holds, assigns variables of the function around it (`nonlocal`), "
            "which the sandbox's copy cannot change for the caller"
        )
    # Its default values are the caller's (computed where it was made):
    # set on the made function, not computed again.
    args = (node.value if isinstance(node, ast.Assign) else node).args
    args.defaults = [ast.Constant(None) for _ in args.defaults]
    args.kw_defaults = [None if d is None else ast.Constant(None) for d in args.kw_defaults]
    inner = name_of(fn)
    free = list(fn.__code__.co_freevars)
    made = ast.parse(
        f"def {factory_name(fn)}(_pw_defaults, _pw_kwdefaults, {', '.join([*free, ''])}):\n"
        f"    {inner}.__defaults__, {inner}.__kwdefaults__ = _pw_defaults, _pw_kwdefaults\n"
        f"    return {inner}\n"
    ).body[0]
    made.body.insert(0, node)
    from . import _travel  # (which imports this module)

    reads = [n for n in _travel._names_in(node) if n not in free]
    return made, reads


def _defaults_read(fn, node):
    """Makes `node`'s default values that are not constants read globals
    named for them, and returns those globals' values: `fn`'s own
    defaults, as they were computed where it was made."""
    args = (node.value if isinstance(node, ast.Assign) else node).args
    prefix = f"_pw_{name_of(fn).lstrip('_')}_default_"
    bound = {}
    positional = list(fn.__defaults__ or ())
    for i, default in enumerate(args.defaults):
        if not isinstance(default, ast.Constant):
            bound[f"{prefix}{i}"] = positional[i]
            args.defaults[i] = ast.Name(f"{prefix}{i}", ast.Load())
    keywords = fn.__kwdefaults__ or {}
    for arg, default in zip(args.kwonlyargs, args.kw_defaults):
        if default is not None and not isinstance(default, ast.Constant):
            bound[f"{prefix}{arg.arg}"] = keywords[arg.arg]
            args.kw_defaults[args.kw_defaults.index(default)] = ast.Name(f"{prefix}{arg.arg}", ast.Load())
    return bound


def _label(fn):
    return "a lambda" if fn.__name__ == "<lambda>" else fn.__qualname__


def _texts(fn):
    """The texts `fn` may be defined in: its file's or notebook cell's
    lines (linecache, as `inspect` reads them), else the script without a
    file it came from."""
    lines = linecache.getlines(fn.__code__.co_filename, fn.__globals__)
    if lines:
        yield "".join(lines)
    yield from _sources.scriptless_texts(fn)


def _found_in(text, fn):
    """`fn`'s definition in `text`: a `def` of its name or a lambda, on
    the line its code starts at, that compiles to its code as it stood."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    lines = text.splitlines(keepends=True)
    context = _sources.import_context(tree)
    first = fn.__code__.co_firstlineno
    lambda_ = fn.__name__ == "<lambda>"
    for node in ast.walk(tree):
        if lambda_ and isinstance(node, ast.Lambda) and node.lineno == first:
            segment = ast.get_source_segment(text, node)
            if segment is None:
                continue
            source = f"{LAMBDA_NAME} = (\n{textwrap.indent(segment, '    ')}\n)\n"
        elif (
            not lambda_
            and isinstance(node, ast.FunctionDef)
            and node.name == fn.__name__
            and first in (node.lineno, *(d.lineno for d in node.decorator_list))
        ):
            # The `def` alone: its decorators made `fn` what it is here
            # (a wrapper is not a plain function, refused before this).
            source = textwrap.dedent("".join(lines[node.lineno - 1 : node.end_lineno]))
        else:
            continue
        if _compiles_to(source, fn, context):
            return ast.parse(source).body[0], source
    return None


def _compiles_to(source, fn, context):
    """Whether `source` compiles, inside a function binding `fn`'s free
    variables (as it stood), to `fn`'s code."""
    binds = "".join(f"    {name} = None\n" for name in fn.__code__.co_freevars)
    outer = f"def _pw_outer():\n{binds}{textwrap.indent(source, '    ')}"
    flags = fn.__code__.co_flags & _sources.FUTURE_FLAGS
    try:
        code = compile(context + outer, fn.__code__.co_filename, "exec", flags=flags, dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    outers = [c for c in code.co_consts if inspect.iscode(c) and c.co_name == "_pw_outer"]
    inner = [c for o in outers for c in _codes(o) if c.co_name == fn.__name__]
    return any(_sources.alike(c, fn.__code__) for c in inner)


def _codes(code):
    """The code objects within `code`, however deep."""
    for c in code.co_consts:
        if inspect.iscode(c):
            yield c
            yield from _codes(c)


def bound(name, value, fn, known, values):
    """`(statements, names)`: what binds `name` — a variable of the
    functions around `fn`, holding `value` — as a global of the sandbox's
    program, and the names its value names besides what the statements
    read (its classes and functions, to travel in turn); None when it is
    the global of that name of `fn`'s own module (which travels as such).
    A function defined inside another travels as its text (its own such
    variables joining `known`, those found so far); a function or class
    of a module, and a module, by import, guarded as the module's imports
    are; data by value (`values`, a `_globals.ByValue`). Raises TypeError
    for what cannot travel."""
    if value is fn:
        raise TypeError(f"{_label(fn)} reads itself through {name}: define it with `def` at the top level of a module")
    if inspect.isfunction(value) and is_nested(value):
        node, _, defaults = definition(value)
        for inner, held in {**closure(value), **defaults}.items():
            if inner in known and known[inner] is not held:
                raise TypeError(
                    f"{_label(fn)} and {_label(value)} read two variables named {inner} of the functions around "
                    "them: rename one"
                )
            known[inner] = held
        statements = [node]
        if name_of(value) != name:
            statements.append(ast.parse(f"{name} = {name_of(value)}").body[0])
        return statements, []
    if inspect.ismodule(value):
        return [_guarded(f"import {value.__name__} as {name}", name)], []
    if (inspect.isroutine(value) or isinstance(value, type)) and not _globals.is_data(name, value):
        module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", "")
        if module == fn.__module__ and "." not in qualname and fn.__globals__.get(qualname) is value:
            # One of its module's own: it travels as the module's do.
            if qualname == name:
                return None
            return [ast.parse(f"{name} = {qualname}").body[0]], [qualname]
        if isinstance(module, str) and qualname and "<" not in qualname and "." not in qualname:
            return [_guarded(f"from {module} import {qualname} as {name}", name)], []
        raise TypeError(
            f"{_label(fn)} reads {name}, a {'class' if isinstance(value, type) else 'function'} defined inside a "
            "function: define it at the top level of a module"
        )
    taken = values.take(name, value, None) if values is not None else None
    if taken is None:
        why = (
            "a random generator, whose state would be the same in every item: make it inside the function, "
            "seeded from the item if it must be reproducible"
            if _globals.draws(type(value))
            else "it does not pickle: make it inside the function, or pass what it holds as an argument"
        )
        raise TypeError(f"{_label(fn)} reads {name} of the function around it, a {type(value).__name__}: {why}")
    statement, refers = taken
    return [statement], refers


def _guarded(statement, name):
    """`statement` (an import binding `name`), with `name` a stand-in
    that raises the import's error when used if the sandbox cannot do it."""
    from . import _travel  # (which imports this module)

    return ast.parse(_travel.guarded_import(statement, [name])).body[0]
