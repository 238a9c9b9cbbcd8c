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
//! nothing of it is decoded. Every byte of a body is charged before it is
//! held, to the tenant or (unauthenticated) to the address that sent it
//! and to the worker's memory (`worker::budget`), and a body must keep a
//! [`Pace`], so neither a large nor a trickled body holds what it has not
//! paid for.

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
use super::serve::Remote;
use crate::proto::{MAX_INPUT_BYTES, PROTOCOL_HEADER, PROTOCOL_VERSION};
use crate::units::Bytes as Size;
use crate::worker::budget::{Charge, ChargeRefused, Payer};
use crate::worker::state::Worker;
use crate::worker::tenants::{AuthError, Sees, Tenant};

/// The most a `POST /v1/jobs` body may be: one job's spec and its input.
pub const JOB_BODY: usize = MAX_INPUT_BYTES as usize + (1 << 20);

/// The most a `POST /v1/jobs/batch` body may be.
pub const BATCH_BODY: usize = 256 << 20;

/// The most a `POST /v1/backlog` body may be: a report is a few dozen bytes.
pub const BACKLOG_BODY: usize = 1 << 10;

/// The most a `POST /v1/gossip` body may be: the largest message a node
/// sends ([`MAX_MESSAGE_BYTES`](crate::gossip::MAX_MESSAGE_BYTES)).
pub const GOSSIP_BODY: usize = crate::gossip::MAX_MESSAGE_BYTES;

/// Bytes of an unauthenticated request's body read (and dropped, never
/// held) before it is answered 401, so that a client still sending it
/// sees the answer rather than a broken connection. Past this, the
/// connection is closed.
pub const DISCARD_UNAUTHENTICATED: usize = 8 << 20;

/// How long the head of a streamed job (its spec) may take to arrive.
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
    w.jobs.metrics.refused("unauthorized");
    let why = match e {
        AuthError::Missing => "this worker needs a tenant token: give --token or PEERWASM_TOKEN",
        AuthError::Unknown => "the tenant token is not known here",
    };
    let mut resp = text(StatusCode::UNAUTHORIZED, why);
    resp.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer"),
    );
    resp
}

/// The caller of a request with these headers, or the 401 to answer. A
/// token the worker knows marks the request's connection as one that
/// belongs (`serve::Trust`): it is never closed to make room.
// The error is the answer itself (an axum `Response`): returned once, at
// once, never carried around.
#[allow(clippy::result_large_err)]
fn authenticate(
    w: &Worker,
    parts: &axum::http::Extensions,
    headers: &axum::http::HeaderMap,
) -> Result<Caller, Response> {
    let caller = w
        .jobs
        .tenants
        .authenticate(token(headers))
        .map(Caller)
        .map_err(|e| unauthorized(w, e))?;
    if w.jobs.tenants.is_multi()
        && let Some(trust) = parts.get::<super::serve::Trust>()
    {
        trust.grant();
    }
    Ok(caller)
}

/// What the caller may see of tenants' usage (`/v1/peers`, `/`,
/// `/metrics`): no token is fine (it sees none); a wrong one is a 401.
pub struct Viewer(pub Sees);

impl FromRequestParts<Arc<Worker>> for Viewer {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, w: &Arc<Worker>) -> Result<Viewer, Response> {
        let sees = w
            .jobs
            .tenants
            .sees(token(&parts.headers))
            .map_err(|e| unauthorized(w, e))?;
        // A known token proves the connection belongs (`serve::Trust`).
        if w.jobs.tenants.is_multi()
            && sees != Sees::Nobody
            && let Some(trust) = parts.extensions.get::<super::serve::Trust>()
        {
            trust.grant();
        }
        Ok(Viewer(sees))
    }
}

impl FromRequestParts<Arc<Worker>> for Caller {
    type Rejection = Response;

    /// The tenant [`tenant_first`] found, or from the headers.
    async fn from_request_parts(parts: &mut Parts, w: &Arc<Worker>) -> Result<Caller, Response> {
        match parts.extensions.get::<Caller>() {
            Some(caller) => Ok(caller.clone()),
            None => authenticate(w, &parts.extensions, &parts.headers),
        }
    }
}

