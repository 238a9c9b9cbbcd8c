//! Faults across machines. Workers run as separate hosts: each in a network
//! namespace of its own (`ip netns` + a veth pair on a bridge), with its own
//! address and a link that can be cut, like a machine whose cable is pulled.
//! The client (`peerwasm map`) runs in the test's namespace and reaches them
//! over the bridge.
//!
//! Namespaces need root (CI runs as root). Without root or `ip`, the two
//! namespace tests print why and return; the restart test needs neither.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use peerwasm::client::{Job, Target};
use peerwasm::gossip::Liveness;
use peerwasm::proto::CacheSource;

use crate::map::{MapProcess, stderr};
use crate::pool::{alive, wait_for};
use crate::support::MIB;

/// A bridge and `n` namespaces on it, removed when dropped.
pub(crate) struct Net {
    bridge: String,
    pub(crate) hosts: Vec<Host>,
}

/// One namespace: its name, the host-side end of its veth, its address.
pub(crate) struct Host {
    pub(crate) ns: String,
    link: String,
    pub(crate) ip: String,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Net {
    /// `n` hosts, or why they cannot be made here.
    pub(crate) fn new(n: usize) -> Result<Net, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root".into());
        }
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let k = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        // Interface names are at most 15 bytes; subnets unique per process
        // and per net.
        let tag = format!("{:x}{k}", pid % 0xffff);
        let subnet = format!("10.{}.{}", 100 + k % 100, pid % 250);
        let mut net = Net {
            bridge: format!("pwb{tag}"),
            hosts: Vec::new(),
        };
        ip(&["link", "add", &net.bridge, "type", "bridge"])?;
        ip(&["addr", "add", &format!("{subnet}.1/24"), "dev", &net.bridge])?;
        ip(&["link", "set", &net.bridge, "up"])?;
        for i in 0..n {
            let host = Host {
                ns: format!("pwn{tag}{i}"),
                link: format!("pwv{tag}{i}"),
                ip: format!("{subnet}.{}", 11 + i),
            };
            ip(&["netns", "add", &host.ns])?;
            // Owned by `net` from here, so that a failure below cleans it up.
            net.hosts.push(host);
            let host = net.hosts.last().expect("just pushed");
            ip(&[
                "link", "add", &host.link, "type", "veth", "peer", "name", "eth0", "netns",
                &host.ns,
            ])?;
            ip(&["link", "set", &host.link, "master", &net.bridge])?;
            ip(&["link", "set", &host.link, "up"])?;
            ip(&[
                "netns",
                "exec",
                &host.ns,
                "ip",
                "addr",
                "add",
                &format!("{}/24", host.ip),
                "dev",
                "eth0",
            ])?;
            ip(&["netns", "exec", &host.ns, "ip", "link", "set", "eth0", "up"])?;
            ip(&["netns", "exec", &host.ns, "ip", "link", "set", "lo", "up"])?;
        }
        Ok(net)
    }

    /// [`Net::new`], or `None` after saying why the test does not run.
    pub(crate) fn or_skip(n: usize) -> Option<Net> {
        Net::new(n)
            .inspect_err(|why| eprintln!("skipped: network namespaces unavailable ({why})"))
            .ok()
    }

    /// Cuts host `i`'s link (`up == false`) or restores it.
    fn link(&self, i: usize, up: bool) {
        ip(&[
            "link",
            "set",
            &self.hosts[i].link,
            if up { "up" } else { "down" },
        ])
        .unwrap();
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for h in &self.hosts {
            let _ = ip(&["netns", "del", &h.ns]); // takes its veth pair along
        }
        let _ = ip(&["link", "del", &self.bridge]);
    }
}

/// The pool's shared key: workers on addresses others can reach must have
/// one.
fn pool_key() -> &'static Path {
    static KEY: std::sync::OnceLock<tempfile::NamedTempFile> = std::sync::OnceLock::new();
    KEY.get_or_init(|| {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(&mut f, b"a shared secret for the fault tests").unwrap();
        f
    })
    .path()
}

/// A `peerwasm worker` process, in a namespace or not; killed when dropped.
struct Worker {
    child: Child,
    addr: String,
}

