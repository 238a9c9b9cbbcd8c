//! Running on a real cluster: the Slurm recipe (`contrib/slurm/peerwasm-pool.sbatch`)
//! run as Slurm would run it — one task per node, each node a network
//! namespace of its own, `srun` and `scontrol` stood in for by small shims —
//! and a worker inside a real memory cgroup (what Slurm's `--mem` makes)
//! lending no more than the cgroup's limit.
//!
//! Both need root (namespaces, cgroups); without it they print why and
//! return. The cgroup reader itself is tested on fixture trees in
//! `worker::cgroup`.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use peerwasm::client::{Job, SubmitError, Target};

use crate::faults::Net;
use crate::map::{MapProcess, stderr};
use crate::pool::{alive, wait_for};
use crate::support::MIB;

fn shim(dir: &Path, name: &str, script: &str) {
    let path = dir.join(name);
    std::fs::write(&path, script).unwrap();
    let mut perms = std::fs::metadata(&path).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&path, perms).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sbatch_recipe_starts_one_worker_per_node_joined_into_one_pool() {
    let Some(net) = Net::or_skip(3) else { return };
    let shims = tempfile::tempdir().unwrap();
    shim(
        shims.path(),
        "scontrol",
        "#!/bin/sh\n[ \"$1 $2\" = \"show hostnames\" ] && echo \"$3\" | tr ',' '\\n'\n",
    );
    // squeue: the job's time left (`--slurm` asks): no end.
    shim(shims.path(), "squeue", "#!/bin/sh\necho UNLIMITED\n");
    // srun: one task per node of the allocation, each in its node's namespace.
    let namespaces: Vec<&str> = net.hosts.iter().map(|h| h.ns.as_str()).collect();
    shim(
        shims.path(),
        "srun",
        &format!(
            "#!/bin/bash\nwhile [[ \"$1\" == --* ]]; do shift; done\nnamespaces=({})\ni=0\n\
             for node in $(echo \"$SLURM_JOB_NODELIST\" | tr ',' ' '); do\n\
             ip netns exec \"${{namespaces[$i]}}\" env SLURMD_NODENAME=\"$node\" SLURM_PROCID=$i \"$@\" &\n\
             i=$((i+1))\ndone\nwait\n",
            namespaces.join(" ")
        ),
    );
    let nodes: Vec<&str> = net.hosts.iter().map(|h| h.ip.as_str()).collect();
    let recipe = peerwasm_testkit::workspace_root().join("contrib/slurm/peerwasm-pool.sbatch");
    // The workers make the pool's key and CA, and each its certificate, here.
    let pool_dir = shims.path().join("pool");
    let path = format!(
        "{}:{}",
        shims.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut job = Command::new("bash")
        .arg(&recipe)
        .env("PATH", path)
        .env("SLURM_JOB_NODELIST", nodes.join(","))
        .env("SLURM_JOB_NUM_NODES", "3")
        .env("SLURM_CPUS_PER_TASK", "2")
        .env("PEERWASM", crate::support::PEERWASM)
        .env("PEERWASM_PORT", "7070")
        .env("PEERWASM_POOL_DIR", &pool_dir)
        .env("SLURM_JOB_ID", "42")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(shims.path().join("job.err")).unwrap())
        .process_group(0)
        .spawn()
        .unwrap();
    let mut banner = String::new();
    let mut job_out = BufReader::new(job.stdout.take().unwrap());
    job_out.read_line(&mut banner).unwrap();
    // Keep reading what the workers print, as slurmstepd would.
    std::thread::spawn(move || std::io::copy(&mut job_out, &mut std::io::sink()));
    let seed = format!("{}:7070", nodes[0]);
    assert!(
        banner.contains(&format!("--pool-dir {}", pool_dir.display())),
        "{banner}"
    );

    // scancel, as Slurm does it: SIGTERM to every process of the job.
    struct Scancel(i32);
    impl Drop for Scancel {
        fn drop(&mut self) {
            // SAFETY: kill(2) on our own child's process group.
            unsafe { libc::kill(-self.0, libc::SIGKILL) };
        }
    }
    let _scancel = Scancel(job.id() as i32);

    // Every hop is TLS with the pool's CA: the workers take a moment
    // to start, so wait for the seed to answer.
    let ca = pool_dir.join("ca.crt");
    let start = std::time::Instant::now();
    while !ca.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the workers made no CA"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let http = crate::pool::operator(&peerwasm::net::Transport::tls(&ca).unwrap());
    let peers_url = http.url(&seed, "/v1/peers");
    while http.get(&peers_url).send().await.is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the seed worker never answered"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        crate::support::http()
            .get(format!("http://{seed}/v1/peers"))
            .send()
            .await
            .is_err(),
        "the seed answers plain HTTP too"
    );
    let view =
        crate::pool::wait_for_via(&http, &seed, Duration::from_secs(30), |v| alive(v) == 3).await;
    let mut addrs: Vec<String> = view.iter().map(|p| p.advert.addr.clone()).collect();
    addrs.sort();
    assert_eq!(
        addrs,
        nodes
            .iter()
            .map(|n| format!("{n}:7070"))
            .collect::<Vec<_>>(),
        "one worker per node, by name"
    );
    assert!(
        view.iter().all(|p| p.advert.slots_total == 2),
        "--cpus-per-task slots each"
    );
    assert!(
        view.iter()
            .all(|p| p.advert.batch_job.as_deref() == Some("42")),
        "each names its Slurm job"
    );

    let client = tempfile::tempdir().unwrap();
    let ca_arg = ca.to_str().unwrap();
    let map = MapProcess::start(
        "sleep",
        &["--mem", "32MiB", "--peers", &seed, "--tls-ca", ca_arg],
        &"30\n".repeat(90),
        client.path(),
    );
    let (out, lines) = map.finish();
    let log = std::fs::read_to_string(shims.path().join("job.err")).unwrap_or_default();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\nthe job's stderr:\n{log}",
        stderr(&out)
    );
    assert_eq!(lines.len(), 90);
    for addr in &addrs {
        assert!(
            lines.iter().any(|l| l["peer"] == addr.as_str()),
            "{addr} ran nothing"
        );
    }

    // The end of the Slurm job: SIGTERM; the workers drain and exit.
    // SAFETY: kill(2) on our own child's process group.
    unsafe { libc::kill(-(job.id() as i32), libc::SIGTERM) };
    tokio::task::spawn_blocking(move || job.wait())
        .await
        .unwrap()
        .unwrap();
    let start = std::time::Instant::now();
    while http.get(&peers_url).send().await.is_ok() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the workers outlived the Slurm job"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A child cgroup (v1 memory controller) under this process's own, removed
