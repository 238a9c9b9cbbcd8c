//! `peerwasm adapt`: a controller that keeps a pool's size matched to its
//! backlog by submitting and cancelling one-worker batch jobs.
//!
//! * `policy` — the decisions, pure: target, capacity coming, up at once
//!   and down after an idle period, memory-shaped workers;
//! * `slurm` — the batch-system seam ([`BatchSystem`]) and Slurm behind it;
//! * `status` — its figures for Prometheus (`--metrics`); what it is doing
//!   travels in its notice (`server::controller`).
//!
//! This file is the loop: every poll it reads the pool view (the maps'
//! backlog, the workers and which batch job lends each) and the batch
//! jobs it submitted, asks the policy, and carries the decision out,
//! saying each one in a line. Ctrl-C or SIGTERM cancels what it submitted,
//! and nothing else.

pub mod policy;
pub mod slurm;
pub mod status;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::client::Pool;
use crate::gossip::{Liveness, PeerView};
use crate::proto::backlog::PoolBacklog;
pub use crate::server::controller::ControllerStatus;
pub use policy::{Decision, Policy, PoolWorker, Shape};
pub use slurm::{BatchJob, BatchSystem, Slurm};

/// How the controller runs.
#[derive(Clone, Debug)]
pub struct AdaptConfig {
    /// How the pool is sized.
    pub policy: Policy,
    /// How often it looks. Default: 1 s.
    pub poll: Duration,
    /// A batch job running this long without its worker in the pool is
    /// said to be stuck. Default: 60 s.
    pub join_patience: Duration,
}

impl Default for AdaptConfig {
    fn default() -> Self {
        AdaptConfig {
            policy: Policy::default(),
            poll: Duration::from_secs(1),
            join_patience: Duration::from_secs(60),
        }
    }
}

/// What the controller did, when it stops.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AdaptSummary {
    /// Batch jobs submitted.
    pub submitted: u64,
    /// Batch jobs it cancelled (idle workers, unneeded pending jobs, and
    /// all of its own when it stopped).
    pub cancelled: u64,
    /// Of those, jobs whose worker never ran a job.
    pub cancelled_unused: u64,
    /// Submissions the batch system refused.
    pub refused: u64,
}

/// Where the controller reads the pool view: the workers named, or the
/// members a pool directory lists now (the pool may start empty, and its
/// members come and go).
pub struct PoolSource {
    seeds: Box<dyn Fn() -> Vec<String> + Send>,
    make: Box<dyn Fn(Vec<String>) -> anyhow::Result<Pool> + Send>,
    current: Option<(Vec<String>, Arc<Pool>)>,
    /// Backlogs told to the controller directly (a pool directory's
    /// `backlog/`): how it hears of work while the pool has no worker.
    direct: Box<dyn Fn() -> Vec<crate::proto::backlog::Backlog> + Send>,
}

impl PoolSource {
    /// A view through the seeds `seeds` gives at each poll, through a pool
    /// `make` builds for them (again when they change).
    pub fn new(
        seeds: impl Fn() -> Vec<String> + Send + 'static,
        make: impl Fn(Vec<String>) -> anyhow::Result<Pool> + Send + 'static,
    ) -> PoolSource {
        PoolSource {
            seeds: Box::new(seeds),
            make: Box::new(make),
            current: None,
            direct: Box::new(Vec::new),
        }
    }

    /// Also counts the backlogs `direct` gives at each poll (maps that
    /// tell the controller directly, as well as through the workers).
    pub fn with_direct_backlogs(
        mut self,
        direct: impl Fn() -> Vec<crate::proto::backlog::Backlog> + Send + 'static,
    ) -> PoolSource {
        self.direct = Box::new(direct);
        self
    }

    /// The pool view now (empty when no worker answers: a pool of none).
    async fn view(&mut self) -> Vec<PeerView> {
        let seeds = (self.seeds)();
        let stale = self.current.as_ref().is_none_or(|(s, _)| *s != seeds);
        if stale && !seeds.is_empty() {
            match (self.make)(seeds.clone()) {
                Ok(pool) => self.current = Some((seeds, Arc::new(pool))),
                Err(e) => tracing::warn!("cannot reach the pool: {e:#}"),
            }
        }
        let Some((_, pool)) = &self.current else {
            return Vec::new();
        };
        pool.view().await.unwrap_or_else(|e| {
            tracing::debug!("no pool view this poll: {e:#}");
            Vec::new()
        })
    }
}

/// One batch job of the controller's.
struct Mine {
    submitted: Instant,
    /// What it was asked with.
    shape: Shape,
    /// Its worker's address once it joined the pool.
    worker: Option<String>,
    /// Whether its worker ever ran a job.
    worked: bool,
    cancelling: bool,
    said_stuck: bool,
}

