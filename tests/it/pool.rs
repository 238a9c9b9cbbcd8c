//! A pool of real worker processes on loopback, talking real HTTP.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use peerwasm::client::{Job, SubmitError, Target};
use peerwasm::gossip::Liveness;
use peerwasm::gossip::PeerView;
use peerwasm::proto::{JobResult, JobSpec, ModuleHash, Outcome};

use crate::support::{MIB, WorkerProcess as Worker};

const GIB: u64 = 1 << 30;

fn http() -> reqwest::Client {
    crate::support::http()
}

/// `addr`'s pool view, asked with the token of the tenants file's operator
/// (`tenants::CAROL`), so it shows every tenant's usage on workers with
/// `--tenants` (a worker without them takes any token).
pub(crate) async fn view(addr: &str) -> Vec<PeerView> {
    view_via(&operator(&peerwasm::net::Transport::plain()), addr).await
}

/// The tenants file's operator on `transport` (who sees every tenant's usage).
pub(crate) fn operator(transport: &peerwasm::net::Transport) -> peerwasm::net::HttpClient {
    peerwasm::client::http_client(Some(crate::tenants::CAROL), transport).unwrap()
}

/// `addr`'s view, asked with `http`.
pub(crate) async fn view_via(http: &peerwasm::net::HttpClient, addr: &str) -> Vec<PeerView> {
    peerwasm::client::fetch_peers(http, &[addr.to_string()])
        .await
        .expect("a pool view")
}

/// Polls `addr`'s view until `done`, for at most `limit`.
pub(crate) async fn wait_for(
    addr: &str,
    limit: Duration,
    done: impl Fn(&[PeerView]) -> bool,
) -> Vec<PeerView> {
    wait_for_via(
        &operator(&peerwasm::net::Transport::plain()),
        addr,
        limit,
        done,
    )
    .await
}

