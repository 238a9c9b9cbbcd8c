//! [`Submitter`]: what `map` needs of where its jobs go — their capacity,
//! submitting one job, and which workers are dead — so that map's rules
//! run against a scripted fake in unit tests (on Tokio's paused clock) as
//! well as against the real [`Target`](super::Target).

use parking_lot::Mutex;
use std::future::Future;

use tokio::time::Instant;

use super::errors::SubmitError;
use super::job::Job;
use crate::proto::{JobResult, JobSpec};

/// Where jobs go, as `map` sees it. [`Target`](super::Target) is the
/// real one: the embedded worker or a pool.
pub trait Submitter: Clone + Send + Sync + 'static {
    /// Whether jobs run in this process, writing straight into their
    /// directories (the embedded worker).
    fn in_process(&self) -> bool;

    /// What the target can take now.
    fn capacity(&self) -> impl Future<Output = anyhow::Result<Capacity>> + Send;

    /// Runs one job; `placed` says which worker it is on meanwhile.
    fn submit(
        &self,
        job: &Job,
        spec: JobSpec,
        placed: &Placed,
    ) -> impl Future<Output = Result<JobResult, SubmitError>> + Send;

    /// The workers the target now believes dead (a job on one of them is
    /// lost); none for a target without workers, or when the target
    /// cannot tell.
    fn dead_workers(&self) -> impl Future<Output = Vec<String>> + Send;

    /// Tells the pool what the map still has to run (its demand: see
    /// `proto::backlog`). Nothing, for a target without a pool.
    fn report_backlog(
        &self,
        _backlog: crate::proto::backlog::Backlog,
    ) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// Where a submitted job is now: the worker it was sent to and since when,
/// or nothing while it waits for a worker with room (or runs embedded).
/// The time is Tokio's, so that a paused clock moves it in tests.
#[derive(Debug, Default)]
pub struct Placed(Mutex<Option<(String, Instant)>>);

impl Placed {
    /// Records that the job was just sent to `addr` (or to nobody).
    pub fn set(&self, addr: Option<&str>) {
        *self.0.lock() = addr.map(|a| (a.to_string(), Instant::now()));
    }

    /// The worker and the time it was sent there.
    pub fn get(&self) -> Option<(String, Instant)> {
        self.0.lock().clone()
    }
}

/// How much a target can take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    /// Jobs that run at once (Σ slots of live workers).
    pub slots: u32,
    /// The largest job any worker could hold, in bytes.
    pub largest_job: u64,
    /// The largest job any worker holds beside what its warm starts keep,
    /// in bytes (≤ `largest_job`): what a map asks before it has learned
    /// anything, so that its first jobs do not cost a worker its snapshots.
    pub largest_beside_warm: u64,
    /// The largest job that at least half the workers could hold.
    pub typical_job: u64,
    /// Live workers (1 for the embedded worker).
    pub workers: u32,
}
