//! A job's life on a worker, from its request to its result: the checks,
//! admission, the run under the worker's limits, charging its tenant,
//! cancelling it. No HTTP here: `http/` turns
//! requests into these calls and [`Refused`] into responses.
//!
//! Who ends a job:
//! * an **attached** job (`POST /v1/jobs`, each job of a batch) lives as
//!   long as the request waiting for it: if that future is dropped (its
//!   client's connection closed), the job is cancelled;
//! * a **detached** job (`?detach=true`) runs on until it ends, its owner
//!   cancels it ([`JobTable::cancel`]), or the worker shuts down;
//! * the worker's own time policy ([`crate::sandbox::SandboxConfig::max_job_time`])
//!   ends any job that runs too long.
//!
//! A cancelled job gives back its slot and reservation once it has stopped
//! (within one fuel yield), never before: memory still in use is never
//! handed to another job. Its tenant is charged for the time it held them.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::admission::{Queued, Refusal};
use super::fairshare::JobUsage;
use super::ledger::Hold;
use super::runner::ModulePin;
use super::state::Worker;
use super::table::{JobState, JobTable};
use super::tenants::Tenant;
use crate::proto::{CancelCause, JobResult, JobSpec, MAX_INPUT_BYTES, ModuleHash, Outcome};
use crate::sandbox::{Cancel, LiveOutput, OutputChunk, RunHooks, StdinFeed};
use tokio::sync::mpsc::UnboundedSender;
use crate::units::Bytes as Size;

/// Why a job was not run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The request is wrong: no worker would take it as it is.
    Invalid(String),
    /// Its input is over the limit.
    InputTooLarge(String),
    /// The worker does not have the module: upload it, then ask again.
    UnknownModule(ModuleHash),
    /// It asks for more memory than this worker could ever give.
    TooLarge { message: String, largest: u64 },
    /// It asks for a longer time limit than this worker allows.
    TooLong(String),
    /// Not now: the tenant's queue is full or the worker is shutting down.
    Busy(String),
    /// The worker failed (a bug): not the request's fault.
    Internal(String),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Invalid(m)
            | Refused::InputTooLarge(m)
            | Refused::TooLong(m)
            | Refused::Busy(m)
            | Refused::Internal(m) => f.write_str(m),
            Refused::TooLarge { message, .. } => f.write_str(message),
            Refused::UnknownModule(hash) => write!(f, "module {hash} unknown: upload it first"),
        }
    }
}

/// Removes an attached job's entry when its request ends, however it ends.
struct Forget<'a> {
    table: &'a JobTable,
    id: String,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.table.remove(&self.id);
    }
}

/// A job's stdin and output as they flow, for a streamed job
/// (`POST /v1/jobs/stream`); the default: stdin all in the spec, output
/// all in the result.
#[derive(Default)]
pub struct Streams {
    /// Receives the output as the job writes it.
    pub tee: Option<UnboundedSender<OutputChunk>>,
    /// Stdin after the spec's, as it arrives.
    pub stdin: Option<StdinFeed>,
    /// Where the job's output can be read while it runs.
    pub captures: Option<LiveOutput>,
}

/// Runs an attached job: checked, queued, run, charged. `on_id` hears its
/// id as soon as it is queued. Dropping the future cancels the job (its
/// client went away).
pub async fn run_attached(
    w: &Arc<Worker>,
    tenant: &Arc<Tenant>,
    spec: JobSpec,
    streams: Streams,
    on_id: impl FnOnce(&str),
) -> Result<JobResult, Refused> {
    let (queued, _pin) = admit(w, tenant, &spec)?;
    let cancel = Cancel::new();
    let id = w.jobs.insert(&tenant.name, spec.limits.memory_bytes, cancel.clone());
    let _forget = Forget { table: &w.jobs, id: id.clone() };
    on_id(&id);
    let abandoned = cancel.on_drop(CancelCause::ClientGone);
    // The output's hold is given back as this returns: the bytes are then
    // the response's, sent at once.
    let hold = Arc::new(w.admission.ledger().hold());
    let result = run_queued(w, tenant, &id, queued, spec, cancel, &hold, streams).await;
    abandoned.disarm();
    result
}

/// Starts a detached job and returns its id; the result waits in the job
/// table until taken. Refusals that are known at once (the queue is full,
/// it can never fit) are returned now, so the client can go elsewhere.
pub fn submit_detached(w: &Arc<Worker>, tenant: &Arc<Tenant>, spec: JobSpec) -> Result<String, Refused> {
    let held = w.jobs.held_bytes(&tenant.name);
    if held >= w.max_results {
        w.metrics.refused("results_held");
        return Err(Refused::Busy(format!(
            "this worker holds {} of your finished jobs' results (its --max-results is {}): \
             read them (GET /v1/jobs/ID) and discard them (DELETE /v1/jobs/ID, or peerwasm cancel ID)",
            Size(held),
            Size(w.max_results)
        )));
    }
    let (queued, pin) = admit(w, tenant, &spec)?;
    let cancel = Cancel::new();
    let memreq = spec.limits.memory_bytes;
    let id = w.jobs.insert(&tenant.name, memreq, cancel.clone());
    let live = LiveOutput::default();
    w.jobs.set_live(&id, live.clone());
    let (w, tenant, id2) = (w.clone(), tenant.clone(), id.clone());
    tokio::spawn(async move {
        // Held (and counted against the worker's memory) until the result
        // is discarded.
        let hold = Arc::new(w.admission.ledger().hold());
        let result = run_queued(&w, &tenant, &id2, queued, spec, cancel, &hold, Streams { captures: Some(live), ..Streams::default() }).await.unwrap_or_else(|refused| {
            // Refused after it was queued: it waited past the hold bound and
            // the host can never hold it.
            let mut r = JobResult::never_ran(memreq, Outcome::Rejected { reason: refused.to_string() });
            r.peer = w.addr.clone();
            r
        });
        drop(pin);
        w.jobs.set_done(&id2, result, hold);
    });
    Ok(id)
}

