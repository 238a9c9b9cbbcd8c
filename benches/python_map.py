"""The python-map benchmark (`peerwasm-benches python-map`): one function
mapped over its inputs by serial Python, multiprocessing.Pool(2), joblib
(n_jobs=2), Dask (a local cluster of 2 processes), Ray (local, 2 CPUs) and
peerwasm (the embedded worker, and a pool of two 1-slot workers), each as a
user meets it: a fresh Python process running a script, the whole process
timed, the runners interleaved round by round. Also the time to the first
result (from the process's start), and the map's own cost: its wall time
(the whole process less that of the same script with no map: Python's
start and the workload's imports, which every runner pays) against the
ideal from the sandbox's own speed (the same calls one after another in
one sandboxed interpreter, divided by the 2 slots); the whole process
against the same ideal is printed beside it.

Run by the Rust bench with the benchmark venv's python; arguments: the
peerwasm binary, the rounds, and any arguments the binary needs before a
subcommand. Prints a markdown table per workload.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

# The peerwasm command: an executable, then the rounds, then arguments that
# come before a subcommand (the benches binary is `peerwasm-benches peerwasm`).
PEERWASM = [sys.argv[1], *sys.argv[3:]]
ROUNDS = int(sys.argv[2])

WORKLOADS = textwrap.dedent(
    """\
    import numpy as np
    from sklearn.datasets import make_classification
    from sklearn.linear_model import LogisticRegression


    def numpy_task(seed):
        rng = np.random.default_rng(seed)
        a = rng.random((500, 500))
        for _ in range(20):
            a = np.tanh(a @ a.T / 500.0)
        return float(a.sum())


    def fit(seed):
        X, y = make_classification(n_samples=300, n_features=12, random_state=seed)
        return float(LogisticRegression(max_iter=200).fit(X, y).score(X, y))


    def tiny(x):
        return x + 1
    """
)

# (name, function, inputs, whether it is real work: measured against the ideal)
CASES = [
    ("16 numpy tasks", "numpy_task", "list(range(16))", True),
    ("24 small scikit-learn fits", "fit", "list(range(24))", True),
    ("a tiny function, 1,000 calls", "tiny", "list(range(1000))", False),
]

# Each runner: a script body that maps `fn` over `items`, and sets `first`
# to the time.time() of the first result it could hand over.
RUNNERS = {
    # The script with no map: Python's start and the workload's imports,
    # which every runner pays; the rest of a runner's time is its map's.
    "no map": """
out = [None] * len(items)
first = time.time()
""",
    "serial": """
out = []
for i in items:
    out.append(fn(i))
    first = first or time.time()
""",
    "Pool(2)": """
from multiprocessing import Pool
with Pool(2) as p:
    out = []
    for r in p.imap(fn, items):
        out.append(r)
        first = first or time.time()
""",
    "joblib": """
from joblib import Parallel, delayed
out = []
for r in Parallel(n_jobs=2, return_as="generator")(delayed(fn)(i) for i in items):
    out.append(r)
    first = first or time.time()
""",
    "Dask": """
from dask.distributed import Client, LocalCluster, as_completed
if __name__ == "__main__":
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as c, Client(c) as cl:
        futures = cl.map(fn, items)
        for f in as_completed(futures):
            first = first or time.time()
            break
        out = cl.gather(futures)
""",
    "Ray": """
import ray
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
f = ray.remote(fn)
refs = [f.remote(i) for i in items]
ray.wait(refs, num_returns=1)
first = time.time()
out = ray.get(refs)
""",
    "peerwasm embedded": """
import peerwasm
out = []
for r in peerwasm.imap(fn, items):
    out.append(r)
    first = first or time.time()
""",
    "peerwasm pool (2)": """
import peerwasm
out = []
for r in peerwasm.imap(fn, items, peers=os.environ["PW_PEERS"].split(",")):
    out.append(r)
    first = first or time.time()
""",
}

SCRIPT = """\
import os, sys, time, json
sys.path.insert(0, {dir!r})
from wl import {fn} as fn
items = {items}
first = None
{body}
if __name__ == "__main__":
    assert len(out) == len(items)
    print(json.dumps({{"first": first}}))
"""

IDEAL = """\
import sys, time
sys.path.insert(0, {dir!r})
from wl import {fn} as fn
items = {items}
t = time.perf_counter()
for i in items:
    fn(i)
