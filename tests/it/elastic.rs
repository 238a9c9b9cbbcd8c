//! A pool that follows the work: a running map spreads onto workers that
//! join it and reports its backlog to the pool; a draining worker leaves
//! every view at once; workers on port 0 join through a shared pool
//! directory; a worker whose batch job ends drains first and takes no job
//! it could not finish. Real worker processes over real HTTP (and TLS).

use std::time::{Duration, Instant};

use peerwasm::client::{Job, MapConfig, MapItem, Target, map};
use peerwasm::gossip::PeerView;
use peerwasm::proto::{JobSpec, ModuleHash, Outcome};

use crate::pool::{alive, view, view_via, wait_for};
use crate::support::{MIB, WorkerProcess as Worker};

fn sleep_job(ms: u64) -> (Vec<u8>, JobSpec) {
    let bytes = peerwasm_testkit::guest_wasm_bytes("sleep");
    let mut spec = JobSpec::new(ModuleHash::of(&bytes));
    spec.stdin = ms.to_string().into_bytes();
    spec.limits.memory = peerwasm::proto::MemoryRequest::from(64 * MIB);
    (bytes, spec)
}

/// What `addr` says of its pool directory's controller.
async fn controller_of(http: &peerwasm::net::HttpClient, addr: &str) -> serde_json::Value {
    http.get(http.url(addr, peerwasm::proto::routes::CONTROLLER))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .map(|t| serde_json::from_str(&t).unwrap())
        .unwrap()
}

fn backlog_of(v: &[PeerView]) -> peerwasm::proto::backlog::PoolBacklog {
    peerwasm::proto::backlog::PoolBacklog::sum(v.iter().flat_map(|p| p.advert.backlog.iter()))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_map_spreads_onto_workers_that_join_while_it_runs_and_its_backlog_is_seen() {
    let a = Worker::start("1GiB", 1, None);
    let target = Target::pool(vec![a.addr.clone()]).unwrap();
    let job = Job::new(peerwasm_testkit::guest_wasm_bytes("sleep"));
    let config = MapConfig {
        mem: Some((64 * MIB).into()),
        ..MapConfig::default()
    };
    let running = tokio::spawn(async move {
        let mut items: Vec<MapItem> = Vec::new();
        let summary = map(
            &target,
            &job,
            (0..60).map(|_| b"300".to_vec()),
            &config,
            &mut items,
        )
        .await;
        (summary, items)
    });
    // The pool sees the demand: the map reports what it still has to run.
    let seen = wait_for(&a.addr, Duration::from_secs(10), |v| {
        backlog_of(v).waiting > 20
    })
    .await;
    let demand = backlog_of(&seen);
    assert_eq!(demand.maps, 1, "{demand:?}");
    assert!(
        demand.jobs() <= 60 && demand.largest_bytes == 64 * MIB,
        "{demand:?}"
    );
    let metrics = reqwest::get(format!("http://{}/metrics", a.addr))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("peerwasm_pool_backlog_jobs{state=\"waiting\"} ")),
        "{metrics}"
    );
    let table = reqwest::get(format!("http://{}/", a.addr))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        table.contains("backlog: ") && table.contains("waiting"),
        "{table}"
    );
    // Two workers join while it runs.
    let b = Worker::start("1GiB", 1, Some(&a.addr));
    let c = Worker::start("1GiB", 1, Some(&a.addr));
    let (summary, items) = running.await.unwrap();
    let summary = summary.unwrap();
    assert_eq!(items.len(), 60);
    assert!(
        items
            .iter()
            .all(|i| i.result.outcome == Outcome::Exited { code: 0 })
    );
    for w in [&b, &c] {
        let n = summary.per_peer.get(&w.addr).copied().unwrap_or(0);
        assert!(
            n >= 5,
            "{} joined mid-map and got {n} jobs: {:?}",
            w.addr,
            summary.per_peer
        );
    }
    // The map's end clears its backlog at once.
    wait_for(&a.addr, Duration::from_secs(3), |v| backlog_of(v).maps == 0).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_draining_worker_leaves_every_view_within_a_round() {
    let a = Worker::start("512MiB", 1, None);
    let mut b = Worker::start("512MiB", 1, Some(&a.addr));
    let c = Worker::start("512MiB", 1, Some(&a.addr));
    for w in [&a, &b, &c] {
        wait_for(&w.addr, Duration::from_secs(10), |v| alive(v) == 3).await;
    }
    let b_addr = b.addr.clone();
    let t = Instant::now();
    b.terminate();
    for w in [&a, &c] {
        wait_for(&w.addr, Duration::from_secs(5), |v| {
            v.iter().all(|p| p.advert.addr != b_addr)
        })
        .await;
    }
    // Gossip runs every 100 ms here; suspicion alone would take seconds.
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "gone from both views after {:?}",
        t.elapsed()
    );
    assert!(b.child.wait().unwrap().success());
}

