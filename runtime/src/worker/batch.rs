//! `POST /v1/jobs/batch`: many jobs of one tenant in one request, each
//! answered in its own frame the moment it ends (the format is in
//! [`crate::proto::batch`]).
//!
//! Each job goes through exactly the path of `POST /v1/jobs` (checks,
//! admission, fair share, accounting); only the HTTP exchange is shared.
//! The jobs wait for admission inside the response stream: if the client
//! hangs up, jobs still queued leave the queue, and jobs already running
//! finish and release their slot as usual (their tasks hold the tickets).

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use futures::stream::FuturesUnordered;

use super::jobs::{Refused, caller_and_body, run_one};
use super::server::{Worker, text};
use crate::proto::JobSpec;
use crate::proto::POSTCARD;
use crate::proto::batch::{BatchAnswer, BatchItem, MAX_BATCH_JOBS, encode_frame};

pub(super) async fn post_batch(
    State(w): State<Arc<Worker>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let (tenant, body) = match caller_and_body(&w, &headers, body, "batch request", super::limits::BATCH_BODY) {
        Ok(t) => t,
        Err(resp) => return resp,
    };
    let specs: Vec<JobSpec> = match postcard::from_bytes(&body) {
        Ok(s) => s,
        Err(e) => return text(StatusCode::BAD_REQUEST, format!("bad batch request: {e}")),
    };
    if specs.len() > MAX_BATCH_JOBS {
        return text(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("a batch of {} jobs is more than the limit of {MAX_BATCH_JOBS}", specs.len()),
        );
    }
    if w.draining.load(std::sync::atomic::Ordering::Relaxed) {
        w.metrics.refused("draining");
        return Refused::busy("this worker is shutting down").into_response();
    }
    w.metrics.batch_received(specs.len());
    let answers: FuturesUnordered<_> = specs
        .into_iter()
        .enumerate()
        .map(|(index, spec)| {
            let (w, tenant) = (w.clone(), tenant.clone());
            async move { BatchItem { index: index as u32, answer: run_one(&w, &tenant, spec).await } }
        })
        .collect();
    let frames = answers.map(|item| {
        let frame = encode_frame(&item).unwrap_or_else(|e| {
            let answer = BatchAnswer::Refused {
                status: StatusCode::INTERNAL_SERVER_ERROR.as_u16(),
                message: format!("cannot encode the result: {e}"),
                largest_job: None,
            };
            encode_frame(&BatchItem { index: item.index, answer }).expect("a refusal encodes")
        });
        Ok::<_, Infallible>(Bytes::from(frame))
    });
    ([(header::CONTENT_TYPE, POSTCARD)], Body::from_stream(frames)).into_response()
}
