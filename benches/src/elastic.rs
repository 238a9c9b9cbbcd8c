//! `elastic`: a pool that follows the work, on a real Slurm — `peerwasm
//! adapt` against dask-jobqueue's `SLURMCluster(...).adapt()`, the same run,
//! the same Slurm (`tests/slurm/cluster.sh`: four nodes of two cores), the
//! same maximum workers (8 of one slot), the same work: 200 jobs of 0.5 s
//! from zero workers.
//!
//! For each: makespan (submit to the last result), time to the first
//! worker, time from the last result until the batch queue holds none of
//! its jobs (back to minimum), the batch jobs submitted, and, for peerwasm,
//! the jobs cancelled without having run a job (adapt counts them; dask's
//! adapt does not say). Needs root and Slurm (as the Slurm tests); dask-
//! jobqueue is installed into a venv of its own (`target/benchvenv-jobqueue`).
//! Skipped with `--quick`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::Sizes;
use crate::summary::Summary;

const JOBS: usize = 200;
const JOB_MS: u64 = 500;
const MAX_WORKERS: u32 = 8;

/// What one controller did with the work.
#[derive(Debug, Default)]
struct Run {
    makespan: f64,
    first_worker: f64,
    back_to_min: f64,
    submitted: u64,
    cancelled_unused: Option<u64>,
}

pub fn elastic(sizes: &Sizes, summary: &mut Summary) -> anyhow::Result<()> {
    println!(
        "\n## Elastic pool on Slurm: {JOBS} jobs of {JOB_MS} ms from zero workers, at most {MAX_WORKERS}"
    );
    if sizes.quick {
        println!("skipped with --quick (it starts a Slurm and installs dask-jobqueue)");
        return Ok(());
    }
    let root = peerwasm_testkit::workspace_root();
    let dir = tempfile::tempdir()?;
    let script = root.join("tests/slurm/cluster.sh");
    let up = Command::new("bash")
        .arg(&script)
        .arg("up")
        .arg(dir.path().join("slurm"))
        .args(["4", "2", "4096"])
        .status()?;
    if !up.success() {
        println!(
            "not measured: no Slurm test cluster here (it needs root and slurm-wlm; see above)"
        );
        return Ok(());
    }
    let conf = dir.path().join("slurm/slurm.conf");
    let result = (|| -> anyhow::Result<(Run, Option<Run>)> {
        let ours = peerwasm_adapt(&conf, dir.path())?;
        let dask = match dask_venv().and_then(|venv| dask_jobqueue(&venv, &conf, dir.path())) {
            Ok(r) => Some(r),
            Err(e) => {
                println!("dask-jobqueue: not measured: {e:#}");
                None
            }
        };
        Ok((ours, dask))
    })();
    let _ = Command::new("bash")
        .arg(&script)
        .arg("down")
        .arg(dir.path().join("slurm"))
        .status();
    let (ours, dask) = result?;
    println!(
        "| controller | makespan | first worker | back to min after | Slurm jobs | cancelled unused |"
    );
    println!("|---|---|---|---|---|---|");
    let row = |name: &str, r: &Run| {
        println!(
            "| {name} | {:.1} s | {:.1} s | {:.1} s | {} | {} |",
            r.makespan,
            r.first_worker,
            r.back_to_min,
            r.submitted,
            r.cancelled_unused
                .map_or("not said".into(), |n| n.to_string())
        )
    };
    row("peerwasm adapt", &ours);
    let ideal = JOBS as f64 * JOB_MS as f64 / 1000.0 / f64::from(MAX_WORKERS);
    println!("(ideal on {MAX_WORKERS} workers, counting no start-up: {ideal:.1} s)");
    summary.goal(
        "elastic: jobs cancelled without having worked",
        ours.cancelled_unused.unwrap_or(0).to_string(),
        "0",
        ours.cancelled_unused == Some(0),
        None,
    );
    match dask {
        Some(d) => {
            row("dask-jobqueue adapt", &d);
            let ratio = ours.makespan / d.makespan;
            println!(
                "makespan {ratio:.2}× dask-jobqueue; back to minimum {:.1} s vs {:.1} s",
                ours.back_to_min, d.back_to_min
            );
            summary.goal(
                "elastic: makespan vs dask-jobqueue (200 × 0.5 s from 0 workers)",
                format!("{ratio:.2}×"),
                "≤ 0.8×",
                ratio <= 0.8,
                None,
            );
            summary.goal(
                "elastic: back to minimum after the work",
                format!("{:.1} s (dask {:.1} s)", ours.back_to_min, d.back_to_min),
                "no slower than dask",
                ours.back_to_min <= d.back_to_min + 0.5,
                None,
            );
        }
        None => summary.figure(
            "elastic: makespan (200 × 0.5 s from 0 workers)",
            format!("{:.1} s", ours.makespan),
            None,
        ),
    }
    Ok(())
}

