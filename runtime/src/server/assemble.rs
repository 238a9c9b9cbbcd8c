//! A worker assembled from its [`WorkerConfig`] with no socket: its core
//! (the job path, its place in the pool, what requests may hold), the owner
//! of its detached maps, and its router — what `start` serves on a socket
//! and `server::memory` in memory — and its share of the host's ledger.

use std::sync::Arc;
use std::time::Duration;

use super::config::WorkerConfig;
use super::router::router;
use crate::gossip::transport::SharedNode;
use crate::gossip::{GossipConfig, GossipNode, NodeId};
use crate::owner::Owner;
use crate::proto::Advert;
use crate::runner::JobRunner;
use crate::worker::admission::{Admission, AdmissionConfig};
use crate::worker::job_path::{JobPath, Kept};
use crate::worker::ledger::Ledger;
use crate::worker::state::{Node, Requests, Worker};

/// How often a worker refreshes its record in the host's ledger.
pub const HOST_LEDGER_REFRESH: Duration = Duration::from_millis(250);

/// A worker's parts, built and wired, serving nothing yet: its core, the
/// owner of its detached maps, and its router. What [`start`] serves on a
/// socket, and `server::memory` in memory.
pub(super) struct Assembled {
    pub worker: Arc<Worker>,
    pub owner: Arc<Owner>,
    pub app: axum::Router,
}

/// Builds the worker `config` describes, known to others as `addr`, and
/// reaching them over `transport` (else the one its TLS settings say), its
/// owner and its router; raises the sizing warnings and puts its first
/// advert in its gossip record. Opens no socket.
pub(super) fn assemble(
    config: &WorkerConfig,
    addr: &str,
    transport: Option<crate::net::Transport>,
) -> anyhow::Result<Assembled> {
    let worker = build_worker(config, addr, transport)?;
    let owner = crate::owner::Owner::new(worker.jobs.clone(), worker.node.transport.clone());
    worker.check_sizing();
    worker.check_host_memory();
    let advert = worker.gossip_advert();
    worker.node.gossip.lock().set_record(advert);
    let app = router(worker.clone(), owner.clone(), config.members.clone());
    Ok(Assembled { worker, owner, app })
}

/// The worker's core as `config` describes it, known to others as `addr`:
/// its runner, ledger (joined to the host's), admission, gossip node, file
/// store and state database.
fn build_worker(
    config: &WorkerConfig,
    addr: &str,
    transport: Option<crate::net::Transport>,
) -> anyhow::Result<Arc<Worker>> {
    let slots = config.runner.sandbox.slots.max(1);
    let runner = JobRunner::new(config.runner.clone())?;
    let ledger = Ledger::new(&config.ledger)?;
    if let Some(path) = &config.host_ledger {
        join_host_ledger(&ledger, path, addr);
    }
    let budgets =
        crate::worker::budget::RequestBudgets::new(ledger.clone(), config.max_request_bytes);
    let defaults = AdmissionConfig::new(slots as u32);
    let capacity = ledger.capacity();
    let admission = Admission::new(
        ledger,
        AdmissionConfig {
            fair_share: config.fair_share,
            half_life: config.usage_half_life,
            hold_after: config.hold_after,
            queue_per_tenant: config.max_queued.unwrap_or(defaults.queue_per_tenant),
            queue_bytes_per_tenant: config.max_queued_bytes,
            max_job_memory: config.runner.sandbox.max_job_memory,
            ..defaults
        },
    );
    let files = Arc::new(crate::worker::filestore::FileStore::new(
        config.runner.sandbox.scratch_root.as_deref(),
        config.file_store_bytes,
        runner.sandbox().scratch_pool(),
        config.tenants.is_multi(),
    )?);
    let db = Arc::new(match &config.state_dir {
        Some(dir) => crate::worker::statedb::StateDb::open(dir)?,
        None => crate::worker::statedb::StateDb::temporary(None)?,
    });
    let kept = Kept {
        history: crate::worker::history::History::new(db.clone(), config.history_keep),
        db: db.clone(),
        max_results: config.max_results,
        max_stored: config.max_stored,
    };
    let jobs = JobPath::new(
        addr,
        runner,
        admission,
        config.tenants.clone(),
        files,
        crate::worker::uploaders::Uploaders::load(db)?,
        kept,
        config.lifetime.clone(),
        config.max_files_back,
    );
    let key = gossip_key(config)?;
    let transport = match (transport, &config.tls) {
        (Some(given), _) => given,
        (None, Some(tls)) => tls.transport()?,
        (None, None) => crate::net::Transport::new(None, config.insecure_http)?,
    };
    let jobs = Arc::new(jobs);
    jobs.start_warm_charge();
    Ok(Arc::new(Worker {
        jobs,
        node: Node {
            transport,
            gossip: SharedNode::new(gossip_node(config, addr), key),
            host_id: sysinfo::System::host_name().unwrap_or_else(|_| "unknown".into()),
            backlogs: Default::default(),
            owned_maps: Default::default(),
        },
        requests: Requests {
            budgets,
            unsent_output: crate::worker::ledger::Shares::new(unsent_share(capacity)),
            unread_grace: config.unread_grace,
            connections_refused: Default::default(),
        },
    }))
}

