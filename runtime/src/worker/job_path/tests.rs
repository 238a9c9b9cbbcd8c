//! The job path built from its parts with [`JobPath::new`] — no server, no
//! router, no gossip, no socket — and driven by the calls `server/` makes:
//! a job run to its result, the gate a drain closes, a job that would
//! outlast the batch job lending the worker, a detached job kept in the
//! state database until its result is discarded.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::{JobPath, Kept};
use crate::proto::{JobSpec, Outcome};
use crate::runner::{JobRunner, RunnerConfig};
use crate::server::testing::{ECHO, MIB};
use crate::worker::admission::{Admission, AdmissionConfig};
use crate::worker::filestore::FileStore;
use crate::worker::history::History;
use crate::worker::jobs::{self, Streams};
use crate::worker::ledger::{Ledger, LedgerConfig};
use crate::worker::lifetime::Lifetime;
use crate::worker::refused::Refused;
use crate::worker::statedb::StateDb;
use crate::worker::table::Lookup;
use crate::worker::tenants::{Tenant, Tenants};
use crate::worker::uploaders::Uploaders;

/// A job path of 2 slots and 64 MiB, its scratch, files and state under
/// `dir`, lent until `lifetime` ends.
fn job_path(dir: &std::path::Path, lifetime: Lifetime) -> Arc<JobPath> {
    let mut config = RunnerConfig::default();
    config.sandbox.slots = 2;
    config.sandbox.scratch_root = Some(dir.to_path_buf());
    let runner = JobRunner::new(config).unwrap();
    let ledger = Ledger::new(&LedgerConfig {
        memory: Some(64 * MIB),
        reserve: 0,
        ..LedgerConfig::default()
    })
    .unwrap();
    let admission = Admission::new(ledger, AdmissionConfig::new(2));
    let files = Arc::new(
        FileStore::new(Some(dir), 16 * MIB, runner.sandbox().scratch_pool(), false).unwrap(),
    );
    let db = Arc::new(StateDb::temporary(Some(dir)).unwrap());
    let kept = Kept {
        history: History::new(db.clone(), Duration::from_secs(3600)),
        db: db.clone(),
        max_results: MIB,
        max_stored: 16 * MIB,
    };
    Arc::new(JobPath::new(
        "in-memory:1",
        runner,
        admission,
        Tenants::single(),
        files,
        Uploaders::load(db).unwrap(),
        kept,
        lifetime,
        MIB,
    ))
}

fn tenant(jobs: &JobPath) -> Arc<Tenant> {
    jobs.tenants
        .by_name(crate::worker::tenants::DEFAULT_TENANT)
        .unwrap()
}

/// ECHO's spec with `stdin`, its module known to the runner.
fn echo(jobs: &JobPath, stdin: &[u8]) -> JobSpec {
    let bytes = wat::parse_str(ECHO).unwrap();
    jobs.runner.add_module(bytes.clone());
    crate::client::Job::new(bytes).spec(stdin.to_vec(), 4 * MIB)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_runs_to_its_result_stamped_counted_and_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let jobs = job_path(dir.path(), Lifetime::default());
    let (spec, who) = (echo(&jobs, b"hello"), tenant(&jobs));
    let mut heard = None;
    let result = jobs::run_attached(&jobs, &who, spec, Streams::default(), |id| {
        heard = Some(id.to_string())
    })
    .await
    .unwrap();
    assert!(result.outcome.is_success(), "{:?}", result.outcome);
    assert_eq!(result.stdout, b"hello");
    assert_eq!(
        result.peer, "in-memory:1",
        "stamped with the worker's address"
    );
    assert!(result.peak_memory_bytes >= 64 << 10, "one page at least");
    assert!(heard.is_some(), "its id was told as it was queued");
    assert_eq!(jobs.jobs_run.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert_eq!(
        jobs.table.active(),
        0,
        "an attached job leaves the table with its request"
    );
    let history = jobs.kept.history.query(0, None).await.unwrap();
    assert_eq!(history.len(), 1, "recorded once: {history:?}");
    let snap = jobs.admission.ledger().snapshot();
    assert_eq!((snap.reserved, snap.held), (0, 0), "every byte given back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_module_is_asked_for_and_a_drained_gate_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let jobs = job_path(dir.path(), Lifetime::default());
    let who = tenant(&jobs);
    let unknown = crate::client::Job::new(wat::parse_str("(module)").unwrap()).spec(vec![], MIB);
    let refused = jobs::run_attached(&jobs, &who, unknown, Streams::default(), |_| {}).await;
    assert!(
        matches!(refused, Err(Refused::UnknownModule(_))),
        "{refused:?}"
    );
    jobs.gate.drain();
    let spec = echo(&jobs, b"late");
    let refused = jobs::run_attached(&jobs, &who, spec, Streams::default(), |_| {}).await;
    match refused {
        Err(Refused::Busy(why)) => assert!(why.contains("shutting down"), "{why}"),
        other => panic!("a draining worker ran a job: {other:?}"),
    }
    assert_eq!(jobs.jobs_run.load(std::sync::atomic::Ordering::Relaxed), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_would_outlast_the_batch_job_is_refused_one_that_fits_runs() {
    let dir = tempfile::tempdir().unwrap();
    let lifetime = Lifetime {
        batch_job: Some("4242".into()),
        ends_at: Some(SystemTime::now() + Duration::from_secs(600)),
        drain_before: Duration::from_secs(60),
    };
    let jobs = job_path(dir.path(), lifetime);
    let who = tenant(&jobs);
    let mut long = echo(&jobs, b"long");
    long.limits.timeout_ms = Some(3_600_000);
    match jobs::run_attached(&jobs, &who, long, Streams::default(), |_| {}).await {
        Err(Refused::Busy(why)) => assert!(why.contains("batch job"), "{why}"),
        other => panic!("a job of an hour was taken by a worker ending in 10 minutes: {other:?}"),
    }
    let mut short = echo(&jobs, b"short");
    short.limits.timeout_ms = Some(60_000);
    let result = jobs::run_attached(&jobs, &who, short, Streams::default(), |_| {})
        .await
        .unwrap();
    assert_eq!(result.stdout, b"short");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detached_job_is_kept_until_its_result_is_discarded() {
    let dir = tempfile::tempdir().unwrap();
    let jobs = job_path(dir.path(), Lifetime::default());
    let who = tenant(&jobs);
    let spec = echo(&jobs, b"kept");
    let id = jobs::submit_detached(&jobs, &who, spec).await.unwrap();
    let stored = || crate::worker::stored::stored_by(&jobs.kept.db, &who.name);
    assert!(
        stored().await.unwrap() > 0,
        "committed before its id was answered"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let encoded = loop {
        match jobs.table.result(&who.name, &id) {
            Lookup::Done(bytes) => break bytes,
            Lookup::NotDone => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the detached job never ended"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Lookup::NotFound => panic!("the detached job left the table before it was read"),
        }
    };
    let result: crate::proto::JobResult = postcard::from_bytes(&encoded).unwrap();
    assert_eq!(result.stdout, b"kept");
    assert!(!matches!(result.outcome, Outcome::Rejected { .. }));
    assert!(
        jobs.table.held_bytes(&who.name) > 0,
        "its result is held for its owner"
    );
    crate::worker::detached::discarded(&jobs.kept.db, &id)
        .await
        .unwrap();
    assert_eq!(
        stored().await.unwrap(),
        0,
        "nothing of it left in the state database"
    );
}
