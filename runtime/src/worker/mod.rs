//! The worker side: what runs jobs on a machine.
//!
//! * [`runner`] — [`JobRunner`]: the sandbox with N slots on its own threads.
//!   The embedded worker is a `JobRunner` inside the client's process;
//! * [`modules`] — module bytes held for compiling, within a byte budget;
//! * [`ledger`] — the host memory ledger (smartmem, exact);
//! * [`cgroup`] — the memory limit of the cgroup the worker runs in (a
//!   Slurm job's allocation), which the ledger never exceeds;
//! * [`tenants`] — who may submit (`--tenants`), with weights and limits;
//! * [`admission`] — slots, memory and per-tenant queues;
//! * [`fairshare`] — decayed dominant-resource usage (smartshare) and
//!   accounts;
//! * [`jobs`] — the job endpoints: authentication, job ids, results;
//! * [`batch`] — many jobs in one request, answers streamed as they end;
//! * [`limits`] — what a request may carry, per kind, and its protocol;
//! * [`warnings`] — warnings to the operator, logged, counted and shown;
//! * [`metrics`] — `GET /metrics` in Prometheus' text format;
//! * [`server`] — `peerwasm worker`: all of the above behind HTTP, with
//!   capacity gossip.

pub mod admission;
pub mod batch;
pub mod cgroup;
pub mod fairshare;
pub mod jobs;
pub mod ledger;
pub mod limits;
pub mod metrics;
pub mod modules;
pub mod runner;
pub mod server;
pub mod tenants;
pub mod warnings;

pub use runner::{JobRunner, RunnerConfig};