/// Distinct Slurm jobs named `name` seen so far.
fn squeue_ids(conf: &Path, name: &str) -> Vec<String> {
    Command::new("squeue")
        .env("SLURM_CONF", conf)
        .args(["-h", "--name", name, "-o", "%i"])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

fn peerwasm_adapt(conf: &Path, dir: &Path) -> anyhow::Result<Run> {
    let pool = dir.join("pool");
    let name = "pwbench-adapt";
    let log = dir.join("adapt.log");
    let mut adapt = crate::procs::peerwasm()
        .env("SLURM_CONF", conf)
        .args(["adapt", "--pool-dir"])
        .arg(&pool)
        .args([
            "--name",
            name,
            "--min",
            "0",
            "--max",
            &MAX_WORKERS.to_string(),
            "--idle",
            "3s",
            "--poll",
            "500ms",
        ])
        .arg(format!("--sbatch=--output={}/%j.out", dir.display()))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()?;
    let t = Instant::now();
    while !pool.join("controller.json").exists() {
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(20),
            "peerwasm adapt did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let inputs = dir.join("inputs.txt");
    std::fs::write(&inputs, format!("{JOB_MS}\n").repeat(JOBS))?;
    let start = Instant::now();
    let mut map = crate::procs::peerwasm()
        .arg("map")
        .arg(peerwasm_testkit::guest_wasm("sleep"))
        .arg(&inputs)
        .arg("--pool-dir")
        .arg(&pool)
        .args(["--mem", "64MiB", "-o"])
        .arg(dir.join("out.jsonl"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let mut seen = std::collections::BTreeSet::new();
    let mut first_worker = None;
    let members = || std::fs::read_dir(pool.join("members")).map_or(0, |d| d.count());
    let status = loop {
        seen.extend(squeue_ids(conf, name));
        if first_worker.is_none() && members() > 0 {
            first_worker = Some(start.elapsed().as_secs_f64());
        }
        if let Some(s) = map.try_wait()? {
            break s;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let makespan = start.elapsed().as_secs_f64();
    anyhow::ensure!(status.success(), "the map failed");
    let lines = std::fs::read_to_string(dir.join("out.jsonl"))?
        .lines()
        .count();
    anyhow::ensure!(lines == JOBS, "{lines} results of {JOBS}");
    let ended = Instant::now();
    while !squeue_ids(conf, name).is_empty() {
        anyhow::ensure!(
            ended.elapsed() < Duration::from_secs(120),
            "the pool did not shrink back to zero"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let back_to_min = ended.elapsed().as_secs_f64();
    // Stopped as Ctrl-C would: it cancels what it submitted, and says so.
    Command::new("kill")
        .args(["-TERM", &adapt.id().to_string()])
        .status()?;
    adapt.wait()?;
    let said = std::fs::read_to_string(&log)?;
    let unused = said.lines().rev().find_map(|l| {
        l.split(" cancelled (")
            .nth(1)?
            .split_whitespace()
            .next()?
            .parse::<u64>()
            .ok()
    });
    Ok(Run {
        makespan,
        first_worker: first_worker.unwrap_or(makespan),
        back_to_min,
        submitted: seen.len() as u64,
        cancelled_unused: unused,
    })
}

/// The anchor, as its users run it: `SLURMCluster(cores=1, processes=1,
/// memory="512MB").adapt(minimum=0, maximum=8)` and `client.map`.
const DASK_SCRIPT: &str = r#"
import json, subprocess, sys, threading, time
from dask_jobqueue import SLURMCluster
from distributed import Client

jobs, ms, most, outdir = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
name = "pwbench-dask"
def ids():
    out = subprocess.run(["squeue", "-h", "--name", name, "-o", "%i"], capture_output=True, text=True).stdout
    return out.split()
cluster = SLURMCluster(cores=1, processes=1, memory="512MB", walltime="00:30:00", job_name=name,
                       scheduler_options={"host": "10.77.0.1"},
                       job_extra_directives=[f"--output={outdir}/dask-%j.out"])
cluster.adapt(minimum=0, maximum=most)
client = Client(cluster)
seen, stop = set(), False
def poll():
    while not stop:
        seen.update(ids())
        time.sleep(0.1)
threading.Thread(target=poll, daemon=True).start()
def work(i):
    time.sleep(ms / 1000)
    return i
t0 = time.time()
futures = client.map(work, range(jobs))
first = None
while first is None:
    if client.scheduler_info()["workers"]:
        first = time.time() - t0
    time.sleep(0.05)
results = client.gather(futures)
makespan = time.time() - t0
assert sorted(results) == list(range(jobs))
# Released, as a user's loop would: a worker holding results is never let go.
del futures
t1 = time.time()
while ids() and time.time() - t1 < 120:
    time.sleep(0.1)
back = time.time() - t1
stop = True
print(json.dumps({"makespan": makespan, "first_worker": first, "back_to_min": back, "submitted": len(seen)}))
client.close()
cluster.close()
"#;

/// `target/benchvenv-jobqueue`, with dask-jobqueue (and only what it
/// needs: the anchors' venv also carries Ray and the wasmtime CLI).
fn dask_venv() -> anyhow::Result<std::path::PathBuf> {
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

fn dask_jobqueue(venv: &Path, conf: &Path, dir: &Path) -> anyhow::Result<Run> {
    let script = dir.join("dask_adapt.py");
    std::fs::write(&script, DASK_SCRIPT)?;
    let out = Command::new(venv.join("bin/python"))
        .env("SLURM_CONF", conf)
        .arg(&script)
        .args([
            JOBS.to_string(),
            JOB_MS.to_string(),
            MAX_WORKERS.to_string(),
        ])
        .arg(dir)
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
    Ok(Run {
        makespan: f("makespan"),
        first_worker: f("first_worker"),
        back_to_min: f("back_to_min"),
        submitted: f("submitted") as u64,
        cancelled_unused: None,
    })
}
