//! `peerwasm worker`: the JobRunner behind HTTP, with the ledger, admission
//! and capacity gossip.
//!
//! Endpoints (bodies in postcard unless noted):
//! * `PUT  /v1/modules/{sha256}` — module bytes; the hash is verified;
//! * `POST /v1/jobs`, `GET /v1/jobs[/{id}]` — jobs (see [`super::jobs`]);
//! * `POST /v1/gossip` — anti-entropy (see `gossip::transport`);
//! * `GET  /v1/peers` — the pool as this worker sees it, JSON (or postcard
//!   with `Accept: application/x-postcard`);
//! * `GET  /metrics` — Prometheus text (see [`super::metrics`]);
//! * `GET  /` — the status page for browsers (HTML that polls
//!   `/v1/peers`), or the peers table as text for other clients.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::serve::ListenerExt;
use axum::Router;

use super::admission::{Admission, AdmissionConfig};
use super::fairshare::{PoolSize, Usage};
use super::jobs::{JobTable, authenticate};
use super::ledger::{Ledger, LedgerConfig};
use super::limits;
use super::runner::{JobRunner, RunnerConfig};
use super::metrics::Metrics;
use super::tenants::Tenants;
use super::warnings::{WarningKind, Warnings};
use crate::gossip::transport::{SharedNode, run_rounds};
use crate::gossip::{GossipConfig, GossipNode, Liveness, NodeId};
use crate::proto::{Advert, ModuleHash, POSTCARD, PROTOCOL_HEADER, PROTOCOL_VERSION, PeerView};
use crate::units::Bytes as Size;

/// How a worker is set up.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// Where to listen; port 0 picks a free port.
    pub listen: SocketAddr,
    /// Peers to join through (`host:port`).
    pub join: Vec<String>,
    /// The sandbox and its slots.
    pub runner: RunnerConfig,
    /// Memory sizing.
    pub ledger: LedgerConfig,
    /// Time between gossip rounds. Default: 1 s.
    pub gossip_interval: Duration,
    /// Who may submit. Default: one tenant, no tokens.
    pub tenants: Tenants,
    /// Fair share on or off (`AdmissionConfig::fair_share`). Default: on.
    pub fair_share: bool,
    /// Half-life of tenants' usage. Default: 10 minutes.
    pub usage_half_life: Duration,
    /// The key gossip is authenticated with (`--cluster-key`). Default: none.
    pub cluster_key: Option<std::path::PathBuf>,
    /// The address peers and clients reach this worker at (`--advertise`,
    /// `host:port`; a name is fine). `None`: the address it listens on.
    pub advertise: Option<String>,
    /// Jobs one tenant may have waiting here (`--max-queued`); more are
    /// refused with 503. `None`: `admission::QUEUE_PER_SLOT` × slots.
    pub max_queued: Option<u32>,
}

/// The state every handler shares.
pub(super) struct Worker {
    pub(super) addr: String,
    pub(super) runner: JobRunner,
    pub(super) admission: Arc<Admission>,
    pub(super) tenants: Tenants,
    pub(super) jobs: JobTable,
    gossip: Arc<SharedNode<Advert>>,
    host_id: String,
    pub(super) jobs_run: AtomicU64,
    modules_received: AtomicU64,
    pub(super) draining: std::sync::atomic::AtomicBool,
    pub(super) metrics: Metrics,
    pub(super) warnings: Warnings,
}

impl Worker {
    fn advert(&self) -> Advert {
        let snap = self.admission.ledger().snapshot();
        let (busy, queued) = self.admission.counts();
        Advert {
            addr: self.addr.clone(),
            host_id: self.host_id.clone(),
            capacity_bytes: snap.capacity,
            reserved_bytes: snap.reserved,
            reserved_high_water_bytes: snap.reserved_high_water,
            used_bytes: snap.used,
            host_available_bytes: snap.host_available,
            largest_fit_bytes: if busy >= self.admission.slots() { 0 } else { snap.offer },
            slots_total: self.admission.slots(),
            slots_busy: busy,
            queue_len: queued,
            jobs_run: self.jobs_run.load(Ordering::Relaxed),
            modules_received: self.modules_received.load(Ordering::Relaxed),
            draining: self.draining.load(Ordering::Relaxed),
            multi_tenant: self.tenants.is_multi(),
            tenants: self.admission.tenant_report(),
            warnings: self.warnings.current(),
        }
    }

