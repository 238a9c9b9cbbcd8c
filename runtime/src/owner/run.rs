//! Running the maps this worker owns: a submission checked, stored and
//! started ([`create`]), every running one started again after a restart
//! ([`resume_all`]), and each one's map — the client's own `map` over the
//! pool as seen from here — reading its inputs from the state database a
//! page at a time and handing its results back to it in input order.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use rusqlite::params;
use tokio::sync::oneshot;

use super::{MAX_RUNNING_PER_TENANT, Owner, Stored};
use crate::client::estimate::{DEFAULT_MARGIN, MemoryEstimator};
use crate::client::{Job, MapConfig, MapItem, MapObserver, MapSummary, Pool, PoolConfig, Target};
use crate::proto::submission::{
    MAX_SUBMISSION_INPUTS, MOST_ATTEMPTS, MOST_IN_FLIGHT, SUBMISSION_PREFIX, SubmissionInfo,
    SubmissionSpec, SubmitConfig, SubmittedResult,
};
use crate::proto::{JobSpec, MAX_INPUT_BYTES};
use crate::worker::refused::Refused;
use crate::worker::statedb::{Committed, StateDb, now_ms};
use crate::worker::stored::ROW_BYTES;
use crate::worker::tenants::Tenant;

/// Checks and stores a submission, then starts its map. Answers once
/// it is committed.
pub async fn create(
    o: &Arc<Owner>,
    tenant: &Tenant,
    token: Option<String>,
    spec: SubmissionSpec,
) -> Result<SubmissionInfo, Refused> {
    let (w, this) = (&o.jobs, &o.submissions);
    let job = &spec.job;
    check_spec(&spec)?;
    let shown = !w.tenants.is_multi() || w.uploaders.has_shown(&job.module, &tenant.name);
    let Some(bytes) = w.runner.module_bytes(&job.module).filter(|_| shown) else {
        return Err(Refused::UnknownModule(job.module));
    };
    let running: i64 = this
        .db
        .read({
            let tenant = tenant.name.clone();
            move |c| {
                c.query_row(
                    "SELECT count(*) FROM submissions WHERE tenant = ?1 AND state = 'running'",
                    [tenant],
                    |r| r.get(0),
                )
            }
        })
        .await
        .map_err(|e| Refused::Internal(format!("{e:#}")))?;
    let rows = spec.inputs.len() as u64 + 1;
    let adding = spec.inputs.iter().map(|i| i.len() as u64).sum::<u64>()
        + job.encoded_len()
        + rows * ROW_BYTES;
    crate::worker::stored::check(&w.kept, &w.metrics, &tenant.name, adding, "submission").await?;
    if running >= MAX_RUNNING_PER_TENANT {
        return Err(Refused::Busy(format!(
            "you have {running} submissions running on this worker, the most it takes: wait for one to end or cancel one"
        )));
    }
    // The module first, then the row that names it.
    let (db, hash) = (this.db.clone(), job.module);
    tokio::task::spawn_blocking(move || db.keep_module(&hash, &bytes))
        .await
        .map_err(|e| Refused::Internal(e.to_string()))?
        .map_err(|e| Refused::Internal(format!("cannot store the module: {e}")))?;
    let id = format!(
        "{SUBMISSION_PREFIX}{}",
        hex::encode(rand::random::<[u8; 16]>())
    );
    let stored = Stored {
        id: id.clone(),
        tenant: tenant.name.clone(),
        token,
        job: JobSpec {
            stdin: Vec::new(),
            tag: None,
            ..spec.job
        },
        config: spec.config,
    };
    let row = (
        stored.id.clone(),
        stored.tenant.clone(),
        stored.token.clone(),
        stored.job.module.to_hex(),
        stored
            .job
            .to_stored()
            .map_err(|e| Refused::Internal(e.to_string()))?,
        postcard::to_allocvec(&stored.config).map_err(|e| Refused::Internal(e.to_string()))?,
        spec.inputs.len() as i64,
        now_ms() as i64,
    );
    let inputs = spec.inputs;
    this.db
        .write(move |c| {
            let (id, tenant, token, module, job, config, total, created) = row;
            c.execute(
                "INSERT INTO submissions (id, tenant, token, module, job, config, total, state, created_ms) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'running', ?8)",
                params![id, tenant, token, module, job, config, total, created],
            )?;
            let mut insert = c.prepare_cached("INSERT INTO inputs (submission, idx, data) VALUES (?1, ?2, ?3)")?;
            for (i, data) in inputs.iter().enumerate() {
                insert.execute(params![id, i as i64, data.as_slice()])?;
            }
            Ok(())
        })
        .await
        .map_err(|e| Refused::Internal(format!("{e:#}")))?;
    tracing::info!(submission = %id, tenant = %tenant.name, "submission stored; its map starts");
    start(o, stored);
    this.info(&w.addr, Some(tenant.name.clone()), &id)
        .await
        .map_err(|e| Refused::Internal(format!("{e:#}")))?
        .ok_or_else(|| Refused::Internal("the submission vanished".into()))
}