#[tokio::test(flavor = "multi_thread")]
async fn workers_on_port_0_join_through_a_pool_directory_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let pool_dir = dir.path().join("pool");
    let args = [
        "--advertise",
        "127.0.0.1",
        "--pool-dir",
        pool_dir.to_str().unwrap(),
    ];
    let a = Worker::start_with("512MiB", 1, None, &args);
    // The second finds the first in the directory's members: no --join.
    let b = Worker::start_with("512MiB", 1, None, &args);
    assert_ne!(a.addr, b.addr, "two workers of one host, two ports");
    let ca = pool_dir.join("ca.crt");
    let transport = peerwasm::net::Transport::new(Some(&ca), false).unwrap();
    let http = crate::pool::operator(&transport);
    let start = Instant::now();
    loop {
        let v = view_via(&http, &b.addr).await;
        if alive(&v) == 2 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{v:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Each entry: the address, then the certificate its worker issued.
    let mut members: Vec<String> = std::fs::read_dir(pool_dir.join("members"))
        .unwrap()
        .map(|e| {
            let text = std::fs::read_to_string(e.unwrap().path()).unwrap();
            let (addr, cert) = text.split_once('\n').unwrap();
            assert!(
                pool_dir.join(format!("{}.crt", cert.trim())).exists(),
                "{text}"
            );
            addr.to_string()
        })
        .collect();
    members.sort();
    let mut both = vec![a.addr.clone(), b.addr.clone()];
    both.sort();
    assert_eq!(members, both);
    // A job over TLS, trusting the directory's CA alone.
    let pool = peerwasm::client::Pool::new(peerwasm::client::PoolConfig {
        transport,
        ..peerwasm::client::PoolConfig::new(vec![a.addr.clone()])
    })
    .unwrap();
    let (bytes, spec) = sleep_job(10);
    let res = Target::Pool(std::sync::Arc::new(pool))
        .run(&Job::new(bytes), spec)
        .await
        .unwrap();
    assert_eq!(res.outcome, Outcome::Exited { code: 0 });

    // No controller yet: null. Then one announces itself (as `peerwasm
    // adapt` does) and the workers show what it does, to clients and on
    // the status page.
    assert!(controller_of(&http, &a.addr).await.is_null());
    let mut status = peerwasm::server::controller::ControllerStatus {
        target: 4,
        workers: 2,
        pending: 2,
        backlog_jobs: 120,
        ..Default::default()
    };
    status.said("growing by 2: 120 jobs to run want 4 workers");
    peerwasm::server::pooldir::PoolDir::open(&pool_dir)
        .unwrap()
        .announce(&peerwasm::server::pooldir::Controller {
            name: "peerwasm-adapt-test".into(),
            host: "login1".into(),
            pid: 42,
            max_workers: 8,
            largest_job: 1 << 30,
            status,
        })
        .unwrap();
    let c = controller_of(&http, &b.addr).await;
    assert_eq!(c["name"], "peerwasm-adapt-test", "{c}");
    assert_eq!(c["status"]["target"], 4, "{c}");
    let url = format!("https://{}/", a.addr);
    let dom = tokio::task::spawn_blocking(move || crate::observe::browse(&url, None))
        .await
        .unwrap();
    assert!(
        dom.contains("grown by peerwasm adapt peerwasm-adapt-test")
            && dom.contains("growing by 2: 120 jobs to run want 4 workers"),
        "the controller is not on the status page:\n{dom}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_ending_soon_gets_no_job_that_would_outlast_it_and_drains_before_its_end() {
    // A's batch job ends in 30 s; it drains 20 s before: 10 s of jobs left.
    let mut a = Worker::start_with(
        "512MiB",
        1,
        None,
        &["--ends-in", "30s", "--drain-before", "20s"],
    );
    let b = Worker::start("512MiB", 1, Some(&a.addr));
    wait_for(&a.addr, Duration::from_secs(10), |v| alive(v) == 2).await;
    let me = view(&a.addr)
        .await
        .into_iter()
        .find(|p| p.advert.addr == a.addr)
        .unwrap();
    assert!(me.advert.ends_at_ms.is_some(), "{:?}", me.advert);
    // A job stating a minute's limit goes to B, though only A was named.
    let (bytes, mut spec) = sleep_job(10);
    spec.limits.timeout_ms = Some(60_000);
    let res = Target::pool(vec![a.addr.clone()])
        .unwrap()
        .run(&Job::new(bytes.clone()), spec.clone())
        .await
        .unwrap();
    assert_eq!(res.peer, b.addr, "{res:?}");
    // Sent to A directly, it is refused, saying why.
    let body = postcard::to_allocvec(&spec).unwrap();
    let http = crate::support::http();
    http.put(format!("http://{}/v1/modules/{}", a.addr, spec.module))
        .body(bytes)
        .send()
        .await
        .unwrap();
    let r = http
        .post(format!("http://{}/v1/jobs", a.addr))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.text().await.unwrap().contains("batch job ends in"));
    // A short job still runs on A.
    let (bytes, mut spec) = sleep_job(10);
    spec.limits.timeout_ms = Some(2_000);
    let res = Target::pool(vec![a.addr.clone()])
        .unwrap()
        .run(&Job::new(bytes), spec)
        .await
        .unwrap();
    assert_eq!(res.outcome, Outcome::Exited { code: 0 });
    // At 10 s it drains by itself, leaves the pool and exits.
    let a_addr = a.addr.clone();
    wait_for(&b.addr, Duration::from_secs(20), |v| {
        v.iter().all(|p| p.advert.addr != a_addr)
    })
    .await;
    let start = Instant::now();
    while a.child.try_wait().unwrap().is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "A did not stop after draining"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_growing_pool_asks_new_members_directly_and_a_silent_one_holds_nothing_up() {
    // A and B are not joined: B is in no gossip view A gives. A third
    // member accepts connections and never answers (a node gone quiet
    // whose entry has not expired yet).
    let a = Worker::start("512MiB", 1, None);
    let b = Worker::start("512MiB", 1, None);
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let members = vec![
        a.addr.clone(),
        b.addr.clone(),
        silent.local_addr().unwrap().to_string(),
    ];
    let pool = peerwasm::client::Pool::new(peerwasm::client::PoolConfig {
        growth: Some(peerwasm::client::growth::Growth {
            members: std::sync::Arc::new(move || members.clone()),
            largest_job: 512 * MIB,
            patience: Duration::from_secs(60),
            report: std::sync::Arc::new(|_| {}),
        }),
        ..peerwasm::client::PoolConfig::new(Vec::new())
    })
    .unwrap();
    let t = Instant::now();
    let v = pool.view().await.unwrap();
    let took = t.elapsed();
    let mut addrs: Vec<&str> = v.iter().map(|p| p.advert.addr.as_str()).collect();
    addrs.sort();
    let mut both = [a.addr.as_str(), b.addr.as_str()];
    both.sort();
    assert_eq!(addrs, both, "B's own record joins A's view");
    assert!(
        took < Duration::from_secs(5),
        "the silent member held the view up for {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_seed_that_accepts_and_never_answers_delays_the_view_not_forever() {
    // The first worker named was stopped (a laptop closed): its kernel
    // still accepts connections, nothing answers them.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let a = Worker::start("512MiB", 1, None);
    let pool = peerwasm::client::Pool::new(peerwasm::client::PoolConfig::new(vec![
        silent.local_addr().unwrap().to_string(),
        a.addr.clone(),
    ]))
    .unwrap();
    let t = Instant::now();
    let v = tokio::time::timeout(Duration::from_secs(30), pool.view())
        .await
        .expect("the view waited on the silent seed for 30 s")
        .unwrap();
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].advert.addr, a.addr);
    assert!(
        t.elapsed() >= Duration::from_secs(4),
        "the silent seed was asked first"
    );
    // The next view asks it last: no wait.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let t = Instant::now();
    assert_eq!(pool.view().await.unwrap().len(), 1);
    assert!(
        t.elapsed() < Duration::from_secs(4),
        "the silent seed held the next view up for {:?}",
        t.elapsed()
    );
}
