//! How a worker is started: assembled (`assemble`) from a
//! [`WorkerConfig`], bound, gossip started, what it kept put back, and the
//! drain that shutting down begins.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::assemble::{Assembled, assemble};
use super::config::WorkerConfig;
use super::serve;
use crate::gossip::GossipNode;
use crate::gossip::transport::{HttpTransport, run_rounds};
use crate::owner::Owner;
use crate::proto::{Advert, CancelCause, PROTOCOL_HEADER, PROTOCOL_VERSION};
use crate::units::Bytes as Size;
use crate::worker::state::Worker;
use crate::worker::tenants::Tenants;

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
        while self.worker.jobs.table.active() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.worker
            .jobs
            .table
            .cancel_all(CancelCause::Shutdown, false);
        let stop = tokio::time::Instant::now() + Duration::from_secs(5);
        while self.worker.jobs.table.active() > 0 && tokio::time::Instant::now() < stop {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.gossip.abort();
        // What is queued for the state database is committed before exit.
        self.worker.jobs.kept.db.close();
        result??;
        Ok(())
    }
}

/// Builds a worker from `config`, binds, starts gossip and serves until
/// `shutdown` resolves (then drains: see [`RunningWorker::wait`]).
pub async fn start(
    config: WorkerConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<RunningWorker> {
    refuse_unkeyed_gossip_off_loopback(&config)?;
    refuse_tokens_in_clear_off_loopback(&config)?;
    let tls = config.tls.as_ref().map(|t| t.server_config()).transpose()?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", config.listen))?;
    let bound = listener.local_addr()?;
    let addr = advertised(config.advertise.as_deref(), bound);
    let Assembled { worker, owner, app } = assemble(&config, &addr, None)?;
    check_own_certificate(&config, &addr);
    log_start(&config, &worker);
    let (gossip, transport) = spawn_gossip(
        &worker,
        &owner,
        config.gossip_interval,
        config.members.clone(),
    )?;
    let drain = drain(
        worker.clone(),
        owner.clone(),
        transport,
        shutdown,
        config.gossip_interval,
        config.drain_grace,
    );
    let refused = worker.requests.connections_refused.clone();
    super::kept::restore_state(&owner, config.keep_results).await;
    let serve = tokio::spawn(serve::serve(
        listener,
        tls,
        app,
        config.serve.clone(),
        refused,
        drain,
    ));
    tokio::spawn(super::kept::keep_state(owner.clone(), config.keep_results));
    if !config.precompile.is_empty() {
        let (w, paths) = (worker.clone(), config.precompile.clone());
        tokio::task::spawn_blocking(move || precompile(&w, &paths));
    }
    Ok(RunningWorker {
        addr: bound,
        advertised: addr,
        serve,
        gossip,
        worker,
        grace: config.drain_grace,
    })
}

/// `host` and its port, if it names one (`[::1]:80`, `node:7070`, `node`).
pub fn split_host_port(addr: &str) -> (&str, Option<u16>) {
    match addr.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && (!host.contains(':') || host.ends_with(']')) => {
            (host, port.parse().ok())
        }
        _ => (addr, None),
    }
}

/// The address the worker gives peers and clients: `--advertise` (a bare
/// host, or port 0, takes the port it bound), else the bound address.
fn advertised(advertise: Option<&str>, bound: SocketAddr) -> String {
    match advertise.map(split_host_port) {
        Some((host, Some(port))) if port != 0 => format!("{host}:{port}"),
        Some((host, _)) => format!("{host}:{}", bound.port()),
        None => bound.to_string(),
    }
}

/// A worker reachable from other machines must authenticate its gossip, or
/// be told not to (`--insecure-gossip`).
fn refuse_unkeyed_gossip_off_loopback(config: &WorkerConfig) -> anyhow::Result<()> {
    if !config.listen.ip().is_loopback() && config.cluster_key.is_none() && !config.insecure_gossip
    {
        anyhow::bail!(
            "--listen {} can be reached from other machines, and gossip without a key can be forged by anyone \
             who reaches it: give every worker of the pool --cluster-key FILE (a shared secret of 16+ bytes, \
             e.g. `head -c 32 /dev/urandom > pool.key`), or --insecure-gossip to run without",
            config.listen
        );
    }
    Ok(())
}

/// A worker reachable from other machines with tenants must serve TLS, or
/// be told not to (`--insecure-http`): their tokens would cross the
/// network in clear.
fn refuse_tokens_in_clear_off_loopback(config: &WorkerConfig) -> anyhow::Result<()> {
    if !config.listen.ip().is_loopback()
        && config.tenants.is_multi()
        && config.tls.is_none()
        && !config.insecure_http
    {
        anyhow::bail!(
            "--listen {} can be reached from other machines, and with --tenants every job carries a tenant's token: \
             over plain HTTP anyone on the network between can read it and run jobs as that tenant. Give the worker \
             a certificate (`peerwasm tls init DIR`, `peerwasm tls issue DIR HOST`, then --tls-cert DIR/HOST.crt \
             --tls-key DIR/HOST.key --tls-ca DIR/ca.crt), or --insecure-http to run without",
            config.listen
        );
    }
    Ok(())
}

