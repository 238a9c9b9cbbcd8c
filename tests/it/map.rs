//! `peerwasm map`: ordered results, learned memory, retries, lost workers,
//! stopping at failures — through the library API on the embedded worker
//! and through the real binary on a pool of real worker processes.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use peerwasm::client::estimate::WASM_PAGE;
use peerwasm::client::{Job, MapConfig, MapItem, Target, map};
use peerwasm_guest_examples::count_primes_below;
use serde_json::Value;

use crate::pool::{alive, three_workers, wait_for};
use crate::support::{MIB, WorkerProcess};

/// `{"n": ...}` inputs of the primes job, one per line.
fn primes_inputs(count: usize) -> Vec<u64> {
    (0..count as u64)
        .map(|i| 1000 + i * 7919 % 50_000)
        .collect()
}

fn primes_lines(ns: &[u64]) -> String {
    ns.iter().map(|n| format!("{{\"n\": {n}}}\n")).collect()
}

/// A `peerwasm map` process over an inputs file, writing to a file.
pub(crate) struct MapProcess {
    child: std::process::Child,
    out_path: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl MapProcess {
    /// Starts `peerwasm map ARGS -o OUT GUEST INPUTS` with `inputs` as the
    /// inputs file and `cache` as its cache dir.
    pub(crate) fn start(guest: &str, args: &[&str], inputs: &str, cache: &Path) -> MapProcess {
        let dir = tempfile::tempdir().unwrap();
        let input_path = dir.path().join("inputs.jsonl");
        let out_path = dir.path().join("out.jsonl");
        std::fs::write(&input_path, inputs).unwrap();
        let child = Command::new(crate::support::PEERWASM)
            .arg("map")
            .args(args)
            .arg("-o")
            .arg(&out_path)
            .arg(peerwasm_testkit::guest_wasm(guest))
            .arg(&input_path)
            .env("PEERWASM_CACHE_DIR", cache)
            .env_remove("PEERWASM_PEERS")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running peerwasm map");
        MapProcess {
            child,
            out_path,
            _dir: dir,
        }
    }

    /// Waits for it; returns its output and the result lines.
    pub(crate) fn finish(self) -> (Output, Vec<Value>) {
        let out = self.child.wait_with_output().unwrap();
        let lines = std::fs::read_to_string(&self.out_path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("each result line is JSON"))
            .collect();
        (out, lines)
    }
}

/// Runs `peerwasm map` to the end; see [`MapProcess::start`].
fn peerwasm_map(guest: &str, args: &[&str], inputs: &str, cache: &Path) -> (Output, Vec<Value>) {
    MapProcess::start(guest, args, inputs, cache).finish()
}

pub(crate) fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Results in input order, each correct.
fn assert_primes_results(lines: &[Value], ns: &[u64]) {
    assert_eq!(lines.len(), ns.len());
    for (i, (line, n)) in lines.iter().zip(ns).enumerate() {
        assert_eq!(line["index"], i as u64, "{line}");
        assert_eq!(line["exit_code"], 0, "{line}");
        assert_eq!(
            line["stdout"]["count"],
            count_primes_below(*n),
            "input {i}: {line}"
        );
    }
}

#[test]
fn map_primes_on_the_embedded_worker_in_order() {
    let cache = tempfile::tempdir().unwrap();
    let ns = primes_inputs(200);
    let (out, lines) = peerwasm_map(
        "primes",
        &["--slots", "2"],
        &primes_lines(&ns),
        cache.path(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_primes_results(&lines, &ns);
    assert!(
        lines
            .iter()
            .all(|l| l["peer"] == "embedded" && l["attempts"] == 1)
    );
    let err = stderr(&out);
    assert!(err.contains("200 jobs, 0 failed"), "{err}");
    assert!(err.contains("memory request learned"), "{err}");
    assert!(err.contains("jobs per peer: embedded 200"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn map_primes_on_a_pool_of_three_in_order() {
    let workers = three_workers().await;
    let cache = tempfile::tempdir().unwrap();
    let ns = primes_inputs(200);
    let (out, lines) = peerwasm_map(
        "primes",
        &["--peers", &workers[0].addr],
        &primes_lines(&ns),
        cache.path(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_primes_results(&lines, &ns);
    let mut per_peer: BTreeMap<String, u32> = BTreeMap::new();
    for l in &lines {
        *per_peer
            .entry(l["peer"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    assert!(
        per_peer
            .keys()
            .all(|p| workers.iter().any(|w| &w.addr == p)),
        "{per_peer:?}"
    );
    assert!(
        per_peer.len() >= 2,
        "the map spreads over the pool: {per_peer:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn learned_estimates_shrink_requests_and_are_saved_for_the_next_map() {
    let a = WorkerProcess::start("2GiB", 2, None);
    let b = WorkerProcess::start("2GiB", 2, Some(&a.addr));
    wait_for(&a.addr, Duration::from_secs(10), |v| alive(v) == 2).await;
    let cache = tempfile::tempdir().unwrap();
    // memhog N touches N MiB on top of ~1 MiB of its own: peaks of 10–40 MiB.
    let mibs: Vec<u64> = (0..60u64).map(|i| 9 + (i * 17) % 30).collect();
    let inputs: String = mibs.iter().map(|m| format!("{m}\n")).collect();
    let bound = 50 * MIB + WASM_PAGE; // 1.25 × 40 MiB + one page

    let (out, lines) = peerwasm_map("memhog", &["--peers", &a.addr], &inputs, cache.path());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(lines.len(), mibs.len());
    let limit = |l: &Value| l["memory_limit_bytes"].as_u64().unwrap();
    let peak = |l: &Value| l["peak_memory_bytes"].as_u64().unwrap();
    assert!(
        lines
            .iter()
            .all(|l| peak(l) <= 40 * MIB && l["exit_code"] == 0),
        "{lines:?}"
    );
    // Jobs sent before any result asked for the default (1 GiB); every job
    // sent after asked for at most 1.25 × the largest peak, as the workers
    // report what they received.
    let first_try: Vec<&Value> = lines.iter().filter(|l| l["attempts"] == 1).collect();
    let learned: Vec<&&Value> = first_try.iter().filter(|l| limit(l) != 1 << 30).collect();
    let limits: Vec<(u64, u64)> = lines
        .iter()
        .map(|l| (l["attempts"].as_u64().unwrap(), limit(l) / MIB))
        .collect();
    // At most the first wave (two per slot, 4 slots) went out unlearned.
    assert!(
        first_try.len() - learned.len() <= 8,
        "{} of {} learned: {limits:?}",
        learned.len(),
        first_try.len()
    );
    for l in &learned {
        assert!(
            limit(l) <= bound && limit(l) >= peak(l) && limit(l) % WASM_PAGE == 0,
            "{l}"
        );
    }
    let err = stderr(&out);
    assert!(err.contains("memory request learned"), "{err}");

    // The second map of the same module starts from the saved estimate.
    let saved = cache.path().join("estimates").join(format!(
        "{}.json",
        Job::from_file(peerwasm_testkit::guest_wasm("memhog"))
            .unwrap()
            .hash()
    ));
    assert!(saved.exists(), "{}", saved.display());
    let (out, lines) = peerwasm_map("memhog", &["--peers", &b.addr], &inputs, cache.path());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        lines.iter().all(|l| limit(l) <= bound),
        "no job asked for the 1 GiB default: {lines:?}"
    );
    assert!(
        stderr(&out).contains("started from the saved estimate"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_that_outgrows_the_learned_estimate_is_retried_larger() {
    let target = Target::embedded(2).unwrap();
    let job = Job::new(peerwasm_testkit::guest_wasm_bytes("memhog"));
    // One at a time, so the estimate is learned from the small ones
    // (~5 MiB × 1.25) before the 40 MiB one goes out.
    let config = MapConfig {
        max_in_flight: Some(1),
        ..MapConfig::default()
    };
    let inputs = [4u64, 4, 4, 4, 40, 4].map(|m| format!("{m}\n").into_bytes());
    let mut items: Vec<MapItem> = Vec::new();
    let summary = map(&target, &job, inputs, &config, &mut items)
        .await
        .unwrap();
    assert_eq!(items.len(), 6);
    assert!(items.iter().all(|i| i.succeeded()), "{items:?}");
    let big = &items[4];
    assert_eq!(big.attempts, 2, "one retry with a larger limit: {big:?}");
    assert!(big.result.memory_limit_bytes >= big.result.peak_memory_bytes);
    assert!(big.result.peak_memory_bytes >= 40 * MIB);
    assert!(
        items[3].result.memory_limit_bytes < 16 * MIB,
        "learned from the small ones: {:?}",
        items[3]
    );
    assert_eq!(summary.memory_retries, 1);
    assert_eq!(summary.failure_retries, 0);
    assert_eq!(summary.failed, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_killed_mid_map_loses_no_result_and_duplicates_none() {
    let [a, mut b, c] = three_workers().await;
    let cache = tempfile::tempdir().unwrap();
    let map = MapProcess::start(
        "sleep",
        &["--mem", "32MiB", "--peers", &a.addr],
        &"40\n".repeat(500),
        cache.path(),
    );
    // 500 × 40 ms over 6 slots is about 3.5 s: kill B a third of the way.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let b_addr = b.addr.clone();
    b.kill();
    let (out, lines) = map.finish();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(lines.len(), 500);
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l["index"], i as u64, "each input once, in order");
        assert_eq!(l["stdout"], "slept 40 ms\n");
    }
    let on = |addr: &str| lines.iter().filter(|l| l["peer"] == addr).count();
    assert!(on(&b_addr) > 0, "B ran jobs before it died");
    assert!(on(&a.addr) + on(&c.addr) > 0);
    let err = stderr(&out);
    assert!(err.contains("500 jobs, 0 failed"), "{err}");
    drop(c);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_frozen_worker_is_declared_dead_its_jobs_rerun_and_late_answers_dropped() {
    let [a, b, c] = three_workers().await;
    let cache = tempfile::tempdir().unwrap();
    let map = MapProcess::start(
        "sleep",
        &["--mem", "32MiB", "--peers", &a.addr],
        &"40\n".repeat(400),
        cache.path(),
    );
    // Freeze B with jobs on it: its connections stay open but nothing
    // answers. The pool declares it dead within about a second (100 ms
    // gossip), the map resubmits B's jobs; thawed, B answers late.
    tokio::time::sleep(Duration::from_millis(600)).await;
    b.signal(libc::SIGSTOP);
    let b_addr = b.addr.clone();
    wait_for(&a.addr, Duration::from_secs(10), |v| {
        v.iter()
            .any(|p| p.advert.addr == b_addr && p.liveness == peerwasm::gossip::Liveness::Dead)
    })
    .await;
    // The map reads the view at most every 0.5 s: give it time to see it.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    b.signal(libc::SIGCONT);
    let (out, lines) = map.finish();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(lines.len(), 400);
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l["index"], i as u64, "each input once, in order");
        assert_eq!(l["exit_code"], 0);
    }
    let err = stderr(&out);
    eprintln!("{err}");
    assert!(
        err.contains("was declared dead"),
        "the map saw B die: {err}"
    );
    assert!(!err.contains(" 0 lost"), "{err}");
    drop(c);
}

#[test]
fn a_failing_input_stops_the_map_naming_it_unless_keep_going() {
    let cache = tempfile::tempdir().unwrap();
    let mut ns = primes_inputs(40);
    ns[17] = 1 << 40; // the primes job refuses n > 2^32: exit 1
    let inputs = primes_lines(&ns);

    let (out, lines) = peerwasm_map("primes", &["--slots", "2"], &inputs, cache.path());
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("input 17 (line 18) failed: job exited with code 1"),
        "{err}"
    );
    assert!(err.contains("too large"), "the job's own message: {err}");
    assert_eq!(
        lines.len(),
        18,
        "every input before the failure, then the failure"
    );
    assert_eq!(lines[17]["exit_code"], 1);

    let (out, lines) = peerwasm_map(
        "primes",
        &["--slots", "2", "--keep-going"],
        &inputs,
        cache.path(),
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(lines.len(), 40);
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l["index"], i as u64);
        assert_eq!(l["exit_code"], if i == 17 { 1 } else { 0 }, "{l}");
    }
    assert!(
        stderr(&out).contains("40 jobs, 1 failed"),
        "{}",
        stderr(&out)
    );

    // --retries runs a failing job again, and it still fails.
    let (out, lines) = peerwasm_map(
        "primes",
        &["--keep-going", "--retries", "2"],
        &inputs,
        cache.path(),
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(lines[17]["attempts"], 3);
    assert!(stderr(&out).contains("2 failed)"), "{}", stderr(&out));
}

#[test]
fn map_reads_inputs_from_stdin_and_writes_to_stdout() {
    let cache = tempfile::tempdir().unwrap();
    let mut child = Command::new(crate::support::PEERWASM)
        .args(["map", "--mem", "64MiB"])
        .arg(peerwasm_testkit::guest_wasm("primes"))
        .arg("-")
        .env("PEERWASM_CACHE_DIR", cache.path())
        .env_remove("PEERWASM_PEERS")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"{\"n\": 10}\n{\"n\": 100}\nnot json\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1), "the bad line fails");
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[0]["stdout"]["count"], 4);
    assert_eq!(lines[1]["stdout"]["count"], 25);
    assert_eq!(lines[1]["memory_limit_bytes"], 64 * MIB);
    assert_eq!(lines[2]["exit_code"], 2);
    assert!(
        lines[2]["stderr"]
            .as_str()
            .unwrap()
            .contains("input is not valid"),
        "{}",
        lines[2]
    );
    assert_eq!(
        lines[2]["outcome"],
        serde_json::json!({"exited": {"code": 2}})
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_too_large_for_the_pool_is_refused_at_once() {
    let a = WorkerProcess::start("1GiB", 1, None);
    let cache = tempfile::tempdir().unwrap();
    let (out, lines) = peerwasm_map(
        "primes",
        &["--mem", "4GiB", "--peers", &a.addr],
        "{\"n\": 10}\n",
        cache.path(),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(lines.is_empty());
    assert!(
        stderr(&out)
            .contains("no peer can hold a job of 4 GiB: the largest the pool can take is 1 GiB"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn map_warns_when_its_estimate_is_larger_than_most_workers_take() {
    let a = WorkerProcess::start("256MiB", 1, None);
    let b = WorkerProcess::start("256MiB", 1, Some(&a.addr));
    let c = WorkerProcess::start("2GiB", 1, Some(&a.addr));
    wait_for(&a.addr, Duration::from_secs(10), |v| alive(v) == 3).await;
    let target = Target::pool(vec![a.addr.clone()]).unwrap();
    let job = Job::new(peerwasm_testkit::guest_wasm_bytes("memhog"));
    let inputs = vec![b"300\n".to_vec(); 3];
    let mut items: Vec<MapItem> = Vec::new();
    let summary = map(&target, &job, inputs, &MapConfig::default(), &mut items)
        .await
        .unwrap();
    assert!(
        items
            .iter()
            .all(|i| i.succeeded() && i.result.peer == c.addr),
        "only C holds 300 MiB: {items:?}"
    );
    let text = summary.to_string();
    assert!(
        text.contains("larger than most workers can take (256 MiB)"),
        "{text}"
    );
    drop(b);
}

#[test]
fn each_input_runs_under_the_memory_given_for_it_never_raised() {
    let cache = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let given = dir.path().join("mem.txt");
    let mem = |s: &str| {
        std::fs::write(&given, s).unwrap();
        given.to_str().unwrap().to_owned()
    };
    // memhog allocates as many MiB as its input says.
    let inputs = "8\n40\n8\n";
    let mib = |v: &Value| v["memory_limit_bytes"].as_u64().unwrap() >> 20;

    let file = mem("24MiB\n64MiB\n16MiB\n");
    let (out, lines) = peerwasm_map("memhog", &["--mem-per-input", &file], inputs, cache.path());
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let limits: Vec<u64> = lines.iter().map(mib).collect();
    assert_eq!(limits, [24, 64, 16]);
    assert!(lines.iter().all(|l| l["attempts"] == 1));

    // Too little for input 1: it fails at what was given, not run larger;
    // input 2, past the file's end, learns as usual.
    let file = mem("24MiB\n16MiB\n");
    let (out, lines) = peerwasm_map(
        "memhog",
        &["--mem-per-input", &file, "--keep-going"],
        inputs,
        cache.path(),
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(
        (mib(&lines[1]), &lines[1]["attempts"]),
        (16, &Value::from(1))
    );
    assert_ne!(lines[1]["exit_code"], 0);
    assert_eq!(lines[2]["exit_code"], 0, "{}", lines[2]);

    // A line that is not a size is an error naming it, before any job.
    let file = mem("24MiB\nlots\n");
    let (out, lines) = peerwasm_map("memhog", &["--mem-per-input", &file], inputs, cache.path());
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("mem.txt line 2"), "{}", stderr(&out));
    assert!(lines.is_empty());
}
