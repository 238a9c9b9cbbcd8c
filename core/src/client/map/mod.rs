//! `map`: one job module over many inputs, results in input order — the
//! peercellfun of peerwasm.
//!
//! One loop owns all the state; every submission is a task that sends its
//! answer back on a channel tagged with its attempt id. That makes the
//! rules easy to check in one place:
//!
//! * **The pool as it is now**: every [`BACKLOG_EVERY`] the map reads the
//!   pool's capacity again — workers that joined get work within a round
//!   or two, drained ones none — and reports what it still has to run to
//!   the pool ([`Backlog`]), so that demand is visible to the pool view,
//!   its metrics and `peerwasm adapt`.
//! * **Flow**: at most `max_in_flight` submissions are under way. The
//!   default is one per slot on the embedded worker (no round trip to
//!   cover); on a pool it follows Little's law: enough per slot to cover
//!   [`PIPELINE_DEPTH`] of the jobs' measured wall time (at least two, at
//!   most [`MAX_IN_FLIGHT_PER_SLOT`]), so a slot never idles during a
//!   round trip, and short jobs fill the batches `pool` sends.
//! * **Memory** (smartmem): jobs go out with the learned estimate; one that
//!   exceeds a limit *we* estimated is resubmitted with double (at least what
//!   it asked for), up to the largest the pool can take, and that does not
//!   count against `--retries`.
//! * **Lost jobs**: a broken connection, a worker the gossip declares dead,
//!   a slot process that died under its job, or a worker's shutdown: the
//!   input is resubmitted elsewhere. One lost with the process running it
//!   `max_lost` times (not counting shutdowns) is given up — it fails with
//!   outcome `lost` — so a job that kills whatever runs it cannot go round
//!   the pool for ever (Dask's `KilledWorker`).
//! * **Slow answers**: no answer within 3 × the slowest round trip seen +
//!   slack (a worker stuck without breaking its connection, or a job far
//!   longer than the others) sends *one* copy of the input elsewhere, never
//!   a second: a long job is not copied over the pool every few seconds.
//!   The first submission is not cancelled — whichever answers first is
//!   used — and when an input has its result every other submission of it
//!   is cancelled, so each input gets exactly one result and no slot keeps
//!   computing one that is done.
//! * **Failures** of the job itself stop the map (after the inputs before
//!   it are done) unless `keep_going`; they are resubmitted only up to
//!   `retries` times.
//! * **Order**: results are handed to the observer in input order; results
//!   that arrive early wait (at most `reorder_window` inputs ahead). An
//!   unordered map (`ordered: false`, Python's `imap_unordered`) hands each
//!   over as it arrives instead, and holds at most `reorder_window` inputs
//!   read but not done.
//! * **Interrupt** (`interrupt`, Ctrl-C in `peerwasm map`): no more
//!   submissions; the results already in are handed over (in input order,
//!   with a gap where a job was still under way), and every submission
//!   under way is dropped, which cancels its job on the worker (the
//!   connection waiting for it closes) or in the embedded worker.
//!
//! This file is the loop and a map's state (`MapRun`); `config.rs` its
//! knobs ([`MapConfig`]) and observer, `flow.rs` the window and the order
//! inputs go out in, `answers.rs` what each answer does, `report.rs` what a
//! map hands back ([`MapItem`], [`MapSummary`]).

mod answers;
mod config;
mod flow;
mod report;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

pub use config::{DEFAULT_MAX_LOST, MapConfig, MapObserver};
pub use report::{MapItem, MapSummary, Progress, Stopped};

use super::errors::SubmitError;
use super::estimate::MemoryEstimator;
use super::job::Job;
use super::submitter::{Placed, Submitter};
use crate::proto::backlog::{BACKLOG_EVERY, Backlog};
use crate::proto::{JobResult, MemoryRequest};
use crate::units::Bytes;

/// Runs `job` once per input (each input is the job's stdin) on `target`.
/// Results reach `observer` in input order. Returns the figures of the
/// whole map; a map stopped by a failing job returns `Ok` with
/// [`MapSummary::stopped`] set. Errors are for what no input can get past
/// (no worker, a job too large for any, the observer failing).
pub async fn map<T: Submitter, I>(
    target: &T,
    job: &Job,
    inputs: I,
    config: &MapConfig,
    observer: &mut (dyn MapObserver + Send),
) -> anyhow::Result<MapSummary>
where
    I: IntoIterator<Item = Vec<u8>>,
{
    let mut run = MapRun::start(target, job, config).await?;
    let result = run.drive(inputs.into_iter(), observer).await;
    // Nothing left: the pool stops counting this map at once.
    target
        .report_backlog(Backlog {
            id: run.id.clone(),
            ..Backlog::default()
        })
        .await;
    run.estimator.refit();
    if let (Some(store), Some(saved)) = (&config.estimates, run.estimator.to_saved())
        && let Err(e) = store.save(&job.hash(), &saved)
    {
        tracing::warn!(
            "cannot save the learned estimate in {}: {e}",
            store.dir().display()
        );
    }
    result?;
    Ok(run.finish())
}

