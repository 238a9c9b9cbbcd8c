//! Detached jobs (`run --detach`) kept in the state database, so that they
//! outlive the worker: the job (its spec, its module's bytes) is committed
//! before its id is answered; its result when it ends (and then the spec
//! without its input); the row goes when its owner discards the result
//! (`peerwasm cancel ID`) or `--keep-results` after the job ended.
//!
//! After a restart, finished results are served again (`logs ID`, `GET
//! /v1/jobs/{id}`) and jobs that had not finished run again from the
//! start, under the same id (`restore.rs`). A job with shipped directories cannot: the
//! files are not kept across a restart, so its result says so.

use rusqlite::params;

use super::job_path::JobPath;
use super::refused::Refused;
use super::statedb::{StateDb, now_ms};
use super::tenants::Tenant;
use crate::proto::JobSpec;

/// Commits a detached job before its id is answered.
pub async fn keep(w: &JobPath, id: &str, tenant: &Tenant, spec: &JobSpec) -> Result<(), Refused> {
    let internal = |e: String| Refused::Internal(format!("cannot keep the detached job: {e}"));
    if let Some(bytes) = w.runner.module_bytes(&spec.module) {
        let (db, hash) = (w.kept.db.clone(), spec.module);
        tokio::task::spawn_blocking(move || db.keep_module(&hash, &bytes))
            .await
            .map_err(|e| internal(e.to_string()))?
            .map_err(|e| internal(e.to_string()))?;
    }
    let row = (
        id.to_string(),
        tenant.name.clone(),
        spec.module.to_hex(),
        spec.to_stored().map_err(|e| internal(e.to_string()))?,
        now_ms() as i64,
    );
    w.kept.db.write(move |c| {
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

/// Records a detached job's result, `encoded` (committed with the next
/// group), and when it ended; `spec`, the job's spec without its input,
/// replaces the kept one (the input is not needed once the job has run).
pub fn ended(db: &StateDb, id: &str, encoded: bytes::Bytes, spec: Option<Vec<u8>>) {
    let id = id.to_string();
    db.write_later(move |c| {
        c.execute(
            "UPDATE detached SET result = ?1, spec = coalesce(?2, spec), ended_ms = ?3 WHERE id = ?4",
            params![&encoded[..], spec, now_ms() as i64, id],
        )
        .map(drop)
    });
}

/// Forgets the detached jobs that ended longer than `keep` ago (the
/// worker's `--keep-results`), in the state database and in the job
/// table; returns how many.
pub async fn expire(w: &JobPath, keep: std::time::Duration) -> anyhow::Result<usize> {
    let before = now_ms().saturating_sub(keep.as_millis() as u64) as i64;
    let ids: Vec<String> = w
        .kept
        .db
        .read(move |c| {
            let mut stmt = c.prepare("SELECT id FROM detached WHERE ended_ms < ?1")?;
            let rows = stmt.query_map([before], |r| r.get(0))?;
            rows.collect()
        })
        .await?;
    if ids.is_empty() {
        return Ok(0);
    }
    w.kept
        .db
        .write(move |c| {
            c.execute("DELETE FROM detached WHERE ended_ms < ?1", [before])
                .map(drop)
        })
        .await?;
    for id in &ids {
        w.table.forget_done(id);
    }
    Ok(ids.len())
}

/// Forgets a detached job whose result was discarded, returning once that
/// is committed: the owner is told "discarded" only when a restart cannot
/// bring the job back.
pub async fn discarded(db: &StateDb, id: &str) -> anyhow::Result<()> {
    let id = id.to_string();
    db.write(move |c| {
        c.execute("DELETE FROM detached WHERE id = ?1", [id])
            .map(drop)
    })
    .await
}
