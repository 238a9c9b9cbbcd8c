//! Slot processes (`worker --slot-processes`), against real worker
//! processes and their real children: a job run in a child gives the
//! answers, limits, streams and peak it gives in the worker's process; its
//! time limit, a cancel, a client going and a drain end it though it
//! computes with no fuel; a child killed under its job loses the job (a
//! map runs it again, and gives up after `max_lost`) and the worker goes
//! on; no child outlives its worker; and `auto` sends only modules that
//! compute long.

use std::io::Write;
use std::time::{Duration, Instant};

use peerwasm::client::{Job, Target};
use peerwasm::proto::{CancelCause, JobResult, Outcome, StdStream};
use reqwest::StatusCode;

use crate::lifecycle::{busy, exit_within, idle_within, spawn, wasm};
use crate::observe::{get, scrape};
use crate::support::{MIB, WorkerProcess};
use crate::tenants::{http, post, upload};

fn always(slots: u32, extra: &[&str]) -> WorkerProcess {
    let mut args = vec!["--slot-processes", "always"];
    args.extend_from_slice(extra);
    WorkerProcess::start_with("2GiB", slots, None, &args)
}

/// The worker's live `peerwasm slot` children.
fn slot_children(worker: &WorkerProcess) -> Vec<i32> {
    let pid = worker.child.id();
    let mut found = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return found;
    };
    for task in tasks.flatten() {
        let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        for child in children
            .split_whitespace()
            .filter_map(|c| c.parse::<i32>().ok())
        {
            let cmdline = std::fs::read(format!("/proc/{child}/cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            if args.iter().any(|a| *a == b"slot") && !found.contains(&child) {
                found.push(child);
            }
        }
    }
    found
}