/// What a submission must be, whoever sends it: some inputs, none too
/// large, a map that holds its owner within bounds, no directories.
fn check_spec(spec: &SubmissionSpec) -> Result<(), Refused> {
    if spec.inputs.is_empty() {
        return Err(Refused::Invalid(
            "a submission needs at least one input".into(),
        ));
    }
    if spec.inputs.len() as u64 > MAX_SUBMISSION_INPUTS {
        return Err(Refused::Invalid(format!(
            "a submission may have at most {MAX_SUBMISSION_INPUTS} inputs"
        )));
    }
    if let Some(i) = spec
        .inputs
        .iter()
        .position(|i| i.len() as u64 > MAX_INPUT_BYTES)
    {
        return Err(Refused::InputTooLarge(format!(
            "input {i} is over the {} a job's input may be",
            crate::units::Bytes(MAX_INPUT_BYTES)
        )));
    }
    let c = &spec.config;
    if c.retries > MOST_ATTEMPTS {
        return Err(Refused::Invalid(format!(
            "retries {}: a detached map retries a failed job at most {MOST_ATTEMPTS} times",
            c.retries
        )));
    }
    if !(1..=MOST_ATTEMPTS).contains(&c.max_lost) {
        return Err(Refused::Invalid(format!(
            "max_lost {}: a detached map gives an input up after 1 to {MOST_ATTEMPTS} losses",
            c.max_lost
        )));
    }
    if let Some(n) = c.max_in_flight
        && !(1..=MOST_IN_FLIGHT).contains(&n)
    {
        return Err(Refused::Invalid(format!(
            "max_in_flight {n}: a detached map keeps 1 to {MOST_IN_FLIGHT} jobs in flight"
        )));
    }
    if !spec.job.dirs.is_empty() || !spec.job.trees.is_empty() {
        return Err(Refused::Invalid(
            "a detached map cannot take directories yet: run it attached (without --detach) to use --dir".into(),
        ));
    }
    Ok(())
}

/// Starts the maps of every stored submission still running: after a
/// restart, each goes on from its first input without a result.
pub async fn resume_all(o: &Arc<Owner>) -> anyhow::Result<usize> {
    let stored = o
        .submissions
        .db
        .read(|c| {
            let mut stmt = c.prepare(
                "SELECT id, tenant, token, job, config FROM submissions WHERE state = 'running'",
            )?;
            let rows = stmt.query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get::<_, Vec<u8>>(3)?,
                    r.get::<_, Vec<u8>>(4)?,
                ))
            })?;
            rows.collect::<Result<Vec<_>, _>>()
        })
        .await?;
    let n = stored.len();
    for (id, tenant, token, job, config) in stored {
        let (Ok(job), Ok(config)) = (
            JobSpec::from_stored(&job),
            SubmitConfig::from_stored(&config),
        ) else {
            tracing::error!(submission = %id, "a stored submission cannot be read by this peerwasm: left as it is");
            continue;
        };
        tracing::info!(submission = %id, "resuming a submission");
        start(
            o,
            Stored {
                id,
                tenant,
                token,
                job,
                config,
            },
        );
    }
    Ok(n)
}