/// Runs the controller until `stop` is cancelled; then cancels every batch
/// job it submitted. Each poll's figures and decisions go to `status`.
pub async fn run(
    config: AdaptConfig,
    mut pool: PoolSource,
    batch: Arc<dyn BatchSystem>,
    stop: CancellationToken,
    status: tokio::sync::watch::Sender<ControllerStatus>,
    mut on_decision: impl FnMut(&Decision) + Send,
) -> anyhow::Result<AdaptSummary> {
    let mut mine: HashMap<String, Mine> = HashMap::new();
    let mut memory = policy::Memory::default();
    let mut summary = AdaptSummary::default();
    let mut backoff = Duration::from_secs(1);
    let mut submit_after = Instant::now();
    let started = Instant::now();
    let mut every = tokio::time::interval(config.poll);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            _ = every.tick() => {}
        }
        let view = pool.view().await;
        let live: Vec<&PeerView> = view
            .iter()
            .filter(|p| p.liveness == Liveness::Alive && !p.advert.draining)
            .collect();
        let direct = (pool.direct)();
        let backlog = PoolBacklog::sum(
            direct
                .iter()
                .chain(live.iter().flat_map(|p| p.advert.backlog.iter())),
        );
        let known = match tokio::task::block_in_place(|| batch.jobs()) {
            Ok(jobs) => jobs,
            Err(e) => {
                tracing::warn!("cannot list the batch jobs: {e:#}");
                continue;
            }
        };
        forget_ended(&mut mine, &known);
        // Waiting for what never comes is not capacity coming: cancelled,
        // counted as refused, and submissions back off as after a refusal.
        for job in &known {
            let Some(m) = mine.get_mut(&job.id).filter(|m| !m.cancelling) else {
                continue;
            };
            let Some(why) = batch.never_starts(job) else {
                continue;
            };
            let why = format!(
                "batch job {}: {why}: cancelling it; asking again in {}",
                job.id,
                humantime::format_duration(backoff)
            );
            tracing::error!("{why}");
            status.send_modify(|s| s.said(&why));
            if let Err(e) = tokio::task::block_in_place(|| batch.cancel(&job.id)) {
                tracing::warn!(batch_job = %job.id, "cannot cancel: {e:#}");
                continue;
            }
            m.cancelling = true;
            summary.refused += 1;
            submit_after = Instant::now() + backoff;
            backoff = (backoff * 2).min(Duration::from_secs(60));
        }
        let mut workers = Vec::new();
        for p in &live {
            let Some(job) = p.advert.batch_job.as_ref() else {
                continue;
            };
            let Some(m) = mine.get_mut(job) else { continue };
            if m.worker.is_none() {
                // A worker came all the way: what went wrong before (a
                // refusal, a job that never starts) is behind us.
                backoff = Duration::from_secs(1);
            }
            m.worker = Some(p.advert.addr.clone());
            m.worked |= p.advert.jobs_run > 0 || p.advert.slots_busy > 0;
            if m.cancelling {
                continue;
            }
            workers.push(PoolWorker {
                addr: p.advert.addr.clone(),
                batch_job: job.clone(),
                busy: p.advert.slots_busy > 0 || p.advert.queue_len > 0 || p.advert.owned_maps > 0,
                idle_ms: p.advert.idle_ms.unwrap_or(0),
                largest_job: p.advert.largest_job(),
            });
        }
        let in_pool: std::collections::HashSet<&str> =
            workers.iter().map(|w| w.batch_job.as_str()).collect();
        let pending: Vec<String> = mine
            .iter()
            .filter(|(id, m)| !m.cancelling && !in_pool.contains(id.as_str()))
            .map(|(id, _)| id.clone())
            .collect();
        let coming_largest = pending
            .iter()
            .filter_map(|id| mine.get(id))
            .map(|m| config.policy.largest_job_of(&m.shape))
            .max()
            .unwrap_or(0);
        say_stuck(&mut mine, &known, config.join_patience);
        let now_ms = started.elapsed().as_millis() as u64;
        let mut decision = config.policy.decide(
            &backlog,
            &workers,
            &pending,
            coming_largest,
            &mut memory,
            now_ms,
        );
        if Instant::now() < submit_after && !decision.submit.is_empty() {
            // Backing off after a refusal: said when it asks again.
            decision.submit.clear();
            if decision.cancel.is_empty() {
                decision.why.clear();
            }
        }
        if !decision.why.is_empty() {
            tracing::info!("{}", decision.why);
            on_decision(&decision);
        }
        status.send_if_modified(|s| {
            let before = s.clone();
            s.target = decision.target;
            s.workers = workers.len() as u32;
            s.pending = pending.len() as u32;
            s.backlog_jobs = backlog.jobs();
            if !decision.why.is_empty() {
                s.said(&decision.why);
            }
            *s != before
        });
        for shape in &decision.submit {
            match tokio::task::block_in_place(|| batch.submit(shape)) {
                Ok(id) => {
                    tracing::info!(batch_job = %id, "submitted a worker job");
                    summary.submitted += 1;
                    mine.insert(
                        id,
                        Mine {
                            submitted: Instant::now(),
                            shape: *shape,
                            worker: None,
                            worked: false,
                            cancelling: false,
                            said_stuck: false,
                        },
                    );
                }
                Err(e) => {
                    summary.refused += 1;
                    tracing::error!(
                        "{e:#}; trying again in {}",
                        humantime::format_duration(backoff)
                    );
                    submit_after = Instant::now() + backoff;
                    backoff = (backoff * 2).min(Duration::from_secs(60));
                    break;
                }
            }
        }
        for id in &decision.cancel {
            cancel(batch.as_ref(), &mut mine, id, &mut summary);
        }
        status.send_if_modified(|s| {
            let before = s.clone();
            s.submitted = summary.submitted;
            s.cancelled = summary.cancelled;
            s.cancelled_unused = summary.cancelled_unused;
            s.refused = summary.refused;
            *s != before
        });
    }
    let ids: Vec<String> = mine
        .iter()
        .filter(|(_, m)| !m.cancelling)
        .map(|(id, _)| id.clone())
        .collect();
    if !ids.is_empty() {
        tracing::info!(
            jobs = ids.len(),
            "stopping: cancelling the worker jobs this controller submitted"
        );
    }
    for id in ids {
        cancel(batch.as_ref(), &mut mine, &id, &mut summary);
    }
    Ok(summary)
}

