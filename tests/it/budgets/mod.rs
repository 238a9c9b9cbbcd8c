//! Nothing a request makes the worker hold goes unbudgeted: each attack of
//! a hostile client (or a stranger on the network) against what the worker
//! holds *for* requests — bodies, connections, answers, queued specs,
//! manifests, gossip replies — against a real worker process. During each
//! attack the worker's resident memory grows by no more than its
//! `--memory` plus [`OVERHEAD`], it answers `/v1/peers` within a second
//! and runs another tenant's job.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use peerwasm::client::{Job, Target};
use reqwest::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use peerwasm::sandbox::compile_memory::DEFAULT_BYTES_PER_BYTE;

use crate::support::{MIB, WorkerProcess};
use crate::tenants::{ALICE, BOB, http, me, tenants_file, upload};

/// What the worker may hold past `--memory` for requests, at worst: the
/// unauthenticated budget (16 MiB), the overdraft past a full ledger
/// (16 MiB) and manifests (32 MiB) — `worker::budget` and
/// `worker::manifests`.
const OVERHEAD: u64 = 64 * MIB;

pub(crate) fn rss(w: &WorkerProcess) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", w.child.id())).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib * 1024
}

/// A worker of alice, bob and carol with `--memory` `memory`, warmed up
/// (a job run), and its resident memory then.
pub(crate) async fn warm_worker(
    memory: &str,
    slots: u32,
    extra: &[&str],
) -> (WorkerProcess, tempfile::NamedTempFile, u64) {
    let tenants = tenants_file(1, 1);
    let mut args = vec!["--tenants", tenants.path().to_str().unwrap()];
    args.extend_from_slice(extra);
    let w = WorkerProcess::start_with(memory, slots, None, &args);
    bob_runs_a_job(&w).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let base = rss(&w);
    (w, tenants, base)
}

pub(crate) async fn bob_runs_a_job(w: &WorkerProcess) -> Duration {
    let bob = Target::pool_as(vec![w.addr.clone()], Some(BOB.into())).unwrap();
    let hello = Job::new(peerwasm_testkit::guest_wasm_bytes("hello"));
    let t = Instant::now();
    let r = bob
        .run(&hello, hello.spec(Vec::new(), 16 * MIB))
        .await
        .unwrap();
    assert!(
        r.outcome.is_success(),
        "bob's job during the attack: {}",
        r.outcome
    );
    t.elapsed()
}

/// The worker serves others: `/v1/peers` within a second, and a job of bob.
async fn serves_others(w: &WorkerProcess) -> (Duration, Duration) {
    let t = Instant::now();
    me(&w.addr).await;
    let view = t.elapsed();
    assert!(
        view < Duration::from_secs(1),
        "/v1/peers took {view:?} during the attack"
    );
    (view, bob_runs_a_job(w).await)
}

/// Asserts the worker grew by no more than `memory` + [`OVERHEAD`] over `base`.
fn within(w: &WorkerProcess, base: u64, memory: u64, what: &str) -> u64 {
    let grew = rss(w).saturating_sub(base);
    assert!(
        grew <= memory + OVERHEAD,
        "{what}: the worker grew by {} MiB (bound {} MiB)",
        grew / MIB,
        (memory + OVERHEAD) / MIB
    );
    grew
}

/// A connection to `addr` from `from` (any address of 127.0.0.0/8 is this
/// machine), with `head` sent.
pub(crate) async fn connect_from(
    from: IpAddr,
    addr: &str,
    head: &str,
) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind((from, 0).into())?;
    let mut tcp = socket.connect(addr.parse().unwrap()).await?;
    tcp.write_all(head.as_bytes()).await?;
    Ok(tcp)
}

/// Writes `n` bytes of zeros (fewer if the worker closes first).
async fn send_zeros(tcp: &mut TcpStream, n: usize) {
    let chunk = vec![0u8; 1 << 20];
    let mut sent = 0;
    while sent < n {
        let k = chunk.len().min(n - sent);
        if tcp.write_all(&chunk[..k]).await.is_err() {
            return;
        }
        sent += k;
    }
}

fn post_head(path: &str, token: Option<&str>, length: u64) -> String {
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    format!("POST {path} HTTP/1.1\r\nHost: w\r\n{auth}Content-Length: {length}\r\n\r\n")
}

mod gossip;

