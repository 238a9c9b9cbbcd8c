//! What each tenant keeps in the state database, counted against
//! `--max-stored`: its submissions (job spec, inputs, results) and its
//! detached jobs (spec, result), each row also charged [`ROW_BYTES`] for
//! its keys and index entries, so that rows with empty blobs are not free.
//!
//! Checked when something is added (a submission, a detached job): past
//! the bound the request is refused (503) until the tenant discards
//! finished ones, or they expire (`--keep-results`). A running map's
//! results are added as it goes; they are bounded by its inputs' count
//! and each job's output cap.

use rusqlite::params;

use super::job_path::Kept;
use super::metrics::Metrics;
use super::refused::Refused;
use super::statedb::StateDb;
use crate::units::Bytes as Size;

/// What one row costs beyond its blobs: ids, keys, index entries, page
/// slack — an upper bound for our rows, so a million empty results are
/// counted as the quarter GiB they take, not as nothing.
pub const ROW_BYTES: u64 = 256;

/// The bytes `tenant` keeps in the state database now.
pub async fn stored_by(db: &StateDb, tenant: &str) -> anyhow::Result<u64> {
    let tenant = tenant.to_string();
    let n: i64 = db
        .read(move |c| {
            c.query_row(
                "SELECT \
                 (SELECT coalesce(sum(length(job) + length(config) + ?2), 0) FROM submissions WHERE tenant = ?1) + \
                 (SELECT coalesce(sum(length(data) + ?2), 0) FROM inputs WHERE submission IN \
                    (SELECT id FROM submissions WHERE tenant = ?1)) + \
                 (SELECT coalesce(sum(length(item) + ?2), 0) FROM results WHERE submission IN \
                    (SELECT id FROM submissions WHERE tenant = ?1)) + \
                 (SELECT coalesce(sum(length(spec) + coalesce(length(result), 0) + ?2), 0) FROM detached \
                    WHERE tenant = ?1)",
                params![tenant, ROW_BYTES as i64],
                |r| r.get(0),
            )
        })
        .await?;
    Ok(n as u64)
}

/// Refuses `adding` more bytes of `tenant`'s past `--max-stored`.
pub async fn check(
    kept: &Kept,
    metrics: &Metrics,
    tenant: &str,
    adding: u64,
    what: &str,
) -> Result<(), Refused> {
    let stored = stored_by(&kept.db, tenant)
        .await
        .map_err(|e| Refused::Internal(format!("{e:#}")))?;
    if stored.saturating_add(adding) > kept.max_stored {
        metrics.refused("stored");
        return Err(Refused::Busy(format!(
            "you keep {} in this worker's state database and this {what} adds {}, past its --max-stored of {}: \
             discard finished submissions and detached jobs (peerwasm cancel ID), or wait for them to expire",
            Size(stored),
            Size(adding),
            Size(kept.max_stored)
        )));
    }
    Ok(())
}
