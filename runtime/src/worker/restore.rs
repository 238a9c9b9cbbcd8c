//! What a worker puts back at start from its state database: detached jobs
//! (their results served again, unfinished ones run again under the same
//! id). Durable submissions resume in `owner/run.rs`.

use std::sync::Arc;

use super::detached;
use super::job_path::JobPath;
use super::table::Finished;
use crate::proto::{JobResult, JobSpec, Outcome};

/// Puts the detached jobs of the state database back: results into the
/// job table, unfinished jobs into their queues. Returns how many of each.
/// Read a page at a time, so a large state database is not all in memory
/// at once.
pub async fn detached_jobs(w: &Arc<JobPath>) -> anyhow::Result<(usize, usize)> {
    type Row = (i64, String, String, Vec<u8>, Option<Vec<u8>>);
    let (mut results, mut rerun, mut after) = (0, 0, 0i64);
    loop {
        let rows: Vec<Row> = w
            .kept
            .db
            .read(move |c| {
                let mut stmt = c.prepare_cached(
                    "SELECT rowid, id, tenant, spec, result FROM detached WHERE rowid > ?1 ORDER BY rowid LIMIT ?2",
                )?;
                let rows = stmt.query_map([after, PAGE], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)))?;
                rows.collect()
            })
            .await?;
        let Some(last) = rows.last() else { break };
        after = last.0;
        for (_, id, tenant, spec, result) in rows {
            match restore_one(w, &id, &tenant, &spec, result.as_deref()) {
                Some(true) => results += 1,
                Some(false) => rerun += 1,
                None => {}
            }
        }
    }
    Ok((results, rerun))
}

/// Rows of the state database read at once at start.
const PAGE: i64 = 256;

/// Puts one kept detached job back: `Some(true)` its result (kept, or why
/// it cannot run again), `Some(false)` queued to run again, `None` left in
/// the database as it is.
fn restore_one(
    w: &Arc<JobPath>,
    id: &str,
    tenant_name: &str,
    spec: &[u8],
    result: Option<&[u8]>,
) -> Option<bool> {
    let Some(tenant) = w.tenants.by_name(tenant_name) else {
        tracing::warn!(job = %id, tenant = %tenant_name, "a kept detached job's tenant is gone: left in the state database");
        return None;
    };
    let Ok(spec) = JobSpec::from_stored(spec) else {
        tracing::error!(job = %id, "a kept detached job cannot be read by this peerwasm: left as it is");
        return None;
    };
    let asked = spec.limits.memory.bytes();
    // A result that says why the job cannot run again, kept as its result.
    let never_ran = |reason: String| {
        let mut r = JobResult::never_ran(asked, Outcome::Rejected { reason });
        r.peer = w.addr.clone();
        let done = Finished::of(&r);
        detached::ended(&w.kept.db, id, done.encoded.clone(), None);
        done
    };
    let done = match result.map(postcard::from_bytes::<JobResult>) {
        Some(Ok(r)) => Some(Finished::of(&r)),
        Some(Err(e)) => Some(never_ran(format!("its kept result cannot be read: {e}"))),
        None if !spec.trees.is_empty() => Some(never_ran(
            "the worker restarted before the job ended, and shipped directories are not kept across a restart: \
             submit it again"
                .into(),
        )),
        None => None,
    };
    if let Some(done) = done {
        put_done(w, id, &tenant.name, asked, done);
        return Some(true);
    }
    if !w.runner.has_module(&spec.module) {
        match std::fs::read(w.kept.db.module_path(&spec.module)) {
            Ok(bytes) => w.runner.add_module_hashed(spec.module, bytes),
            Err(e) => {
                let done = never_ran(format!(
                    "its module was not kept across the worker's restart: {e}"
                ));
                put_done(w, id, &tenant.name, asked, done);
                return Some(true);
            }
        }
    }
    match super::jobs::start_detached(w, &tenant, spec, id) {
        Ok(()) => Some(false),
        Err(refused) => {
            let done = never_ran(format!(
                "not run again after the worker's restart: {refused}"
            ));
            put_done(w, id, &tenant.name, asked, done);
            Some(true)
        }
    }
}

/// Puts a kept result into the job table, its bytes held.
fn put_done(w: &JobPath, id: &str, tenant: &str, memory_bytes: u64, done: Finished) {
    let hold = Arc::new(w.admission.ledger().hold(super::ledger::HoldKind::Result));
    hold.try_grow(done.encoded.len() as u64, true);
    w.table.insert_done(id, tenant, memory_bytes, done, hold);
}
