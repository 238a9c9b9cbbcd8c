//! `POST /v1/jobs/batch` against a real worker process: answers stream
//! back as jobs end, each job is refused or run on its own, bad batches are
//! refused whole, and a client that hangs up mid-batch costs nothing.

use std::time::{Duration, Instant};

use peerwasm::client::Job;
use peerwasm::proto::batch::{BatchAnswer, BatchItem, FrameReader, MAX_BATCH_JOBS};
use peerwasm::proto::routes::BATCH;
use peerwasm::proto::{JobSpec, ModuleHash, Outcome};
use reqwest::StatusCode;

use crate::support::{MIB, WorkerProcess};

fn http() -> reqwest::Client {
    crate::support::http()
}

async fn upload(addr: &str, job: &Job) {
    let url = format!("http://{addr}/v1/modules/{}", job.hash().to_hex());
    let status = http()
        .put(url)
        .body(job.bytes().to_vec())
        .send()
        .await
        .unwrap()
        .status();
    assert!(status.is_success(), "upload: {status}");
}

fn sleep_spec(job: &Job, ms: u64) -> JobSpec {
    job.spec(format!("{ms}\n").into_bytes(), 32 * MIB)
}

/// Posts `specs` as one batch; each answer with the time it arrived.
async fn batch(addr: &str, specs: &[JobSpec]) -> (StatusCode, Vec<(BatchItem, Duration)>) {
    let start = Instant::now();
    let body = postcard::to_allocvec(specs).unwrap();
    let mut resp = http()
        .post(format!("http://{addr}{BATCH}"))
        .body(body)
        .send()
        .await
        .unwrap();
    let status = resp.status();
    let mut reader = FrameReader::default();
    let mut items = Vec::new();
    if status == StatusCode::OK {
        while let Some(chunk) = resp.chunk().await.unwrap() {
            reader.push(&chunk);
            while let Some(item) = reader.next_item().unwrap() {
                items.push((item, start.elapsed()));
            }
        }
        assert_eq!(reader.pending(), 0, "the stream ended inside a frame");
    }
    (status, items)
}

#[tokio::test]
async fn a_batch_answers_each_job_as_it_ends_and_refuses_jobs_one_by_one() {
    let w = WorkerProcess::start("1GiB", 2, None);
    let sleep = Job::new(peerwasm_testkit::guest_wasm_bytes("sleep"));
    upload(&w.addr, &sleep).await;
    let unknown = JobSpec::new(ModuleHash::of(b"never uploaded"));
    let too_large = sleep.spec(b"1\n".to_vec(), 64 << 30);
    let specs = vec![
        sleep_spec(&sleep, 1500), // 0: slow, first in the batch
        sleep_spec(&sleep, 10),   // 1
        unknown,                  // 2: 404
        too_large,                // 3: 422
        sleep_spec(&sleep, 10),   // 4
        sleep_spec(&sleep, 10),   // 5
    ];
    let (status, items) = batch(&w.addr, &specs).await;
    assert_eq!(status, StatusCode::OK);
    let mut seen: Vec<u32> = items.iter().map(|(i, _)| i.index).collect();
    seen.sort();
    assert_eq!(
        seen,
        vec![0, 1, 2, 3, 4, 5],
        "every job answered exactly once"
    );
    let answer = |index: u32| items.iter().find(|(i, _)| i.index == index).unwrap();
    for index in [1, 4, 5] {
        let (item, at) = answer(index);
        let BatchAnswer::Done(r) = &item.answer else {
            panic!("job {index}: {:?}", item.answer)
        };
        assert_eq!(r.outcome, Outcome::Exited { code: 0 });
        assert!(
            *at < Duration::from_millis(1200),
            "job {index} waited for the slow one: {at:?}"
        );
    }
    let (slow, slow_at) = answer(0);
    assert!(matches!(&slow.answer, BatchAnswer::Done(r) if r.outcome.is_success()));
    assert!(*slow_at >= Duration::from_millis(1500));
    assert_eq!(
        items.last().unwrap().0.index,
        0,
        "the slow job's answer comes last"
    );
    match &answer(2).0.answer {
        BatchAnswer::Refused {
            status: 404,
            message,
            ..
        } => assert!(message.contains("unknown"), "{message}"),
        other => panic!("unknown module: {other:?}"),
    }
    match &answer(3).0.answer {
        BatchAnswer::Refused {
            status: 422,
            largest_job: Some(largest),
            ..
        } => assert!(*largest <= 1 << 30),
        other => panic!("too large: {other:?}"),
    }
}