fn start(o: &Arc<Owner>, stored: Stored) {
    let id = stored.id.clone();
    let o2 = o.clone();
    // Held while the map is being registered, so that the task cannot
    // finish (and unregister) before it is registered.
    let mut running = o.submissions.running();
    let task = tokio::spawn(async move {
        let summary = run_map(&o2, &stored).await;
        o2.submissions.finish(&stored.id, summary).await;
    });
    running.insert(id, task.abort_handle());
}

/// Runs a stored submission's map on the pool from its first input
/// without a result.
async fn run_map(o: &Arc<Owner>, s: &Stored) -> anyhow::Result<MapSummary> {
    let (w, this) = (&o.jobs, &o.submissions);
    let path = this.db.module_path(&s.job.module);
    let bytes = tokio::fs::read(&path)
        .await
        .map_err(|e| anyhow::anyhow!("the submission's module {} is gone: {e}", path.display()))?;
    let mut job = Job::new(bytes);
    job.program_name = s.job.program_name.clone();
    job.args = s.job.args.clone();
    job.env = s.job.env.clone();
    job.limits = crate::client::RunLimits::of(&s.job.limits);
    let id = s.id.clone();
    let (done, total, peak) = this
        .db
        .read(move |c| {
            c.query_row(
                &format!("SELECT ({FIRST_WITHOUT_RESULT}), (SELECT total FROM submissions WHERE id = ?1), \
                 (SELECT max(peak) FROM results WHERE submission = ?1)"),
                [&id],
                |r| Ok((r.get::<_, i64>(0)? as usize, r.get::<_, i64>(1)? as usize, r.get::<_, Option<i64>>(2)?.map(|p| p as u64))),
            )
        })
        .await?;
    // What the results so far say of memory against input size: the
    // resumed map asks per input from its first job (inputs whose bytes
    // are gone count by their peak alone).
    let id = s.id.clone();
    let seen: Vec<(u64, u64)> = this
        .db
        .read(move |c| {
            let mut q = c.prepare(&format!(
                "SELECT coalesce(length(i.data), 0), r.peak FROM results r LEFT JOIN inputs i \
                 ON i.submission = r.submission AND i.idx = r.idx WHERE r.submission = ?1 AND r.ok = 1 \
                 ORDER BY r.idx DESC LIMIT {}",
                crate::client::estimate::HISTORY
            ))?;
            let rows = q.query_map([&id], |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64)))?;
            rows.collect::<Result<Vec<_>, _>>()
        })
        .await?;
    let unreadable = Arc::new(parking_lot::Mutex::new(None));
    let inputs = InputPages {
        db: this.db.clone(),
        id: s.id.clone(),
        next: done,
        end: total,
        page: Default::default(),
        unreadable: unreadable.clone(),
    };
    let start_estimate = peak.and_then(|peak| {
        let mut e = MemoryEstimator::new(
            job.declared_memory(),
            None,
            s.config.min_mem,
            u64::MAX,
            DEFAULT_MARGIN,
        );
        for &(size, peak) in seen.iter().rev() {
            e.observe(size, peak);
        }
        if seen.is_empty() {
            e.observe(0, peak);
        }
        e.to_saved()
    });
    let pool = Pool::new(PoolConfig {
        token: s.token.clone(),
        transport: o.transport.clone(),
        ..PoolConfig::new(vec![w.addr.clone()])
    })?;
    let config = MapConfig {
        first_index: done,
        submission: Some(s.id.clone()),
        start_estimate,
        // Inputs are read from the database as they go out; this bounds
        // how many the owner holds in memory for one map.
        reorder_window: OWNED_REORDER_WINDOW,
        ..MapConfig::default()
    }
    .with_submitted(&s.config);
    let mut sink = Sink::new(o, &s.id);
    let summary = crate::client::map(
        &Target::Pool(Arc::new(pool)),
        &job,
        inputs,
        &config,
        &mut sink,
    )
    .await;
    // Every result handed over is kept before the map may be said to end.
    sink.flush()?;
    if let Some(why) = unreadable.lock().take() {
        anyhow::bail!("the submission's inputs could not be read from the state database: {why}");
    }
    summary
}

