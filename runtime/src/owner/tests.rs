//! The owner on workers served in memory (`server::memory`): what it
//! stores survives a restart, an interrupted map resumes where it stopped
//! without running an input twice, a cancel stops it — in a second, with
//! no process or socket.

use std::time::Duration;

use crate::client::{Pool, PoolConfig, WorkerApi, http_client};
use crate::proto::submission::{
    MOST_ATTEMPTS, MOST_IN_FLIGHT, SubmissionInfo, SubmissionState, SubmitConfig, SubmittedResult,
};
use crate::server::memory::{MemoryNetwork, MemoryWorker};
use crate::server::testing::{BUSY_ECHO, ECHO, MIB, SPIN, config, job, until};

fn pool(network: &MemoryNetwork, addr: &str) -> Pool {
    Pool::new(PoolConfig {
        transport: network.transport(),
        ..PoolConfig::new(vec![addr.to_string()])
    })
    .unwrap()
}

fn inputs(n: u8) -> Vec<Vec<u8>> {
    (0..n).map(|i| format!("input {i}").into_bytes()).collect()
}

/// Every result of submission `id` on the worker at `addr`, read page by
/// page until `n` are in.
async fn results(network: &MemoryNetwork, addr: &str, id: &str, n: usize) -> Vec<SubmittedResult> {
    let http = http_client(None, &network.transport()).unwrap();
    let api = WorkerApi::new(&http, addr);
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while got.len() < n {
        if tokio::time::Instant::now() > deadline {
            let info = api.submission(id).await;
            panic!("{} of {n} results: {info:?}", got.len());
        }
        let page = api
            .submission_results(id, got.len() as u64, Duration::from_secs(5))
            .await
            .unwrap();
        got.extend(page.items);
    }
    got
}

async fn info(network: &MemoryNetwork, addr: &str, id: &str) -> SubmissionInfo {
    let http = http_client(None, &network.transport()).unwrap();
    WorkerApi::new(&http, addr).submission(id).await.unwrap()
}

/// The submission once it is no longer running (its last results are
/// readable a moment before its state says so).
async fn ended(network: &MemoryNetwork, addr: &str, id: &str) -> SubmissionInfo {
    until("the submission's map returns", async || {
        info(network, addr, id).await.state != SubmissionState::Running
    })
    .await;
    info(network, addr, id).await
}

fn mem(m: u64) -> SubmitConfig {
    SubmitConfig {
        mem: Some((m).into()),
        ..SubmitConfig::default()
    }
}

/// A worker in memory (its state in a new directory) that owns a map of
/// `wat` over `n` inputs, just submitted.
async fn owning(
    wat: &str,
    n: u8,
) -> (
    tempfile::TempDir,
    MemoryNetwork,
    MemoryWorker,
    SubmissionInfo,
) {
    let dir = tempfile::tempdir().unwrap();
    let network = MemoryNetwork::new();
    let worker = MemoryWorker::start(config(dir.path(), false), &network)
        .await
        .unwrap();
    let submitted = pool(&network, &worker.addr)
        .submit_map(&job(wat), inputs(n), mem(4 * MIB), None)
        .await
        .unwrap();
    (dir, network, worker, submitted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_submission_and_its_results_survive_a_restart() {
    let (dir, network, worker, submitted) = owning(ECHO, 6).await;
    let before = results(&network, &worker.addr, &submitted.id, 6).await;
    let worker = worker.restart(config(dir.path(), false)).await.unwrap();
    let after = results(&network, &worker.addr, &submitted.id, 6).await;
    assert_eq!(after, before, "the same results, read after the restart");
    let info = ended(&network, &worker.addr, &submitted.id).await;
    assert_eq!((info.state, info.done), (SubmissionState::Done, 6));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_map_resumes_where_it_stopped_and_runs_no_input_twice() {
    let n = 24;
    let (dir, network, worker, submitted) = owning(BUSY_ECHO, n).await;
    // Stopped once some results are in, before all are.
    let some = results(&network, &worker.addr, &submitted.id, 2).await;
    let done_before = info(&network, &worker.addr, &submitted.id).await.done;
    let worker = worker.restart(config(dir.path(), false)).await.unwrap();
    let all = results(&network, &worker.addr, &submitted.id, n as usize).await;
    assert_eq!(
        &all[..some.len()],
        &some[..],
        "what was stored is kept as it was"
    );
    let outputs: Vec<_> = all.iter().map(|r| r.result.stdout.clone()).collect();
    assert_eq!(outputs, inputs(n), "every input once, in order");
    let info = ended(&network, &worker.addr, &submitted.id).await;
    assert_eq!((info.state, info.done), (SubmissionState::Done, n as u64));
    assert!(
        done_before < n as u64,
        "the map was stopped before it ended ({done_before} of {n} done): the test proves nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_submission_stops_its_jobs_and_keeps_what_it_had() {
    let (_dir, network, worker, submitted) = owning(SPIN, 4).await;
    let http = http_client(None, &network.transport()).unwrap();
    let api = WorkerApi::new(&http, &worker.addr);
    // Both slots busy with its spinning jobs, then cancelled.
    until("its jobs start", async || {
        worker.worker().jobs.admission.counts().0 == 2
    })
    .await;
    let was = api.cancel_submission(&submitted.id).await.unwrap();
    assert_eq!(was, "running");
    until("its jobs end after the cancel", async || {
        worker.worker().jobs.admission.counts() == (0, 0)
    })
    .await;
    let info = api.submission(&submitted.id).await.unwrap();
    assert_eq!((info.state, info.done), (SubmissionState::Cancelled, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_map_that_would_hold_its_owner_without_bound_is_refused_saying_which_knob() {
    let dir = tempfile::tempdir().unwrap();
    let network = MemoryNetwork::new();
    let worker = MemoryWorker::start(config(dir.path(), false), &network)
        .await
        .unwrap();
    let pool = pool(&network, &worker.addr);
    let with = |f: fn(&mut SubmitConfig)| {
        let mut c = mem(4 * MIB);
        f(&mut c);
        c
    };
    for (config, named) in [
        (with(|c| c.retries = u32::MAX), "retries 4294967295"),
        (with(|c| c.max_lost = 0), "max_lost 0"),
        (with(|c| c.max_lost = MOST_ATTEMPTS + 1), "max_lost 101"),
        (with(|c| c.max_in_flight = Some(0)), "max_in_flight 0"),
        (
            with(|c| c.max_in_flight = Some(u64::MAX)),
            "max_in_flight 18446744073709551615",
        ),
    ] {
        let refused = pool
            .submit_map(&job(ECHO), inputs(2), config, None)
            .await
            .unwrap_err();
        assert!(format!("{refused:#}").contains(named), "{refused:#}");
    }
    // At the bounds: taken, and run.
    let taken = with(|c| {
        c.retries = MOST_ATTEMPTS;
        c.max_lost = MOST_ATTEMPTS;
        c.max_in_flight = Some(MOST_IN_FLIGHT);
    });
    let submitted = pool
        .submit_map(&job(ECHO), inputs(2), taken, None)
        .await
        .unwrap();
    assert_eq!(ended(&network, &worker.addr, &submitted.id).await.done, 2);
}
