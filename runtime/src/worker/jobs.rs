//! The job endpoints of `peerwasm worker`, and who may use them.
//!
//! * `POST /v1/jobs` — a postcard `JobSpec`. Answered with the `JobResult`
//!   when the job ends (header `peerwasm-job-id` names it); with
//!   `?detach=true`, at once with `202` and the id, the result to be taken
//!   later. Refusals: 401 (no or unknown token), 404 (module unknown: upload
//!   it), 422 (can never fit; header `peerwasm-largest-job`), 503 (queue
//!   full or draining; `Retry-After`), 400 (bad bytes).
//! * `GET /v1/jobs/{id}` — a detached job's result (200, postcard; taken:
//!   the worker forgets it), or 202 while it waits or runs.
//! * `GET /v1/jobs` — the caller's own jobs here (JSON).
//! * `POST /v1/jobs/batch` — many jobs at once, each answered as it ends
//!   (`batch.rs`, `proto::batch`).
//!
//! Every request names its tenant with `Authorization: Bearer TOKEN` when
//! the worker has `--tenants`. Job ids are 128 random bits *and* checked
//! against the tenant: another tenant's id answers 404, exactly as an id
//! that does not exist, so ids leak nothing.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::admission::Refusal;
use super::fairshare::JobUsage as Usage;
use super::server::{Worker, postcard_body, text};
use super::tenants::{AuthError, Tenant};
use crate::proto::batch::BatchAnswer;
use crate::proto::{JOB_ID_HEADER, JobResult, JobSpec, JobStatus, LARGEST_JOB_HEADER, MAX_INPUT_BYTES};
use crate::sandbox::RunHooks;
use crate::units::Bytes as Size;

/// How long a detached job's result is kept if nobody takes it.
pub const RESULT_TTL: Duration = Duration::from_secs(3600);

enum JobState {
    Queued,
    Running,
    Done(Box<JobResult>, Instant),
}

struct Entry {
    tenant: String,
    memory_bytes: u64,
    state: JobState,
}

/// The jobs a worker holds, by id.
#[derive(Default)]
pub struct JobTable {
    jobs: Mutex<HashMap<String, Entry>>,
}

impl JobTable {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn insert(&self, tenant: &str, memory_bytes: u64) -> String {
        let id = hex::encode(rand::random::<[u8; 16]>());
        self.lock().insert(id.clone(), Entry { tenant: tenant.into(), memory_bytes, state: JobState::Queued });
        id
    }

    fn set(&self, id: &str, state: JobState) {
        if let Some(e) = self.lock().get_mut(id) {
            e.state = state;
        }
    }

    fn remove(&self, id: &str) {
        self.lock().remove(id);
    }

    /// Forgets results nobody took within [`RESULT_TTL`].
    pub fn sweep(&self) {
        self.lock().retain(|_, e| !matches!(&e.state, JobState::Done(_, at) if at.elapsed() > RESULT_TTL));
    }
}

/// The caller's tenant, or the 401 to answer.
pub(super) fn authenticate(w: &Worker, headers: &HeaderMap) -> Result<Arc<Tenant>, Response> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    w.tenants.authenticate(token).map_err(|e| {
        let why = match e {
            AuthError::Missing => "this worker needs a tenant token: give --token or PEERWASM_TOKEN",
            AuthError::Unknown => "the tenant token is not known here",
        };
        let mut resp = text(StatusCode::UNAUTHORIZED, why);
        resp.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        resp
    })
}

/// The caller's tenant and the request body (a `what`, at most `limit`
/// bytes), or the response to give: 401 (counted), 413 or 400.
pub(super) fn caller_and_body(
    w: &Worker,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    what: &str,
    limit: usize,
) -> Result<(Arc<Tenant>, Bytes), Response> {
    let tenant = authenticate(w, headers).inspect_err(|_| w.metrics.refused("unauthorized"))?;
    Ok((tenant, super::limits::body(body, what, limit)?))
}

#[derive(serde::Deserialize)]
pub(super) struct PostParams {
    #[serde(default)]
    detach: bool,
}

/// Why a job was not run: answered as a status and a message to one job,
/// or as a [`BatchAnswer::Refused`] within a batch.
pub(super) struct Refused {
    status: StatusCode,
    message: String,
    /// For 422: the largest job this worker could ever take.
    largest_job: Option<u64>,
}

impl Refused {
    fn new(status: StatusCode, message: impl Into<String>) -> Refused {
        Refused { status, message: message.into(), largest_job: None }
    }

    pub(super) fn busy(message: &str) -> Refused {
        Refused::new(StatusCode::SERVICE_UNAVAILABLE, message)
    }

