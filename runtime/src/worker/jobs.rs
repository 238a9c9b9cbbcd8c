//! A job's life on a worker, from its request to its result: the checks,
//! admission, the run under the worker's limits, charging its tenant,
//! cancelling it. No HTTP here: `server/` turns
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

use super::admission::{NotAdmitted, Queued};
use super::compile_charge::CompileCharge;
use super::fairshare::JobUsage;
use super::filestore::TreePins;
use super::job_path::JobPath;
use super::ledger::{Hold, HoldKind};
use super::refused::Refused;
use super::table::{JobState, JobTable};
use super::tenants::Tenant;
use super::trees::{self, Mounted};
use crate::proto::{CancelCause, JobResult, JobSpec, MAX_INPUT_BYTES, Outcome};
use crate::runner::ModulePin;
use crate::sandbox::{Cancel, LiveOutput, OutputChunk, RunHooks, StdinFeed};
use crate::units::Bytes as Size;
use tokio::sync::mpsc::UnboundedSender;

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
    /// What the job's output is charged to, when the caller sends it on
    /// (a stream): the caller gives the bytes back as they are sent, so
    /// output not read yet stays charged after the job ends. `None`: a
    /// hold of the job's own, shrunk to its result when it ends.
    pub hold: Option<Arc<Hold>>,
    /// Keep none of the output in the result: it all goes to `tee`.
    pub forward_only: bool,
}

/// Runs an attached job: checked, queued, run, charged. `on_id` hears its
/// id as soon as it is queued. Dropping the future cancels the job (its
/// client went away).
pub async fn run_attached(
    w: &Arc<JobPath>,
    tenant: &Arc<Tenant>,
    spec: JobSpec,
    streams: Streams,
    on_id: impl FnOnce(&str),
) -> Result<JobResult, Refused> {
    let (queued, pins) = admit(w, tenant, &spec)?;
    let cancel = Cancel::new();
    let id = w
        .table
        .insert(&tenant.name, spec.limits.memory.bytes(), cancel.clone());
    let _forget = Forget {
        table: &w.table,
        id: id.clone(),
    };
    on_id(&id);
    let abandoned = cancel.on_drop(CancelCause::ClientGone);
    // The output's hold is given back as this returns: the bytes are then
    // the response's, sent at once (a stream's caller brings its own).
    let hold = streams
        .hold
        .clone()
        .unwrap_or_else(|| Arc::new(w.admission.ledger().hold(HoldKind::Output)));
    let turn = Turn {
        w: w.clone(),
        tenant: tenant.clone(),
        id: id.clone(),
        queued,
        spec,
        pins,
        cancel,
        hold,
        streams,
    };
    let result = run_queued(turn).await;
    abandoned.disarm();
    result
}

/// Starts a detached job and returns its id, once the job is committed to
/// the state database (`detached.rs`); the result waits in the job table
/// until taken. Refusals that are known at once (the queue is full, it can
/// never fit) are returned now, so the client can go elsewhere.
pub async fn submit_detached(
    w: &Arc<JobPath>,
    tenant: &Arc<Tenant>,
    spec: JobSpec,
) -> Result<String, Refused> {
    let held = w.table.held_bytes(&tenant.name);
    if held >= w.kept.max_results {
        w.metrics.refused("results_held");
        return Err(Refused::Busy(format!(
            "this worker holds {} of your finished jobs' results (its --max-results is {}): \
             read them (GET /v1/jobs/ID) and discard them (DELETE /v1/jobs/ID, or peerwasm cancel ID)",
            Size(held),
            Size(w.kept.max_results)
        )));
    }
    if spec.trees.iter().any(|t| !t.read_only) {
        // Its files back would be kept, unbounded, with its result.
        return Err(Refused::Invalid(
            "a detached job's directories must be read-only (:ro): nobody would be there to take the files it writes".into(),
        ));
    }
    super::stored::check(
        &w.kept,
        &w.metrics,
        &tenant.name,
        spec.encoded_len() + super::stored::ROW_BYTES,
        "detached job",
    )
    .await?;
    let (queued, pins) = admit(w, tenant, &spec)?;
    let id = JobTable::new_id();
    // While this commits, the job keeps its place in the queue.
    super::detached::keep(w, &id, tenant, &spec).await?;
    spawn_detached(w, tenant, spec, queued, pins, &id);
    Ok(id)
}

/// Queues a kept detached job again under its id (after a restart).
pub(crate) fn start_detached(
    w: &Arc<JobPath>,
    tenant: &Arc<Tenant>,
    spec: JobSpec,
    id: &str,
) -> Result<(), Refused> {
    let (queued, pins) = admit(w, tenant, &spec)?;
    spawn_detached(w, tenant, spec, queued, pins, id);
    Ok(())
}

