//! The controller's decisions, without a batch system or a clock of its
//! own: given the pool as it is (its workers, its backlog) and the batch
//! jobs the controller has submitted, how many workers to ask for, of
//! what shape, and which to let go. Pure, so that every rule is a unit
//! test on simulated time.
//!
//! * **Target** (as dask's `adapt`): the work left — each map's jobs ×
//!   their mean time, learned by smartmem — over `target_duration`, in
//!   workers of `slots` slots; never more workers than there are jobs to
//!   fill them; within `min..=max`.
//! * **Capacity** counts the workers of the controller's batch jobs that
//!   are in the pool, *and* the jobs still pending: capacity coming. So a
//!   slow queue never makes it submit again (dask-jobqueue's loop).
//! * **Up at once, down slowly**: it asks for the missing workers as soon
//!   as the target is above capacity; it lets a worker go only when the
//!   target has been below capacity for `idle_for`, and only a worker that
//!   has had nothing to do (no job running or queued, no detached map it
//!   owns) for that long. Never below `min`.
//! * **Memory-shaped** (★): a worker's slots hold the typical job of the
//!   map with the most work (no more slots than jobs wait); of the workers
//!   asked for at once, the first holds in one of its slots the largest
//!   job still waiting that no worker of the pool (or coming) could hold —
//!   never more than the backlog needs: a heavy tail gets one large worker,
//!   not a pool of them, whose other slots run small jobs beside it.

use std::collections::HashMap;
use std::time::Duration;

use crate::proto::backlog::PoolBacklog;

/// How the controller sizes the pool.
#[derive(Clone, Debug)]
pub struct Policy {
    /// Fewest workers kept (`--min`). Default: 0.
    pub min: u32,
    /// Most workers (`--max`). Default: 8.
    pub max: u32,
    /// Slots of each worker asked for (`--slots`). Default: 1.
    pub slots: u32,
    /// The backlog's work is to take about this long (`--target-duration`).
    /// Default: 5 s (dask's).
    pub target_duration: Duration,
    /// A job's time before any job of its map has ended. Default: 1 s.
    pub unknown_job_time: Duration,
    /// How long a worker must have had nothing to do, and the target been
    /// below capacity, before it is let go (`--idle`). Default: 10 s.
    pub idle_for: Duration,
    /// Memory a worker needs besides its jobs' limits and the native
    /// memory reserved beside each (`sandbox::JOB_NATIVE_BYTES`): the
    /// process, compiles (the worker is told to keep it). Default: 64 MiB.
    pub overhead_bytes: u64,
    /// The least and most memory one worker is asked with (`--min-mem`,
    /// `--max-mem`: a node's size). Default: 256 MiB and 64 GiB.
    pub min_worker_bytes: u64,
    pub max_worker_bytes: u64,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            min: 0,
            max: 8,
            slots: 1,
            target_duration: Duration::from_secs(5),
            unknown_job_time: Duration::from_secs(1),
            idle_for: Duration::from_secs(10),
            overhead_bytes: 64 << 20,
            min_worker_bytes: 256 << 20,
            max_worker_bytes: 64 << 30,
        }
    }
}

/// A worker of the controller's in the pool, as its advert shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolWorker {
    pub addr: String,
    /// The batch job lending it.
    pub batch_job: String,
    /// Whether it has anything to do: a job running or queued, or a
    /// detached map it owns.
    pub busy: bool,
    /// The largest job it can hold.
    pub largest_job: u64,
    /// How long it had had nothing to do when its advert was made (0 if
    /// busy, or not said): its idle clock starts that much earlier than
    /// the controller first sees it idle, since adverts reach the
    /// controller through a gossip round or two.
    pub idle_ms: u64,
}

/// What the controller asks a batch system for: one worker of this shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub slots: u32,
    /// Memory for the whole worker (its jobs and its overhead).
    pub memory_bytes: u64,
}

/// One poll's decision, with why.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Decision {
    /// Workers to ask for.
    pub submit: Vec<Shape>,
    /// Batch jobs to end (idle workers, or pending ones no longer needed).
    pub cancel: Vec<String>,
    /// Why, in words (empty when nothing changes).
    pub why: String,
    /// The target it computed, in workers.
    pub target: u32,
}

