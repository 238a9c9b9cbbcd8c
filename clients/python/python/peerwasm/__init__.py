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
PEERWASM_PEERS) to run on a pool. Jobs run with the GIL released; Ctrl-C
cancels them. A job that does not succeed raises `JobError`, whose
`.result` is its `Result`.
"""

from ._peerwasm import JobError, Result, map, run

__all__ = ["JobError", "Result", "map", "run"]
