//! `PUT /v1/modules/{sha256}`: module bytes, checked against their hash and
//! kept within the worker's byte budget (`worker::modules`). An upload is
//! also how a tenant shows it has a module: with `--tenants`, only tenants
//! that did may run it (`state::Uploaders`), so the bytes are checked even
//! when the worker has the module already.

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
    Body(body, _): Body<ModuleBody>,
) -> Response {
    let Some(hash) = ModuleHash::from_hex(&hash) else {
        return text(StatusCode::BAD_REQUEST, "the module name must be its sha256 in hex");
    };
    if ModuleHash::of(&body) != hash {
        return text(StatusCode::BAD_REQUEST, "the bytes do not match the sha256 in the URL");
    }
    w.uploaders.record(hash, &tenant.name);
    // Compiled is enough for jobs, but the bytes are kept when sent: a
    // submission this worker owns stores them to hand on to other workers.
    if w.runner.module_bytes(&hash).is_some() {
        return StatusCode::OK.into_response();
    }
    w.runner.add_module_hashed(hash, body.to_vec());
    w.modules_received.fetch_add(1, Ordering::Relaxed);
    StatusCode::CREATED.into_response()
}
