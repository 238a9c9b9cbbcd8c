//! The anchor of `elastic`: dask-jobqueue's `SLURMCluster(...).adapt()`,
//! run from its own venv on the same Slurm, the same work.

use std::path::Path;
use std::process::Command;

use super::{MAX_WORKERS, Run, Work};

/// The anchor, as its users run it: `SLURMCluster(cores=1, processes=1,
/// memory=...).adapt(minimum=0, maximum=8)` and `client.map` over tasks
/// that hold `bytes` for `ms` (a sleep when 0).
const DASK_SCRIPT: &str = r#"
import json, subprocess, sys, threading, time
from dask_jobqueue import SLURMCluster
from distributed import Client

tasks, most, outdir, memory = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
name = "pwbench-dask"
def mib(s):
    unit = s[-1]
    n = float(s[:-1]) if unit.isalpha() else float(s)
    return n * {"G": 1024, "T": 1024 * 1024}.get(unit, 1)
def jobs():
    out = subprocess.run(["squeue", "-h", "--name", name, "-o", "%i|%T|%m"], capture_output=True, text=True).stdout
    return [l.split("|") for l in out.split() if l.count("|") == 2]
cluster = SLURMCluster(cores=1, processes=1, memory=memory, walltime="00:30:00", job_name=name,
                       scheduler_options={"host": "10.77.0.1"},
                       job_extra_directives=[f"--output={outdir}/dask-%j.out"])
cluster.adapt(minimum=0, maximum=most)
client = Client(cluster)
seen, held, stop = set(), [0.0], False
def poll():
    last = time.time()
    while not stop:
        now = time.time()
        for i, state, m in jobs():
            seen.add(i)
            if state == "RUNNING":
                held[0] += mib(m) * (now - last)
        last = now
        time.sleep(0.1)
threading.Thread(target=poll, daemon=True).start()
def work(task):
    ms, n = task
    block = bytearray(n)
    for i in range(0, n, 4096):
        block[i] = 1
    time.sleep(ms / 1000)
    return len(block)
t0 = time.time()
futures = client.map(work, tasks, pure=False)
first = None
while first is None:
    if client.scheduler_info()["workers"]:
        first = time.time() - t0
    time.sleep(0.05)
results = client.gather(futures)
makespan = time.time() - t0
assert results == [n for _, n in tasks]
# Released, as a user's loop would: a worker holding results is never let go.
del futures
t1 = time.time()
while jobs() and time.time() - t1 < 120:
    time.sleep(0.1)
back = time.time() - t1
stop = True
mem = [l.strip() for l in cluster.job_script().splitlines() if "--mem" in l]
print(json.dumps({"makespan": makespan, "first_worker": first, "back_to_min": back, "submitted": len(seen),
                  "held_gib_s": held[0] / 1024, "mem": mem}))
client.close()
cluster.close()
"#;

/// `target/benchvenv-jobqueue`, with dask-jobqueue (and only what it
/// needs: the anchors' venv also carries Ray and the wasmtime CLI).
pub(super) fn dask_venv() -> anyhow::Result<std::path::PathBuf> {
    let dir = peerwasm_testkit::workspace_root()
        .join("target")
        .join("benchvenv-jobqueue");
    if !dir.join("bin").join("python").exists() {
        let ok = Command::new("python3")
            .arg("-m")
            .arg("venv")
            .arg(&dir)
            .status()?
            .success();
        anyhow::ensure!(ok, "python3 -m venv {} failed", dir.display());
    }
    let pip = Command::new(dir.join("bin/pip"))
        .args(["install", "--quiet", "dask-jobqueue"])
        .output()?;
    anyhow::ensure!(
        pip.status.success(),
        "pip install dask-jobqueue: {}",
        String::from_utf8_lossy(&pip.stderr).trim()
    );
    Ok(dir)
}

pub(super) fn dask_jobqueue(
    venv: &Path,
    conf: &Path,
    dir: &Path,
    work: &Work,
) -> anyhow::Result<Run> {
    let script = dir.join("dask_adapt.py");
    std::fs::write(&script, DASK_SCRIPT)?;
    let out = Command::new(venv.join("bin/python"))
        .env("SLURM_CONF", conf)
        .arg(&script)
        .arg(serde_json::to_string(&work.tasks)?)
        .arg(MAX_WORKERS.to_string())
        .arg(dir)
        .arg(work.dask_memory)
        .current_dir(dir)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "the dask run failed: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .ok_or_else(|| anyhow::anyhow!("no figures from dask: {text}"))?;
    let v: serde_json::Value = serde_json::from_str(line)?;
    let f = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    if work.used_gib_s > 0.0 {
        println!("  dask: each worker job {}", v["mem"]);
    }
    Ok(Run {
        makespan: f("makespan"),
        first_worker: f("first_worker"),
        back_to_min: f("back_to_min"),
        submitted: f("submitted") as u64,
        cancelled_unused: None,
        held_gib_s: f("held_gib_s"),
        reserved_gib_s: None,
    })
}