/// The first input of submission `?1` without a stored result. Results are
/// stored in input order, but a crash while one could not be stored may
/// leave later ones in: the map goes on from the first gap.
const FIRST_WITHOUT_RESULT: &str = "SELECT CASE WHEN NOT EXISTS \
    (SELECT 1 FROM results WHERE submission = ?1 AND idx = 0) THEN 0 \
    ELSE (SELECT min(r.idx) + 1 FROM results r WHERE r.submission = ?1 AND NOT EXISTS \
      (SELECT 1 FROM results n WHERE n.submission = ?1 AND n.idx = r.idx + 1)) END";

/// How far ahead of its next result an owned map may run (the client's
/// own map allows 10,000): the inputs under way are held in memory.
pub const OWNED_REORDER_WINDOW: usize = 1024;

/// Inputs read from the database a page at a time, as the map takes them.
struct InputPages {
    db: Arc<StateDb>,
    id: String,
    next: usize,
    end: usize,
    page: VecDeque<Vec<u8>>,
    /// Why the inputs could not be read, if they could not: the map then
    /// ends early, and must not be said to be done.
    unreadable: Arc<parking_lot::Mutex<Option<String>>>,
}

impl Iterator for InputPages {
    type Item = Vec<u8>;

    fn next(&mut self) -> Option<Vec<u8>> {
        if self.page.is_empty() && self.next < self.end {
            let (db, id, from) = (self.db.clone(), self.id.clone(), self.next as i64);
            // A short read on the reading connection; the map's loop is
            // async, so it is made a blocking section of its thread.
            let read = || {
                db.read_blocking(|c| {
                    let mut stmt = c.prepare_cached(
                        "SELECT data FROM inputs WHERE submission = ?1 AND idx >= ?2 ORDER BY idx LIMIT 256",
                    )?;
                    stmt.query_map(params![id, from], |r| r.get::<_, Vec<u8>>(0))?.collect::<Result<Vec<_>, _>>()
                })
            };
            let page = blocking(read);
            match page {
                Ok(rows) if !rows.is_empty() => self.page.extend(rows),
                Ok(_) => self.end = self.next, // the inputs are gone (cancelled meanwhile)
                Err(e) => {
                    tracing::error!(submission = %self.id, "cannot read the inputs: {e:#}");
                    *self.unreadable.lock() = Some(format!("{e:#}"));
                    self.end = self.next;
                }
            }
        }
        let input = self.page.pop_front()?;
        self.next += 1;
        Some(input)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.end - self.next;
        (left, Some(left))
    }
}

/// Hands each result, in input order, to the database — and never lets
/// one go uncommitted in silence. Each is queued to be committed with the
/// next group ([`StateDb::write_soon`]); as the map goes on, the outcomes
/// that are in are checked, in order. A result whose commit failed (the
/// state dir's disk is full, say) is written again, and the map *waits*
/// there — no further results are taken — until it is kept or the
/// submission is stopped: the map pauses while the disk is full and goes
/// on when it has room, with nothing lost and nothing stored twice.
struct Sink {
    o: Arc<Owner>,
    id: String,
    /// Results queued, oldest first, until their commit is known.
    pending: VecDeque<Pending>,
    /// Whether the map is paused now (said once per pause in the log).
    paused: bool,
}

/// One result, as it is stored.
struct Row {
    index: i64,
    ok: bool,
    peak: i64,
    blob: Arc<Vec<u8>>,
}

/// A result queued to the database, until its commit is known.
struct Pending {
    row: Row,
    committed: Committed,
}

/// The longest a paused map waits between two tries to store a result.
const STORE_RETRY_MAX: Duration = Duration::from_secs(2);

