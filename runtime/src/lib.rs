//! peerwasm runs other people's jobs, compiled to WebAssembly
//! (wasm32-wasip1), with exactly enforced memory limits and exactly measured
//! peak memory — in-process (the embedded worker) or on a pool of peers.
//!
//! # Layout
//!
//! The modules follow a job's path from the command line to the sandbox:
//!
//! * [`cli`] — the `peerwasm` command line (`run`, `map`, `worker`, `peers`);
//! * [`client`] — the submitting side: the embedded worker or a pool as one
//!   [`Target`](client::Target), best-fit placement, learned memory
//!   estimates, and [`map`](client::map()) with retries and ordered results;
//! * [`proto`] — wire types: [`JobSpec`](proto::JobSpec) in,
//!   [`JobResult`](proto::JobResult) and [`Outcome`](proto::Outcome) out;
//! * [`worker`] — [`JobRunner`](worker::JobRunner): N slots running jobs on
//!   this machine (the embedded worker), and `peerwasm worker`: the host
//!   memory ledger, admission and the HTTP service;
//! * [`gossip`] — membership and capacity adverts: a pure state machine
//!   and its thin HTTP transport;
//! * [`sandbox`] — wasmtime: the engine, module cache, memory limiter,
//!   captured stdio and outcome classification;
//! * [`units`] — sizes and durations as people write and read them.
//!
//! # Example
//!
//! ```no_run
//! use peerwasm::proto::JobSpec;
//! use peerwasm::worker::{JobRunner, RunnerConfig};
//!
//! let runner = JobRunner::new(RunnerConfig::default())?;
//! let hash = runner.add_module(std::fs::read("hello.wasm")?);
//! let mut spec = JobSpec::new(hash);
//! spec.args = vec!["world".into()];
//! let result = runner.run_blocking(spec);
//! println!("{} (peak {} bytes)", result.outcome, result.peak_memory_bytes);
//! # Ok::<(), anyhow::Error>(())
//! ```

pub mod cli;
pub mod client;
pub mod gossip;
pub mod proto;
pub mod sandbox;
pub mod units;
pub mod worker;
