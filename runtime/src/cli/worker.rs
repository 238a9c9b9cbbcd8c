//! `peerwasm worker`: lend this machine to the pool.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use crate::runner::RunnerConfig;
use crate::server::DEFAULT_MAX_JOB_TIME;
use crate::server::{WorkerConfig, start};
use crate::units::{Size, Span, parse_duration, parse_size};
use crate::worker::ledger::LedgerConfig;
use crate::worker::tenants::Tenants;

#[derive(clap::Args, Debug)]
pub struct WorkerArgs {
    /// Address to listen on; port 0 picks a free port (printed at start).
    #[arg(long, default_value = "127.0.0.1:7070", value_name = "ADDR")]
    listen: SocketAddr,
    /// Peers to join through, comma-separated host:port.
    #[arg(long, value_delimiter = ',', value_name = "ADDR,...")]
    join: Vec<String>,
    /// Jobs run at once [default: number of cores].
    #[arg(long, value_name = "N")]
    slots: Option<usize>,
    /// Which jobs run in a slot process — a child that runs the job's code
    /// with no time-limit checks and is killed at its deadline: `auto`
    /// (jobs of modules whose last job computed 20 ms or more), `always`,
    /// or `never` (all in this process, with fuel: up to 40% slower
    /// compute). See docs/time-limits.md.
    #[arg(long, value_name = "WHEN", default_value = "auto")]
    slot_processes: crate::runner::slotproc::SlotPolicy,
    /// The most memory jobs may hold here, e.g. 8GiB [default: physical
    /// memory less --reserve, or the cgroup's limit if lower].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    memory: Option<u64>,
    /// Memory always left to the host and its users.
    #[arg(long, value_name = "SIZE", default_value_t = Size(crate::worker::ledger::DEFAULT_RESERVE))]
    reserve: Size,
    /// In a cgroup with a memory limit (a Slurm job's --mem, a container's),
    /// what of it this worker keeps for itself — its process and its slot
    /// processes, which the cgroup counts beside the jobs — and does not
    /// lend [default: 32 MiB + 4 MiB per slot].
    #[arg(long, value_name = "SIZE")]
    overhead: Option<Size>,
    /// Where compiled modules are cached, under modules/ [default:
    /// ~/.cache/peerwasm].
    #[arg(long, value_name = "DIR", env = "PEERWASM_CACHE_DIR")]
    cache_dir: Option<PathBuf>,
    /// Where the worker keeps what must outlive it — the submissions it
    /// owns (`map --detach`) and its job history — in a SQLite database
    /// [default: ~/.local/share/peerwasm/worker-ADDR-PORT, after --listen;
    /// with port 0 a temporary dir, removed when the worker stops].
    #[arg(long, value_name = "DIR", env = "PEERWASM_STATE_DIR")]
    state_dir: Option<PathBuf>,
    /// Days the records of finished jobs (`peerwasm history`) are kept.
    #[arg(long, value_name = "DAYS", default_value_t = crate::worker::DEFAULT_HISTORY_DAYS)]
    history_days: u32,
    /// How long the results of finished detached jobs and maps (`run
    /// --detach`, `map --detach`) are kept after they ended, unless
    /// discarded first (`peerwasm cancel ID`), e.g. 7days, 12h.
    #[arg(long, value_name = "DUR", default_value_t = Span(crate::server::DEFAULT_KEEP_RESULTS))]
    keep_results: Span,
    /// The file this worker shares with the other peerwasm workers of this
    /// machine, so that together they never lend more memory than it has;
    /// `none` to decide alone. Workers of different users share one only
    /// if given a path in a directory of a common group, not writable by
    /// others (a lab's group directory); the file must be this user's
    /// (0600) or that group's (0660), not a link
    /// [default: ledger in this user's private runtime dir].
    #[arg(long, value_name = "PATH|none", env = "PEERWASM_HOST_LEDGER")]
    host_ledger: Option<PathBuf>,
    /// How much CPU time compiling one module may take (all its threads;
    /// compiles run in a child process, ended past it): the job is then
    /// rejected naming this limit, and so are later jobs of that module. A
    /// module over 16 MiB gets 0.5 s more per MiB beyond that (CPython's
    /// 95 MiB: 100 s by default; it compiles in ~66 s of CPU).
    #[arg(long, value_name = "DUR", default_value_t = Span(crate::server::DEFAULT_MAX_COMPILE_TIME))]
    max_compile_time: Span,
    /// The most disk the compiled-module cache may take; the least recently
    /// used modules are removed first (and compiled again when needed).
    #[arg(long, value_name = "SIZE", default_value_t = Size(crate::sandbox::DEFAULT_CACHE_MAX))]
    cache_max: Size,
    /// Time between gossip rounds.
    #[arg(long, value_name = "DUR", default_value_t = Span(crate::server::DEFAULT_GOSSIP_INTERVAL))]
    gossip_interval: Span,
    /// Tenants who may submit, with their token hashes, weights and limits
    /// (TOML; see the README). Without it, anyone who reaches the worker
    /// may submit, as one tenant.
    #[arg(long, value_name = "FILE")]
    tenants: Option<PathBuf>,
    /// Share slots between tenants by their decayed usage (on), or serve
    /// jobs in arrival order (off).
    #[arg(long, value_name = "on|off", default_value = "on", value_parser = parse_on_off, action = clap::ArgAction::Set)]
    fair_share: bool,
    /// A file holding the pool's shared secret (at least 16 bytes): gossip
    /// is authenticated with it (HMAC-SHA256) and forged or replayed
    /// messages are dropped. Every worker of a pool needs the same file.
    /// Without it, a worker on loopback uses this user's own pool key
    /// (made on first use in the user's private runtime dir), so another
    /// user of the machine cannot join.
    #[arg(long, value_name = "FILE")]
    cluster_key: Option<PathBuf>,
    /// Gossip without any key (anyone who reaches the port can plant
    /// adverts; this worker then vouches for no other worker, and clients
    /// place jobs only on the workers they name).
    #[arg(long, conflicts_with = "cluster_key")]
    insecure_gossip: bool,
    /// Serve TLS with this certificate (PEM; `peerwasm tls issue` makes
    /// one): clients and peers then reach this worker only over TLS.
    #[arg(long, value_name = "FILE", requires_all = ["tls_key", "tls_ca"])]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM; this user's alone: made 0600
    /// if it is open to others).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// The pool CA's certificate (PEM): this worker trusts it when it
    /// talks to its peers (gossip, the jobs of the maps it owns).
    /// Without --tls-cert it is not used (a worker without a certificate
    /// serves plain HTTP), and the worker says so.
    #[arg(long, value_name = "FILE", env = crate::net::transport::TLS_CA_ENV)]
    tls_ca: Option<PathBuf>,
    /// Serve plain HTTP with --tenants although --listen is reachable from
    /// other machines: tenants' tokens then cross the network in clear.
    #[arg(long, conflicts_with = "tls_cert")]
    insecure_http: bool,
    /// Half-life of tenants' usage in fair share.
    #[arg(long, value_name = "DUR", default_value_t = Span(crate::worker::DEFAULT_HALF_LIFE))]
    usage_half_life: Span,
    /// Module bytes kept in memory for compiling, at most; the least
    /// recently used are dropped (a client uploads a dropped module again).
    #[arg(long, value_name = "SIZE", default_value_t = Size(crate::sandbox::DEFAULT_MODULE_BYTES_HELD))]
    module_memory: Size,
    /// The largest module this worker accepts (an upload, or a job's
    /// module); larger ones are refused, naming this limit. Compiling a
    /// module takes about 20 times its size in memory for a while.
    #[arg(long, value_name = "SIZE", default_value_t = Size(crate::sandbox::DEFAULT_MAX_MODULE_BYTES))]
    max_module_size: Size,
    /// Compile this module as the worker starts, in the background, for
    /// the engine its jobs will run on (repeatable): its first job then
    /// starts at once, e.g. `--precompile python.wasm` (~45 s of compile).
    #[arg(long, value_name = "FILE.wasm")]
    precompile: Vec<PathBuf>,
    /// The address peers and clients reach this worker at, host:port (a
    /// name is fine), when it is not the --listen address: e.g. with
    /// --listen 0.0.0.0:7070 on a cluster node, --advertise node042:7070.
    /// A bare HOST (or HOST:0) takes the port --listen bound: with
    /// --listen 0.0.0.0:0, two workers on one node never collide.
    #[arg(long, value_name = "HOST[:PORT]", value_parser = parse_host_port)]
    advertise: Option<String>,
    /// Join the pool kept in this shared directory (private to you, on a
    /// filesystem every node sees): the pool's key and CA are made there by
    /// the first worker, each worker issues its own certificate at start
    /// for the host it advertises, and lists itself there while it runs,
    /// so any allocation can join. Clients use DIR/ca.crt
    /// (PEERWASM_TLS_CA) and any address in DIR/members/.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["cluster_key", "tls_cert", "insecure_gossip"])]
    pool_dir: Option<PathBuf>,
    /// This worker runs in a Slurm job: it names the job in its advert
    /// (SLURM_JOB_ID), learns when the job ends (squeue), drains
    /// --drain-before that, and takes no job that states a time limit it
    /// could not finish by then.
    #[arg(long)]
    slurm: bool,
    /// This worker is ended after this long (a batch job's walltime, when
    /// not --slurm): it drains --drain-before that.
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    ends_in: Option<Duration>,
    /// How long before its end (--slurm, --ends-in) the worker drains:
    /// running jobs get that long to finish [default: --drain-grace].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    drain_before: Option<Duration>,
    /// Jobs one tenant may have waiting here; more are refused (503) and
    /// the client tries another worker [default: 256 per slot].
    #[arg(long, value_name = "N")]
    max_queued: Option<u32>,
    /// Bytes one tenant's waiting jobs may hold here, counted as sent (args,
    /// env, stdin and all); more are refused (503) and the client tries
    /// another worker.
    #[arg(long, value_name = "SIZE", default_value_t = Size(crate::worker::admission::QUEUE_BYTES_PER_TENANT))]
    max_queued_bytes: Size,
    /// Bytes of finished detached jobs' output one tenant may hold here;
    /// past it its new detached jobs are refused (503) until it discards
    /// some.
    #[arg(long, value_name = "SIZE", default_value_t = Size(crate::server::DEFAULT_MAX_RESULTS))]
    max_results: Size,
    /// Bytes of detached maps (inputs and results) one tenant may keep in
    /// this worker's state database; past it, its next `map --detach` here
    /// is refused until it discards finished ones (`peerwasm cancel ID`).
    #[arg(long, value_name = "SIZE", default_value_t = Size(crate::server::DEFAULT_MAX_STORED))]
    max_stored: Size,
    /// Connections served at once; more are closed as they arrive.
    #[arg(long, value_name = "N", default_value_t = crate::server::DEFAULT_MAX_CONNECTIONS)]
    max_connections: usize,
    /// Connections one address may hold at once, so that one client cannot
    /// take them all [default: a quarter of --max-connections].
    #[arg(long, value_name = "N")]
    max_connections_per_address: Option<usize>,
    /// How long the client of a streamed job (`run --peers`) may read none
    /// of its output before the stream is dropped, the job cancelled and
    /// its output given back.
    #[arg(long, value_name = "DUR", default_value_t = Span(crate::server::DEFAULT_UNREAD_GRACE))]
    unread_grace: Span,
    /// Bytes one tenant's requests may make this worker hold at once
    /// (bodies being read and decoded, tree manifests);
    /// past it, its requests get 503 and its client retries.
    #[arg(long, value_name = "SIZE", default_value_t = Size(crate::worker::DEFAULT_MAX_REQUEST_BYTES))]
    max_request_bytes: Size,
    /// Time a client has to send a request's headers before its connection
    /// is closed (slow clients cannot hold connections open).
    #[arg(long, value_name = "DUR", default_value_t = Span(crate::server::DEFAULT_HEADER_TIMEOUT))]
    header_timeout: Span,
    /// The longest any job may run here, e.g. 2h, or `none`: a job that
    /// asks for no limit gets this one, and a job asking for more is
    /// refused, naming it (like a cluster partition's MaxTime).
    #[arg(long, value_name = "DUR|none", value_parser = parse_max_job_time,
          default_value_t = MaxJobTime(Some(DEFAULT_MAX_JOB_TIME)))]
    max_job_time: MaxJobTime,
    /// On shutdown (SIGTERM, Ctrl-C), how long running jobs may go on
    /// before they are cancelled; queued jobs are cancelled at once, so
    /// their clients send them elsewhere.
    #[arg(long, value_name = "DUR", default_value_t = Span(crate::server::DEFAULT_DRAIN_GRACE))]
    drain_grace: Span,
    /// A job that has waited this long gets memory held for it, so large
    /// jobs are not starved by a stream of small ones (sooner where jobs
    /// are short: after 3 × the mean time of recent jobs, at least 250 ms).
    #[arg(long, value_name = "DUR", default_value_t = Span(crate::worker::DEFAULT_HOLD_AFTER))]
    hold_after: Span,
    /// Files and directories one job may hold open; past it, opening gives
    /// the job EMFILE (the worker's own descriptors are never at risk).
    #[arg(long, value_name = "N", default_value_t = crate::sandbox::files::DEFAULT_MAX_OPEN_FILES)]
    max_open_files: u32,
    /// Bytes one job may write to files (its scratch directory /tmp); past
    /// it, writing gives the job ENOSPC.
    #[arg(long, value_name = "SIZE", default_value_t = Size(crate::server::DEFAULT_SCRATCH))]
    scratch: Size,
    /// Where jobs' scratch directories are made [default: the system's
    /// temporary directory].
    #[arg(long, value_name = "DIR")]
    scratch_dir: Option<PathBuf>,
    /// Bytes all running jobs together may write to files; past it their
    /// writes get ENOSPC [default: 90% of the free space where scratch
    /// lives, when the worker starts].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    scratch_total: Option<u64>,
    /// The most stdout, and the most stderr, a job's output is buffered to
    /// here, whatever the job asks; past it the job ends with "output
    /// limit".
    #[arg(long, value_name = "SIZE", default_value_t = Size(crate::server::DEFAULT_MAX_OUTPUT))]
    max_output: Size,
    /// Bytes of files shipped with jobs (`run --dir` on a pool) kept here by
    /// content hash, shared by all jobs; the least recently used go first.
    /// They count against --scratch-total too.
    #[arg(long, value_name = "SIZE", default_value_t = Size(crate::worker::DEFAULT_FILE_STORE))]
    file_store: Size,
    /// The most bytes of files one job sends back from its writable
    /// directories; past it the job ends "files back too large".
    #[arg(long, value_name = "SIZE", default_value_t = Size(crate::worker::DEFAULT_MAX_FILES_BACK))]
    max_files_back: Size,
}

