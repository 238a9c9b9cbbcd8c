//! `POST /v1/jobs/batch`: many jobs of one tenant in one request, each
//! answered in its own frame the moment it ends (the format is in
//! [`crate::proto::batch`]).
//!
//! Each job goes through exactly the path of `POST /v1/jobs`
//! ([`jobs::run_attached`]: checks, admission, fair share, accounting);
//! only the HTTP exchange is shared. The jobs live inside the response
//! stream: if the client hangs up, the stream is dropped, and with it every
//! job of the batch — queued ones leave the queue, running ones are
//! cancelled and give back their slots as soon as they stop.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use futures::stream::FuturesUnordered;

use super::extract::{BatchBody, Caller, Postcard};
use super::response::{batch_refusal, text};
use crate::proto::batch::{BatchAnswer, BatchItem, MAX_BATCH_JOBS, encode_frame};
use crate::proto::{JobSpec, POSTCARD};
use crate::worker::jobs;
use crate::worker::refused::Refused;
use crate::worker::state::Worker;

pub async fn post_batch(
    State(w): State<Arc<Worker>>,
    Caller(tenant): Caller,
    Postcard(specs, charge, _): Postcard<Vec<JobSpec>, BatchBody>,
) -> Response {
    if specs.len() > MAX_BATCH_JOBS {
        return text(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "a batch of {} jobs is more than the limit of {MAX_BATCH_JOBS}",
                specs.len()
            ),
        );
    }
    if w.jobs.gate.draining() {
        w.jobs.metrics.refused("draining");
        return Refused::Busy("this worker is shutting down".into()).into_response();
    }
    w.jobs.metrics.batch_received(specs.len());
    // The request's charge covers its bytes until its jobs are queued: then
    // their specs are the queue's (bounded by `--max-queued-bytes`), and a
    // job must never wait for memory its own request holds. So the charge
    // is given back as the answer is first polled, before any job is
    // admitted.
    let answers = futures::stream::once(async move {
        drop(charge);
        specs
            .into_iter()
            .enumerate()
            .map(|(index, spec)| {
                let (jobs_path, tenant) = (w.jobs.clone(), tenant.clone());
                async move {
                    let answer = match jobs::run_attached(
                        &jobs_path,
                        &tenant,
                        spec,
                        jobs::Streams::default(),
                        |_| {},
                    )
                    .await
                    {
                        Ok(result) => BatchAnswer::Done(result),
                        Err(refused) => batch_refusal(refused),
                    };
                    BatchItem {
                        index: index as u32,
                        answer,
                    }
                }
            })
            .collect::<FuturesUnordered<_>>()
    })
    .flatten();
    let frames = answers.map(|item| {
        let frame = encode_frame(&item).unwrap_or_else(|e| {
            let answer = batch_refusal(Refused::Internal(format!("cannot encode the result: {e}")));
            encode_frame(&BatchItem {
                index: item.index,
                answer,
            })
            .expect("a refusal encodes")
        });
        Ok::<_, Infallible>(Bytes::from(frame))
    });
    (
        [(header::CONTENT_TYPE, POSTCARD)],
        Body::from_stream(frames),
    )
        .into_response()
}
