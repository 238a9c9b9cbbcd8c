//! peerwasm on a real Slurm: slurmctld and four slurmd, each node in a
//! network namespace of its own, started by `tests/slurm/cluster.sh` once
//! for this test binary (and taken down when it exits). Here: the harness,
//! the static recipe (`contrib/slurm/peerwasm-pool.sbatch`) and a worker
//! draining before its walltime; `memory.rs`: what a worker lends of its
//! allocation; `adapt.rs`: `peerwasm adapt` growing and
//! shrinking a pool for a map, memory-shaped workers, a worker killed by
//! Slurm mid-map, a worker job Slurm will never start.
//!
//! Without root or Slurm these tests say so and pass without running;
//! `run-tests` installs Slurm where it can and then sets
//! `PEERWASM_TEST_SLURM=require`, which turns a cluster that does not start
//! into a failure. They run one at a time: they share the cluster's
//! 4 × 2 cores.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::support::PEERWASM;

mod adapt;
mod memory;

/// The cluster of this test binary, if this machine can run one.
struct Cluster {
    conf: PathBuf,
}

fn cluster() -> Option<&'static Cluster> {
    static CLUSTER: OnceLock<Option<Cluster>> = OnceLock::new();
    CLUSTER
        .get_or_init(|| {
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("slurm/cluster.sh");
            let dir = std::env::temp_dir().join(format!("peerwasm-slurm-{}", std::process::id()));
            let status = Command::new("bash")
                .arg(&script)
                .args(["up"])
                .arg(&dir)
                .args(["4", "2", "4096", "--watch", &std::process::id().to_string()])
                .status()
                .expect("running tests/slurm/cluster.sh");
            let required = std::env::var("PEERWASM_TEST_SLURM").is_ok_and(|v| v == "require");
            match status.code() {
                Some(0) => Some(Cluster { conf: dir.join("slurm.conf") }),
                Some(2) if !required => {
                    eprintln!("slurm tests: skipped (no Slurm test cluster on this machine; see above)");
                    None
                }
                _ => panic!("the Slurm test cluster did not start (tests/slurm/cluster.sh up {}): see above", dir.display()),
            }
        })
        .as_ref()
}

/// One test on the cluster at a time.
async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}

impl Cluster {
    fn cmd(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.env("SLURM_CONF", &self.conf);
        c
    }

