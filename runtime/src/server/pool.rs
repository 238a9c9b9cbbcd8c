//! The endpoints about the pool rather than one job: `POST /v1/gossip`
//! (anti-entropy, see `gossip::transport`), `POST /v1/backlog` (what a
//! running map still has to run: postcard `proto::backlog::Backlog`, 204;
//! 400 for a report no client could send, 503 when the tenant or the
//! worker holds as many as it may), `GET /v1/peers` (the pool as this
//! worker sees it, JSON or postcard), `GET /metrics` (Prometheus
//! text) and `GET /` (the status page for browsers, the peers table as text
//! for other clients).

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::extract::{
    GOSSIP_BODY, STRANGER_PACE, Viewer, next_chunk, over_budget, read_charged, refuse_too_large,
};
use super::response::{json, postcard, text};
use super::serve::{Remote, Trust};
use crate::proto::POSTCARD;
use crate::units::Bytes as Size;
use crate::worker::budget::{Charge, Payer};
use crate::worker::state::Worker;
use crate::worker::tenants::Sees;

pub async fn post_gossip(State(w): State<Arc<Worker>>, req: axum::extract::Request) -> Response {
    use crate::gossip::transport::GossipError;
    let (body, _charge) = match read_gossip(&w, req).await {
        Ok(read) => read,
        Err(refusal) => return refusal,
    };
    match w.node.gossip.handle(&body) {
        Ok(reply) => ([(header::CONTENT_TYPE, POSTCARD)], reply).into_response(),
        Err(e @ GossipError::Malformed(_)) => text(StatusCode::BAD_REQUEST, e.to_string()),
        Err(e @ GossipError::Unauthenticated(_)) => text(StatusCode::UNAUTHORIZED, e.to_string()),
    }
}

/// A gossip body, charged as it is read. Under a key its head comes first
/// ([`HEADER`](crate::gossip::auth::HEADER) bytes, charged to the sender's
/// address like any stranger's): only when it proves the sender knows the
/// key is the rest read, charged to the sender as a peer (its own budget,
/// apart from strangers'), and the connection marked as one that belongs.
/// A stranger thus holds at most a head's worth of the gossip budget, for
/// at most the pace's grace.
async fn read_gossip(
    w: &Worker,
    req: axum::extract::Request,
) -> Result<(axum::body::Bytes, Charge), Response> {
    use crate::gossip::auth::HEADER;
    use crate::gossip::transport::GossipError;
    let ip = req
        .extensions()
        .get::<Remote>()
        .map_or(std::net::Ipv4Addr::UNSPECIFIED.into(), |r| r.0);
    let trust = req.extensions().get::<Trust>().cloned();
    let mut stranger = w.requests.budgets.charge(Payer::Address(ip));
    let mut body = req.into_body();
    let what = "gossip message";
    let too_large = || {
        text(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "a gossip message may be at most {}",
                Size(GOSSIP_BODY as u64)
            ),
        )
    };
    if axum::body::HttpBody::size_hint(&body)
        .exact()
        .is_some_and(|n| n > GOSSIP_BODY as u64)
    {
        return Err(refuse_too_large(body, what, GOSSIP_BODY, STRANGER_PACE).await);
    }
    if !w.node.gossip.is_keyed() {
        let bytes = read_charged(
            w,
            body,
            "gossip message",
            GOSSIP_BODY,
            STRANGER_PACE,
            &mut stranger,
        )
        .await?;
        return Ok((bytes, stranger));
    }
    let start = tokio::time::Instant::now();
    let mut buf: Vec<u8> = Vec::new();
    while buf.len() < HEADER {
        let Some(data) = next_chunk(&mut body, what, STRANGER_PACE, start, buf.len()).await? else {
            break;
        };
        if buf.len() + data.len() > GOSSIP_BODY {
            return Err(too_large());
        }
        stranger
            .grow(data.len() as u64)
            .map_err(|e| over_budget(w, e))?;
        buf.extend_from_slice(&data);
    }
    let len = match w.node.gossip.precheck(&buf) {
        Ok(len) => len.unwrap_or(0),
        Err(e @ GossipError::Unauthenticated(_)) => {
            return Err(text(StatusCode::UNAUTHORIZED, e.to_string()));
        }
        Err(e) => return Err(text(StatusCode::BAD_REQUEST, e.to_string())),
    };
    let total = (HEADER as u64).saturating_add(len);
    if total > GOSSIP_BODY as u64 {
        return Err(too_large());
    }
    if let Some(trust) = trust {
        trust.grant();
    }
    let mut peer = w.requests.budgets.charge(Payer::Peer(ip));
    peer.grow(total).map_err(|e| over_budget(w, e))?;
    drop(stranger);
    buf.reserve_exact((total as usize).saturating_sub(buf.len()));
    while (buf.len() as u64) < total {
        let Some(data) = next_chunk(&mut body, what, STRANGER_PACE, start, buf.len()).await? else {
            break;
        };
        if buf.len() as u64 + data.len() as u64 > total {
            return Err(text(
                StatusCode::BAD_REQUEST,
                "the gossip message is longer than its head says",
            ));
        }
        buf.extend_from_slice(&data);
    }
    Ok((axum::body::Bytes::from(buf), peer))
}

