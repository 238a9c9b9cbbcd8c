//! Seeing the pool: `/metrics` parsed as Prometheus text and moving with
//! the jobs, and each operator warning provoked on a real worker.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use peerwasm::client::{Job, Target};
use peerwasm::proto::Outcome;

use crate::support::{MIB, WorkerProcess};

/// Parses the text exposition strictly enough to catch a malformed line:
/// `name{labels} value` or `name value`, with a number for a value, `#`
/// lines for HELP/TYPE/UNIT, and `# EOF` last.
fn parse(text: &str) -> HashMap<String, f64> {
    let mut samples = HashMap::new();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.last(),
        Some(&"# EOF"),
        "OpenMetrics text ends with # EOF"
    );
    for line in &lines[..lines.len() - 1] {
        if let Some(comment) = line.strip_prefix("# ") {
            let kind = comment.split(' ').next().unwrap();
            assert!(
                ["HELP", "TYPE", "UNIT"].contains(&kind),
                "bad comment line {line:?}"
            );
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("no value in {line:?}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in {line:?}"));
        let name = series.split('{').next().unwrap();
        assert!(
            name.starts_with("peerwasm_")
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "bad metric name in {line:?}"
        );
        if let Some(labels) = series.strip_prefix(name) {
            assert!(
                labels.is_empty() || (labels.starts_with('{') && labels.ends_with('}')),
                "bad labels in {line:?}"
            );
        }
        assert!(
            samples.insert(series.to_string(), value).is_none(),
            "{series} twice"
        );
    }
    samples
}

/// `addr`'s metrics, scraped with the operator's token (`tenants::CAROL`):
/// with `--tenants` they are an operator's to read.
pub(crate) async fn scrape(addr: &str) -> HashMap<String, f64> {
    let operator = peerwasm::client::http_client(
        Some(crate::tenants::CAROL),
        &peerwasm::net::Transport::plain(),
    )
    .unwrap();
    let resp = operator
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let content_type = resp.headers()["content-type"].to_str().unwrap().to_string();
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    parse(&resp.text().await.unwrap())
}

/// `addr`'s metrics, from a worker without `--tenants` (no token needed).
pub(crate) async fn scrape_open(addr: &str) -> HashMap<String, f64> {
    let resp = crate::support::http()
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    parse(&resp.text().await.unwrap())
}

pub(crate) fn get(m: &HashMap<String, f64>, series: &str) -> f64 {
    m.get(series).copied().unwrap_or(0.0)
}

