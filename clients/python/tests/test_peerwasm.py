"""The Python client against the embedded worker and a real two-worker pool."""

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

import peerwasm

ROOT = pathlib.Path(__file__).resolve().parents[3]
GUESTS = ROOT / "target" / "guests" / "wasm32-wasip1" / "release"
PRIMES = GUESTS / "primes.wasm"
SLEEP = GUESTS / "sleep.wasm"
MEMHOG = GUESTS / "memhog.wasm"
HELLO = GUESTS / "hello.wasm"
PEERWASM = pathlib.Path(os.environ.get("PEERWASM_BIN", ROOT / "target" / "debug" / "peerwasm"))


def setup_module():
    if not PRIMES.exists():
        subprocess.run(
            ["cargo", "build", "--release", "-q", "-p", "peerwasm-guest-examples", "--bins",
             "--target-dir", str(ROOT / "target" / "guests"), "--target", "wasm32-wasip1"],
            cwd=ROOT, check=True,
        )


def test_map_gives_outputs_in_input_order():
    results = peerwasm.map(str(PRIMES), [{"n": 10}, {"n": 100}])
    assert [r.output for r in results] == [{"count": 4}, {"count": 25}]
    assert [r.index for r in results] == [0, 1]
    assert all(r.ok and r.peer == "embedded" and r.peak_memory_bytes > 0 for r in results)


def test_run_reports_what_the_job_used():
    r = peerwasm.run(PRIMES, stdin=b'{"n": 1000000}', mem="64MiB")
    assert r.output == {"count": 78498}
    assert r.stdout == b'{"count":78498}\n'
    assert r.exit_code == 0 and r.outcome == "exited"
    assert r.memory_limit_bytes == 64 << 20
    assert 0 < r.peak_memory_bytes <= r.memory_limit_bytes
    assert r.wall_s > 0 and r.cpu_s > 0


def test_output_is_stdout_read_as_json_when_it_is_and_none_else():
    assert peerwasm.run(HELLO, args=['{"a": [1, 2]}']).output == {"a": [1, 2]}
    assert peerwasm.run(HELLO, args=["not json"]).output is None
    assert peerwasm.run(HELLO, args=["[1, 2"]).output is None
    # Nested past what the parser can go into: not JSON here either.
    assert peerwasm.run(HELLO, args=["[" * 100_000]).output is None


def test_a_ctrl_c_while_a_result_is_read_is_raised_not_lost(monkeypatch):
    # json.loads runs Python code, so a Ctrl-C that arrives while it reads
    # a result's stdout is raised inside it. That was taken for stdout that
    # is not JSON and lost: a map went on to its end.
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(json, "loads", interrupted)
    with pytest.raises(KeyboardInterrupt):
        peerwasm.run(PRIMES, stdin=b'{"n": 10}')
    with pytest.raises(KeyboardInterrupt):
        peerwasm.map(str(PRIMES), [{"n": 10}, {"n": 100}])


def test_a_failed_job_raises_with_its_result():
    with pytest.raises(peerwasm.JobError) as e:
        peerwasm.run(PRIMES, stdin='{"n": 5000000000}')
    assert e.value.result.exit_code == 1
    assert "too large" in e.value.result.stderr
    with pytest.raises(peerwasm.JobError) as e:
        peerwasm.run(MEMHOG, stdin="200", mem=64 << 20)
    assert e.value.result.outcome == "memory_limit_exceeded"
    assert e.value.result.exit_code == 137


def test_map_learns_memory_and_keeps_going_when_asked():
    # memhog: N MiB; without mem the map learns (and retries what outgrows it).
    results = peerwasm.map(MEMHOG, [b"10\n", b"40\n", b"20\n"])
    assert [r.stdout.strip() for r in results] == [b"10", b"40", b"20"]
    out = peerwasm.map(PRIMES, [{"n": 10}, {"n": 5000000000}, {"n": 100}], keep_going=True)
    assert [r.exit_code for r in out] == [0, 1, 0]
    with pytest.raises(peerwasm.JobError) as e:
        peerwasm.map(PRIMES, [{"n": 10}, {"n": 5000000000}])
    assert e.value.result.index == 1


def test_the_gil_is_released_while_jobs_run():
    ticks = []
    stop = threading.Event()

    def tick():
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.01)

    t = threading.Thread(target=tick)
    t.start()
    peerwasm.run(SLEEP, stdin="500", mem="64MiB")
    stop.set()
    t.join()
    assert len(ticks) > 20, "another Python thread ran while the job slept"