/// The worker's `n` slot processes, once it has started them (a slot is
/// busy from when its job is admitted; its child is started after).
fn wait_children(worker: &WorkerProcess, n: usize) -> Vec<i32> {
    let start = Instant::now();
    loop {
        let children = slot_children(worker);
        if children.len() == n {
            return children;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "slot processes: {children:?}, expected {n}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until a job runs in a slot process: the child has reported the
/// job's memory, which it does once the job started.
async fn running_in_a_child(addr: &str) {
    let start = Instant::now();
    while crate::tenants::me(addr).await.used_bytes == 0 {
        assert!(start.elapsed() < Duration::from_secs(20), "no job started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether process `pid` is gone (or only a zombie nobody reaped yet).
fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

async fn result_of(addr: &str, id: &str) -> JobResult {
    let r = http()
        .get(format!("http://{addr}/v1/jobs/{id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    postcard::from_bytes(&r.bytes().await.unwrap()).unwrap()
}

async fn detach(addr: &str, job: &Job, stdin: &[u8]) -> String {
    assert!(upload(addr, job, None).await.is_success());
    let r = post(addr, &job.spec(stdin.to_vec(), 32 * MIB), None, true).await;
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    r.text().await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn jobs_in_slot_processes_give_the_in_process_answers_limits_and_streams() {
    let w = always(2, &["--max-output", "1MiB"]);
    let pool = Target::pool(vec![w.addr.clone()]).unwrap();

    // Arguments, stdin given whole, and the exact peak of linear memory.
    let (code, _) = exit_within(
        spawn(&["run", "--peers", &w.addr, &wasm("hello"), "x", "y"], ""),
        Duration::from_secs(60),
    );
    assert_eq!(code, Some(0));
    let memhog = Job::new(peerwasm_testkit::guest_wasm_bytes("memhog"));
    let r = pool
        .run(&memhog, memhog.spec(b"10".to_vec(), 64 * MIB))
        .await
        .unwrap();
    assert_eq!(
        (
            r.outcome.clone(),
            String::from_utf8_lossy(&r.stdout).into_owned()
        ),
        (Outcome::Exited { code: 0 }, "10\n".into())
    );
    assert!(
        (10 * MIB..12 * MIB).contains(&r.peak_memory_bytes),
        "peak {}",
        r.peak_memory_bytes
    );
    // The memory limit, exactly.
    let r = pool
        .run(&memhog, memhog.spec(b"64".to_vec(), 16 * MIB))
        .await
        .unwrap();
    match r.outcome {
        Outcome::MemoryLimitExceeded {
            limit,
            peak,
            requested,
        } => {
            assert_eq!(limit, 16 * MIB);
            assert!(
                peak <= limit && requested > limit,
                "peak {peak}, requested {requested}"
            );
        }
        other => panic!("expected the memory limit, got {other:?}"),
    }
    assert!(r.peak_memory_bytes <= 16 * MIB);
    // The worker's output cap, whatever the job asks (1 GiB written).
    let mut flood = Job::new(peerwasm_testkit::guest_wasm_bytes("hostile-flood"));
    flood.limits.stdout_bytes = 64 * MIB;
    let r = pool
        .run(&flood, flood.spec(Vec::new(), 32 * MIB))
        .await
        .unwrap();
    assert_eq!(
        r.outcome,
        Outcome::OutputLimitExceeded {
            stream: StdStream::Stdout,
            limit: MIB
        }
    );
    assert!(r.stdout.len() as u64 <= MIB);

    // Stdin and output flow while the job runs: a conversation, line by line.
    let mut child = crate::streams::run(Some(&w.addr), "interactive", &[]);
    let mut stdin = child.stdin.take().unwrap();
    let answers = crate::streams::lines(child.stdout.take().unwrap());
    for i in 1..=2 {
        writeln!(stdin, "line {i}").unwrap();
        stdin.flush().unwrap();
        let (_, answer) = answers
            .recv_timeout(Duration::from_secs(30))
            .expect("an answer while the job runs");
        assert_eq!(answer, format!("echo: line {i}"));
    }
    drop(stdin);
    assert_eq!(
        answers.recv_timeout(Duration::from_secs(10)).unwrap().1,
        "2 lines"
    );
    assert!(crate::streams::wait_exit(&mut child, Duration::from_secs(10)).success());
    // And output shows as it is written.
    let mut child = crate::streams::run(Some(&w.addr), "ticks", &["2", "1500"]);
    drop(child.stdin.take());
    let out = crate::streams::lines(child.stdout.take().unwrap());
    let (first, _) = out.recv_timeout(Duration::from_secs(30)).unwrap();
    let (second, _) = out.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(
        second - first > Duration::from_millis(1000),
        "ticks 1.5 s apart came {:?} apart",
        second - first
    );
    assert!(crate::streams::wait_exit(&mut child, Duration::from_secs(10)).success());

    let m = scrape(&w.addr).await;
    assert_eq!(
        get(&m, "peerwasm_slot_process_jobs_total"),
        6.0,
        "all six jobs ran in a child"
    );
    assert_eq!(get(&m, "peerwasm_memory_bytes{kind=\"output_held\"}"), 0.0);
    let children = slot_children(&w);
    assert!(
        !children.is_empty() && children.len() <= 2,
        "children kept idle: {children:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn time_limits_cancel_and_a_gone_client_end_computing_jobs_in_slot_processes() {
    let w = always(2, &["--max-job-time", "1s"]);
    // The worker's time limit, for a job computing without fuel and one
    // sleeping.
    for (name, stdin) in [("hostile-loop", ""), ("sleep", "600000\n")] {
        let start = Instant::now();
        let (code, stderr) = exit_within(
            spawn(&["run", "--peers", &w.addr, &wasm(name)], stdin),
            Duration::from_secs(10),
        );
        let took = start.elapsed();
        assert_eq!(code, Some(124), "{name}: {stderr}");
        assert!(
            stderr.contains("job exceeded the worker's time limit of 1s"),
            "{name}: {stderr}"
        );
        assert!(
            took >= Duration::from_secs(1) && took < Duration::from_secs(3),
            "{name}: ended after {took:?}"
        );
        println!("{name} in a slot process: time limit 1s, `run` ended after {took:?}");
    }
    // The job's own, shorter limit.
    let looping = Job::new(peerwasm_testkit::guest_wasm_bytes("hostile-loop"));
    let mut spec = looping.spec(Vec::new(), 32 * MIB);
    spec.limits.timeout_ms = Some(300);
    let r = Target::pool(vec![w.addr.clone()])
        .unwrap()
        .run(&looping, spec)
        .await
        .unwrap();
    assert_eq!(
        r.outcome,
        Outcome::TimeLimitExceeded {
            limit_ms: 300,
            worker_limit: false
        }
    );
    // It ran until its limit, computing (how much CPU it got depends on
    // what else shares the cores).
    assert!(
        r.wall_time_us >= 300_000,
        "it ended before its limit: {} µs",
        r.wall_time_us
    );
    assert!(
        r.cpu_time_us >= 10_000,
        "its CPU time was measured: {} µs",
        r.cpu_time_us
    );

    // The owner cancels a computing job.
    let id = detach(&w.addr, &looping, b"").await;
    busy(&w.addr, 1).await;
    let start = Instant::now();
    let r = http()
        .delete(format!("http://{}/v1/jobs/{id}", w.addr))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    idle_within(&w.addr, Duration::from_secs(1)).await;
    println!(
        "cancelled computing job in a slot process: idle {:?} later",
        start.elapsed()
    );
    assert_eq!(
        result_of(&w.addr, &id).await.outcome,
        Outcome::Cancelled {
            cause: CancelCause::Owner
        }
    );

    // A computing job's client goes.
    let run = spawn(&["run", "--peers", &w.addr, &wasm("hostile-loop")], "");
    busy(&w.addr, 1).await;
    let mut run = run;
    run.kill().unwrap();
    let _ = run.wait();
    let took = idle_within(&w.addr, Duration::from_secs(2)).await;
    println!("client of a computing job in a slot process killed: idle {took:?} later");

    // The slots serve again, and no child was left over.
    let (code, _) = exit_within(
        spawn(&["run", "--peers", &w.addr, &wasm("hello"), "again"], ""),
        Duration::from_secs(30),
    );
    assert_eq!(code, Some(0));
    let m = scrape(&w.addr).await;
    assert_eq!(
        get(
            &m,
            "peerwasm_jobs_total{outcome=\"cancelled\",tenant=\"default\"}"
        ),
        2.0
    );
    assert_eq!(
        get(
            &m,
            "peerwasm_jobs_total{outcome=\"time_limit_exceeded\",tenant=\"default\"}"
        ),
        3.0
    );
    let children = slot_children(&w);
    assert!(children.len() <= 2, "children: {children:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slot_process_killed_under_its_job_loses_it_and_none_outlives_its_worker() {
    let mut w = always(1, &[]);
    let sleep = Job::new(peerwasm_testkit::guest_wasm_bytes("sleep"));
    let id = detach(&w.addr, &sleep, b"600000").await;
    running_in_a_child(&w.addr).await;
    let children = wait_children(&w, 1);
    // SAFETY: kill(2) on our worker's child.
    unsafe { libc::kill(children[0], libc::SIGKILL) };
    idle_within(&w.addr, Duration::from_secs(2)).await;
    match result_of(&w.addr, &id).await.outcome {
        Outcome::Lost { reason } => assert!(
            reason.contains("slot process running it ended without a result")
                && reason.contains("SIGKILL"),
            "{reason}"
        ),
        other => panic!("expected the job lost, got {other:?}"),
    }
    // A new child serves the next job.
    let (code, _) = exit_within(
        spawn(&["run", "--peers", &w.addr, &wasm("hello"), "next"], ""),
        Duration::from_secs(30),
    );
    assert_eq!(code, Some(0));
    // An idle child killed between jobs is not handed the next one.
    let idle = wait_children(&w, 1);
    // SAFETY: as above.
    unsafe { libc::kill(idle[0], libc::SIGKILL) };
    let start = Instant::now();
    while !gone(idle[0]) {
        assert!(start.elapsed() < Duration::from_secs(2));
        std::thread::sleep(Duration::from_millis(5));
    }
    let (code, stderr) = exit_within(
        spawn(&["run", "--peers", &w.addr, &wasm("hello"), "after"], ""),
        Duration::from_secs(30),
    );
    assert_eq!(code, Some(0), "{stderr}");

    // The worker dies (SIGKILL: nothing of it runs) while a child computes:
    // the child goes with it.
    let looping = Job::new(peerwasm_testkit::guest_wasm_bytes("hostile-loop"));
    detach(&w.addr, &looping, b"").await;
    running_in_a_child(&w.addr).await;
    let children = wait_children(&w, 1);
    w.kill();
    let start = Instant::now();
    while !gone(children[0]) {
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "slot process {} outlived its worker",
            children[0]
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_draining_worker_ends_jobs_in_slot_processes_after_its_grace() {
    let mut w = always(2, &["--drain-grace", "1s"]);
    let looping = Job::new(peerwasm_testkit::guest_wasm_bytes("hostile-loop"));
    let sleep = Job::new(peerwasm_testkit::guest_wasm_bytes("sleep"));
    let mut answers = Vec::new();
    for (job, stdin) in [(&looping, &b""[..]), (&sleep, &b"600000"[..])] {
        assert!(upload(&w.addr, job, None).await.is_success());
        let (addr, spec) = (w.addr.clone(), job.spec(stdin.to_vec(), 32 * MIB));
        answers.push(tokio::spawn(async move {
            post(&addr, &spec, None, false).await
        }));
    }
    busy(&w.addr, 2).await;
    let children = wait_children(&w, 2);
    let start = Instant::now();
    w.terminate();
    for answer in answers {
        let r = answer.await.unwrap();
        let result: JobResult = postcard::from_bytes(&r.bytes().await.unwrap()).unwrap();
        assert_eq!(
            result.outcome,
            Outcome::Cancelled {
                cause: CancelCause::Shutdown
            }
        );
    }
    let answered = start.elapsed();
    assert!(
        answered >= Duration::from_secs(1) && answered < Duration::from_secs(3),
        "answered after {answered:?}"
    );
    let status = w.child.wait().unwrap();
    let took = start.elapsed();
    assert!(status.success(), "{status}");
    for pid in children {
        assert!(gone(pid), "slot process {pid} outlived its worker's drain");
    }
    println!(
        "drain of a computing and a sleeping job in slot processes: answered after {answered:?}, worker gone after {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn auto_runs_only_modules_that_compute_long_in_slot_processes() {
    let w = WorkerProcess::start("2GiB", 1, None);
    let pool = Target::pool(vec![w.addr.clone()]).unwrap();
    let hello = Job::new(peerwasm_testkit::guest_wasm_bytes("hello"));
    let primes = Job::new(peerwasm_testkit::guest_wasm_bytes("primes"));
    let mut answers = Vec::new();
    for (job, stdin) in [
        (&hello, "hi"),
        (&hello, "hi"),
        (&primes, "{\"n\": 10000000}"),
        (&primes, "{\"n\": 10000000}"),
    ] {
        let r = pool
            .run(job, job.spec(stdin.as_bytes().to_vec(), 64 * MIB))
            .await
            .unwrap();
        assert_eq!(r.outcome, Outcome::Exited { code: 0 });
        answers.push((
            String::from_utf8_lossy(&r.stdout).into_owned(),
            r.cpu_time_us,
        ));
    }
    assert_eq!(
        answers[2].0, answers[3].0,
        "the same answer in and out of a slot process"
    );
    let m = scrape(&w.addr).await;
    assert_eq!(
        get(&m, "peerwasm_slot_process_jobs_total"),
        1.0,
        "only the second primes job: {answers:?}"
    );
    println!(
        "primes 10^7: {} µs CPU with fuel, {} µs in a slot process",
        answers[2].1, answers[3].1
    );
}

/// `--precompile`: the module is compiled as the worker starts, for the
/// engine its jobs will run on — this process's (`never`), or the slot
/// processes' (`always`; under `auto`, modules of 16 MiB or more) — so the
/// first job loads it rather than compiling (without it: `Compiled`).
#[tokio::test(flavor = "multi_thread")]
async fn a_precompiled_module_starts_its_first_job_without_compiling() {
    use peerwasm::proto::CacheSource;
    let primes = peerwasm_testkit::guest_wasm("primes");
    let hash = peerwasm::proto::ModuleHash::of(&std::fs::read(&primes).unwrap()).to_hex();
    for policy in ["never", "always"] {
        let cache = tempfile::tempdir().unwrap();
        let w = WorkerProcess::start_with(
            "1GiB",
            1,
            None,
            &[
                "--slot-processes",
                policy,
                "--cache-dir",
                cache.path().to_str().unwrap(),
                "--precompile",
                primes.to_str().unwrap(),
            ],
        );
        // Done when its artifact (and the tags beside it) is on disk.
        let start = Instant::now();
        let compiled = || {
            std::fs::read_dir(cache.path().join("modules"))
                .into_iter()
                .flatten()
                .flatten()
                .any(|engine| engine.path().join(format!("{hash}.mac")).exists())
        };
        while !compiled() {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{policy}: not precompiled after a minute"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let target = Target::pool(vec![w.addr.clone()]).unwrap();
        let job = Job::from_file(&primes).unwrap();
        let r = target
            .run(&job, job.spec(br#"{"n": 100}"#.to_vec(), 64 * MIB))
            .await
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&r.stdout),
            "{\"count\":25}\n",
            "{policy}"
        );
        // From memory or disk (a slot process: disk), never compiled.
        assert_ne!(
            r.cache,
            CacheSource::Compiled,
            "{policy}: the first job compiled its module"
        );
    }
}

/// Kills the worker's slot process once a job runs in it, `times` times:
/// each time a child not killed before, once a job has reported its
/// memory (which a child does only after the job started in it).
async fn kill_slot_processes_under_jobs(w: &WorkerProcess, times: usize) {
    let mut killed = Vec::new();
    let start = Instant::now();
    while killed.len() < times {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "killed only {killed:?}"
        );
        let fresh: Vec<i32> = slot_children(w)
            .into_iter()
            .filter(|c| !killed.contains(c) && !gone(*c))
            .collect();
        if fresh.len() != 1 || crate::tenants::me(&w.addr).await.used_bytes == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        }
        // SAFETY: kill(2) on our worker's child.
        unsafe { libc::kill(fresh[0], libc::SIGKILL) };
        killed.push(fresh[0]);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_map_runs_a_job_whose_slot_process_was_killed_again_and_gives_it_up_after_max_lost() {
    let w = always(1, &[]);
    let pool = Target::pool(vec![w.addr.clone()]).unwrap();
    let sleep = Job::new(peerwasm_testkit::guest_wasm_bytes("sleep"));
    let config = peerwasm::client::MapConfig {
        mem: Some((32 * MIB).into()),
        ..Default::default()
    };
    // One input of 1.5 s under a killer of `kills` slot processes.
    let (pool, sleep, config, w) = (&pool, &sleep, &config, &w);
    let map_killing = |kills| async move {
        let mut items = Vec::new();
        let inputs = std::iter::once(b"1500".to_vec());
        let map = peerwasm::client::map(pool, sleep, inputs, config, &mut items);
        let (summary, ()) = tokio::join!(map, kill_slot_processes_under_jobs(w, kills));
        (summary.unwrap(), items)
    };

    // Killed once: run again, and the map ends with its result.
    let (summary, items) = map_killing(1).await;
    assert!(items[0].succeeded(), "{:?}", items[0].result.outcome);
    assert_eq!((items[0].attempts, summary.lost), (2, 1));
    assert_eq!(items[0].result.stdout, b"slept 1500 ms\n");

    // Killed every time: given up after max_lost (3), not run for ever;
    // the map says why, and the worker serves the next map.
    let (summary, items) = map_killing(3).await;
    assert_eq!(
        summary.stopped.expect("the lost input stops the map").index,
        0
    );
    assert_eq!(items[0].attempts, 3);
    match &items[0].result.outcome {
        Outcome::Lost { reason } => assert!(
            reason.starts_with("lost 3 times with the process running it")
                && reason.contains("SIGKILL"),
            "{reason}"
        ),
        other => panic!("expected lost, got {other:?}"),
    }
    let mut items = Vec::new();
    let inputs = [b"10".to_vec(), b"20".to_vec()].into_iter();
    let summary = peerwasm::client::map(pool, sleep, inputs, config, &mut items).await;
    assert!(summary.unwrap().stopped.is_none());
    assert!(items.len() == 2 && items.iter().all(|i| i.succeeded()));
}