print(time.perf_counter() - t)
"""


def start_worker(join=None):
    args = [*PEERWASM, "worker", "--listen", "127.0.0.1:0", "--memory", "4GiB", "--reserve", "0",
            "--slots", "1", "--gossip-interval", "100ms", "--max-compile-time", "10m"]
    if os.environ.get("PEERWASM_CACHE_DIR"):
        args += ["--cache-dir", os.path.join(os.environ["PEERWASM_CACHE_DIR"], "worker")]
    if join:
        args += ["--join", join]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = p.stdout.readline()
    assert line.startswith("peerwasm worker listening on "), line
    return p, line.split()[-1]


def timed(script_path, env):
    t0 = time.time()
    out = subprocess.run([sys.executable, script_path], capture_output=True, text=True, env=env)
    wall = time.time() - t0
    if out.returncode != 0:
        raise RuntimeError(f"{script_path} failed: {out.stderr[-2000:]}")
    first = json.loads(out.stdout.strip().splitlines()[-1])["first"]
    return wall, first - t0


def ideal(d, fn, items):
    """The calls one after another in one sandboxed interpreter: seconds."""
    work = os.path.join(d, "ideal")
    os.makedirs(work, exist_ok=True)
    with open(os.path.join(work, "wl.py"), "w") as f:
        f.write(WORKLOADS)
    with open(os.path.join(work, "ideal.py"), "w") as f:
        f.write(IDEAL.format(dir="/work", fn=fn, items=items))
    out = subprocess.run([*PEERWASM, "run", "--python", "--mem", "2GiB", "--dir", f"{work}::/work:ro",
                          os.path.join(work, "ideal.py")], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"the ideal run failed: {out.stderr[-2000:]}")
    return float(out.stdout.strip())


def native(d, fn, items):
    """The same calls one after another in this (native) Python: seconds."""
    code = IDEAL.format(dir=d, fn=fn, items=items)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def main():
    d = tempfile.mkdtemp(prefix="pw-python-map-")
    with open(os.path.join(d, "wl.py"), "w") as f:
        f.write(WORKLOADS)
    a, addr = start_worker()
    b, _ = start_worker(addr)
    env = dict(os.environ, PW_PEERS=addr, RAY_DEDUP_LOGS="0")
    try:
        time.sleep(1)
        for case, fn, items, real in CASES:
            scripts = {}
            for name, body in RUNNERS.items():
                path = os.path.join(d, f"{fn}-{len(scripts)}.py")
                with open(path, "w") as f:
                    f.write(SCRIPT.format(dir=d, fn=fn, items=items, body=body))
                scripts[name] = path
            # Untimed: compiles, snapshots of the stdlib dir, Ray's first start.
            for name in ("peerwasm embedded", "peerwasm pool (2)"):
                timed(scripts[name], env)
            walls = {n: [] for n in scripts}
            firsts = {n: [] for n in scripts}
            for _ in range(ROUNDS):
                for name, path in scripts.items():
                    w, f1 = timed(path, env)
                    walls[name].append(w)
                    firsts[name].append(f1)
            med = {n: statistics.median(v) for n, v in walls.items()}
            print(f"\n### {case} — whole process, median of {ROUNDS} interleaved rounds (s)\n")
            print("| runner | wall | first result | × joblib |")
            print("|---|---|---|---|")
            for name in scripts:
                print(f"| {name} | {med[name]:.2f} | {statistics.median(firsts[name]):.2f} | "
                      f"{med[name] / med['joblib']:.2f}× |")
            if not real:
                continue
            sandbox = ideal(d, fn, items)
            ideal_wall = sandbox / 2
            for name in ("peerwasm embedded", "peerwasm pool (2)"):
                own = med[name] - med["no map"]
                print(f"\n{name}: the calls take {sandbox:.2f} s one after another in one sandboxed interpreter; "
                      f"ideal on 2 slots {ideal_wall:.2f} s; the map's own wall time (its process less the "
                      f"script with no map, {med['no map']:.2f} s) {own:.2f} s = **{own / ideal_wall:.2f}× the "
                      f"ideal**; its whole process {med[name]:.2f} s = {med[name] / ideal_wall:.2f}×")
            print(f"sandboxed CPython computes these calls in {sandbox / native(d, fn, items):.2f}× the time "
                  f"native CPython does (one after another, imports excluded)")
            sys.stdout.flush()
    finally:
        for p in (a, b):
            p.kill()
            p.wait()


if __name__ == "__main__":
    main()
