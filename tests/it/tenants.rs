//! Many tenants on one pool: tokens, job ids that leak nothing, fair share
//! (the smartshare seed's experiment), weights, and usage counted across
//! the pool — against real worker processes.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use peerwasm::client::{Job, MapConfig, MapItem, MapObserver, Target, map};
use peerwasm::gossip::PeerView;
use peerwasm::proto::{JobResult, JobSpec, Outcome};
use reqwest::StatusCode;

use crate::pool::{alive, wait_for};
use crate::support::{MIB, WorkerProcess};

pub(crate) const ALICE: &str = "alice-token";
pub(crate) const BOB: &str = "bob-token";
/// A third tenant, for warming caches without charging alice or bob; the
/// tenants file's operator, who may see every tenant's usage.
pub(crate) const CAROL: &str = "carol-token";

fn sha(token: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(token.as_bytes()))
}

/// A tenants file with alice and bob at these weights.
pub(crate) fn tenants_file(alice_weight: u32, bob_weight: u32) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    let text = format!(
        "[[tenant]]\nname = \"alice\"\ntoken_sha256 = \"{}\"\nweight = {alice_weight}\n\n\
         [[tenant]]\nname = \"bob\"\ntoken_sha256 = \"{}\"\nweight = {bob_weight}\n\n\
         [[tenant]]\nname = \"carol\"\ntoken_sha256 = \"{}\"\noperator = true\n",
        sha(ALICE),
        sha(BOB),
        sha(CAROL)
    );
    std::io::Write::write_all(&mut f, text.as_bytes()).unwrap();
    f
}

pub(crate) fn worker(
    slots: u32,
    tenants: &tempfile::NamedTempFile,
    join: Option<&str>,
    extra: &[&str],
) -> WorkerProcess {
    let mut args = vec!["--tenants", tenants.path().to_str().unwrap()];
    args.extend_from_slice(extra);
    WorkerProcess::start_with("2GiB", slots, join, &args)
}

pub(crate) fn sleep_job() -> Job {
    Job::new(peerwasm_testkit::guest_wasm_bytes("sleep"))
}

pub(crate) fn http() -> reqwest::Client {
    crate::support::http()
}

pub(crate) async fn upload(addr: &str, job: &Job, token: Option<&str>) -> StatusCode {
    let mut req = http()
        .put(format!("http://{addr}/v1/modules/{}", job.hash().to_hex()))
        .body(job.bytes().to_vec());
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    req.send().await.unwrap().status()
}

pub(crate) async fn post(
    addr: &str,
    spec: &JobSpec,
    token: Option<&str>,
    detach: bool,
) -> reqwest::Response {
    let mut req = http()
        .post(format!(
            "http://{addr}/v1/jobs{}",
            if detach { "?detach=true" } else { "" }
        ))
        .body(postcard::to_allocvec(spec).unwrap());
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    req.send().await.unwrap()
}

/// This worker's advert, as the operator sees it (every tenant's usage).
pub(crate) async fn me(addr: &str) -> peerwasm::proto::Advert {
    let operator =
        peerwasm::client::http_client(Some(CAROL), &peerwasm::net::Transport::plain()).unwrap();
    let v: Vec<PeerView> = peerwasm::client::fetch_peers(&operator, &[addr.to_string()])
        .await
        .unwrap();
    v.into_iter()
        .find(|p| p.advert.addr == addr)
        .unwrap()
        .advert
}