/// What one tenant's streamed jobs may hold of output their clients have
/// not read: a quarter of the worker's memory (at least 16 MiB), so that a
/// tenant who stops reading leaves three quarters to the others.
fn unsent_share(capacity: u64) -> u64 {
    (capacity / 4).max(16 << 20)
}

/// The key this worker's gossip is sealed with: `--cluster-key`; else, on
/// loopback, this user's own pool key (`pool.key` in the user's private
/// runtime dir, made on first use), so that the loopback workers of one
/// user hear each other and another user of the machine — who cannot read
/// it — can neither join their pool nor read it; none only with
/// `--insecure-gossip`.
fn gossip_key(config: &WorkerConfig) -> anyhow::Result<Option<crate::gossip::auth::ClusterKey>> {
    use crate::gossip::auth::ClusterKey;
    if let Some(path) = &config.cluster_key {
        return ClusterKey::load(path).map(Some);
    }
    if config.insecure_gossip {
        return Ok(None);
    }
    let key = crate::private_path::user_runtime_dir()
        .and_then(|dir| crate::private_path::private_secret(&dir.join("pool.key"), "this user's pool key", 32))
        .and_then(ClusterKey::new)
        .map_err(|e| anyhow::anyhow!("{e:#}: gossip needs a key that only this user's workers know; give --cluster-key FILE"))?;
    Ok(Some(key))
}

/// This worker's gossip node: a new generation (the start time), seeded
/// with `--join`, its failure detector tuned to the gossip interval.
fn gossip_node(config: &WorkerConfig, addr: &str) -> GossipNode<Advert> {
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
    GossipNode::new(
        NodeId::new(addr, generation),
        Advert::default(),
        gossip_config,
    )
    .with_check(Advert::check)
}

/// Joins the host's ledger at `path` (see `worker::hostledger`), or says
/// loudly why it cannot and goes on deciding alone. Its figures are
/// published every [`HOST_LEDGER_REFRESH`] (its jobs touch their memory as
/// they run) and at once when a reservation ends.
fn join_host_ledger(ledger: &Arc<Ledger>, path: &std::path::Path, addr: &str) {
    let domain = match crate::worker::cgroup::binding_limit() {
        Some((_, dir)) => format!("cgroup:{}", dir.display()),
        None => "host".to_string(),
    };
    match crate::worker::hostledger::HostLedger::open(path, domain, ledger.sizing().physical) {
        Ok(host) => {
            tracing::info!(path = %path.display(), domain = host.domain(), "sharing the host's memory ledger with its other workers");
            ledger.join_host(host, addr);
            let ledger = Arc::downgrade(ledger);
            tokio::spawn(async move {
                let mut every = tokio::time::interval(HOST_LEDGER_REFRESH);
                loop {
                    every.tick().await;
                    let Some(ledger) = ledger.upgrade() else {
                        return;
                    };
                    tokio::task::block_in_place(|| ledger.publish());
                }
            });
        }
        Err(e) => tracing::error!(
            path = %path.display(),
            "cannot use the host's memory ledger ({e:#}): this worker decides alone, and with other workers on this \
             machine the host can be over-committed. Give --host-ledger a path that is this user's alone"
        ),
    }
}
