//! Durable submissions: a whole map handed to this worker, its *owner*,
//! which runs it on the pool while the client that submitted it is gone
//! (`peerwasm map --detach`), like a Slurm `sbatch` or an HTCondor schedd's
//! queue.
//!
//! The owner runs the very map the client runs (`client::map`): placement
//! over the pool as seen from here, learned memory estimates, retries,
//! lost-worker detection — submitting as the tenant who submitted, with
//! that tenant's token (kept in the state database, which only the
//! worker's user can read), so fair share charges the right tenant.
//!
//! What is durable, and when:
//! * the submission (job, inputs, token) is committed before its id is
//!   answered — an id a client holds always names a stored submission;
//! * each result is queued to the database as the map hands it over, in
//!   input order, and committed with the next group. A result whose commit
//!   fails (a full disk) is written again while the map waits, so the map
//!   pauses and goes on, and is never `done` with a hole (`finish` checks).
//!   After `kill -9` the map resumes at the first input without a result,
//!   starting from the peaks already seen. A result is never stored twice,
//!   and readers only see committed ones, in order, up to the first input
//!   still without one, so nobody sees a result that is then lost.
//!
//! This room sits above both the worker and the client: an [`Owner`] is
//! a worker's store of submissions with the worker they run on, and it
//! runs them with the client's `map`; the worker's core knows nothing of
//! it. This file is the store: the submissions, their results and their
//! cancelling; [`run`] starts and runs their maps.
//!
//! Cancelling (`DELETE`) drops the map, which cancels its jobs under way
//! on every worker (their connections close); a second cancel discards the
//! submission and its results.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rusqlite::{OptionalExtension, params};

pub mod run;
#[cfg(test)]
mod tests;

use crate::client::MapSummary;
use crate::proto::JobSpec;
use crate::proto::submission::{
    ResultsPage, SubmissionInfo, SubmissionState, SubmitConfig, SubmittedResult,
};
use crate::worker::job_path::JobPath;
use crate::worker::statedb::{StateDb, now_ms};

/// Submissions one tenant may have running on one owner.
pub const MAX_RUNNING_PER_TENANT: i64 = 64;

/// The most bytes of results one page carries (at least one result).
pub const RESULTS_PAGE_BYTES: usize = 16 << 20;

/// The longest a results request waits for the next result.
pub const MAX_WAIT: Duration = Duration::from_secs(30);

/// A worker as the owner of submissions: its store, and the job path of
/// the worker whose tenants, modules and address the maps use.
pub struct Owner {
    /// The job path of the worker the maps run from.
    pub jobs: Arc<JobPath>,
    /// How the maps reach the pool's workers (the worker's own transport).
    pub transport: crate::net::Transport,
    /// The submissions it owns.
    pub submissions: Submissions,
}

impl Owner {
    /// The owner of the submissions stored in `jobs`' state database,
    /// running their maps over `transport`.
    pub fn new(jobs: Arc<JobPath>, transport: crate::net::Transport) -> Arc<Owner> {
        Arc::new(Owner {
            submissions: Submissions::new(jobs.kept.db.clone()),
            jobs,
            transport,
        })
    }
}

/// The submissions this worker owns.
pub struct Submissions {
    db: Arc<StateDb>,
    /// The maps running now, by submission id.
    running: Mutex<HashMap<String, tokio::task::AbortHandle>>,
}

/// A stored submission, as its map needs it.
struct Stored {
    id: String,
    tenant: String,
    token: Option<String>,
    job: JobSpec,
    config: SubmitConfig,
}

impl Submissions {
    /// The submissions stored in `db`; their modules under `db`'s dir.
    pub fn new(db: Arc<StateDb>) -> Submissions {
        Submissions {
            db,
            running: Mutex::new(HashMap::new()),
        }
    }

