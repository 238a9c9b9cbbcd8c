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
//! `start.rs` assembles and starts a worker; this file holds its
//! configuration, its defaults and the router.
//!
//! `serve` accepts connections within limits (a header timeout, a
//! connection cap), `extract` holds what every request passes through
//! first (protocol version, tenant, capped body) and `response` how
//! refusals are answered. The handlers are thin: the job's life is `worker::jobs`, the
//! worker's state `worker::state`; neither knows HTTP.

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

mod start;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::{get, post, put};

use crate::owner::Owner;
use crate::proto::CancelCause;
use crate::runner::RunnerConfig;
use crate::worker::ledger::LedgerConfig;
use crate::worker::state::Worker;
use crate::worker::tenants::Tenants;

pub use serve::{DEFAULT_HEADER_TIMEOUT, DEFAULT_MAX_CONNECTIONS, DEFAULT_PER_ADDRESS_SHARE, Remote, ServeLimits};
pub use start::start;

/// The longest a job may run on a worker unless `--max-job-time` says
/// otherwise, like a cluster partition's time limit.
pub const DEFAULT_MAX_JOB_TIME: Duration = Duration::from_secs(24 * 3600);

/// The most stdout (and stderr) a worker buffers per job unless
/// `--max-output` says otherwise.
pub const DEFAULT_MAX_OUTPUT: u64 = 64 << 20;

/// Bytes of detached results one tenant may hold on a worker unless
/// `--max-results` says otherwise.
pub const DEFAULT_MAX_RESULTS: u64 = 256 << 20;

/// Bytes of submissions one tenant may keep in a worker's state database
/// unless `--max-stored` says otherwise.
pub const DEFAULT_MAX_STORED: u64 = 4 << 30;

/// How long finished detached jobs and submissions are kept unless
/// `--keep-results` says otherwise: a week, long enough for a weekend.
pub const DEFAULT_KEEP_RESULTS: Duration = Duration::from_secs(7 * 24 * 3600);

/// Bytes one job may write to files on a worker unless `--scratch` says
/// otherwise.
pub const DEFAULT_SCRATCH: u64 = 1 << 30;

/// How long compiling one module may take on a worker unless
/// `--max-compile-time` says otherwise.
pub const DEFAULT_MAX_COMPILE_TIME: Duration = Duration::from_secs(60);

/// How long a shutting-down worker lets running jobs finish before it
/// cancels them, unless `--drain-grace` says otherwise (Slurm's `KillWait`
/// is 30 s too).
pub const DEFAULT_DRAIN_GRACE: Duration = Duration::from_secs(30);

/// Time between gossip rounds by default (`--gossip-interval`).
pub const DEFAULT_GOSSIP_INTERVAL: Duration = Duration::from_secs(1);