#[tokio::test(flavor = "multi_thread")]
async fn tokens_are_required_and_job_ids_are_private() {
    let tenants = tenants_file(1, 1);
    let w = worker(1, &tenants, None, &[]);
    let job = sleep_job();
    let spec = job.spec(b"10".to_vec(), 32 * MIB);

    // No token, a wrong token: 401, and nothing is stored or run.
    assert_eq!(upload(&w.addr, &job, None).await, StatusCode::UNAUTHORIZED);
    assert_eq!(
        upload(&w.addr, &job, Some("guess")).await,
        StatusCode::UNAUTHORIZED
    );
    let r = post(&w.addr, &spec, None, false).await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert!(r.text().await.unwrap().contains("needs a tenant token"));
    assert_eq!(
        post(&w.addr, &spec, Some("guess"), false).await.status(),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(me(&w.addr).await.jobs_run, 0);
    assert!(me(&w.addr).await.multi_tenant);

    // Alice's detached job: only alice can see it and take its result.
    assert!(upload(&w.addr, &job, Some(ALICE)).await.is_success());
    let r = post(&w.addr, &spec, Some(ALICE), true).await;
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let id = r.text().await.unwrap();
    assert_eq!(id.len(), 32, "128 random bits in hex: {id}");
    let get = |token: &'static str, id: String| {
        let addr = w.addr.clone();
        async move {
            http()
                .get(format!("http://{addr}/v1/jobs/{id}"))
                .bearer_auth(token)
                .send()
                .await
                .unwrap()
        }
    };
    let list = |token: &'static str| {
        let addr = w.addr.clone();
        async move {
            let r = http()
                .get(format!("http://{addr}/v1/jobs"))
                .bearer_auth(token)
                .send()
                .await
                .unwrap();
            serde_json::from_slice::<Vec<peerwasm::proto::JobStatus>>(&r.bytes().await.unwrap())
                .unwrap()
        }
    };
    assert_eq!(
        get(BOB, id.clone()).await.status(),
        StatusCode::NOT_FOUND,
        "not 403: existence is not leaked"
    );
    assert_eq!(
        get(BOB, "0".repeat(32)).await.status(),
        StatusCode::NOT_FOUND
    );
    assert!(list(BOB).await.is_empty());
    assert_eq!(list(ALICE).await.len(), 1);
    let result: JobResult = loop {
        let r = get(ALICE, id.clone()).await;
        if r.status() == StatusCode::OK {
            break postcard::from_bytes(&r.bytes().await.unwrap()).unwrap();
        }
        assert_eq!(r.status(), StatusCode::ACCEPTED);
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(result.outcome, Outcome::Exited { code: 0 });
    // A result stays until its owner discards it: an answer lost in transit
    // can be asked for again.
    let again = get(ALICE, id.clone()).await;
    assert_eq!(again.status(), StatusCode::OK, "read twice");
    assert_eq!(
        postcard::from_bytes::<JobResult>(&again.bytes().await.unwrap()).unwrap(),
        result
    );
    let discard = |token: &'static str, id: String| {
        let addr = w.addr.clone();
        async move {
            http()
                .delete(format!("http://{addr}/v1/jobs/{id}"))
                .bearer_auth(token)
                .send()
                .await
                .unwrap()
        }
    };
    assert_eq!(
        discard(BOB, id.clone()).await.status(),
        StatusCode::NOT_FOUND,
        "only its owner discards it"
    );
    assert_eq!(discard(ALICE, id.clone()).await.status(), StatusCode::OK);
    assert_eq!(
        get(ALICE, id).await.status(),
        StatusCode::NOT_FOUND,
        "discarded"
    );

    // A synchronous job names its id too; the account shows it per tenant.
    // (Bob shows the module's bytes first: a hash alone runs nothing.)
    assert!(upload(&w.addr, &job, Some(BOB)).await.is_success());
    let r = post(&w.addr, &spec, Some(BOB), false).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.headers().contains_key(peerwasm::proto::JOB_ID_HEADER));
    let advert = wait_for(&w.addr, Duration::from_secs(5), |v| {
        v[0].advert
            .tenants
            .iter()
            .map(|t| t.account.jobs)
            .sum::<u64>()
            == 2
    })
    .await;
    let names: Vec<&str> = advert[0]
        .advert
        .tenants
        .iter()
        .map(|t| t.tenant.as_str())
        .collect();
    // (Both tenants that ran jobs here; carol ran none.)
    assert_eq!(names, ["alice", "bob"]);

    // The command line: a clear error for a bad token, a result for a good one.
    let wasm = peerwasm_testkit::guest_wasm("hello");
    let run = |token: &str| {
        std::process::Command::new(crate::support::PEERWASM)
            .args([
                "run",
                "--mem",
                "16MiB",
                "--peers",
                &w.addr,
                "--token",
                token,
                wasm.to_str().unwrap(),
                "hi",
            ])
            .output()
            .unwrap()
    };
    let out = run("guess");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("the tenant token is not known here"));
    let out = run(ALICE);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hi\n");

    // And `peerwasm status` sums the accounts per tenant.
    let out = std::process::Command::new(crate::support::PEERWASM)
        .args(["status", "--json", "--peers", &w.addr, "--token", CAROL])
        .output()
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["workers_up"], 1);
    assert_eq!(status["tenants"]["bob"]["account"]["jobs"], 1);
}

/// Records when each result of a map arrived.
struct Finish(Arc<Mutex<Vec<Instant>>>);

impl MapObserver for Finish {
    fn result(&mut self, item: MapItem) -> anyhow::Result<()> {
        assert!(item.succeeded(), "{item:?}");
        self.0.lock().unwrap().push(Instant::now());
        Ok(())
    }
}

