//! `elastic`: a pool that follows the work, on a real Slurm — `peerwasm
//! adapt` against dask-jobqueue's `SLURMCluster(...).adapt()`, the same run,
//! the same Slurm (`tests/slurm/cluster.sh`: four nodes of two cores and
//! 4 GiB), the same maximum workers (8 of one slot), from zero workers, on
//! two workloads:
//!
//! * **sleeps**: 200 jobs of 0.5 s;
//! * **mix**, heavy-tailed memory: 48 jobs that hold their memory 2 s (as
//!   I/O-bound analyses do), 64 MiB each but every 8th 768 MiB, the memory
//!   following the input's size (the `hold` guest: 1,024 × its input's
//!   bytes). peerwasm runs it three times — learning, then with the
//!   estimate the first run saved, then so again with workers of two slots
//!   (at most four: the same cores) — and asks `adapt --overhead 40MiB --min-mem 64MiB`
//!   (a worker's own processes take 4–17 MiB of its Slurm job's cgroup
//!   beside its jobs, measured; the module is a few KiB: its compiles need
//!   little); dask's workers
//!   are sized for the largest job (`memory="1.2GB"`), as its users must.
//!   Each controller's asks are printed (adapt's decisions, dask's
//!   `#SBATCH --mem`).
//!
//! For each: makespan (submit to the last result), time to the first
//! worker, time from the last result until the batch queue holds none of
//! its jobs (back to minimum), the batch jobs submitted, the jobs cancelled
//! without having run a job (adapt counts them; dask's adapt does not
//! say), and for the mix the memory-seconds the batch jobs held (their
//! `--mem` × the time each ran, sampled from `squeue` every 100 ms) against
//! those the work used (each job's memory × its 2 s).
//!
//! Before measuring, every node runs both programs once (this binary and
//! the venv's Python importing dask): the cluster was just started, and
//! its first jobs are slower for whichever controller goes first. Needs
//! root and Slurm (as the Slurm tests); dask-jobqueue is installed into a
//! venv of its own (`target/benchvenv-jobqueue`). Skipped with `--quick`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::Sizes;
use crate::summary::Summary;

mod dask;
use dask::{dask_jobqueue, dask_venv};

const MAX_WORKERS: u32 = 8;
const NODES: u32 = 4;

/// A workload, as each controller's client gets it.
struct Work {
    name: &'static str,
    /// peerwasm: the guest, one input per line, `--mem` if given.
    guest: &'static str,
    inputs: Vec<String>,
    mem: Option<&'static str>,
    /// adapt's options beyond the common ones.
    adapt: &'static [&'static str],
    /// dask: `(ms, bytes)` per task, and each worker's `memory=`.
    tasks: Vec<(u64, u64)>,
    dask_memory: &'static str,
    /// The memory-seconds the work itself uses, in GiB·s (0: not counted).
    used_gib_s: f64,
}

fn sleeps() -> Work {
    let (jobs, ms) = (200, 500);
    Work {
        name: "200 jobs of 0.5 s",
        guest: "sleep",
        inputs: vec![ms.to_string(); jobs],
        mem: Some("64MiB"),
        adapt: &[],
        tasks: vec![(ms, 0); jobs],
        dask_memory: "512MB",
        used_gib_s: 0.0,
    }
}

const MIX_JOBS: usize = 48;
const MIX_HOLD_MS: u64 = 2000;

fn mix() -> Work {
    let sizes: Vec<u64> = (0..MIX_JOBS)
        .map(|i| if i % 8 == 7 { 768 << 20 } else { 64 << 20 })
        .collect();
    // `MS x1024 PADDING`: the line (and its newline) is 1/1024 of the
    // memory the job holds.
    let inputs = sizes
        .iter()
        .map(|&bytes| {
            let head = format!("{MIX_HOLD_MS} x1024 ");
            let len = (bytes / 1024) as usize - 1;
            format!("{head}{}", "a".repeat(len - head.len()))
        })
        .collect();
    let used =
        sizes.iter().sum::<u64>() as f64 / f64::from(1u32 << 30) * (MIX_HOLD_MS as f64 / 1000.0);
    Work {
        name: "48 jobs holding 64 MiB (every 8th 768 MiB) for 2 s",
        guest: "hold",
        inputs,
        mem: None,
        adapt: &[
            "--overhead",
            "40MiB",
            "--min-mem",
            "64MiB",
            "--max-mem",
            "3900MiB",
        ],
        tasks: sizes.iter().map(|&b| (MIX_HOLD_MS, b)).collect(),
        dask_memory: "1.2GB",
        used_gib_s: used,
    }
}

