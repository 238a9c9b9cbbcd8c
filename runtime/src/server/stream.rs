//! `POST /v1/jobs/stream`: one job whose stdin flows in and whose output
//! flows out while it runs (the format is in [`crate::proto::stream`]).
//!
//! The job goes through exactly the path of `POST /v1/jobs`
//! ([`jobs::run_attached`]: checks, admission, fair share, accounting);
//! what differs is only where its stdin comes from and where its output
//! goes as it is written. Three pieces run at once:
//! * the handler reads the head (the spec), admits the job and answers
//!   `200` — or the refusal, before any stdin was sent;
//! * a feeder moves the rest of the request body into the job's stdin,
//!   counting it against the input limit;
//! * the job's task forwards its output as frames and ends with its
//!   result. If the client hangs up, the answer is dropped: the task sees
//!   it and drops the job, which cancels it.
//!
//! The output is kept nowhere but on its way to the client, and every
//! byte of it is charged to the worker's memory (a `Hold`) from the
//! moment the job writes it until the connection takes it: a client that
//! does not read keeps its output charged, never free. So what a client
//! leaves unread is bounded twice: in time — a stream that takes nothing
//! for the worker's unread grace (`--unread-grace`, 30 s) is dropped, the
//! job cancelled and its output given back, and once the job has ended the
//! client has that long to take the rest — and in bytes, per tenant (the
//! worker's `unsent_output` shares): past its share, the job's writes fail
//! as they would past the worker's memory, and other tenants' jobs keep
//! theirs.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use tokio::sync::{mpsc, oneshot};

use super::extract::{BODY_TIMEOUT, Caller};
use super::response::text;
use crate::proto::frame::{FrameReader, encode_frame};
use crate::proto::stream::{MAX_HEAD, StreamEvent};
use crate::proto::{
    CancelCause, JOB_ID_HEADER, JobResult, JobSpec, MAX_INPUT_BYTES, Outcome, POSTCARD,
};
use crate::sandbox::{Cancel, OutputChunk, StdinFeed, StdinSender};
use crate::units::Bytes as Size;
use crate::worker::jobs::{self, Streams};
use crate::worker::ledger::Hold;
use crate::worker::refused::Refused;
use crate::worker::state::Worker;
use crate::worker::tenants::Tenant;

/// Event frames the answer holds before the job's task waits for the
/// client to read.
const EVENTS_IN_FLIGHT: usize = 64;

/// How long a client may take no output, while the job runs or after it
/// ended, before its stream is dropped (`--unread-grace`).
pub const DEFAULT_UNREAD_GRACE: std::time::Duration = std::time::Duration::from_secs(30);

type DataStream = axum::body::BodyDataStream;

/// `POST /v1/jobs/stream` (see the module docs): the head, then the job
/// runs in a task of its own while this answers with its events.
pub async fn post_stream(
    State(w): State<Arc<Worker>>,
    Caller(tenant): Caller,
    req: Request,
) -> Response {
    let connection = req.extensions().get::<super::serve::Trust>().cloned();
    let mut body = req.into_body().into_data_stream();
    let (spec, rest) = match tokio::time::timeout(BODY_TIMEOUT, read_head(&mut body)).await {
        Ok(Ok(head)) => head,
        Ok(Err(refusal)) => return refusal,
        Err(_) => {
            let why = format!(
                "the job's spec did not arrive within {}",
                humantime::format_duration(BODY_TIMEOUT)
            );
            return text(StatusCode::REQUEST_TIMEOUT, why);
        }
    };
    let (stdin, feed) = StdinFeed::channel();
    // Unbounded in items, bounded in bytes: each is charged to `hold` as
    // the job writes it (within its output cap) and given back as sent.
    let (tee, output) = mpsc::unbounded_channel();
    let (events, answer) = mpsc::channel::<(Bytes, u64)>(EVENTS_IN_FLIGHT);
    let share = w.requests.unsent_output.of(&tenant.name);
    let hold = Arc::new(
        w.jobs
            .admission
            .ledger()
            .hold(crate::worker::HoldKind::Output)
            .within(share),
    );
    let sent = hold.clone();
    let (admitted_tx, admitted) = oneshot::channel::<String>();
    let (refused_tx, refused) = oneshot::channel::<Refused>();
    // Raised by the feeder when the request breaks off: hyper may not drop
    // an idle answer until it next writes to the dead connection.
    let gone = Cancel::new();
    let client_gone = gone.clone();
    tokio::spawn(
        Attached {
            w,
            tenant,
            spec,
            tee,
            feed,
            hold,
            output,
            events,
            admitted_tx,
            refused_tx,
            client_gone,
            connection,
        }
        .run(),
    );
    let id = match admitted.await {
        Ok(id) => id,
        Err(_) => {
            return match refused.await {
                Ok(refusal) => refusal.into_response(),
                Err(_) => text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "the job's task ended without an answer",
                ),
            };
        }
    };
    tokio::spawn(feed_stdin(body, rest, stdin, gone));
    // Output is given back to the ledger as the connection takes it.
    let frames = futures::stream::unfold(answer, move |mut rx| {
        let sent = sent.clone();
        async move {
            let (frame, output) = rx.recv().await?;
            sent.release(output);
            Some((Ok::<_, Infallible>(frame), rx))
        }
    });
    let mut resp = (
        [(header::CONTENT_TYPE, POSTCARD)],
        Body::from_stream(frames),
    )
        .into_response();
    if let Ok(v) = header::HeaderValue::from_str(&id) {
        resp.headers_mut().insert(JOB_ID_HEADER, v);
    }
    resp
}

