//! [`JobTable`]: the jobs a worker holds, by id — queued, running, or done
//! with a detached job's result waiting — each with the handle that cancels
//! it.
//!
//! A detached result is kept until its owner discards it (`DELETE`), not
//! when it is read: a read whose answer is lost in transit loses nothing,
//! and reading again gives the same result. What a tenant holds so is
//! bounded in bytes ([`JobTable::held_bytes`]; the worker refuses new
//! detached jobs past `--max-results`).
//!
//! A finished result is kept once, *encoded* ([`Finished`]): every read
//! of it is answered with the same reference-counted bytes, never a copy
//! per reader, so forty clients fetching a 60 MiB result at once cost the
//! worker 60 MiB, not 2.4 GiB; pages of its output are read from those
//! bytes in place.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;

use super::ledger::Hold;
use crate::proto::{CancelCause, JobOutput, JobResult, JobStatus, Outcome};
use crate::sandbox::Cancel;
use crate::sandbox::LiveOutput;

/// Where a job is in its life.
pub(crate) enum JobState {
    Queued,
    Running,
    Done(Finished),
}

/// A finished detached job's result: its postcard encoding, as served.
#[derive(Clone)]
pub struct Finished {
    /// How it ended.
    pub outcome: Outcome,
    /// The whole `JobResult`, encoded once.
    pub encoded: Bytes,
}

impl Finished {
    /// Encodes `result` (once: every reader shares these bytes).
    pub fn of(result: &JobResult) -> Finished {
        let encoded = postcard::to_allocvec(result).unwrap_or_else(|e| {
            let reason = format!("the result could not be encoded: {e}");
            let mut r =
                JobResult::never_ran(result.memory_limit_bytes, Outcome::Rejected { reason });
            r.peer = result.peer.clone();
            postcard::to_allocvec(&r).expect("a refusal encodes")
        });
        Finished {
            outcome: result.outcome.clone(),
            encoded: Bytes::from(encoded),
        }
    }

    /// Its stdout and stderr, read in place.
    fn streams(&self) -> Option<(&[u8], &[u8])> {
        /// The first fields of an encoded `JobResult`, borrowed.
        #[derive(serde::Deserialize)]
        struct Head<'a> {
            #[allow(dead_code)]
            outcome: Outcome,
            #[serde(borrow, with = "serde_bytes")]
            stdout: &'a [u8],
            #[serde(borrow, with = "serde_bytes")]
            stderr: &'a [u8],
        }
        postcard::from_bytes::<Head>(&self.encoded)
            .ok()
            .map(|h| (h.stdout, h.stderr))
    }
}

struct Entry {
    tenant: String,
    memory_bytes: u64,
    state: JobState,
    cancel: Cancel,
    /// A finished job's result bytes, counted against the worker's memory
    /// until the entry goes.
    hold: Option<Arc<Hold>>,
    /// A detached job's output while it runs.
    live: Option<LiveOutput>,
    /// This run's token (`JobOutput::run`): drawn when the job is taken, 0
    /// for a result kept across a restart.
    run: u64,
}

/// What became of a cancel request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cancelled {
    /// No such job of this tenant here.
    NotFound,
    /// It had already ended, this way; nothing to cancel.
    AlreadyEnded(Outcome),
    /// It was cancelled while in this state (`queued`, `running`).
    Was(&'static str),
    /// It had ended; its result (this outcome) was discarded.
    Discarded(Outcome),
}

/// A detached job's result, as `GET /v1/jobs/{id}` finds it: done, its
/// encoded `JobResult`, shared.
pub enum Lookup {
    NotFound,
    NotDone,
    Done(Bytes),
}

/// The jobs a worker holds, by id: 128 random bits, and checked against
/// the tenant, so another tenant's id answers exactly as one that does not
/// exist.
#[derive(Default)]
pub struct JobTable {
    jobs: Mutex<HashMap<String, Entry>>,
    /// Results being sent now, per tenant.
    readers: Arc<Mutex<HashMap<String, usize>>>,
}

/// Results of one tenant sent at once, at most: each reader shares the
/// result's bytes, but holds a connection and the kernel's buffers.
pub const READS_PER_TENANT: usize = 8;

