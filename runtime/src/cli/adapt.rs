//! `peerwasm adapt`: keep a pool on Slurm sized to its backlog
//! (`crate::adapt`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use crate::adapt::{AdaptConfig, ControllerStatus, Policy, PoolSource, Slurm};
use crate::server::pooldir::{CONTROLLER_TTL, Controller};
use crate::units::{Size, Span};

#[derive(clap::Args, Debug)]
pub struct AdaptArgs {
    /// The pool's shared directory (as `peerwasm worker --pool-dir`): the
    /// workers it starts join it, and it reads the pool through its
    /// members, trusting its CA.
    #[arg(long, value_name = "DIR")]
    pool_dir: PathBuf,
    /// Fewest workers kept, even with nothing to do.
    #[arg(long, default_value_t = 1)]
    min: u32,
    /// Most workers.
    #[arg(long, default_value_t = 8)]
    max: u32,
    /// Slots of each worker (its Slurm job's --cpus-per-task).
    #[arg(long, default_value_t = 1)]
    slots: u32,
    /// The backlog is to take about this long: more work asks for more
    /// workers (as dask's adapt).
    #[arg(long, value_name = "DUR", default_value_t = Span(Duration::from_secs(5)))]
    target_duration: Span,
    /// A worker with nothing to do for this long, while the backlog wants
    /// fewer, is let go.
    #[arg(long, value_name = "DUR", default_value_t = Span(Duration::from_secs(10)))]
    idle: Span,
    /// The least memory a worker job asks for.
    #[arg(long, value_name = "SIZE", default_value_t = Size(256 << 20))]
    min_mem: Size,
    /// The most memory a worker job asks for (a node's size).
    #[arg(long, value_name = "SIZE", default_value_t = Size(64 << 30))]
    max_mem: Size,
    /// Memory a worker needs besides its jobs' limits and the 12 MiB each
    /// running job is reserved beside (the process, compiles): added to
    /// each worker's --mem, and passed to the worker as its --overhead.
    #[arg(long, value_name = "SIZE", default_value_t = Size(64 << 20))]
    overhead: Size,
    /// An option passed to every sbatch as it is (repeatable): your site's
    /// --partition=, --account=, --qos=, --time=, --constraint=.
    #[arg(long = "sbatch", value_name = "OPTION", allow_hyphen_values = true)]
    sbatch: Vec<String>,
    /// An option added to every worker's command line (repeatable), e.g.
    /// --worker-arg=--tenants=/path/tenants.toml.
    #[arg(long = "worker-arg", value_name = "OPTION", allow_hyphen_values = true)]
    worker_args: Vec<String>,
    /// How often the pool and Slurm are read.
    #[arg(long, value_name = "DUR", default_value_t = Span(Duration::from_secs(1)))]
    poll: Span,
    /// The Slurm job name of the worker jobs [default: peerwasm-adapt-PID].
    #[arg(long)]
    name: Option<String>,
    /// Serve the controller's figures (target, workers, jobs submitted,
    /// cancelled, refused) for Prometheus at http://ADDR/metrics.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,
}