/// A streamed job's own task: it runs the job, forwards its output as
/// events while it runs, then the rest and its result, and says when the
/// job was queued (`admitted_tx`, the answer begins) or refused before
/// that (`refused_tx`, the answer is a status).
struct Attached {
    w: Arc<Worker>,
    tenant: Arc<Tenant>,
    spec: JobSpec,
    tee: mpsc::UnboundedSender<OutputChunk>,
    feed: StdinFeed,
    hold: Arc<Hold>,
    output: mpsc::UnboundedReceiver<OutputChunk>,
    events: mpsc::Sender<(Bytes, u64)>,
    admitted_tx: oneshot::Sender<String>,
    refused_tx: oneshot::Sender<Refused>,
    client_gone: Cancel,
    /// The request's connection: closed when its client reads nothing
    /// for the grace (an answer stuck on its way out holds what it
    /// carries until the connection goes).
    connection: Option<super::serve::Trust>,
}

impl Attached {
    async fn run(self) {
        let Attached {
            w,
            tenant,
            spec,
            tee,
            feed,
            hold,
            mut output,
            events,
            admitted_tx,
            refused_tx,
            client_gone,
            connection,
        } = self;
        let drop_stream = || {
            if let Some(c) = &connection {
                c.close();
            }
        };
        let (asked, peer, grace) = (
            spec.limits.memory.bytes(),
            w.jobs.addr.clone(),
            w.requests.unread_grace,
        );
        let queued = std::sync::atomic::AtomicBool::new(false);
        let streams = Streams {
            tee: Some(tee),
            stdin: Some(feed),
            captures: None,
            hold: Some(hold),
            forward_only: true,
        };
        let run = jobs::run_attached(&w.jobs, &tenant, spec, streams, |id| {
            queued.store(true, std::sync::atomic::Ordering::Relaxed);
            let _ = admitted_tx.send(id.to_string());
        });
        tokio::pin!(run);
        let result = loop {
            tokio::select! {
                biased;
                Some((stream, bytes)) = output.recv() => {
                    match tokio::time::timeout(grace, send_output(&events, stream, &bytes)).await {
                        Ok(true) => {}
                        Ok(false) => return, // the client went: dropping `run` cancels the job
                        Err(_) => {
                            // It stopped reading: dropped, as if it had gone.
                            w.jobs.metrics.refused("unread_stream");
                            tracing::warn!(tenant = %tenant.name, "a streamed job's client read nothing for {}: \
                                its stream is dropped and the job cancelled", humantime::format_duration(grace));
                            drop_stream();
                            return;
                        }
                    }
                }
                ended = &mut run => break ended,
                () = events.closed() => return,
                _ = client_gone.cancelled() => return,
            }
        };
        let mut result = match result {
            Ok(result) => result,
            Err(refusal) => match queued.load(std::sync::atomic::Ordering::Relaxed) {
                // Refused before it was queued: answered as a status.
                false => {
                    let _ = refused_tx.send(refusal);
                    return;
                }
                // Refused after waiting in the queue: the answer has begun.
                true => {
                    let mut r = JobResult::never_ran(
                        asked,
                        Outcome::Rejected {
                            reason: refusal.to_string(),
                        },
                    );
                    r.peer = peer;
                    r
                }
            },
        };
        // The job has ended: the rest of its output, if the client takes
        // it in time.
        let rest = async {
            while let Ok((stream, bytes)) = output.try_recv() {
                if !send_output(&events, stream, &bytes).await {
                    return;
                }
            }
            result.stdout.clear();
            result.stderr.clear();
            send(&events, &StreamEvent::Done(result), 0).await;
        };
        if tokio::time::timeout(grace, rest).await.is_err() {
            w.jobs.metrics.refused("unread_stream");
            tracing::debug!("a streamed job's client did not read its output: dropped");
            drop_stream();
        }
    }
}