    /// As the response to one job.
    pub(super) fn into_response(self) -> Response {
        let mut resp = text(self.status, self.message);
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            resp.headers_mut().insert(header::RETRY_AFTER, 1.into());
        }
        if let Some(largest) = self.largest_job {
            resp.headers_mut().insert(LARGEST_JOB_HEADER, largest.into());
        }
        resp
    }

    /// As one job's answer within a batch.
    pub(super) fn into_answer(self) -> BatchAnswer {
        BatchAnswer::Refused { status: self.status.as_u16(), message: self.message, largest_job: self.largest_job }
    }
}

pub(super) async fn post_job(
    State(w): State<Arc<Worker>>,
    Query(params): Query<PostParams>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let (tenant, body) = match caller_and_body(&w, &headers, body, "job request", super::limits::JOB_BODY) {
        Ok(t) => t,
        Err(resp) => return resp,
    };
    let spec: JobSpec = match postcard::from_bytes(&body) {
        Ok(s) => s,
        Err(e) => return text(StatusCode::BAD_REQUEST, format!("bad job request: {e}")),
    };
    if let Err(refused) = check(&w, &spec) {
        return refused.into_response();
    }
    // Admission refuses a job that can never fit (422) before queueing it.
    let id = w.jobs.insert(&tenant.name, spec.limits.memory_bytes);
    if params.detach {
        // Queue-full is still answered now, so the client can go elsewhere.
        let (admitted_tx, admitted_rx) = tokio::sync::oneshot::channel();
        let (w2, id2) = (w.clone(), id.clone());
        tokio::spawn(async move {
            let result = run(&w2, &tenant, &id2, spec, Some(admitted_tx)).await;
            match result {
                Ok(r) => w2.jobs.set(&id2, JobState::Done(Box::new(r), Instant::now())),
                Err(_) => w2.jobs.remove(&id2),
            }
        });
        return match admitted_rx.await {
            Ok(Ok(())) => {
                let mut resp = (StatusCode::ACCEPTED, id.clone()).into_response();
                resp.headers_mut().insert(JOB_ID_HEADER, id.parse().expect("hex is a valid header"));
                resp
            }
            Ok(Err(refused)) => refused.into_response(),
            Err(_) => text(StatusCode::INTERNAL_SERVER_ERROR, "the job's task failed"),
        };
    }
    let result = run(&w, &tenant, &id, spec, None).await;
    w.jobs.remove(&id);
    let result = match result {
        Ok(r) => r,
        Err(refused) => return refused.into_response(),
    };
    match postcard::to_allocvec(&result) {
        Ok(bytes) => {
            let mut resp = postcard_body(bytes);
            resp.headers_mut().insert(JOB_ID_HEADER, id.parse().expect("hex is a valid header"));
            resp
        }
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("cannot encode the result: {e}")),
    }
}

/// What is checked before a job is admitted: its input within the limit,
/// no host directories, not draining, the module known.
fn check(w: &Worker, spec: &JobSpec) -> Result<(), Refused> {
    if spec.stdin.len() as u64 > MAX_INPUT_BYTES {
        return Err(Refused::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the job's input is {}; inputs may be at most {}",
                Size(spec.stdin.len() as u64),
                Size(MAX_INPUT_BYTES)
            ),
        ));
    }
    if !spec.dirs.is_empty() {
        return Err(Refused::new(StatusCode::BAD_REQUEST, "a remote worker cannot grant host directories"));
    }
    if w.draining.load(Ordering::Relaxed) {
        w.metrics.refused("draining");
        return Err(Refused::busy("this worker is shutting down"));
    }
    if !w.runner.has_module(&spec.module) {
        return Err(Refused::new(StatusCode::NOT_FOUND, format!("module {} unknown: upload it first", spec.module)));
    }
    Ok(())
}

/// One job of a batch: checked, admitted and run like `POST /v1/jobs`.
pub(super) async fn run_one(w: &Arc<Worker>, tenant: &Arc<Tenant>, spec: JobSpec) -> BatchAnswer {
    if let Err(refused) = check(w, &spec) {
        return refused.into_answer();
    }
    let id = w.jobs.insert(&tenant.name, spec.limits.memory_bytes);
    let result = run(w, tenant, &id, spec, None).await;
    w.jobs.remove(&id);
    match result {
        Ok(r) => BatchAnswer::Done(r),
        Err(refused) => refused.into_answer(),
    }
}

/// The 422 for a job that can never fit here; counted, and a warning for
/// the operator (someone wants more memory than this worker lends).
fn too_large(w: &Worker, requested: u64, largest: u64) -> Refused {
    w.metrics.refused("never_fits");
    w.warnings.event(
        super::warnings::WarningKind::RefusedForMemory,
        format!("refused a job of {}: this worker can take at most {}", Size(requested), Size(largest)),
    );
    Refused {
        status: StatusCode::UNPROCESSABLE_ENTITY,
        message: format!("the job asks for {} but this worker can take at most {}", Size(requested), Size(largest)),
        largest_job: Some(largest),
    }
}