/// Maps `count` sleep jobs of `ms` each as `token`; returns when it ended.
async fn sleep_map(addr: &str, token: &str, count: usize, ms: u64) -> Instant {
    let target = Target::pool_as(vec![addr.to_string()], Some(token.to_string())).unwrap();
    let inputs = vec![format!("{ms}\n").into_bytes(); count];
    let config = MapConfig {
        mem: Some((32 * MIB).into()),
        ..MapConfig::default()
    };
    let mut finish = Finish(Arc::new(Mutex::new(Vec::new())));
    map(&target, &sleep_job(), inputs, &config, &mut finish)
        .await
        .unwrap();
    Instant::now()
}

/// The smartshare seed's experiment on one slot: A maps 10 jobs of 1 unit,
/// B 10 of 10 units, together. Returns (A's finish / B's finish, elapsed).
pub async fn seed_experiment(unit_ms: u64, fair_share: bool) -> (f64, Duration, f64) {
    seed_experiment_in_order(unit_ms, fair_share, None, None).await
}

/// [`seed_experiment`] where the tenant of `prior` (a token) first ran one
/// tiny job, and the map of `first` (a token) started half a unit before
/// the other's; `None`: nobody ran anything, both start together.
pub async fn seed_experiment_in_order(
    unit_ms: u64,
    fair_share: bool,
    prior: Option<&str>,
    first: Option<&str>,
) -> (f64, Duration, f64) {
    let tenants = tenants_file(1, 1);
    let w = worker(
        1,
        &tenants,
        None,
        &["--fair-share", if fair_share { "on" } else { "off" }],
    );
    // Compile the module before the clock starts (compiling holds the slot,
    // so it is charged: to a third tenant).
    let warm = Target::pool_as(vec![w.addr.clone()], Some(CAROL.into())).unwrap();
    warm.run(&sleep_job(), sleep_job().spec(b"1".to_vec(), 32 * MIB))
        .await
        .unwrap();
    if let Some(token) = prior {
        let tiny = Target::pool_as(vec![w.addr.clone()], Some(token.into())).unwrap();
        let r = tiny
            .run(&sleep_job(), sleep_job().spec(b"1".to_vec(), 32 * MIB))
            .await
            .unwrap();
        assert!(r.outcome.is_success());
    }
    let start = Instant::now();
    let lead = |token: &str| {
        let delay = if first == Some(token) || first.is_none() {
            0
        } else {
            unit_ms / 2
        };
        Duration::from_millis(delay)
    };
    let (addr_a, addr_b) = (w.addr.clone(), w.addr.clone());
    let (a, b) = tokio::join!(
        async move {
            tokio::time::sleep(lead(ALICE)).await;
            sleep_map(&addr_a, ALICE, 10, unit_ms).await
        },
        async move {
            tokio::time::sleep(lead(BOB)).await;
            sleep_map(&addr_b, BOB, 10, 10 * unit_ms).await
        }
    );
    let (a, b) = (a - start, b - start);
    let ratio = b.as_secs_f64() / a.as_secs_f64();
    (ratio, a.max(b), (110 * unit_ms) as f64 / 1000.0)
}

/// The design's acceptance test, held to its 5× bar. Each job's start costs
/// a few milliseconds more on a busy machine and every one of A's ten jobs
/// pays it (CI at 40 ms units fell to 4.99×; at 100 ms, with three busy
/// loops beside it on two cores, 5.08×), so the units are 200 ms: A's share
/// of that cost is then small beside the 5.5× a quiet slot gives.
#[tokio::test(flavor = "multi_thread")]
async fn the_seed_experiment_short_jobs_finish_five_times_sooner() {
    let unit = 200;
    let (ratio, elapsed, work) = seed_experiment(unit, true).await;
    println!(
        "seed experiment, unit {unit} ms: A finished {ratio:.2}x sooner than B; elapsed {elapsed:?} for {work:.2} s of work"
    );
    assert!(ratio >= 5.0, "A finished only {ratio:.2}x sooner");
    // The slot never idled while work waited.
    assert!(
        elapsed.as_secs_f64() <= work + 0.5,
        "elapsed {elapsed:?} for {work} s of work"
    );
}

