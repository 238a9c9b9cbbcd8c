//! What every request goes through before a handler sees it: the protocol
//! version (middleware), the caller's tenant ([`Caller`], from the
//! `Authorization` header alone), and a size-capped body ([`Body`],
//! [`Postcard`]).
//!
//! Routes with bodies check the tenant in [`tenant_first`], before the
//! handler runs, so a request without a valid token is refused before its
//! body is read into memory (it is dropped unread, so the client still sees
//! the 401). Each kind of body has its own cap (a
//! gossip message is kilobytes, a module megabytes, a batch of jobs with
//! their inputs more); a body over its cap is answered `413` naming it, and
//! nothing of it is decoded.

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use serde::de::DeserializeOwned;

use super::response::text;
use crate::proto::{MAX_INPUT_BYTES, PROTOCOL_HEADER, PROTOCOL_VERSION};
use crate::units::Bytes as Size;
use crate::worker::state::Worker;
use crate::worker::tenants::{AuthError, Sees, Tenant};

/// The most a `POST /v1/jobs` body may be: one job's spec and its input.
pub const JOB_BODY: usize = MAX_INPUT_BYTES as usize + (1 << 20);

/// The most a `POST /v1/jobs/batch` body may be.
pub const BATCH_BODY: usize = 256 << 20;

/// The most a `POST /v1/gossip` body may be. A message carries at most 256
/// node states of well under a kilobyte each.
pub const GOSSIP_BODY: usize = 16 << 20;

/// Bytes of an unauthenticated request's body read (and dropped, never
/// held) before it is answered 401, so that a client still sending it
/// sees the answer rather than a broken connection. Past this, the
/// connection is closed.
pub const DISCARD_UNAUTHENTICATED: usize = 8 << 20;

/// How long a request's body may take to arrive: 64 MiB at ~0.5 MB/s.
/// A client that trickles a body holds a connection no longer than this.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(120);

/// How long an unauthenticated body is read (and dropped) before its 401.
pub const DISCARD_TIMEOUT: Duration = Duration::from_secs(10);

/// The tenant a request comes from, by its bearer token (the one tenant
/// when the worker has no `--tenants`). Rejected with 401, counted.
#[derive(Clone)]
pub struct Caller(pub Arc<Tenant>);

/// The bearer token of a request, if any.
pub fn bearer(headers: &axum::http::HeaderMap) -> Option<&str> {
    token(headers)
}

fn token(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

/// The 401 for `e`, counted.
fn unauthorized(w: &Worker, e: AuthError) -> Response {
    w.metrics.refused("unauthorized");
    let why = match e {
        AuthError::Missing => "this worker needs a tenant token: give --token or PEERWASM_TOKEN",
        AuthError::Unknown => "the tenant token is not known here",
    };
    let mut resp = text(StatusCode::UNAUTHORIZED, why);
    resp.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
    resp
}

/// The caller of a request with these headers, or the 401 to answer.
fn authenticate(w: &Worker, headers: &axum::http::HeaderMap) -> Result<Caller, Response> {
    w.tenants.authenticate(token(headers)).map(Caller).map_err(|e| unauthorized(w, e))
}

/// What the caller may see of tenants' usage (`/v1/peers`, `/`,
/// `/metrics`): no token is fine (it sees none); a wrong one is a 401.
pub struct Viewer(pub Sees);

impl FromRequestParts<Arc<Worker>> for Viewer {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, w: &Arc<Worker>) -> Result<Viewer, Response> {
        w.tenants.sees(token(&parts.headers)).map(Viewer).map_err(|e| unauthorized(w, e))
    }
}

impl FromRequestParts<Arc<Worker>> for Caller {
    type Rejection = Response;

    /// The tenant [`tenant_first`] found, or from the headers.
    async fn from_request_parts(parts: &mut Parts, w: &Arc<Worker>) -> Result<Caller, Response> {
        match parts.extensions.get::<Caller>() {
            Some(caller) => Ok(caller.clone()),
            None => authenticate(w, &parts.headers),
        }
    }
}

