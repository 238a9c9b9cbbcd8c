//! A process that is one job's slot (`slot` means "this process is the
//! job's slot"): it runs the job's code with no
//! time-limit instrumentation, and when the job computes past its deadline
//! or an interrupt, reports what the sandbox would have and lets its caller
//! end the process, the job with it.
//!
//! Two processes are such a slot: `peerwasm run` on the embedded worker
//! (the interrupt is Ctrl-C) and a worker's slot process
//! ([`child`], started by [`crate::runner::slotproc`]; the interrupt is its
//! parent's cancel). Compute with
//! no fuel and no epochs never gives its thread back, so nothing inside the
//! process can stop it: a job asleep in a host call still ends at its
//! deadline or on an interrupt inside the sandbox, but a job still
//! computing [`OVERRUN_GRACE`] later is reported from here — time limit or
//! cancelled, the peak memory so far (from the limiter's meter), the wall
//! and process CPU time, the output so far — and the process must end. See
//! docs/time-limits.md.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

pub mod child;

use crate::proto::{CacheSource, CancelCause, JobResult, Outcome};
use crate::runner::JobRunner;
pub use crate::runner::slotproc::wire::OVERRUN_GRACE;
use crate::sandbox::RunSpec;
use crate::sandbox::{CacheStats, Cancel, LiveOutput, OutputChunk, RunHooks, StdinFeed};

/// How a job run alone ended.
pub enum Alone {
    /// The sandbox ended it and reported.
    Ended(JobResult),
    /// It was still computing past its deadline or an interrupt: the result
    /// is this slot's own account, and the process must end (with
    /// `std::process::exit`), taking the job with it.
    Overran(JobResult),
}

/// What a job run alone does that its caller hears of as it happens.
pub enum Event {
    /// It started: its module is loaded, its deadline runs from now.
    Started,
    /// It wrote output (only with [`AloneJob::stream`]).
    Output(OutputChunk),
}

/// A job to run alone, and what is shared with it while it runs.
pub struct AloneJob {
    /// The job.
    pub spec: RunSpec,
    /// Its stdin as it arrives, after the spec's.
    pub stdin: Option<StdinFeed>,
    /// Whether its output is passed on as [`Event::Output`] as it is written.
    pub stream: bool,
    /// Whether its output is passed on only, not kept in the result.
    pub forward_only: bool,
    /// Its linear memory now, kept up to date while it runs.
    pub memory: Arc<AtomicU64>,
    /// Its output captures, published when it starts.
    pub captures: LiveOutput,
}

/// Why a slot would end a job that does not stop by itself.
#[derive(Clone, Copy)]
enum Watch {
    Deadline(Duration),
    Interrupted(CancelCause),
}

/// Runs `job` on `runner` (one slot, no time-limit instrumentation), ending
/// it at its deadline or once `interrupt` gives a cause (`None`: nothing
/// will interrupt it); `on_event` hears of its start and output. See the
/// module docs for what an overrun means.
pub async fn run_alone(
    runner: &JobRunner,
    job: AloneJob,
    interrupt: impl Future<Output = Option<CancelCause>>,
    mut on_event: impl FnMut(Event),
) -> Alone {
    let AloneJob {
        spec,
        stdin,
        stream,
        forward_only,
        memory,
        captures,
    } = job;
    let (timeout, worker_limit) = runner.sandbox().deadline(spec.limits.timeout_ms);
    let memory_limit = spec.limits.memory.bytes();
    let cancel = Cancel::new();
    let started = Arc::new(Notify::new());
    let (tee, mut output) = tokio::sync::mpsc::unbounded_channel::<OutputChunk>();
    let hooks = RunHooks {
        cancel: Some(cancel.clone()),
        stdin,
        tee: stream.then_some(tee),
        started: Some(started.clone()),
        memory_meter: Some(memory.clone()),
        captures: Some(captures.clone()),
        forward_only,
        ..RunHooks::default()
    };
    let cpu_before = process_cpu_us();
    let cache_before = runner.sandbox().cache_stats();
    let job = runner.run_resolved(spec, hooks);
    // Armed (reset) once there is something to watch for; until then it
    // is not polled (`if watch.is_some()`).
    let watchdog = tokio::time::sleep(Duration::MAX / 4);
    tokio::pin!(job, interrupt, watchdog);
    let (mut since, mut watch, mut interrupted) = (None::<Instant>, None::<Watch>, false);
    loop {
        tokio::select! {
            biased;
            result = &mut job => {
                while let Ok(chunk) = output.try_recv() {
                    on_event(Event::Output(chunk));
                }
                return Alone::Ended(result);
            }
            Some(chunk) = output.recv(), if stream => on_event(Event::Output(chunk)),
            () = started.notified(), if since.is_none() => {
                since = Some(Instant::now());
                on_event(Event::Started);
                if let (Some(t), None) = (timeout, watch) {
                    watchdog.as_mut().reset(tokio::time::Instant::now() + t + OVERRUN_GRACE);
                    watch = Some(Watch::Deadline(t));
                }
            }
            cause = &mut interrupt, if !interrupted => {
                interrupted = true;
                let Some(cause) = cause else { continue }; // nothing to watch for
                cancel.cancel(cause);
                watchdog.as_mut().reset(tokio::time::Instant::now() + OVERRUN_GRACE);
                watch = Some(Watch::Interrupted(cause));
            }
            () = &mut watchdog, if watch.is_some() => {
                while let Ok(chunk) = output.try_recv() {
                    on_event(Event::Output(chunk));
                }
                let outcome = match watch {
                    Some(Watch::Deadline(t)) => Outcome::TimeLimitExceeded { limit_ms: t.as_millis() as u64, worker_limit },
                    Some(Watch::Interrupted(cause)) => Outcome::Cancelled { cause },
                    None => unreachable!("the watchdog is polled only when armed"),
                };
                let mut result = JobResult::never_ran(memory_limit, outcome);
                result.peak_memory_bytes = memory.load(Ordering::Relaxed);
                result.wall_time_us = since.map_or(0, |s| s.elapsed().as_micros() as u64);
                result.cpu_time_us = process_cpu_us().saturating_sub(cpu_before);
                result.cache = cache_source(&cache_before, &runner.sandbox().cache_stats());
                if let Some([out, err]) = captures.lock().as_ref() {
                    (result.stdout, result.stderr) = (out.take(), err.take());
                }
                return Alone::Overran(result);
            }
        }
    }
}

/// Where the job found its module, from the cache's counters before and
/// after it started.
fn cache_source(before: &CacheStats, after: &CacheStats) -> CacheSource {
    if after.compiles > before.compiles {
        CacheSource::Compiled
    } else if after.disk_hits > before.disk_hits {
        CacheSource::Disk
    } else if after.memory_hits > before.memory_hits {
        CacheSource::Memory
    } else {
        CacheSource::None
    }
}

/// CPU time of this whole process, in µs: the job's, when it is the only
/// one, plus what running it costs. (The job's own thread clock cannot be
/// read from outside that thread.)
fn process_cpu_us() -> u64 {
    crate::sandbox::cpu_clock_nanos(libc::CLOCK_PROCESS_CPUTIME_ID) / 1000
}
