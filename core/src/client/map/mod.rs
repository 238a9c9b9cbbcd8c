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
//!   or no answer within 3 × the slowest round trip seen + slack: the input
//!   is resubmitted elsewhere. The old submission is not cancelled — if its
//!   answer comes first it is used — and whichever answer comes second is
//!   dropped, so each input gets exactly one result.
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

mod report;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use report::{MapItem, MapSummary, Progress, Stopped};

use super::errors::SubmitError;
use super::estimate::{DEFAULT_MARGIN, EstimateStore, MemoryEstimator};
use super::job::Job;
use super::submitter::{Placed, Submitter};
use crate::proto::backlog::{BACKLOG_EVERY, Backlog};
use crate::proto::{JobResult, Outcome};
use crate::units::Bytes;

/// How a map runs. `Default` gives the documented defaults.
#[derive(Clone, Debug)]
pub struct MapConfig {
    /// One fixed memory limit for every job; `None` learns it (smartmem).
    /// Default: `None`.
    pub mem: Option<u64>,
    /// Never ask for less than this. Default: 0.
    pub min_mem: u64,
    /// Margin over the largest peak seen. Default: 1.25.
    pub margin: f64,
    /// How often a failed job is resubmitted. Default: 0.
    pub retries: u32,
    /// Submissions under way at once; `None`: two per slot of the target,
    /// more for short jobs (see the module docs).
    pub max_in_flight: Option<usize>,
    /// Whether to go on after a job fails. Default: false.
    pub keep_going: bool,
    /// Added to 3 × the slowest round trip before a job counts as lost.
    /// Default: 10 s.
    pub lost_slack: Duration,
    /// How far ahead of the next result to write the map may run
    /// (unordered: how many inputs may be read and not done). Default:
    /// 10,000 inputs.
    pub reorder_window: usize,
    /// Whether results reach the observer in input order (else as they
    /// arrive). Default: true.
    pub ordered: bool,
    /// Where learned estimates are loaded from and saved to; `None` keeps
    /// them for this run only. Default: `None`.
    pub estimates: Option<EstimateStore>,
    /// Cancelling this stops the map (see the module docs); the summary
    /// then says it was interrupted. Default: none.
    pub interrupt: Option<CancellationToken>,
    /// Where files that jobs create or change in their writable
    /// directories go, each input's under `out_dir/<index>/`; `None`: into
    /// the directories themselves, as jobs finish. On a pool only (the
    /// embedded worker's jobs write straight into their directories).
    /// Default: none.
    pub out_dir: Option<std::path::PathBuf>,
    /// The index of the first input: a resumed map numbers its inputs (in
    /// results, and in the tags its jobs carry) from where it left off.
    /// Default: 0.
    pub first_index: usize,
    /// The submission this map runs for, named in every job's tag (and so
    /// in the history of the workers that run them). Default: none.
    pub submission: Option<String>,
    /// Start from this estimate instead of the saved one (a resumed map
    /// starts from the peaks of the results it already has). Default: none.
    pub start_estimate: Option<super::estimate::SavedEstimate>,
}

impl Default for MapConfig {
    fn default() -> Self {
        MapConfig {
            mem: None,
            min_mem: 0,
            margin: DEFAULT_MARGIN,
            retries: 0,
            max_in_flight: None,
            keep_going: false,
            lost_slack: Duration::from_secs(10),
            reorder_window: 10_000,
            ordered: true,
            estimates: None,
            interrupt: None,
            out_dir: None,
            first_index: 0,
            submission: None,
            start_estimate: None,
        }
    }
}

/// Receives what a map produces.
pub trait MapObserver {
    /// Each input's result: in input order, or as it arrives when the map
    /// is not `ordered`. An error stops the map.
    fn result(&mut self, item: MapItem) -> anyhow::Result<()>;
    /// After each result (in any order) and each resubmission.
    fn progress(&mut self, _progress: &Progress) {}
    /// When an input is submitted again, and why.
    fn retry(&mut self, _index: usize, _why: &str) {}
}