/// `--max-job-time`: a duration, or no limit.
#[derive(Clone, Copy, Debug)]
struct MaxJobTime(Option<Duration>);

impl std::fmt::Display for MaxJobTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(d) => write!(f, "{}", humantime::format_duration(d)),
            None => f.write_str("none"),
        }
    }
}

fn parse_max_job_time(s: &str) -> Result<MaxJobTime, String> {
    match s.trim() {
        "none" | "unlimited" | "off" => Ok(MaxJobTime(None)),
        t => match parse_duration(t)? {
            d if d.is_zero() => Err("--max-job-time must be above 0 (or `none`)".into()),
            d => Ok(MaxJobTime(Some(d))),
        },
    }
}

fn parse_host_port(s: &str) -> Result<String, String> {
    match s.rsplit_once(':') {
        Some((host, port))
            if !host.is_empty() && !host.ends_with(':') && port.parse::<u16>().is_ok() =>
        {
            Ok(s.to_string())
        }
        _ if !s.is_empty()
            && !s.contains(['/', ' '])
            && (!s.contains(':') || s.starts_with('[')) =>
        {
            Ok(s.to_string())
        }
        _ => Err(format!("expected HOST or HOST:PORT, not {s:?}")),
    }
}

fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" | "true" | "yes" => Ok(true),
        "off" | "false" | "no" => Ok(false),
        _ => Err(format!("expected on or off, not {s:?}")),
    }
}