/// Middleware for routes with bodies: the tenant is checked from the
/// headers before anything of the body is read; a refused request's body
/// is dropped unread, up to [`DISCARD_UNAUTHENTICATED`], before the 401.
pub async fn tenant_first(State(w): State<Arc<Worker>>, mut req: Request, next: Next) -> Response {
    match authenticate(&w, req.headers()) {
        Ok(caller) => {
            req.extensions_mut().insert(caller);
            next.run(req).await
        }
        Err(refusal) => {
            let _ = tokio::time::timeout(DISCARD_TIMEOUT, discard(req.into_body(), DISCARD_UNAUTHENTICATED)).await;
            refusal
        }
    }
}

/// Reads and drops up to `max` bytes of `body`.
async fn discard(body: axum::body::Body, max: usize) {
    use http_body_util::BodyExt;
    let mut body = body;
    let mut seen = 0;
    while seen <= max {
        match body.frame().await {
            Some(Ok(frame)) => seen += frame.data_ref().map_or(0, |d| d.len()),
            _ => return,
        }
    }
}

/// A kind of request body: what it is called in messages, and its cap.
pub trait BodyKind {
    /// What the body is, for messages ("job request").
    const WHAT: &'static str;
    /// The most it may be, in bytes.
    fn limit(w: &Worker) -> usize;
}

macro_rules! body_kind {
    ($name:ident, $what:literal, |$w:ident| $limit:expr) => {
        #[doc = concat!("A ", $what, ".")]
        pub struct $name;
        impl BodyKind for $name {
            const WHAT: &'static str = $what;
            fn limit($w: &Worker) -> usize {
                $limit
            }
        }
    };
}

body_kind!(JobBody, "job request", |_w| JOB_BODY);
body_kind!(BatchBody, "batch request", |_w| BATCH_BODY);
body_kind!(SubmissionBody, "submission", |_w| crate::proto::submission::MAX_SUBMISSION_BYTES as usize);
body_kind!(GossipBody, "gossip message", |_w| GOSSIP_BODY);
body_kind!(ModuleBody, "module", |w| usize::try_from(w.runner.sandbox().config().max_module_bytes).unwrap_or(usize::MAX));

/// A whole request body of kind `K`, read up to its cap.
pub struct Body<K>(pub Bytes, pub PhantomData<K>);

impl<K: BodyKind> FromRequest<Arc<Worker>> for Body<K> {
    type Rejection = Response;

    async fn from_request(req: Request, w: &Arc<Worker>) -> Result<Body<K>, Response> {
        let limit = K::limit(w);
        // Read up to the cap, then refuse: a client that declared more is
        // still sending, and reading to the cap lets it see the 413.
        let read = tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(req.into_body(), limit)).await;
        let Ok(read) = read else {
            return Err(text(
                StatusCode::REQUEST_TIMEOUT,
                format!("the {} did not arrive within {}", K::WHAT, humantime::format_duration(BODY_TIMEOUT)),
            ));
        };
        match read {
            Ok(bytes) => Ok(Body(bytes, PhantomData)),
            Err(e) => {
                let e = e.into_inner();
                if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() {
                    Err(text(StatusCode::PAYLOAD_TOO_LARGE, format!("a {} may be at most {}", K::WHAT, Size(limit as u64))))
                } else {
                    Err(text(StatusCode::BAD_REQUEST, format!("cannot read the {}: {e}", K::WHAT)))
                }
            }
        }
    }
}

/// A postcard-encoded request body of kind `K`, decoded defensively: bad
/// bytes get a 400 naming what could not be read.
pub struct Postcard<T, K>(pub T, pub PhantomData<K>);

impl<T: DeserializeOwned, K: BodyKind> FromRequest<Arc<Worker>> for Postcard<T, K> {
    type Rejection = Response;

    async fn from_request(req: Request, w: &Arc<Worker>) -> Result<Postcard<T, K>, Response> {
        let Body(bytes, _) = Body::<K>::from_request(req, w).await?;
        postcard::from_bytes(&bytes)
            .map(|v| Postcard(v, PhantomData))
            .map_err(|e| text(StatusCode::BAD_REQUEST, format!("bad {}: {e}", K::WHAT)))
    }
}

/// Middleware: refuses requests that speak another protocol version. A
/// request without the header (curl) is taken as ours.
pub async fn protocol(req: Request, next: Next) -> Response {
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
