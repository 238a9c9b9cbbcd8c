//! `peerwasm worker` assembled and served: its configuration and defaults
//! ([`WorkerConfig`]), the router, and [`start`], which builds the worker and
//! its owner, binds,
//! gossips and serves until shut down.
//!
//! Endpoints (bodies in postcard unless noted), one file per group:
//! * `modules` — `PUT /v1/modules/{sha256}`;
//! * `files` — `PUT /v1/trees/{sha256}`, `PUT /v1/files/{sha256}` (shipped trees);
//! * `jobs` — `POST /v1/jobs`, `GET /v1/jobs[/{id}[/output]]`, `DELETE /v1/jobs/{id}`;
//! * `batch` — `POST /v1/jobs/batch`;
//! * `stream` — `POST /v1/jobs/stream` (stdin and output flowing);
//! * `submissions` — `/v1/submissions[/{id}[/results]]` (durable maps
//!   this worker owns), `GET /v1/history`;
//! * `pool` — `POST /v1/gossip`, `GET /v1/peers`, `GET /metrics`, `GET /`.
//!
//! `config.rs` holds a worker's configuration and its defaults,
//! `pooldir.rs` a pool joined through a shared directory (key, CA, members),
//! `controller.rs` the notice of the controller growing it (`peerwasm adapt`),
//! `router.rs` every route, `assemble.rs` builds a worker and its owner
//! from its configuration with no socket, `start.rs` binds and starts one
//! and holds the [`RunningWorker`] it gives back, `kept.rs` what it puts back
//! at start and forgets as it expires, [`memory`] serves the same
//! assembled worker without a socket (for tests); this file only names them.
//!
//! `serve` accepts connections within limits (a header timeout, a
//! connection cap), `extract` holds what every request passes through
//! first (protocol version, tenant, capped body) and `response` how
//! refusals are answered. The handlers are thin: the job's life is `worker::jobs` (on
//! the worker's `worker::job_path`), the worker's state `worker::state`;
//! neither knows HTTP.

mod assemble;
mod batch;
mod extract;
mod files;
mod jobs;
mod modules;
mod pool;
mod response;
pub(crate) mod serve;
mod stream;
mod submissions;

mod config;
#[cfg(test)]
mod contract;
pub mod controller;
mod kept;
pub mod memory;
pub mod pooldir;
mod router;
mod start;
#[cfg(test)]
pub(crate) mod testing;

pub use start::split_host_port;

pub use assemble::HOST_LEDGER_REFRESH;
pub use config::{
    DEFAULT_DRAIN_GRACE, DEFAULT_GOSSIP_INTERVAL, DEFAULT_KEEP_RESULTS, DEFAULT_MAX_COMPILE_TIME,
    DEFAULT_MAX_JOB_TIME, DEFAULT_MAX_OUTPUT, DEFAULT_MAX_RESULTS, DEFAULT_MAX_STORED,
    DEFAULT_SCRATCH, WorkerConfig,
};
pub use kept::EXPIRE_EVERY;
pub use serve::{
    DEFAULT_HEADER_TIMEOUT, DEFAULT_MAX_CONNECTIONS, DEFAULT_PER_ADDRESS_SHARE,
    PRESSED_HEADER_TIMEOUT, Remote, ServeLimits, Trust,
};
pub use start::{RunningWorker, start};
pub use stream::DEFAULT_UNREAD_GRACE;