/// The checks made before a job is queued, then its place in the queue,
/// with its module pinned until the job is done.
fn admit(w: &Worker, tenant: &Arc<Tenant>, spec: &JobSpec) -> Result<(Queued, ModulePin), Refused> {
    check(w, tenant, spec)?;
    let pin = w.runner.pin_module(&spec.module);
    let queued = w.admission.enqueue(tenant, spec.limits.memory_bytes, spec.stdin.len() as u64).map_err(|r| refusal(w, r))?;
    Ok((queued, pin))
}

/// What is checked before a job is admitted: its input within the limit, no
/// host directories, a time limit this worker allows, not draining, the
/// module known — and, with tenants, shown by this tenant (a 404 asks its
/// client to upload it, which proves it has the bytes).
fn check(w: &Worker, tenant: &Tenant, spec: &JobSpec) -> Result<(), Refused> {
    if spec.stdin.len() as u64 > MAX_INPUT_BYTES {
        return Err(Refused::InputTooLarge(format!(
            "the job's input is {}; inputs may be at most {}",
            Size(spec.stdin.len() as u64),
            Size(MAX_INPUT_BYTES)
        )));
    }
    if !spec.dirs.is_empty() {
        return Err(Refused::Invalid("a remote worker cannot grant host directories".into()));
    }
    let max_time = w.runner.sandbox().config().max_job_time;
    if let (Some(asked), Some(max)) = (spec.limits.timeout_ms, max_time)
        && Duration::from_millis(asked) > max
    {
        w.metrics.refused("too_long");
        return Err(Refused::TooLong(format!(
            "the job asks for a time limit of {} but this worker runs jobs for at most {} (its --max-job-time)",
            humantime::format_duration(Duration::from_millis(asked)),
            humantime::format_duration(max)
        )));
    }
    if w.draining.load(Ordering::Relaxed) {
        w.metrics.refused("draining");
        return Err(Refused::Busy("this worker is shutting down".into()));
    }
    if !w.runner.has_module(&spec.module)
        || (w.tenants.is_multi() && !w.uploaders.has_shown(&spec.module, &tenant.name))
    {
        return Err(Refused::UnknownModule(spec.module));
    }
    Ok(())
}

/// An admission refusal as the job's refusal: counted, and a warning for
/// the operator when someone wants more memory than this worker lends.
fn refusal(w: &Worker, r: Refusal) -> Refused {
    match r {
        Refusal::NeverFits { requested, largest } => {
            w.metrics.refused("never_fits");
            w.warnings.event(
                super::warnings::WarningKind::RefusedForMemory,
                format!("refused a job of {}: this worker can take at most {}", Size(requested), Size(largest)),
            );
            Refused::TooLarge {
                message: format!(
                    "the job asks for {} but this worker can take at most {}",
                    Size(requested),
                    Size(largest)
                ),
                largest,
            }
        }
        Refusal::Busy => {
            w.metrics.refused("queue_full");
            Refused::Busy("this worker's queue for your jobs is full".into())
        }
    }
}

/// Waits for the job's turn (or its cancellation), then runs it.
async fn run_queued(
    w: &Arc<Worker>,
    tenant: &Arc<Tenant>,
    id: &str,
    queued: Queued,
    spec: JobSpec,
    cancel: Cancel,
    hold: &Arc<Hold>,
    streams: Streams,
) -> Result<JobResult, Refused> {
    let ticket = tokio::select! {
        biased;
        cause = cancel.cancelled() => {
            // Out of the queue at once; it held nothing, so nothing is charged.
            w.metrics.cancelled_in_queue(&tenant.name);
            let mut r = JobResult::never_ran(spec.limits.memory_bytes, Outcome::Cancelled { cause });
            r.peer = w.addr.clone();
            return Ok(r);
        }
        ticket = queued.ticket() => ticket.map_err(|r| refusal(w, r))?,
    };
    w.jobs.set(id, JobState::Running);
    // The job runs in a task of its own that holds the ticket: if the
    // request waiting for it goes away, the job is cancelled, and its slot
    // and reservation are given back once it has actually stopped.
    let (w2, hold) = (w.clone(), hold.clone());
    let job = tokio::spawn(async move {
        let held = Instant::now();
        let hooks = RunHooks {
            tee: streams.tee,
            stdin: streams.stdin,
            captures: streams.captures,
            memory_meter: Some(ticket.reservation().meter()),
            cancel: Some(cancel),
            output_budget: Some(hold.clone()),
        };
        let mut result = w2.runner.run_with(spec, hooks).await;
        hold.shrink_to((result.stdout.len() + result.stderr.len()) as u64);
        w2.admission.account(&ticket.tenant().name, &JobUsage {
            cpu: Duration::from_micros(result.cpu_time_us),
            held: held.elapsed(),
            wall: Duration::from_micros(result.wall_time_us),
            reserved_bytes: ticket.reservation().bytes(),
            peak_bytes: result.peak_memory_bytes,
        });
        w2.metrics.job_ended(&ticket.tenant().name, &result);
        // Fair share is charged as the ticket goes, before its slot is
        // handed to the next job (`Ticket::drop`).
        drop(ticket);
        w2.jobs_run.fetch_add(1, Ordering::Relaxed);
        result.peer = w2.addr.clone();
        result
    });
    job.await.map_err(|e| Refused::Internal(format!("the job's task failed: {e}")))
}