/// Collects the items in order: the simplest observer.
impl MapObserver for Vec<MapItem> {
    fn result(&mut self, item: MapItem) -> anyhow::Result<()> {
        self.push(item);
        Ok(())
    }
}

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
    memreq_floor: u64,
    /// Submissions of it that are neither answered nor given up on.
    live: u32,
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
        if let Some(mem) = config.mem
            && mem > capacity.largest_job
        {
            anyhow::bail!(
                "no peer can hold a job of {}: the largest the pool can take is {}",
                Bytes(mem),
                Bytes(capacity.largest_job)
            );
        }
        let saved = config
            .start_estimate
            .clone()
            .or_else(|| config.estimates.as_ref().and_then(|s| s.load(&job.hash())));
        let estimator = MemoryEstimator::new(
            job.declared_memory(),
            saved.as_ref(),
            config.min_mem,
            capacity.largest_job,
            config.margin,
        );
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
                    && self.within_window(next_index)
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
                            memreq_floor: 0,
                            live: 0,
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
                    self.check_lost(observer).await;
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

    /// Reads the pool's capacity again, every tick (a pool's view is
    /// fetched at most every `PoolConfig::view_max_age`, so most reads are
    /// answered from it): a worker that joined gets work from the next
    /// launch on — a growing pool's new members within a tick or two —
    /// one that left or drains none, placement skips it.
    async fn follow_pool(&mut self) {
        if let Ok(c) = self.target.capacity().await
            && c.workers > 0
            && c.slots > 0
        {
            self.slots = c.slots;
            self.workers = c.workers;
            self.largest_job = c.largest_job;
            self.typical_job = c.typical_job;
            self.estimator.set_cap(c.largest_job);
            if self.config.max_in_flight.is_none() {
                self.max_in_flight = 2 * c.slots as usize;
            }
        }
    }

    /// Reports the backlog to the pool, without waiting for the report (a
    /// slow worker must not stall the map).
    fn report_backlog(&mut self) {
        self.last_report = Some(Instant::now());
        if self.reporting.as_ref().is_none_or(|r| r.is_finished()) {
            let (target, backlog) = (self.target.clone(), self.backlog());
            self.reporting = Some(tokio::spawn(
                async move { target.report_backlog(backlog).await },
            ));
        }
    }

    /// What this map still has to run, as the pool is told it.
    fn backlog(&self) -> Backlog {
        let unread = self.total.map_or(0, |t| t.saturating_sub(self.read as u64));
        let waiting: Vec<usize> = self
            .pending
            .iter()
            .filter(|(_, p)| p.live == 0)
            .map(|(i, _)| *i)
            .collect();
        let memory = self.memreq(usize::MAX);
        let largest = waiting
            .iter()
            .map(|&i| self.memreq(i))
            .max()
            .unwrap_or(0)
            .max(memory);
        Backlog {
            id: self.id.clone(),
            waiting: waiting.len() as u64 + unread,
            running: self.active as u64,
            memory_bytes: memory,
            largest_bytes: largest,
            job_ms: if self.summary.jobs == 0 {
                0
            } else {
                (self.wall_sum_us / self.summary.jobs as u128 / 1000) as u64
            },
        }
    }

    /// How many submissions may be under way: `--max-in-flight`, else
    /// enough to keep [`PIPELINE_DEPTH`] of work per slot under way once
    /// job times are known (two per slot before; before anything of the
    /// jobs' memory is known, as many as the pool can run at the starting
    /// request).
    fn in_flight_limit(&self) -> usize {
        if self.config.max_in_flight.is_some() {
            return self.max_in_flight;
        }
        if self.target.in_process() {
            // No round trip to cover: one submission per slot. Then the
            // embedded worker never queues one, and inputs start in input
            // order — queued submissions race to its slots, and a later,
            // slow one could take a slot before an earlier one, holding
            // back an ordered map's first result.
            return self.slots.max(1) as usize;
        }
        if self.config.mem.is_none()
            && !self.estimator.learned()
            && self.estimator.model().is_none()
        {
            // Nothing learned yet: every job goes out at the starting
            // request (1 GiB, capped by the pool). More in flight than the
            // pool can run at that request only queues jobs that have
            // already asked for too much; the first results set the rest.
            let fit_at_start = (self.largest_job / self.estimator.memreq().max(1)).max(1);
            return (self.workers as u64 * fit_at_start).min(2 * self.slots.max(1) as u64) as usize;
        }
        let per_slot = if self.summary.jobs == 0 {
            2
        } else {
            let mean_us = (self.wall_sum_us / self.summary.jobs as u128).max(1);
            (PIPELINE_DEPTH.as_micros() / mean_us).clamp(2, MAX_IN_FLIGHT_PER_SLOT as u128) as usize
        };
        per_slot * self.slots.max(1) as usize
    }

    /// How many inputs read but not launched the next launch chooses
    /// from: with a model that sizes requests by input, enough to launch
    /// the largest first (longest-processing-time first: a large job
    /// started last holds the map's end while it waits for room); else one
    /// (input order).
    fn lookahead(&self) -> usize {
        match (self.config.mem, self.estimator.model()) {
            (None, Some(crate::client::estimate::Model::BySize { .. })) => LOOKAHEAD,
            _ => 1,
        }
    }

    /// The staged input to launch next: the one asking for most (see
    /// [`lookahead`](Self::lookahead)), ties to the earliest.
    fn next_staged(&mut self) -> Option<usize> {
        let at = (0..self.staged.len()).max_by_key(|&k| {
            let i = self.staged[k];
            let asks = self
                .pending
                .get(&i)
                .map_or(0, |p| self.estimator.memreq_for(input_size(p)));
            (asks, std::cmp::Reverse(i))
        })?;
        Some(self.staged.remove(at))
    }

    /// The request for the next submission of `index` (for the progress
    /// line, `usize::MAX`: a typical input's).
    fn memreq(&self, index: usize) -> u64 {
        match (self.config.mem, self.pending.get(&index)) {
            (Some(mem), _) => mem,
            (None, Some(p)) => self
                .estimator
                .clamp(self.estimator.memreq_for(input_size(p)).max(p.memreq_floor)),
            (None, None) => self.estimator.memreq(),
        }
    }

    fn launch(&mut self, index: usize) {
        let memreq = self.memreq(index);
        let Some(p) = self.pending.get_mut(&index) else {
            return;
        };
        p.attempts += 1;
        p.live += 1;
        let mut spec = self.job.spec(p.stdin.clone(), memreq);
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

    fn on_answer(
        &mut self,
        id: u64,
        answer: Result<JobResult, SubmitError>,
        observer: &mut (dyn MapObserver + Send),
    ) -> anyhow::Result<()> {
        let Some(attempt) = self.attempts.remove(&id) else {
            return Ok(());
        };
        if !attempt.abandoned {
            self.active -= 1;
        }
        let index = attempt.index;
        let Some(p) = self.pending.get_mut(&index) else {
            // This input already has its result (or the map stopped before it).
            self.summary.late_answers += 1;
            return Ok(());
        };
        if !attempt.abandoned {
            p.live -= 1;
        }
        let result = match answer {
            Ok(result) => result,
            Err(SubmitError::Lost { peer, reason }) => {
                if !attempt.abandoned {
                    self.summary.lost += 1;
                    observer.retry(index, &format!("lost with worker {peer}: {reason}"));
                    if p.live == 0 {
                        self.resubmit.push_front(index);
                    }
                }
                return Ok(());
            }
            Err(SubmitError::Fatal(why)) => anyhow::bail!("{why}"),
        };
        if let Some((_, sent)) = attempt.placed.get() {
            let rt = sent.elapsed();
            self.slowest_round_trip = Some(self.slowest_round_trip.map_or(rt, |s| s.max(rt)));
        }
        let ceiling = self.estimator.ceiling();
        let retry = match &result.outcome {
            Outcome::MemoryLimitExceeded {
                limit, requested, ..
            } if self.config.mem.is_none() && *limit < ceiling => {
                let outgrown = crate::client::estimate::Outgrown {
                    limit: *limit,
                    requested: *requested,
                    first: p.memory_retries == 0,
                };
                p.memory_retries += 1;
                p.memreq_floor = self.estimator.retry(input_size(p), outgrown);
                self.summary.memory_retries += 1;
                Some(format!(
                    "{}; again with {}",
                    result.outcome,
                    Bytes(p.memreq_floor)
                ))
            }
            outcome if !outcome.is_success() && p.retries_used < self.config.retries => {
                p.retries_used += 1;
                self.summary.failure_retries += 1;
                Some(format!(
                    "{outcome}; retry {} of {}",
                    p.retries_used, self.config.retries
                ))
            }
            _ => None,
        };
        if let Some(why) = retry {
            // A peak cut short by the limit says only "more": not learned.
            if result.peak_memory_bytes > 0
                && !matches!(result.outcome, Outcome::MemoryLimitExceeded { .. })
            {
                self.estimator
                    .observe(input_size(p), result.peak_memory_bytes);
            }
            observer.retry(index, &why);
            if p.live == 0 {
                self.resubmit.push_front(index);
            }
            return Ok(());
        }
        self.complete(index, result, observer)
    }

    fn complete(
        &mut self,
        index: usize,
        mut result: JobResult,
        observer: &mut (dyn MapObserver + Send),
    ) -> anyhow::Result<()> {
        let Some(p) = self.pending.remove(&index) else {
            return Ok(());
        };
        if !result.files.is_empty() {
            // Small (a worker sends back at most --max-files-back), so
            // written here, as each job ends.
            let out = self
                .config
                .out_dir
                .as_ref()
                .map(|o| o.join(index.to_string()));
            super::tree::write_back(&self.job.dirs, &mut result.files, out.as_deref()).map_err(
                |e| anyhow::anyhow!("input {index}: cannot write the files it made: {e:#}"),
            )?;
        }
        let s = &mut self.summary;
        s.jobs += 1;
        s.cpu_time += Duration::from_micros(result.cpu_time_us);
        *s.per_peer.entry(result.peer.clone()).or_default() += 1;
        s.warned += u64::from(!result.warnings.is_empty());
        self.wall_sum_us += result.wall_time_us as u128;
        if (result.peak_memory_bytes > 0 || result.outcome.is_success())
            && !matches!(result.outcome, Outcome::MemoryLimitExceeded { .. })
        {
            self.estimator
                .observe(input_size(&p), result.peak_memory_bytes);
        }
        let item = MapItem {
            index,
            result,
            attempts: p.attempts,
        };
        if !item.succeeded() {
            s.failed += 1;
            if !self.config.keep_going && self.stop.as_ref().is_none_or(|st| index < st.index) {
                self.stop = Some(Stopped {
                    index,
                    message: item.failure_message(),
                });
                self.cut_after(index);
            }
        }
        if !self.config.ordered {
            // As it arrives; past a stop, only what the stop lets through.
            if self.stop.as_ref().is_none_or(|st| index <= st.index) {
                observer.result(item)?;
            }
            observer.progress(&self.progress());
            return Ok(());
        }
        self.ready.insert(index, item);
        while let Some(item) = self.ready.remove(&self.next_emit) {
            if self.stop.as_ref().is_some_and(|st| item.index > st.index) {
                break;
            }
            observer.result(item)?;
            self.next_emit += 1;
        }
        observer.progress(&self.progress());
        Ok(())
    }

    /// Whether input `next_index` may be read: ordered, it lies within
    /// `reorder_window` of the next result to hand over; unordered, fewer
    /// than `reorder_window` inputs are read and not done.
    fn within_window(&self, next_index: usize) -> bool {
        if self.config.ordered {
            next_index < self.next_emit + self.config.reorder_window
        } else {
            self.pending.len() < self.config.reorder_window
        }
    }

    /// After a failure at `index` stops the map: nothing after it runs on.
    fn cut_after(&mut self, index: usize) {
        self.pending.retain(|&i, _| i <= index);
        self.resubmit.retain(|&i| i <= index);
        self.staged.retain(|&i| i <= index);
        self.ready.retain(|&i, _| i <= index);
        for a in self
            .attempts
            .values_mut()
            .filter(|a| a.index > index && !a.abandoned)
        {
            a.abort.abort();
            a.abandoned = true;
            self.active -= 1;
        }
    }

    /// Gives up on submissions whose worker the pool calls dead, or that
    /// are far slower than any answer so far; their inputs go out again.
    async fn check_lost(&mut self, observer: &mut (dyn MapObserver + Send)) {
        if self.attempts.is_empty() {
            return;
        }
        let dead = self.target.dead_workers().await;
        let deadline = self
            .slowest_round_trip
            .map(|rt| 3 * rt + self.config.lost_slack);
        let mut lost = Vec::new();
        for (id, a) in &self.attempts {
            if a.abandoned {
                continue;
            }
            let Some((peer, sent)) = a.placed.get() else {
                continue;
            };
            if dead.contains(&peer) {
                lost.push((*id, format!("worker {peer} was declared dead")));
            } else if deadline.is_some_and(|d| sent.elapsed() > d) {
                lost.push((
                    *id,
                    format!(
                        "no answer from {peer} in {:.1} s",
                        sent.elapsed().as_secs_f64()
                    ),
                ));
            }
        }
        for (id, why) in lost {
            let Some(a) = self.attempts.get_mut(&id) else {
                continue;
            };
            a.abandoned = true;
            self.active -= 1;
            let index = a.index;
            if let Some(p) = self.pending.get_mut(&index) {
                p.live -= 1;
                self.summary.lost += 1;
                observer.retry(index, &why);
                if p.live == 0 {
                    self.resubmit.push_back(index);
                }
            }
        }
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
            memreq: self.memreq(usize::MAX),
        }
    }

    fn finish(mut self) -> MapSummary {
        self.estimator.refit();
        let mut s = std::mem::take(&mut self.summary);
        s.elapsed = self.started.elapsed();
        s.peak_max = self.estimator.peak_max().unwrap_or(0);
        s.peak_mean = self.estimator.peak_mean().unwrap_or(0);
        s.started_from_saved = self.estimator.started_from_saved();
        if self.config.mem.is_none() && self.estimator.learned() {
            let learned = self.estimator.memreq();
            s.learned_memreq = Some(learned);
            s.learned_model = self.estimator.model();
            if learned > self.typical_job {
                s.warnings.push(format!(
                    "the learned memory request {} is larger than most workers can take ({}): jobs will queue on the few that can",
                    Bytes(learned),
                    Bytes(self.typical_job)
                ));
            }
        }
        s.stopped = self.stop.take();
        s
    }
}
