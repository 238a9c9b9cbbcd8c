//! A worker no tenant can wedge: while one tenant's job attacks what the
//! worker holds for it (descriptors, buffered output), the worker must
//! answer `/v1/peers` in under a second and run another tenant's job —
//! against real worker processes.

use std::time::{Duration, Instant};

use peerwasm::client::{Job, Target};
use peerwasm::proto::{JobResult, Outcome, StdStream};

use crate::support::{MIB, WorkerProcess};
use crate::tenants::{ALICE, BOB, me, tenants_file, worker};

/// What the worker did for others while an attack ran.
struct Probe {
    /// The slowest `/v1/peers` answer.
    slowest_view: Duration,
    /// How long the other tenant's job took, end to end.
    other_job: Duration,
}

/// Runs `attack` as alice; once it holds its slot, checks the worker
/// answers and runs a job of bob's. Returns the attack's result.
async fn probe_during(w: &WorkerProcess, attack: Job, stdin: &str, mem: u64) -> (JobResult, Probe) {
    let alice = Target::pool_as(vec![w.addr.clone()], Some(ALICE.into())).unwrap();
    let spec = attack.spec(stdin.as_bytes().to_vec(), mem);
    let running = tokio::spawn(async move { alice.run(&attack, spec).await });
    let start = Instant::now();
    while me(&w.addr).await.slots_busy == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the attack never started"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await; // let it do its worst
    let probe = serves_others(w, Some(BOB)).await;
    assert!(
        !running.is_finished(),
        "the attack ended before the probe: make it hold longer"
    );
    (running.await.unwrap().unwrap(), probe)
}

