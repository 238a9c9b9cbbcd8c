//! The floors of peerwasm that a client needs: the sandbox and the runner
//! that is the embedded worker, the wire types, the pool as gossip shows
//! it, TLS, and the client that places jobs on a pool. Crate `peerwasm`
//! (the worker, its HTTP server, the command line) builds on this one and
//! re-exports every module, so `peerwasm::client` is this crate's
//! `client`; a program that only submits jobs links this crate alone.
//!
//! # Layout
//!
//! Each module uses only the ones listed after it (the `layering` tests of
//! crate `peerwasm` read this crate's sources too):
//!
//! * [`client`] — the submitting side: the embedded worker or a pool as one
//!   [`Target`], best-fit placement, learned memory
//!   estimates, and [`map`](map()) with retries and ordered results;
//! * [`slot`] — a process that is one job's slot (`peerwasm run`, a slot
//!   process's child side): a job computing past its deadline ends with it;
//! * [`runner`] — [`JobRunner`]: N slots running jobs on
//!   this machine, in-process or in slot processes;
//! * [`sandbox`] — wasmtime: the engine, module cache, memory limiter,
//!   captured stdio and outcome classification;
//! * [`gossip`] — membership and capacity adverts: a pure state machine,
//!   its thin HTTP transport, and the pool as a worker sees it;
//! * [`proto`] — wire types: [`JobSpec`] in,
//!   [`JobResult`] and [`Outcome`] out;
//! * [`net`] — plain HTTP or TLS with the pool's CA
//!   ([`Transport`]), certificates, failures in words;
//! * [`child`] — child processes of ours (slot processes, a compile
//!   apart): started without fork handlers, tied to their parent;
//! * [`private_path`] — files and directories that must be this user's
//!   alone (a TLS key, a worker's state dir);
//! * [`leftovers`] — temporary directories claimed while in use, and
//!   swept once the process that made them was killed;
//! * [`units`] — sizes, durations and tables as people write and read them.
//!
//! The types a program that runs jobs uses most are also at the root:
//! [`Job`], [`Target`], [`map()`], [`JobRunner`], [`JobSpec`],
//! [`JobResult`], [`Outcome`], [`Transport`], [`WorkerApi`].

// The facade: what a program that runs jobs uses most, at the root. The
// modules stay public for the worker crate built on this one; their
// inner rooms are private where nothing outside reaches them.
pub use client::{
    Job, MapConfig, MapItem, MapSummary, Pool, PoolConfig, SubmitError, Target, WorkerApi, map,
};
pub use net::Transport;
pub use proto::{JobLimits, JobResult, JobSpec, Outcome};
pub use runner::{JobRunner, RunnerConfig};
pub use sandbox::{RunSpec, SandboxConfig};

pub mod child;
pub mod client;
pub mod gossip;
pub mod leftovers;
pub mod net;
pub mod private_path;
pub mod proto;
pub mod runner;
pub mod sandbox;
pub mod slot;
pub mod units;