impl Sink {
    fn new(o: &Arc<Owner>, id: &str) -> Sink {
        Sink {
            o: o.clone(),
            id: id.to_string(),
            pending: VecDeque::new(),
            paused: false,
        }
    }

    /// Queues the write of a result; `OR IGNORE`: after a restart the map
    /// runs again from the first input without a result, and a result
    /// already stored is the one kept.
    fn queue(&self, row: &Row) -> Committed {
        let (id, index, ok, peak, blob) = (
            self.id.clone(),
            row.index,
            row.ok,
            row.peak,
            row.blob.clone(),
        );
        self.o.submissions.db.write_soon(move |c| {
            c.prepare_cached("INSERT OR IGNORE INTO results (submission, idx, ok, peak, item) VALUES (?1, ?2, ?3, ?4, ?5)")?
                .execute(params![id, index, ok, peak, blob.as_slice()])
                .map(drop)
        })
    }

    /// Takes the outcomes that are in, oldest first; a failed one is
    /// written again until it is kept (blocking: the map waits).
    fn settle_ready(&mut self) -> anyhow::Result<()> {
        while let Some(front) = self.pending.front_mut() {
            let outcome = match front.committed.try_recv() {
                Ok(outcome) => outcome,
                Err(oneshot::error::TryRecvError::Empty) => return Ok(()),
                Err(oneshot::error::TryRecvError::Closed) => Err(CLOSED.into()),
            };
            let p = self.pending.pop_front().expect("the front is there");
            if let Err(why) = outcome {
                blocking(|| self.keep(&p.row, &why))?;
            }
        }
        Ok(())
    }

    /// Waits for every queued result to be kept: the map has ended.
    fn flush(&mut self) -> anyhow::Result<()> {
        while let Some(Pending { row, committed }) = self.pending.pop_front() {
            let outcome = blocking(|| futures::executor::block_on(committed))
                .unwrap_or_else(|_| Err(CLOSED.into()));
            if let Err(why) = outcome {
                blocking(|| self.keep(&row, &why))?;
            }
        }
        Ok(())
    }

    /// Writes `row` again, and again, until it is committed; gives up only
    /// when the submission no longer runs (cancelled, the worker stopping)
    /// or the database is closed. Blocking.
    fn keep(&mut self, row: &Row, first_error: &str) -> anyhow::Result<()> {
        if !self.paused {
            tracing::error!(
                submission = %self.id, input = row.index,
                "a result could not be stored ({first_error}); the map waits until the state dir has room"
            );
            self.paused = true;
        }
        let mut wait = Duration::from_millis(50);
        loop {
            if !self.o.submissions.is_running(&self.id) {
                anyhow::bail!(
                    "the submission stopped while its results could not be stored ({first_error})"
                );
            }
            std::thread::sleep(wait);
            wait = (wait * 2).min(STORE_RETRY_MAX);
            match futures::executor::block_on(self.queue(row)) {
                Ok(Ok(())) => break,
                Ok(Err(_)) => continue,
                Err(_) => anyhow::bail!(CLOSED),
            }
        }
        tracing::info!(submission = %self.id, input = row.index, "results are stored again; the map goes on");
        self.paused = false;
        Ok(())
    }
}

const CLOSED: &str = "the state database was closed";

/// Runs `f`, which blocks, from the map's task: as a blocking section of
/// its thread where the runtime allows it.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    let multi_thread = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if multi_thread {
        tokio::task::block_in_place(f)
    } else {
        f()
    }
}

impl MapObserver for Sink {
    fn result(&mut self, item: MapItem) -> anyhow::Result<()> {
        let (ok, peak) = (item.succeeded(), item.result.peak_memory_bytes as i64);
        let index = item.index as i64;
        let stored = SubmittedResult {
            index: item.index as u64,
            attempts: item.attempts,
            result: item.result,
        };
        let row = Row {
            index,
            ok,
            peak,
            blob: Arc::new(postcard::to_allocvec(&stored)?),
        };
        let committed = self.queue(&row);
        self.pending.push_back(Pending { row, committed });
        self.settle_ready()
    }
}
