//! What a worker puts back at start from its state database: detached jobs
//! (their results served again, unfinished ones run again under the same
//! id). Durable submissions resume in `submissions/run.rs`.

use std::sync::Arc;

use super::detached;
use super::state::Worker;
use super::table::Finished;
use crate::proto::{JobResult, JobSpec, Outcome};

/// Puts the detached jobs of the state database back: results into the
/// job table, unfinished jobs into their queues. Returns how many of each.
pub async fn detached_jobs(w: &Arc<Worker>) -> anyhow::Result<(usize, usize)> {
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
            detached::ended(w, &id, &r);
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
            put_done(w, &id, &tenant.name, &result);
            results += 1;
            continue;
        }
        if !w.runner.has_module(&spec.module) {
            match std::fs::read(w.db.module_path(&spec.module)) {
                Ok(bytes) => w.runner.add_module_hashed(spec.module, bytes),
                Err(e) => {
                    let r = never_ran(format!("its module was not kept across the worker's restart: {e}"));
                    put_done(w, &id, &tenant.name, &r);
                    continue;
                }
            }
        }
        match super::jobs::start_detached(w, &tenant, spec, &id) {
            Ok(_) => rerun += 1,
            Err(refused) => {
                let r = never_ran(format!("not run again after the worker's restart: {refused}"));
                put_done(w, &id, &tenant.name, &r);
            }
        }
    }
    Ok((results, rerun))
}

/// Puts a kept result into the job table, its bytes held.
fn put_done(w: &Worker, id: &str, tenant: &str, result: &JobResult) {
    let done = Finished::of(result);
    let hold = Arc::new(w.admission.ledger().hold());
    hold.try_grow(done.encoded.len() as u64, true);
    w.jobs.insert_done(id, tenant, result.memory_limit_bytes, done, hold);
}