/// Whatever ends a map — its end, an error, or its future being dropped —
/// ends the submissions it still has under way: each one's task is
/// aborted, which drops its wait for an answer, and the client hangs up on
/// the worker, which cancels the job.
impl<T: Submitter> Drop for MapRun<'_, T> {
    fn drop(&mut self) {
        for a in self.attempts.values() {
            a.abort.abort();
        }
        if let Some(r) = &self.reporting {
            r.abort();
        }
    }
}

/// What the submitter sees of an input's size before it runs: its stdin
/// bytes (a map's directories are the same for every input).
fn input_size(p: &Pending) -> u64 {
    p.stdin.len() as u64
}

/// One input that has no result yet.
struct Pending {
    stdin: Vec<u8>,
    attempts: u32,
    retries_used: u32,
    /// Times it ran out of a request we made.
    memory_retries: u32,
    /// The least the next submission asks for (after a memory retry).
    floor: MemoryRequest,
    /// The reserve its last submission ran under, if any.
    reserve: Option<MemoryRequest>,
    /// Submissions of it that are neither answered nor given up on.
    live: u32,
    /// Times it was lost with the process running it (`max_lost`).
    lost: u32,
    /// Whether a second submission of it runs because the first was slow
    /// to answer (one such copy at most: a long job is not copied again
    /// and again).
    copied: bool,
}

/// One submission under way.
struct Attempt {
    index: usize,
    placed: Arc<Placed>,
    /// Given up on as lost; its answer still counts if it comes first.
    abandoned: bool,
    abort: tokio::task::AbortHandle,
}

type Answer = (u64, Result<JobResult, SubmitError>);

/// Wall time of work kept under way per slot by default.
pub const PIPELINE_DEPTH: Duration = Duration::from_millis(20);

/// Inputs read ahead to launch the largest first, when requests follow
/// input size (`MapRun::lookahead`).
pub const LOOKAHEAD: usize = 64;

/// The most submissions kept under way per slot by default.
pub const MAX_IN_FLIGHT_PER_SLOT: usize = 128;

struct MapRun<'a, T: Submitter> {
    target: &'a T,
    job: Arc<Job>,
    config: &'a MapConfig,
    estimator: MemoryEstimator,
    slots: u32,
    /// Live workers, and the largest job any can hold, at the start.
    workers: u32,
    largest_job: u64,
    typical_job: u64,
    max_in_flight: usize,
    started: Instant,
    tx: mpsc::UnboundedSender<Answer>,
    rx: mpsc::UnboundedReceiver<Answer>,
    pending: HashMap<usize, Pending>,
    resubmit: VecDeque<usize>,
    /// Inputs read but not launched yet, in input order.
    staged: Vec<usize>,
    attempts: HashMap<u64, Attempt>,
    next_attempt: u64,
    active: usize,
    ready: BTreeMap<usize, MapItem>,
    next_emit: usize,
    slowest_round_trip: Option<Duration>,
    wall_sum_us: u128,
    /// This map's id in the pool's backlog: its submission's, or random.
    id: String,
    /// Inputs read so far.
    read: usize,
    /// When the capacity was last read again and the backlog reported.
    last_report: Option<Instant>,
    /// The backlog report under way (not awaited by the loop).
    reporting: Option<tokio::task::JoinHandle<()>>,
    total: Option<u64>,
    stop: Option<Stopped>,
    summary: MapSummary,
}