fn cancel(
    batch: &dyn BatchSystem,
    mine: &mut HashMap<String, Mine>,
    id: &str,
    summary: &mut AdaptSummary,
) {
    match tokio::task::block_in_place(|| batch.cancel(id)) {
        Ok(()) => {
            summary.cancelled += 1;
            if let Some(m) = mine.get_mut(id) {
                m.cancelling = true;
                summary.cancelled_unused += u64::from(!m.worked);
            }
        }
        Err(e) => tracing::warn!(batch_job = id, "cannot cancel: {e:#}"),
    }
}

/// Batch jobs the system no longer knows have ended: said if that was not
/// the controller's doing (refused at start, killed, out of memory, past
/// their walltime); their jobs are rerun by the maps that sent them.
fn forget_ended(mine: &mut HashMap<String, Mine>, known: &[BatchJob]) {
    mine.retain(|id, m| {
        let alive = known.iter().any(|j| &j.id == id);
        if !alive && !m.cancelling {
            match &m.worker {
                Some(addr) => tracing::warn!(
                    batch_job = %id, worker = %addr,
                    "the batch job ended by itself (killed, out of memory, preempted or past its time): \
                     the jobs it ran are run again elsewhere by their maps"
                ),
                None => tracing::warn!(
                    batch_job = %id,
                    "the batch job ended before its worker joined the pool (it failed to start: see its output \
                     file, e.g. slurm-{id}.out)"
                ),
            }
        }
        alive
    });
}

/// Says, once, of a batch job that is running without its worker in the
/// pool for `patience`, or pending for that long, why.
fn say_stuck(mine: &mut HashMap<String, Mine>, known: &[BatchJob], patience: Duration) {
    for (id, m) in mine
        .iter_mut()
        .filter(|(_, m)| m.worker.is_none() && !m.said_stuck && !m.cancelling)
    {
        if m.submitted.elapsed() < patience {
            continue;
        }
        m.said_stuck = true;
        let job = known.iter().find(|j| &j.id == id);
        match job {
            Some(j) if j.state == "PENDING" => tracing::warn!(
                batch_job = %id,
                "pending for {} ({}): it counts as capacity coming, so no other job is asked for in its place",
                humantime::format_duration(Duration::from_secs(m.submitted.elapsed().as_secs())),
                j.reason
            ),
            _ => tracing::warn!(
                batch_job = %id,
                "running for {} but its worker is not in the pool: can it reach the pool (--pool-dir shared, the \
                 network between nodes)? See its output file",
                humantime::format_duration(Duration::from_secs(m.submitted.elapsed().as_secs()))
            ),
        }
    }
}