fn status(addr: &str) -> String {
    let out = Command::new(crate::support::PEERWASM)
        .args(["status", "--peers", addr])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_parse_and_move_as_jobs_run() {
    let w = WorkerProcess::start("1GiB", 2, None);
    let before = scrape(&w.addr).await;
    assert_eq!(get(&before, "peerwasm_slots{state=\"total\"}"), 2.0);
    assert_eq!(
        get(&before, "peerwasm_memory_bytes{kind=\"capacity\"}"),
        (1u64 << 30) as f64
    );
    assert_eq!(get(&before, "peerwasm_job_wall_seconds_count"), 0.0);

    let target = Target::pool(vec![w.addr.clone()]).unwrap();
    let hello = Job::new(peerwasm_testkit::guest_wasm_bytes("hello"));
    let memhog = Job::new(peerwasm_testkit::guest_wasm_bytes("memhog"));
    for _ in 0..2 {
        let r = target
            .run(&hello, hello.spec(Vec::new(), 16 * MIB))
            .await
            .unwrap();
        assert_eq!(r.outcome, Outcome::Exited { code: 0 });
    }
    let r = target
        .run(&memhog, memhog.spec(b"64".to_vec(), 16 * MIB))
        .await
        .unwrap();
    assert!(matches!(r.outcome, Outcome::MemoryLimitExceeded { .. }));
    tokio::time::sleep(Duration::from_millis(300)).await; // a few gossip rounds

    let after = scrape(&w.addr).await;
    assert_eq!(
        get(
            &after,
            "peerwasm_jobs_total{outcome=\"exited_ok\",tenant=\"default\"}"
        ),
        2.0
    );
    assert_eq!(
        get(
            &after,
            "peerwasm_jobs_total{outcome=\"memory_limit_exceeded\",tenant=\"default\"}"
        ),
        1.0
    );
    assert_eq!(get(&after, "peerwasm_job_wall_seconds_count"), 3.0);
    assert_eq!(get(&after, "peerwasm_job_peak_memory_bytes_count"), 3.0);
    assert_eq!(
        get(
            &after,
            "peerwasm_module_cache_events_total{event=\"compile\"}"
        ),
        2.0,
        "two modules, compiled once each"
    );
    assert_eq!(
        get(
            &after,
            "peerwasm_module_cache_events_total{event=\"memory_hit\"}"
        ),
        1.0
    );
    assert_eq!(
        get(&after, "peerwasm_tenant_jobs_total{tenant=\"default\"}"),
        3.0
    );
    assert!(
        get(
            &after,
            "peerwasm_tenant_slot_seconds_total{tenant=\"default\"}"
        ) > 0.0
    );
    assert!(
        get(&after, "peerwasm_gossip_events_total{event=\"round\"}")
            > get(&before, "peerwasm_gossip_events_total{event=\"round\"}")
    );
    assert_eq!(get(&after, "peerwasm_peers{liveness=\"alive\"}"), 1.0);
    assert_eq!(get(&after, "peerwasm_slots{state=\"busy\"}"), 0.0);

    // Bad gossip bytes (not sealed with this user's pool key) are dropped
    // and counted.
    let r = crate::support::http()
        .post(format!("http://{}/v1/gossip", w.addr))
        .body(vec![0xff; 8])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let later = scrape(&w.addr).await;
    assert_eq!(
        get(&later, "peerwasm_gossip_events_total{event=\"forged\"}"),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_too_large_warns_the_operator() {
    let w = WorkerProcess::start("1GiB", 1, None);
    let target = Target::pool(vec![w.addr.clone()]).unwrap();
    let hello = Job::new(peerwasm_testkit::guest_wasm_bytes("hello"));
    // Placement refuses it before asking the worker (the view says 1 GiB
    // at most), so ask the worker directly, as a stale client would.
    let body = postcard::to_allocvec(&hello.spec(Vec::new(), 2 << 30)).unwrap();
    let http = crate::support::http();
    http.put(format!(
        "http://{}/v1/modules/{}",
        w.addr,
        hello.hash().to_hex()
    ))
    .body(hello.bytes().to_vec())
    .send()
    .await
    .unwrap();
    let r = http
        .post(format!("http://{}/v1/jobs", w.addr))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 422);
    let m = scrape(&w.addr).await;
    assert_eq!(
        get(&m, "peerwasm_refused_jobs_total{reason=\"never_fits\"}"),
        1.0
    );
    assert_eq!(
        get(&m, "peerwasm_warnings_total{kind=\"refused_for_memory\"}"),
        1.0
    );
    let s = status(&w.addr);
    assert!(
        s.contains("refused a job of 2 GiB: this worker can take at most 1 GiB"),
        "{s}"
    );
    let err = target
        .run(&hello, hello.spec(Vec::new(), 2 << 30))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("the largest the pool can take is 1 GiB"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_below_the_reserve_warns_the_operator() {
    // A reserve larger than the machine: the host is always "below" it, and
    // --memory is more than physical memory less the reserve.
    let w = WorkerProcess::start_with("1GiB", 1, None, &["--reserve", "1000TiB"]);
    let m = scrape(&w.addr).await;
    assert_eq!(
        get(&m, "peerwasm_warnings_total{kind=\"host_memory_low\"}"),
        1.0
    );
    assert_eq!(
        get(
            &m,
            "peerwasm_warnings_total{kind=\"memory_above_physical\"}"
        ),
        1.0
    );
    assert_eq!(get(&m, "peerwasm_memory_bytes{kind=\"capacity\"}"), 0.0);
    let s = status(&w.addr);
    assert!(s.contains("is below the reserve of 1000 TiB"), "{s}");
    assert!(
        s.contains("is more than physical memory less --reserve"),
        "{s}"
    );
}

/// Headless Chromium (Debian's `chromium`; `.ci/run` installs it).
fn chromium() -> std::path::PathBuf {
    for candidate in ["chromium", "chromium-browser"] {
        if let Ok(out) = Command::new("which").arg(candidate).output()
            && out.status.success()
        {
            return String::from_utf8_lossy(&out.stdout).trim().into();
        }
    }
    panic!("this test needs a headless browser: apt-get install chromium (as .ci/run does)");
}

/// Loads `url` in headless Chromium, lets its scripts run for a few
/// seconds of virtual time, and returns the DOM; with `screenshot`, also
/// saves a picture of the page there.
pub(crate) fn browse(url: &str, screenshot: Option<&Path>) -> String {
    let profile = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(chromium());
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        // A pool directory's workers serve TLS under the pool's own CA.
        "--ignore-certificate-errors",
        "--virtual-time-budget=3000",
        "--window-size=1280,900",
    ])
    .arg(format!("--user-data-dir={}", profile.path().display()));
    match screenshot {
        Some(path) => cmd.arg(format!("--screenshot={}", path.display())),
        None => cmd.arg("--dump-dom"),
    };
    let out = cmd.arg(url).output().expect("running chromium");
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_status_page_shows_the_pool_in_a_real_browser() {
    let a = WorkerProcess::start("1GiB", 2, None);
    let b = WorkerProcess::start("2GiB", 1, Some(&a.addr));
    crate::pool::wait_for(&a.addr, Duration::from_secs(10), |v| {
        crate::pool::alive(v) == 2
    })
    .await;
    let target = Target::pool(vec![a.addr.clone()]).unwrap();
    let hello = Job::new(peerwasm_testkit::guest_wasm_bytes("hello"));
    for _ in 0..3 {
        target
            .run(&hello, hello.spec(Vec::new(), 16 * MIB))
            .await
            .unwrap();
    }
    // A's view has both workers with their job counts.
    crate::pool::wait_for(&a.addr, Duration::from_secs(5), |v| {
        v.iter().map(|p| p.advert.jobs_run).sum::<u64>() == 3
    })
    .await;

    // curl-like clients get the text table; browsers get the page.
    let text = crate::support::http()
        .get(format!("http://{}/", a.addr))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.starts_with("ADDRESS"), "{text}");

    let url = format!("http://{}/", a.addr);
    let dom = tokio::task::spawn_blocking(move || browse(&url, None))
        .await
        .unwrap();
    for addr in [&a.addr, &b.addr] {
        assert!(
            dom.contains(&format!("data-addr=\"{addr}\"")),
            "no card for {addr} in\n{dom}"
        );
    }
    assert!(
        dom.contains("2 up · 0 suspect · 0 dead"),
        "summary missing in\n{dom}"
    );
    assert!(
        dom.contains("capacity 1.0 GiB") && dom.contains("capacity 2.0 GiB"),
        "capacities missing in\n{dom}"
    );
    assert!(
        dom.contains("<tr data-tenant=\"default\"><td>default</td><td>3</td>"),
        "tenant row missing in\n{dom}"
    );
    assert!(dom.contains("jobs run"), "{dom}");

    // A picture for people (not asserted): target/status-page.png.
    let png = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("status-page.png");
    let url = format!("http://{}/", a.addr);
    let png2 = png.clone();
    tokio::task::spawn_blocking(move || browse(&url, Some(&png2)))
        .await
        .unwrap();
    assert!(png.exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn gossip_under_a_cluster_key_drops_forged_and_replayed_messages() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("cluster.key");
    let other = dir.path().join("other.key");
    std::fs::write(&key, "a shared secret of the pool\n").unwrap();
    std::fs::write(&other, "somebody else's secret key\n").unwrap();
    let with = |path: &Path| vec!["--cluster-key".to_string(), path.display().to_string()];
    let args = with(&key);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let a = WorkerProcess::start_with("1GiB", 1, None, &args);
    let b = WorkerProcess::start_with("1GiB", 1, Some(&a.addr), &args);
    let stranger_args = with(&other);
    let stranger_args: Vec<&str> = stranger_args.iter().map(String::as_str).collect();
    let stranger = WorkerProcess::start_with("1GiB", 1, Some(&a.addr), &stranger_args);
    // A and B (same key) see each other; the stranger is never let in.
    crate::pool::wait_for(&b.addr, Duration::from_secs(10), |v| {
        crate::pool::alive(v) == 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let view = crate::pool::view(&a.addr).await;
    assert!(
        view.iter().all(|p| p.advert.addr != stranger.addr),
        "{view:?}"
    );
    let m = scrape(&a.addr).await;
    assert!(
        get(&m, "peerwasm_gossip_events_total{event=\"forged\"}") >= 1.0,
        "the stranger's messages were counted"
    );

    // A captured message replayed: refused.
    let http = crate::support::http();
    let forged = vec![b'P', b'W', b'G', b'1']
        .into_iter()
        .chain(std::iter::repeat_n(7u8, 100))
        .collect::<Vec<u8>>();
    let r = http
        .post(format!("http://{}/v1/gossip", a.addr))
        .body(forged)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let sealed = peerwasm::gossip::auth::ClusterKey::load(&key)
        .unwrap()
        .seal(b"not even postcard");
    let r = http
        .post(format!("http://{}/v1/gossip", a.addr))
        .body(sealed.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400, "authentic but undecodable");
    let r = http
        .post(format!("http://{}/v1/gossip", a.addr))
        .body(sealed)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401, "the same message again is a replay");
}
