//! [`Target`]: where jobs go — the embedded worker in this process, or a
//! pool of workers over HTTP. `run` and `map` are written once against it.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::job::Job;
use super::pool::{Pool, PoolConfig};
use crate::proto::{JobResult, JobSpec};
use crate::sandbox::SandboxConfig;
use crate::worker::{JobRunner, RunnerConfig};

/// Why a submission produced no result.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// The job was on `peer` when the connection broke (or the peer was
    /// declared dead): it may or may not have run; submit it again.
    #[error("lost with worker {peer}: {reason}")]
    Lost { peer: String, reason: String },
    /// No worker will ever run it as asked (too large for the pool, a bad
    /// request, no live worker for a long time).
    #[error("{0}")]
    Fatal(String),
}

/// Where a submitted job is now: the worker it was sent to and since when,
/// or nothing while it waits for a worker with room (or runs embedded).
#[derive(Debug, Default)]
pub struct Placed(Mutex<Option<(String, Instant)>>);

impl Placed {
    /// Records that the job was just sent to `addr` (or to nobody).
    pub fn set(&self, addr: Option<&str>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = addr.map(|a| (a.to_string(), Instant::now()));
    }

    /// The worker and the time it was sent there.
    pub fn get(&self) -> Option<(String, Instant)> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// How much a target can take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    /// Jobs that run at once (Σ slots of live workers).
    pub slots: u32,
    /// The largest job any worker could hold, in bytes.
    pub largest_job: u64,
    /// The largest job that at least half the workers could hold.
    pub typical_job: u64,
    /// Live workers (1 for the embedded worker).
    pub workers: u32,
}

/// Where jobs run.
#[derive(Clone)]
pub enum Target {
    /// The embedded worker: a sandbox with slots in this process.
    Embedded(Arc<JobRunner>),
    /// A pool of workers.
    Pool(Arc<Pool>),
}

impl Target {
    /// An embedded worker with `slots` slots and an in-memory module cache.
    pub fn embedded(slots: usize) -> anyhow::Result<Target> {
        let sandbox = SandboxConfig { slots, ..SandboxConfig::default() };
        Ok(Target::Embedded(Arc::new(JobRunner::new(RunnerConfig { sandbox, ..RunnerConfig::default() })?)))
    }

    /// A pool reached through `seeds` (`host:port`), with default settings.
    pub fn pool(seeds: Vec<String>) -> anyhow::Result<Target> {
        Target::pool_as(seeds, None)
    }

    /// A pool reached through `seeds`, submitting as the tenant of `token`.
    pub fn pool_as(seeds: Vec<String>, token: Option<String>) -> anyhow::Result<Target> {
        Ok(Target::Pool(Arc::new(Pool::new(PoolConfig { token, ..PoolConfig::new(seeds) })?)))
    }

    /// What the target can take now.
    pub async fn capacity(&self) -> anyhow::Result<Capacity> {
        match self {
            Target::Embedded(runner) => {
                let largest = runner.sandbox().config().max_job_memory;
                Ok(Capacity { slots: runner.slots() as u32, largest_job: largest, typical_job: largest, workers: 1 })
            }
            Target::Pool(pool) => {
                let view = pool.view().await?;
                let live: Vec<_> = view
                    .iter()
                    .filter(|p| p.liveness == crate::gossip::Liveness::Alive && !p.advert.draining)
                    .collect();
                let mut caps: Vec<u64> = live.iter().map(|p| p.advert.capacity_bytes).collect();
                caps.sort_unstable();
                Ok(Capacity {
                    slots: live.iter().map(|p| p.advert.slots_total).sum(),
                    largest_job: caps.last().copied().unwrap_or(0),
                    // The median's upper neighbour: at least half hold it.
                    typical_job: caps.get(caps.len().saturating_sub(1) / 2).copied().unwrap_or(0),
                    workers: live.len() as u32,
                })
            }
        }
    }

    /// Runs one job and returns its result.
    pub async fn run(&self, job: &Job, spec: JobSpec) -> Result<JobResult, SubmitError> {
        self.run_tracked(job, spec, &Placed::default()).await
    }

    /// [`run`](Self::run), setting `placed` to the worker the job is on.
    pub async fn run_tracked(
        &self,
        job: &Job,
        spec: JobSpec,
        placed: &Placed,
    ) -> Result<JobResult, SubmitError> {
        match self {
            Target::Embedded(runner) => {
                if !runner.has_module(&job.hash()) {
                    runner.add_module_hashed(job.hash(), job.bytes().clone());
                }
                Ok(runner.run(spec, None).await)
            }
            Target::Pool(pool) => pool.run(job, &spec, placed).await,
        }
    }
}