#[tokio::test]
async fn bad_batches_are_refused_whole_and_the_worker_stays_up() {
    let w = WorkerProcess::start("1GiB", 1, None);
    let url = format!("http://{}{BATCH}", w.addr);
    // Garbage, a truncated batch, and one job too many.
    let garbage = http()
        .post(&url)
        .body(vec![0xff; 100])
        .send()
        .await
        .unwrap();
    assert_eq!(garbage.status(), StatusCode::BAD_REQUEST);
    let specs = vec![JobSpec::new(ModuleHash::of(b"m")); 3];
    let mut truncated = postcard::to_allocvec(&specs).unwrap();
    truncated.truncate(truncated.len() - 5);
    let resp = http().post(&url).body(truncated).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    assert!(resp.text().await.unwrap().contains("bad batch request"));
    let too_many = vec![JobSpec::new(ModuleHash::of(b"m")); MAX_BATCH_JOBS + 1];
    let resp = http()
        .post(&url)
        .body(postcard::to_allocvec(&too_many).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert!(resp.text().await.unwrap().contains("limit"));
    // Still serving.
    let hello = Job::new(peerwasm_testkit::guest_wasm_bytes("hello"));
    upload(&w.addr, &hello).await;
    let (status, items) = batch(&w.addr, &[hello.spec(Vec::new(), 16 * MIB)]).await;
    assert_eq!(status, StatusCode::OK);
    assert!(matches!(&items[0].0.answer, BatchAnswer::Done(r) if r.outcome.is_success()));
}

#[tokio::test]
async fn a_client_that_hangs_up_mid_batch_frees_the_queue() {
    let w = WorkerProcess::start("1GiB", 1, None);
    let sleep = Job::new(peerwasm_testkit::guest_wasm_bytes("sleep"));
    upload(&w.addr, &sleep).await;
    // 20 jobs of 300 ms on one slot: 6 s if they all ran.
    let specs: Vec<JobSpec> = (0..20).map(|_| sleep_spec(&sleep, 300)).collect();
    let body = postcard::to_allocvec(&specs).unwrap();
    let resp = http()
        .post(format!("http://{}{BATCH}", w.addr))
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(resp); // hang up with one job running and 19 queued
    // The running job ends; the queued ones left with the client, so a new
    // job starts within about one job's time, not after 19 more.
    let start = Instant::now();
    let (status, items) = batch(&w.addr, &[sleep_spec(&sleep, 10)]).await;
    assert_eq!(status, StatusCode::OK);
    assert!(matches!(&items[0].0.answer, BatchAnswer::Done(r) if r.outcome.is_success()));
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "the abandoned jobs still ran: {:?}",
        start.elapsed()
    );
}

#[tokio::test]
async fn a_map_of_short_jobs_travels_in_batches_and_every_result_comes_back_once() {
    use peerwasm::client::{MapConfig, MapItem, Target, map};
    let w = WorkerProcess::start("1GiB", 1, None);
    let hello = Job::new(peerwasm_testkit::guest_wasm_bytes("hello"));
    let target = Target::pool(vec![w.addr.clone()]).unwrap();
    let n = 3000;
    let mut items: Vec<MapItem> = Vec::new();
    let summary = map(
        &target,
        &hello,
        (0..n).map(|_| Vec::new()),
        &MapConfig::default(),
        &mut items,
    )
    .await
    .unwrap();
    assert_eq!(summary.jobs, n as u64);
    assert_eq!(
        items.iter().map(|i| i.index).collect::<Vec<_>>(),
        (0..n).collect::<Vec<_>>()
    );
    assert!(items.iter().all(MapItem::succeeded));
    let m = crate::observe::scrape(&w.addr).await;
    let (requests, jobs) = (
        crate::observe::get(&m, "peerwasm_batch_jobs_count"),
        crate::observe::get(&m, "peerwasm_batch_jobs_sum"),
    );
    // The first jobs go out before the module (a worker may have it
    // already); they find it unknown, it is uploaded once, and they go again.
    assert!(
        jobs >= n as f64 && jobs <= n as f64 + 8.0,
        "{jobs} jobs sent for {n}: some were sent more than once"
    );
    assert!(
        requests <= n as f64 / 4.0,
        "{n} short jobs took {requests} requests: not batched"
    );
}