    fn run(&self, program: &str, args: &[&str]) -> String {
        let out = self
            .cmd(program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{program}: {e}"));
        assert!(
            out.status.success(),
            "{program} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `(id, state, memory in MiB)` of the jobs named `name`.
    fn jobs(&self, name: &str) -> Vec<(String, String, u64)> {
        self.run("squeue", &["-h", "--name", name, "-o", "%i|%T|%m"])
            .lines()
            .filter_map(|l| {
                let mut f = l.trim().split('|');
                let (id, state, mem) = (f.next()?, f.next()?, f.next()?);
                Some((id.to_string(), state.to_string(), parse_mib(mem)?))
            })
            .collect()
    }

    /// Submits `wrap` (`--wrap=…`) as a batch job named `name` with
    /// `options`, its output in `dir`; its id.
    fn sbatch_wrap(&self, name: &str, options: &[&str], dir: &Path, wrap: &str) -> String {
        let (job_name, output) = (
            format!("--job-name={name}"),
            format!("--output={}/%j.out", dir.display()),
        );
        let mut args = vec!["--parsable", &job_name, &output];
        args.extend(options);
        args.push(wrap);
        self.run("sbatch", &args).trim().to_string()
    }

    fn running(&self, name: &str) -> usize {
        self.jobs(name)
            .iter()
            .filter(|(_, s, _)| s == "RUNNING")
            .count()
    }
}

/// What batch job `id` (submitted with `Cluster::sbatch_wrap`) wrote to
/// `dir` so far.
fn job_log(dir: &Path, id: &str) -> String {
    std::fs::read_to_string(dir.join(format!("{id}.out"))).unwrap_or_default()
}

/// The pool in `pool_dir` as `peerwasm peers --json` shows it (empty if
/// nobody answers).
fn pool_view(pool_dir: &Path) -> Vec<serde_json::Value> {
    let out = Command::new(PEERWASM)
        .args(["peers", "--json", "--pool-dir"])
        .arg(pool_dir)
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_default()
}

/// squeue's `%m` (`512M`, `1G`) in MiB.
fn parse_mib(s: &str) -> Option<u64> {
    let s = s.trim();
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit())?);
    let n: u64 = n.parse().ok()?;
    Some(match unit {
        "M" => n,
        "G" => n * 1024,
        "T" => n * 1024 * 1024,
        _ => return None,
    })
}

/// Waits until `ok()` holds, or fails saying `what` (and `context()`).
async fn until(
    limit: Duration,
    what: &str,
    mut ok: impl FnMut() -> bool,
    context: impl Fn() -> String,
) -> Duration {
    let t = Instant::now();
    while !ok() {
        if t.elapsed() > limit {
            panic!("not within {limit:?}: {what}\n{}", context());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    t.elapsed()
}

/// A pool directory of one test, with `peerwasm adapt` over it; the
/// controller is stopped (SIGTERM: it cancels its jobs) when dropped.
struct Elastic<'c> {
    cluster: &'c Cluster,
    dir: tempfile::TempDir,
    name: String,
    adapt: Child,
}

impl<'c> Elastic<'c> {
    fn start(cluster: &'c Cluster, name: &str, args: &[&str]) -> Elastic<'c> {
        // A directory the nodes share: every node is this machine.
        let dir = tempfile::tempdir().unwrap();
        let pool = dir.path().join("pool");
        let log = std::fs::File::create(dir.path().join("adapt.log")).unwrap();
        let name = format!("pwtest-{name}-{}", std::process::id());
        let adapt = cluster
            .cmd(PEERWASM)
            .args(["adapt", "--pool-dir"])
            .arg(&pool)
            .args(["--name", &name, "--poll", "500ms", "--idle", "3s"])
            .arg(format!("--sbatch=--output={}/%j.out", dir.path().display()))
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        // Clients find the controller through its notice.
        let t = Instant::now();
        while !pool.join("controller.json").exists() {
            assert!(
                t.elapsed() < Duration::from_secs(20),
                "peerwasm adapt did not announce itself in {}",
                pool.display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Elastic {
            cluster,
            dir,
            name,
            adapt,
        }
    }

    fn pool(&self) -> PathBuf {
        self.dir.path().join("pool")
    }

    fn log(&self) -> String {
        let mut out =
            std::fs::read_to_string(self.dir.path().join("adapt.log")).unwrap_or_default();
        out.push_str(&format!("\nsqueue: {:?}", self.cluster.jobs(&self.name)));
        out
    }

    fn members(&self) -> usize {
        members_in(&self.pool())
    }

    /// A `peerwasm map` of `inputs` over the pool directory, in the
    /// background; its results go to `out`.
    fn map(&self, inputs: &[String], mem: &str, out: &Path) -> Child {
        let input = self
            .dir
            .path()
            .join(format!("inputs-{}.txt", rand::random::<u32>()));
        std::fs::write(&input, inputs.join("\n") + "\n").unwrap();
        self.cluster
            .cmd(PEERWASM)
            .arg("map")
            .arg(guest("sleep"))
            .arg(&input)
            .arg("--pool-dir")
            .arg(self.pool())
            .args(["--mem", mem, "-o"])
            .arg(out)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// Stops the controller; what it said at the end.
    fn stop(&mut self) -> String {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.adapt.id() as i32, libc::SIGTERM) };
        let _ = self.adapt.wait();
        self.log()
    }
}

impl Drop for Elastic<'_> {
    fn drop(&mut self) {
        if self.adapt.try_wait().ok().flatten().is_none() {
            self.stop();
        }
        // Whatever is left of this test's jobs, whatever happened.
        let _ = self
            .cluster
            .cmd("scancel")
            .args(["--name", &self.name])
            .status();
    }
}

/// The workers a pool directory lists as running.
fn members_in(pool: &Path) -> usize {
    std::fs::read_dir(pool.join("members")).map_or(0, |d| d.count())
}

fn guest(name: &str) -> PathBuf {
    peerwasm_testkit::guest_wasm(name)
}

/// The results file of a map: every index once, every job exited 0.
fn check_results(out: &Path, n: usize) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(out).unwrap();
    let items: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let indices: BTreeSet<u64> = items.iter().map(|i| i["index"].as_u64().unwrap()).collect();
    assert_eq!(items.len(), n, "one result per input");
    assert_eq!(indices, (0..n as u64).collect(), "every input once");
    for i in &items {
        assert_eq!(i["exit_code"], 0, "{i}");
    }
    items
}

fn finished(mut map: Child, limit: Duration) -> String {
    let t = Instant::now();
    loop {
        if let Some(status) = map.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(map.stderr.as_mut().unwrap(), &mut err).unwrap();
            assert!(status.success(), "the map failed: {err}");
            return err;
        }
        if t.elapsed() > limit {
            let _ = map.kill();
            panic!("the map did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_static_allocation_lends_every_node_and_drains_on_scancel() {
    let Some(cluster) = cluster() else { return };
    let _serial = serial().await;
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("pool");
    let name = format!("pwtest-static-{}", std::process::id());
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../contrib/slurm/peerwasm-pool.sbatch");
    let id = cluster
        .run(
            "sbatch",
            &[
                "--parsable",
                &format!("--job-name={name}"),
                "--nodes=4",
                "--cpus-per-task=2",
                "--mem=1G",
                "--time=10",
                &format!("--output={}/%j.out", dir.path().display()),
                &format!(
                    "--export=ALL,PEERWASM={PEERWASM},PEERWASM_POOL_DIR={}",
                    pool.display()
                ),
                script.to_str().unwrap(),
            ],
        )
        .trim()
        .to_string();
    let log = || std::fs::read_to_string(dir.path().join(format!("{id}.out"))).unwrap_or_default();
    let members = || members_in(&pool);
    until(
        Duration::from_secs(30),
        "4 workers list themselves",
        || members() == 4,
        log,
    )
    .await;
    // One pool of four, each lending its cgroup: 1 GiB and 2 slots.
    let view = || pool_view(&pool);
    until(
        Duration::from_secs(15),
        "every worker sees the other three",
        || view().len() == 4,
        log,
    )
    .await;
    for p in view() {
        let a = &p["advert"];
        assert_eq!(a["slots_total"], 2, "{p}");
        let capacity = a["capacity_bytes"].as_u64().unwrap();
        assert!(
            (512 << 20..=1 << 30).contains(&capacity),
            "capacity from the job's cgroup (1 GiB): {p}"
        );
        assert_eq!(a["batch_job"].as_str(), Some(id.as_str()), "{p}");
    }
    // A map spreads over all of them.
    let out = dir.path().join("out.jsonl");
    std::fs::write(dir.path().join("in.txt"), "300\n".repeat(40)).unwrap();
    let map = Command::new(PEERWASM)
        .arg("map")
        .arg(guest("sleep"))
        .arg(dir.path().join("in.txt"))
        .arg("--pool-dir")
        .arg(&pool)
        .args(["--mem", "64MiB", "-o"])
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    finished(map, Duration::from_secs(60));
    let items = check_results(&out, 40);
    let peers: BTreeSet<&str> = items.iter().map(|i| i["peer"].as_str().unwrap()).collect();
    assert_eq!(peers.len(), 4, "jobs on every node: {peers:?}");
    // scancel: every worker drains and leaves (a worker takes itself off
    // `members/` only when it stops cleanly, not when killed); the job ends.
    cluster.run("scancel", &[&id]);
    until(
        Duration::from_secs(20),
        "scancel drains the workers and ends the job",
        || members() == 0 && cluster.jobs(&name).is_empty(),
        log,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_drains_before_its_walltime_and_takes_no_job_it_cannot_finish() {
    let Some(cluster) = cluster() else { return };
    let _serial = serial().await;
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("pool");
    let name = format!("pwtest-walltime-{}", std::process::id());
    // A one-minute job whose worker drains 45 s before its end.
    let wrap = format!(
        "--wrap=exec {PEERWASM} worker --listen 0.0.0.0:0 --advertise \"$SLURMD_NODENAME\" --pool-dir {} --slurm --drain-before 45s",
        pool.display()
    );
    let id = cluster.sbatch_wrap(&name, &["--time=1", "--mem=512M"], dir.path(), &wrap);
    let log = || job_log(dir.path(), &id);
    let members = || members_in(&pool);
    until(
        Duration::from_secs(20),
        "the worker joins",
        || members() == 1,
        log,
    )
    .await;
    let joined = Instant::now();
    // It says when it ends; a job that states a longer limit is not sent.
    let run = |timeout: &str| {
        Command::new(PEERWASM)
            .args(["run", "--pool-dir"])
            .arg(&pool)
            .args([
                "--timeout",
                timeout,
                "--mem",
                "64MiB",
                "--wait-for-workers",
                "3s",
            ])
            .arg(guest("sleep"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let short = run("5s");
    if let Some(o) = write_stdin(short, b"100") {
        assert!(
            o.status.success(),
            "a job that fits its time runs: {}",
            String::from_utf8_lossy(&o.stderr)
        )
    }
    let long = write_stdin(run("5m"), b"100").unwrap();
    let said = String::from_utf8_lossy(&long.stderr);
    assert!(
        !long.status.success(),
        "a job stating 5 min is not sent to a worker that ends within 1 min"
    );
    assert!(
        said.contains("ends (its batch job's time is up) before a job of 5m could finish"),
        "{said}"
    );
    // It drains about 15 s in, before Slurm would kill it at 60 s.
    until(
        Duration::from_secs(40),
        "the worker drains and its job ends",
        || members() == 0 && cluster.jobs(&name).is_empty(),
        log,
    )
    .await;
    let ended = joined.elapsed();
    assert!(
        ended < Duration::from_secs(40),
        "left {ended:?} after joining, for a 60 s walltime"
    );
    assert!(
        log().contains("peerwasm worker stopped") && !log().contains("DUE TO TIME LIMIT"),
        "{}",
        log()
    );
}

fn write_stdin(mut child: Child, input: &[u8]) -> Option<std::process::Output> {
    use std::io::Write;
    child.stdin.take().unwrap().write_all(input).unwrap();
    Some(child.wait_with_output().unwrap())
}
