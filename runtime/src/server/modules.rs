//! `PUT /v1/modules/{sha256}`: module bytes, checked against their hash and
//! kept within the worker's byte budget (`runner::modules`). An upload is
//! also how a tenant shows it has a module: with `--tenants`, only tenants
//! that did may run it (`state::Uploaders`), so the bytes are checked even
//! when the worker has the module already. The answer is 201 the first
//! time a tenant shows a module, 200 after: it says nothing of whether
//! another tenant has it.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::extract::{Body, Caller, ModuleBody};
use super::response::text;
use crate::proto::ModuleHash;
use crate::worker::state::Worker;

pub async fn put_module(
    State(w): State<Arc<Worker>>,
    Caller(tenant): Caller,
    Path(hash): Path<String>,
    Body(body, _charge, _): Body<ModuleBody>,
) -> Response {
    let Some(hash) = ModuleHash::from_hex(&hash) else {
        return text(
            StatusCode::BAD_REQUEST,
            "the module name must be its sha256 in hex",
        );
    };
    if ModuleHash::of(&body) != hash {
        return text(
            StatusCode::BAD_REQUEST,
            "the bytes do not match the sha256 in the URL",
        );
    }
    // The answer, and the count gossiped, say whether *this tenant* had
    // shown the module before, never whether another had: that would be
    // an oracle on other tenants' modules.
    let first = w.jobs.uploaders.record(hash, &tenant.name);
    // Compiled is enough for jobs, but the bytes are kept when sent: a
    // submission this worker owns stores them to hand on to other workers.
    if w.jobs.runner.module_bytes(&hash).is_none() {
        w.jobs.runner.add_module_hashed(hash, body.to_vec());
    }
    if !first {
        return StatusCode::OK.into_response();
    }
    w.jobs.modules_received.fetch_add(1, Ordering::Relaxed);
    StatusCode::CREATED.into_response()
}