/// The controller's memory between polls: since when each worker has been
/// idle, since when the target has been below capacity (in the caller's
/// clock, milliseconds).
#[derive(Clone, Debug, Default)]
pub struct Memory {
    idle_since: HashMap<String, u64>,
    below_since: Option<u64>,
}

impl Policy {
    /// The workers the backlog asks for, within `min..=max`.
    pub fn target(&self, backlog: &PoolBacklog) -> u32 {
        let slots = f64::from(self.slots.max(1));
        let work = self.work_seconds(backlog);
        let by_work = (work / self.target_duration.as_secs_f64().max(0.001) / slots).ceil();
        let by_jobs = (backlog.jobs() as f64 / slots).ceil();
        (by_work.min(by_jobs) as u32).clamp(self.min, self.max.max(self.min))
    }

    /// The backlog's work in slot-seconds: each map's jobs × their mean
    /// time, or `unknown_job_time` before any of its jobs has ended.
    pub fn work_seconds(&self, backlog: &PoolBacklog) -> f64 {
        let unknown = self.unknown_job_time.as_secs_f64();
        backlog
            .reports
            .iter()
            .map(|b| {
                (b.waiting + b.running) as f64
                    * if b.job_ms == 0 {
                        unknown
                    } else {
                        b.job_ms as f64 / 1000.0
                    }
            })
            // Not `sum()`: an empty f64 sum is -0.0, said as "~-0 slot-s".
            .fold(0.0, |a, b| a + b)
    }

    /// The shape of a worker for the backlog as it is, given the largest
    /// job any worker of the pool (or coming) can hold.
    ///
    /// Its slots hold the typical job of the map with the most work — no
    /// more slots than jobs wait. A job larger than the pool holds takes
    /// a slot of its own: one slot when it is its map's tail (its typical
    /// job is smaller), every slot when the map's jobs are all that large.
    /// So a heavy tail gets one worker that holds one large job beside its
    /// other slots' small ones, not slots × the largest.
    pub fn shape(&self, backlog: &PoolBacklog, pool_largest: u64) -> Shape {
        let native = crate::sandbox::JOB_NATIVE_BYTES;
        let waiting = backlog.reports.iter().filter(|b| b.waiting > 0);
        let slots = match backlog.waiting {
            0 => u64::from(self.slots.max(1)),
            waiting => u64::from(self.slots.max(1)).min(waiting),
        };
        let typical = waiting
            .clone()
            .max_by_key(|b| (b.waiting + b.running).saturating_mul(b.job_ms.max(1)))
            .map_or(0, |b| b.memory_bytes);
        let mut jobs = typical.saturating_add(native).saturating_mul(slots);
        // A job nobody can hold (waiting, or under way waiting for a
        // worker): the worker holds it too.
        if let Some(b) = unheld(backlog, pool_largest) {
            let of_them = if b.memory_bytes < b.largest_bytes {
                1
            } else {
                slots.min(b.waiting).max(1)
            };
            // Its other slots keep their typical jobs: a slot beside a
            // large job that no small one fits would be a core held idle.
            let large = b
                .largest_bytes
                .saturating_add(native)
                .saturating_mul(of_them);
            let beside = typical
                .saturating_add(native)
                .saturating_mul(slots - of_them);
            jobs = jobs.max(large.saturating_add(beside));
        }
        let memory = jobs.saturating_add(self.overhead_bytes).clamp(
            self.min_worker_bytes,
            self.max_worker_bytes.max(self.min_worker_bytes),
        );
        Shape {
            slots: slots as u32,
            memory_bytes: round_up_mib(memory),
        }
    }

    /// The largest job a worker of `shape` holds alone (what
    /// [`Policy::shape`] sized it for at the least).
    pub fn largest_job_of(&self, shape: &Shape) -> u64 {
        shape
            .memory_bytes
            .saturating_sub(self.overhead_bytes)
            .saturating_sub(crate::sandbox::JOB_NATIVE_BYTES)
    }

