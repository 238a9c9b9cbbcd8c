from os import PathLike
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

_Size = Union[int, str]
_Seconds = Union[int, float, str]
_Path = Union[str, PathLike[str]]

class Result:
    """How a job ended."""

    exit_code: int
    """The job's exit code (124 time limit, 137 memory, 134 trap, 130 cancelled)."""
    outcome: str
    """`exited`, `memory_limit_exceeded`, `time_limit_exceeded`, `trapped`, ..."""
    message: str
    """The outcome in words."""
    stdout: bytes
    output: Any
    """stdout parsed as JSON when it parses, else None."""
    stderr: str
    peak_memory_bytes: int
    """The most linear memory the job held, exactly."""
    memory_limit_bytes: int
    wall_s: float
    cpu_s: float
    peer: str
    """`embedded` or the address of the worker that ran it."""
    attempts: int
    index: Optional[int]
    """The input's position in a map; None for run."""
    ok: bool
    """Whether it exited with code 0."""

MAX_INPUT_BYTES: int
TURN_ONLY_DIR: str
"""The most a job's input (its stdin) may be, embedded as on a pool."""

class JobError(Exception):
    """A job that did not succeed."""

    result: Result

def run(
    module: _Path,
    stdin: Union[bytes, str, None] = None,
    args: Sequence[str] = (),
    env: Optional[Mapping[str, str]] = None,
    mem: Optional[_Size] = None,
    timeout: Optional[_Seconds] = None,
    peers: Optional[Sequence[str]] = None,
    token: Optional[str] = None,
) -> Result:
    """Runs one job; raises JobError if it did not succeed."""

class MapStream:
    """A map's Results as they come (in input order unless it was started
    unordered), each with its `index`. A failed job raises JobError when
    the stream reaches it, unless the map keeps going; Ctrl-C raises
    KeyboardInterrupt and stops the map."""

    def __iter__(self) -> "MapStream": ...
    def __next__(self) -> Result: ...
    def close(self) -> None:
        """Stops the map: nothing more is submitted, what is under way is cancelled."""
    def rest(self) -> list[Result]:
        """After an interrupt: the Results that were in; the stream is then over."""
    progress: tuple[int, int, int, int]
    """(done, failed, retried, in flight)."""

def map_stream(
    module: _Path,
    inputs: Iterable[Any],
    mem: Optional[Union[_Size, Sequence[_Size]]] = None,
    timeout: Optional[_Seconds] = None,
    peers: Optional[Sequence[str]] = None,
    token: Optional[str] = None,
    keep_going: bool = False,
    retries: int = 0,
    ordered: bool = True,
    max_lost: int = 3,
) -> MapStream:
    """Starts the job once per input (bytes as they are, anything else as
    JSON); its Results as they come (`peerwasm.map`, `imap`). `mem`: one
    size for every job, or one per input (nothing is learned then);
    `max_lost`: losses with the process running an input before it is
    given up (outcome `lost`)."""

def learned_memory() -> Optional[str]:
    """What the last map learned of its jobs' memory, in words; None before
    a map had results enough, or with `mem` given."""

def _run_python(
    runtime: _Path,
    source: str,
    stdin: bytes,
    mem: Optional[_Size] = None,
    timeout: Optional[_Seconds] = None,
    peers: Optional[Sequence[str]] = None,
    token: Optional[str] = None,
    dirs: Sequence[tuple[str, str, bool]] = (),
    max_output: Optional[_Size] = None,
    plots: bool = False,
) -> Result:
    """Runs the Python program `source` once on the CPython for WASI in
    `runtime` (used by `peerwasm.run(fn, ...)`)."""

def _map_python(
    runtime: _Path,
    source: str,
    inputs: Sequence[bytes],
    mem: Optional[Union[_Size, Sequence[_Size]]] = None,
    timeout: Optional[_Seconds] = None,
    peers: Optional[Sequence[str]] = None,
    token: Optional[str] = None,
    keep_going: bool = False,
    retries: int = 0,
    warm: Optional[tuple[str, str]] = None,
    ordered: bool = True,
    dirs: Sequence[tuple[str, str, bool]] = (),
    max_output: Optional[_Size] = None,
    plots: bool = False,
    max_lost: int = 3,
) -> MapStream:
    """Starts the Python program `source` once per input (used by
    `peerwasm.map(fn, ...)` and `imap`)."""