impl<'a, T: Submitter> MapRun<'a, T> {
    async fn start(
        target: &'a T,
        job: &Job,
        config: &'a MapConfig,
    ) -> anyhow::Result<MapRun<'a, T>> {
        if config.out_dir.is_some() && target.in_process() {
            anyhow::bail!(
                "--out-dir needs a pool (--peers): on the embedded worker, jobs write straight into their --dir"
            );
        }
        let capacity = target.capacity().await?;
        if capacity.workers == 0 || capacity.slots == 0 {
            anyhow::bail!("no live worker in the pool");
        }
        let given = config
            .mem
            .iter()
            .chain(config.mem_per_input.iter().flat_map(|m| m.iter()));
        if let Some(mem) = given.max_by_key(|m| m.bytes())
            && mem.bytes() > capacity.largest_job
        {
            anyhow::bail!(
                "no peer can hold a job of {mem}: the largest the pool can take is {}",
                Bytes(capacity.largest_job)
            );
        }
        let saved = config
            .start_estimate
            .clone()
            .or_else(|| config.estimates.as_ref().and_then(|s| s.load(&job.hash())));
        let mut estimator = MemoryEstimator::new(
            job.declared_memory(),
            saved.as_ref(),
            config.min_mem,
            capacity.largest_job,
            config.margin,
        );
        estimator.set_caps(capacity.largest_job, capacity.largest_beside_warm);
        let (tx, rx) = mpsc::unbounded_channel();
        Ok(MapRun {
            target,
            job: Arc::new(job.clone()),
            config,
            estimator,
            slots: capacity.slots,
            workers: capacity.workers,
            largest_job: capacity.largest_job,
            typical_job: capacity.typical_job,
            max_in_flight: config
                .max_in_flight
                .unwrap_or(2 * capacity.slots as usize)
                .max(1),
            started: Instant::now(),
            tx,
            rx,
            pending: HashMap::new(),
            resubmit: VecDeque::new(),
            staged: Vec::new(),
            attempts: HashMap::new(),
            next_attempt: 0,
            active: 0,
            ready: BTreeMap::new(),
            next_emit: config.first_index,
            slowest_round_trip: None,
            wall_sum_us: 0,
            id: config
                .submission
                .clone()
                .unwrap_or_else(|| format!("m-{:016x}", rand::random::<u64>())),
            read: 0,
            last_report: None,
            reporting: None,
            total: None,
            stop: None,
            summary: MapSummary::default(),
        })
    }

    async fn drive(
        &mut self,
        mut inputs: impl Iterator<Item = Vec<u8>>,
        observer: &mut (dyn MapObserver + Send),
    ) -> anyhow::Result<()> {
        let (lo, hi) = inputs.size_hint();
        self.total = (Some(lo) == hi).then_some(lo as u64);
        let mut next_index = self.config.first_index;
        let mut exhausted = false;
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let interrupt = self.config.interrupt.clone().unwrap_or_default();
        // One future for the whole map, not one per turn of the loop.
        let interrupted = interrupt.cancelled();
        tokio::pin!(interrupted);
        loop {
            while self.active < self.in_flight_limit() {
                // Read ahead as far as the order of launches may look.
                let lookahead = self.lookahead();
                while self.staged.len() < lookahead
                    && self.stop.is_none()
                    && !exhausted
                    && self.within_window(next_index, observer.unread())
                {
                    let Some(stdin) = inputs.next() else {
                        exhausted = true;
                        break;
                    };
                    self.pending.insert(
                        next_index,
                        Pending {
                            stdin,
                            attempts: 0,
                            retries_used: 0,
                            memory_retries: 0,
                            floor: MemoryRequest::from(0),
                            reserve: None,
                            live: 0,
                            lost: 0,
                            copied: false,
                        },
                    );
                    self.staged.push(next_index);
                    next_index += 1;
                    self.read += 1;
                }
                let index = match self.resubmit.pop_front() {
                    Some(i) => i,
                    None => match self.next_staged() {
                        Some(i) => i,
                        None => break,
                    },
                };
                self.launch(index);
            }
            if self.pending.is_empty() && (exhausted || self.stop.is_some()) {
                break;
            }
            tokio::select! {
                biased;
                () = &mut interrupted => {
                    self.summary.interrupted = true;
                    // What is in is handed over, gaps and all.
                    for (_, item) in std::mem::take(&mut self.ready) {
                        observer.result(item)?;
                    }
                    return Ok(());
                }
                Some((id, answer)) = self.rx.recv() => self.on_answer(id, answer, observer)?,
                _ = tick.tick() => {
                    self.check_lost(observer).await?;
                    self.follow_pool().await;
                    if self.last_report.is_none_or(|t| t.elapsed() >= BACKLOG_EVERY) {
                        self.report_backlog();
                    }
                }
            }
        }
        if let Some(total) = self.total.filter(|_| self.stop.is_none())
            && self.summary.jobs != total
        {
            tracing::warn!(
                results = self.summary.jobs,
                promised = total,
                "the inputs ended before their count"
            );
        }
        Ok(())
    }

    /// The request for the next submission of `index` (for the progress
    /// line, `usize::MAX`: a typical input's).
    fn request(&self, index: usize) -> MemoryRequest {
        if let Some(given) = self.given(index) {
            return given;
        }
        match self.pending.get(&index) {
            Some(p) => MemoryRequest::from(
                self.estimator
                    .clamp((self.estimator.request_for(input_size(p)).max(p.floor)).bytes()),
            ),
            None => self.estimator.request(),
        }
    }

    /// The request its submitter gave `index`: its own in
    /// `mem_per_input`, else `mem`.
    fn given(&self, index: usize) -> Option<MemoryRequest> {
        index
            .checked_sub(self.config.first_index)
            .and_then(|k| self.config.mem_per_input.as_ref()?.get(k).copied())
            .or(self.config.mem)
    }

    /// Whether this map learns its requests (neither `mem` nor
    /// `mem_per_input` given).
    fn learning(&self) -> bool {
        self.config.mem.is_none() && self.config.mem_per_input.is_none()
    }

    /// What the worker should reserve for `index` before it starts, when
    /// less than its request: the learned reserve for its size, on its
    /// first attempt only — one that ran out of memory, or out of what its
    /// worker could lend, runs again with its whole request reserved.
    fn reserve(&self, index: usize, request: MemoryRequest) -> Option<MemoryRequest> {
        let p = self.pending.get(&index)?;
        if !self.learning() || p.memory_retries > 0 {
            return None;
        }
        self.estimator
            .reserve_for(input_size(p))
            .filter(|&r| r < request)
    }

    fn launch(&mut self, index: usize) {
        let request = self.request(index);
        let reserve = self.reserve(index, request);
        let Some(p) = self.pending.get_mut(&index) else {
            return;
        };
        p.attempts += 1;
        p.live += 1;
        p.reserve = reserve;
        let mut spec = self.job.spec(p.stdin.clone(), request);
        spec.memory_reserve = reserve;
        spec.tag = Some(crate::proto::submission::JobTag {
            submission: self.config.submission.clone().unwrap_or_default(),
            index: index as u64,
            attempt: p.attempts,
        });
        let id = self.next_attempt;
        self.next_attempt += 1;
        let placed = Arc::new(Placed::default());
        let (target, job, tx, placed2) = (
            self.target.clone(),
            self.job.clone(),
            self.tx.clone(),
            placed.clone(),
        );
        let task = tokio::spawn(async move {
            // Boxed: the submission's future is kilobytes, and a spawn
            // moves what it is given several times.
            let answer = Box::pin(target.submit(&job, spec, &placed2)).await;
            let _ = tx.send((id, answer));
        });
        self.attempts.insert(
            id,
            Attempt {
                index,
                placed,
                abandoned: false,
                abort: task.abort_handle(),
            },
        );
        self.active += 1;
    }

    fn progress(&self) -> Progress {
        let done = self.summary.jobs;
        let parallel = (self.slots as usize).min(self.max_in_flight).max(1) as f64;
        let eta = self.total.filter(|_| done > 0).map(|total| {
            let mean_us = self.wall_sum_us as f64 / done as f64;
            Duration::from_micros((total.saturating_sub(done) as f64 * mean_us / parallel) as u64)
        });
        Progress {
            done,
            total: self.total,
            failed: self.summary.failed,
            retried: self.summary.retries(),
            in_flight: self.active,
            elapsed: self.started.elapsed(),
            eta,
            request: self.request(usize::MAX),
        }
    }

    fn finish(mut self) -> MapSummary {
        self.estimator.refit();
        let mut s = std::mem::take(&mut self.summary);
        s.elapsed = self.started.elapsed();
        s.peak_max = self.estimator.peak_max().unwrap_or(0);
        s.peak_mean = self.estimator.peak_mean().unwrap_or(0);
        s.started_from_saved = self.estimator.started_from_saved();
        if self.learning() && self.estimator.learned() {
            let learned = self.estimator.request();
            s.learned_request = Some(learned);
            s.learned_model = self.estimator.model();
            if learned.bytes() > self.typical_job {
                s.warnings.push(format!(
                    "the learned memory request {} is larger than most workers can take ({}): jobs will queue on the few that can",
                    learned,
                    Bytes(self.typical_job)
                ));
            }
        }
        s.stopped = self.stop.take();
        s
    }
}