/// Middleware for routes with bodies: the tenant is checked from the
/// headers before anything of the body is read; a refused request's body
/// is dropped unread, up to [`DISCARD_UNAUTHENTICATED`], before the 401.
pub async fn tenant_first(State(w): State<Arc<Worker>>, mut req: Request, next: Next) -> Response {
    match authenticate(&w, req.extensions(), req.headers()) {
        Ok(caller) => {
            req.extensions_mut().insert(caller);
            next.run(req).await
        }
        Err(refusal) => {
            let _ = tokio::time::timeout(
                DISCARD_TIMEOUT,
                discard(req.into_body(), DISCARD_UNAUTHENTICATED),
            )
            .await;
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

/// How fast a body must arrive: after `grace`, at least `min_rate` bytes
/// a second on average since the request began. A client that trickles a
/// body (a byte a second) is cut off soon after the grace, whatever the
/// body's size, instead of holding its connection for minutes; an honest
/// slow link is far above the rate.
#[derive(Clone, Copy, Debug)]
pub struct Pace {
    /// Time before any byte need have come.
    pub grace: Duration,
    /// The slowest average rate accepted after it, in bytes a second.
    pub min_rate: u64,
}

impl Pace {
    /// When the body must have gone past `received` bytes.
    pub fn deadline(&self, start: tokio::time::Instant, received: u64) -> tokio::time::Instant {
        start + self.grace + Duration::from_secs_f64(received as f64 / self.min_rate.max(1) as f64)
    }
}

/// The pace of a tenant's bodies: 10 s, then 32 KiB/s.
pub const TENANT_PACE: Pace = Pace {
    grace: Duration::from_secs(10),
    min_rate: 32 << 10,
};

/// The pace of an unauthenticated body (gossip): a peer sends a whole
/// message at once, and gives up on its answer after 5 s.
pub const STRANGER_PACE: Pace = Pace {
    grace: Duration::from_secs(5),
    min_rate: 256 << 10,
};

/// A kind of request body: what it is called in messages, its cap, and
/// how fast it must arrive.
pub trait BodyKind {
    /// What the body is, for messages ("job request").
    const WHAT: &'static str;
    /// How fast it must arrive.
    const PACE: Pace = TENANT_PACE;
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
body_kind!(
    SubmissionBody,
    "submission",
    |_w| crate::proto::submission::MAX_SUBMISSION_BYTES as usize
);
body_kind!(BacklogBody, "backlog report", |_w| BACKLOG_BODY);
body_kind!(ModuleBody, "module", |w| usize::try_from(
    w.jobs.runner.sandbox().config().max_module_bytes
)
.unwrap_or(usize::MAX));

/// Who pays for a request's bytes: the tenant [`tenant_first`] found, else
/// the address the request came from.
pub fn payer(parts: &axum::http::Extensions) -> Payer {
    match (parts.get::<Caller>(), parts.get::<Remote>()) {
        (Some(Caller(tenant)), _) => Payer::Tenant(tenant.name.clone()),
        (None, Some(Remote(ip))) => Payer::Address(*ip),
        (None, None) => Payer::Address(std::net::Ipv4Addr::UNSPECIFIED.into()),
    }
}

/// A 503 for a charge that did not fit, counted.
pub fn over_budget(w: &Worker, e: ChargeRefused) -> Response {
    w.jobs.metrics.refused("request_bytes");
    let mut resp = text(StatusCode::SERVICE_UNAVAILABLE, e.to_string());
    resp.headers_mut()
        .insert(header::RETRY_AFTER, header::HeaderValue::from(1));
    resp
}

/// Reads `body` whole, at most `limit` bytes at the pace `pace`, every
/// byte charged to `charge` before it is held (the buffer's capacity, not
/// only its length). A declared length over the limit is refused before
/// anything is held: the body is read and dropped up to the limit so the
/// client sees the 413.
pub async fn read_charged(
    w: &Worker,
    body: axum::body::Body,
    what: &str,
    limit: usize,
    pace: Pace,
    charge: &mut Charge,
) -> Result<Bytes, Response> {
    let too_large = || {
        text(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("a {what} may be at most {}", Size(limit as u64)),
        )
    };
    let declared = axum::body::HttpBody::size_hint(&body).exact();
    let start = tokio::time::Instant::now();
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(refuse_too_large(body, what, limit, pace).await);
    }
    let mut buf: Vec<u8> = Vec::new();
    if let Some(n) = declared {
        charge.grow(n).map_err(|e| over_budget(w, e))?;
        buf.reserve_exact(n as usize);
    }
    let mut body = body;
    while let Some(data) = next_chunk(&mut body, what, pace, start, buf.len()).await? {
        let need = buf.len() + data.len();
        if need > limit {
            return Err(too_large());
        }
        if need > buf.capacity() {
            // Grown as a Vec would (doubling), and charged before.
            let cap = need.max(buf.capacity() * 2).min(limit);
            charge
                .grow((cap as u64).saturating_sub(charge.bytes()))
                .map_err(|e| over_budget(w, e))?;
            buf.reserve_exact(cap - buf.len());
        }
        buf.extend_from_slice(&data);
    }
    Ok(Bytes::from(buf))
}

/// The 413 for a body that declares more than `limit`: read and dropped
/// (never held), up to the cap, at the pace, so the client sees the answer
/// rather than a broken connection.
pub async fn refuse_too_large(
    body: axum::body::Body,
    what: &str,
    limit: usize,
    pace: Pace,
) -> Response {
    let start = tokio::time::Instant::now();
    let _ = tokio::time::timeout_at(pace.deadline(start, limit as u64), discard(body, limit)).await;
    text(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("a {what} may be at most {}", Size(limit as u64)),
    )
}

/// The next bytes of `body` (`None` at its end), if they come by the time
/// `pace` allows after `received` bytes since `start`; else the `408`.
pub async fn next_chunk(
    body: &mut axum::body::Body,
    what: &str,
    pace: Pace,
    start: tokio::time::Instant,
    received: usize,
) -> Result<Option<Bytes>, Response> {
    use http_body_util::BodyExt;
    loop {
        let deadline = pace.deadline(start, received as u64);
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => {
                let why = format!(
                    "the {what} arrived too slowly ({} in {:.0?}; at least {}/s is expected)",
                    Size(received as u64),
                    start.elapsed(),
                    Size(pace.min_rate)
                );
                return Err(text(StatusCode::REQUEST_TIMEOUT, why));
            }
            Ok(None) => return Ok(None),
            Ok(Some(Err(e))) => {
                return Err(text(
                    StatusCode::BAD_REQUEST,
                    format!("cannot read the {what}: {e}"),
                ));
            }
            Ok(Some(Ok(frame))) => frame,
        };
        if let Ok(data) = frame.into_data() {
            return Ok(Some(data));
        }
    }
}

/// A whole request body of kind `K`, read up to its cap and charged to
/// who sent it ([`payer`]) until this is dropped.
pub struct Body<K>(pub Bytes, pub Charge, pub PhantomData<K>);

impl<K: BodyKind> FromRequest<Arc<Worker>> for Body<K> {
    type Rejection = Response;

    async fn from_request(req: Request, w: &Arc<Worker>) -> Result<Body<K>, Response> {
        let mut charge = w.requests.budgets.charge(payer(req.extensions()));
        let bytes = read_charged(
            w,
            req.into_body(),
            K::WHAT,
            K::limit(w),
            K::PACE,
            &mut charge,
        )
        .await?;
        Ok(Body(bytes, charge, PhantomData))
    }
}

/// A postcard-encoded request body of kind `K`, decoded defensively: bad
/// bytes get a 400 naming what could not be read. The body's charge stays
/// with what was decoded from it, which holds as much.
pub struct Postcard<T, K>(pub T, pub Charge, pub PhantomData<K>);

impl<T: DeserializeOwned, K: BodyKind> FromRequest<Arc<Worker>> for Postcard<T, K> {
    type Rejection = Response;

    async fn from_request(req: Request, w: &Arc<Worker>) -> Result<Postcard<T, K>, Response> {
        let Body(bytes, charge, _) = Body::<K>::from_request(req, w).await?;
        postcard::from_bytes(&bytes)
            .map(|v| Postcard(v, charge, PhantomData))
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