    fn running(&self) -> parking_lot::MutexGuard<'_, HashMap<String, tokio::task::AbortHandle>> {
        self.running.lock()
    }

    /// How many maps run here now.
    pub fn count(&self) -> usize {
        self.running().len()
    }

    /// Whether submission `id`'s map runs here now (not cancelled, not
    /// stopped with the worker).
    pub fn is_running(&self, id: &str) -> bool {
        self.running().contains_key(id)
    }

    /// Records how a map ended; its inputs are no longer needed. A map
    /// that was cancelled or stopped with the worker records nothing (who
    /// stopped it did). `done` only when every input has its result
    /// stored; the record is written again until it is kept.
    async fn finish(&self, id: &str, summary: anyhow::Result<MapSummary>) {
        if !self.is_running(id) {
            return;
        }
        let (state, message) = match summary {
            Ok(s) => match s.stopped {
                Some(stopped) => (SubmissionState::Stopped, Some(stopped.message)),
                None => (SubmissionState::Done, None),
            },
            Err(e) => (SubmissionState::Failed, Some(format!("{e:#}"))),
        };
        let mut wait = Duration::from_millis(50);
        loop {
            let id2 = id.to_string();
            let message = message.clone();
            let ended = self
                .db
                .write(move |c| {
                    let (stored, total): (i64, i64) = c.query_row(
                        "SELECT (SELECT count(*) FROM results WHERE submission = ?1), \
                         (SELECT total FROM submissions WHERE id = ?1)",
                        [&id2],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )?;
                    // Never `done` with a hole.
                    let (state, message) = match state {
                        SubmissionState::Done if stored < total => (
                            SubmissionState::Failed,
                            Some(format!("only {stored} of {total} results were stored")),
                        ),
                        _ => (state, message),
                    };
                    let n = c.execute(
                        "UPDATE submissions SET state = ?1, message = ?2, ended_ms = ?3 WHERE id = ?4 AND state = 'running'",
                        params![state.as_str(), message, now_ms() as i64, id2],
                    )?;
                    if n > 0 {
                        tracing::info!(submission = %id2, state = state.as_str(), "submission ended");
                        c.execute("DELETE FROM inputs WHERE submission = ?1", [&id2])?;
                    }
                    Ok(())
                })
                .await;
            match ended {
                Ok(()) => break,
                Err(e) if self.is_running(id) => {
                    tracing::error!(submission = %id, "cannot record the end of a submission (tried again): {e:#}");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(2));
                }
                Err(e) => {
                    tracing::error!(submission = %id, "cannot record the end of a submission: {e:#}");
                    break;
                }
            }
        }
        self.running().remove(id);
    }

    /// One submission of `tenant` (any tenant's with `None`).
    pub async fn info(
        &self,
        owner: &str,
        tenant: Option<String>,
        id: &str,
    ) -> anyhow::Result<Option<SubmissionInfo>> {
        let (owner, id) = (owner.to_string(), id.to_string());
        self.db
            .read(move |c| {
                c.query_row(
                    &format!("{INFO_SELECT} WHERE s.id = ?1 AND (?2 IS NULL OR s.tenant = ?2)"),
                    params![id, tenant],
                    |r| info_row(r, &owner),
                )
                .optional()
            })
            .await
    }

    /// `tenant`'s submissions, newest first.
    pub async fn list(&self, owner: &str, tenant: String) -> anyhow::Result<Vec<SubmissionInfo>> {
        let owner = owner.to_string();
        self.db
            .read(move |c| {
                let mut stmt = c.prepare(&format!(
                    "{INFO_SELECT} WHERE s.tenant = ?1 ORDER BY s.created_ms DESC"
                ))?;
                let rows = stmt.query_map([tenant], |r| info_row(r, &owner))?;
                rows.collect()
            })
            .await
    }

    /// Results of `tenant`'s submission `id` from input `from` on; waits up
    /// to `wait` for one while there is none yet and the map runs.
    pub async fn results(
        &self,
        owner: &str,
        tenant: String,
        id: &str,
        from: u64,
        wait: Duration,
    ) -> anyhow::Result<Option<ResultsPage>> {
        let deadline = tokio::time::Instant::now() + wait.min(MAX_WAIT);
        let mut committed = self.db.committed();
        loop {
            committed.borrow_and_update();
            let Some(info) = self.info(owner, Some(tenant.clone()), id).await? else {
                return Ok(None);
            };
            let id2 = id.to_string();
            // While the map runs, only up to the first input still without
            // a result: a reader never skips one that is yet to come.
            let contiguous = !info.state.is_final();
            let items = self
                .db
                .read(move |c| {
                    let mut stmt = c.prepare_cached(
                        "SELECT idx, item FROM results WHERE submission = ?1 AND idx >= ?2 ORDER BY idx LIMIT 100000",
                    )?;
                    let mut rows = stmt.query(params![id2, from as i64])?;
                    let (mut items, mut bytes) = (Vec::new(), 0usize);
                    while let Some(row) = rows.next()? {
                        let (idx, blob): (i64, Vec<u8>) = (row.get(0)?, row.get(1)?);
                        if contiguous && idx as u64 != from + items.len() as u64 {
                            break;
                        }
                        if !items.is_empty() && bytes + blob.len() > RESULTS_PAGE_BYTES {
                            break;
                        }
                        bytes += blob.len();
                        items.push(blob);
                    }
                    Ok(items)
                })
                .await?;
            let items = items
                .iter()
                .map(|b| postcard::from_bytes::<SubmittedResult>(b))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| anyhow::anyhow!("a stored result cannot be read: {e}"))?;
            if !items.is_empty() || info.state.is_final() || tokio::time::Instant::now() >= deadline
            {
                return Ok(Some(ResultsPage { info, items }));
            }
            let _ = tokio::time::timeout_at(deadline, committed.changed()).await;
        }
    }

    /// Cancels `tenant`'s running submission `id` (`Some("running")`), or
    /// discards a finished one and its results (`Some("done")`).
    pub async fn cancel(&self, tenant: String, id: &str) -> anyhow::Result<Option<&'static str>> {
        let id2 = id.to_string();
        let cancelled = self
            .db
            .read({
                let (id, tenant) = (id2.clone(), tenant.clone());
                move |c| {
                    c.query_row(
                        "SELECT state FROM submissions WHERE id = ?1 AND tenant = ?2",
                        params![id, tenant],
                        |r| r.get::<_, String>(0),
                    )
                    .optional()
                }
            })
            .await?;
        let Some(state) = cancelled else {
            return Ok(None);
        };
        if state == SubmissionState::Running.as_str() {
            if let Some(task) = self.running().remove(id) {
                // Dropping the map cancels its jobs under way.
                task.abort();
            }
            self.db
                .write(move |c| {
                    c.execute(
                        "UPDATE submissions SET state = 'cancelled', message = 'cancelled by its tenant', ended_ms = ?1 \
                         WHERE id = ?2 AND state = 'running'",
                        params![now_ms() as i64, id2],
                    )?;
                    c.execute("DELETE FROM inputs WHERE submission = ?1", [&id2]).map(drop)
                })
                .await?;
            tracing::info!(submission = %id, "submission cancelled by its tenant");
            return Ok(Some("running"));
        }
        self.db
            .write(move |c| {
                for table in ["results", "inputs"] {
                    c.execute(
                        &format!("DELETE FROM {table} WHERE submission = ?1"),
                        [&id2],
                    )?;
                }
                c.execute("DELETE FROM submissions WHERE id = ?1", [&id2])
                    .map(drop)
            })
            .await?;
        Ok(Some("done"))
    }

    /// Stops every running map without changing its state (the worker is
    /// shutting down; they resume when it is back). Their jobs under way
    /// are cancelled.
    pub fn stop_all(&self) -> usize {
        let running: Vec<_> = self.running().drain().collect();
        for (_, task) in &running {
            task.abort();
        }
        running.len()
    }

    /// Forgets finished submissions older than `keep`, and the stored
    /// modules no submission names any more.
    pub async fn expire(&self, keep: Duration) -> anyhow::Result<()> {
        let before = now_ms().saturating_sub(keep.as_millis() as u64) as i64;
        self.db
            .write(move |c| {
                let old = "SELECT id FROM submissions WHERE state != 'running' AND ended_ms < ?1";
                for table in ["results", "inputs"] {
                    c.execute(
                        &format!("DELETE FROM {table} WHERE submission IN ({old})"),
                        [before],
                    )?;
                }
                c.execute(
                    "DELETE FROM submissions WHERE state != 'running' AND ended_ms < ?1",
                    [before],
                )
                .map(drop)
            })
            .await?;
        let named: Vec<String> = self
            .db
            .read(|c| {
                let mut stmt =
                    c.prepare("SELECT module FROM submissions UNION SELECT module FROM detached")?;
                let rows = stmt.query_map([], |r| r.get(0))?;
                rows.collect()
            })
            .await?;
        if let Ok(entries) = std::fs::read_dir(self.db.dir().join("modules")) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name
                    .strip_suffix(".wasm")
                    .is_some_and(|h| !named.iter().any(|n| n == h))
                {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        Ok(())
    }
}

const INFO_SELECT: &str = "SELECT s.id, s.tenant, s.module, s.total, s.state, s.message, s.created_ms, s.ended_ms, \
    (SELECT count(*) FROM results r WHERE r.submission = s.id), \
    (SELECT count(*) FROM results r WHERE r.submission = s.id AND r.ok = 0) FROM submissions s";

fn info_row(r: &rusqlite::Row<'_>, owner: &str) -> rusqlite::Result<SubmissionInfo> {
    let state: String = r.get(4)?;
    Ok(SubmissionInfo {
        id: r.get(0)?,
        owner: owner.to_string(),
        tenant: r.get(1)?,
        module: r.get(2)?,
        total: r.get::<_, i64>(3)? as u64,
        state: SubmissionState::parse(&state).unwrap_or(SubmissionState::Failed),
        message: r.get(5)?,
        created_ms: r.get::<_, i64>(6)? as u64,
        ended_ms: r.get::<_, Option<i64>>(7)?.map(|v| v as u64),
        done: r.get::<_, i64>(8)? as u64,
        failed: r.get::<_, i64>(9)? as u64,
    })
}
