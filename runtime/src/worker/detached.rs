//! Detached jobs (`run --detach`) kept in the state database, so that they
//! outlive the worker: the job (its spec, its module's bytes) is committed
//! before its id is answered; its result when it ends; the row goes when
//! its owner discards the result (`peerwasm cancel ID`).
//!
//! After a restart, finished results are served again (`logs ID`, `GET
//! /v1/jobs/{id}`) and jobs that had not finished run again from the
//! start, under the same id. A job with shipped directories cannot: the
//! files are not kept across a restart, so its result says so.

use std::sync::Arc;

use rusqlite::params;

use super::jobs::Refused;
use super::state::Worker;
use super::statedb::now_ms;
use super::tenants::Tenant;
use crate::proto::{JobResult, JobSpec, Outcome};

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
    let id = id.to_string();
    w.db.write_later(move |c| c.execute("UPDATE detached SET result = ?1 WHERE id = ?2", params![blob, id]).map(drop));
}

/// Forgets a detached job whose result was discarded, returning once that
/// is committed: the owner is told "discarded" only when a restart cannot
/// bring the job back.
pub async fn discarded(w: &Worker, id: &str) -> anyhow::Result<()> {
    let id = id.to_string();
    w.db.write(move |c| c.execute("DELETE FROM detached WHERE id = ?1", [id]).map(drop)).await
}

/// Puts the detached jobs of the state database back: results into the
/// job table, unfinished jobs into their queues. Returns how many of each.
pub async fn restore(w: &Arc<Worker>) -> anyhow::Result<(usize, usize)> {
    type Row = (String, String, Vec<u8>, Option<Vec<u8>>);
    let rows: Vec<Row> = w
        .db
        .read(|c| {
            let mut stmt = c.prepare("SELECT id, tenant, spec, result FROM detached ORDER BY created_ms")?;
            let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?;
            rows.collect()
        })
        .await?;
    let (mut results, mut rerun) = (0, 0);
    for (id, tenant_name, spec, result) in rows {
        let Some(tenant) = w.tenants.by_name(&tenant_name) else {
            tracing::warn!(job = %id, tenant = %tenant_name, "a kept detached job's tenant is gone: left in the state database");
            continue;
        };
        let Ok(spec) = postcard::from_bytes::<JobSpec>(&spec) else {
            tracing::error!(job = %id, "a kept detached job cannot be read by this peerwasm: left as it is");
            continue;
        };
        let memreq = spec.limits.memory_bytes;
        let never_ran = |reason: String| {
            let mut r = JobResult::never_ran(memreq, Outcome::Rejected { reason });
            r.peer = w.addr.clone();
            ended(w, &id, &r);
            r
        };
        let result = match result.map(|b| postcard::from_bytes::<JobResult>(&b)) {
            Some(Ok(r)) => Some(r),
            Some(Err(e)) => Some(never_ran(format!("its kept result cannot be read: {e}"))),
            None if !spec.trees.is_empty() => Some(never_ran(
                "the worker restarted before the job ended, and shipped directories are not kept across a restart: \
                 submit it again"
                    .into(),
            )),
            None => None,
        };
        if let Some(result) = result {
            let hold = Arc::new(w.admission.ledger().hold());
            hold.try_grow((result.stdout.len() + result.stderr.len()) as u64, true);
            w.jobs.insert_done(&id, &tenant.name, result, hold);
            results += 1;
            continue;
        }
        if !w.runner.has_module(&spec.module) {
            match std::fs::read(w.db.module_path(&spec.module)) {
                Ok(bytes) => w.runner.add_module_hashed(spec.module, bytes),
                Err(e) => {
                    let r = never_ran(format!("its module was not kept across the worker's restart: {e}"));
                    w.jobs.insert_done(&id, &tenant.name, r, Arc::new(w.admission.ledger().hold()));
                    continue;
                }
            }
        }
        match super::jobs::start_detached(w, &tenant, spec, &id) {
            Ok(_) => rerun += 1,
            Err(refused) => {
                let r = never_ran(format!("not run again after the worker's restart: {refused}"));
                w.jobs.insert_done(&id, &tenant.name, r, Arc::new(w.admission.ledger().hold()));
            }
        }
    }
    Ok((results, rerun))
}
