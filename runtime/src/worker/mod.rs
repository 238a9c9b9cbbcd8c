//! The worker side: what runs jobs on a machine.
//!
//! * [`runner`] — [`JobRunner`]: the sandbox with N slots on its own threads.
//!   The embedded worker is a `JobRunner` inside the client's process; a
//!   remote worker will be the same `JobRunner` behind HTTP.

pub mod runner;

pub use runner::{JobRunner, RunnerConfig};
