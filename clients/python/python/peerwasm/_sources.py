"""Where a function's source is read from, to be sent into the sandbox:
its module's file; the cells of the notebook or IPython session it was
defined in; or — for a script that has no file — the text Python ran.

A script with no file of its own is common on a cluster: a batch script's
`python - <<EOF … EOF`, `cat analysis.py | python`, `python -c '…'`, or
the plain `python` prompt. Python keeps none of those texts, so `inspect`
cannot find a function's source there; this module finds it:

* `python -c CODE`: CODE is in `sys.orig_argv`;
* a script read from stdin that is a file (`python - < script.py`, a
  large here-document): it is read again, from its start;
* a script read from a pipe: the pipe is gone once Python has read it, so
  the package installs a start-up hook (`peerwasm-stdin.pth`, module
  `_peerwasm_stdin`) that, in a Python whose script comes from a pipe and
  only then, reads the pipe first, keeps the text, and gives Python the
  same bytes from a file of its own (what Python reads is unchanged);
* the interactive prompt: the lines typed, from readline's history (a
  prompt of Python 3.13 or later keeps each input in `linecache`, which
  `inspect` reads).

Text found this way is used only if it compiles to the very function (and
helper) being sent — the same bytecode — so a stale history line or a
different script is never sent in its place: the error then says to put
the function in a file.
"""

import __future__
import ast
import inspect
import io
import linecache
import os
import stat
import sys
import textwrap
import tokenize

# The compiler flags of `from __future__ import …`: a function's code
# carries those its script was compiled with.
FUTURE_FLAGS = 0
for _name in __future__.all_feature_names:
    FUTURE_FLAGS |= getattr(__future__, _name).compiler_flag


def function_source(fn):
    """The source of `fn`'s `def` (with its decorators), dedented. Raises
    TypeError, saying what to do, when it cannot be found."""
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as e:
        why = e
    else:
        _check_running(source, fn)
        return source
    for text in scriptless_texts(fn):
        found = _definition_in(text, fn)
        if found is not None:
            return found
    raise TypeError(
        f"the source of {fn.__name__} cannot be read ({why}): define it in a file, a notebook cell, "
        "or a script (a file, or one piped on stdin to a Python where peerwasm is installed)"
    )


def _check_running(source, fn):
    """Raises TypeError when `source`, read from `fn`'s file (or notebook
    cell) now, is not the code that runs: the file was edited since it was
    imported, and the sandbox would run other code than this process. Not
    checked where the two differ by design or cannot be compared: a
    decorator's wrapper, a function not at its module's top level, a text
    that no longer parses."""
    if hasattr(fn, "__wrapped__") or fn.__qualname__ != fn.__name__:
        return
    filename = fn.__code__.co_filename
    try:
        tree = ast.parse("".join(linecache.getlines(filename, fn.__globals__)))
    except (SyntaxError, ValueError):
        return
    if not same_code(source, fn, import_context(tree)):
        if filename.startswith("<"):
            # A text Python kept (`-c`'s, since 3.13), not a file: the
            # function was made otherwise (by `exec`, say).
            raise TypeError(
                f"the source of {fn.__name__} cannot be read ({filename} defines it otherwise: code made at run "
                "time?): define it in a file, a notebook cell, or a script"
            )
        raise TypeError(
            f"the source of {fn.__name__} in {filename} is not the code that runs here (the file changed since "
            "it was imported): import it afresh (importlib.reload, or restart) and call again"
        )


def module_trees(fn):
    """The parsed source `fn`'s imports and module-level definitions are
    read from: its module's file; every cell of the notebook or IPython
    session it was defined in (IPython keeps them, magics already turned
    into Python, in `In`; a cell that does not parse is passed over); or
    the text of the script that has no file."""
    namespace = fn.__globals__
    cells = namespace.get("In")
    if fn.__module__ == "__main__" and "get_ipython" in namespace and isinstance(cells, list):
        return _parsed(cells)
    module = sys.modules.get(fn.__module__)
    if module is None:
        return []
    if fn.__module__ == "__main__" and fn.__code__.co_filename.startswith("<"):
        # Typed at the prompt, or `-c`'s: `inspect` would read another text
        # (Python 3.13's prompt is a module of its own).
        return _parsed(scriptless_texts(fn))
    try:
        return [ast.parse(inspect.getsource(module))]
    except (OSError, TypeError, SyntaxError):
        pass
    return _parsed(scriptless_texts(fn)) if fn.__module__ == "__main__" else []