def test_ctrl_c_cancels_a_job():
    # As a terminal's Ctrl-C: a job started in the background of a script
    # (as CI may start us) inherits SIGINT ignored, and Python then never
    # raises KeyboardInterrupt; take the default back first.
    code = (
        "import peerwasm, signal, sys\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "try:\n"
        f"    peerwasm.run({str(SLEEP)!r}, stdin='60000', mem='64MiB')\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted'); sys.exit(0)\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    time.sleep(1.5)
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=10)
    assert out.strip() == "interrupted"


def _worker(join=None, extra=()):
    args = [str(PEERWASM), "worker", "--listen", "127.0.0.1:0", "--memory", "1GiB", "--reserve", "0",
            "--slots", "2", "--gossip-interval", "100ms", *extra]
    if join:
        args += ["--join", join]
    if os.environ.get("PEERWASM_CACHE_DIR"):
        # The compiled code run-tests keeps (CPython's takes 45 s to compile).
        args += ["--cache-dir", os.path.join(os.environ["PEERWASM_CACHE_DIR"], "worker"), "--max-compile-time", "10m"]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = p.stdout.readline()
    assert line.startswith("peerwasm worker listening on "), line
    return p, line.split()[-1]


@pytest.fixture
def pool():
    if not PEERWASM.exists():
        pytest.fail(f"no peerwasm binary at {PEERWASM}: run `cargo build -p peerwasm` (or set PEERWASM_BIN)")
    a, addr_a = _worker()
    b, addr_b = _worker(addr_a)
    try:
        deadline = time.time() + 10
        while time.time() < deadline:
            view = json.loads(subprocess.run([str(PEERWASM), "peers", "--json", "--peers", addr_a],
                                             capture_output=True, text=True).stdout or "[]")
            if sum(1 for p in view if p["liveness"] == "alive") == 2:
                break
            time.sleep(0.1)
        yield [addr_a, addr_b]
    finally:
        for p in (a, b):
            p.kill()
            p.wait()


def test_map_on_a_two_worker_pool(pool):
    inputs = [{"n": 1000 * (i + 1)} for i in range(40)]
    results = peerwasm.map(PRIMES, inputs, peers=pool[:1], mem="64MiB")
    assert [r.index for r in results] == list(range(40))
    local = peerwasm.map(PRIMES, inputs, mem="64MiB")
    assert [r.output for r in results] == [r.output for r in local]
    assert {r.peer for r in results} == set(pool), "both workers ran jobs"
    r = peerwasm.run(PRIMES, stdin='{"n": 100}', peers=pool)
    assert r.output == {"count": 25} and r.peer in pool


def test_a_pool_over_tls(tmp_path, monkeypatch):
    """With PEERWASM_TLS_CA the client speaks TLS, trusting that CA alone;
    without it, it cannot reach a TLS worker, and says why."""
    if not PEERWASM.exists():
        pytest.fail(f"no peerwasm binary at {PEERWASM}")
    tls = tmp_path / "tls"
    subprocess.run([str(PEERWASM), "tls", "init", str(tls)], check=True, capture_output=True)
    subprocess.run([str(PEERWASM), "tls", "issue", str(tls), "127.0.0.1"], check=True, capture_output=True)
    w, addr = _worker(extra=["--tls-cert", str(tls / "127.0.0.1.crt"), "--tls-key", str(tls / "127.0.0.1.key"),
                             "--tls-ca", str(tls / "ca.crt")])
    try:
        monkeypatch.delenv("PEERWASM_TLS_CA", raising=False)
        with pytest.raises(Exception, match="does this worker serve TLS"):
            peerwasm.run(PRIMES, stdin='{"n": 100}', peers=[addr])
        monkeypatch.setenv("PEERWASM_TLS_CA", str(tls / "ca.crt"))
        r = peerwasm.run(PRIMES, stdin='{"n": 100}', peers=[addr])
        assert r.output == {"count": 25} and r.peer == addr
        results = peerwasm.map(PRIMES, [{"n": 10 * (i + 1)} for i in range(8)], peers=[addr], mem="64MiB")
        assert [r.output["count"] for r in results] == [4, 8, 10, 12, 15, 17, 19, 22]
    finally:
        w.kill()
        w.wait()