fn spawn_detached(
    w: &Arc<JobPath>,
    tenant: &Arc<Tenant>,
    mut spec: JobSpec,
    queued: Queued,
    pins: Pins,
    id: &str,
) {
    // What is kept of the spec once the job has run: all but its input.
    let stdin = std::mem::take(&mut spec.stdin);
    let ran = spec.to_stored().ok();
    spec.stdin = stdin;
    let cancel = Cancel::new();
    let asked = spec.limits.memory.bytes();
    w.table
        .insert_with_id(id, &tenant.name, asked, cancel.clone());
    let live = LiveOutput::default();
    w.table.set_live(id, live.clone());
    let (w, tenant, id2) = (w.clone(), tenant.clone(), id.to_string());
    tokio::spawn(async move {
        // Held (and counted against the worker's memory) until the result
        // is discarded.
        let hold = Arc::new(w.admission.ledger().hold(HoldKind::Output));
        let streams = Streams {
            captures: Some(live),
            ..Streams::default()
        };
        let turn = Turn {
            w: w.clone(),
            tenant,
            id: id2.clone(),
            queued,
            spec,
            pins,
            cancel,
            hold: hold.clone(),
            streams,
        };
        let result = run_queued(turn).await.unwrap_or_else(|refused| {
            // Refused after it was queued: it waited past the hold bound and
            // the host can never hold it.
            let mut r = JobResult::never_ran(
                asked,
                Outcome::Rejected {
                    reason: refused.to_string(),
                },
            );
            r.peer = w.addr.clone();
            r
        });
        // Ended by this worker's shutdown, it runs again when the worker
        // is back; any other end is its result.
        // Encoded once: the state database and every reader share the bytes.
        let done = super::table::Finished::of(&result);
        drop(result);
        // Kept now: held as a result (`HoldKind::Result`), not as output.
        let kept = Arc::new(w.admission.ledger().hold(HoldKind::Result));
        kept.try_grow(done.encoded.len() as u64, true);
        drop(hold);
        if !matches!(
            done.outcome,
            Outcome::Cancelled {
                cause: CancelCause::Shutdown
            }
        ) {
            super::detached::ended(&w.kept.db, &id2, done.encoded.clone(), ran);
        }
        w.table.set_done(&id2, done, kept);
    });
}

/// What a job keeps from being dropped while it waits and runs: its
/// module's bytes and its trees' files.
pub struct Pins {
    _module: ModulePin,
    trees: Option<TreePins>,
}

/// The checks made before a job is queued, then its place in the queue,
/// with its module and its trees' files pinned until the job is done.
fn admit(w: &JobPath, tenant: &Arc<Tenant>, spec: &JobSpec) -> Result<(Queued, Pins), Refused> {
    check(w, tenant, spec)?;
    let trees = match spec.trees.is_empty() {
        true => None,
        false => Some(
            w.files
                .pin_trees(&tenant.name, &spec.trees)
                .map_err(Refused::MissingFiles)?,
        ),
    };
    let pins = Pins {
        _module: w.runner.pin_module(&spec.module),
        trees,
    };
    // It starts where its limit fits, and reserves its reserve.
    let queued = w
        .admission
        .enqueue_reserving(
            tenant,
            spec.reserved(),
            spec.limits.memory,
            spec.encoded_len(),
        )
        .map_err(|r| not_admitted(w, r))?;
    Ok((queued, pins))
}

