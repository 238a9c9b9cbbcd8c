//! [`Target`]: where jobs go — the embedded worker in this process, or a
//! pool of workers over HTTP. `run` and `map` are written once against it.

use std::sync::Arc;

use super::errors::SubmitError;
use super::job::Job;
use super::pool::{Pool, PoolConfig};
use super::submitter::{Capacity, Placed, Submitter};
use crate::gossip::Liveness;
use crate::proto::{JobResult, JobSpec, Outcome};
use crate::runner::{JobRunner, RunnerConfig};
use crate::sandbox::SandboxConfig;

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
        let sandbox = SandboxConfig {
            slots,
            ..SandboxConfig::default()
        };
        Ok(Target::Embedded(Arc::new(JobRunner::new(RunnerConfig {
            sandbox,
            ..RunnerConfig::default()
        })?)))
    }

    /// A pool reached through `seeds` (`host:port`), with default settings.
    pub fn pool(seeds: Vec<String>) -> anyhow::Result<Target> {
        Target::pool_as(seeds, None)
    }

    /// A pool reached through `seeds`, submitting as the tenant of `token`.
    pub fn pool_as(seeds: Vec<String>, token: Option<String>) -> anyhow::Result<Target> {
        Ok(Target::Pool(Arc::new(Pool::new(PoolConfig {
            token,
            ..PoolConfig::new(seeds)
        })?)))
    }

    /// What the target can take now.
    pub async fn capacity(&self) -> anyhow::Result<Capacity> {
        match self {
            Target::Embedded(runner) => {
                let largest = runner.sandbox().config().max_job_memory;
                Ok(Capacity {
                    slots: runner.slots() as u32,
                    largest_job: largest,
                    largest_beside_warm: largest,
                    typical_job: largest,
                    workers: 1,
                })
            }
            Target::Pool(pool) => {
                let view = pool.view().await?;
                let live: Vec<_> = view
                    .iter()
                    .filter(|p| p.liveness == Liveness::Alive && !p.advert.draining)
                    .collect();
                let mut caps: Vec<u64> = live.iter().map(|p| p.advert.largest_job()).collect();
                caps.sort_unstable();
                let now = Capacity {
                    slots: live.iter().map(|p| p.advert.slots_total).sum(),
                    largest_job: caps.last().copied().unwrap_or(0),
                    largest_beside_warm: live
                        .iter()
                        .map(|p| p.advert.largest_beside_warm())
                        .max()
                        .unwrap_or(0),
                    // The median's upper neighbour: at least half hold it.
                    typical_job: caps
                        .get(caps.len().saturating_sub(1) / 2)
                        .copied()
                        .unwrap_or(0),
                    workers: live.len() as u32,
                };
                Ok(match pool.growth() {
                    // What the pool can grow to hold: a map starts (and
                    // waits) on an empty pool, and asks up to the largest
                    // worker its controller can bring.
                    Some(g) => Capacity {
                        slots: now.slots.max(1),
                        workers: now.workers.max(1),
                        largest_job: now.largest_job.max(g.largest_job),
                        largest_beside_warm: now.largest_beside_warm.max(g.largest_job),
                        typical_job: now.typical_job.max(1),
                    },
                    None => now,
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
                // The module's source even when a compiled form is cached:
                // where a job runs (a slot process for a large module) is
                // decided from its length. Left in its file, it is read
                // only if a compile needs it.
                runner.add_module_source(job.hash(), job.source().clone());
                let result = runner.run(spec, None).await;
                match result.outcome {
                    // Its slot process died under it: lost, as on a pool.
                    Outcome::Lost { reason } => Err(SubmitError::Lost {
                        peer: result.peer,
                        reason,
                        killed: true,
                    }),
                    _ => Ok(result),
                }
            }
            Target::Pool(pool) => pool.run(job, &spec, placed).await,
        }
    }
}

/// The real target of `map`.
impl Submitter for Target {
    fn in_process(&self) -> bool {
        matches!(self, Target::Embedded(_))
    }

    async fn capacity(&self) -> anyhow::Result<Capacity> {
        Target::capacity(self).await
    }

    async fn submit(
        &self,
        job: &Job,
        spec: JobSpec,
        placed: &Placed,
    ) -> Result<JobResult, SubmitError> {
        self.run_tracked(job, spec, placed).await
    }

    async fn report_backlog(&self, backlog: crate::proto::backlog::Backlog) {
        if let Target::Pool(pool) = self {
            pool.report_backlog(&backlog).await;
        }
    }

    async fn dead_workers(&self) -> Vec<String> {
        let Target::Pool(pool) = self else {
            return Vec::new();
        };
        match pool.view().await {
            Ok(view) => view
                .iter()
                .filter(|p| p.liveness == Liveness::Dead)
                .map(|p| p.advert.addr.clone())
                .collect(),
            Err(_) => Vec::new(),
        }
    }
}