/// Says in the log, as the worker starts, if clients trusting its CA would
/// refuse its certificate at the address it advertises (expired, not for
/// that host, another CA): every one of them would fail otherwise, each
/// with its own message.
fn check_own_certificate(config: &WorkerConfig, addr: &str) {
    let Some(tls) = &config.tls else { return };
    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
    match crate::net::tls::would_refuse(&tls.cert, &tls.ca, host) {
        Ok(None) => {}
        Ok(Some(why)) => tracing::error!(
            cert = %tls.cert.display(), advertised = addr,
            "clients will refuse this worker's certificate: {}", crate::net::errors::tls_reason(&why)
        ),
        Err(e) => tracing::warn!("cannot check this worker's certificate: {e:#}"),
    }
}

fn log_start(config: &WorkerConfig, worker: &Worker) {
    let max_job_time = config
        .runner
        .sandbox
        .max_job_time
        .map(|d| humantime::format_duration(d).to_string());
    let ledger = worker.jobs.admission.ledger();
    let sizing = ledger.sizing();
    let from = match sizing.cgroup {
        _ if sizing.requested == Some(ledger.capacity()) => "--memory".to_string(),
        Some(limit) => format!(
            "the cgroup's limit {} less --overhead {}",
            Size(limit),
            Size(sizing.overhead)
        ),
        None => format!(
            "physical memory {} less --reserve {}",
            Size(sizing.physical),
            Size(ledger.reserve())
        ),
    };
    tracing::info!(addr = %worker.jobs.addr, slots = config.runner.sandbox.slots.max(1),
        capacity = %Size(ledger.capacity()),
        memory = %from,
        max_job_time = max_job_time.as_deref().unwrap_or("none"), "worker started");
    match &config.tenants {
        Tenants::Single(_) => {
            tracing::info!("single-tenant mode: no --tenants file, jobs need no token")
        }
        Tenants::Multi(t) => tracing::info!(
            tenants = t.len(),
            fair_share = config.fair_share,
            "multi-tenant mode"
        ),
    }
}

/// Gossip rounds every `interval` over HTTP, each publishing the worker's
/// advert afresh (and reading the pool's usage and the host's memory).
/// How often a worker of a pool directory reads its members again.
const MEMBERS_EVERY: Duration = Duration::from_secs(2);

/// Returns the rounds' task and their transport (the drain's farewell
/// goes over it too).
fn spawn_gossip(
    worker: &Arc<Worker>,
    owner: &Arc<Owner>,
    interval: Duration,
    members: Option<super::pooldir::PoolDir>,
) -> anyhow::Result<(tokio::task::JoinHandle<()>, Arc<HttpTransport>)> {
    let refresher = worker.clone();
    let owner = Arc::downgrade(owner);
    let transport = gossip_transport(worker)?;
    let mut last_members = None;
    let rounds = tokio::spawn(run_rounds(
        worker.node.gossip.clone(),
        transport.clone(),
        interval,
        move |node| {
            // Members found in the pool directory but not yet in the view are
            // contacted (every 2 s: a directory read, not every round).
            if let Some(dir) = &members
                && last_members.is_none_or(|t: std::time::Instant| t.elapsed() >= MEMBERS_EVERY)
            {
                last_members = Some(std::time::Instant::now());
                for addr in dir.members() {
                    node.introduce(&addr);
                }
            }
            refresh_record(&refresher, &owner, node);
        },
    ));
    Ok((rounds, transport))
}

/// How `worker` sends gossip: its transport, the protocol header on every
/// message, 5 s for an exchange.
pub(super) fn gossip_transport(worker: &Worker) -> anyhow::Result<Arc<HttpTransport>> {
    let mut protocol = reqwest::header::HeaderMap::new();
    protocol.insert(
        PROTOCOL_HEADER,
        reqwest::header::HeaderValue::from_static(PROTOCOL_VERSION),
    );
    let builder = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .tcp_nodelay(true);
    let http = worker.node.transport.client(builder, protocol, None)?;
    Ok(Arc::new(HttpTransport::new(http)))
}

