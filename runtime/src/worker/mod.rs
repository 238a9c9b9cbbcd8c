//! The worker's core: a machine lent to the pool, in the order a job meets
//! it. The jobs themselves run on a [`JobRunner`](crate::runner::JobRunner)
//! (the layer below, shared with the embedded worker). Its HTTP edge and
//! its assembly (`start`, `WorkerConfig`) are [`crate::server`]'s, the maps
//! it owns for clients that went away `crate::owner`'s: both sit above
//! this core, which imports neither them nor the client.
//!
//! * `filestore` — files of shipped trees by sha256, on disk, within a
//!   byte budget shared with jobs' scratch;
//! * `manifests` — shipped trees' manifests, within a byte budget per
//!   tenant;
//! * `trees` — a job's shipped trees laid out for it, and the files it
//!   wrote read back;
//! * `layouts` — read-only trees laid out once and shared by the jobs
//!   that mount them;
//! * `uploaders` — which tenants showed which module, kept across
//!   restarts;
//! * `budget` — what requests make the worker hold (bodies, waiting
//!   specs, manifests), charged to who sent them and to the ledger;
//! * `job_path` — what a job needs of its worker, from its checks to its
//!   result: the handle the job path, the detached jobs and the owner take,
//!   not the whole worker;
//! * `jobs` — a job's life: checks, admission, the run, charging,
//!   cancelling;
//! * `compile_charge` — what a job's compile takes of the host's memory,
//!   charged while it runs;
//! * `compile_turns` — how many modules one tenant may compile at once;
//! * `warm_charge` — what warm starts keep for the next jobs, charged,
//!   and let go when a job waits for the memory;
//! * `table` — the jobs a worker holds, by id, with their cancel handles;
//! * `admission` — slots, memory and per-tenant queues;
//! * `ledger` — the host memory ledger (smartmem, exact);
//! * `hostledger` — the record every worker of one machine shares, so
//!   that together they never over-commit it;
//! * `cgroup` — the memory limit of the cgroup the worker runs in (a
//!   Slurm job's allocation), which the ledger never exceeds;
//! * `fairshare` — decayed dominant-resource usage (smartshare) and
//!   accounts;
//! * `tenants` — who may submit (`--tenants`), with weights and limits;
//! * `state` — what a running worker holds (its job path, its place in the
//!   pool, what requests may hold) and derives (its advert, metrics, the
//!   pool's usage), shared by the HTTP edge and gossip;
//! * `statedb` — the state database (SQLite, WAL) in `--state-dir`:
//!   what outlives the process, committed in groups by one writer thread;
//! * `stored` — what each tenant keeps in the state database
//!   (`--max-stored`);
//! * `refused` — why a job was not run: the one error of the job path;
//! * `detached` — detached jobs kept in the state database;
//! * `restore` — what a worker puts back at start: detached jobs served
//!   or run again;
//! * `history` — a record of every job this worker ran (`peerwasm history`);
//! * `backlogs` — what the maps reporting here still have to run (the
//!   pool's demand, gossiped in the advert);
//! * `lifetime` — the batch-system job the worker runs in and when it
//!   ends: it drains before then, and takes no job it could not finish;
//! * `warnings` — warnings to the operator, logged, counted and shown;
//! * `metrics` — `GET /metrics` in Prometheus' text format.
//!
//! Arrows point one way (no file imports one that imports it back):
//! `restore` uses `jobs` and `job_path`; `jobs` uses `job_path`, `table`,
//! `detached`, admission and the runner; `state` uses `job_path`; admission, the ledger, fair share and tenants import
//! nothing of HTTP.

pub(crate) mod admission;
pub(crate) mod backlogs;
pub(crate) mod budget;
pub(crate) mod cgroup;
pub(crate) mod compile_charge;
pub(crate) mod compile_turns;
pub(crate) mod detached;
pub(crate) mod fairshare;
pub(crate) mod filestore;
pub(crate) mod history;
pub(crate) mod hostledger;
pub(crate) mod job_path;
pub(crate) mod jobs;
pub(crate) mod layouts;
pub(crate) mod ledger;
pub(crate) mod lifetime;
pub(crate) mod manifests;
pub(crate) mod metrics;
pub(crate) mod refused;
pub(crate) mod restore;
pub(crate) mod state;
pub(crate) mod statedb;
pub(crate) mod stored;
pub(crate) mod table;
pub(crate) mod tenants;
pub(crate) mod trees;
pub(crate) mod uploaders;
pub(crate) mod warm_charge;
pub(crate) mod warnings;

// What is reached from outside the crate (the benchmarks, the tests): the
// rest of the worker is the server's and the owner's alone.
pub use admission::DEFAULT_HOLD_AFTER;
pub use budget::DEFAULT_MAX_REQUEST_BYTES;
pub use fairshare::DEFAULT_HALF_LIFE;
pub use filestore::DEFAULT_FILE_STORE;
pub use history::DEFAULT_HISTORY_DAYS;
pub use hostledger::{HostLedger, default_path as default_host_ledger};
pub use ledger::{DEFAULT_RESERVE, HoldKind, Ledger, LedgerConfig};
pub use statedb::StateDb;
pub use tenants::{Tenant, Tenants};
pub use trees::DEFAULT_MAX_FILES_BACK;

#[cfg(test)]
mod tests;