/// How a worker is set up.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// Where to listen; port 0 picks a free port.
    pub listen: SocketAddr,
    /// Peers to join through (`host:port`).
    pub join: Vec<String>,
    /// The sandbox and its slots; `runner.sandbox.max_job_time` is the
    /// worker's time policy (`--max-job-time`).
    pub runner: RunnerConfig,
    /// Memory sizing.
    pub ledger: LedgerConfig,
    /// Time between gossip rounds. Default: [`DEFAULT_GOSSIP_INTERVAL`].
    pub gossip_interval: Duration,
    /// Who may submit. Default: one tenant, no tokens.
    pub tenants: Tenants,
    /// Fair share on or off (`AdmissionConfig::fair_share`). Default: on.
    pub fair_share: bool,
    /// Half-life of tenants' usage. Default:
    /// [`DEFAULT_HALF_LIFE`](crate::worker::DEFAULT_HALF_LIFE).
    pub usage_half_life: Duration,
    /// A job waiting longer than this gets memory held for it
    /// (`AdmissionConfig::hold_after`). Default:
    /// [`DEFAULT_HOLD_AFTER`](crate::worker::DEFAULT_HOLD_AFTER).
    pub hold_after: Duration,
    /// The key gossip is authenticated with (`--cluster-key`). Default:
    /// none, which [`start`] allows only on a loopback address unless
    /// `insecure_gossip`.
    pub cluster_key: Option<std::path::PathBuf>,
    /// Gossip without a cluster key on an address others can reach
    /// (`--insecure-gossip`): anyone who reaches the port can then forge
    /// adverts. Default: false.
    pub insecure_gossip: bool,
    /// TLS (`--tls-cert`, `--tls-key`, `--tls-ca`): the worker then serves
    /// only TLS and talks TLS to its peers. Default: none, plain HTTP.
    pub tls: Option<crate::net::tls::WorkerTls>,
    /// Serve plain HTTP with `--tenants` on an address others can reach
    /// (`--insecure-http`), where tenants' tokens cross the network in
    /// clear; [`start`] refuses that otherwise. Default: false.
    pub insecure_http: bool,
    /// The address peers and clients reach this worker at (`--advertise`,
    /// `host:port`; a name is fine). `None`: the address it listens on.
    pub advertise: Option<String>,
    /// Jobs one tenant may have waiting here (`--max-queued`); more are
    /// refused with 503. `None`: `admission::QUEUE_PER_SLOT` × slots.
    pub max_queued: Option<u32>,
    /// Bytes of specs (args, env, stdin, tag) one tenant's waiting jobs may hold here
    /// (`--max-queued-bytes`). Default: `admission::QUEUE_BYTES_PER_TENANT`.
    pub max_queued_bytes: u64,
    /// On shutdown, how long running jobs may go on before they are
    /// cancelled (`--drain-grace`). Default: [`DEFAULT_DRAIN_GRACE`].
    pub drain_grace: Duration,
    /// Bytes of finished detached jobs' output one tenant may hold here
    /// (`--max-results`); past it its new detached jobs are refused until
    /// it discards some. Default: [`DEFAULT_MAX_RESULTS`].
    pub max_results: u64,
    /// Bytes of submissions (inputs and results) one tenant may keep in
    /// the state database (`--max-stored`). Default: [`DEFAULT_MAX_STORED`].
    pub max_stored: u64,
    /// Bytes one tenant's requests may make the worker hold at once
    /// (`--max-request-bytes`; `worker::budget`). Default:
    /// [`DEFAULT_MAX_REQUEST_BYTES`](crate::worker::DEFAULT_MAX_REQUEST_BYTES).
    pub max_request_bytes: u64,
    /// Connections served at once and the time to send headers
    /// (`--max-connections`, `--header-timeout`). Default: `ServeLimits::default()`.
    pub serve: ServeLimits,
    /// Bytes of shipped trees' files kept on disk (`--file-store`); they
    /// also count against the sandbox's `scratch_total_bytes`. Default:
    /// [`DEFAULT_FILE_STORE`](crate::worker::DEFAULT_FILE_STORE).
    pub file_store_bytes: u64,
    /// The most bytes of files one job sends back (`--max-files-back`).
    /// Default: [`DEFAULT_MAX_FILES_BACK`](crate::worker::DEFAULT_MAX_FILES_BACK).
    pub max_files_back: u64,
    /// Where the worker keeps what outlives it (`--state-dir`): submissions
    /// it owns and its job history, in a SQLite database. `None`: a
    /// temporary dir, removed when the worker stops. Default: `None`.
    pub state_dir: Option<std::path::PathBuf>,
    /// How long finished jobs' records are kept (`--history-days`).
    /// Default: [`DEFAULT_HISTORY_DAYS`](crate::worker::DEFAULT_HISTORY_DAYS) days.
    pub history_keep: Duration,
    /// How long finished detached jobs and submissions (their results) are
    /// kept after they ended unless discarded first (`--keep-results`).
    /// Default: [`DEFAULT_KEEP_RESULTS`].
    pub keep_results: Duration,
    /// The file this worker shares with the other workers of its machine
    /// so that together they never over-commit it (`--host-ledger`;
    /// `worker::hostledger`). `None`: this worker decides alone. Default:
    /// [`hostledger::default_path`](crate::worker::default_host_ledger).
    pub host_ledger: Option<std::path::PathBuf>,
    /// Modules compiled as the worker starts (`--precompile`), in the
    /// background, for the engine their jobs will run on, so that the
    /// first job of each starts at once (CPython's takes ~45 s to
    /// compile). Default: none.
    pub precompile: Vec<std::path::PathBuf>,
}