/// when dropped.
struct Cgroup(PathBuf);

impl Cgroup {
    fn new(limit: u64) -> Result<Cgroup, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root".into());
        }
        let base = Path::new("/sys/fs/cgroup/memory");
        let own = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| e.to_string())?;
        let path = own
            .lines()
            .find_map(|l| {
                l.split(':')
                    .nth(1)
                    .filter(|c| c.split(',').any(|c| c == "memory"))
                    .and(l.split(':').nth(2))
            })
            .ok_or("no cgroup v1 memory controller")?;
        let parent = [base.join(path.trim_start_matches('/')), base.to_path_buf()]
            .into_iter()
            .find(|p| p.join("cgroup.procs").exists())
            .ok_or("the memory controller is not mounted at /sys/fs/cgroup/memory")?;
        static MADE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = parent.join(format!("peerwasm-test-{}-{n}", std::process::id()));
        std::fs::create_dir(&dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
        let group = Cgroup(dir);
        std::fs::write(group.0.join("memory.limit_in_bytes"), limit.to_string())
            .map_err(|e| e.to_string())?;
        Ok(group)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_in_a_memory_cgroup_lends_no_more_than_its_limit() {
    let limit = 300 * MIB;
    let group = match Cgroup::new(limit) {
        Ok(g) => g,
        Err(why) => return eprintln!("skipped: no cgroup to make ({why})"),
    };
    let cache = tempfile::tempdir().unwrap();
    // As under Slurm: the process is in the cgroup before the worker starts.
    let script = format!(
        "echo $$ > {}/cgroup.procs && exec {} worker --listen 127.0.0.1:0 --memory 1GiB --reserve 0 --slots 2 \
         --gossip-interval 100ms --cache-dir {}",
        group.0.display(),
        crate::support::PEERWASM,
        cache.path().display()
    );
    let (mut worker, addr) = crate::support::spawn_worker(
        Command::new("sh")
            .args(["-c", &script])
            .stdout(Stdio::piped())
            .stderr(Stdio::null()),
    );

    let view = wait_for(&addr, Duration::from_secs(10), |v| !v.is_empty()).await;
    let advert = &view[0].advert;
    // Less what the worker keeps for its own processes in the cgroup (its
    // default --overhead: 32 MiB + 4 MiB per slot).
    assert_eq!(
        advert.capacity_bytes,
        limit - 40 * MIB,
        "--memory 1GiB in a 300 MiB cgroup lends 300 MiB less its overhead"
    );
    assert!(
        advert.warnings.iter().any(|w| w.contains(
            "cgroup's memory limit 300 MiB less --overhead 40 MiB is lower than --memory 1 GiB"
        )),
        "{:?}",
        advert.warnings
    );

    // A job larger than the cgroup allows is refused at once, clearly; one
    // that fits runs.
    let memhog = Job::new(peerwasm_testkit::guest_wasm_bytes("memhog"));
    let target = Target::pool(vec![addr.clone()]).unwrap();
    match target
        .run(&memhog, memhog.spec(b"8".to_vec(), 512 * MIB))
        .await
    {
        Err(SubmitError::Fatal(why)) => assert!(why.contains("248 MiB"), "{why}"),
        other => panic!("a 512 MiB job in a 300 MiB cgroup: {other:?}"),
    }
    let r = target
        .run(&memhog, memhog.spec(b"100".to_vec(), 200 * MIB))
        .await
        .unwrap();
    assert!(r.outcome.is_success(), "{}", r.outcome);
    let _ = worker.kill();
    let _ = worker.wait();
}

impl Cgroup {
    /// Starts a worker lending 2900 MiB inside this cgroup (it is there
    /// before it starts, as under Slurm), sharing the host ledger at
    /// `ledger`, its module cache under `cache`; its process and address.
    fn worker(&self, cache: &Path, ledger: &Path) -> (std::process::Child, String) {
        let script = format!(
            "echo $$ > {}/cgroup.procs && exec {} worker --listen 127.0.0.1:0 --memory 2900MiB --reserve 0 \
             --slots 1 --gossip-interval 100ms --cache-dir {} --host-ledger {}",
            self.0.display(),
            crate::support::PEERWASM,
            cache.display(),
            ledger.display()
        );
        crate::support::spawn_worker(
            Command::new("sh")
                .args(["-c", &script])
                .stdout(Stdio::piped())
                .stderr(Stdio::null()),
        )
    }
}

/// When each job a worker ran was running, by the worker's own history
/// (the host's clock): `[ended − wall, ended]` in µs.
fn ran_on(addr: &str) -> Vec<(u64, u64)> {
    let out = Command::new(crate::support::PEERWASM)
        .args(["history", "--json", "--peers", addr])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    rows.iter()
        .filter(|r| r["peer"] == addr)
        .map(|r| {
            let (ended_us, wall_us) = (
                r["ended_ms"].as_u64().unwrap() * 1000,
                r["wall_time_us"].as_u64().unwrap(),
            );
            (ended_us - wall_us, ended_us)
        })
        .collect()
}

/// Two, then three, workers in one 3 GiB memory cgroup (two Slurm
/// allocations on one node; two users' shares of one workstation), each
/// told it may lend 2900 MiB, each sent a job of 2 GiB that touches 1.5
/// GiB at the same moment: with the host's ledger (one file the workers
/// share) the jobs take turns — every one succeeds, none is OOM-killed, and
/// no two ran at once, so their reservations together never exceeded the
/// cgroup's limit. (Before, and with `--host-ledger none`: each accepted
/// its job at once, 4 GiB reserved together in 3 GiB, and the kernel could
/// kill one.)
#[tokio::test(flavor = "multi_thread")]
async fn workers_in_one_cgroup_never_over_commit_it_together() {
    const LIMIT: u64 = 3 << 30;
    if !crate::support::is_root() {
        return eprintln!(
            "skipped: this test makes a memory cgroup, which needs root (CI runs as root)"
        );
    }
    for n in [2, 3] {
        let group = Cgroup::new(LIMIT)
            .unwrap_or_else(|why| panic!("cannot make a memory cgroup as root: {why}"));
        let shared = tempfile::tempdir().unwrap();
        let ledger = shared.path().join("host-ledger");
        let mut workers = Vec::new();
        for _ in 0..n {
            let cache = tempfile::tempdir().unwrap();
            let (child, addr) = group.worker(cache.path(), &ledger);
            workers.push((child, addr, cache));
        }
        let memhog = Job::new(peerwasm_testkit::guest_wasm_bytes("memhog"));
        let jobs: Vec<_> = workers
            .iter()
            .map(|(_, addr, _)| {
                let (target, memhog) = (Target::pool(vec![addr.clone()]).unwrap(), memhog.clone());
                tokio::spawn(async move {
                    target
                        .run(&memhog, memhog.spec(b"1536".to_vec(), 2 << 30))
                        .await
                })
            })
            .collect();
        // While they run: what the workers have reserved, read at once (for
        // the log: reads of different workers are not one moment).
        let mut most = 0f64;
        while !jobs.iter().all(|j| j.is_finished()) {
            let reads = futures::future::join_all(
                workers
                    .iter()
                    .map(|(_, addr, _)| crate::observe::scrape(addr)),
            )
            .await;
            let sum: f64 = reads
                .iter()
                .map(|m| crate::observe::get(m, "peerwasm_memory_bytes{kind=\"reserved\"}"))
                .sum();
            most = most.max(sum);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for job in jobs {
            let r = job.await.unwrap().unwrap();
            assert!(
                r.outcome.is_success(),
                "{n} workers: a job ended {}",
                r.outcome
            );
            assert_eq!(r.stdout, b"1536\n");
        }
        // When each job ran, by its worker's own record (the host's clock):
        // [ended − wall, ended].
        let ran: Vec<(u64, u64)> = workers
            .iter()
            .flat_map(|(_, addr, _)| ran_on(addr))
            .collect();
        assert_eq!(ran.len(), n, "each worker ran its job: {ran:?}");
        // Two 2 GiB jobs never ran at once in 3 GiB: they took turns.
        for (i, a) in ran.iter().enumerate() {
            for b in &ran[i + 1..] {
                let overlap_ms = a.1.min(b.1).saturating_sub(a.0.max(b.0)) / 1000;
                assert!(
                    overlap_ms < 20,
                    "{n} workers: two 2 GiB jobs ran together for {overlap_ms} ms in 3 GiB"
                );
            }
        }
        println!(
            "{n} workers in one 3 GiB cgroup: at most {:.2} GiB reserved together (sampled)",
            most / (1u64 << 30) as f64
        );
        for (mut child, _, _) in workers {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A worker of the host's ledger killed with `-9` gives its share back:
/// the other worker of the cgroup, whose job waited for that memory (and
/// whose advert meanwhile offered only what was left), starts it within
/// 2 s.
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_workers_share_of_the_host_is_freed_within_two_seconds() {
    const LIMIT: u64 = 3 << 30;
    if !crate::support::is_root() {
        return eprintln!(
            "skipped: this test makes a memory cgroup, which needs root (CI runs as root)"
        );
    }
    let group = Cgroup::new(LIMIT)
        .unwrap_or_else(|why| panic!("cannot make a memory cgroup as root: {why}"));
    let shared = tempfile::tempdir().unwrap();
    let ledger = shared.path().join("host-ledger");
    let start = |cache: &Path| group.worker(cache, &ledger);
    let (a_cache, b_cache) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (mut a, a_addr) = start(a_cache.path());
    let (mut b, b_addr) = start(b_cache.path());
    // A holds 2 GiB for a job that sleeps a minute.
    let sleep = Job::new(peerwasm_testkit::guest_wasm_bytes("sleep"));
    let on_a = Target::pool(vec![a_addr.clone()]).unwrap();
    let holding = tokio::spawn(async move {
        on_a.run(&sleep, sleep.spec(b"60000".to_vec(), 2 << 30))
            .await
    });
    let reserved = |addr: String| async move {
        crate::observe::get(
            &crate::observe::scrape(&addr).await,
            "peerwasm_memory_bytes{kind=\"reserved\"}",
        )
    };
    let t = std::time::Instant::now();
    while reserved(a_addr.clone()).await == 0.0 {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "a's job did not start"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // B's 2 GiB job waits: the cgroup has 1 GiB left.
    let memhog = Job::new(peerwasm_testkit::guest_wasm_bytes("memhog"));
    let on_b = Target::pool(vec![b_addr.clone()]).unwrap();
    let waiting = tokio::spawn(async move {
        on_b.run(&memhog, memhog.spec(b"1536".to_vec(), 2 << 30))
            .await
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(
        reserved(b_addr.clone()).await,
        0.0,
        "b's job must wait while a holds 2 GiB of the 3"
    );
    // And b's advert says so: what it can take now is what the cgroup has
    // left beside a's share, not its own 2900 MiB.
    let fit = crate::tenants::me(&b_addr).await.largest_fit_bytes;
    assert!(
        fit <= 1 << 30,
        "b advertises {fit} bytes free while a holds 2 GiB of the cgroup's 3"
    );
    a.kill().unwrap();
    let killed = std::time::Instant::now();
    let _ = a.wait();
    while reserved(b_addr.clone()).await == 0.0 && !waiting.is_finished() {
        assert!(
            killed.elapsed() < Duration::from_secs(2),
            "a's share was not freed within 2 s of kill -9"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "a killed worker's share freed for another in {:?}",
        killed.elapsed()
    );
    let r = waiting.await.unwrap().unwrap();
    assert!(r.outcome.is_success(), "{}", r.outcome);
    assert!(
        holding.await.unwrap().is_err(),
        "a's client learns its worker is gone"
    );
    let _ = b.kill();
    let _ = b.wait();
}

/// The same on a bare host: workers lending all of the machine less 1 GiB,
/// each sent at once a job reserving 4 GiB (the most a job may have; it
/// sleeps, so nothing is touched) — two more of them than the host could
/// hold: with the host's ledger, no more run at once than the host holds.
/// (With `--host-ledger none` every one runs at once.)
#[tokio::test(flavor = "multi_thread")]
async fn workers_on_one_bare_host_never_over_commit_it_together() {
    const JOB: u64 = 4 << 30;
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let field = |name: &str| -> u64 {
        let line = meminfo.lines().find(|l| l.starts_with(name)).unwrap();
        line.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<u64>()
            .unwrap()
            * 1024
    };
    let host = field("MemTotal:").saturating_sub(1 << 30);
    let fits = (field("MemAvailable:").saturating_sub(1 << 30) / JOB).min(host / JOB);
    let n = fits as usize + 2;
    let shared = tempfile::tempdir().unwrap();
    let ledger = shared.path().join("host-ledger");
    let flags = [
        "--reserve",
        "1GiB",
        "--host-ledger",
        ledger.to_str().unwrap(),
    ];
    let memory = format!("{}MiB", host >> 20);
    let workers: Vec<_> = (0..n)
        .map(|_| crate::support::WorkerProcess::start_with(&memory, 1, None, &flags))
        .collect();
    let sleep = Job::new(peerwasm_testkit::guest_wasm_bytes("sleep"));
    let jobs: Vec<_> = workers
        .iter()
        .map(|w| {
            let (target, sleep) = (Target::pool(vec![w.addr.clone()]).unwrap(), sleep.clone());
            tokio::spawn(async move { target.run(&sleep, sleep.spec(b"600".to_vec(), JOB)).await })
        })
        .collect();
    for job in jobs {
        let r = job.await.unwrap().unwrap();
        assert!(r.outcome.is_success(), "{}", r.outcome);
    }
    // When each ran, by its worker's own record; then the most at once.
    let mut edges: Vec<(u64, i32)> = Vec::new();
    for (start, end) in workers.iter().flat_map(|w| ran_on(&w.addr)) {
        // Shrunk by 20 ms each end: a handover within the records'
        // millisecond is not an overlap.
        edges.extend([(start + 20_000, 1), (end.saturating_sub(20_000), -1)]);
    }
    assert_eq!(edges.len(), 2 * n, "each worker ran its job");
    edges.sort();
    let (mut now, mut most) = (0, 0);
    for (_, step) in edges {
        now += step;
        most = most.max(now);
    }
    assert!(
        most as u64 * JOB <= host,
        "{most} jobs of 4 GiB ran at once on a host of {} MiB ({n} workers sharing its ledger)",
        host >> 20
    );
    println!(
        "{n} workers, jobs of 4 GiB on a host of {} MiB: at most {most} at once",
        host >> 20
    );
}