    /// Raises the warnings that depend on how memory was sized.
    fn check_sizing(&self) {
        let ledger = self.admission.ledger();
        let sizing = ledger.sizing();
        if let (Some(cgroup), Some(memory)) = (sizing.cgroup, sizing.requested)
            && cgroup < memory
        {
            self.warnings.condition(
                WarningKind::CgroupBelowMemory,
                Some(format!("the cgroup's memory limit {} is lower than --memory {}: jobs get at most {}", Size(cgroup), Size(memory), Size(ledger.capacity()))),
            );
        }
        let physical_less_reserve = sizing.physical.saturating_sub(ledger.reserve());
        if let Some(memory) = sizing.requested
            && memory > physical_less_reserve
        {
            self.warnings.condition(
                WarningKind::MemoryAbovePhysical,
                Some(format!("--memory {} is more than physical memory less --reserve ({}): jobs get at most {}", Size(memory), Size(physical_less_reserve), Size(ledger.capacity()))),
            );
        }
    }

    /// Raises (or ends) the host-memory-low warning.
    fn check_host_memory(&self) {
        let snap = self.admission.ledger().snapshot();
        let reserve = self.admission.ledger().reserve();
        let low = (snap.host_available < reserve).then(|| {
            format!(
                "host available memory {} is below the reserve of {}: no job can start until it frees up",
                Size(snap.host_available),
                Size(reserve)
            )
        });
        self.warnings.condition(WarningKind::HostMemoryLow, low);
    }

