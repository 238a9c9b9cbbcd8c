//! The history of the jobs this worker ran, like Slurm's `sacct`: one row
//! per finished job in the state database (tenant, module, the map input
//! and attempt it was, outcome, exact peak, reservation, CPU, wall), kept
//! for `--history-days`, at most [`ROWS_PER_TENANT`] of one tenant. `peerwasm history` asks every worker of the pool
//! and merges their answers.
//!
//! Rows are queued to the database's writer as jobs end and committed with
//! the next group: recording costs a job no `fsync` of its own.

use std::sync::Arc;
use std::time::Duration;

use rusqlite::params;

use super::statedb::{StateDb, now_ms};
use crate::proto::submission::{HistoryRecord, JobTag};
use crate::proto::{JobResult, ModuleHash};

/// How long history is kept unless `--history-days` says otherwise.
pub const DEFAULT_HISTORY_DAYS: u32 = 30;

/// The most records kept of one tenant: past it, its oldest are forgotten
/// (each is about 200 bytes, so at most ~200 MB a tenant).
pub const ROWS_PER_TENANT: u32 = 1_000_000;

/// The most records one `GET /v1/history` returns.
pub const MAX_HISTORY_ROWS: u32 = 100_000;

/// A worker's job history.
pub struct History {
    db: Arc<StateDb>,
    keep: Duration,
}

impl History {
    /// History in `db`, keeping records for `keep`.
    pub fn new(db: Arc<StateDb>, keep: Duration) -> History {
        History { db, keep }
    }

    /// Records a job that ended on this worker (`peer`), having reserved
    /// `reserved` bytes for it.
    pub fn record(
        &self,
        tenant: &str,
        module: &ModuleHash,
        tag: Option<&JobTag>,
        result: &JobResult,
        reserved: u64,
        peer: &str,
    ) {
        let submission = tag.map(|t| t.submission.clone()).filter(|s| !s.is_empty());
        let (index, attempt) = (tag.map(|t| t.index as i64), tag.map(|t| t.attempt));
        let row = (
            now_ms() as i64,
            tenant.to_string(),
            module.to_hex(),
            result.outcome.kind(),
            result.outcome.exit_code(),
            [
                result.peak_memory_bytes,
                reserved,
                result.cpu_time_us,
                result.wall_time_us,
            ]
            .map(|v| v as i64),
            peer.to_string(),
        );
        self.db.write_later(move |c| {
            let (ended, tenant, module, outcome, code, [peak, reserved, cpu, wall], peer) = row;
            c.prepare_cached(
                "INSERT INTO history (ended_ms, tenant, module, submission, idx, attempt, outcome, exit_code, peak, \
                 reserved, cpu_us, wall_us, peer) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
            )?
            .execute(params![ended, tenant, module, submission, index, attempt, outcome, code, peak, reserved, cpu, wall, peer])
            .map(drop)
        });
    }

    /// Records that ended at or after `since_ms`, oldest first; only
    /// `tenant`'s when given. Every job that ended before the call is in it:
    /// records still queued are committed first.
    pub async fn query(
        &self,
        since_ms: u64,
        tenant: Option<String>,
    ) -> anyhow::Result<Vec<HistoryRecord>> {
        self.db.sync().await?;
        self.db
            .read(move |c| {
                let mut stmt = c.prepare_cached(
                    "SELECT ended_ms, tenant, module, submission, idx, attempt, outcome, exit_code, peak, reserved, \
                     cpu_us, wall_us, peer FROM history WHERE ended_ms >= ?1 AND (?2 IS NULL OR tenant = ?2) \
                     ORDER BY ended_ms LIMIT ?3",
                )?;
                let rows = stmt.query_map(params![since_ms as i64, tenant, MAX_HISTORY_ROWS], |r| {
                    Ok(HistoryRecord {
                        ended_ms: r.get::<_, i64>(0)? as u64,
                        tenant: r.get(1)?,
                        module: r.get(2)?,
                        submission: r.get(3)?,
                        index: r.get::<_, Option<i64>>(4)?.map(|i| i as u64),
                        attempt: r.get(5)?,
                        outcome: r.get(6)?,
                        exit_code: r.get(7)?,
                        peak_memory_bytes: r.get::<_, i64>(8)? as u64,
                        reserved_bytes: r.get::<_, i64>(9)? as u64,
                        cpu_time_us: r.get::<_, i64>(10)? as u64,
                        wall_time_us: r.get::<_, i64>(11)? as u64,
                        peer: r.get(12)?,
                    })
                })?;
                rows.collect()
            })
            .await
    }

    /// Forgets records older than the keep time, and each tenant's past
    /// its newest [`ROWS_PER_TENANT`].
    pub fn expire(&self) {
        self.expire_keeping(ROWS_PER_TENANT);
    }

    fn expire_keeping(&self, rows_per_tenant: u32) {
        let before = now_ms().saturating_sub(self.keep.as_millis() as u64) as i64;
        self.db.write_later(move |c| {
            c.execute("DELETE FROM history WHERE ended_ms < ?1", [before])?;
            c.execute(
                "DELETE FROM history WHERE rowid IN (SELECT rowid FROM (SELECT rowid, row_number() OVER \
                 (PARTITION BY tenant ORDER BY ended_ms DESC, rowid DESC) AS newer FROM history) WHERE newer > ?1)",
                [rows_per_tenant],
            )
            .map(drop)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn each_tenant_keeps_its_newest_rows_within_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let db = Arc::new(StateDb::open(dir.path()).unwrap());
        let history = History::new(db.clone(), Duration::from_secs(3600));
        let module = ModuleHash::of(b"m");
        let mut result = JobResult::never_ran(
            1,
            crate::proto::Outcome::Rejected {
                reason: String::new(),
            },
        );
        for i in 0..30u64 {
            result.cpu_time_us = i;
            history.record(
                if i % 3 == 0 { "bob" } else { "alice" },
                &module,
                None,
                &result,
                1,
                "w",
            );
        }
        history.expire_keeping(5);
        let rows = history.query(0, None).await.unwrap();
        let cpu = |t: &str| {
            rows.iter()
                .filter(|r| r.tenant == t)
                .map(|r| r.cpu_time_us)
                .collect::<Vec<_>>()
        };
        assert_eq!(cpu("alice"), vec![23, 25, 26, 28, 29]);
        assert_eq!(cpu("bob").len(), 5);
    }
}
