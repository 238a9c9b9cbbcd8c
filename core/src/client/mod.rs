//! The submitting side, in the order a job meets it:
//!
//! * `job` — a module and what its runs share, hashed once;
//! * `submitter` — [`Submitter`]: what `map` needs of where jobs go
//!   (capacity, one submission, dead workers), so its rules are unit-tested
//!   against a scripted fake;
//! * `target` — the real one: the embedded worker or a pool;
//! * `peers` — the pool's view from the first seed that answers, and who
//!   may be sent a tenant's token;
//! * [`placement`] — best fit over the gossip view;
//! * [`growth`] — a pool that grows on demand: members read again, the
//!   backlog told to its controller, jobs that wait for a worker to come;
//! * [`pool`] — [`Pool`]: the view, the candidates for a job, module
//!   uploads, how a refusal reads;
//! * `api` — [`WorkerApi`]: the worker's HTTP API, one
//!   method per route, typed answers; everything above keeps only policy;
//! * `send` — one job on the pool: try candidates in order, provide what a
//!   worker lacks, wait when all are busy;
//! * `loss` — whether a broken connection lost the job with its worker (a
//!   map counts it) or only with the network (it does not);
//! * `batcher` — the jobs bound for one worker, sent together while it is
//!   busy (`POST /v1/jobs/batch`);
//! * `ship` — shipping a job's directories to a worker: the trees and the
//!   files it lacks, once per worker;
//! * [`tree`] — host directories hashed into manifests, files coming back
//!   written into them;
//! * `errors` — [`SubmitError`] (what a caller sees) and what one worker's
//!   exchange ended in;
//! * `stream` — one job with stdin and output flowing while it runs
//!   (`run --peers`);
//! * [`estimate`] — learned memory requests (smartmem), saved per module;
//! * [`python`] — Python scripts as jobs: CPython for WASI found here and
//!   mounted with its stdlib (`run --python`);
//! * [`map`](mod@map) — many inputs, results in order, with retries and progress;
//! * [`status`] — the pool summed up on one screen;
//! * [`jobs`] — a tenant's jobs across the pool: listing and cancelling
//!   them by id;
//! * [`detach`] — submitting a job and walking away; following its output
//!   (`logs -f`);
//! * [`submit`] — handing a whole map to a worker that owns it durably
//!   (`map --detach`), and its results, list, cancel and the pool's history.
//!
//! No file here imports one that imports it back; `send`, `loss`, `ship`,
//! `stream` and `detach` add methods to [`Pool`] from their own files.
//!
//! `peerwasm run` and `peerwasm map` are thin shells over these; a program
//! can do the same:
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use peerwasm_core::client::{Job, MapConfig, MapItem, Target, map};
//! let job = Job::from_file("primes.wasm")?;
//! let target = Target::pool(vec!["127.0.0.1:7070".into()])?;
//! let inputs = (1..=100).map(|n| format!("{{\"n\": {n}}}").into_bytes());
//! let mut results: Vec<MapItem> = Vec::new();
//! let summary = map(&target, &job, inputs, &MapConfig::default(), &mut results).await?;
//! assert_eq!(results.len(), 100);
//! println!("{summary}");
//! # Ok(()) }
//! ```

mod api;
mod batcher;
pub mod detach;
mod errors;
pub mod estimate;
pub mod growth;
pub(crate) mod job;
pub mod jobs;
mod loss;
pub mod map;
pub(crate) mod peers;
pub mod placement;
pub mod pool;
pub mod python;
mod send;
mod ship;
pub mod status;
pub(crate) mod stream;
pub mod submit;
pub(crate) mod submitter;
pub(crate) mod target;
pub mod tree;

pub use api::{ApiError, WorkerApi, http_client};
pub use errors::SubmitError;
pub use job::{Job, RunLimits};
pub use map::{DEFAULT_MAX_LOST, MapConfig, MapItem, MapObserver, MapSummary, map};
pub use peers::{fetch_peers, trusted};
pub use pool::{Pool, PoolConfig};
pub use submitter::{Capacity, Placed, Submitter};
pub use target::Target;