impl Worker {
    /// Starts a worker with 1 slot listening on `listen`, caching under
    /// `cache`, inside namespace `ns` if given.
    fn start(ns: Option<&str>, listen: &str, cache: &Path, join: Option<&str>) -> Worker {
        let peerwasm = crate::support::PEERWASM;
        let mut cmd = match ns {
            // `ip netns exec` execs the program: the child is the worker.
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, peerwasm]);
                c
            }
            None => Command::new(peerwasm),
        };
        cmd.args([
            "worker",
            "--listen",
            listen,
            "--memory",
            "1GiB",
            "--reserve",
            "0",
            "--slots",
            "1",
        ])
        .args(["--gossip-interval", "100ms"])
        .arg("--cluster-key")
        .arg(pool_key())
        .arg("--cache-dir")
        .arg(cache)
        .arg("--state-dir")
        .arg(cache.join(format!("state-{listen}")))
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
        if let Some(seed) = join {
            cmd.args(["--join", seed]);
        }
        let (child, addr) = crate::support::spawn_worker(&mut cmd);
        Worker { child, addr }
    }

    fn kill(&mut self) {
        let _ = self.child.kill(); // SIGKILL
        let _ = self.child.wait();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `n` workers, one per host of `net`, joined through the first; waits
/// until each sees all of them alive.
async fn pool(net: &Net, caches: &tempfile::TempDir) -> Vec<Worker> {
    let mut workers: Vec<Worker> = Vec::new();
    for (i, h) in net.hosts.iter().enumerate() {
        let seed = workers.first().map(|w| w.addr.clone());
        let cache = caches.path().join(format!("w{i}"));
        workers.push(Worker::start(
            Some(&h.ns),
            &format!("{}:7070", h.ip),
            &cache,
            seed.as_deref(),
        ));
    }
    for w in &workers {
        wait_for(&w.addr, Duration::from_secs(20), |v| {
            alive(v) == workers.len()
        })
        .await;
    }
    workers
}

/// Every input has exactly one result, in order, each a success; the
/// number of results that came from `addr`.
fn assert_each_once(lines: &[serde_json::Value], n: usize, addr: &str) -> usize {
    assert_eq!(lines.len(), n, "one result per input");
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l["index"], i as u64, "each input once, in order");
        assert_eq!(l["exit_code"], 0, "{l}");
    }
    lines.iter().filter(|l| l["peer"] == addr).count()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_killed_during_a_1000_job_map_over_4_hosts_loses_and_duplicates_nothing() {
    let Some(net) = Net::or_skip(4) else { return };
    let caches = tempfile::tempdir().unwrap();
    let mut workers = pool(&net, &caches).await;
    let client = tempfile::tempdir().unwrap();
    // 1,000 × 20 ms over 4 slots: about 5 s. Kill host 2 a third of the way.
    let map = MapProcess::start(
        "sleep",
        &["--mem", "32MiB", "--peers", &workers[0].addr],
        &"20\n".repeat(1000),
        client.path(),
    );
    tokio::time::sleep(Duration::from_millis(1700)).await;
    let victim = workers[2].addr.clone();
    workers[2].kill();
    let (out, lines) = map.finish();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let on_victim = assert_each_once(&lines, 1000, &victim);
    println!(
        "killed host ran {on_victim} of 1000 jobs before SIGKILL; {}",
        stderr(&out).lines().last().unwrap_or("")
    );
    assert!(on_victim > 0, "the killed host ran jobs before it died");
    for w in [&workers[0], &workers[1], &workers[3]] {
        assert!(
            lines.iter().any(|l| l["peer"] == w.addr.as_str()),
            "{} ran nothing",
            w.addr
        );
    }
    assert!(
        stderr(&out).contains("1000 jobs, 0 failed"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_cut_off_is_declared_dead_avoided_and_rejoins_when_its_link_returns() {
    let Some(net) = Net::or_skip(3) else { return };
    let caches = tempfile::tempdir().unwrap();
    let workers = pool(&net, &caches).await;
    let (seed, cut) = (workers[0].addr.clone(), workers[1].addr.clone());
    let client = tempfile::tempdir().unwrap();
    let map = MapProcess::start(
        "sleep",
        &["--mem", "32MiB", "--peers", &seed],
        &"20\n".repeat(600),
        client.path(),
    );
    // Once the host has run jobs of the map (a fixed second was not always
    // enough on a loaded machine: CI saw 0 of 600 by then), pull the
    // cable: no RST, no FIN; its jobs in flight hang.
    wait_for(&seed, Duration::from_secs(30), |v| {
        v.iter()
            .any(|p| p.advert.addr == cut && p.advert.jobs_run > 0)
    })
    .await;
    net.link(1, false);
    wait_for(&seed, Duration::from_secs(15), |v| {
        v.iter()
            .any(|p| p.advert.addr == cut && p.liveness == Liveness::Dead)
    })
    .await;
    // The map finishes without it: its jobs were resubmitted elsewhere.
    let (out, lines) = map.finish();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let before_cut = assert_each_once(&lines, 600, &cut);
    println!("cut-off host answered {before_cut} of 600 jobs before its link went down");
    assert!(before_cut > 0, "the host ran jobs before it was cut off");
    assert!(
        stderr(&out).contains("600 jobs, 0 failed"),
        "{}",
        stderr(&out)
    );

    // Restore the link: it rejoins, and takes jobs again.
    net.link(1, true);
    for w in &workers {
        wait_for(&w.addr, Duration::from_secs(20), |v| alive(v) == 3).await;
    }
    let map = MapProcess::start(
        "sleep",
        &["--mem", "32MiB", "--peers", &seed],
        &"20\n".repeat(120),
        client.path(),
    );
    let (out, lines) = map.finish();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        assert_each_once(&lines, 120, &cut) > 0,
        "the restored host got no jobs"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_worker_serves_its_modules_from_its_disk_cache_without_compiling() {
    let cache = tempfile::tempdir().unwrap();
    let primes = Job::new(peerwasm_testkit::guest_wasm_bytes("primes"));
    let spec = || primes.spec(br#"{"n": 1000}"#.to_vec(), 64 * MIB);
    let mut first = Worker::start(None, "127.0.0.1:0", cache.path(), None);
    let r = Target::pool(vec![first.addr.clone()])
        .unwrap()
        .run(&primes, spec())
        .await
        .unwrap();
    assert_eq!(
        (r.outcome.is_success(), r.cache),
        (true, CacheSource::Compiled)
    );
    first.kill(); // SIGKILL: no orderly shutdown

    let second = Worker::start(None, "127.0.0.1:0", cache.path(), None);
    // A new client, as after a restart of everything: the worker has lost
    // the module's bytes (kept in memory) but not the compiled artifact,
    // which is enough: the client need not upload the module again.
    let r = Target::pool(vec![second.addr.clone()])
        .unwrap()
        .run(&primes, spec())
        .await
        .unwrap();
    assert!(r.outcome.is_success(), "{}", r.outcome);
    assert_eq!(
        r.cache,
        CacheSource::Disk,
        "the restarted worker compiled again"
    );
    let m = crate::observe::scrape(&second.addr).await;
    assert_eq!(
        crate::observe::get(&m, "peerwasm_module_cache_events_total{event=\"compile\"}"),
        0.0
    );
    assert_eq!(
        crate::observe::get(&m, "peerwasm_module_cache_events_total{event=\"disk_hit\"}"),
        1.0
    );
    let view = wait_for(&second.addr, Duration::from_secs(5), |v| !v.is_empty()).await;
    assert_eq!(
        view[0].advert.modules_received, 0,
        "the artifact served the job: nothing was uploaded again"
    );
}

/// A job that ends each worker it runs on (here: a killer that SIGKILLs any
/// worker with a busy slot): every broken connection is counted, since
/// its worker no longer answers while the others do, and the map gives the
/// input up after `max_lost` instead of killing the whole pool.
#[tokio::test(flavor = "multi_thread")]
async fn a_job_whose_workers_die_under_it_is_given_up_after_max_lost() {
    use crate::support::WorkerProcess;
    let a = WorkerProcess::start("256MiB", 1, None);
    let b = WorkerProcess::start("256MiB", 1, Some(&a.addr));
    let c = WorkerProcess::start("256MiB", 1, Some(&a.addr));
    wait_for(&a.addr, Duration::from_secs(10), |v| alive(v) == 3).await;
    let addrs: Vec<String> = [&a, &b, &c].iter().map(|w| w.addr.clone()).collect();
    let target = Target::pool(addrs.clone()).unwrap();
    let sleep = Job::new(peerwasm_testkit::guest_wasm_bytes("sleep"));
    let config = peerwasm::client::MapConfig {
        mem: Some((32 * MIB).into()),
        max_lost: 2,
        ..Default::default()
    };
    let workers = std::sync::Mutex::new(vec![a, b, c]);
    let killed = AtomicU32::new(0);
    let done = std::sync::atomic::AtomicBool::new(false);
    let operator = crate::pool::operator(&peerwasm::net::Transport::plain());
    let killer =
        async {
            while !done.load(Ordering::Relaxed) {
                for (i, addr) in addrs.iter().enumerate() {
                    let busy =
                        match peerwasm::client::fetch_peers(&operator, std::slice::from_ref(addr))
                            .await
                        {
                            Ok(v) => v
                                .iter()
                                .any(|p| p.advert.addr == *addr && p.advert.slots_busy > 0),
                            Err(_) => false,
                        };
                    if busy {
                        workers.lock().unwrap()[i].kill();
                        killed.fetch_add(1, Ordering::Relaxed);
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
    let mut items = Vec::new();
    let map = async {
        let inputs = std::iter::once(b"30000".to_vec());
        let summary = peerwasm::client::map(&target, &sleep, inputs, &config, &mut items).await;
        done.store(true, Ordering::Relaxed);
        summary
    };
    let (summary, ()) =
        tokio::time::timeout(Duration::from_secs(60), async { tokio::join!(map, killer) })
            .await
            .expect("the map goes on killing workers");
    let summary = summary.unwrap();
    assert_eq!(killed.load(Ordering::Relaxed), 2, "one worker left alive");
    assert_eq!(
        summary.stopped.expect("the lost input stops the map").index,
        0
    );
    match &items[0].result.outcome {
        peerwasm::proto::Outcome::Lost { reason } => {
            assert!(
                reason.starts_with("lost 2 times with the process running it"),
                "{reason}"
            )
        }
        other => panic!("expected lost, got {other:?}"),
    }
}