/// Fair share must not depend on who came first or who ran a small job
/// before: in every order the short jobs finish far sooner. Quiet, A leads
/// by 5.5× (the single-order test above holds it to 5×); first come first
/// served would give 1.0× when B comes first, round robin 1.1×. Each job's
/// start costs more on a busy machine (CI shares it: at load 5–7 on two
/// cores one order of six fell to 3.6× with units of 50 ms), so here the
/// units are 100 ms, which halves that cost's share, and the bar for each
/// of the six orders is 4.5×.
#[tokio::test(flavor = "multi_thread")]
async fn the_seed_experiment_holds_in_every_order_and_after_a_prior_job() {
    let unit = 100;
    for prior in [None, Some(ALICE), Some(BOB)] {
        for first in [Some(ALICE), Some(BOB)] {
            let (ratio, elapsed, work) = seed_experiment_in_order(unit, true, prior, first).await;
            let name = |t: Option<&str>| t.map_or("nobody", |t| if t == ALICE { "A" } else { "B" });
            println!(
                "seed experiment, prior job by {}, {} first: A finished {ratio:.2}x sooner than B; elapsed {elapsed:?} for {work:.2} s",
                name(prior),
                name(first)
            );
            assert!(
                ratio >= 4.5,
                "prior job by {}, {} first: A finished only {ratio:.2}x sooner",
                name(prior),
                name(first)
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn weights_split_the_slots_two_to_one() {
    let tenants = tenants_file(2, 1);
    let w = worker(2, &tenants, None, &[]);
    let addr = w.addr.clone();
    let maps = tokio::spawn(async move {
        tokio::join!(
            sleep_map(&addr, ALICE, 2000, 20),
            sleep_map(&addr, BOB, 2000, 20)
        );
    });
    let jobs = |advert: &peerwasm::proto::Advert, name: &str| {
        advert
            .tenants
            .iter()
            .find(|t| t.tenant == name)
            .map_or(0, |t| t.account.jobs)
    };
    // Measure over a window in which both keep the worker saturated.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let before = me(&w.addr).await;
    tokio::time::sleep(Duration::from_millis(3000)).await;
    let after = me(&w.addr).await;
    maps.abort();
    let a = (jobs(&after, "alice") - jobs(&before, "alice")) as f64;
    let b = (jobs(&after, "bob") - jobs(&before, "bob")) as f64;
    println!("weights 2:1 → alice {a} jobs, bob {b} jobs: {:.2}", a / b);
    assert!(b > 20.0, "bob ran too few jobs to judge: {b}");
    assert!(
        (a / b - 2.0).abs() <= 0.3,
        "alice:bob = {a}:{b} = {:.2}, not 2 ± 15%",
        a / b
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn usage_is_counted_across_the_pool() {
    let tenants = tenants_file(1, 1);
    let w1 = worker(1, &tenants, None, &[]);
    let w2 = worker(1, &tenants, Some(&w1.addr), &[]);
    wait_for(&w2.addr, Duration::from_secs(10), |v| alive(v) == 2).await;
    let job = sleep_job();
    for (w, token) in [(&w1, ALICE), (&w1, BOB), (&w2, ALICE), (&w2, BOB)] {
        assert!(upload(&w.addr, &job, Some(token)).await.is_success());
    }
    // Bob has used worker 1 a lot.
    for _ in 0..4 {
        assert_eq!(
            post(
                &w1.addr,
                &job.spec(b"150".to_vec(), 32 * MIB),
                Some(BOB),
                false
            )
            .await
            .status(),
            StatusCode::OK
        );
    }
    let w1_addr = w1.addr.clone();
    wait_for(&w2.addr, Duration::from_secs(5), |v| {
        v.iter()
            .any(|p| p.advert.addr == w1_addr && p.advert.tenants.iter().any(|t| t.tenant == "bob"))
    })
    .await;
    // On worker 2 alice holds the slot for a moment; then bob's job and
    // alice's queue, bob's first. Worker 2 alone would start bob's (alice
    // has used it, bob not); the pool knows better.
    let occupy = tokio::spawn({
        let (addr, spec) = (w2.addr.clone(), job.spec(b"300".to_vec(), 32 * MIB));
        async move { post(&addr, &spec, Some(ALICE), false).await.status() }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut queued = Vec::new();
    for token in [BOB, ALICE] {
        let (addr, spec, order) = (
            w2.addr.clone(),
            job.spec(b"50".to_vec(), 32 * MIB),
            order.clone(),
        );
        queued.push(tokio::spawn(async move {
            assert_eq!(
                post(&addr, &spec, Some(token), false).await.status(),
                StatusCode::OK
            );
            order.lock().unwrap().push(token);
        }));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(occupy.await.unwrap(), StatusCode::OK);
    for q in queued {
        q.await.unwrap();
    }
    assert_eq!(
        *order.lock().unwrap(),
        [ALICE, BOB],
        "worker 2 preferred the tenant with less pool-wide usage"
    );
}
