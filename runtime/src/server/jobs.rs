//! The job endpoints.
//!
//! * `POST /v1/jobs` — a postcard `JobSpec`. Answered with the `JobResult`
//!   when the job ends (header `peerwasm-job-id` names it); with
//!   `?detach=true`, at once with `202` and the id, the result to be taken
//!   later. An attached job is cancelled if its client hangs up. Refusals:
//!   401 (no or unknown token), 404 (module unknown: upload it), 422 (can
//!   never fit, header `peerwasm-largest-job`; or a time limit longer than
//!   this worker allows), 503 (queue full or draining; `Retry-After`), 400
//!   (bad bytes), 413 (too large).
//! * `GET /v1/jobs/{id}` — a detached job's result (200, postcard; kept
//!   until discarded, so a lost answer can be asked for again), or 202
//!   while it waits or runs; every reader is sent the same stored bytes,
//!   and a tenant has at most `READS_PER_TENANT` sent at once (503 past).
//! * `DELETE /v1/jobs/{id}` — cancels a queued or running job, or discards
//!   a finished one's result (200, JSON `{"id", "was"}`: `queued`,
//!   `running` or `done`); 409 if it is being cancelled already; 404 if it
//!   is not the caller's.
//! * `GET /v1/jobs` — the caller's own jobs here (JSON).
//! * `GET /v1/jobs/{id}/output?stdout=N&stderr=M` — a detached job's output
//!   past the first N bytes of stdout and M of stderr (at most
//!   [`OUTPUT_PAGE`] of each), while it runs and after; its outcome once it
//!   has ended (postcard `JobOutput`). What `peerwasm logs -f` polls.
//!
//! Job ids are 128 random bits *and* checked against the tenant: another
//! tenant's id answers 404, exactly as an id that does not exist.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::http::header::{self, HeaderValue};
use axum::response::{IntoResponse, Response};

use super::extract::{Caller, JobBody, Postcard};
use super::response::{json, postcard, text};
use crate::proto::routes::{CancelAnswer, OutputQuery, PostJobQuery};
use crate::proto::{JOB_ID_HEADER, JobSpec, POSTCARD};
use crate::worker::jobs;
use crate::worker::state::Worker;
use crate::worker::table::{Cancelled, Lookup, READS_PER_TENANT};

fn with_id(mut resp: Response, id: &str) -> Response {
    if let Ok(v) = HeaderValue::from_str(id) {
        resp.headers_mut().insert(JOB_ID_HEADER, v);
    }
    resp
}

pub async fn post_job(
    State(w): State<Arc<Worker>>,
    Query(params): Query<PostJobQuery>,
    Caller(tenant): Caller,
    Postcard(spec, charge, _): Postcard<JobSpec, JobBody>,
) -> Response {
    // The body's charge ends as its job is queued: the spec is then the
    // queue's (`--max-queued-bytes`), and a job asking for all the worker
    // offers must not wait for the memory its own request holds.
    drop(charge);
    if params.detach {
        return match jobs::submit_detached(&w.jobs, &tenant, spec).await {
            Ok(id) => with_id((StatusCode::ACCEPTED, id.clone()).into_response(), &id),
            Err(refused) => refused.into_response(),
        };
    }
    let mut job_id = String::new();
    match jobs::run_attached(&w.jobs, &tenant, spec, jobs::Streams::default(), |id| {
        job_id = id.to_string()
    })
    .await
    {
        Ok(result) => with_id(postcard(&result), &job_id),
        Err(refused) => refused.into_response(),
    }
}

/// The most output of each stream one `GET /v1/jobs/{id}/output` returns.
pub const OUTPUT_PAGE: usize = 4 << 20;

pub async fn get_output(
    State(w): State<Arc<Worker>>,
    Caller(tenant): Caller,
    Path(id): Path<String>,
    Query(from): Query<OutputQuery>,
) -> Response {
    match w
        .jobs
        .table
        .output(&tenant.name, &id, [from.stdout, from.stderr], OUTPUT_PAGE)
    {
        Some(output) => postcard(&output),
        None => text(StatusCode::NOT_FOUND, "no such job"),
    }
}

pub async fn get_job(
    State(w): State<Arc<Worker>>,
    Caller(tenant): Caller,
    Path(id): Path<String>,
) -> Response {
    match w.jobs.table.result(&tenant.name, &id) {
        Lookup::NotFound => text(StatusCode::NOT_FOUND, "no such job"),
        Lookup::NotDone => {
            let mut resp = text(StatusCode::ACCEPTED, "not done yet");
            resp.headers_mut().insert(header::RETRY_AFTER, 1.into());
            resp
        }
        Lookup::Done(encoded) => {
            let Some(permit) = w.jobs.table.read_permit(&tenant.name) else {
                let mut resp = text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!(
                        "{READS_PER_TENANT} of your results are being sent already: read those first"
                    ),
                );
                resp.headers_mut().insert(header::RETRY_AFTER, 1.into());
                return resp;
            };
            // The shared bytes themselves, no copy. The connection asks for
            // the body's end once it has room again, that is once most of
            // the bytes are written: the permit goes then.
            let body = futures::stream::unfold(
                (Some(encoded), Some(permit)),
                |(bytes, permit)| async move {
                    let bytes = bytes?;
                    Some((Ok::<_, std::convert::Infallible>(bytes), (None, permit)))
                },
            );
            (
                [(header::CONTENT_TYPE, POSTCARD)],
                axum::body::Body::from_stream(body),
            )
                .into_response()
        }
    }
}

pub async fn delete_job(
    State(w): State<Arc<Worker>>,
    Caller(tenant): Caller,
    Path(id): Path<String>,
) -> Response {
    match w.jobs.table.cancel(&tenant.name, &id) {
        Cancelled::NotFound => text(StatusCode::NOT_FOUND, "no such job"),
        Cancelled::AlreadyEnded(outcome) => text(
            StatusCode::CONFLICT,
            format!("the job had already ended: {outcome}"),
        ),
        Cancelled::Discarded(_) => {
            if let Err(e) = crate::worker::detached::discarded(&w.jobs.kept.db, &id).await {
                tracing::error!(job = %id, "cannot forget a discarded result: {e:#}");
                return text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("the result was discarded here but not in the state database: {e:#}"),
                );
            }
            json(&CancelAnswer {
                id,
                was: "done".into(),
            })
        }
        Cancelled::Was(was) => {
            tracing::info!(tenant = %tenant.name, job = %id, was, "job cancelled by its owner");
            json(&CancelAnswer {
                id,
                was: was.into(),
            })
        }
    }
}

pub async fn list_jobs(State(w): State<Arc<Worker>>, Caller(tenant): Caller) -> Response {
    json(&w.jobs.table.list(&tenant.name))
}
