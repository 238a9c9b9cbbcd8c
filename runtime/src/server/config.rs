//! How a worker is set up: [`WorkerConfig`], and the defaults the command
//! line shows for what it leaves out.

use std::net::SocketAddr;
use std::time::Duration;

use super::serve::ServeLimits;
use crate::runner::RunnerConfig;
use crate::worker::ledger::LedgerConfig;
use crate::worker::tenants::Tenants;

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
    /// Where other members are found again while the worker runs (a pool
    /// directory's `members/`): each one not in the view is contacted, so
    /// workers that started at the same moment, each alone, become one
    /// pool within a round. Default: none.
    pub members: Option<super::pooldir::PoolDir>,
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
    /// A job waiting longer than this gets memory held for it, sooner
    /// where jobs are short (`AdmissionConfig::hold_after`). Default:
    /// [`DEFAULT_HOLD_AFTER`](crate::worker::DEFAULT_HOLD_AFTER).
    pub hold_after: Duration,
    /// The key gossip is authenticated with (`--cluster-key`). Default:
    /// none, which [`start`](super::start()) allows only on a loopback
    /// address unless `insecure_gossip`; there, the worker seals its gossip
    /// with this user's own pool key (`pool.key` in
    /// [`user_runtime_dir`](crate::private_path::user_runtime_dir), made on
    /// first use), so another user of the machine cannot join.
    pub cluster_key: Option<std::path::PathBuf>,
    /// Gossip without any key (`--insecure-gossip`): anyone who reaches the
    /// port can then plant adverts, which this worker then vouches for to
    /// no one ([`PeerView::vouched`](crate::gossip::PeerView::vouched) is
    /// false): clients place jobs only on the workers they name. Default: false.
    pub insecure_gossip: bool,
    /// TLS (`--tls-cert`, `--tls-key`, `--tls-ca`): the worker then serves
    /// only TLS and talks TLS to its peers. Default: none, plain HTTP.
    pub tls: Option<crate::net::tls::WorkerTls>,
    /// Serve plain HTTP with `--tenants` on an address others can reach
    /// (`--insecure-http`), where tenants' tokens cross the network in
    /// clear; [`start`](super::start()) refuses that otherwise. Default: false.
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
    /// How long a client of a streamed job may read nothing before its
    /// stream is dropped, the job cancelled and its output given back
    /// (`--unread-grace`). Default: [`DEFAULT_UNREAD_GRACE`](super::stream::DEFAULT_UNREAD_GRACE).
    pub unread_grace: Duration,
    /// Modules compiled as the worker starts (`--precompile`), in the
    /// background, for the engine their jobs will run on, so that the
    /// first job of each starts at once (CPython's takes ~45 s to
    /// compile). Default: none.
    pub precompile: Vec<std::path::PathBuf>,
    /// The batch job lending this worker and when it ends (`--ends-at`,
    /// `--drain-before`, `--slurm`): it drains before then. Default: none,
    /// no end.
    pub lifetime: crate::worker::lifetime::Lifetime,
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
            members: None,
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
            history_keep: Duration::from_secs(
                u64::from(crate::worker::DEFAULT_HISTORY_DAYS) * 24 * 3600,
            ),
            keep_results: DEFAULT_KEEP_RESULTS,
            host_ledger: Some(crate::worker::default_host_ledger()),
            precompile: Vec::new(),
            unread_grace: super::stream::DEFAULT_UNREAD_GRACE,
            lifetime: Default::default(),
        }
    }
}
