//! What a request may carry, per kind, and which protocol it must speak.
//!
//! Every body is size-capped before it is read, each kind at its own limit
//! (a gossip message is kilobytes, a module megabytes, a batch of jobs with
//! their inputs more); a body over its limit is answered `413` with a
//! message naming the limit, and nothing of it is decoded. A request that
//! names a protocol version other than ours (header
//! [`PROTOCOL_HEADER`]) is answered `400`
//! before any handler sees it; a request without the header (curl) is taken
//! as ours.

use axum::body::Bytes;
use axum::extract::Request;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::Response;

use super::server::text;
use crate::proto::{MAX_INPUT_BYTES, PROTOCOL_HEADER, PROTOCOL_VERSION};
use crate::units::Bytes as Size;

/// The most a `POST /v1/jobs` body may be: one job's spec and its input.
pub const JOB_BODY: usize = MAX_INPUT_BYTES as usize + (1 << 20);

/// The most a `POST /v1/jobs/batch` body may be.
pub const BATCH_BODY: usize = 256 << 20;

/// The most a `POST /v1/gossip` body may be. A message carries at most 256
/// node states of well under a kilobyte each.
pub const GOSSIP_BODY: usize = 16 << 20;

/// The body of a request whose kind is `what` and limit `limit`, or the
/// response to give: 413 naming the limit, or 400 for a body that could
/// not be read.
pub(super) fn body(read: Result<Bytes, BytesRejection>, what: &str, limit: usize) -> Result<Bytes, Response> {
    read.map_err(|rejection| match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => {
            text(StatusCode::PAYLOAD_TOO_LARGE, format!("a {what} may be at most {}", Size(limit as u64)))
        }
        status => text(status, format!("cannot read the {what}: {}", rejection.body_text())),
    })
}

/// Middleware: refuses requests that speak another protocol version.
pub(super) async fn protocol(req: Request, next: Next) -> Response {
    if let Some(v) = req.headers().get(PROTOCOL_HEADER)
        && v.as_bytes() != PROTOCOL_VERSION.as_bytes()
    {
        return text(
            StatusCode::BAD_REQUEST,
            format!(
                "this worker speaks peerwasm protocol {PROTOCOL_VERSION}, the request protocol {}: \
                 run the same peerwasm version on both sides",
                String::from_utf8_lossy(v.as_bytes())
            ),
        );
    }
    next.run(req).await
}