/// Checks the worker answers `/v1/peers` within a second (five times) and
/// runs a job of `token`'s tenant; says how long each took.
async fn serves_others(w: &WorkerProcess, token: Option<&str>) -> Probe {
    let mut slowest_view = Duration::ZERO;
    for _ in 0..5 {
        let t = Instant::now();
        me(&w.addr).await;
        slowest_view = slowest_view.max(t.elapsed());
    }
    let other = Target::pool_as(vec![w.addr.clone()], token.map(String::from)).unwrap();
    let hello = Job::new(peerwasm_testkit::guest_wasm_bytes("hello"));
    let t = Instant::now();
    let r = other
        .run(&hello, hello.spec(Vec::new(), 16 * MIB))
        .await
        .unwrap();
    let other_job = t.elapsed();
    assert!(
        r.outcome.is_success(),
        "the other job during the attack: {}",
        r.outcome
    );
    assert!(
        slowest_view < Duration::from_secs(1),
        "/v1/peers took {slowest_view:?} during the attack"
    );
    Probe {
        slowest_view,
        other_job,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_descriptor_bomb_gets_emfile_at_the_bound_and_the_worker_serves_others() {
    let tenants = tenants_file(1, 1);
    let w = worker(2, &tenants, None, &["--max-open-files", "64"]);
    let bomb = Job::new(peerwasm_testkit::guest_wasm_bytes("hostile-files"));
    // Opens until refused, then holds its files for 2 s.
    let (result, probe) = probe_during(&w, bomb, "2000", 32 * MIB).await;
    let stdout = String::from_utf8_lossy(&result.stdout);
    assert!(result.outcome.is_success(), "{}", result.outcome);
    assert!(stdout.starts_with("opened 64 files, then: "), "{stdout}");
    println!(
        "descriptor bomb: {} worker answered /v1/peers in {:?} at worst; another tenant's job took {:?}",
        stdout.trim(),
        probe.slowest_view,
        probe.other_job
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_worker_caps_buffered_output_whatever_the_job_asks() {
    let tenants = tenants_file(1, 1);
    let w = worker(2, &tenants, None, &["--max-output", "1MiB"]);
    // hostile-flood writes 1 GiB to stdout; the job asks to keep 64 MiB.
    let mut flood = Job::new(peerwasm_testkit::guest_wasm_bytes("hostile-flood"));
    flood.limits.stdout_bytes = 64 * MIB;
    let alice = Target::pool_as(vec![w.addr.clone()], Some(ALICE.into())).unwrap();
    let r = alice
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
    assert!(
        r.stdout.len() as u64 <= MIB,
        "{} bytes came back",
        r.stdout.len()
    );
    // A job asking for less than the worker's cap keeps its own.
    flood.limits.stdout_bytes = 64 << 10;
    let r = alice
        .run(&flood, flood.spec(Vec::new(), 32 * MIB))
        .await
        .unwrap();
    assert_eq!(
        r.outcome,
        Outcome::OutputLimitExceeded {
            stream: StdStream::Stdout,
            limit: 64 << 10
        }
    );
}

/// Without any key (`--insecure-gossip`), anyone who reaches the port can
/// post gossip: the records must still be ones a worker could have sent,
/// or they never enter the view that placement and fair share read.
#[tokio::test(flavor = "multi_thread")]
async fn forged_adverts_are_dropped_and_counted() {
    use peerwasm::gossip::transport::GossipRequest;
    use peerwasm::gossip::{Ack, NodeId, NodeState};
    use peerwasm::proto::{Advert, TenantUsage};
    let w = WorkerProcess::start_with("1GiB", 1, None, &["--insecure-gossip"]);
    let forged = |addr: &str, tenant: &str, usage: f64| {
        let record = Advert {
            addr: addr.into(),
            capacity_bytes: 1 << 30,
            slots_total: 1,
            tenants: vec![TenantUsage {
                tenant: tenant.into(),
                slot_seconds: usage,
                ..TenantUsage::default()
            }],
            ..Advert::default()
        };
        (
            NodeId::new(addr, 1),
            NodeState {
                record,
                version: 1,
                heartbeat: 1,
            },
        )
    };
    let delta = vec![
        forged("127.0.0.1:1", "bob", -1e12), // would favour bob everywhere
        forged("127.0.0.1:2", "alice", f64::INFINITY), // would starve alice
        forged("127.0.0.1:3", "carol", f64::NAN),
        forged("127.0.0.1:4", "dave", 12.5), // a record a worker could send
    ];
    let body = postcard::to_allocvec(&GossipRequest::Ack(Ack { delta })).unwrap();
    let r = crate::support::http()
        .post(format!("http://{}/v1/gossip", w.addr))
        .body(body)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let view = crate::pool::wait_for(&w.addr, Duration::from_secs(5), |_| true).await;
    let addrs: Vec<&str> = view.iter().map(|p| p.advert.addr.as_str()).collect();
    assert!(addrs.contains(&"127.0.0.1:4"), "{addrs:?}");
    assert!(
        !addrs
            .iter()
            .any(|a| ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"].contains(a)),
        "{addrs:?}"
    );
    let m = crate::observe::scrape(&w.addr).await;
    assert_eq!(
        crate::observe::get(&m, "peerwasm_gossip_events_total{event=\"rejected\"}"),
        3.0
    );
    let probe = serves_others(&w, None).await;
    println!(
        "forged adverts: 3 dropped; the worker answered /v1/peers in {:?} at worst and ran a job in {:?}",
        probe.slowest_view, probe.other_job
    );
}

#[test]
fn a_worker_reachable_from_other_machines_needs_a_cluster_key() {
    use std::process::{Command, Stdio};
    let peerwasm = crate::support::PEERWASM;
    let out = Command::new(peerwasm)
        .args(["worker", "--listen", "0.0.0.0:0", "--reserve", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("give every worker of the pool --cluster-key FILE")
            && stderr.contains("--insecure-gossip"),
        "{stderr}"
    );
    // Those who want the old way say so.
    let mut cmd = Command::new(peerwasm);
    cmd.args([
        "worker",
        "--listen",
        "0.0.0.0:0",
        "--reserve",
        "0",
        "--insecure-gossip",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::null());
    let (mut child, addr) = crate::support::spawn_worker(&mut cmd);
    assert!(addr.starts_with("0.0.0.0:"), "{addr}");
    let _ = child.kill();
    let _ = child.wait();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_compile_past_the_limit_is_refused_naming_it_and_others_run_meanwhile() {
    let tenants = tenants_file(1, 1);
    let w = worker(2, &tenants, None, &["--max-compile-time", "1s"]);
    let alice = Target::pool_as(vec![w.addr.clone()], Some(ALICE.into())).unwrap();
    // About 2.5 s to compile here: within the size cap, past the limit.
    let bomb = Job::new(peerwasm_testkit::big_module(20_000));
    let started = Instant::now();
    let compiling = tokio::spawn({
        let (alice, bomb) = (alice.clone(), bomb.clone());
        async move {
            alice
                .run(&bomb, bomb.spec(Vec::new(), 32 * MIB))
                .await
                .unwrap()
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let bob = Target::pool_as(vec![w.addr.clone()], Some(BOB.into())).unwrap();
    let hello = Job::new(peerwasm_testkit::guest_wasm_bytes("hello"));
    let t = Instant::now();
    assert!(
        bob.run(&hello, hello.spec(Vec::new(), 16 * MIB))
            .await
            .unwrap()
            .outcome
            .is_success()
    );
    let other = t.elapsed();
    let r = compiling.await.unwrap();
    let refused_after = started.elapsed();
    let expected = "job rejected: compiling it takes more than 1s of CPU time (this worker's --max-compile-time)";
    assert_eq!(r.outcome.to_string(), expected);
    assert!(
        refused_after < Duration::from_millis(2500),
        "refused after {refused_after:?}"
    );
    // Once known, the module is refused at once.
    let t = Instant::now();
    let again = alice
        .run(&bomb, bomb.spec(Vec::new(), 32 * MIB))
        .await
        .unwrap();
    assert_eq!(again.outcome.to_string(), expected);
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "the second refusal took {:?}",
        t.elapsed()
    );
    println!(
        "compile bomb: refused after {refused_after:?}, again in {:?}; another tenant's job took {other:?} meanwhile",
        t.elapsed()
    );
    assert!(
        other < Duration::from_secs(1),
        "another tenant's job took {other:?} during the compile"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn queued_jobs_keep_their_module_and_queues_hold_bounded_bytes() {
    use crate::tenants::{post, upload};
    use reqwest::StatusCode;
    let tenants = tenants_file(1, 1);
    // Room for one module's bytes at a time; 1 MiB of queued input each.
    let w = worker(
        1,
        &tenants,
        None,
        &["--module-memory", "1", "--max-queued-bytes", "1MiB"],
    );
    let sleep = crate::tenants::sleep_job();
    let primes = Job::new(peerwasm_testkit::guest_wasm_bytes("primes"));
    // Alice: one job runs (its module compiled, so its bytes are no longer
    // needed); one of primes, uploaded now and not compiled yet, waits.
    assert!(upload(&w.addr, &sleep, Some(ALICE)).await.is_success());
    let running = tokio::spawn({
        let (addr, spec) = (w.addr.clone(), sleep.spec(b"1500".to_vec(), 16 * MIB));
        async move { post(&addr, &spec, Some(ALICE), false).await.status() }
    });
    crate::pool::wait_for(&w.addr, Duration::from_secs(10), |v| {
        v[0].advert.slots_busy == 1
    })
    .await;
    assert!(upload(&w.addr, &primes, Some(ALICE)).await.is_success());
    let queued = tokio::spawn({
        let (addr, spec) = (
            w.addr.clone(),
            primes.spec(br#"{"n": 100}"#.to_vec(), 16 * MIB),
        );
        async move { post(&addr, &spec, Some(ALICE), false).await }
    });
    crate::pool::wait_for(&w.addr, Duration::from_secs(5), |v| {
        v[0].advert.queue_len == 1
    })
    .await;
    // Bob uploads other modules: each pushes out what it can.
    for name in ["hello", "memhog", "spin"] {
        assert!(
            upload(
                &w.addr,
                &Job::new(peerwasm_testkit::guest_wasm_bytes(name)),
                Some(BOB)
            )
            .await
            .is_success()
        );
    }
    // Queued input is bounded in bytes: 700 KB waits, 2 × 700 KB does not.
    let big_input = |addr: String| {
        let spec = sleep.spec(vec![b'1'; 700_000], 16 * MIB);
        async move { post(&addr, &spec, Some(ALICE), false).await.status() }
    };
    let first = tokio::spawn(big_input(w.addr.clone()));
    crate::pool::wait_for(&w.addr, Duration::from_secs(5), |v| {
        v[0].advert.queue_len == 2
    })
    .await;
    assert_eq!(
        big_input(w.addr.clone()).await,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(running.await.unwrap(), StatusCode::OK);
    let r = queued.await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let result: JobResult = postcard::from_bytes(&r.bytes().await.unwrap()).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&result.stdout).trim(),
        r#"{"count":25}"#,
        "{}",
        result.outcome
    );
    let _ = first.await;
}

/// Strangers need no token to open connections: those that send headers a
/// byte at a time, or nothing, are closed after the header timeout, and
/// past the connection cap new ones are closed at once — while the worker
/// answers the pool.
#[tokio::test(flavor = "multi_thread")]
async fn slow_and_idle_connections_cannot_hold_the_worker() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    // All from one address: the total cap is tested here, the share per
    // address in budgets.rs.
    let w = WorkerProcess::start_with(
        "1GiB",
        1,
        None,
        &[
            "--max-connections",
            "16",
            "--max-connections-per-address",
            "16",
            "--header-timeout",
            "1s",
        ],
    );
    let closed_within = |mut s: TcpStream, limit: Duration| async move {
        let mut buf = [0u8; 256];
        match tokio::time::timeout(limit, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => true,
            Ok(Ok(_)) => true, // an answer (408), then the close
            Err(_) => false,
        }
    };
    let closed_within_ref = |s: &TcpStream, limit: Duration| {
        let fd = std::os::fd::AsRawFd::as_raw_fd(s);
        async move {
            // Closed by the worker: readable with nothing (EOF) or an answer.
            let deadline = Instant::now() + limit;
            loop {
                let mut b = [0u8; 1];
                // SAFETY: recv(2) with MSG_PEEK | MSG_DONTWAIT on an open socket.
                let n = unsafe {
                    libc::recv(
                        fd,
                        b.as_mut_ptr().cast(),
                        1,
                        libc::MSG_PEEK | libc::MSG_DONTWAIT,
                    )
                };
                if n >= 0 {
                    return true;
                }
                if Instant::now() > deadline {
                    return false;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    // Twelve slowloris connections: a request begun and never finished.
    let mut slow = Vec::new();
    for _ in 0..12 {
        let mut s = TcpStream::connect(&w.addr).await.unwrap();
        s.write_all(b"GET /v1/peers HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        slow.push(s);
    }
    let t = Instant::now();
    me(&w.addr).await;
    let answered = t.elapsed();
    assert!(
        answered < Duration::from_secs(1),
        "/v1/peers took {answered:?} beside 12 slow connections"
    );
    // Eight more that send nothing: past the cap of 16, as many idle ones
    // as the cap needs are closed at once (the oldest that never proved
    // they belong: slow ones, here) to make room for the newcomers.
    let mut idle = Vec::new();
    for _ in 0..8 {
        idle.push(TcpStream::connect(&w.addr).await.unwrap());
    }
    let all: Vec<TcpStream> = slow.into_iter().chain(idle).collect();
    let closed = futures::future::join_all(all.into_iter().map(|s| async move {
        let closed = closed_within_ref(&s, Duration::from_millis(300)).await;
        (closed, s)
    }))
    .await;
    let closed_at_once = closed.iter().filter(|(c, _)| *c).count();
    assert!(
        closed_at_once >= 4,
        "only {closed_at_once} of 20 connections were closed at the cap of 16"
    );
    // The rest are closed by the header timeout.
    let start = Instant::now();
    for (_, s) in closed.into_iter().filter(|(c, _)| !c) {
        assert!(
            closed_within(s, Duration::from_secs(3)).await,
            "a slow connection outlived the header timeout"
        );
    }
    println!(
        "slowloris: /v1/peers answered in {answered:?}; {closed_at_once} of 20 closed at the cap; the others closed {:?} after",
        start.elapsed()
    );
    // And it serves again.
    me(&w.addr).await;
    let m = crate::observe::scrape(&w.addr).await;
    assert!(crate::observe::get(&m, "peerwasm_connections_refused_total") >= 4.0);
}

/// With tenants, who used what is private: `/v1/peers` shows a tenant its
/// own usage, an operator everyone's, a stranger no one's; `/metrics` is an
/// operator's.
#[tokio::test(flavor = "multi_thread")]
async fn tenants_see_only_their_own_usage_and_operators_see_all() {
    use crate::tenants::CAROL;
    let tenants = tenants_file(1, 1);
    let w = worker(2, &tenants, None, &[]);
    let hello = Job::new(peerwasm_testkit::guest_wasm_bytes("hello"));
    for token in [ALICE, BOB] {
        let t = Target::pool_as(vec![w.addr.clone()], Some(token.into())).unwrap();
        assert!(
            t.run(&hello, hello.spec(Vec::new(), 16 * MIB))
                .await
                .unwrap()
                .outcome
                .is_success()
        );
    }
    let names_seen_by = |token: Option<&'static str>| {
        let addr = w.addr.clone();
        async move {
            let http =
                peerwasm::client::pool::http_client(token, &peerwasm::net::Transport::plain())
                    .unwrap();
            let view = peerwasm::client::fetch_peers(&http, &[addr]).await.unwrap();
            view[0]
                .advert
                .tenants
                .iter()
                .map(|t| t.tenant.clone())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        names_seen_by(None).await,
        Vec::<String>::new(),
        "a stranger sees no tenant"
    );
    assert_eq!(names_seen_by(Some(ALICE)).await, ["alice"]);
    assert_eq!(names_seen_by(Some(BOB)).await, ["bob"]);
    assert_eq!(
        names_seen_by(Some(CAROL)).await,
        ["alice", "bob"],
        "the operator sees all"
    );
    let bad =
        peerwasm::client::pool::http_client(Some("guess"), &peerwasm::net::Transport::plain())
            .unwrap();
    assert!(
        peerwasm::client::fetch_peers(&bad, std::slice::from_ref(&w.addr))
            .await
            .is_err(),
        "a wrong token is refused"
    );
    // The text page and `peerwasm peers` still work for anyone.
    let page = crate::support::http()
        .get(format!("http://{}/", w.addr))
        .send()
        .await
        .unwrap();
    assert!(page.status().is_success());
    let metrics = |token: Option<&'static str>| {
        let addr = w.addr.clone();
        async move {
            let http =
                peerwasm::client::pool::http_client(token, &peerwasm::net::Transport::plain())
                    .unwrap();
            http.get(format!("http://{addr}/metrics"))
                .send()
                .await
                .unwrap()
        }
    };
    assert_eq!(
        metrics(None).await.status(),
        reqwest::StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        metrics(Some(ALICE)).await.status(),
        reqwest::StatusCode::UNAUTHORIZED
    );
    let text = metrics(Some(CAROL)).await.text().await.unwrap();
    assert!(text.contains("tenant=\"alice\"") && text.contains("tenant=\"bob\""));
}

/// A module's hash is no key to it: with tenants, only a tenant that showed
/// the bytes (uploaded them) runs a module; another who only knows the
/// hash is asked for them (404).
#[tokio::test(flavor = "multi_thread")]
async fn only_tenants_that_showed_a_modules_bytes_may_run_it() {
    use crate::tenants::{post, upload};
    use reqwest::StatusCode;
    let tenants = tenants_file(1, 1);
    let w = worker(1, &tenants, None, &[]);
    let private = Job::new(peerwasm_testkit::guest_wasm_bytes("hello"));
    assert!(upload(&w.addr, &private, Some(ALICE)).await.is_success());
    let spec = private.spec(Vec::new(), 16 * MIB);
    assert_eq!(
        post(&w.addr, &spec, Some(ALICE), false).await.status(),
        StatusCode::OK
    );
    // Bob knows the hash, not the bytes.
    let r = post(&w.addr, &spec, Some(BOB), false).await;
    assert_eq!(
        r.status(),
        StatusCode::NOT_FOUND,
        "{}",
        r.text().await.unwrap()
    );
    // Wrong bytes under the hash prove nothing.
    let wrong = crate::tenants::http()
        .put(format!(
            "http://{}/v1/modules/{}",
            w.addr,
            private.hash().to_hex()
        ))
        .bearer_auth(BOB)
        .body(b"\0asm\x01\0\0\0".to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        post(&w.addr, &spec, Some(BOB), false).await.status(),
        StatusCode::NOT_FOUND
    );
    // With the bytes (the client uploads on a 404), bob runs it.
    let bob = Target::pool_as(vec![w.addr.clone()], Some(BOB.into())).unwrap();
    assert!(
        bob.run(&private, spec.clone())
            .await
            .unwrap()
            .outcome
            .is_success()
    );
    assert_eq!(
        post(&w.addr, &spec, Some(BOB), false).await.status(),
        StatusCode::OK
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_disk_filler_gets_enospc_at_its_bound_and_leaves_nothing_behind() {
    let tenants = tenants_file(1, 1);
    let scratch = tempfile::tempdir().unwrap();
    let w = worker(
        2,
        &tenants,
        None,
        &[
            "--scratch",
            "32MiB",
            "--scratch-dir",
            scratch.path().to_str().unwrap(),
        ],
    );
    let filler = Job::new(peerwasm_testkit::guest_wasm_bytes("hostile-disk"));
    // Fills, then holds its files for 2 s while the worker is probed.
    let (r, probe) = probe_during(&w, filler, "2000", 32 * MIB).await;
    println!(
        "disk filler: worker answered /v1/peers in {:?} at worst; another tenant's job took {:?}",
        probe.slowest_view, probe.other_job
    );
    let stdout = String::from_utf8_lossy(&r.stdout);
    assert!(r.outcome.is_success(), "{}", r.outcome);
    // 64 directories (256 KiB counted) and the file (4 KiB): 31 MiB fit.
    assert!(
        stdout.starts_with("wrote 31 MiB, then: No space left on device"),
        "{stdout}"
    );
    // Only the worker's own file store (made at its start) may be there.
    let left: Vec<_> = std::fs::read_dir(scratch.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| !name.starts_with("peerwasm-files-"))
        .collect();
    assert!(left.is_empty(), "scratch left behind: {left:?}");
    // Another tenant's job writes its own files as usual.
    let bob = Target::pool_as(vec![w.addr.clone()], Some(BOB.into())).unwrap();
    let files = Job::new(peerwasm_testkit::guest_wasm_bytes("hostile-escape"));
    assert!(
        bob.run(&files, files.spec(Vec::new(), 32 * MIB))
            .await
            .unwrap()
            .outcome
            .is_success()
    );
}

/// Disk is charged by what a call makes the disk hold, whatever the
/// descriptor's number: a scratch file renumbered onto stdout is still a
/// file; symlinks and hard links are names that take disk. In-process and
/// in slot processes alike. (Before: 512 MiB written to descriptor 1 under
/// `--scratch 16MiB`, and 20,000 symlinks with 4000-byte targets, 78 MiB,
/// under `--scratch 1MiB`.)
#[tokio::test(flavor = "multi_thread")]
async fn side_doors_to_the_disk_are_charged_by_what_they_make_it_hold() {
    let names = Job::new(peerwasm_testkit::guest_wasm_bytes("hostile-names"));
    for isolation in ["never", "always"] {
        let scratch = tempfile::tempdir().unwrap();
        let w = WorkerProcess::start_with(
            "1GiB",
            2,
            None,
            &[
                "--scratch",
                "16MiB",
                "--scratch-dir",
                scratch.path().to_str().unwrap(),
                "--slot-processes",
                isolation,
            ],
        );
        let target = Target::pool(vec![w.addr.clone()]).unwrap();
        let run = |mode: &str| {
            let mut spec = names.spec(Vec::new(), 32 * MIB);
            spec.args = vec![mode.to_string()];
            let (target, names) = (target.clone(), names.clone());
            async move { target.run(&names, spec).await.unwrap() }
        };
        let r = run("renumber").await;
        let said = String::from_utf8_lossy(&r.stderr).into_owned();
        assert!(
            said.contains("No space left on device"),
            "{isolation}: {said}"
        );
        let mib: u64 = said
            .strip_prefix("wrote ")
            .and_then(|s| s.split(' ').next())
            .unwrap()
            .parse()
            .unwrap();
        assert!(mib <= 16, "{isolation}: {said}");
        assert!(r.stdout.is_empty(), "what went to the file is not output");
        for mode in ["symlinks", "links"] {
            let r = run(mode).await;
            let said = String::from_utf8_lossy(&r.stderr).into_owned();
            // 16 MiB of a block and an inode per symlink (a block per hard
            // link) is under 4,000 names: refused with ENOSPC (51).
            assert!(said.ends_with("then: errno 51\n"), "{isolation}: {said}");
            let made: u64 = said.split(' ').nth(1).unwrap().parse().unwrap();
            assert!(made < 4200, "{isolation}: {said}");
        }
    }
}

/// Finished detached jobs' output is memory the worker holds for their
/// owner until it discards it: bounded per tenant.
#[tokio::test(flavor = "multi_thread")]
async fn detached_results_held_are_bounded_per_tenant_until_discarded() {
    use crate::tenants::{http, post, upload};
    use reqwest::StatusCode;
    let tenants = tenants_file(1, 1);
    let w = worker(2, &tenants, None, &["--max-results", "4KiB"]);
    let hello = Job::new(peerwasm_testkit::guest_wasm_bytes("hello"));
    for t in [ALICE, BOB] {
        assert!(upload(&w.addr, &hello, Some(t)).await.is_success());
    }
    let mut loud = hello.spec(Vec::new(), 16 * MIB);
    loud.args = vec!["x".repeat(5000)]; // 5 KB of output
    let detach = |token: &'static str| {
        let (addr, spec) = (w.addr.clone(), loud.clone());
        async move { post(&addr, &spec, Some(token), true).await }
    };
    let r = detach(ALICE).await;
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let id = r.text().await.unwrap();
    let done = |id: String| {
        let addr = w.addr.clone();
        async move {
            for _ in 0..200 {
                let r = http()
                    .get(format!("http://{addr}/v1/jobs/{id}"))
                    .bearer_auth(ALICE)
                    .send()
                    .await
                    .unwrap();
                if r.status() == StatusCode::OK {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            panic!("never done");
        }
    };
    done(id.clone()).await;
    // Alice holds 5 KB > 4 KiB: her next detached job is refused, saying why...
    let r = detach(ALICE).await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        r.text()
            .await
            .unwrap()
            .contains("of your finished jobs' results")
    );
    // ...bob's is not, and attached jobs still run.
    assert_eq!(detach(BOB).await.status(), StatusCode::ACCEPTED);
    assert_eq!(
        post(&w.addr, &loud, Some(ALICE), false).await.status(),
        StatusCode::OK
    );
    // Discarding frees her room.
    let out = std::process::Command::new(crate::support::PEERWASM)
        .args(["cancel", "--peers", &w.addr, "--token", ALICE, &id])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("its result was discarded"),
        "{out:?}"
    );
    assert_eq!(detach(ALICE).await.status(), StatusCode::ACCEPTED);
}

/// A stranger's huge body is refused before it is read into memory: the
/// tenant is checked from the headers, the body dropped unread.
#[tokio::test(flavor = "multi_thread")]
async fn an_oversized_body_without_a_token_is_refused_unread() {
    let tenants = tenants_file(1, 1);
    let w = worker(1, &tenants, None, &[]);
    let rss = |pid: u32| {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let line = status
            .lines()
            .find(|l| l.starts_with("VmHWM:"))
            .unwrap()
            .to_string();
        line.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<u64>()
            .unwrap()
            * 1024
    };
    let before = rss(w.child.id());
    let huge = vec![0u8; 60 << 20]; // under the module limit, so only the token refuses it
    let url = format!("http://{}/v1/modules/{}", w.addr, "ab".repeat(32));
    let answer = crate::support::http().put(url).body(huge).send().await;
    match answer {
        Ok(r) => assert_eq!(r.status(), reqwest::StatusCode::UNAUTHORIZED),
        Err(e) => println!("oversized body without a token: connection closed ({e})"),
    }
    // Read before the probe: running a job (compiling its module) raises
    // the peak by itself.
    let grew = rss(w.child.id()).saturating_sub(before);
    let probe = serves_others(&w, Some(BOB)).await;
    println!(
        "oversized body without a token: peak RSS grew {} KiB; the worker answered /v1/peers in {:?} and ran bob's job in {:?}",
        grew >> 10,
        probe.slowest_view,
        probe.other_job
    );
    assert!(
        grew < 16 << 20,
        "the worker buffered the body: peak RSS grew {} MiB",
        grew >> 20
    );
}

/// Without any key (`--insecure-gossip`), anyone who reaches a worker can
/// plant an advert: a client places jobs (and sends its token) only on
/// workers it named, unless the worker that answered vouches for the
/// others — their adverts came sealed with the pool's key: an explicit
/// `--cluster-key`, or on loopback this user's own.
#[tokio::test(flavor = "multi_thread")]
async fn a_token_goes_only_to_named_workers_unless_the_pool_is_keyed() {
    use peerwasm::client::{MapConfig, MapItem, map};
    let tenants = tenants_file(1, 1);
    let key = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(key.path(), b"a shared secret for the token test").unwrap();
    let key = key.path().to_str().unwrap().to_string();
    for (how, extra) in [
        ("no key", vec!["--insecure-gossip"]),
        ("this user's key", vec![]),
        ("a cluster key", vec!["--cluster-key", &key]),
    ] {
        let keyed = extra.first() != Some(&"--insecure-gossip");
        let w1 = worker(1, &tenants, None, &extra);
        let w2 = worker(1, &tenants, Some(&w1.addr), &extra);
        crate::pool::wait_for(&w1.addr, Duration::from_secs(10), |v| {
            crate::pool::alive(v) == 2
        })
        .await;
        // Named: w1 only.
        let target = Target::pool_as(vec![w1.addr.clone()], Some(ALICE.into())).unwrap();
        let job = crate::tenants::sleep_job();
        let config = MapConfig {
            mem: Some(16 * MIB),
            ..MapConfig::default()
        };
        let mut items: Vec<MapItem> = Vec::new();
        let summary = map(&target, &job, vec![b"100".to_vec(); 8], &config, &mut items)
            .await
            .unwrap();
        assert!(items.iter().all(MapItem::succeeded));
        let on_w2 = summary.per_peer.get(&w2.addr).copied().unwrap_or(0);
        println!("{how}: jobs per peer {:?}", summary.per_peer);
        if keyed {
            assert!(
                on_w2 > 0,
                "a keyed pool vouches for w2: it should have run some jobs"
            );
        } else {
            assert_eq!(
                on_w2, 0,
                "w2 was not named and nothing vouches for it: no job"
            );
            let m = crate::observe::scrape(&w2.addr).await;
            assert_eq!(
                crate::observe::get(&m, "peerwasm_refused_jobs_total{reason=\"unauthorized\"}"),
                0.0,
                "w2 was sent jobs"
            );
        }
    }
}

/// Jobs' writes together stay within the worker's scratch total, each job
/// within its own bound too.
#[tokio::test(flavor = "multi_thread")]
async fn running_jobs_together_keep_within_the_scratch_total() {
    let tenants = tenants_file(1, 1);
    let w = worker(
        2,
        &tenants,
        None,
        &["--scratch", "32MiB", "--scratch-total", "40MiB"],
    );
    let filler = Job::new(peerwasm_testkit::guest_wasm_bytes("hostile-disk"));
    // Each fills, then holds its files for a second: the two overlap.
    let run = |token: &'static str| {
        let (addr, filler) = (w.addr.clone(), filler.clone());
        async move {
            let t = Target::pool_as(vec![addr], Some(token.into())).unwrap();
            let r = t
                .run(&filler, filler.spec(b"1000".to_vec(), 32 * MIB))
                .await
                .unwrap();
            let out = String::from_utf8_lossy(&r.stdout).into_owned();
            let mib: u64 = out
                .strip_prefix("wrote ")
                .and_then(|s| s.split(' ').next()?.parse().ok())
                .unwrap_or_else(|| panic!("{out}"));
            assert!(out.contains("No space left on device"), "{out}");
            mib
        }
    };
    let (a, b) = tokio::join!(run(ALICE), run(BOB));
    println!("scratch total 40 MiB: two fillers wrote {a} + {b} MiB");
    assert!(a + b <= 40, "together {a} + {b} MiB, over the 40 MiB total");
    assert!(a <= 31 && b <= 31, "each within its own 32 MiB");
    // Their shares came back when they ended: a third runs to its own bound.
    assert_eq!(run(ALICE).await, 31);
}

/// Output a worker buffers, and detached results it keeps, are memory the
/// host holds: they shrink what the worker offers beside the reservations,
/// and a job whose output no longer fits ends saying so, within its cap.
#[tokio::test(flavor = "multi_thread")]
async fn buffered_output_and_held_results_count_against_the_workers_memory() {
    use crate::tenants::{http, post, upload};
    use reqwest::StatusCode;
    let tenants = tenants_file(1, 1);
    let w = WorkerProcess::start_with(
        "256MiB",
        2,
        None,
        &[
            "--tenants",
            tenants.path().to_str().unwrap(),
            "--max-output",
            "1GiB",
        ],
    );
    let mut flood = Job::new(peerwasm_testkit::guest_wasm_bytes("hostile-flood"));
    assert!(upload(&w.addr, &flood, Some(ALICE)).await.is_success());
    // Alice parks 100 MiB of output in a detached result.
    flood.limits.stdout_bytes = 100 * MIB;
    let r = post(
        &w.addr,
        &flood.spec(Vec::new(), 32 * MIB),
        Some(ALICE),
        true,
    )
    .await;
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let id = r.text().await.unwrap();
    let start = Instant::now();
    loop {
        let r = http()
            .get(format!("http://{}/v1/jobs/{id}", w.addr))
            .bearer_auth(ALICE)
            .send()
            .await
            .unwrap();
        if r.status() == StatusCode::OK {
            let result: JobResult = postcard::from_bytes(&r.bytes().await.unwrap()).unwrap();
            assert_eq!(
                result.outcome,
                Outcome::OutputLimitExceeded {
                    stream: StdStream::Stdout,
                    limit: 100 * MIB
                }
            );
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the flood never ended"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let offer = me(&w.addr).await.largest_fit_bytes;
    println!(
        "with 100 MiB of results held, a 256 MiB worker offers {} MiB",
        offer / MIB
    );
    assert_eq!(
        offer,
        156 * MIB,
        "the held result must come out of the offer"
    );
    let m = crate::observe::scrape(&w.addr).await;
    assert_eq!(
        crate::observe::get(&m, "peerwasm_memory_bytes{kind=\"output_held\"}"),
        (100 * MIB) as f64
    );
    let probe = serves_others(&w, Some(BOB)).await;
    println!(
        "with alice's 100 MiB held, the worker answered /v1/peers in {:?} and ran bob's job in {:?}",
        probe.slowest_view, probe.other_job
    );
    // Bob asks to keep 1 GiB; only what is free beside his 32 MiB
    // reservation and alice's result can be held for him.
    flood.limits.stdout_bytes = 1 << 30;
    let bob = Target::pool_as(vec![w.addr.clone()], Some(BOB.into())).unwrap();
    let r = bob
        .run(&flood, flood.spec(Vec::new(), 32 * MIB))
        .await
        .unwrap();
    let Outcome::OutputMemoryExhausted {
        stream: StdStream::Stdout,
        held,
    } = r.outcome
    else {
        panic!("{}", r.outcome)
    };
    println!("bob's flood: {}", r.outcome);
    assert_eq!(r.stdout.len() as u64, held);
    assert!(
        (123 * MIB..=125 * MIB).contains(&held),
        "held {} MiB",
        held / MIB
    );
    assert_eq!(r.outcome.exit_code(), 137);
    assert_eq!(
        me(&w.addr).await.largest_fit_bytes,
        156 * MIB,
        "bob's output was given back"
    );
    // Discarding alice's result gives its memory back.
    let out = std::process::Command::new(crate::support::PEERWASM)
        .args(["cancel", "--peers", &w.addr, "--token", ALICE, &id])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(me(&w.addr).await.largest_fit_bytes, 256 * MIB);
}