pub fn run(args: AdaptArgs) -> anyhow::Result<ExitCode> {
    let (exe, before) = super::args::this_program("worker", "for the workers")?;
    let pool_dir = crate::server::pooldir::PoolDir::open(&args.pool_dir)?;
    let dir = pool_dir.path().canonicalize()?;
    // The same program in the same role: what came before our arguments
    // (a program embedding peerwasm's command line) comes again.
    let mut worker = vec![shell_quote(&exe.to_string_lossy())];
    worker.extend(before.iter().map(|a| shell_quote(&a.to_string_lossy())));
    worker.extend([
        "--listen 0.0.0.0:0".into(),
        // Each node's own name, as the cluster resolves it.
        "--advertise \"${SLURMD_NODENAME:-$(hostname)}\"".into(),
        format!("--pool-dir {}", shell_quote(&dir.to_string_lossy())),
        "--slurm".into(),
    ]);
    // Each worker keeps for itself what its job was sized with beside its
    // jobs, and lends the rest: the jobs it was asked for, no more.
    if !args.worker_args.iter().any(|a| a.starts_with("--overhead")) {
        worker.push(format!("--overhead {}", args.overhead.0));
    }
    worker.extend(args.worker_args.iter().map(|a| shell_quote(a)));
    let slurm = Slurm {
        name: args
            .name
            .unwrap_or_else(|| format!("peerwasm-adapt-{}", std::process::id())),
        sbatch_args: args.sbatch,
        worker_command: worker.join(" "),
    };
    slurm.check()?;
    let config = AdaptConfig {
        policy: Policy {
            min: args.min,
            max: args.max.max(args.min),
            slots: args.slots.max(1),
            target_duration: args.target_duration.0,
            idle_for: args.idle.0,
            overhead_bytes: args.overhead.0,
            min_worker_bytes: args.min_mem.0,
            max_worker_bytes: args.max_mem.0,
            ..Policy::default()
        },
        poll: args.poll.0,
        ..AdaptConfig::default()
    };
    // Clients may start before any worker: the key and CA are made now.
    pool_dir.prepare()?;
    let ca = dir.join(crate::net::certs::CA_CERT);
    let (members, direct) = (pool_dir.clone(), pool_dir.clone());
    let source = PoolSource::new(
        move || members.members(),
        move |seeds| {
            let transport = crate::net::Transport::new(Some(&ca), false)?;
            crate::client::Pool::new(crate::client::PoolConfig {
                transport,
                ..crate::client::PoolConfig::new(seeds)
            })
        },
    )
    .with_direct_backlogs(move || direct.backlogs());
    let controller = Controller {
        name: slurm.name.clone(),
        host: sysinfo::System::host_name().unwrap_or_default(),
        pid: std::process::id(),
        max_workers: args.max.max(args.min),
        largest_job: args
            .max_mem
            .0
            .saturating_sub(args.overhead.0)
            .saturating_sub(crate::sandbox::JOB_NATIVE_BYTES),
        status: Default::default(),
    };
    eprintln!(
        "peerwasm adapt: sizing the pool in {} to its backlog with Slurm jobs named {} ({}..{} workers of {} slot{})",
        dir.display(),
        slurm.name,
        config.policy.min,
        config.policy.max,
        config.policy.slots,
        if config.policy.slots == 1 { "" } else { "s" }
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let summary = runtime.block_on(async {
        let stop = tokio_util::sync::CancellationToken::new();
        let on_signal = stop.clone();
        tokio::spawn(async move {
            super::worker::shutdown_signal().await;
            on_signal.cancel();
        });
        let (status, mut changes) = tokio::sync::watch::channel(ControllerStatus::default());
        if let Some(addr) = args.metrics {
            serve_metrics(addr, changes.clone(), controller.name.clone()).await?;
        }
        // Clients of the pool directory learn that the pool grows (and how
        // large a job it can take) from this notice, renewed while it runs
        // and whenever what it is doing changes (`peerwasm status`).
        let (notice, announcing) = (pool_dir.clone(), stop.clone());
        let mut renew = controller.clone();
        let announcer = tokio::spawn(async move {
            loop {
                renew.status = changes.borrow_and_update().clone();
                if let Err(e) = notice.announce(&renew) {
                    tracing::warn!(
                        "cannot write the controller's notice into the pool directory: {e:#}"
                    );
                }
                tokio::select! {
                    () = announcing.cancelled() => break,
                    () = tokio::time::sleep(CONTROLLER_TTL / 6) => {}
                    _ = changes.changed() => {}
                }
            }
        });
        let out = crate::adapt::run(config, source, Arc::new(slurm), stop, status, |d| {
            eprintln!("peerwasm adapt: {}", d.why)
        })
        .await;
        let _ = announcer.await;
        pool_dir.retire(&controller.name);
        out
    })?;
    eprintln!(
        "peerwasm adapt: stopped; {} worker jobs submitted, {} cancelled ({} without having run a job), {} refused by Slurm",
        summary.submitted, summary.cancelled, summary.cancelled_unused, summary.refused
    );
    Ok(ExitCode::SUCCESS)
}

/// Serves `GET /metrics` on `addr` from the controller's status.
async fn serve_metrics(
    addr: std::net::SocketAddr,
    status: tokio::sync::watch::Receiver<ControllerStatus>,
    name: String,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot serve the metrics on {addr}: {e}"))?;
    eprintln!(
        "peerwasm adapt: metrics on http://{}/metrics",
        listener.local_addr()?
    );
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let text = crate::adapt::status::metrics_text(&status.borrow(), &name);
            async move {
                (
                    [(
                        axum::http::header::CONTENT_TYPE,
                        crate::worker::metrics::CONTENT_TYPE,
                    )],
                    text,
                )
            }
        }),
    );
    // Served as a worker's API is (`server::serve`): a few connections at
    // once, fewer per address, headers within the timeout — a scraper is
    // one client, and whoever else reaches the port cannot hold it.
    let limits = crate::server::ServeLimits {
        max_connections: METRICS_CONNECTIONS,
        ..crate::server::ServeLimits::default()
    };
    tokio::spawn(async move {
        let refused = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let forever = std::future::pending::<()>();
        if let Err(e) =
            crate::server::serve::serve(listener, None, app, limits, refused, forever).await
        {
            tracing::warn!("the metrics server stopped: {e}");
        }
    });
    Ok(())
}

/// Connections `adapt --metrics` serves at once (a quarter of them from one
/// address).
const METRICS_CONNECTIONS: usize = 16;

/// `s` quoted for the shell that runs the job's `--wrap`.
fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}