/// What a worker does to its gossip node before each round: learns the
/// pool's usage (fair share) from it, checks host memory, counts the maps
/// its owner runs, and puts its fresh advert in.
pub(super) fn refresh_record(
    worker: &Worker,
    owner: &std::sync::Weak<Owner>,
    node: &mut GossipNode<Advert>,
) {
    worker.learn_pool_usage(node);
    worker.check_host_memory();
    if let Some(owner) = owner.upgrade() {
        worker
            .node
            .owned_maps
            .store(owner.submissions.count() as u32, Ordering::Relaxed);
    }
    node.set_record(worker.gossip_advert())
}

/// What happens on shutdown — or when the batch job lending this worker
/// is about to end (`Lifetime::drain_at`): the maps this worker owns stop
/// (they resume when it is back); it tells every peer at once that it is
/// leaving (a farewell round: it leaves every view within one round), new
/// jobs get 503, queued ones are cancelled so their clients go elsewhere;
/// it stops accepting then (after two more gossip rounds if the farewell
/// missed a peer); requests in flight —
/// running jobs — finish before `serve` returns, or are cancelled after
/// the grace.
async fn drain(
    worker: Arc<Worker>,
    owner: Arc<Owner>,
    transport: Arc<HttpTransport>,
    shutdown: impl std::future::Future<Output = ()>,
    interval: Duration,
    grace: Duration,
) {
    let ends = worker.jobs.gate.lifetime.drain_at().map(|at| {
        at.duration_since(std::time::SystemTime::now())
            .unwrap_or_default()
    });
    tokio::select! {
        () = shutdown => {}
        () = tokio::time::sleep(ends.unwrap_or(Duration::MAX / 4)), if ends.is_some() => {
            tracing::warn!(
                batch_job = worker.jobs.gate.lifetime.batch_job.as_deref().unwrap_or("-"),
                "the batch job lending this worker ends in {}: draining before it does",
                humantime::format_duration(Duration::from_secs(worker.jobs.gate.lifetime.drain_before.as_secs()))
            );
        }
    }
    let owned = owner.submissions.stop_all();
    if owned > 0 {
        tracing::info!(
            submissions = owned,
            "stopped the maps of owned submissions: they resume on restart"
        );
    }
    tracing::info!(grace = %humantime::format_duration(grace), "shutting down: finishing running jobs, leaving the pool");
    worker.jobs.gate.drain();
    // Queued jobs first: their clients send them elsewhere at once.
    let queued = worker.jobs.table.cancel_all(CancelCause::Shutdown, true);
    if queued > 0 {
        tracing::info!(
            queued,
            "cancelled queued jobs: their clients send them elsewhere"
        );
    }
    let farewell_worker = worker.clone();
    let missed = crate::gossip::transport::farewell(
        &worker.node.gossip,
        transport.as_ref(),
        &mut |node: &mut GossipNode<Advert>| node.set_record(farewell_worker.gossip_advert()),
    )
    .await;
    // Peers it missed that are leaving too (their own farewell said so:
    // workers of a pool let go together) need not hear it.
    let someone_to_tell = {
        let node = worker.node.gossip.lock();
        missed.iter().any(|addr| {
            !node
                .state()
                .iter()
                .any(|(id, s)| id.addr == *addr && s.record.draining)
        })
    };
    let reaper = worker.clone();
    tokio::spawn(async move {
        tokio::time::sleep(grace).await;
        let n = reaper.jobs.table.cancel_all(CancelCause::Shutdown, false);
        if n > 0 {
            tracing::warn!(
                jobs = n,
                "drain grace over: cancelled the jobs still running"
            );
        }
    });
    // A peer the farewell missed learns of the drain from the others'
    // gossip while this worker still answers (new jobs get 503, not a
    // refused connection): two more rounds. When every peer that stays
    // heard it, nobody is left to tell — a batch system waiting for the
    // job to end (`scancel`) gets it back two rounds sooner.
    if someone_to_tell {
        tokio::time::sleep(2 * interval).await;
    }
}

/// Compiles `paths` one after another (`--precompile`), saying how each
/// went: a module that cannot be read or compiled is named, and the worker
/// goes on without it.
fn precompile(w: &Worker, paths: &[std::path::PathBuf]) {
    for path in paths {
        let started = std::time::Instant::now();
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(path = %path.display(), "--precompile: cannot read the module: {e}");
                continue;
            }
        };
        match w.jobs.runner.precompile(bytes.into()) {
            Ok((hash, in_children, source)) => tracing::info!(
                path = %path.display(),
                module = %hash,
                for_engine = if in_children { "slot processes" } else { "this process" },
                took = %humantime::format_duration(std::time::Duration::from_millis(started.elapsed().as_millis() as u64)),
                "precompiled ({source:?})"
            ),
            Err(why) => {
                tracing::error!(path = %path.display(), "--precompile: the module does not compile: {why}")
            }
        }
    }
}

#[cfg(test)]
mod tests;
