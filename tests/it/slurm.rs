//! peerwasm on a real Slurm: slurmctld and four slurmd, each node in a
//! network namespace of its own, started by `tests/slurm/cluster.sh` once
//! for this test binary (and taken down when it exits). The static recipe
//! (`contrib/slurm/peerwasm-pool.sbatch`), `peerwasm adapt` growing and
//! shrinking a pool for a map, memory-shaped workers, a worker killed by
//! Slurm mid-map, and a worker draining before its walltime.
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

    fn running(&self, name: &str) -> usize {
        self.jobs(name)
            .iter()
            .filter(|(_, s, _)| s == "RUNNING")
            .count()
    }
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
    let view = || {
        let out = Command::new(PEERWASM)
            .args(["peers", "--json", "--pool-dir"])
            .arg(&pool)
            .output()
            .unwrap();
        serde_json::from_slice::<Vec<serde_json::Value>>(&out.stdout).unwrap_or_default()
    };
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
            capacity <= 1 << 30 && capacity >= 512 << 20,
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
async fn adapt_grows_the_pool_for_a_map_and_shrinks_it_back_to_min() {
    let Some(cluster) = cluster() else { return };
    let _serial = serial().await;
    let mut pool = Elastic::start(cluster, "grow", &["--min", "1", "--max", "8"]);
    until(
        Duration::from_secs(20),
        "the pool starts at --min 1",
        || pool.members() == 1,
        || pool.log(),
    )
    .await;
    let out = pool.dir.path().join("out.jsonl");
    let map = pool.map(&vec!["500".to_string(); 200], "64MiB", &out);
    let started = Instant::now();
    let mut most = 0;
    let grown = until(
        Duration::from_secs(15),
        "≥ 4 workers",
        || {
            most = most.max(pool.members());
            most >= 4
        },
        || pool.log(),
    )
    .await;
    eprintln!("slurm: grew to {most} workers {grown:?} after the map started");
    finished(map, Duration::from_secs(120));
    let took = started.elapsed();
    check_results(&out, 200);
    // 200 × 0.5 s is 100 slot-s: one worker alone would take 100 s.
    assert!(
        took < Duration::from_secs(60),
        "the map took {took:?}: the pool did not grow enough"
    );
    let idle = Instant::now();
    until(
        Duration::from_secs(25),
        "back to --min 1 worker",
        || cluster.running(&pool.name) == 1 && pool.members() == 1,
        || pool.log(),
    )
    .await;
    eprintln!(
        "slurm: back to 1 worker {:?} after the map ended; the map took {took:?}",
        idle.elapsed()
    );
    let log = pool.stop();
    assert!(
        log.contains("growing by") && log.contains("shrinking by"),
        "{log}"
    );
    assert!(
        log.contains("(0 without having run a job)"),
        "no worker job was cancelled unused: {log}"
    );
    until(
        Duration::from_secs(20),
        "stopping cancels its last job",
        || cluster.jobs(&pool.name).is_empty(),
        || pool.log(),
    )
    .await;
}