    /// The `/metrics` text.
    fn metrics_text(&self) -> String {
        let advert = self.advert();
        let queued = self.admission.queued_by_tenant();
        let g = &self.gossip.stats;
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let now = self.gossip.now_ms();
        let peers: Vec<Liveness> = {
            let node = self.gossip.lock();
            node.state().iter().map(|(id, _)| node.liveness(id, now).unwrap_or(Liveness::Alive)).collect()
        };
        let warnings: Vec<(&'static str, u64)> = self.warnings.counts().into_iter().map(|(k, n)| (k.label(), n)).collect();
        self.metrics.render(&super::metrics::Scrape {
            advert: &advert,
            queued: &queued,
            cache: self.runner.sandbox().cache_stats(),
            module_bytes: self.runner.module_bytes_held(),
            gossip: [
                load(&g.rounds),
                load(&g.exchanges_ok),
                load(&g.exchanges_failed),
                load(&g.bytes_sent),
                load(&g.bytes_received),
                load(&g.rejected),
                load(&g.forged),
            ],
            peers: &peers,
            warnings: &warnings,
        })
    }

    /// Hands the rest of the pool's per-tenant usage to fair share, so
    /// tenants are ranked by what they use across the pool.
    fn learn_pool_usage(&self, node: &GossipNode<Advert>) {
        let now = self.gossip.now_ms();
        let mut remote: std::collections::HashMap<String, Usage> = Default::default();
        let mut pool = PoolSize { slots: 0.0, capacity_gib: 0.0 };
        for (id, s) in node.state().iter() {
            if node.liveness(id, now).unwrap_or(Liveness::Alive) == Liveness::Dead {
                continue;
            }
            pool.slots += s.record.slots_total as f64;
            pool.capacity_gib += s.record.capacity_bytes as f64 / (1u64 << 30) as f64;
            if s.record.addr == self.addr {
                continue;
            }
            for t in &s.record.tenants {
                let u = remote.entry(t.tenant.clone()).or_default();
                u.slot_seconds += t.slot_seconds;
                u.gib_seconds += t.gib_seconds;
            }
        }
        self.admission.set_pool_usage(remote, pool);
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
}

impl RunningWorker {
    /// Serves until the shutdown future given to [`start`] resolves; then
    /// advertises that it is leaving, stops accepting, lets running jobs
    /// finish, and stops gossiping.
    pub async fn wait(self) -> anyhow::Result<()> {
        let result = self.serve.await;
        self.gossip.abort();
        result??;
        Ok(())
    }
}

/// Binds, starts gossip and serves until `shutdown` resolves.
pub async fn start(
    config: WorkerConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<RunningWorker> {
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", config.listen))?;
    let bound = listener.local_addr()?;
    let addr = config.advertise.clone().unwrap_or_else(|| bound.to_string());
    let slots = config.runner.sandbox.slots.max(1);
    let runner = JobRunner::new(config.runner.clone())?;
    let ledger = Ledger::new(&config.ledger)?;
    let defaults = AdmissionConfig::new(slots as u32);
    let admission = Admission::new(ledger, AdmissionConfig {
        fair_share: config.fair_share,
        half_life: config.usage_half_life,
        queue_per_tenant: config.max_queued.unwrap_or(defaults.queue_per_tenant),
        ..defaults
    });
    let generation = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let gossip_config = GossipConfig {
        seeds: config.join.clone(),
        failure: crate::gossip::FailureDetectorConfig {
            initial_interval_ms: config.gossip_interval.as_millis() as u64,
            ..Default::default()
        },
        ..GossipConfig::default()
    };
    let node = GossipNode::new(NodeId::new(addr.clone(), generation), Advert::default(), gossip_config);
    let worker = Arc::new(Worker {
        addr: addr.clone(),
        runner,
        admission,
        tenants: config.tenants.clone(),
        jobs: JobTable::default(),
        gossip: SharedNode::new(node, match &config.cluster_key {
            Some(path) => Some(crate::gossip::auth::ClusterKey::load(path)?),
            None => None,
        }),
        host_id: sysinfo::System::host_name().unwrap_or_else(|_| "unknown".into()),
        jobs_run: AtomicU64::new(0),
        modules_received: AtomicU64::new(0),
        draining: std::sync::atomic::AtomicBool::new(false),
        metrics: Metrics::new(),
        warnings: Warnings::default(),
    });
    worker.check_sizing();
    worker.check_host_memory();
    let advert = worker.advert();
    worker.gossip.lock().set_record(advert);
    tracing::info!(%addr, slots, capacity = %Size(worker.admission.ledger().capacity()), "worker started");
    match &config.tenants {
        Tenants::Single(_) => tracing::info!("single-tenant mode: no --tenants file, jobs need no token"),
        Tenants::Multi(t) => tracing::info!(tenants = t.len(), fair_share = config.fair_share, "multi-tenant mode"),
    }

    let mut protocol = reqwest::header::HeaderMap::new();
    protocol.insert(PROTOCOL_HEADER, reqwest::header::HeaderValue::from_static(PROTOCOL_VERSION));
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        .default_headers(protocol)
        .build()?;
    let refresher = worker.clone();
    let gossip = tokio::spawn(run_rounds(worker.gossip.clone(), http, config.gossip_interval, move |node| {
        refresher.learn_pool_usage(node);
        refresher.check_host_memory();
        refresher.jobs.sweep();
        node.set_record(refresher.advert())
    }));

    // Each kind of request at its own size limit (limits.rs).
    let module_limit = usize::try_from(worker.runner.sandbox().config().max_module_bytes).unwrap_or(usize::MAX);
    let app = Router::new()
        .route("/", get(status_page))
        .route("/v1/modules/{hash}", put(put_module).layer(DefaultBodyLimit::max(module_limit)))
        .route(
            "/v1/jobs",
            post(super::jobs::post_job).get(super::jobs::list_jobs).layer(DefaultBodyLimit::max(limits::JOB_BODY)),
        )
        .route("/v1/jobs/{id}", get(super::jobs::get_job))
        .route(
            crate::proto::batch::BATCH_PATH,
            post(super::batch::post_batch).layer(DefaultBodyLimit::max(limits::BATCH_BODY)),
        )
        .route("/v1/gossip", post(post_gossip).layer(DefaultBodyLimit::max(limits::GOSSIP_BODY)))
        .route("/v1/peers", get(get_peers))
        .route("/metrics", get(get_metrics))
        .layer(axum::middleware::from_fn(limits::protocol))
        .with_state(worker.clone());
    // On shutdown: advertise `draining` for two gossip rounds (new jobs get
    // 503 meanwhile), then stop accepting; requests in flight — running
    // jobs — finish before `serve` returns.
    let draining = worker.clone();
    let interval = config.gossip_interval;
    let drain = async move {
        shutdown.await;
        tracing::info!("shutting down: finishing running jobs, leaving the pool");
        draining.draining.store(true, Ordering::Relaxed);
        tokio::time::sleep(2 * interval).await;
    };
    // TCP_NODELAY: a response goes out in several writes (head, then body
    // frames); with Nagle's algorithm each small write after the first
    // waits for the client's delayed ACK, 40 ms on Linux.
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("cannot set TCP_NODELAY: {e}");
        }
    });
    let serve = tokio::spawn(async move { axum::serve(listener, app).with_graceful_shutdown(drain).await });
    Ok(RunningWorker { addr: bound, advertised: addr, serve, gossip })
}

