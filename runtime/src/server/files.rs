//! `PUT /v1/trees/{sha256}` and `PUT /v1/files/{sha256}`: shipped trees
//! (`proto::tree`) arriving at the worker's file store
//! (`worker::filestore`).
//!
//! A manifest is a small postcard body, checked in full (paths, order,
//! size) before anything is kept; the answer is the postcard list of the
//! files this tenant must still send. A file's body is streamed to disk as
//! it arrives — never held in memory whole — hashed on the way, and kept
//! only if its sha256 is its name. A body that stalls for
//! [`IDLE_TIMEOUT`], or falls behind the tenant's pace
//! ([`TENANT_PACE`](super::extract::TENANT_PACE)), is dropped; the
//! buffer it is gathered in is charged to the tenant.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;

use super::extract::{BodyKind, Caller, Postcard};
use super::response::{postcard, text};
use crate::proto::ModuleHash;
use crate::proto::tree::{MAX_MANIFEST_BYTES, Manifest};
use crate::worker::filestore::StoreError;
use crate::worker::state::Worker;

/// How long a file's body may go without a byte before it is dropped.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Bytes gathered before they are written.
const WRITE_CHUNK: usize = 1 << 20;

/// A tree's manifest.
pub struct ManifestBody;

impl BodyKind for ManifestBody {
    const WHAT: &'static str = "tree manifest";
    fn limit(_w: &Worker) -> usize {
        MAX_MANIFEST_BYTES
    }
}

#[allow(clippy::result_large_err)] // the error is the answer itself, returned at once
fn parse_hash(hex: &str) -> Result<ModuleHash, Response> {
    ModuleHash::from_hex(hex)
        .ok_or_else(|| text(StatusCode::BAD_REQUEST, "the name must be a sha256 in hex"))
}

fn store_error(e: StoreError) -> Response {
    let status = match e {
        StoreError::Invalid(_) => StatusCode::BAD_REQUEST,
        StoreError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
        StoreError::Full(_) => StatusCode::INSUFFICIENT_STORAGE,
        StoreError::Io(_) => StatusCode::INTERNAL_SERVER_ERROR,
    };
    text(status, e.to_string())
}

pub async fn put_tree(
    State(w): State<Arc<Worker>>,
    Caller(tenant): Caller,
    Path(hash): Path<String>,
    Postcard(manifest, _charge, _): Postcard<Manifest, ManifestBody>,
) -> Response {
    let hash = match parse_hash(&hash) {
        Ok(h) => h,
        Err(r) => return r,
    };
    if manifest.hash() != hash {
        return text(
            StatusCode::BAD_REQUEST,
            "the manifest does not match the sha256 in the URL",
        );
    }
    // Checked on a blocking thread: a manifest of 100,000 deep paths is
    // milliseconds of work the async threads must not do.
    let (files, name) = (w.jobs.files.clone(), tenant.name.clone());
    match tokio::task::spawn_blocking(move || files.put_manifest(&name, hash, manifest)).await {
        Ok(Ok(missing)) => postcard(&missing),
        Ok(Err(e)) => {
            w.jobs.metrics.refused("bad_tree");
            store_error(e)
        }
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("checking the manifest failed: {e}"),
        ),
    }
}

pub async fn put_file(
    State(w): State<Arc<Worker>>,
    Caller(tenant): Caller,
    Path(hash): Path<String>,
    req: Request,
) -> Response {
    let hash = match parse_hash(&hash) {
        Ok(h) => h,
        Err(r) => return r,
    };
    if w.jobs.files.has_file(&tenant.name, &hash) {
        return StatusCode::OK.into_response();
    }
    let mut incoming = match w.jobs.files.receive(hash) {
        Ok(i) => i,
        Err(e) => return store_error(e),
    };
    let mut charge = w
        .requests
        .budgets
        .charge(super::extract::payer(req.extensions()));
    if let Err(e) = charge.grow(WRITE_CHUNK as u64) {
        return super::extract::over_budget(&w, e);
    }
    let mut body = req.into_body();
    let mut pending: Vec<u8> = Vec::with_capacity(WRITE_CHUNK);
    let (start, pace) = (tokio::time::Instant::now(), super::extract::TENANT_PACE);
    let mut received = 0u64;
    loop {
        let deadline = pace
            .deadline(start, received)
            .min(tokio::time::Instant::now() + IDLE_TIMEOUT);
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => {
                return text(
                    StatusCode::REQUEST_TIMEOUT,
                    "the file stopped arriving, or arrived too slowly",
                );
            }
            Ok(None) => None,
            Ok(Some(Err(e))) => {
                return text(
                    StatusCode::BAD_REQUEST,
                    format!("cannot read the file: {e}"),
                );
            }
            Ok(Some(Ok(frame))) => Some(frame),
        };
        let end = frame.is_none();
        if let Some(data) = frame.and_then(|f| f.into_data().ok()) {
            received += data.len() as u64;
            pending.extend_from_slice(&data);
        }
        if pending.len() >= WRITE_CHUNK || (end && !pending.is_empty()) {
            // Written on a blocking thread, a chunk at a time.
            let chunk = std::mem::replace(&mut pending, Vec::with_capacity(WRITE_CHUNK));
            incoming = match tokio::task::spawn_blocking(move || {
                incoming.write(&chunk).map(|()| incoming)
            })
            .await
            {
                Ok(Ok(i)) => i,
                Ok(Err(e)) => return store_error(e),
                Err(e) => {
                    return text(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!("writing the file failed: {e}"),
                    );
                }
            };
        }
        if end {
            break;
        }
    }
    let tenant_name = tenant.name.clone();
    match tokio::task::spawn_blocking(move || incoming.finish(&tenant_name)).await {
        Ok(Ok(())) => StatusCode::CREATED.into_response(),
        Ok(Err(e)) => store_error(e),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("keeping the file failed: {e}"),
        ),
    }
}