def same_code(source, fn, context=""):
    """Whether the `def` in `source` compiles to `fn`'s code: the same
    bytecode, constants and names (line numbers aside). `context`: the
    imports of the text it was compiled in (`import_context`), compiled
    ahead of it as they were then."""
    try:
        flags = fn.__code__.co_flags & FUTURE_FLAGS
        code = compile(context + source, fn.__code__.co_filename, "exec", flags=flags, dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return any(alike(c, fn.__code__) for c in code.co_consts if inspect.iscode(c) and c.co_name == fn.__name__)


def import_context(tree):
    """The import statements of `tree`'s module scope (in its `if`, `try`
    and `with` blocks too; not in functions or classes), as source. A
    definition taken out of its text compiles as it did in it only with
    these ahead of it: since Python 3.11 a call on an attribute of an
    imported module (`math.floor(x)`) compiles otherwise than one on any
    other name. `from __future__` imports are left out (their flags are
    given to the compiler apart)."""
    found, todo = [], list(tree.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if not (isinstance(node, ast.ImportFrom) and node.module == "__future__"):
                found.append(ast.unparse(node) + "\n")
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            todo.extend(
                n for n in ast.iter_child_nodes(node) if isinstance(n, (ast.stmt, ast.excepthandler, ast.match_case))
            )
    return "".join(found)


def alike(a, b):
    """Whether two code objects are the same code: bytecode, names,
    constants (nested code compared alike), line numbers aside — a class
    body's own too (Python 3.13 keeps it as a constant, `__firstlineno__`)."""
    if (a.co_code, a.co_names, a.co_varnames, a.co_freevars) != (b.co_code, b.co_names, b.co_varnames, b.co_freevars):
        return False
    if len(a.co_consts) != len(b.co_consts):
        return False
    lines = "__firstlineno__" in a.co_names
    return all(
        alike(x, y)
        if inspect.iscode(x) and inspect.iscode(y)
        else (type(x) is type(y) and x == y) or (lines and (x, y) == (a.co_firstlineno, b.co_firstlineno))
        for x, y in zip(a.co_consts, b.co_consts)
    )


def _parsed(texts):
    trees = []
    for text in texts:
        try:
            trees.append(ast.parse(text))
        except (SyntaxError, ValueError, TypeError):
            continue
    return trees


def _definition_in(text, fn):
    """`fn`'s definition in `text` (a script, or one input at the prompt),
    if `text` holds one that compiles to `fn`: the last such, as the last
    definition of a name is the one that runs."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    lines = text.splitlines(keepends=True)
    context = import_context(tree)
    for node in reversed([n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]):
        if node.name != fn.__name__:
            continue
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        source = textwrap.dedent("".join(lines[first - 1 : node.end_lineno]))
        if same_code(source, fn, context):
            return source
    return None


def scriptless_texts(fn):
    """The texts that may hold `fn` when its file does not exist: the
    script of `-c`, the script read from stdin, or the inputs typed at the
    prompt (oldest first)."""
    filename = fn.__code__.co_filename
    if filename == "<string>":
        code = _command_text()
        return [code] if code is not None else []
    if filename == "<stdin>":
        if hasattr(sys, "ps1") or sys.flags.interactive:
            return _typed_inputs()
        script = _stdin_script()
        return [script] if script is not None else []
    for prefix, end in (("<python-input-", ">"), ("<stdin>-", "")):
        if filename.startswith(prefix):
            # The prompt of Python 3.13 and later (its own, and the plain
            # one it falls back to): each input is in linecache.
            def number(name):
                digits = name[len(prefix) : len(name) - len(end)]
                return int(digits) if digits.isdigit() else -1

            names = sorted((n for n in linecache.cache if n.startswith(prefix) and number(n) >= 0), key=number)
            return ["".join(linecache.getlines(n)) for n in names]
    return []


def _command_text():
    """The CODE of `python -c CODE`."""
    argv = getattr(sys, "orig_argv", None)
    if argv is None:
        try:
            with open("/proc/self/cmdline", "rb") as f:
                argv = [os.fsdecode(a) for a in f.read().split(b"\0")]
        except OSError:
            return None
    for i, arg in enumerate(argv[1:-1], start=1):
        if arg == "-c":
            return argv[i + 1]
        if arg.startswith("-c") and not arg.startswith("--"):
            return arg[2:]
    return None


def _stdin_script():
    """The script Python read from stdin: kept by the start-up hook when
    it came through a pipe, else read again from the start of the file
    stdin is."""
    kept = getattr(sys.modules.get("_peerwasm_stdin"), "script", None)
    data = kept
    if data is None:
        try:
            st = os.fstat(0)
            if not stat.S_ISREG(st.st_mode):
                return None
            data = os.pread(0, st.st_size, 0)
        except (OSError, AttributeError):
            return None
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding)
    except (SyntaxError, UnicodeDecodeError, LookupError):
        return None


def _typed_inputs():
    """What was typed at the prompt, from readline's history, cut into
    top-level statements (a line that does not start with a space begins
    one, but for the `else:`/`except` kind and a decorated `def`)."""
    try:
        import readline
    except ImportError:
        return []
    lines = [readline.get_history_item(i) for i in range(1, readline.get_current_history_length() + 1)]
    inputs, current = [], []
    continuing = ("else", "elif", "except", "finally", "case", ")", "]", "}")
    for line in (x for x in lines if x is not None):
        starts = line[:1] not in ("", " ", "\t") and not line.startswith(continuing)
        decorated = current and all(x.startswith("@") for x in current)
        if starts and current and not decorated:
            inputs.append("\n".join(current) + "\n")
            current = []
        current.append(line)
    if current:
        inputs.append("\n".join(current) + "\n")
    return inputs