#[tokio::test(flavor = "multi_thread")]
async fn a_tenants_stalled_batch_bodies_are_charged_before_they_are_held() {
    let (w, _t, base) = warm_worker("1GiB", 2, &["--max-queued-bytes", "1MiB"]).await;
    // Ten batch requests of 200 MiB each, 150 MiB of each sent, then stalled.
    let mut attacks = Vec::new();
    for _ in 0..10 {
        let addr = w.addr.clone();
        attacks.push(tokio::spawn(async move {
            let head = post_head("/v1/jobs/batch", Some(ALICE), 200 * MIB);
            let mut tcp = connect_from(Ipv4Addr::LOCALHOST.into(), &addr, &head)
                .await
                .unwrap();
            send_zeros(&mut tcp, 150 * MIB as usize).await;
            tcp
        }));
    }
    let mut conns = Vec::new();
    for a in attacks {
        conns.push(a.await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let grew = within(&w, base, 256 * MIB, "ten stalled 200 MiB batches");
    let (view, job) = serves_others(&w).await;
    println!(
        "10 stalled 200 MiB batch bodies (150 MiB sent each): worker grew {} MiB; /v1/peers {view:?}; bob's job {job:?}",
        grew / MIB
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn one_address_cannot_take_every_connection_and_trickled_bodies_are_cut() {
    let (w, _t, _) = warm_worker("256MiB", 2, &["--max-connections", "64"]).await;
    // A stranger at 127.0.0.2 opens 64 connections, each trickling a body.
    let stranger = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
    let mut open = Vec::new();
    for _ in 0..64 {
        if let Ok(tcp) = connect_from(stranger, &w.addr, &post_head("/v1/gossip", None, 1000)).await
        {
            open.push(tcp);
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (view, job) = serves_others(&w).await;
    println!("64 trickling connections from one address: /v1/peers {view:?}; bob's job {job:?}");
    drop(open);
    // A file upload at a byte a second is cut off soon after the grace.
    let head = format!(
        "PUT /v1/files/{} HTTP/1.1\r\nHost: w\r\nAuthorization: Bearer {ALICE}\r\nContent-Length: 1000000\r\n\r\n",
        "ab".repeat(32)
    );
    let mut tcp = connect_from(Ipv4Addr::LOCALHOST.into(), &w.addr, &head)
        .await
        .unwrap();
    let t = Instant::now();
    let mut answer = Vec::new();
    loop {
        assert!(
            t.elapsed() < Duration::from_secs(40),
            "the trickled upload is still open after {:?}",
            t.elapsed()
        );
        if tcp.write_all(b"x").await.is_err() {
            break;
        }
        let mut buf = [0u8; 512];
        match tokio::time::timeout(Duration::from_secs(1), tcp.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => answer.extend_from_slice(&buf[..n]),
            Err(_) => {}
        }
    }
    let answer = String::from_utf8_lossy(&answer);
    println!(
        "a file upload at 1 byte/s: cut after {:?} ({})",
        t.elapsed(),
        answer.lines().next().unwrap_or("closed")
    );
    assert!(answer.is_empty() || answer.contains("408"), "{answer}");
}

#[tokio::test(flavor = "multi_thread")]
async fn one_result_read_by_many_who_never_read_is_held_once() {
    let (w, _t, _) = warm_worker("512MiB", 2, &[]).await;
    let mut flood = Job::new(peerwasm_testkit::guest_wasm_bytes("hostile-flood"));
    flood.limits.stdout_bytes = 60 * MIB;
    assert!(upload(&w.addr, &flood, Some(ALICE)).await.is_success());
    let resp = crate::tenants::post(
        &w.addr,
        &flood.spec(Vec::new(), 32 * MIB),
        Some(ALICE),
        true,
    )
    .await;
    assert_eq!(resp.status(), StatusCode::ACCEPTED);
    let id = resp.text().await.unwrap();
    let t = Instant::now();
    loop {
        let r = http()
            .get(format!("http://{}/v1/jobs/{id}", w.addr))
            .bearer_auth(ALICE)
            .send()
            .await
            .unwrap();
        if r.status() == StatusCode::OK {
            assert!(r.bytes().await.unwrap().len() as u64 >= 60 * MIB);
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the result never came"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let base = rss(&w);
    // 40 readers ask for it and never read the answers.
    let head =
        format!("GET /v1/jobs/{id} HTTP/1.1\r\nHost: w\r\nAuthorization: Bearer {ALICE}\r\n\r\n");
    let mut readers = Vec::new();
    for _ in 0..40 {
        readers.push(
            connect_from(Ipv4Addr::LOCALHOST.into(), &w.addr, &head)
                .await
                .unwrap(),
        );
    }
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let grew = within(&w, base, 0, "40 unread answers of a 60 MiB result");
    let (view, job) = serves_others(&w).await;
    println!(
        "40 unread fetches of a 60 MiB result: worker grew {} MiB; /v1/peers {view:?}; bob's job {job:?}",
        grew / MIB
    );
}

/// Alice's streamed job of `job` on `addr` (`POST /v1/jobs/stream`), its
/// spec sent, its stdin left open; the answer is never read.
pub(crate) async fn unread_stream(addr: &str, job: &Job) -> TcpStream {
    let head = peerwasm::proto::frame::encode_frame(&job.spec(Vec::new(), 16 * MIB)).unwrap();
    let h = format!(
        "POST /v1/jobs/stream HTTP/1.1\r\nHost: w\r\nAuthorization: Bearer {ALICE}\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n",
        head.len()
    );
    let mut tcp = connect_from(Ipv4Addr::LOCALHOST.into(), addr, &h)
        .await
        .unwrap();
    tcp.write_all(&head).await.unwrap();
    tcp.write_all(b"\r\n").await.unwrap();
    tcp
}

#[tokio::test(flavor = "multi_thread")]
async fn unread_streamed_output_stays_charged_and_bounded() {
    let (w, _t, base) = warm_worker("256MiB", 2, &["--slot-processes", "never"]).await;
    let mut flood = Job::new(peerwasm_testkit::guest_wasm_bytes("hostile-flood"));
    flood.limits.stdout_bytes = 64 * MIB;
    assert!(upload(&w.addr, &flood, Some(ALICE)).await.is_success());
    // Twelve streamed jobs each writing up to 64 MiB; nobody reads.
    let mut conns = Vec::new();
    for _ in 0..12 {
        conns.push(unread_stream(&w.addr, &flood).await);
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let grew = within(&w, base, 256 * MIB, "12 unread streamed jobs");
    let held = me(&w.addr).await;
    let (view, job) = serves_others(&w).await;
    println!(
        "12 unread streamed jobs of up to 64 MiB output: worker grew {} MiB, advert offers {} MiB; /v1/peers {view:?}; bob's job {job:?}",
        grew / MIB,
        held.largest_fit_bytes / MIB
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn queued_bytes_count_the_whole_spec() {
    let (w, _t, _) = warm_worker("1GiB", 1, &["--max-queued-bytes", "1MiB"]).await;
    let sleep = crate::tenants::sleep_job();
    assert!(upload(&w.addr, &sleep, Some(ALICE)).await.is_success());
    // One job holds the only slot; the next, with 2 MiB of args, must wait.
    let busy = {
        let (addr, spec) = (w.addr.clone(), sleep.spec(b"1500".to_vec(), 16 * MIB));
        tokio::spawn(async move {
            crate::tenants::post(&addr, &spec, Some(ALICE), false)
                .await
                .status()
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut spec = sleep.spec(b"10".to_vec(), 16 * MIB);
    spec.args = vec!["a".repeat(2 << 20)];
    let t = Instant::now();
    let r = crate::tenants::post(&w.addr, &spec, Some(ALICE), false).await;
    let status = r.status();
    let why = r.text().await.unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{why}");
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "refused only after {:?}",
        t.elapsed()
    );
    assert_eq!(busy.await.unwrap(), StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread")]
async fn manifests_are_bounded_per_tenant_and_deep_ones_checked_off_the_async_threads() {
    use peerwasm::proto::tree::{EntryKind, Manifest, TreeEntry};
    let (w, _t, base) = warm_worker("256MiB", 2, &[]).await;
    let manifest = |tag: usize, files: usize, path: &dyn Fn(usize) -> String| Manifest {
        entries: (0..files)
            .map(|i| TreeEntry {
                path: format!("{tag:03}/{}", path(i)),
                kind: EntryKind::File {
                    hash: peerwasm::proto::ModuleHash::of(&(tag * 1_000_000 + i).to_le_bytes()),
                    size: 1,
                },
            })
            .collect(),
    };
    let put = |m: Manifest| {
        let addr = w.addr.clone();
        async move {
            http()
                .put(format!("http://{addr}/v1/trees/{}", m.hash().to_hex()))
                .bearer_auth(ALICE)
                .body(m.encode())
                .send()
                .await
                .unwrap()
                .status()
        }
    };
    // 50 manifests of ~10 MiB in memory each, none of whose files is sent.
    for tag in 0..50 {
        let s = put(manifest(tag, 60_000, &|i| {
            format!("{i:06}-{}", "p".repeat(90))
        }))
        .await;
        assert_eq!(s, StatusCode::OK);
    }
    let grew = within(&w, base, 256 * MIB, "50 manifests of 10 MiB");
    // A manifest of deep paths is checked on a blocking thread, quickly.
    let deep = manifest(99, 2_000, &|i| {
        format!("{i:04}/{}", vec!["d"; 250].join("/"))
    });
    let (checked, views) = tokio::join!(
        async {
            let t = Instant::now();
            assert_eq!(put(deep).await, StatusCode::OK);
            t.elapsed()
        },
        serves_others(&w)
    );
    println!(
        "50 unsent 10 MiB manifests: worker grew {} MiB; a 2,000-path manifest 250 deep checked in {checked:?}; /v1/peers {:?}",
        grew / MIB,
        views.0
    );
    assert!(checked < Duration::from_secs(2), "{checked:?}");
}

/// A job request's charge ends when its jobs are queued: a job asking for
/// all of `--memory` starts on an idle worker, sent alone or in a batch
/// (before, each waited forever for the bytes of its own request).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_asking_for_all_the_worker_offers_is_not_held_back_by_its_own_request() {
    use peerwasm::client::{MapConfig, MapItem, map};
    let w = WorkerProcess::start("256MiB", 1, None);
    let hello = Job::new(peerwasm_testkit::guest_wasm_bytes("hello"));
    let target = Target::pool(vec![w.addr.clone()]).unwrap();
    let alone = tokio::time::timeout(
        Duration::from_secs(20),
        target.run(&hello, hello.spec(Vec::new(), 256 * MIB)),
    )
    .await
    .expect("a job of all of --memory, sent alone, did not start");
    assert!(alone.unwrap().outcome.is_success());
    // `map`'s first request, knowing nothing, is all the pool can hold.
    let mut items: Vec<MapItem> = Vec::new();
    let n = 20;
    let summary = tokio::time::timeout(
        Duration::from_secs(30),
        map(
            &target,
            &hello,
            (0..n).map(|_| Vec::new()),
            &MapConfig::default(),
            &mut items,
        ),
    )
    .await
    .expect("a batch of jobs of all of --memory did not start")
    .unwrap();
    assert_eq!(summary.jobs, n as u64);
    assert!(items.iter().all(MapItem::succeeded));
    let all = items
        .iter()
        .filter(|i| i.result.memory_limit_bytes == 256 * MIB)
        .count();
    assert!(all >= 1, "the first jobs asked for all of --memory");
}

/// Compiling a module takes host memory outside any job's limit (~24× the
/// module before any compile was measured: 2 GB for CPython's 95 MiB). While a job's module compiles, that
/// memory is charged to the ledger, so the worker offers that much less
/// (and admits nothing into it); once the module is loaded it is given back,
/// and a module already compiled is not charged again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compile_is_charged_to_the_ledger_until_its_module_is_loaded() {
    use crate::pool::view;
    let w = WorkerProcess::start_with("1GiB", 2, None, &["--slot-processes", "never"]);
    let big = Job::new(peerwasm_testkit::big_module(20_000));
    let charge = big.bytes().len() as u64 * DEFAULT_BYTES_PER_BYTE;
    assert!(
        charge > 100 * MIB,
        "a compile worth seeing: {} MiB",
        charge / MIB
    );
    let target = Target::pool(vec![w.addr.clone()]).unwrap();
    assert_eq!(
        view(&w.addr).await[0].advert.largest_fit_bytes,
        1024 * MIB,
        "an idle worker offers all of --memory"
    );
    let lowest = lowest_offer_while_it_runs(&w, &target, &big).await;
    assert!(
        lowest <= 1024 * MIB - 16 * MIB - charge,
        "while compiling the worker offered {} MiB (the compile: {} MiB)",
        lowest / MIB,
        charge / MIB
    );
    // Given back once loaded; compiled now, the next job charges nothing.
    crate::pool::wait_for(&w.addr, Duration::from_secs(5), |v| {
        v[0].advert.largest_fit_bytes == 1024 * MIB
    })
    .await;
    let lowest = lowest_offer_while_it_runs(&w, &target, &big).await;
    assert!(
        lowest >= 1024 * MIB - 16 * MIB,
        "a compiled module was charged again: offer {} MiB",
        lowest / MIB
    );
}

/// Runs `job` (16 MiB) on `w` and returns the least the worker offered while
/// it ran, polling its view.
async fn lowest_offer_while_it_runs(w: &WorkerProcess, target: &Target, job: &Job) -> u64 {
    let run = tokio::spawn({
        let (target, job) = (target.clone(), job.clone());
        async move { target.run(&job, job.spec(Vec::new(), 16 * MIB)).await }
    });
    let mut lowest = u64::MAX;
    while !run.is_finished() {
        lowest = lowest.min(crate::pool::view(&w.addr).await[0].advert.largest_fit_bytes);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(run.await.unwrap().unwrap().outcome.is_success());
    lowest
}
