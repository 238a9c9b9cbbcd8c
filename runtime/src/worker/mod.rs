//! The worker side: what runs jobs on a machine.
//!
//! * [`runner`] — [`JobRunner`]: the sandbox with N slots on its own threads.
//!   The embedded worker is a `JobRunner` inside the client's process;
//! * [`ledger`] — the host memory ledger (smartmem, exact);
//! * [`admission`] — slots, memory and a bounded queue;
//! * [`server`] — `peerwasm worker`: all of the above behind HTTP, with
//!   capacity gossip.

pub mod admission;
pub mod ledger;
pub mod runner;
pub mod server;

pub use runner::{JobRunner, RunnerConfig};
