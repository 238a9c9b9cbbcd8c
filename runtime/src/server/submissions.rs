//! The submission endpoints (see `proto::submission` for the wire types):
//!
//! * `POST /v1/submissions` — a postcard `SubmissionSpec`; `201` with the
//!   id once it is committed; 404 when this worker lacks the module (upload
//!   it, then submit again), 400, 413, 503 (too many running);
//! * `GET /v1/submissions[/{id}]` — JSON `SubmissionInfo`s, the caller's own;
//! * `GET /v1/submissions/{id}/results?from=N&wait_ms=T` — postcard
//!   `ResultsPage`;
//! * `DELETE /v1/submissions/{id}` — JSON `{"id", "was"}`: `running`
//!   (cancelled) or `done` (discarded);
//! * `GET /v1/history?since_ms=&tenant=` — JSON `HistoryRecord`s: the
//!   caller's own, or with an operator's token anyone's (`tenant` filters).
//!
//! Another tenant's submission answers 404, exactly as one that does not
//! exist.

use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::extract::{Caller, Postcard, SubmissionBody, bearer};
use super::response::{json, postcard, text};
use crate::owner::Owner;
use crate::proto::routes::{CancelAnswer, HistoryQuery, ResultsQuery};
use crate::proto::submission::{SUBMISSION_ID_HEADER, SubmissionSpec};
use crate::worker::state::Worker;

fn failed(e: anyhow::Error) -> Response {
    text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e:#}"))
}

pub async fn post_submission(
    State(w): State<Arc<Worker>>,
    Extension(o): Extension<Arc<Owner>>,
    Caller(tenant): Caller,
    headers: HeaderMap,
    Postcard(spec, _charge, _): Postcard<SubmissionSpec, SubmissionBody>,
) -> Response {
    if w.jobs.gate.draining() {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            "this worker is shutting down",
        );
    }
    match crate::owner::run::create(&o, &tenant, bearer(&headers).map(String::from), spec).await {
        Ok(info) => {
            let mut resp = (StatusCode::CREATED, json(&info)).into_response();
            if let Ok(v) = HeaderValue::from_str(&info.id) {
                resp.headers_mut().insert(SUBMISSION_ID_HEADER, v);
            }
            resp
        }
        Err(refused) => refused.into_response(),
    }
}

pub async fn list_submissions(
    State(w): State<Arc<Worker>>,
    Extension(o): Extension<Arc<Owner>>,
    Caller(tenant): Caller,
) -> Response {
    match o.submissions.list(&w.jobs.addr, tenant.name.clone()).await {
        Ok(list) => json(&list),
        Err(e) => failed(e),
    }
}

pub async fn get_submission(
    State(w): State<Arc<Worker>>,
    Extension(o): Extension<Arc<Owner>>,
    Caller(tenant): Caller,
    Path(id): Path<String>,
) -> Response {
    match o
        .submissions
        .info(&w.jobs.addr, Some(tenant.name.clone()), &id)
        .await
    {
        Ok(Some(info)) => json(&info),
        Ok(None) => text(StatusCode::NOT_FOUND, "no such submission"),
        Err(e) => failed(e),
    }
}

pub async fn get_results(
    State(w): State<Arc<Worker>>,
    Extension(o): Extension<Arc<Owner>>,
    Caller(tenant): Caller,
    Path(id): Path<String>,
    Query(p): Query<ResultsQuery>,
) -> Response {
    let wait = Duration::from_millis(p.wait_ms);
    match o
        .submissions
        .results(&w.jobs.addr, tenant.name.clone(), &id, p.from, wait)
        .await
    {
        Ok(Some(page)) => postcard(&page),
        Ok(None) => text(StatusCode::NOT_FOUND, "no such submission"),
        Err(e) => failed(e),
    }
}

pub async fn delete_submission(
    Extension(o): Extension<Arc<Owner>>,
    Caller(tenant): Caller,
    Path(id): Path<String>,
) -> Response {
    match o.submissions.cancel(tenant.name.clone(), &id).await {
        Ok(Some(was)) => json(&CancelAnswer {
            id,
            was: was.into(),
        }),
        Ok(None) => text(StatusCode::NOT_FOUND, "no such submission"),
        Err(e) => failed(e),
    }
}

pub async fn get_history(
    State(w): State<Arc<Worker>>,
    Caller(caller): Caller,
    Query(p): Query<HistoryQuery>,
) -> Response {
    let tenant = match (caller.operator, p.tenant) {
        (true, wanted) => wanted,
        (false, Some(wanted)) if wanted != caller.name => {
            return text(
                StatusCode::FORBIDDEN,
                "only an operator's token sees other tenants' history",
            );
        }
        (false, _) => Some(caller.name.clone()),
    };
    // Without --tenants everyone is the one tenant: its history is all.
    let tenant = if w.jobs.tenants.is_multi() {
        tenant
    } else {
        None
    };
    match w.jobs.kept.history.query(p.since_ms, tenant).await {
        Ok(rows) => {
            let mut resp = json(&rows);
            resp.headers_mut()
                .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            resp
        }
        Err(e) => failed(e),
    }
}