/// Waits until `pool`'s controller has asked Slurm for a worker.
async fn workers_asked(cluster: &Cluster, pool: &Elastic<'_>) {
    until(
        Duration::from_secs(20),
        "workers asked for",
        || !cluster.jobs(&pool.name).is_empty(),
        || pool.log(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn adapt_shapes_workers_for_the_memory_of_the_jobs_that_wait() {
    let Some(cluster) = cluster() else { return };
    let _serial = serial().await;
    // Both pools: from zero workers, up to two, each asked with 128 MiB
    // beside its jobs and at least 256 MiB.
    let start = |name: &str| {
        Elastic::start(
            cluster,
            name,
            &[
                "--min",
                "0",
                "--max",
                "2",
                "--overhead",
                "128MiB",
                "--min-mem",
                "256MiB",
            ],
        )
    };
    // Large jobs: workers sized for them.
    let pool = start("large");
    let out = pool.dir.path().join("large.jsonl");
    let map = pool.map(&vec!["500".to_string(); 6], "1GiB", &out);
    workers_asked(cluster, &pool).await;
    for (_, _, mib) in cluster.jobs(&pool.name) {
        assert!(
            (1024 + 128..=1024 + 128 + 64).contains(&mib),
            "a worker job for 1 GiB jobs asks for {mib} MiB: {}",
            pool.log()
        );
    }
    finished(map, Duration::from_secs(90));
    check_results(&out, 6);
    drop(pool);
    // Small jobs: small workers, not large ones.
    let pool = start("small");
    let out = pool.dir.path().join("small.jsonl");
    let map = pool.map(&vec!["300".to_string(); 20], "64MiB", &out);
    workers_asked(cluster, &pool).await;
    for (_, _, mib) in cluster.jobs(&pool.name) {
        assert_eq!(
            mib,
            256,
            "a worker job for 64 MiB jobs asks for the least (--min-mem): {}",
            pool.log()
        );
    }
    finished(map, Duration::from_secs(90));
    check_results(&out, 20);
    // A job larger than any worker the controller may ask for fails at once.
    let err = pool
        .map(
            &["100".to_string()],
            "80GiB",
            &pool.dir.path().join("huge.jsonl"),
        )
        .wait_with_output()
        .unwrap();
    assert!(!err.status.success());
    let said = String::from_utf8_lossy(&err.stderr);
    assert!(said.contains("no peer can hold a job of 80 GiB"), "{said}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_job_killed_by_slurm_mid_map_has_its_jobs_run_again() {
    let Some(cluster) = cluster() else { return };
    let _serial = serial().await;
    let pool = Elastic::start(cluster, "killed", &["--min", "3", "--max", "3"]);
    until(
        Duration::from_secs(20),
        "3 workers",
        || pool.members() == 3,
        || pool.log(),
    )
    .await;
    let out = pool.dir.path().join("out.jsonl");
    let map = pool.map(&vec!["500".to_string(); 60], "64MiB", &out);
    let lines = || std::fs::read_to_string(&out).map_or(0, |t| t.lines().count());
    until(
        Duration::from_secs(30),
        "10 results in",
        || lines() >= 10,
        || pool.log(),
    )
    .await;
    // Slurm kills one worker's job outright (as an OOM kill or preemption
    // would): no drain, its running jobs are lost with it.
    let (victim, _, _) = cluster
        .jobs(&pool.name)
        .into_iter()
        .find(|(_, s, _)| s == "RUNNING")
        .unwrap();
    cluster.run("scancel", &["--full", "--signal=KILL", &victim]);
    let said = finished(map, Duration::from_secs(120));
    check_results(&out, 60);
    assert!(
        said.contains("lost"),
        "the map says it lost jobs with the worker: {said}"
    );
    // The controller says so and brings the pool back to --min.
    until(
        Duration::from_secs(30),
        "a replacement worker",
        || {
            let jobs = cluster.jobs(&pool.name);
            jobs.len() == 3 && !jobs.iter().any(|(id, _, _)| *id == victim)
        },
        || pool.log(),
    )
    .await;
    let log = pool.log();
    assert!(log.contains("ended by itself"), "{log}");
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
    let id = cluster
        .run(
            "sbatch",
            &[
                "--parsable",
                &format!("--job-name={name}"),
                "--time=1",
                "--mem=512M",
                &format!("--output={}/%j.out", dir.path().display()),
                &wrap,
            ],
        )
        .trim()
        .to_string();
    let log = || std::fs::read_to_string(dir.path().join(format!("{id}.out"))).unwrap_or_default();
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
    write_stdin(short, b"100").map(|o| {
        assert!(
            o.status.success(),
            "a job that fits its time runs: {}",
            String::from_utf8_lossy(&o.stderr)
        )
    });
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