pub(super) fn text(status: StatusCode, message: impl Into<String>) -> Response {
    (status, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], message.into() + "\n").into_response()
}

pub(super) fn postcard_body(bytes: Vec<u8>) -> Response {
    ([(header::CONTENT_TYPE, POSTCARD)], bytes).into_response()
}

async fn put_module(
    State(w): State<Arc<Worker>>,
    Path(hash): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    if let Err(resp) = authenticate(&w, &headers) {
        return resp;
    }
    let max = w.runner.sandbox().config().max_module_bytes;
    let body = match limits::body(body, "module", max as usize) {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    let Some(hash) = ModuleHash::from_hex(&hash) else {
        return text(StatusCode::BAD_REQUEST, "the module name must be its sha256 in hex");
    };
    if body.len() as u64 > max {
        return text(StatusCode::PAYLOAD_TOO_LARGE, format!("a module may be at most {}", Size(max)));
    }
    if w.runner.has_module(&hash) {
        return StatusCode::OK.into_response();
    }
    if ModuleHash::of(&body) != hash {
        return text(StatusCode::BAD_REQUEST, "the bytes do not match the sha256 in the URL");
    }
    w.runner.add_module_hashed(hash, body.to_vec());
    w.modules_received.fetch_add(1, Ordering::Relaxed);
    StatusCode::CREATED.into_response()
}

async fn post_gossip(State(w): State<Arc<Worker>>, body: Result<Bytes, BytesRejection>) -> Response {
    use crate::gossip::transport::GossipError;
    let body = match limits::body(body, "gossip message", limits::GOSSIP_BODY) {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    match w.gossip.handle(&body) {
        Ok(reply) => postcard_body(reply),
        Err(e @ GossipError::Malformed(_)) => text(StatusCode::BAD_REQUEST, e.to_string()),
        Err(e @ GossipError::Unauthenticated(_)) => text(StatusCode::UNAUTHORIZED, e.to_string()),
    }
}

fn peer_views(w: &Worker) -> Vec<PeerView> {
    let now = w.gossip.now_ms();
    let node = w.gossip.lock();
    let mut views: Vec<PeerView> = node
        .state()
        .iter()
        .map(|(id, s)| PeerView {
            id: id.clone(),
            advert: s.record.clone(),
            liveness: node.liveness(id, now).unwrap_or(Liveness::Alive),
            last_heard_ms: node.silent_ms(id, now),
        })
        .collect();
    drop(node);
    // This worker's own line is fresh, not the last gossiped copy.
    for v in views.iter_mut().filter(|v| v.advert.addr == w.addr) {
        v.advert = w.advert();
    }
    views
}

async fn get_peers(State(w): State<Arc<Worker>>, headers: HeaderMap) -> Response {
    let views = peer_views(&w);
    let wants_postcard = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains(POSTCARD));
    if wants_postcard {
        match postcard::to_allocvec(&views) {
            Ok(b) => postcard_body(b),
            Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        }
    } else {
        match serde_json::to_vec(&views) {
            Ok(b) => ([(header::CONTENT_TYPE, "application/json")], b).into_response(),
            Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        }
    }
}

async fn get_metrics(State(w): State<Arc<Worker>>) -> Response {
    ([(header::CONTENT_TYPE, super::metrics::CONTENT_TYPE)], w.metrics_text()).into_response()
}

/// The status page (`status.html`, served from the binary) for browsers;
/// the peers table as text for `curl` and other clients.
async fn status_page(State(w): State<Arc<Worker>>, headers: HeaderMap) -> Response {
    let wants_html =
        headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|v| v.contains("text/html"));
    if wants_html {
        return ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], STATUS_PAGE).into_response();
    }
    let views = peer_views(&w);
    text(StatusCode::OK, crate::client::peers_table(&views))
}

/// The status page: plain HTML, CSS and JS that polls `GET /v1/peers`.
const STATUS_PAGE: &str = include_str!("status.html");