pub fn run(args: WorkerArgs) -> anyhow::Result<ExitCode> {
    let mut sandbox = crate::sandbox::SandboxConfig::default();
    if let Some(n) = args.slots {
        sandbox.slots = n.max(1);
    }
    sandbox.module_bytes_held = args.module_memory.0;
    sandbox.max_module_bytes = args.max_module_size.0;
    sandbox.cache_dir = args
        .cache_dir
        .or_else(super::args::default_cache_root)
        .map(|root| root.join("modules"));
    sandbox.max_job_time = args.max_job_time.0;
    sandbox.max_open_files = args.max_open_files.max(1);
    sandbox.cache_max_bytes = args.cache_max.0;
    sandbox.max_scratch_bytes = Some(args.scratch.0);
    let scratch_root = args.scratch_dir.clone().unwrap_or_else(std::env::temp_dir);
    sandbox.scratch_total_bytes = Some(
        args.scratch_total
            .unwrap_or_else(|| free_space(&scratch_root) / 10 * 9),
    );
    sandbox.scratch_root = args.scratch_dir;
    sandbox.claim_jobs_dir = true;
    sandbox.max_compile_time = Some(args.max_compile_time.0);
    sandbox.compile_program = Some(super::args::compile_program()?);
    sandbox.max_output_bytes = Some(args.max_output.0);
    raise_descriptor_limit(args.slots.unwrap_or(sandbox.slots), args.max_open_files);
    let overhead = args.overhead.map_or_else(
        || crate::worker::ledger::default_overhead(sandbox.slots),
        |o| o.0,
    );
    let drain_before = args.drain_before.unwrap_or(args.drain_grace.0);
    let lifetime = match (args.slurm, args.ends_in) {
        (true, _) => super::batch::slurm_lifetime(drain_before)?,
        (false, Some(d)) => crate::worker::lifetime::Lifetime {
            batch_job: None,
            ends_at: Some(std::time::SystemTime::now() + d),
            drain_before,
        },
        (false, None) => Default::default(),
    };
    let (mut cluster_key, mut tls, mut join) = (
        args.cluster_key,
        worker_tls(args.tls_cert, args.tls_key, args.tls_ca),
        args.join,
    );
    let pool_dir = match &args.pool_dir {
        Some(dir) => {
            let pool = crate::server::pooldir::PoolDir::open(dir)?;
            let host = advertised_host(args.listen, args.advertise.as_deref());
            let joining = pool.join(&host)?;
            cluster_key = Some(joining.key);
            tls = Some(joining.tls.clone());
            join.extend(joining.members);
            Some((pool, joining.tls))
        }
        None => None,
    };
    let config = WorkerConfig {
        listen: args.listen,
        join,
        members: pool_dir.as_ref().map(|(pool, _)| pool.clone()),
        runner: RunnerConfig {
            sandbox,
            slot_processes: match args.slot_processes {
                crate::runner::slotproc::SlotPolicy::Never => None,
                policy => Some(crate::runner::slotproc::SlotProcessConfig {
                    program: super::args::slot_program()?,
                    policy,
                }),
            },
        },
        ledger: LedgerConfig {
            memory: args.memory,
            reserve: args.reserve.0,
            overhead,
            ..LedgerConfig::default()
        },
        gossip_interval: args.gossip_interval.0,
        tenants: match &args.tenants {
            Some(path) => Tenants::load(path)?,
            None => Tenants::single(),
        },
        fair_share: args.fair_share,
        usage_half_life: args.usage_half_life.0,
        hold_after: args.hold_after.0,
        cluster_key,
        insecure_gossip: args.insecure_gossip,
        tls,
        insecure_http: args.insecure_http,
        max_queued: args.max_queued,
        max_queued_bytes: args.max_queued_bytes.0,
        advertise: args.advertise.clone(),
        drain_grace: args.drain_grace.0,
        max_results: args.max_results.0,
        max_stored: args.max_stored.0,
        max_request_bytes: args.max_request_bytes.0,
        file_store_bytes: args.file_store.0,
        max_files_back: args.max_files_back.0,
        state_dir: args
            .state_dir
            .or_else(|| default_state_dir(args.listen, args.advertise.as_deref())),
        history_keep: Duration::from_secs(u64::from(args.history_days) * 24 * 3600),
        keep_results: args.keep_results.0,
        host_ledger: match args.host_ledger {
            Some(p) if p.as_os_str() == "none" => None,
            Some(p) => Some(p),
            None => Some(crate::worker::default_host_ledger()),
        },
        precompile: args.precompile,
        unread_grace: args.unread_grace.0,
        lifetime,
        serve: crate::server::ServeLimits {
            max_connections: args.max_connections.max(1),
            max_connections_per_address: args.max_connections_per_address,
            header_timeout: args.header_timeout.0,
        },
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let worker = start(config, shutdown_signal()).await?;
        // The one line scripts (and tests) read to learn the address.
        // Not println!: a worker whose stdout is closed (a batch system, a
        // pipe to `head -1`) must not panic here, after it began serving.
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout, "peerwasm worker listening on {}", worker.advertised)
            .and_then(|()| stdout.flush());
        drop(stdout);
        // Listed in the pool directory while it serves, renewed so that a
        // worker killed without leaving is unlisted (`pooldir::MEMBER_TTL`).
        let member = match &pool_dir {
            Some((pool, own)) => Some(Arc::new(pool.register(&worker.advertised, Some(own))?)),
            None => None,
        };
        if let Some(member) = &member {
            let member = Arc::downgrade(member);
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(crate::server::pooldir::MEMBER_RENEW).await;
                    let Some(member) = member.upgrade() else {
                        break;
                    };
                    if let Err(e) = member.renew() {
                        tracing::warn!("{e:#}");
                    }
                }
            });
        }
        worker.wait().await?;
        drop(member);
        let _ = writeln!(std::io::stderr(), "peerwasm worker stopped");
        Ok(ExitCode::SUCCESS)
    })
}