/// One result being sent; the tenant's count goes down when dropped.
pub struct ReadPermit {
    readers: Arc<Mutex<HashMap<String, usize>>>,
    tenant: String,
}

impl Drop for ReadPermit {
    fn drop(&mut self) {
        let mut r = self.readers.lock();
        if let Some(n) = r.get_mut(&self.tenant) {
            *n -= 1;
            if *n == 0 {
                r.remove(&self.tenant);
            }
        }
    }
}

impl JobTable {
    fn lock(&self) -> parking_lot::MutexGuard<'_, HashMap<String, Entry>> {
        self.jobs.lock()
    }

    /// A new job id: 128 random bits in hex.
    pub(crate) fn new_id() -> String {
        hex::encode(rand::random::<[u8; 16]>())
    }

    pub(crate) fn insert(&self, tenant: &str, memory_bytes: u64, cancel: Cancel) -> String {
        let id = JobTable::new_id();
        self.insert_with_id(&id, tenant, memory_bytes, cancel);
        id
    }

    /// A queued job under a given id (a detached job kept across a restart).
    pub(crate) fn insert_with_id(&self, id: &str, tenant: &str, memory_bytes: u64, cancel: Cancel) {
        self.lock().insert(
            id.into(),
            Entry {
                tenant: tenant.into(),
                memory_bytes,
                state: JobState::Queued,
                cancel,
                hold: None,
                live: None,
                run: rand::random::<u64>() | 1,
            },
        );
    }

    /// A detached job that ended before the worker restarted.
    pub(crate) fn insert_done(
        &self,
        id: &str,
        tenant: &str,
        memory_bytes: u64,
        done: Finished,
        hold: Arc<Hold>,
    ) {
        let entry = Entry {
            tenant: tenant.into(),
            memory_bytes,
            state: JobState::Done(done),
            cancel: Cancel::new(),
            hold: Some(hold),
            live: None,
            run: 0,
        };
        self.lock().insert(id.into(), entry);
    }

    pub(crate) fn set(&self, id: &str, state: JobState) {
        if let Some(e) = self.lock().get_mut(id) {
            e.state = state;
        }
    }

    /// Where a detached job's output can be read while it runs.
    pub(crate) fn set_live(&self, id: &str, live: LiveOutput) {
        if let Some(e) = self.lock().get_mut(id) {
            e.live = Some(live);
        }
    }

    /// `tenant`'s detached job's output from `from` (bytes of stdout and
    /// of stderr already seen) on, at most `max` bytes of each, and its
    /// outcome once it has ended; `None` if there is no such job of theirs.
    pub fn output(&self, tenant: &str, id: &str, from: [u64; 2], max: usize) -> Option<JobOutput> {
        let jobs = self.lock();
        let e = jobs.get(id).filter(|e| e.tenant == tenant)?;
        let slice = |bytes: &[u8], from: u64| {
            let start = usize::try_from(from).unwrap_or(usize::MAX).min(bytes.len());
            bytes[start..][..max.min(bytes.len() - start)].to_vec()
        };
        Some(match &e.state {
            JobState::Done(done) => {
                let (stdout, stderr) = done.streams().unwrap_or_default();
                JobOutput {
                    stdout: slice(stdout, from[0]),
                    stderr: slice(stderr, from[1]),
                    ended: Some(done.outcome.clone()),
                    run: e.run,
                }
            }
            _ => {
                let live = e.live.as_ref().and_then(|l| l.lock().clone());
                match live {
                    Some([out, err]) => JobOutput {
                        stdout: out.read_from(from[0], max),
                        stderr: err.read_from(from[1], max),
                        ended: None,
                        run: e.run,
                    },
                    None => JobOutput {
                        run: e.run,
                        ..JobOutput::default()
                    },
                }
            }
        })
    }

    /// A detached job is done: its result waits here, its bytes held.
    pub(crate) fn set_done(&self, id: &str, done: Finished, hold: Arc<Hold>) {
        if let Some(e) = self.lock().get_mut(id) {
            e.state = JobState::Done(done);
            e.hold = Some(hold);
            e.live = None;
        }
    }

    pub(crate) fn remove(&self, id: &str) {
        self.lock().remove(id);
    }

    /// Forgets job `id` if it is done (its result expired); its bytes are
    /// given back as the entry goes.
    pub(crate) fn forget_done(&self, id: &str) {
        let mut jobs = self.lock();
        if jobs
            .get(id)
            .is_some_and(|e| matches!(e.state, JobState::Done(_)))
        {
            jobs.remove(id);
        }
    }

    /// `tenant`'s detached job's result, if it is done; it stays until
    /// discarded.
    pub fn result(&self, tenant: &str, id: &str) -> Lookup {
        match self
            .lock()
            .get(id)
            .filter(|e| e.tenant == tenant)
            .map(|e| &e.state)
        {
            None => Lookup::NotFound,
            Some(JobState::Queued | JobState::Running) => Lookup::NotDone,
            Some(JobState::Done(done)) => Lookup::Done(done.encoded.clone()),
        }
    }

    /// A permit to send one of `tenant`'s results, or `None` when
    /// [`READS_PER_TENANT`] are being sent already.
    pub fn read_permit(&self, tenant: &str) -> Option<ReadPermit> {
        let mut r = self.readers.lock();
        let n = r.entry(tenant.to_string()).or_insert(0);
        if *n >= READS_PER_TENANT {
            return None;
        }
        *n += 1;
        Some(ReadPermit {
            readers: self.readers.clone(),
            tenant: tenant.to_string(),
        })
    }

    /// Bytes of output `tenant`'s finished detached jobs hold here.
    pub fn held_bytes(&self, tenant: &str) -> u64 {
        self.lock()
            .values()
            .filter(|e| e.tenant == tenant)
            .map(|e| match &e.state {
                JobState::Done(done) => done.encoded.len() as u64,
                _ => 0,
            })
            .sum()
    }

    /// `tenant`'s jobs here, by id.
    pub fn list(&self, tenant: &str) -> Vec<JobStatus> {
        let mut mine: Vec<JobStatus> = self
            .lock()
            .iter()
            .filter(|(_, e)| e.tenant == tenant)
            .map(|(id, e)| JobStatus {
                id: id.clone(),
                state: state_name(&e.state).into(),
                memory_bytes: e.memory_bytes,
            })
            .collect();
        mine.sort_by(|a, b| a.id.cmp(&b.id));
        mine
    }

    /// Cancels `tenant`'s job `id`: it leaves its queue at once, or stops
    /// at its next yield if it runs; a finished one's result is discarded.
    pub fn cancel(&self, tenant: &str, id: &str) -> Cancelled {
        let mut jobs = self.lock();
        let Some(e) = jobs.get(id).filter(|e| e.tenant == tenant) else {
            return Cancelled::NotFound;
        };
        if let JobState::Done(done) = &e.state {
            let outcome = done.outcome.clone();
            jobs.remove(id);
            return Cancelled::Discarded(outcome);
        }
        if let Some(cause) = e.cancel.cause() {
            return Cancelled::AlreadyEnded(Outcome::Cancelled { cause });
        }
        e.cancel.cancel(CancelCause::Owner);
        Cancelled::Was(state_name(&e.state))
    }

    /// Cancels every job that has not ended, for `cause`; with `queued_only`
    /// only those still waiting for a slot. Returns how many.
    pub fn cancel_all(&self, cause: CancelCause, queued_only: bool) -> usize {
        let jobs = self.lock();
        let mut n = 0;
        for e in jobs.values() {
            let cancel = match e.state {
                JobState::Queued => true,
                JobState::Running => !queued_only,
                JobState::Done(..) => false,
            };
            if cancel && !e.cancel.is_cancelled() {
                e.cancel.cancel(cause);
                n += 1;
            }
        }
        n
    }

    /// Jobs queued or running.
    pub fn active(&self) -> usize {
        self.lock()
            .values()
            .filter(|e| !matches!(e.state, JobState::Done(..)))
            .count()
    }
}

fn state_name(s: &JobState) -> &'static str {
    match s {
        JobState::Queued => "queued",
        JobState::Running => "running",
        JobState::Done(..) => "done",
    }
}