/// What is checked before a job is admitted: its input within the limit, no
/// host directories, a time limit this worker allows, not draining, the
/// module known — and, with tenants, shown by this tenant (a 404 asks its
/// client to upload it, which proves it has the bytes).
fn check(w: &JobPath, tenant: &Tenant, spec: &JobSpec) -> Result<(), Refused> {
    if spec.stdin.len() as u64 > MAX_INPUT_BYTES {
        return Err(Refused::InputTooLarge(format!(
            "the job's input is {}; inputs may be at most {}",
            Size(spec.stdin.len() as u64),
            Size(MAX_INPUT_BYTES)
        )));
    }
    check_guest_paths(spec)?;
    if let Some(tag) = &spec.tag
        && !tag.submission.is_empty()
        && !crate::proto::submission::is_issued_submission_id(&tag.submission)
    {
        return Err(Refused::Invalid(
            "a job's tag names a submission by the id its owner issued (s- and 32 hex digits), or none".into(),
        ));
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
    if w.gate.draining() {
        w.metrics.refused("draining");
        return Err(Refused::Busy("this worker is shutting down".into()));
    }
    if let Some(asked) = spec.limits.timeout_ms
        && let Some(why) = w
            .gate
            .lifetime
            .refuses(Duration::from_millis(asked), std::time::SystemTime::now())
    {
        w.metrics.refused("ends_first");
        return Err(Refused::Busy(why));
    }
    if !w.runner.has_module(&spec.module)
        || (w.tenants.is_multi() && !w.uploaders.has_shown(&spec.module, &tenant.name))
    {
        return Err(Refused::UnknownModule(spec.module));
    }
    Ok(())
}

/// Trees must be mounted at distinct, non-empty guest paths, none of them
/// the scratch directory's.
fn check_guest_paths(spec: &JobSpec) -> Result<(), Refused> {
    let mut seen = std::collections::HashSet::new();
    for t in &spec.trees {
        if t.guest.is_empty() || t.guest.contains('\0') {
            return Err(Refused::Invalid(
                "a tree's guest path is empty or has a NUL".into(),
            ));
        }
        if t.guest == crate::sandbox::SCRATCH_GUEST_PATH {
            return Err(Refused::Invalid(format!(
                "{} is the job's scratch directory; mount the tree elsewhere",
                t.guest
            )));
        }
        if !seen.insert(t.guest.as_str()) {
            return Err(Refused::Invalid(format!(
                "two trees are mounted at {}",
                t.guest
            )));
        }
    }
    Ok(())
}

/// `largest` in words, saying so when it is what the machine has for jobs
/// less a job's native memory (in a cgroup of 1 GiB, jobs of 1012 MiB).
fn at_most(w: &JobPath, largest: u64) -> String {
    let ledger = w.admission.ledger();
    if largest == ledger.largest_job() && largest < ledger.capacity() {
        format!(
            "{} ({} less the {} of native stack and state a job may take beside its limit)",
            Size(largest),
            Size(ledger.capacity()),
            Size(ledger.per_job())
        )
    } else {
        Size(largest).to_string()
    }
}

/// An admission refusal as the job's refusal: counted, and a warning for
/// the operator when someone wants more memory than this worker lends.
fn not_admitted(w: &JobPath, r: NotAdmitted) -> Refused {
    match r {
        NotAdmitted::NeverFits { requested, largest } => {
            w.metrics.refused("never_fits");
            let most = at_most(w, largest);
            w.warnings.event(
                super::warnings::WarningKind::RefusedForMemory,
                format!(
                    "refused a job of {}: this worker can take at most {most}",
                    Size(requested)
                ),
            );
            Refused::TooLarge {
                message: format!(
                    "the job asks for {} but this worker can take at most {most}",
                    Size(requested),
                ),
                largest,
            }
        }
        NotAdmitted::Busy => {
            w.metrics.refused("queue_full");
            Refused::Busy("this worker's queue for your jobs is full".into())
        }
    }
}

/// Waits for the job's turn (or its cancellation), then runs it.
///
/// All of it happens in one task on the runner's slot threads, which holds
/// the ticket: when a job ends there, the ticket it gives back starts the
/// next job on the same thread, with no hand-off between threads (and if
/// the request waiting for the job goes away, the job is cancelled, and its
/// slot and reservation are given back once it has actually stopped).
async fn run_queued(turn: Turn) -> Result<JobResult, Refused> {
    let w = turn.w.clone();
    w.runner
        .spawn(in_turn(turn))
        .await
        .map_err(|e| Refused::Internal(format!("the job's task failed: {e}")))?
}

/// A job in the queue, with everything it runs with: what
/// [`run_queued`] hands to the runner's slot threads.
struct Turn {
    w: Arc<JobPath>,
    tenant: Arc<Tenant>,
    /// Its id in the job table.
    id: String,
    /// Its place in admission's queue.
    queued: Queued,
    spec: JobSpec,
    /// The files of its trees, kept until it is done.
    pins: Pins,
    cancel: Cancel,
    /// What its output is charged to.
    hold: Arc<Hold>,
    streams: Streams,
}

/// [`run_queued`]'s task: waits for the job's ticket, runs it within the
/// reservation the ticket holds, then charges it.
async fn in_turn(turn: Turn) -> Result<JobResult, Refused> {
    let Turn {
        w,
        tenant,
        id,
        queued,
        mut spec,
        pins,
        cancel,
        hold,
        streams,
    } = turn;
    let ticket = tokio::select! {
        biased;
        cause = cancel.cancelled() => {
            // Out of the queue at once; it held nothing, so nothing is charged.
            w.metrics.cancelled_in_queue(&tenant.name);
            let mut r = JobResult::never_ran(spec.limits.memory.bytes(), Outcome::Cancelled { cause });
            r.peer = w.addr.clone();
            return Ok(r);
        }
        ticket = queued.ticket() => ticket.map_err(|r| not_admitted(&w, r))?,
    };
    w.table.set(&id, JobState::Running);
    let (module, tag) = (spec.module, spec.tag.take());
    let streams_forwarded = streams.forward_only;
    let held = Instant::now();
    // The sandbox enforces what the ticket reserved: one number, from
    // admission to the limiter (the job's reserve, when it runs under one:
    // its limit is then the spec's, and the ticket's ledger lends the rest).
    let asked = ticket.reservation().bytes();
    let limit = spec.limits.memory.bytes().max(asked);
    // Cancelled while it waited for a compile turn, it still held its slot:
    // ended as a cancelled job, and accounted as one below.
    let (compile, waited) =
        match CompileCharge::for_module(&w, &tenant.name, &module, &cancel).await {
            Ok(compile) => (compile, None),
            Err(cause) => (None, Some(cause)),
        };
    let hooks = RunHooks {
        tee: streams.tee,
        stdin: streams.stdin,
        captures: streams.captures,
        memory_meter: Some(ticket.reservation().meter()),
        memory_lender: Some(ticket.reservation().lender(&ticket.tenant().name)),
        cancel: Some(cancel),
        output_budget: Some(hold.clone()),
        started: compile.as_ref().map(|c| c.started.clone()),
        forward_only: streams.forward_only,
    };
    let mounted = match waited {
        Some(cause) => Err(Outcome::Cancelled { cause }),
        None => mount_trees(&w, &pins, &spec)
            .await
            .map_err(|reason| Outcome::Rejected { reason }),
    };
    let mut result = match mounted {
        Ok(mounted) => {
            // Laid out: the sandbox sees them as directories.
            let grants = mounted
                .as_ref()
                .map(|m| m.grants.clone())
                .unwrap_or_default();
            let mut run = crate::sandbox::RunSpec::resolved(spec, grants, asked);
            // A warm start's snapshot is shared by this tenant's jobs only.
            run.warm_scope = format!("{}/{}", tenant.name, run.warm_scope);
            let mut result = w.runner.run_resolved(run, hooks).await;
            w.warm.follow(&w.runner);
            if let Some(mounted) = mounted {
                send_files_back(&w, mounted, &hold, &mut result).await;
            }
            result
        }
        Err(outcome) => JobResult::never_ran(limit, outcome),
    };
    drop((pins, compile));
    let files: usize = result.files.iter().map(|f| f.contents.len()).sum();
    if !streams_forwarded {
        hold.shrink_to((result.stdout.len() + result.stderr.len() + files) as u64);
    }
    w.admission.account(
        &ticket.tenant().name,
        &JobUsage {
            cpu: Duration::from_micros(result.cpu_time_us),
            held: held.elapsed(),
            wall: Duration::from_micros(result.wall_time_us),
            reserved_bytes: ticket.reservation().with_loans(),
            peak_bytes: result.peak_memory_bytes,
        },
    );
    w.metrics.job_ended(&ticket.tenant().name, &result);
    w.kept.history.record(
        &ticket.tenant().name,
        &module,
        tag.as_ref(),
        &result,
        ticket.reservation().with_loans(),
        &w.addr,
    );
    // Fair share is charged as the ticket goes, before its slot is
    // handed to the next job (`Ticket::drop`).
    drop(ticket);
    w.jobs_run.fetch_add(1, Ordering::Relaxed);
    result.peer = w.addr.clone();
    Ok(result)
}

/// Lays out the job's trees, if it has any, on a blocking thread (their
/// files stay pinned by `pins` until the job is done).
async fn mount_trees(
    w: &Arc<JobPath>,
    pins: &Pins,
    spec: &JobSpec,
) -> Result<Option<Mounted>, String> {
    let Some(tree_pins) = &pins.trees else {
        return Ok(None);
    };
    let sandbox = w.runner.sandbox();
    let (root, disk) = (sandbox.jobs_dir(), sandbox.scratch_pool());
    let (store, manifests, trees) = (
        w.files.clone(),
        tree_pins.manifests.clone(),
        spec.trees.clone(),
    );
    tokio::task::spawn_blocking(move || {
        trees::mount(&store, &manifests, &trees, root.as_deref(), disk).map(Some)
    })
    .await
    .map_err(|e| format!("laying out the job's trees failed: {e}"))?
}

/// Reads back what the job wrote into its writable trees (held against
/// the worker's memory with its output), into its result.
async fn send_files_back(
    w: &Arc<JobPath>,
    mounted: Mounted,
    hold: &Arc<Hold>,
    result: &mut JobResult,
) {
    let max = w.max_files_back;
    // Held before reading; shrunk to what the result keeps.
    hold.try_grow(max, true);
    let back = tokio::task::spawn_blocking(move || mounted.files_back(max)).await;
    match back {
        Ok(Ok((files, warnings))) => {
            result.files = files;
            result.warnings.extend(warnings);
        }
        Ok(Err(outcome)) => {
            if result.outcome.is_success() {
                result.outcome = outcome;
            } else {
                result.warnings.push(format!("{outcome}"));
            }
        }
        Err(e) => result
            .warnings
            .push(format!("reading back the job's files failed: {e}")),
    }
}