/// The host this worker is reached at: --advertise's, else --listen's
/// address unless that is a wildcard, else the machine's name.
fn advertised_host(listen: SocketAddr, advertise: Option<&str>) -> String {
    match advertise {
        Some(a) => crate::server::split_host_port(a).0.to_string(),
        None if !listen.ip().is_unspecified() => listen.ip().to_string(),
        None => sysinfo::System::host_name().unwrap_or_else(|_| "localhost".into()),
    }
}

/// `~/.local/share/peerwasm/worker-ADDR` (`$XDG_DATA_HOME`), ADDR being
/// the address the worker advertises, else the one it listens on: workers
/// of one host on different addresses or ports keep apart. None for port
/// 0, whose worker cannot be found again after a restart anyway.
fn default_state_dir(listen: SocketAddr, advertise: Option<&str>) -> Option<PathBuf> {
    let addr = advertise.map_or_else(|| listen.to_string(), String::from);
    let name = format!("worker-{addr}")
        .replace(['/', '[', ']'], "_")
        .replace(':', "-");
    (listen.port() != 0)
        .then(|| dirs::data_dir().map(|d| d.join("peerwasm").join(name)))
        .flatten()
}

/// Bytes free for unprivileged users on the filesystem of `dir` (0 if it
/// cannot be read).
fn free_space(dir: &std::path::Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return 0;
    };
    // SAFETY: statvfs writes into the zeroed struct we own; the path is a
    // valid NUL-terminated string.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(path.as_ptr(), &mut st) != 0 {
            return 0;
        }
        (st.f_bavail as u64).saturating_mul(st.f_frsize as u64)
    }
}

