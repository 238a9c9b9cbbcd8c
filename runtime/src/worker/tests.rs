//! A job's path through workers served in memory (`server::memory`):
//! gossip between two workers, a map spread over both, a worker that dies
//! under a map, a detached job kept across a restart — in a second, with
//! no process or socket. The gossip rounds run when the test says.

use std::sync::atomic::Ordering;

use crate::client::{MapConfig, Pool, PoolConfig, Target, WorkerApi, http_client, map};
use crate::server::memory::{MemoryNetwork, MemoryWorker};
use crate::server::testing::{BUSY_ECHO, ECHO, MIB, config, job, second, until};

fn target(network: &MemoryNetwork, seed: &str) -> Target {
    let pool = Pool::new(PoolConfig {
        transport: network.transport(),
        ..PoolConfig::new(vec![seed.to_string()])
    })
    .unwrap();
    Target::Pool(std::sync::Arc::new(pool))
}

/// Two workers, the second joining the first, each having heard the
/// other.
async fn pair(network: &MemoryNetwork, dir: &std::path::Path) -> (MemoryWorker, MemoryWorker) {
    let a = MemoryWorker::start(config(dir, false), network)
        .await
        .unwrap();
    let mut b_config = second(config(dir, false), dir, "b");
    b_config.join = vec![a.addr.clone()];
    let b = MemoryWorker::start(b_config, network).await.unwrap();
    b.gossip_round().await;
    a.gossip_round().await;
    (a, b)
}

fn inputs(n: usize) -> Vec<Vec<u8>> {
    (0..n).map(|i| format!("input {i}").into_bytes()).collect()
}

fn config_of_map() -> MapConfig {
    MapConfig {
        estimates: None,
        mem: Some((4 * MIB).into()),
        ..MapConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_hear_each_other_and_a_map_runs_on_both() {
    let dir = tempfile::tempdir().unwrap();
    let network = MemoryNetwork::new();
    let (a, b) = pair(&network, dir.path()).await;
    let http = http_client(None, &network.transport()).unwrap();
    let view = WorkerApi::new(&http, &a.addr).peers().await.unwrap();
    let mut seen: Vec<_> = view.iter().map(|p| p.advert.addr.clone()).collect();
    seen.sort();
    assert_eq!(
        seen,
        [a.addr.clone(), b.addr.clone()],
        "a's view after one round each"
    );
    let mut items = Vec::new();
    map(
        &target(&network, &a.addr),
        &job(BUSY_ECHO),
        inputs(24),
        &config_of_map(),
        &mut items,
    )
    .await
    .unwrap();
    let outputs: Vec<_> = items.iter().map(|i| i.result.stdout.clone()).collect();
    assert_eq!(outputs, inputs(24));
    let (ran_a, ran_b) = (
        a.worker().jobs.jobs_run.load(Ordering::Relaxed),
        b.worker().jobs.jobs_run.load(Ordering::Relaxed),
    );
    assert_eq!(ran_a + ran_b, 24, "each input once");
    assert!(ran_a > 0 && ran_b > 0, "both worked: {ran_a} and {ran_b}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_dies_under_a_map_loses_no_input() {
    let dir = tempfile::tempdir().unwrap();
    let network = MemoryNetwork::new();
    let (a, b) = pair(&network, dir.path()).await;
    let n = 40;
    let running = {
        let target = target(&network, &a.addr);
        tokio::spawn(async move {
            let mut items = Vec::new();
            map(
                &target,
                &job(BUSY_ECHO),
                inputs(n),
                &config_of_map(),
                &mut items,
            )
            .await
            .map(|_| items)
        })
    };
    until("b gets a job", async || {
        b.worker().jobs.jobs_run.load(Ordering::Relaxed) > 0
    })
    .await;
    b.stop();
    let items = running.await.unwrap().unwrap();
    let outputs: Vec<_> = items.iter().map(|i| i.result.stdout.clone()).collect();
    assert_eq!(outputs, inputs(n), "every input, in order, though b died");
    assert!(items.iter().all(|i| i.result.outcome.is_success()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detached_job_s_result_is_kept_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let network = MemoryNetwork::new();
    let worker = MemoryWorker::start(config(dir.path(), false), &network)
        .await
        .unwrap();
    let pool = Pool::new(PoolConfig {
        transport: network.transport(),
        ..PoolConfig::new(vec![worker.addr.clone()])
    })
    .unwrap();
    let echo = job(ECHO);
    let (_, id) = pool
        .submit_detached(&echo, &echo.spec(b"kept".to_vec(), 4 * MIB))
        .await
        .unwrap();
    let http = http_client(None, &network.transport()).unwrap();
    let api = WorkerApi::new(&http, &worker.addr);
    until("the job ends", async || {
        api.job_output(&id, [0, 0]).await.unwrap().ended.is_some()
    })
    .await;
    let worker = worker.restart(config(dir.path(), false)).await.unwrap();
    let output = WorkerApi::new(&http, &worker.addr)
        .job_output(&id, [0, 0])
        .await
        .unwrap();
    assert_eq!(output.stdout, b"kept");
    assert!(
        output.ended.as_ref().is_some_and(|o| o.is_success()),
        "{output:?}"
    );
}