/// [`wait_for`], asking with `http`.
pub(crate) async fn wait_for_via(
    http: &peerwasm::net::HttpClient,
    addr: &str,
    limit: Duration,
    done: impl Fn(&[PeerView]) -> bool,
) -> Vec<PeerView> {
    let start = Instant::now();
    loop {
        let v = view_via(http, addr).await;
        if done(&v) {
            return v;
        }
        assert!(
            start.elapsed() < limit,
            "condition not reached in {limit:?}; view: {v:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub(crate) fn alive(v: &[PeerView]) -> usize {
    v.iter().filter(|p| p.liveness == Liveness::Alive).count()
}

/// Three workers of 1, 2 and 4 GiB joined through the first.
pub(crate) async fn three_workers() -> [Worker; 3] {
    let a = Worker::start("1GiB", 2, None);
    let b = Worker::start("2GiB", 2, Some(&a.addr));
    let c = Worker::start("4GiB", 2, Some(&a.addr));
    for w in [&a, &b, &c] {
        wait_for(&w.addr, Duration::from_secs(10), |v| alive(v) == 3).await;
    }
    [a, b, c]
}

/// One job on the pool reached through `peers`, as `peerwasm run --peers`.
async fn remote_run(
    peers: &[String],
    bytes: &[u8],
    spec: &JobSpec,
) -> Result<JobResult, SubmitError> {
    let target = Target::pool(peers.to_vec()).unwrap();
    target.run(&Job::new(bytes.to_vec()), spec.clone()).await
}

fn job(name: &str, stdin: &str, mem: u64) -> (Vec<u8>, JobSpec) {
    let bytes = peerwasm_testkit::guest_wasm_bytes(name);
    let mut spec = JobSpec::new(ModuleHash::of(&bytes));
    spec.stdin = stdin.as_bytes().to_vec();
    spec.limits.memory = peerwasm::proto::MemoryRequest::from(mem);
    (bytes, spec)
}

#[tokio::test(flavor = "multi_thread")]
async fn workers_join_through_a_seed_and_a_killed_one_leaves_placement() {
    let [a, b, mut c] = three_workers().await;
    // Each sees each, with its capacity.
    let v = view(&b.addr).await;
    let mut caps: Vec<u64> = v.iter().map(|p| p.advert.capacity_bytes).collect();
    caps.sort();
    assert_eq!(caps, [GIB, 2 * GIB, 4 * GIB]);

    let c_addr = c.addr.clone();
    c.kill();
    let v = wait_for(&a.addr, Duration::from_secs(15), |v| {
        v.iter()
            .any(|p| p.advert.addr == c_addr && p.liveness == Liveness::Dead)
    })
    .await;
    let candidates = peerwasm::client::placement::candidates(&v, GIB).unwrap();
    assert!(!candidates.contains(&c_addr), "{candidates:?}");
    // Only the dead worker could take 3 GiB.
    let err = peerwasm::client::placement::candidates(&v, 3 * GIB)
        .unwrap_err()
        .to_string();
    assert!(err.contains("largest the pool can take is 2 GiB"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn best_fit_places_jobs_and_refuses_what_no_one_can_hold() {
    let [a, b, c] = three_workers().await;
    let peers = [a.addr.clone()];

    let (bytes, spec) = job("hello", "", 3 * GIB);
    let res = remote_run(&peers, &bytes, &spec).await.unwrap();
    assert_eq!(res.outcome, Outcome::Exited { code: 0 });
    assert_eq!(res.peer, c.addr, "only the 4 GiB worker fits 3 GiB");

    let (bytes, spec) = job("hello", "", 1536 * MIB);
    let res = remote_run(&peers, &bytes, &spec).await.unwrap();
    assert_eq!(
        res.peer, b.addr,
        "the 2 GiB worker is the best fit for 1.5 GiB"
    );

    // Adverts are hints: until gossip brings B's release, B looks like it
    // has 512 MiB to spare, a better fit than A's 1 GiB. Wait for it.
    wait_for(&a.addr, Duration::from_secs(5), |v| {
        v.iter().all(|p| p.advert.reserved_bytes == 0)
    })
    .await;
    let (bytes, spec) = job("hello", "", 256 * MIB);
    let res = remote_run(&peers, &bytes, &spec).await.unwrap();
    assert_eq!(res.peer, a.addr, "the smallest that fits");

    // Through the command line: refused at once, naming the largest.
    let wasm = peerwasm_testkit::guest_wasm("hello");
    let started = Instant::now();
    let out = Command::new(crate::support::PEERWASM)
        .args([
            "run",
            "--mem",
            "8GiB",
            "--peers",
            &a.addr,
            wasm.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no peer can hold a job of 8 GiB: the largest the pool can take is 4 GiB"),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));

    // And a remote run behaves like an embedded one: output and exit code.
    let out = Command::new(crate::support::PEERWASM)
        .args([
            "run",
            "--mem",
            "16MiB",
            "--peers",
            &a.addr,
            peerwasm_testkit::guest_wasm("memhog").to_str().unwrap(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(b"64")?;
            child.wait_with_output()
        })
        .unwrap();
    assert_eq!(out.status.code(), Some(137));
    assert!(String::from_utf8_lossy(&out.stderr).contains("memory limit of 16 MiB"));
}

/// A worker lending 8 GiB still runs no job over 4 GiB (all a wasm32
/// memory addresses): it advertises that, so the client refuses such a job
/// at once instead of placing it where the sandbox would reject it.
#[test]
fn a_job_over_the_most_a_job_may_have_is_refused_before_it_is_placed() {
    let w = Worker::start("8GiB", 1, None);
    let wasm = peerwasm_testkit::guest_wasm("hello");
    let out = Command::new(crate::support::PEERWASM)
        .args([
            "run",
            "--mem",
            "6GiB",
            "--peers",
            &w.addr,
            wasm.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no peer can hold a job of 6 GiB: the largest the pool can take is 4 GiB"),
        "{err}"
    );
    let out = Command::new(crate::support::PEERWASM)
        .args(["peers", "--json", "--peers", &w.addr])
        .output()
        .unwrap();
    let view: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(view[0]["advert"]["max_job_bytes"], 4u64 << 30, "{view}");
    assert_eq!(view[0]["advert"]["capacity_bytes"], 8u64 << 30);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_module_is_uploaded_once_per_worker() {
    let [a, b, c] = three_workers().await;
    let peers = [a.addr.clone()];
    for mem in [256 * MIB, 1536 * MIB, 3 * GIB].repeat(3) {
        let (bytes, spec) = job("primes", r#"{"n": 1000}"#, mem);
        let res = remote_run(&peers, &bytes, &spec).await.unwrap();
        assert_eq!(res.outcome, Outcome::Exited { code: 0 });
    }
    // Placement follows (possibly stale) adverts, so which worker ran how
    // many is not fixed; but each that ran any got the module exactly once.
    let mut total = 0;
    let mut used = 0;
    for w in [&a, &b, &c] {
        let v = view(&w.addr).await;
        let me = &v.iter().find(|p| p.advert.addr == w.addr).unwrap().advert;
        total += me.jobs_run;
        used += (me.jobs_run > 0) as u32;
        assert_eq!(me.modules_received, (me.jobs_run > 0) as u64, "{me:?}");
    }
    assert_eq!(total, 9);
    assert!(
        used >= 2,
        "the 3 GiB jobs fit only one worker, the 256 MiB ones best fit another"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn reservations_never_exceed_capacity_under_concurrent_submitters() {
    let a = Worker::start("1GiB", 2, None);
    let b = Worker::start("1GiB", 2, Some(&a.addr));
    wait_for(&a.addr, Duration::from_secs(10), |v| alive(v) == 2).await;
    let peers = vec![a.addr.clone(), b.addr.clone()];
    let submitters = (0..8u64).map(|s| {
        let peers = peers.clone();
        tokio::spawn(async move {
            let mut outcomes = Vec::new();
            for i in 0..5u64 {
                // Pseudo-random requests from 128 MiB to 1 GiB.
                let mem = (128 + (s * 7919 + i * 104729) % 897) * MIB;
                let (bytes, spec) = job("sleep", "50", mem);
                // Both queues full at once: the client waits for room.
                let res = remote_run(&peers, &bytes, &spec).await.unwrap();
                outcomes.push(res.outcome);
            }
            outcomes
        })
    });
    for outcomes in futures::future::join_all(submitters).await {
        assert!(
            outcomes
                .unwrap()
                .iter()
                .all(|o| *o == Outcome::Exited { code: 0 })
        );
    }
    let mut high_waters = Vec::new();
    for w in [&a, &b] {
        let v = view(&w.addr).await;
        let me = &v.iter().find(|p| p.advert.addr == w.addr).unwrap().advert;
        assert!(me.reserved_high_water_bytes <= me.capacity_bytes, "{me:?}");
        assert_eq!(me.reserved_bytes, 0, "everything given back");
        high_waters.push(me.reserved_high_water_bytes);
    }
    // The test must have pushed the ledger: two jobs at once on some worker.
    assert!(
        high_waters.iter().any(|&h| h > 512 * MIB),
        "{high_waters:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_finishes_running_jobs_and_leaves_the_pool() {
    // A is the best fit for the job (least to spare).
    let mut a = Worker::start("512MiB", 2, None);
    let b = Worker::start("1GiB", 2, Some(&a.addr));
    wait_for(&b.addr, Duration::from_secs(10), |v| alive(v) == 2).await;
    wait_for(&a.addr, Duration::from_secs(10), |v| alive(v) == 2).await;
    let peers = [a.addr.clone()];
    let (bytes, spec) = job("sleep", "1500", 256 * MIB);
    let running = tokio::spawn(async move { remote_run(&peers, &bytes, &spec).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let a_addr = a.addr.clone();
    a.terminate();
    // B learns that A is leaving: A is gone from its view.
    wait_for(&b.addr, Duration::from_secs(5), |v| {
        v.iter().all(|p| p.advert.addr != a_addr)
    })
    .await;
    let res = running
        .await
        .unwrap()
        .expect("the running job's result still arrives");
    assert_eq!(res.outcome, Outcome::Exited { code: 0 });
    assert_eq!(res.peer, a_addr);
    let status = a.child.wait().unwrap();
    assert!(status.success(), "{status:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_bytes_get_a_4xx_and_the_worker_goes_on() {
    let a = Worker::start("1GiB", 1, None);
    let http = http();
    let url = |path: &str| format!("http://{}{path}", a.addr);
    let garbage = vec![0xffu8; 100];

    let r = http
        .post(url("/v1/jobs"))
        .body(garbage.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("bad job request"));

    // Gossip is sealed with the pool's key (this user's, on loopback):
    // garbage is refused before it is read further.
    let r = http
        .post(url("/v1/gossip"))
        .body(garbage.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);

    let r = http
        .put(url("/v1/modules/not-a-hash"))
        .body(garbage.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);

    let wrong = ModuleHash::of(b"something else").to_hex();
    let r = http
        .put(url(&format!("/v1/modules/{wrong}")))
        .body(garbage.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("do not match"));

    // A job whose module was never uploaded: 404 tells the client to upload.
    let (_, spec) = job("hello", "", 64 * MIB);
    let body = postcard::to_allocvec(&spec).unwrap();
    let r = http.post(url("/v1/jobs")).body(body).send().await.unwrap();
    assert_eq!(r.status(), 404);

    // A job that can never fit is refused at once, naming the largest.
    let (bytes, mut spec) = job("hello", "", 64 * MIB);
    let hash = spec.module.to_hex();
    http.put(url(&format!("/v1/modules/{hash}")))
        .body(bytes)
        .send()
        .await
        .unwrap();
    spec.limits.memory = peerwasm::proto::MemoryRequest::from(2 * GIB);
    let r = http
        .post(url("/v1/jobs"))
        .body(postcard::to_allocvec(&spec).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 422);
    assert_eq!(
        r.headers()[peerwasm::proto::LARGEST_JOB_HEADER],
        GIB.to_string().as_str()
    );

    // Still serving.
    spec.limits.memory = peerwasm::proto::MemoryRequest::from(64 * MIB);
    let r = http
        .post(url("/v1/jobs"))
        .body(postcard::to_allocvec(&spec).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let res: peerwasm::proto::JobResult = postcard::from_bytes(&r.bytes().await.unwrap()).unwrap();
    assert_eq!(res.outcome, Outcome::Exited { code: 0 });
}