impl WorkerConfig {
    /// The documented defaults, listening on `listen`, with the worker's
    /// time policy ([`DEFAULT_MAX_JOB_TIME`]) in its sandbox.
    pub fn new(listen: SocketAddr) -> WorkerConfig {
        let mut runner = RunnerConfig::default();
        runner.sandbox.max_job_time = Some(DEFAULT_MAX_JOB_TIME);
        runner.sandbox.max_output_bytes = Some(DEFAULT_MAX_OUTPUT);
        runner.sandbox.max_compile_time = Some(DEFAULT_MAX_COMPILE_TIME);
        runner.sandbox.max_scratch_bytes = Some(DEFAULT_SCRATCH);
        WorkerConfig {
            listen,
            join: Vec::new(),
            runner,
            ledger: LedgerConfig::default(),
            gossip_interval: DEFAULT_GOSSIP_INTERVAL,
            tenants: Tenants::single(),
            fair_share: true,
            usage_half_life: crate::worker::DEFAULT_HALF_LIFE,
            hold_after: crate::worker::DEFAULT_HOLD_AFTER,
            cluster_key: None,
            insecure_gossip: false,
            tls: None,
            insecure_http: false,
            advertise: None,
            max_queued: None,
            max_queued_bytes: crate::worker::admission::QUEUE_BYTES_PER_TENANT,
            drain_grace: DEFAULT_DRAIN_GRACE,
            serve: ServeLimits::default(),
            max_results: DEFAULT_MAX_RESULTS,
            max_stored: DEFAULT_MAX_STORED,
            max_request_bytes: crate::worker::DEFAULT_MAX_REQUEST_BYTES,
            file_store_bytes: crate::worker::DEFAULT_FILE_STORE,
            max_files_back: crate::worker::DEFAULT_MAX_FILES_BACK,
            state_dir: None,
            history_keep: Duration::from_secs(u64::from(crate::worker::DEFAULT_HISTORY_DAYS) * 24 * 3600),
            keep_results: DEFAULT_KEEP_RESULTS,
            host_ledger: Some(crate::worker::default_host_ledger()),
            precompile: Vec::new(),
        }
    }
}

/// A bound, running worker.
pub struct RunningWorker {
    /// The address it listens on.
    pub addr: SocketAddr,
    /// The address it gives peers and clients (`WorkerConfig::advertise`,
    /// else `addr`).
    pub advertised: String,
    serve: tokio::task::JoinHandle<std::io::Result<()>>,
    gossip: tokio::task::JoinHandle<()>,
    worker: Arc<Worker>,
    grace: Duration,
}

impl RunningWorker {
    /// Serves until the shutdown future given to [`start`] resolves; then
    /// advertises that it is leaving, cancels the jobs still queued (their
    /// clients send them elsewhere), stops accepting, lets running jobs
    /// finish for up to the drain grace, cancels those still running, and
    /// stops gossiping.
    pub async fn wait(self) -> anyhow::Result<()> {
        let result = self.serve.await;
        // Detached jobs have no request keeping `serve` open: wait for
        // them too, within what is left of the grace.
        let deadline = tokio::time::Instant::now() + self.grace;
        while self.worker.jobs.active() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.worker.jobs.cancel_all(CancelCause::Shutdown, false);
        let stop = tokio::time::Instant::now() + Duration::from_secs(5);
        while self.worker.jobs.active() > 0 && tokio::time::Instant::now() < stop {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.gossip.abort();
        // What is queued for the state database is committed before exit.
        self.worker.db.close();
        result??;
        Ok(())
    }
}

/// How often a worker refreshes its record in the host's ledger.
pub const HOST_LEDGER_REFRESH: Duration = Duration::from_millis(250);

/// How often what expired is forgotten (or more often, with a shorter
/// `--keep-results`).
pub const EXPIRE_EVERY: Duration = Duration::from_secs(3600);

/// Every route, behind the protocol check. The submission endpoints get
/// the worker's [`Owner`] as an extension.
fn router(worker: Arc<Worker>, owner: Arc<Owner>) -> Router {
    use crate::proto::routes;
    // Requests with a tenant's body: the tenant first, then the body.
    let uploads = Router::new()
        .route(routes::MODULE, put(modules::put_module))
        .route(routes::TREE, put(files::put_tree))
        .route(routes::FILE, put(files::put_file))
        .route(routes::JOBS, post(jobs::post_job))
        .route(routes::BATCH, post(batch::post_batch))
        .route(routes::STREAM, post(stream::post_stream))
        .route(routes::SUBMISSIONS, post(submissions::post_submission))
        .route_layer(axum::middleware::from_fn_with_state(worker.clone(), extract::tenant_first));
    Router::new()
        .merge(uploads)
        .route(routes::STATUS_PAGE, get(pool::status_page))
        .route(routes::JOBS, get(jobs::list_jobs))
        .route(routes::JOB, get(jobs::get_job).delete(jobs::delete_job))
        .route(routes::JOB_OUTPUT, get(jobs::get_output))
        .route(routes::SUBMISSIONS, get(submissions::list_submissions))
        .route(routes::SUBMISSION, get(submissions::get_submission).delete(submissions::delete_submission))
        .route(routes::SUBMISSION_RESULTS, get(submissions::get_results))
        .route(routes::HISTORY, get(submissions::get_history))
        .route(routes::GOSSIP, post(pool::post_gossip))
        .route(routes::PEERS, get(pool::get_peers))
        .route(routes::METRICS, get(pool::get_metrics))
        .layer(axum::Extension(owner))
        .layer(axum::middleware::from_fn(extract::protocol))
        .with_state(worker)
}