    /// One poll at `now_ms`: `workers` are the controller's workers in the
    /// pool, `pending` its batch jobs not (yet) in the pool, of which the
    /// largest holds jobs of up to `coming_largest`.
    pub fn decide(
        &self,
        backlog: &PoolBacklog,
        workers: &[PoolWorker],
        pending: &[String],
        coming_largest: u64,
        memory: &mut Memory,
        now_ms: u64,
    ) -> Decision {
        let target = self.target(backlog);
        let capacity = (workers.len() + pending.len()) as u32;
        // Who has been idle since when.
        memory
            .idle_since
            .retain(|addr, _| workers.iter().any(|w| &w.addr == addr && !w.busy));
        for w in workers.iter().filter(|w| !w.busy) {
            let since = now_ms.saturating_sub(w.idle_ms);
            memory
                .idle_since
                .entry(w.addr.clone())
                .and_modify(|t| *t = (*t).min(since))
                .or_insert(since);
        }
        let largest = workers
            .iter()
            .map(|w| w.largest_job)
            .max()
            .unwrap_or(0)
            .max(coming_largest);
        if target > capacity {
            memory.below_since = None;
            // One worker for the largest job nobody holds (if any), the
            // others for the typical job.
            let first = self.shape(backlog, largest);
            let shape = self.shape(backlog, u64::MAX);
            let n = target - capacity;
            let mut submit = vec![first];
            submit.extend(std::iter::repeat_n(shape, n as usize - 1));
            let why = if backlog.jobs() == 0 {
                format!(
                    "growing by {n} to --min {}: the pool has {} and {} coming; each asked with {}",
                    self.min,
                    workers.len(),
                    pending.len(),
                    crate::units::Bytes(shape.memory_bytes),
                )
            } else {
                format!(
                    "growing by {n}: {} jobs to run (~{:.0} slot-s of work) want {target} worker{} of {} slot{}, \
                     the pool has {} and {} coming; {}",
                    backlog.jobs(),
                    self.work_seconds(backlog),
                    plural(target),
                    shape.slots,
                    plural(shape.slots),
                    workers.len(),
                    pending.len(),
                    if first == shape {
                        format!(
                            "each asked with {} for jobs of up to {}",
                            crate::units::Bytes(shape.memory_bytes),
                            crate::units::Bytes(self.largest_job_of(&shape))
                        )
                    } else {
                        format!(
                            "one asked with {} for jobs of up to {} (none holds them), {} with {} for jobs of up to {}",
                            crate::units::Bytes(first.memory_bytes),
                            crate::units::Bytes(self.largest_job_of(&first)),
                            if n > 1 { "the rest" } else { "none" },
                            crate::units::Bytes(shape.memory_bytes),
                            crate::units::Bytes(self.largest_job_of(&shape))
                        )
                    },
                )
            };
            return Decision {
                submit,
                cancel: Vec::new(),
                why,
                target,
            };
        }
        let idle_ms = self.idle_for.as_millis() as u64;
        if let Some(d) =
            self.for_a_job_nobody_holds(backlog, workers, largest, capacity, memory, now_ms)
        {
            memory.below_since = None;
            return Decision { target, ..d };
        }
        if target == capacity {
            memory.below_since = None;
            return Decision {
                target,
                ..Decision::default()
            };
        }
        let since = *memory.below_since.get_or_insert(now_ms);
        let waited = now_ms.saturating_sub(since) >= idle_ms;
        // With work left, the target must have stayed low for the idle
        // period. With none, a worker's own idle clock is enough (it has
        // had nothing to do for that long, by its advert): the backlog's
        // end reaches the controller a gossip round or two late, and the
        // pool would wait that long again.
        if !waited && backlog.jobs() > 0 {
            return Decision {
                target,
                ..Decision::default()
            };
        }
        // Let go of what is not needed: pending jobs first when nothing has
        // been left to do for the idle period, then workers idle long
        // enough, oldest idle first.
        let mut excess = capacity - target.max(self.min);
        let mut cancel = Vec::new();
        if waited && backlog.jobs() == 0 {
            for id in pending.iter().take(excess as usize) {
                cancel.push(id.clone());
                excess -= 1;
            }
        }
        for w in idle_longer_than(workers, memory, idle_ms, now_ms)
            .into_iter()
            .take(excess as usize)
        {
            cancel.push(w.batch_job.clone());
        }
        if cancel.is_empty() {
            return Decision {
                target,
                ..Decision::default()
            };
        }
        let demand = match backlog.jobs() {
            0 => "no job waits: the pool wants".to_string(),
            n => format!("{n} jobs to run want"),
        };
        let why = format!(
            "shrinking by {}: {demand} {target} worker{} (at least --min {}), the pool has {} and {} coming; \
             letting go of those idle for {}",
            cancel.len(),
            plural(target),
            self.min,
            workers.len(),
            pending.len(),
            humantime::format_duration(self.idle_for)
        );
        Decision {
            submit: Vec::new(),
            cancel,
            why,
            target,
        }
    }
}

