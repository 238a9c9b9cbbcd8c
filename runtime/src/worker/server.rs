//! `peerwasm worker`: the JobRunner behind HTTP, with the ledger, admission
//! and capacity gossip.
//!
//! Endpoints (bodies in postcard unless noted):
//! * `PUT  /v1/modules/{sha256}` — module bytes; the hash is verified;
//! * `POST /v1/jobs` — a `JobSpec`; answered with the `JobResult` when done,
//!   or 404 (module unknown: upload it), 422 (can never fit here; header
//!   `peerwasm-largest-job`), 503 (queue full; `Retry-After`), 400 (bad bytes);
//! * `POST /v1/gossip` — anti-entropy (see `gossip::transport`);
//! * `GET  /v1/peers` — the pool as this worker sees it, JSON (or postcard
//!   with `Accept: application/x-postcard`);
//! * `GET  /` — a one-screen text summary.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::Router;

use super::admission::{Admission, Refusal};
use super::ledger::{Ledger, LedgerConfig};
use super::runner::{JobRunner, RunnerConfig};
use crate::gossip::transport::{SharedNode, run_rounds};
use crate::gossip::{GossipConfig, GossipNode, Liveness, NodeId};
use crate::proto::{Advert, JobSpec, LARGEST_JOB_HEADER, ModuleHash, POSTCARD, PeerView};
use crate::sandbox::RunHooks;
use crate::units::Bytes as Size;

/// The most a job request body may be (spec + stdin).
pub const MAX_JOB_BODY: usize = 256 << 20;

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
}

struct Worker {
    addr: String,
    runner: JobRunner,
    admission: Arc<Admission>,
    gossip: Arc<SharedNode<Advert>>,
    host_id: String,
    jobs_run: AtomicU64,
    modules_received: AtomicU64,
    draining: std::sync::atomic::AtomicBool,
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
        }
    }
}

/// A bound, running worker.
pub struct RunningWorker {
    /// The address it listens on.
    pub addr: SocketAddr,
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
    let addr = listener.local_addr()?;
    let slots = config.runner.sandbox.slots.max(1);
    let runner = JobRunner::new(config.runner.clone())?;
    let ledger = Ledger::new(&config.ledger)?;
    let admission = Admission::new(ledger, slots as u32, 2 * slots as u32);
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
    let node = GossipNode::new(NodeId::new(addr.to_string(), generation), Advert::default(), gossip_config);
    let worker = Arc::new(Worker {
        addr: addr.to_string(),
        runner,
        admission,
        gossip: SharedNode::new(node),
        host_id: sysinfo::System::host_name().unwrap_or_else(|_| "unknown".into()),
        jobs_run: AtomicU64::new(0),
        modules_received: AtomicU64::new(0),
        draining: std::sync::atomic::AtomicBool::new(false),
    });
    let advert = worker.advert();
    worker.gossip.lock().set_record(advert);
    tracing::info!(%addr, slots, capacity = %Size(worker.admission.ledger().capacity()), "worker started");

    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()?;
    let refresher = worker.clone();
    let gossip = tokio::spawn(run_rounds(worker.gossip.clone(), http, config.gossip_interval, move |node| {
        node.set_record(refresher.advert())
    }));

    let app = Router::new()
        .route("/", get(status_text))
        .route("/v1/modules/{hash}", put(put_module))
        .route("/v1/jobs", post(post_job))
        .route("/v1/gossip", post(post_gossip))
        .route("/v1/peers", get(get_peers))
        .layer(DefaultBodyLimit::max(MAX_JOB_BODY))
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
    let serve = tokio::spawn(async move { axum::serve(listener, app).with_graceful_shutdown(drain).await });
    Ok(RunningWorker { addr, serve, gossip })
}

fn text(status: StatusCode, message: impl Into<String>) -> Response {
    (status, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], message.into() + "\n").into_response()
}

fn postcard_body(bytes: Vec<u8>) -> Response {
    ([(header::CONTENT_TYPE, POSTCARD)], bytes).into_response()
}

async fn put_module(State(w): State<Arc<Worker>>, Path(hash): Path<String>, body: Bytes) -> Response {
    let Some(hash) = ModuleHash::from_hex(&hash) else {
        return text(StatusCode::BAD_REQUEST, "the module name must be its sha256 in hex");
    };
    let max = w.runner.sandbox().config().max_module_bytes;
    if body.len() as u64 > max {
        return text(StatusCode::PAYLOAD_TOO_LARGE, format!("modules may be at most {}", Size(max)));
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

async fn post_job(State(w): State<Arc<Worker>>, body: Bytes) -> Response {
    let spec: JobSpec = match postcard::from_bytes(&body) {
        Ok(s) => s,
        Err(e) => return text(StatusCode::BAD_REQUEST, format!("bad job request: {e}")),
    };
    if !spec.dirs.is_empty() {
        return text(StatusCode::BAD_REQUEST, "a remote worker cannot grant host directories");
    }
    if w.draining.load(Ordering::Relaxed) {
        let mut resp = text(StatusCode::SERVICE_UNAVAILABLE, "this worker is shutting down");
        resp.headers_mut().insert(header::RETRY_AFTER, 1.into());
        return resp;
    }
    if !w.runner.has_module(&spec.module) {
        return text(StatusCode::NOT_FOUND, format!("module {} unknown: upload it first", spec.module));
    }
    let ticket = match w.admission.admit(spec.limits.memory_bytes).await {
        Ok(t) => t,
        Err(Refusal::NeverFits { requested, largest }) => {
            let mut resp = text(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("the job asks for {} but this worker can take at most {}", Size(requested), Size(largest)),
            );
            resp.headers_mut().insert(LARGEST_JOB_HEADER, largest.into());
            return resp;
        }
        Err(Refusal::Busy) => {
            let mut resp = text(StatusCode::SERVICE_UNAVAILABLE, "this worker's queue is full");
            resp.headers_mut().insert(header::RETRY_AFTER, 1.into());
            return resp;
        }
    };
    // The job runs in a task of its own that holds the ticket: if the client
    // goes away, the job still ends normally and its reservation is held
    // until then (dropping this handler must not free memory still in use).
    let runner = w.clone();
    let job = tokio::spawn(async move {
        let hooks = RunHooks { tee: None, memory_meter: Some(ticket.reservation().meter()) };
        let result = runner.runner.run_with(spec, hooks).await;
        drop(ticket);
        runner.jobs_run.fetch_add(1, Ordering::Relaxed);
        result
    });
    let mut result = match job.await {
        Ok(r) => r,
        Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, format!("the job's task failed: {e}")),
    };
    result.peer = w.addr.clone();
    match postcard::to_allocvec(&result) {
        Ok(bytes) => postcard_body(bytes),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("cannot encode the result: {e}")),
    }
}

async fn post_gossip(State(w): State<Arc<Worker>>, body: Bytes) -> Response {
    match w.gossip.handle(&body) {
        Ok(reply) => postcard_body(reply),
        Err(e) => text(StatusCode::BAD_REQUEST, e),
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

async fn status_text(State(w): State<Arc<Worker>>) -> Response {
    let views = peer_views(&w);
    text(StatusCode::OK, crate::client::peers_table(&views))
}