/// Reads the head frame (the job's spec); returns it and the bytes after it.
async fn read_head(body: &mut DataStream) -> Result<(JobSpec, Vec<u8>), Response> {
    let mut reader = FrameReader::default();
    loop {
        match reader.next_frame_within::<JobSpec>(MAX_HEAD) {
            Ok(Some(spec)) => return Ok((spec, reader.take_rest())),
            Ok(None) => {}
            Err(e) => return Err(text(StatusCode::BAD_REQUEST, format!("bad job spec: {e}"))),
        }
        match body.next().await {
            Some(Ok(bytes)) => reader.push(&bytes),
            Some(Err(e)) => {
                return Err(text(
                    StatusCode::BAD_REQUEST,
                    format!("cannot read the job's spec: {e}"),
                ));
            }
            None => {
                return Err(text(
                    StatusCode::BAD_REQUEST,
                    "the request ended before the job's spec did",
                ));
            }
        }
    }
}

/// Moves the rest of the request body into the job's stdin, within the
/// input limit; stops when the job no longer reads it. If the request
/// breaks off, the client is gone: `gone` is raised, which cancels the job.
async fn feed_stdin(mut body: DataStream, rest: Vec<u8>, stdin: StdinSender, gone: Cancel) {
    let mut sent = 0u64;
    let mut next = (!rest.is_empty()).then(|| Ok(Bytes::from(rest)));
    loop {
        let chunk = match next.take() {
            Some(chunk) => chunk,
            None => tokio::select! {
                chunk = body.next() => match chunk {
                    Some(chunk) => chunk,
                    None => return, // the end of stdin
                },
                () = stdin.closed() => return, // the job has ended
            },
        };
        let bytes = match chunk {
            Ok(bytes) => bytes,
            Err(_) => {
                // The job must not take the break for the end of its input.
                gone.cancel(CancelCause::ClientGone);
                return;
            }
        };
        sent += bytes.len() as u64;
        if sent > MAX_INPUT_BYTES {
            let why = format!(
                "stdin is larger than the worker's input limit of {}",
                Size(MAX_INPUT_BYTES)
            );
            let _ = stdin.send(Err(std::io::Error::other(why))).await;
            return;
        }
        if stdin.send(Ok(bytes)).await.is_err() {
            return;
        }
    }
}

/// Sends a chunk of output; false if the client has gone.
async fn send_output(
    events: &mpsc::Sender<(Bytes, u64)>,
    stream: crate::proto::StdStream,
    bytes: &[u8],
) -> bool {
    send(
        events,
        &StreamEvent::Output {
            stream,
            bytes: bytes.to_vec(),
        },
        bytes.len() as u64,
    )
    .await
}

/// Sends one event carrying `output` bytes of the job's output; false if
/// the client has gone.
async fn send(events: &mpsc::Sender<(Bytes, u64)>, event: &StreamEvent, output: u64) -> bool {
    let frame = match encode_frame(event) {
        Ok(frame) => frame,
        Err(e) => {
            tracing::error!("cannot encode a stream event: {e}");
            return false;
        }
    };
    events.send((Bytes::from(frame), output)).await.is_ok()
}