/// What one controller did with the work.
#[derive(Debug, Default)]
struct Run {
    makespan: f64,
    first_worker: f64,
    back_to_min: f64,
    submitted: u64,
    cancelled_unused: Option<u64>,
    /// The batch jobs' memory × their running time, GiB·s.
    held_gib_s: f64,
    /// peerwasm: its jobs' memory limits × their wall times, GiB·s (what
    /// smartmem asked; what the workers held beyond it is the controller's).
    reserved_gib_s: Option<f64>,
}

pub fn elastic(sizes: &Sizes, summary: &mut Summary) -> anyhow::Result<()> {
    println!(
        "\n## Elastic pool on Slurm: from zero workers to at most {MAX_WORKERS}, peerwasm adapt vs dask-jobqueue"
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
        .args([&NODES.to_string(), "2", "4096"])
        .status()?;
    if !up.success() {
        println!(
            "not measured: no Slurm test cluster here (it needs root and slurm-wlm; see above)"
        );
        return Ok(());
    }
    let conf = dir.path().join("slurm/slurm.conf");
    let result = (|| -> anyhow::Result<()> {
        let venv = dask_venv();
        warm_up(&conf, venv.as_ref().ok().map(|v| v.as_path()))?;
        let (sleeps, mix) = (sleeps(), mix());
        let cache = dir.path().join("client-cache");
        let ours = peerwasm_adapt(&conf, dir.path(), &sleeps, &cache, "a", 1)?;
        let dask = dask_or_said(&venv, &conf, dir.path(), &sleeps);
        report_sleeps(&ours, dask.as_ref(), summary);
        let learning = peerwasm_adapt(&conf, dir.path(), &mix, &cache, "b", 1)?;
        let informed = peerwasm_adapt(&conf, dir.path(), &mix, &cache, "c", 1)?;
        let two_slots = peerwasm_adapt(&conf, dir.path(), &mix, &cache, "d", 2)?;
        let dask = dask_or_said(&venv, &conf, dir.path(), &mix);
        report_mix(
            &mix,
            [&learning, &informed, &two_slots],
            dask.as_ref(),
            summary,
        );
        Ok(())
    })();
    let _ = Command::new("bash")
        .arg(&script)
        .arg("down")
        .arg(dir.path().join("slurm"))
        .status();
    result
}

fn dask_or_said(
    venv: &anyhow::Result<std::path::PathBuf>,
    conf: &Path,
    dir: &Path,
    work: &Work,
) -> Option<Run> {
    let run = match venv {
        Ok(venv) => dask_jobqueue(venv, conf, dir, work),
        Err(e) => Err(anyhow::anyhow!("{e:#}")),
    };
    run.map_err(|e| println!("dask-jobqueue: not measured: {e:#}"))
        .ok()
}

fn header() {
    println!(
        "| controller | makespan | first worker | back to min after | Slurm jobs | cancelled unused | memory held |"
    );
    println!("|---|---|---|---|---|---|---|");
}

fn row(name: &str, r: &Run, used_gib_s: f64) {
    let held = if used_gib_s > 0.0 {
        format!(
            "{:.0} GiB·s ({:.2}× used)",
            r.held_gib_s,
            r.held_gib_s / used_gib_s
        )
    } else {
        format!("{:.0} GiB·s", r.held_gib_s)
    };
    println!(
        "| {name} | {:.1} s | {:.1} s | {:.1} s | {} | {} | {held} |",
        r.makespan,
        r.first_worker,
        r.back_to_min,
        r.submitted,
        r.cancelled_unused
            .map_or("not said".into(), |n| n.to_string())
    );
}

fn report_sleeps(ours: &Run, dask: Option<&Run>, summary: &mut Summary) {
    println!("\n### 200 jobs of 0.5 s");
    header();
    row("peerwasm adapt", ours, 0.0);
    if let Some(d) = dask {
        row("dask-jobqueue adapt", d, 0.0);
    }
    println!("(ideal on {MAX_WORKERS} workers, counting no start-up: 12.5 s)");
    summary.goal(
        "elastic: jobs cancelled without having worked",
        ours.cancelled_unused.unwrap_or(0).to_string(),
        "0",
        ours.cancelled_unused == Some(0),
        None,
    );
    match dask {
        Some(d) => {
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
}

/// The mix's peerwasm runs: learning, informed, informed with workers of
/// two slots (half as many: the same cores).
fn report_mix(work: &Work, ours: [&Run; 3], dask: Option<&Run>, summary: &mut Summary) {
    let names = ["learning", "informed", "informed, workers of 2 slots"];
    println!(
        "\n### Heavy-tailed memory: {} (the work uses {:.0} GiB·s)",
        work.name, work.used_gib_s
    );
    header();
    for (name, r) in names.iter().zip(ours) {
        row(&format!("peerwasm adapt, {name}"), r, work.used_gib_s);
    }
    if let Some(d) = dask {
        row("dask-jobqueue adapt", d, work.used_gib_s);
    }
    for (name, r) in names.iter().zip(ours) {
        if let Some(reserved) = r.reserved_gib_s {
            println!(
                "peerwasm {name}: its jobs (their last attempts) reserved {reserved:.0} GiB·s ({:.2}× used) of the {:.0} held ({:.2}× reserved)",
                reserved / work.used_gib_s,
                r.held_gib_s,
                r.held_gib_s / reserved
            );
        }
    }
    // The goal on the like-for-like run (8 workers of one slot, as dask's);
    // the same cores in workers of two slots said beside it.
    let ratio = ours[1].held_gib_s / work.used_gib_s;
    summary.goal(
        "elastic: memory held vs used, heavy-tailed mix (informed)",
        format!(
            "{ratio:.2}× (workers of 2 slots {:.2}×){}",
            ours[2].held_gib_s / work.used_gib_s,
            dask.map_or(String::new(), |d| format!(
                " (dask {:.2}×)",
                d.held_gib_s / work.used_gib_s
            ))
        ),
        "≤ 1.25×",
        ratio <= 1.25,
        None,
    );
}

/// Runs both programs once on every node: the first jobs of a cluster
/// just started, and the first loads of each binary, are slower.
fn warm_up(conf: &Path, venv: Option<&Path>) -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let mut cmd = format!("{} peerwasm --version >/dev/null", exe.display());
    if let Some(v) = venv {
        cmd.push_str(&format!(
            "; {} -c 'import dask_jobqueue, distributed'",
            v.join("bin/python").display()
        ));
    }
    let ok = Command::new("srun")
        .env("SLURM_CONF", conf)
        .args([
            &format!("--nodes={NODES}"),
            "--ntasks-per-node=1",
            "--mem=512M",
            "bash",
            "-c",
            &cmd,
        ])
        .stdout(Stdio::null())
        .status()?
        .success();
    anyhow::ensure!(ok, "the warm-up job failed");
    Ok(())
}

/// The batch jobs of one controller, sampled: which were seen, and the
/// memory-seconds those running held.
#[derive(Default)]
struct Queue {
    seen: std::collections::BTreeSet<String>,
    held_mib_s: f64,
    last: Option<Instant>,
}

impl Queue {
    /// One `squeue` sample of the jobs named `name`; how many there are.
    fn sample(&mut self, conf: &Path, name: &str) -> usize {
        let out = Command::new("squeue")
            .env("SLURM_CONF", conf)
            .args(["-h", "--name", name, "-o", "%i|%T|%m"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let now = Instant::now();
        let dt = self.last.map_or(0.0, |t| (now - t).as_secs_f64());
        self.last = Some(now);
        let mut n = 0;
        for line in out.lines() {
            let f: Vec<&str> = line.trim().split('|').collect();
            if f.len() != 3 {
                continue;
            }
            n += 1;
            self.seen.insert(f[0].to_string());
            if f[1] == "RUNNING" {
                self.held_mib_s += parse_mib(f[2]) * dt;
            }
        }
        n
    }
}

/// squeue's `%m` (`512M`, `1G`) in MiB.
fn parse_mib(s: &str) -> f64 {
    let (n, unit) = s.split_at(
        s.find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(s.len()),
    );
    let n: f64 = n.parse().unwrap_or(0.0);
    match unit {
        "G" => n * 1024.0,
        "T" => n * 1024.0 * 1024.0,
        _ => n,
    }
}

fn peerwasm_adapt(
    conf: &Path,
    dir: &Path,
    work: &Work,
    cache: &Path,
    tag: &str,
    slots: u32,
) -> anyhow::Result<Run> {
    let pool = dir.join(format!("pool-{tag}"));
    let name = format!("pwbench-adapt-{tag}");
    let log = dir.join(format!("adapt-{tag}.log"));
    let mut adapt = crate::procs::peerwasm()
        .env("SLURM_CONF", conf)
        .args(["adapt", "--pool-dir"])
        .arg(&pool)
        .args([
            "--name",
            &name,
            "--min",
            "0",
            "--max",
            &(MAX_WORKERS / slots).to_string(),
            "--slots",
            &slots.to_string(),
            "--idle",
            "3s",
            "--poll",
            "500ms",
        ])
        .args(work.adapt)
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
    let inputs = dir.join(format!("inputs-{tag}.txt"));
    std::fs::write(&inputs, work.inputs.join("\n") + "\n")?;
    let out = dir.join(format!("out-{tag}.jsonl"));
    let start = Instant::now();
    let mut map = crate::procs::peerwasm();
    map.arg("map")
        .arg(peerwasm_testkit::guest_wasm(work.guest))
        .arg(&inputs)
        .arg("--pool-dir")
        .arg(&pool)
        .arg("--cache-dir")
        .arg(cache)
        .arg("-o")
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join(format!("map-{tag}.err")))?);
    if let Some(mem) = work.mem {
        map.args(["--mem", mem]);
    }
    let mut map = map.spawn()?;
    let mut queue = Queue::default();
    let mut first_worker = None;
    let members = || std::fs::read_dir(pool.join("members")).map_or(0, |d| d.count());
    let status = loop {
        queue.sample(conf, &name);
        if first_worker.is_none() && members() > 0 {
            first_worker = Some(start.elapsed().as_secs_f64());
        }
        if let Some(s) = map.try_wait()? {
            break s;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let makespan = start.elapsed().as_secs_f64();
    anyhow::ensure!(
        status.success(),
        "the map failed: {}",
        std::fs::read_to_string(dir.join(format!("map-{tag}.err"))).unwrap_or_default()
    );
    let results: Vec<serde_json::Value> = std::fs::read_to_string(&out)?
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    anyhow::ensure!(
        results.len() == work.inputs.len() && results.iter().all(|r| r["exit_code"] == 0),
        "{} results of {}, not all exited 0",
        results.len(),
        work.inputs.len()
    );
    let ended = Instant::now();
    while queue.sample(conf, &name) > 0 {
        anyhow::ensure!(
            ended.elapsed() < Duration::from_secs(120),
            "the pool did not shrink back to zero"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let back_to_min = ended.elapsed().as_secs_f64();
    let reserved_gib_s = results
        .iter()
        .map(|r| {
            r["memory_limit_bytes"].as_f64().unwrap_or(0.0)
                * r["wall_time_us"].as_f64().unwrap_or(0.0)
                / 1e6
        })
        .sum::<f64>()
        / f64::from(1u32 << 30);
    // Stopped as Ctrl-C would: it cancels what it submitted, and says so.
    Command::new("kill")
        .args(["-TERM", &adapt.id().to_string()])
        .status()?;
    adapt.wait()?;
    let said = std::fs::read_to_string(&log)?;
    if work.used_gib_s > 0.0 {
        for l in said
            .lines()
            .filter(|l| l.starts_with("peerwasm adapt: growing"))
        {
            println!("  {tag}: {}", l.trim_start_matches("peerwasm adapt: "));
        }
        let err = std::fs::read_to_string(dir.join(format!("map-{tag}.err"))).unwrap_or_default();
        let tail: Vec<&str> = err.lines().rev().take(3).collect();
        for l in tail.into_iter().rev() {
            println!("  {tag} map: {}", l.trim());
        }
    }
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
        submitted: queue.seen.len() as u64,
        cancelled_unused: unused,
        held_gib_s: queue.held_mib_s / 1024.0,
        reserved_gib_s: Some(reserved_gib_s),
    })
}
