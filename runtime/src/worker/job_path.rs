//! [`JobPath`]: what a job needs of its worker, from its checks to its
//! result, and nothing else — no gossip, no transport to peers, no request
//! budgets. The job's life (`jobs`), its compile charge, the detached jobs
//! kept in the state database (`detached`, `restore`, `stored`) and the
//! owner of submissions take this handle, not the whole worker
//! ([`Worker`](super::state::Worker) holds one beside its place in the pool
//! and what requests may hold), so what each of them can touch is what its
//! signature names.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::admission::Admission;
use super::compile_turns::CompileTurns;
use super::filestore::FileStore;
use super::history::History;
use super::lifetime::Lifetime;
use super::metrics::Metrics;
use super::statedb::StateDb;
use super::table::JobTable;
use super::tenants::Tenants;
use super::uploaders::Uploaders;
use super::warnings::Warnings;
use crate::runner::JobRunner;

/// What a job needs of its worker: where it runs and waits its turn, who
/// may send it, where it is tracked and kept, whether the worker still
/// takes jobs, and what it is counted in.
pub struct JobPath {
    /// The worker's address as its peers and clients know it: every
    /// result is stamped with it (`JobResult::peer`).
    pub(crate) addr: String,
    /// Runs the jobs (slots, the module cache, slot processes).
    pub(crate) runner: JobRunner,
    /// Slots, memory and the tenants' queues; its ledger holds what jobs
    /// and their outputs take.
    pub(crate) admission: Arc<Admission>,
    /// Who may submit (`--tenants`).
    pub(crate) tenants: Tenants,
    /// The jobs this worker holds, by id, with their cancel handles and
    /// (detached) results.
    pub(crate) table: JobTable,
    /// Files of shipped trees (`--file-store`).
    pub(crate) files: Arc<FileStore>,
    /// Which tenants proved they have each module (by uploading it).
    pub(crate) uploaders: Uploaders,
    /// What tenants keep on this worker: the state database and its bounds.
    pub(crate) kept: Kept,
    /// Whether the worker takes a job now: draining, or ending too soon.
    pub(crate) gate: Gate,
    /// Counters for `/metrics`.
    pub(crate) metrics: Metrics,
    /// Warnings to the operator (a job asking more than the worker lends).
    pub(crate) warnings: Warnings,
    /// Jobs run to their end here.
    pub(crate) jobs_run: AtomicU64,
    /// Modules uploaded here.
    pub(crate) modules_received: AtomicU64,
    /// The most bytes of files a job sends back (`--max-files-back`).
    pub(crate) max_files_back: u64,
    /// Each tenant's compile turns.
    pub(crate) compile_turns: CompileTurns,
    /// What warm starts keep for the next jobs, charged to the ledger.
    pub(crate) warm: super::warm_charge::WarmCharge,
}

/// What tenants keep on this worker, and how much they may.
pub struct Kept {
    /// The state database (`--state-dir`): history, detached jobs, and the
    /// submissions its owner keeps (`crate::owner`).
    pub(crate) db: Arc<StateDb>,
    /// The jobs it ran (`peerwasm history`), kept in `db`.
    pub(crate) history: History,
    /// Bytes of detached results one tenant may hold (`--max-results`).
    pub(crate) max_results: u64,
    /// Bytes of submissions and detached jobs one tenant may keep in the
    /// state database (`--max-stored`).
    pub(crate) max_stored: u64,
}

/// Whether the worker takes new jobs: not once it drains, and not a job
/// whose stated time limit outlasts the batch job lending the worker.
pub struct Gate {
    draining: AtomicBool,
    /// The batch-system job it runs in, and when that ends it.
    pub(crate) lifetime: Lifetime,
}

impl Gate {
    /// A gate open until [`Gate::drain`], within `lifetime`.
    pub fn new(lifetime: Lifetime) -> Gate {
        Gate {
            draining: AtomicBool::new(false),
            lifetime,
        }
    }

    /// Closes the gate: the worker is leaving the pool.
    pub fn drain(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// Whether the worker is leaving the pool.
    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }
}

impl JobPath {
    /// The job path of a worker known as `addr`, from its parts; it takes
    /// jobs until its gate is drained.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        addr: &str,
        runner: JobRunner,
        admission: Arc<Admission>,
        tenants: Tenants,
        files: Arc<FileStore>,
        uploaders: Uploaders,
        kept: Kept,
        lifetime: Lifetime,
        max_files_back: u64,
    ) -> JobPath {
        JobPath {
            warm: super::warm_charge::WarmCharge::new(&admission),
            addr: addr.to_string(),
            runner,
            admission,
            tenants,
            table: JobTable::default(),
            files,
            uploaders,
            kept,
            gate: Gate::new(lifetime),
            metrics: Metrics::new(),
            warnings: Warnings::default(),
            jobs_run: AtomicU64::new(0),
            modules_received: AtomicU64::new(0),
            max_files_back,
            compile_turns: CompileTurns::default(),
        }
    }

    /// Starts following what warm starts keep (`warm_charge`), every
    /// [`WARM_READING`](super::warm_charge::WARM_READING) while the job
    /// path lives; nothing outside a Tokio runtime.
    pub fn start_warm_charge(self: &Arc<Self>) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let weak = Arc::downgrade(self);
        rt.spawn(async move {
            let mut readings = tokio::time::interval(super::warm_charge::WARM_READING);
            loop {
                readings.tick().await;
                let Some(w) = weak.upgrade() else { return };
                w.warm.tick(&w.runner, &w.admission);
            }
        });
    }
}

#[cfg(test)]
mod tests;
