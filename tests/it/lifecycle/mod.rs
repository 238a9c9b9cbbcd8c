//! The life of a job on a worker, against real worker processes: a job
//! nobody waits for ends (killed clients, Ctrl-C on `run` and `map`), an
//! owner cancels queued, sleeping and computing jobs, the worker's own time
//! policy ends jobs that asked for none, a draining worker ends what is
//! left after its grace, and the starvation hold never wedges a worker.

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use peerwasm::proto::{Advert, CancelCause, JobResult, JobSpec, Outcome};
use reqwest::StatusCode;

use crate::observe::{get, scrape};
use crate::pool::{alive, wait_for};
use crate::support::{MIB, WorkerProcess};
use crate::tenants::{ALICE, BOB, me, post, sleep_job, tenants_file, upload, worker};

pub(crate) fn peerwasm() -> Command {
    Command::new(crate::support::PEERWASM)
}

pub(crate) fn wasm(name: &str) -> String {
    peerwasm_testkit::guest_wasm(name)
        .to_string_lossy()
        .into_owned()
}

/// Starts `peerwasm ARGS` with `stdin` written to it and closed.
pub(crate) fn spawn(args: &[&str], stdin: &str) -> Child {
    let mut child = peerwasm()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting peerwasm");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child
}

/// Waits for `child` to exit, at most `limit`; its exit code and stderr.
pub(crate) fn exit_within(mut child: Child, limit: Duration) -> (Option<i32>, String) {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
            return (status.code(), err);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("peerwasm did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn interrupt(child: &Child) {
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
}

/// Waits until the worker runs and queues nothing and holds no memory;
/// returns how long that took, failing past `limit`.
pub(crate) async fn idle_within(addr: &str, limit: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let a = me(addr).await;
        if a.slots_busy == 0 && a.queue_len == 0 && a.reserved_bytes == 0 {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < limit,
            "still busy after {limit:?}: {} slots, {} queued",
            a.slots_busy,
            a.queue_len
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(crate) async fn busy(addr: &str, slots: u32) {
    wait_for(addr, Duration::from_secs(20), |v| {
        v.iter()
            .find(|p| p.advert.addr == addr)
            .is_some_and(|p| p.advert.slots_busy == slots)
    })
    .await;
}

mod cancel;

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_client_frees_its_slot_within_a_second() {
    let w = WorkerProcess::start("1GiB", 2, None);
    let advert: Advert = me(&w.addr).await;
    assert_eq!(
        advert.max_job_time_ms,
        Some(24 * 3600 * 1000),
        "the default time policy is 24 h"
    );
    // No --timeout: one computes forever, one sleeps for ten minutes.
    let mut computing = spawn(
        &[
            "run",
            "--peers",
            &w.addr,
            "--mem",
            "32MiB",
            &wasm("hostile-loop"),
        ],
        "",
    );
    let mut sleeping = spawn(
        &["run", "--peers", &w.addr, "--mem", "32MiB", &wasm("sleep")],
        "600000\n",
    );
    busy(&w.addr, 2).await;
    computing.kill().unwrap(); // SIGKILL: no goodbye
    sleeping.kill().unwrap();
    let (_, _) = (computing.wait(), sleeping.wait());
    let took = idle_within(&w.addr, Duration::from_secs(1)).await;
    println!("killed clients: slots and memory free {took:?} after the kill");
    let m = scrape(&w.addr).await;
    assert_eq!(
        get(
            &m,
            "peerwasm_jobs_total{outcome=\"cancelled\",tenant=\"default\"}"
        ),
        2.0
    );
    // The slots serve again.
    let out = peerwasm()
        .args(["run", "--peers", &w.addr, &wasm("hello"), "again"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "again\n");
}

#[tokio::test(flavor = "multi_thread")]
async fn ctrl_c_on_run_and_map_cancels_what_they_have_in_flight() {
    let w1 = WorkerProcess::start("1GiB", 1, None);
    let w2 = WorkerProcess::start("1GiB", 1, Some(&w1.addr));
    wait_for(&w1.addr, Duration::from_secs(10), |v| alive(v) == 2).await;

    // A map: two short inputs, then four of ten minutes over both workers.
    let dir = tempfile::tempdir().unwrap();
    let inputs = dir.path().join("in.jsonl");
    std::fs::write(&inputs, "10\n10\n600000\n600000\n600000\n600000\n").unwrap();
    let out = dir.path().join("out.jsonl");
    let map = spawn(
        &[
            "map",
            "--peers",
            &w1.addr,
            "--mem",
            "32MiB",
            "--no-progress",
            "-o",
            out.to_str().unwrap(),
            &wasm("sleep"),
            inputs.to_str().unwrap(),
        ],
        "",
    );
    busy(&w1.addr, 1).await;
    busy(&w2.addr, 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    interrupt(&map);
    let (code, stderr) = exit_within(map, Duration::from_secs(5));
    assert_eq!(code, Some(130), "{stderr}");
    let said: usize = stderr
        .split("interrupted: ")
        .nth(1)
        .and_then(|rest| rest.split(" of 6 results written").next()?.parse().ok())
        .unwrap_or_else(|| panic!("no interrupt line: {stderr}"));
    let written = std::fs::read_to_string(&out).unwrap();
    assert_eq!(written.lines().count(), said, "{written}");
    assert!(said < 6, "the long inputs cannot have finished");
    for line in written.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(
            v["index"].as_u64().unwrap() < 2,
            "only the short inputs ended: {line}"
        );
    }
    for w in [&w1, &w2] {
        idle_within(&w.addr, Duration::from_secs(1)).await;
    }

    // `run` on the pool.
    let run = spawn(
        &["run", "--peers", &w1.addr, "--mem", "32MiB", &wasm("sleep")],
        "600000\n",
    );
    let start = Instant::now();
    while me(&w1.addr).await.slots_busy + me(&w2.addr).await.slots_busy == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the run's job never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    interrupt(&run);
    let (code, stderr) = exit_within(run, Duration::from_secs(2));
    assert_eq!(code, Some(130), "{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    for w in [&w1, &w2] {
        idle_within(&w.addr, Duration::from_secs(1)).await;
    }

    // `run` on the embedded worker: a sleeping job, and a computing one,
    // whose code has no time-limit checks there (it ends with the process).
    for (guest, stdin) in [("sleep", "600000\n"), ("hostile-loop", "")] {
        let run = spawn(&["run", "--no-disk-cache", "--stats", &wasm(guest)], stdin);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let start = Instant::now();
        interrupt(&run);
        let (code, stderr) = exit_within(run, Duration::from_secs(2));
        assert_eq!(code, Some(130), "{guest}: {stderr}");
        assert!(
            stderr.contains("job cancelled by an interrupt (Ctrl-C)"),
            "{guest}: {stderr}"
        );
        assert!(
            stderr.contains("peerwasm: exit 130 · peak memory 1.1 MiB"),
            "{guest}: {stderr}"
        );
        println!(
            "embedded run of {guest}: exited {:?} after Ctrl-C",
            start.elapsed()
        );
    }
}

/// A program that drops a map (or a single run) in the middle: the process
/// lives on, so only the client hanging up its batches can tell the
/// workers.
#[tokio::test(flavor = "multi_thread")]
async fn dropping_a_map_in_process_cancels_its_jobs_on_the_workers() {
    use peerwasm::client::{MapConfig, MapItem, Target, map};
    let w = WorkerProcess::start("1GiB", 2, None);
    let target = Target::pool(vec![w.addr.clone()]).unwrap();
    let job = sleep_job();
    let config = MapConfig {
        mem: Some((32 * MIB).into()),
        ..MapConfig::default()
    };
    let running = tokio::spawn(async move {
        let mut items: Vec<MapItem> = Vec::new();
        map(
            &target,
            &job,
            vec![b"600000\n".to_vec(); 8],
            &config,
            &mut items,
        )
        .await
        .map(|_| items.len())
    });
    busy(&w.addr, 2).await;
    assert!(
        me(&w.addr).await.queue_len > 0,
        "the map keeps more than the slots under way"
    );
    running.abort();
    let took = idle_within(&w.addr, Duration::from_secs(1)).await;
    println!("map dropped in-process: worker idle {took:?} later");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_worker_time_limit_ends_jobs_that_asked_for_none_and_refuses_longer_ones() {
    let w = WorkerProcess::start_with("1GiB", 2, None, &["--max-job-time", "1s"]);
    for (name, stdin) in [("hostile-loop", ""), ("sleep", "600000\n")] {
        let start = Instant::now();
        let run = spawn(&["run", "--peers", &w.addr, &wasm(name)], stdin);
        let (code, stderr) = exit_within(run, Duration::from_secs(10));
        assert_eq!(code, Some(124), "{name}: {stderr}");
        assert!(
            stderr.contains("job exceeded the worker's time limit of 1s (its --max-job-time)"),
            "{name}: {stderr}"
        );
        assert!(
            start.elapsed() >= Duration::from_secs(1),
            "{name} ended before the limit"
        );
    }
    // Asking for more than the worker allows: refused, naming the limit.
    let run = spawn(
        &["run", "--peers", &w.addr, "--timeout", "5s", &wasm("hello")],
        "",
    );
    let (code, stderr) = exit_within(run, Duration::from_secs(10));
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("no worker runs jobs for 5s: the longest any allows is 1s"),
        "{stderr}"
    );
    let hello = peerwasm::client::Job::new(peerwasm_testkit::guest_wasm_bytes("hello"));
    assert!(upload(&w.addr, &hello, None).await.is_success());
    let mut spec = hello.spec(Vec::new(), 32 * MIB);
    spec.limits.timeout_ms = Some(5000);
    let r = post(&w.addr, &spec, None, false).await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        r.text()
            .await
            .unwrap()
            .contains("this worker runs jobs for at most 1s (its --max-job-time)")
    );
    // Within the limit: fine.
    spec.limits.timeout_ms = Some(900);
    assert_eq!(
        post(&w.addr, &spec, None, false).await.status(),
        StatusCode::OK
    );
    // Shown to people.
    let peers = peerwasm()
        .args(["peers", "--peers", &w.addr])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&peers.stdout);
    assert!(
        table.lines().next().unwrap().contains("MAX TIME")
            && table.lines().nth(1).unwrap().contains("  1s  "),
        "{table}"
    );
}

/// Waits (up to 20 s) until the worker's jobs are in exactly these states
/// (sorted), as `GET /v1/jobs` lists them.
async fn job_states_become(addr: &str, states: &[&str]) {
    let start = Instant::now();
    loop {
        let body = crate::tenants::http()
            .get(format!("http://{addr}/v1/jobs"))
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        let list: Vec<peerwasm::proto::JobStatus> = serde_json::from_slice(&body).unwrap();
        let mut now: Vec<String> = list
            .into_iter()
            .filter(|j| j.state != "done")
            .map(|j| j.state)
            .collect();
        now.sort();
        if now == states {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "jobs still {now:?}, not {states:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_draining_worker_sends_queued_jobs_away_and_cancels_running_ones_after_its_grace() {
    let mut w = WorkerProcess::start_with("1GiB", 1, None, &["--drain-grace", "1s"]);
    let sleep = sleep_job();
    assert!(upload(&w.addr, &sleep, None).await.is_success());
    // Compiled first: a job that holds its slot but is still compiling has
    // not started, and a drain sends it away as a queued one (under load,
    // the compile took long enough for that to happen here).
    assert!(
        post(&w.addr, &sleep.spec(b"1".to_vec(), 32 * MIB), None, false)
            .await
            .status()
            .is_success()
    );
    let running = tokio::spawn({
        let (addr, spec) = (w.addr.clone(), sleep.spec(b"600000".to_vec(), 32 * MIB));
        async move { post(&addr, &spec, None, false).await }
    });
    // The worker's own table, not its gossiped advert: an advert can be a
    // round old (the warm-up job busy), and under load the two posts could
    // then arrive in either order.
    job_states_become(&w.addr, &["running"]).await;
    let queued = tokio::spawn({
        let (addr, spec) = (w.addr.clone(), sleep.spec(b"600000".to_vec(), 32 * MIB));
        async move { post(&addr, &spec, None, false).await }
    });
    job_states_become(&w.addr, &["queued", "running"]).await;
    let start = Instant::now();
    w.terminate();
    // The queued job is sent back at once, cancelled for the shutdown.
    let r = queued.await.unwrap();
    let result: JobResult = postcard::from_bytes(&r.bytes().await.unwrap()).unwrap();
    assert_eq!(
        result.outcome,
        Outcome::Cancelled {
            cause: CancelCause::Shutdown
        }
    );
    assert!(
        start.elapsed() < Duration::from_millis(500),
        "queued job answered after {:?}",
        start.elapsed()
    );
    // The running one after the grace.
    let r = running.await.unwrap();
    let result: JobResult = postcard::from_bytes(&r.bytes().await.unwrap()).unwrap();
    assert_eq!(
        result.outcome,
        Outcome::Cancelled {
            cause: CancelCause::Shutdown
        }
    );
    let took = start.elapsed();
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(3),
        "running job answered after {took:?}"
    );
    let status = w.child.wait().unwrap();
    assert!(status.success(), "{status}");
    println!(
        "drain: queued job answered at once, running one after {took:?}, worker gone after {:?}",
        start.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_the_host_can_never_hold_is_refused_not_held_and_small_jobs_go_on() {
    // A job no larger than the capacity that the host can never offer:
    // with --memory far above the machine, capacity is physical memory less
    // --reserve, and the offer is what the host has available less
    // --reserve. A reserve that leaves a capacity of 4 GiB + 64 MiB (a job
    // may have at most 4 GiB) makes a 4 GiB job such a one on any host
    // using more than 64 MiB.
    let physical = me(&WorkerProcess::start_with("1TiB", 1, None, &[]).addr)
        .await
        .capacity_bytes;
    let reserve = (physical - (4 << 30) - 64 * MIB).to_string();
    let w = WorkerProcess::start_with(
        "1TiB",
        2,
        None,
        &["--hold-after", "500ms", "--reserve", &reserve],
    );
    let advert = me(&w.addr).await;
    let job = advert.largest_job().min(4 << 30);
    assert!(
        advert.largest_fit_bytes < job,
        "this host offers all its memory: {advert:?}"
    );
    let sleep = sleep_job();
    assert!(upload(&w.addr, &sleep, None).await.is_success());
    let r = post(&w.addr, &sleep.spec(b"10".to_vec(), job), None, true).await;
    assert_eq!(
        r.status(),
        StatusCode::ACCEPTED,
        "queued: it is no larger than the capacity"
    );
    let id = r.text().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    // Past the hold bound: small jobs still run.
    let start = Instant::now();
    for _ in 0..3 {
        let r = tokio::time::timeout(
            Duration::from_secs(10),
            post(&w.addr, &sleep.spec(b"10".to_vec(), 32 * MIB), None, false),
        )
        .await
        .expect("a small job waited behind memory held for a job that can never fit");
        assert_eq!(r.status(), StatusCode::OK);
    }
    println!("3 small jobs after the hold bound: {:?}", start.elapsed());
    // The large one was refused, naming what fits.
    let r = crate::tenants::http()
        .get(format!("http://{}/v1/jobs/{id}", w.addr))
        .send()
        .await
        .unwrap();
    let result: JobResult = postcard::from_bytes(&r.bytes().await.unwrap()).unwrap();
    match &result.outcome {
        Outcome::Rejected { reason } => {
            assert!(reason.contains("this worker can take at most"), "{reason}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}