impl Policy {
    /// A waiting job larger than any worker of the pool (or coming) holds
    /// gets a worker shaped for it even when the target in workers is met
    /// (the job was read after the pool grew, or the pool is at its
    /// size): one more below `--max`; at `--max`, in place of a worker
    /// that has had nothing to do for `--idle`. Otherwise it would wait
    /// for a worker that never comes. Nothing when no worker this policy
    /// may ask for holds it (the map says so at once).
    fn for_a_job_nobody_holds(
        &self,
        backlog: &PoolBacklog,
        workers: &[PoolWorker],
        largest: u64,
        capacity: u32,
        memory: &Memory,
        now_ms: u64,
    ) -> Option<Decision> {
        let job = unheld(backlog, largest)?.largest_bytes;
        let shape = self.shape(backlog, largest);
        if self.largest_job_of(&shape) < job {
            return None;
        }
        let mut cancel = Vec::new();
        if capacity >= self.max.max(self.min) {
            let idle_ms = self.idle_for.as_millis() as u64;
            let longest = *idle_longer_than(workers, memory, idle_ms, now_ms).first()?;
            cancel.push(longest.batch_job.clone());
        }
        let why = format!(
            "{}: a job of {} waits that no worker holds (the largest holds {}); asked with {} for jobs of up to {}",
            if cancel.is_empty() {
                "growing by 1".to_string()
            } else {
                format!("replacing an idle worker at --max {}", self.max)
            },
            crate::units::Bytes(job),
            crate::units::Bytes(largest),
            crate::units::Bytes(shape.memory_bytes),
            crate::units::Bytes(self.largest_job_of(&shape)),
        );
        Some(Decision {
            submit: vec![shape],
            cancel,
            why,
            target: 0,
        })
    }
}

/// The map whose largest job no worker of the pool (or coming) holds,
/// `pool_largest` being the most any holds: waiting, or under way waiting
/// for a worker. The largest such first.
fn unheld(backlog: &PoolBacklog, pool_largest: u64) -> Option<&crate::proto::backlog::Backlog> {
    backlog
        .reports
        .iter()
        .filter(|b| !b.is_empty() && b.largest_bytes > pool_largest)
        .max_by_key(|b| b.largest_bytes)
}

/// The workers that have had nothing to do for `idle_ms` by `now_ms`,
/// longest idle first.
fn idle_longer_than<'a>(
    workers: &'a [PoolWorker],
    memory: &Memory,
    idle_ms: u64,
    now_ms: u64,
) -> Vec<&'a PoolWorker> {
    let mut idle: Vec<(&PoolWorker, u64)> = workers
        .iter()
        .filter(|w| !w.busy)
        .filter_map(|w| memory.idle_since.get(&w.addr).map(|t| (w, *t)))
        .filter(|(_, t)| now_ms.saturating_sub(*t) >= idle_ms)
        .collect();
    idle.sort_by_key(|(w, t)| (*t, w.addr.clone()));
    idle.into_iter().map(|(w, _)| w).collect()
}

fn plural(n: u32) -> &'static str {
    if n == 1 { "" } else { "s" }
}

fn round_up_mib(bytes: u64) -> u64 {
    bytes.div_ceil(1 << 20).saturating_mul(1 << 20)
}

#[cfg(test)]
mod tests;