pub async fn post_backlog(
    State(w): State<Arc<Worker>>,
    super::extract::Caller(tenant): super::extract::Caller,
    super::extract::Postcard(backlog, _charge, _): super::extract::Postcard<
        crate::proto::backlog::Backlog,
        super::extract::BacklogBody,
    >,
) -> Response {
    use crate::worker::backlogs::Refused;
    match w.node.backlogs.report(&tenant.name, backlog) {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(Refused::Invalid(why)) => text(StatusCode::BAD_REQUEST, why),
        Err(Refused::Full(why)) => text(StatusCode::SERVICE_UNAVAILABLE, why),
    }
}

fn accepts(headers: &HeaderMap, what: &str) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains(what))
}

pub async fn get_peers(
    State(w): State<Arc<Worker>>,
    Viewer(sees): Viewer,
    headers: HeaderMap,
) -> Response {
    let views = w.peer_views(&sees);
    if accepts(&headers, POSTCARD) {
        postcard(&views)
    } else {
        json(&views)
    }
}

/// What the controller growing this worker's pool directory is doing (its
/// notice: figures and its last decisions), or `null` without one. Shown
/// to whoever may see the pool view: it names no tenant.
pub async fn get_controller(
    Viewer(_sees): Viewer,
    axum::Extension(pool_dir): axum::Extension<Option<super::pooldir::PoolDir>>,
) -> Response {
    json(&pool_dir.and_then(|d| d.controller()))
}

/// Metrics name tenants, so with `--tenants` they are an operator's.
pub async fn get_metrics(State(w): State<Arc<Worker>>, Viewer(sees): Viewer) -> Response {
    if sees != Sees::All {
        let mut resp = text(
            StatusCode::UNAUTHORIZED,
            "/metrics names tenants: scrape it with the token of a tenant marked operator = true in --tenants",
        );
        resp.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
        return resp;
    }
    (
        [(header::CONTENT_TYPE, crate::worker::metrics::CONTENT_TYPE)],
        w.metrics_text(),
    )
        .into_response()
}

/// The status page (`status.html`, served from the binary) for browsers;
/// the peers table as text for `curl` and other clients.
pub async fn status_page(
    State(w): State<Arc<Worker>>,
    Viewer(sees): Viewer,
    headers: HeaderMap,
) -> Response {
    if accepts(&headers, "text/html") {
        // The page runs its own script and reads `/v1/peers` from its own
        // origin, nothing else: what an advert says (addresses, host
        // names) is shown as text, and could not load anything anyway.
        return (
            [
                (header::CONTENT_TYPE, "text/html; charset=utf-8"),
                (header::X_FRAME_OPTIONS, "DENY"),
                (header::CONTENT_SECURITY_POLICY, STATUS_PAGE_CSP),
                (header::REFERRER_POLICY, "no-referrer"),
            ],
            STATUS_PAGE,
        )
            .into_response();
    }
    text(
        StatusCode::OK,
        crate::gossip::peers_table(&w.peer_views(&sees)),
    )
}

/// The status page: plain HTML, CSS and JS that polls `GET /v1/peers`.
const STATUS_PAGE: &str = include_str!("status.html");

/// What the status page may do: its own inline style and script, fetches
/// to its own origin; no frames, no forms, no other origin.
const STATUS_PAGE_CSP: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; \
     base-uri 'none'; form-action 'none'; frame-ancestors 'none'";
