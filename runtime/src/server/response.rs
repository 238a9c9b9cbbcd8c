//! How the worker answers: plain-text messages, postcard and JSON bodies,
//! and one mapping from a job's [`Refused`] to its HTTP status — used for a
//! single job's response and for a job's frame within a batch alike.

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::proto::batch::BatchAnswer;
use crate::proto::{LARGEST_JOB_HEADER, POSTCARD};
use crate::worker::refused::Refused;

/// Middleware: every answer says `X-Content-Type-Options: nosniff`, so a
/// browser never reads a job's output or a message (which may quote what a
/// guest or a stranger chose) as anything but the type it is sent as.
pub async fn nosniff(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let mut resp = next.run(req).await;
    resp.headers_mut().insert(
        header::X_CONTENT_TYPE_OPTIONS,
        header::HeaderValue::from_static("nosniff"),
    );
    resp
}

/// A plain-text message with `status`.
pub fn text(status: StatusCode, message: impl Into<String>) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        message.into() + "\n",
    )
        .into_response()
}

/// `value` as a postcard body (500 if it cannot be encoded).
pub fn postcard<T: Serialize>(value: &T) -> Response {
    match postcard::to_allocvec(value) {
        Ok(bytes) => ([(header::CONTENT_TYPE, POSTCARD)], bytes).into_response(),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot encode the answer: {e}"),
        ),
    }
}

/// `value` as a JSON body (500 if it cannot be encoded).
pub fn json<T: Serialize>(value: &T) -> Response {
    match serde_json::to_vec(value) {
        Ok(b) => ([(header::CONTENT_TYPE, "application/json")], b).into_response(),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// The status a refusal is answered with.
fn status(r: &Refused) -> StatusCode {
    match r {
        Refused::Invalid(_) => StatusCode::BAD_REQUEST,
        Refused::InputTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
        Refused::UnknownModule(_) => StatusCode::NOT_FOUND,
        Refused::MissingFiles(_) => StatusCode::FAILED_DEPENDENCY,
        Refused::TooLarge { .. } | Refused::TooLong(_) => StatusCode::UNPROCESSABLE_ENTITY,
        Refused::Busy(_) => StatusCode::SERVICE_UNAVAILABLE,
        Refused::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

fn largest(r: &Refused) -> Option<u64> {
    match r {
        Refused::TooLarge { largest, .. } => Some(*largest),
        _ => None,
    }
}

impl IntoResponse for Refused {
    /// 400, 404 (upload the module), 424 (send the job's trees), 413, 422 (with header
    /// `peerwasm-largest-job` when memory is why), 503 (with `Retry-After`).
    fn into_response(self) -> Response {
        let status = status(&self);
        let mut resp = text(status, self.to_string());
        if status == StatusCode::SERVICE_UNAVAILABLE {
            resp.headers_mut().insert(header::RETRY_AFTER, 1.into());
        }
        if let Some(largest) = largest(&self) {
            resp.headers_mut()
                .insert(LARGEST_JOB_HEADER, largest.into());
        }
        resp
    }
}

/// A refusal as one job's answer within a batch.
pub fn batch_refusal(r: Refused) -> BatchAnswer {
    BatchAnswer::Refused {
        status: status(&r).as_u16(),
        largest_job: largest(&r),
        message: r.to_string(),
    }
}
