//! The endpoints about the pool rather than one job: `POST /v1/gossip`
//! (anti-entropy, see `gossip::transport`), `GET /v1/peers` (the pool as
//! this worker sees it, JSON or postcard), `GET /metrics` (Prometheus
//! text) and `GET /` (the status page for browsers, the peers table as text
//! for other clients).

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::extract::{Body, GossipBody, Viewer};
use super::response::{json, postcard, text};
use crate::proto::POSTCARD;
use crate::worker::state::Worker;
use crate::worker::tenants::Sees;

pub async fn post_gossip(State(w): State<Arc<Worker>>, Body(body, _charge, _): Body<GossipBody>) -> Response {
    use crate::gossip::transport::GossipError;
    match w.gossip.handle(&body) {
        Ok(reply) => ([(header::CONTENT_TYPE, POSTCARD)], reply).into_response(),
        Err(e @ GossipError::Malformed(_)) => text(StatusCode::BAD_REQUEST, e.to_string()),
        Err(e @ GossipError::Unauthenticated(_)) => text(StatusCode::UNAUTHORIZED, e.to_string()),
    }
}

fn accepts(headers: &HeaderMap, what: &str) -> bool {
    headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|v| v.contains(what))
}

pub async fn get_peers(State(w): State<Arc<Worker>>, Viewer(sees): Viewer, headers: HeaderMap) -> Response {
    let views = w.peer_views(&sees);
    if accepts(&headers, POSTCARD) { postcard(&views) } else { json(&views) }
}

/// Metrics name tenants, so with `--tenants` they are an operator's.
pub async fn get_metrics(State(w): State<Arc<Worker>>, Viewer(sees): Viewer) -> Response {
    if sees != Sees::All {
        let mut resp = text(
            StatusCode::UNAUTHORIZED,
            "/metrics names tenants: scrape it with the token of a tenant marked operator = true in --tenants",
        );
        resp.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
        return resp;
    }
    ([(header::CONTENT_TYPE, crate::worker::metrics::CONTENT_TYPE)], w.metrics_text()).into_response()
}

/// The status page (`status.html`, served from the binary) for browsers;
/// the peers table as text for `curl` and other clients.
pub async fn status_page(State(w): State<Arc<Worker>>, Viewer(sees): Viewer, headers: HeaderMap) -> Response {
    if accepts(&headers, "text/html") {
        return ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], STATUS_PAGE).into_response();
    }
    text(StatusCode::OK, crate::gossip::peers_table(&w.peer_views(&sees)))
}

/// The status page: plain HTML, CSS and JS that polls `GET /v1/peers`.
const STATUS_PAGE: &str = include_str!("status.html");