/// Admits and runs one job. `queued` (for detached jobs) hears whether the
/// job was queued or refused, as soon as that is known.
async fn run(
    w: &Arc<Worker>,
    tenant: &Arc<Tenant>,
    id: &str,
    spec: JobSpec,
    queued: Option<tokio::sync::oneshot::Sender<Result<(), Refused>>>,
) -> Result<JobResult, Refused> {
    let mut queued = queued;
    let mut admit = std::pin::pin!(w.admission.admit(tenant, spec.limits.memory_bytes));
    // A refusal is immediate; anything else means the job is queued.
    let ticket = match futures::poll!(admit.as_mut()) {
        std::task::Poll::Ready(r) => r,
        std::task::Poll::Pending => {
            if let Some(tx) = queued.take() {
                let _ = tx.send(Ok(()));
            }
            admit.await
        }
    };
    let ticket = match ticket {
        Ok(t) => t,
        Err(refusal) => {
            let refused = match refusal {
                Refusal::NeverFits { requested, largest } => too_large(w, requested, largest),
                Refusal::Busy => {
                    w.metrics.refused("queue_full");
                    Refused::busy("this worker's queue for your jobs is full")
                }
            };
            return Err(match queued.take() {
                Some(tx) => {
                    let _ = tx.send(Err(refused));
                    Refused::busy("refused")
                }
                None => refused,
            });
        }
    };
    if let Some(tx) = queued.take() {
        let _ = tx.send(Ok(()));
    }
    w.jobs.set(id, JobState::Running);
    // The job runs in a task of its own that holds the ticket: if the client
    // goes away, the job still ends normally and its reservation is held
    // until then (dropping this handler must not free memory still in use).
    let w2 = w.clone();
    let job = tokio::spawn(async move {
        let held = Instant::now();
        let hooks = RunHooks { tee: None, memory_meter: Some(ticket.reservation().meter()) };
        let mut result = w2.runner.run_with(spec, hooks).await;
        w2.admission.account(
            &ticket.tenant().name,
            &Usage {
                cpu: Duration::from_micros(result.cpu_time_us),
                held: held.elapsed(),
                wall: Duration::from_micros(result.wall_time_us),
                reserved_bytes: ticket.reservation().bytes(),
                peak_bytes: result.peak_memory_bytes,
            },
        );
        w2.metrics.job_ended(&ticket.tenant().name, &result);
        drop(ticket);
        w2.jobs_run.fetch_add(1, Ordering::Relaxed);
        result.peer = w2.addr.clone();
        result
    });
    job.await.map_err(|e| Refused::new(StatusCode::INTERNAL_SERVER_ERROR, format!("the job's task failed: {e}")))
}

pub(super) async fn get_job(State(w): State<Arc<Worker>>, Path(id): Path<String>, headers: HeaderMap) -> Response {
    let tenant = match authenticate(&w, &headers) {
        Ok(t) => t,
        Err(resp) => return resp,
    };
    let mut jobs = w.jobs.lock();
    let Some(entry) = jobs.get(&id).filter(|e| e.tenant == tenant.name) else {
        return text(StatusCode::NOT_FOUND, "no such job");
    };
    if !matches!(entry.state, JobState::Done(..)) {
        let mut resp = text(StatusCode::ACCEPTED, "not done yet");
        resp.headers_mut().insert(header::RETRY_AFTER, 1.into());
        return resp;
    }
    let Some(Entry { state: JobState::Done(result, _), .. }) = jobs.remove(&id) else { unreachable!() };
    drop(jobs);
    match postcard::to_allocvec(&*result) {
        Ok(bytes) => postcard_body(bytes),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("cannot encode the result: {e}")),
    }
}

pub(super) async fn list_jobs(State(w): State<Arc<Worker>>, headers: HeaderMap) -> Response {
    let tenant = match authenticate(&w, &headers) {
        Ok(t) => t,
        Err(resp) => return resp,
    };
    let mut mine: Vec<JobStatus> = w
        .jobs
        .lock()
        .iter()
        .filter(|(_, e)| e.tenant == tenant.name)
        .map(|(id, e)| JobStatus {
            id: id.clone(),
            state: match e.state {
                JobState::Queued => "queued",
                JobState::Running => "running",
                JobState::Done(..) => "done",
            }
            .into(),
            memory_bytes: e.memory_bytes,
        })
        .collect();
    mine.sort_by(|a, b| a.id.cmp(&b.id));
    match serde_json::to_vec(&mine) {
        Ok(b) => ([(header::CONTENT_TYPE, "application/json")], b).into_response(),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}