/// Raises this process's soft limit on open descriptors to its hard limit
/// (as most servers do), and warns when even that cannot hold every slot's
/// jobs at their bound with room for connections.
fn raise_descriptor_limit(slots: usize, per_job: u32) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid, owned rlimit struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim = raised;
            }
        }
    }
    // A component may hold a few handles more than a module (its streams).
    let per_job = per_job as u64 + u64::from(crate::sandbox::component::HANDLE_SLACK);
    let needed = slots as u64 * per_job + 1024;
    if lim.rlim_cur < needed {
        tracing::warn!(
            limit = lim.rlim_cur,
            needed,
            "the descriptor limit (ulimit -n) is below slots x (--max-open-files + 32) + 1024: jobs at their bound could starve the worker"
        );
    }
}

/// SIGINT or SIGTERM.
pub(super) async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(t) => t,
        Err(_) => {
            let _ = ctrl_c.await;
            return;
        }
    };
    tokio::select! {
        _ = ctrl_c => {}
        _ = term.recv() => {}
    }
}

/// The worker's TLS files, when it has a certificate (clap makes
/// `--tls-cert` bring `--tls-key` and `--tls-ca`). A CA alone, as
/// `PEERWASM_TLS_CA` exported for the clients of this shell gives, is said
/// and ignored: without a certificate the worker serves plain HTTP.
fn worker_tls(
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    ca: Option<PathBuf>,
) -> Option<crate::net::tls::WorkerTls> {
    match (cert, key, ca) {
        (Some(cert), Some(key), Some(ca)) => Some(crate::net::tls::WorkerTls { cert, key, ca }),
        (None, _, Some(ca)) => {
            tracing::warn!(ca = %ca.display(), "a pool CA is given but no --tls-cert: this worker serves plain HTTP");
            None
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests;
