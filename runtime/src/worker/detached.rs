//! Detached jobs (`run --detach`) kept in the state database, so that they
//! outlive the worker: the job (its spec, its module's bytes) is committed
//! before its id is answered; its result when it ends; the row goes when
//! its owner discards the result (`peerwasm cancel ID`).
//!
//! After a restart, finished results are served again (`logs ID`, `GET
//! /v1/jobs/{id}`) and jobs that had not finished run again from the
//! start, under the same id (`restore.rs`). A job with shipped directories cannot: the
//! files are not kept across a restart, so its result says so.

use std::sync::Arc;

use rusqlite::params;

use super::refused::Refused;
use super::state::Worker;
use super::statedb::now_ms;
use super::tenants::Tenant;
use crate::proto::{JobResult, JobSpec};

/// Commits a detached job before its id is answered.
pub async fn keep(w: &Arc<Worker>, id: &str, tenant: &Tenant, spec: &JobSpec) -> Result<(), Refused> {
    let internal = |e: String| Refused::Internal(format!("cannot keep the detached job: {e}"));
    if let Some(bytes) = w.runner.module_bytes(&spec.module) {
        let (db, hash) = (w.db.clone(), spec.module);
        tokio::task::spawn_blocking(move || db.keep_module(&hash, &bytes))
            .await
            .map_err(|e| internal(e.to_string()))?
            .map_err(|e| internal(e.to_string()))?;
    }
    let row = (
        id.to_string(),
        tenant.name.clone(),
        spec.module.to_hex(),
        postcard::to_allocvec(spec).map_err(|e| internal(e.to_string()))?,
        now_ms() as i64,
    );
    w.db.write(move |c| {
        let (id, tenant, module, spec, created) = row;
        c.execute(
            "INSERT INTO detached (id, tenant, module, spec, created_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![id, tenant, module, spec, created],
        )
        .map(drop)
    })
    .await
    .map_err(|e| internal(format!("{e:#}")))
}

/// Records a detached job's result (committed with the next group).
pub fn ended(w: &Worker, id: &str, result: &JobResult) {
    let Ok(blob) = postcard::to_allocvec(result) else { return };
    ended_encoded(w, id, bytes::Bytes::from(blob));
}

/// [`ended`], the result already encoded (shared with the job table).
pub fn ended_encoded(w: &Worker, id: &str, blob: bytes::Bytes) {
    let id = id.to_string();
    w.db.write_later(move |c| c.execute("UPDATE detached SET result = ?1 WHERE id = ?2", params![&blob[..], id]).map(drop));
}

/// Forgets a detached job whose result was discarded, returning once that
/// is committed: the owner is told "discarded" only when a restart cannot
/// bring the job back.
pub async fn discarded(w: &Worker, id: &str) -> anyhow::Result<()> {
    let id = id.to_string();
    w.db.write(move |c| c.execute("DELETE FROM detached WHERE id = ?1", [id]).map(drop)).await
}
