//! peerwasm runs other people's jobs, compiled to WebAssembly
//! (wasm32-wasip1), with exactly enforced memory limits and exactly measured
//! peak memory — in-process (the embedded worker) or on a pool of peers.
//!
//! # Layout
//!
//! The modules follow a job's path from the command line to the sandbox,
//! and are layered: each uses only the ones listed after it. The floors a
//! client needs are crate `peerwasm-core` (re-exported here, so
//! `peerwasm::client` is `peerwasm_core::client`): Cargo holds that line —
//! nothing in it can reach the worker — and the `layering` tests hold the
//! rest.
//!
//! * [`cli`] — the `peerwasm` command line (`run`, `map`, `worker`, `peers`,
//!   `tls`, `adapt`, …): thin shells over the client and the server;
//! * [`adapt`] — the controller that sizes a pool to its backlog by
//!   submitting and cancelling one-worker batch jobs (Slurm); a client of
//!   the pool, beside the server;
//! * [`server`] — `peerwasm worker` assembled and served: its configuration
//!   and defaults, `start`, the HTTP router and one file per endpoint group;
//! * `owner` — maps a worker owns for clients that went away (`map
//!   --detach`): stored, run with the client's own `map`, resumed after a
//!   restart; the one room that uses both the worker and the client;
//! * [`worker`] — the worker's core: the host memory ledger, admission,
//!   fair share, tenants, a job's life, the state database;
//!
//! and from `peerwasm-core`:
//!
//! * [`client`] — the submitting side: the embedded worker or a pool as one
//!   [`Target`], best-fit placement, learned memory
//!   estimates, and [`map`](map()) with retries and ordered results;
//! * [`slot`] — a process that is one job's slot (`peerwasm run`, a slot
//!   process's child side): a job computing past its deadline ends with it;
//! * [`runner`] — [`JobRunner`]: N slots running jobs on
//!   this machine, in-process or in slot processes; the embedded worker is
//!   one inside the client's process, and every worker runs its jobs on one;
//! * [`sandbox`] — wasmtime: the engine, module cache, memory limiter,
//!   captured stdio and outcome classification;
//! * [`gossip`] — membership and capacity adverts: a pure state machine,
//!   its thin HTTP transport, and the pool as a worker sees it
//!   ([`PeerView`](gossip::PeerView));
//! * [`proto`] — wire types: [`JobSpec`] in,
//!   [`JobResult`] and [`Outcome`] out;
//! * [`net`] — how processes reach each other: plain HTTP or TLS with the
//!   pool's CA ([`Transport`]), certificates made
//!   (`peerwasm tls`), and connection failures said in words;
//! * [`units`] — sizes, durations and tables as people write and read them.
//!
//! # Example
//!
//! ```no_run
//! use peerwasm::proto::JobSpec;
//! use peerwasm::runner::{JobRunner, RunnerConfig};
//!
//! let runner = JobRunner::new(RunnerConfig::default())?;
//! let hash = runner.add_module(std::fs::read("hello.wasm")?);
//! let mut spec = JobSpec::new(hash);
//! spec.args = vec!["world".into()];
//! let result = runner.run_blocking(spec);
//! println!("{} (peak {} bytes)", result.outcome, result.peak_memory_bytes);
//! # Ok::<(), anyhow::Error>(())
//! ```

pub use peerwasm_core::{
    client, gossip, leftovers, net, private_path, proto, runner, sandbox, slot, units,
};
// The facade: `peerwasm-core`'s root, and a worker started from a program.
pub use peerwasm_core::{
    Job, JobLimits, JobResult, JobRunner, JobSpec, MapConfig, MapItem, MapSummary, Outcome, Pool,
    PoolConfig, RunSpec, RunnerConfig, SandboxConfig, SubmitError, Target, Transport, WorkerApi,
    map,
};
pub use server::{RunningWorker, WorkerConfig, start};

pub mod adapt;
pub mod cli;
mod owner;
pub mod server;
pub mod worker;

#[cfg(test)]
mod house;
