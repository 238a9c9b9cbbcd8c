"""The `peerwasm` command the package installs: the whole command line,
from the venv's own Python; and the compile of CPython it shares with the
package's embedded worker."""

import glob
import hashlib
import os
import pathlib
import subprocess
import sys
import time

import pytest

import peerwasm
from peerwasm import _functions

# The command pip put beside this venv's python.
COMMAND = pathlib.Path(sys.executable).parent / "peerwasm"


def _command(args, **kwargs):
    return subprocess.run([str(COMMAND), *args], capture_output=True, text=True, timeout=600, **kwargs)


def test_the_package_installs_the_peerwasm_command():
    assert COMMAND.exists(), f"pip installed no {COMMAND}"
    version = _command(["--version"])
    assert version.returncode == 0 and version.stdout.startswith("peerwasm "), version
    same = subprocess.run([sys.executable, "-m", "peerwasm", "--version"], capture_output=True, text=True)
    assert same.stdout == version.stdout, same
    usage = _command(["run"])
    assert usage.returncode == 2 and "JOB" in usage.stderr, usage


def test_the_command_runs_a_worker_that_the_client_maps_on(tmp_path):
    # Its slot processes are this venv's Python running the package's
    # command again (`python -m peerwasm slot`): a Python function runs.
    worker = subprocess.Popen(
        [str(COMMAND), "worker", "--listen", "127.0.0.1:0", "--memory", "1GiB", "--reserve", "0", "--slots", "2",
         "--state-dir", str(tmp_path / "state"), "--max-compile-time", "10m"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = worker.stdout.readline()
        assert line.startswith("peerwasm worker listening on "), line
        address = line.split()[-1]
        sys.path.insert(0, str(pathlib.Path(__file__).parent))
        import fns

        assert peerwasm.map(fns.square, [2, 3], peers=[address]) == [4, 9]
    finally:
        worker.terminate()
        worker.wait(timeout=60)


def test_cpython_is_compiled_once_for_the_command_and_the_package(tmp_path):
    # A cache of its own: the package's embedded worker compiles CPython
    # (its slot processes'), then `peerwasm run --python` runs with it.
    # One artifact of CPython in the cache after both: no engine compiled
    # it apart.
    env = dict(os.environ, PEERWASM_CACHE_DIR=str(tmp_path / "cache"))
    script = tmp_path / "job.py"
    script.write_text("import sys\nprint('from the command', sys.version_info[:2])\n")
    client = subprocess.run(
        [sys.executable, "-c", "import peerwasm\ndef f(x):\n    return x + 1\nprint('RESULT', peerwasm.run(f, 41), peerwasm.map(f, [1, 2, 3, 4]))"],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert client.returncode == 0 and "RESULT 42 [2, 3, 4, 5]" in client.stdout, client.stderr[-3000:]
    assert client.stderr.count("compiling CPython") == 1, "the first run says that it compiles, once"
    started = time.monotonic()
    command = _command(["run", "--python", str(script)], env=env)
    took = time.monotonic() - started
    assert command.returncode == 0 and "from the command" in command.stdout, command.stderr[-3000:]
    python_wasm = pathlib.Path(_functions.runtime_dir()) / "python.wasm"
    digest = hashlib.sha256(python_wasm.read_bytes()).hexdigest()
    artifacts = glob.glob(str(tmp_path / "cache" / "modules" / "engine-*" / f"{digest}.cwasm"))
    assert len(artifacts) == 1, (artifacts, took)


def test_slot_processes_start_without_running_the_hosts_fork_handlers():
    # A host library's fork handler (scipy's OpenBLAS has one that waits
    # for its threads, and could wait forever: a map hung) must not run
    # when the embedded worker starts its slot processes: they are spawned,
    # not forked. The handler here only counts.
    script = """
import ctypes, peerwasm
calls = []
HANDLER = ctypes.CFUNCTYPE(None)(lambda: calls.append(1))
# pthread_atfork, as glibc exports it (the name itself is linked statically).
libc = ctypes.CDLL("libc.so.6")
assert libc.__register_atfork(HANDLER, None, None, None) == 0
def f(x):
    return x * 2
print("RESULT", peerwasm.map(f, [1, 2, 3]), len(calls))
"""
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "RESULT [2, 4, 6] 0" in p.stdout, (p.stdout, p.stderr[-2000:])
