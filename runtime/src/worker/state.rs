//! [`Worker`]: what a running `peerwasm worker` holds — the runner, the
//! ledger and admission, tenants, the job table, gossip, metrics and
//! warnings — and what it derives from them: its advert, its metrics text,
//! the pool's usage for fair share, and the operator's warnings. The HTTP
//! edge (`server/`) and the job lifecycle (`jobs`) share it; it knows nothing
//! of HTTP.

use std::sync::Arc;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::admission::Admission;
use super::fairshare::{PoolSize, Usage};
use super::metrics::Metrics;
use super::table::JobTable;
use super::tenants::{Sees, Tenants};
use super::warnings::{WarningKind, Warnings};
use crate::gossip::PeerView;
use crate::gossip::transport::SharedNode;
use crate::gossip::{GossipNode, Liveness};
use crate::proto::Advert;
use crate::runner::JobRunner;
use crate::units::Bytes as Size;

/// What a running worker holds, shared by every request and by gossip.
pub struct Worker {
    pub(crate) addr: String,
    /// How this worker reaches its peers (gossip, the jobs of maps it
    /// owns): TLS with the pool's CA, or plain HTTP.
    pub(crate) transport: crate::net::Transport,
    pub(crate) runner: JobRunner,
    pub(crate) admission: Arc<Admission>,
    pub(crate) tenants: Tenants,
    pub(crate) jobs: JobTable,
    pub(crate) gossip: Arc<SharedNode<Advert>>,
    pub(crate) host_id: String,
    pub(crate) jobs_run: AtomicU64,
    pub(crate) modules_received: AtomicU64,
    /// Which tenants proved they have each module (by uploading it).
    pub(crate) uploaders: super::uploaders::Uploaders,
    /// Bytes of detached results one tenant may hold (`--max-results`).
    pub(crate) max_results: u64,
    /// Bytes of submissions one tenant may keep (`--max-stored`).
    pub(crate) max_stored: u64,
    /// What requests make the worker hold, charged to who sent them.
    pub(crate) budgets: Arc<super::budget::RequestBudgets>,
    /// Files of shipped trees (`--file-store`).
    pub(crate) files: Arc<super::filestore::FileStore>,
    /// The most bytes of files a job sends back (`--max-files-back`).
    pub(crate) max_files_back: u64,
    pub(crate) draining: AtomicBool,
    /// Connections closed because `--max-connections` were open.
    pub(crate) connections_refused: Arc<AtomicU64>,
    pub(crate) metrics: Metrics,
    pub(crate) warnings: Warnings,
    /// The jobs it ran.
    pub(crate) history: super::history::History,
    /// The state database (`--state-dir`): history, detached jobs, and
    /// the submissions its owner keeps (`crate::owner`).
    pub(crate) db: Arc<super::statedb::StateDb>,
    /// What each tenant's streamed jobs may hold of output their clients
    /// have not read (`server::stream`).
    pub(crate) unsent_output: super::ledger::Shares,
    /// How long a stream may take nothing before it is dropped
    /// (`--unread-grace`).
    pub(crate) unread_grace: std::time::Duration,
    /// The maps that report their backlog here (gossiped in the advert).
    pub(crate) backlogs: super::backlogs::Backlogs,
    /// Detached maps its owner runs now (set by the gossip rounds).
    pub(crate) owned_maps: std::sync::atomic::AtomicU32,
    /// The batch-system job it runs in, and when that ends it.
    pub(crate) lifetime: super::lifetime::Lifetime,
    /// Each tenant's compile turns (`compile_charge::compile_turns_per_tenant`).
    pub(crate) compile_turns:
        parking_lot::Mutex<std::collections::HashMap<String, Arc<tokio::sync::Semaphore>>>,
}

impl Worker {
    /// This worker's advert as it gossips it: without a cluster key, with
    /// `--tenants`, tenants go by pseudonyms (`Tenants::pseudonyms`), since
    /// anyone who reaches the port may ask for it.
    pub(crate) fn gossip_advert(&self) -> Advert {
        let mut advert = self.advert();
        if !self.gossip.is_keyed()
            && let Some(pseudonyms) = self.tenants.pseudonyms()
        {
            for t in &mut advert.tenants {
                if let Some(p) = pseudonyms.get(&t.tenant) {
                    t.tenant = p.clone();
                }
            }
        }
        advert
    }

    /// This worker's advert, fresh.
    pub(crate) fn advert(&self) -> Advert {
        let snap = self.admission.ledger().snapshot();
        let view = self.admission.view();
        let (busy, queued) = (view.busy, view.queued);
        Advert {
            addr: self.addr.clone(),
            host_id: self.host_id.clone(),
            capacity_bytes: snap.capacity,
            reserved_bytes: snap.reserved,
            reserved_high_water_bytes: snap.reserved_high_water,
            used_bytes: snap.used,
            host_available_bytes: snap.host_available,
            largest_fit_bytes: if busy >= self.admission.slots() {
                0
            } else {
                snap.offer.min(self.admission.largest_job())
            },
            max_job_bytes: Some(self.admission.largest_job()).filter(|&most| most < snap.capacity),
            slots_total: self.admission.slots(),
            slots_busy: busy,
            queue_len: queued,
            jobs_run: self.jobs_run.load(Ordering::Relaxed),
            modules_received: self.modules_received.load(Ordering::Relaxed),
            draining: self.draining.load(Ordering::Relaxed),
            max_job_time_ms: self
                .runner
                .sandbox()
                .config()
                .max_job_time
                .map(|d| d.as_millis() as u64),
            gossip_keyed: self.gossip.is_keyed(),
            multi_tenant: self.tenants.is_multi(),
            tenants: view.tenants,
            warnings: self.warnings.current(),
            backlog: self.backlogs.current(),
            owned_maps: self.owned_maps.load(Ordering::Relaxed),
            batch_job: self.lifetime.batch_job.clone(),
            ends_at_ms: self.lifetime.ends_at_ms(),
            idle_ms: match self.owned_maps.load(Ordering::Relaxed) {
                0 => view
                    .idle_for
                    .map(|d| d.as_millis().min(u128::from(u64::MAX)) as u64),
                _ => None,
            },
        }
    }

    /// Raises the warnings that depend on how memory was sized.
    pub(crate) fn check_sizing(&self) {
        let ledger = self.admission.ledger();
        let sizing = ledger.sizing();
        if let (Some(cgroup), Some(memory)) = (sizing.cgroup, sizing.requested)
            && cgroup < memory
        {
            self.warnings.condition(
                WarningKind::CgroupBelowMemory,
                Some(format!(
                    "the cgroup's memory limit {} is lower than --memory {}: jobs get at most {}",
                    Size(cgroup),
                    Size(memory),
                    Size(ledger.largest_job())
                )),
            );
        }
        let physical_less_reserve = sizing.physical.saturating_sub(ledger.reserve());
        if let Some(memory) = sizing.requested
            && memory > physical_less_reserve
        {
            self.warnings.condition(
                WarningKind::MemoryAbovePhysical,
                Some(format!("--memory {} is more than physical memory less --reserve ({}): jobs get at most {}", Size(memory), Size(physical_less_reserve), Size(ledger.largest_job()))),
            );
        }
    }

    /// Raises (or ends) the host-memory-low warning.
    pub(crate) fn check_host_memory(&self) {
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
    pub(crate) fn metrics_text(&self) -> String {
        let advert = self.advert();
        let queued = self.admission.queued_by_tenant();
        let g = &self.gossip.stats;
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let now = self.gossip.now_ms();
        let (peers, dropped): (Vec<Liveness>, u64) = {
            let node = self.gossip.lock();
            let peers = node
                .state()
                .iter()
                .map(|(id, _)| node.liveness(id, now).unwrap_or(Liveness::Alive))
                .collect();
            (peers, node.dropped())
        };
        let warnings: Vec<(&'static str, u64)> = self
            .warnings
            .counts()
            .into_iter()
            .map(|(k, n)| (k.label(), n))
            .collect();
        self.metrics.render(&super::metrics::Scrape {
            advert: &advert,
            queued: &queued,
            cache: self.runner.sandbox().cache_stats(),
            module_bytes: self.runner.module_bytes_held(),
            held_by: self.admission.ledger().snapshot().held_by,
            gossip: super::metrics::GossipCounts {
                rounds: load(&g.rounds),
                exchanges_ok: load(&g.exchanges_ok),
                exchanges_failed: load(&g.exchanges_failed),
                bytes_sent: load(&g.bytes_sent),
                bytes_received: load(&g.bytes_received),
                rejected: load(&g.rejected) + dropped,
                forged: load(&g.forged),
            },
            peers: &peers,
            warnings: &warnings,
            connections_refused: self.connections_refused.load(Ordering::Relaxed),
            files: {
                let (received, received_bytes) = self.files.received();
                super::metrics::FileStoreCounts {
                    received,
                    received_bytes,
                    held: self.files.held(),
                }
            },
            slot_process_jobs: self.runner.slot_process_jobs(),
            backlog: &self.pool_backlog(),
        })
    }

    /// The pool's demand: the backlog reports of every live worker in
    /// this worker's view (its own included), each map once.
    pub(crate) fn pool_backlog(&self) -> crate::proto::backlog::PoolBacklog {
        let views = self.peer_views(&Sees::All);
        crate::proto::backlog::PoolBacklog::sum(
            views
                .iter()
                .filter(|v| v.liveness == Liveness::Alive)
                .flat_map(|v| v.advert.backlog.iter()),
        )
    }

    /// Hands the rest of the pool's per-tenant usage to fair share, so
    /// tenants are ranked by what they use across the pool.
    pub(crate) fn learn_pool_usage(&self, node: &GossipNode<Advert>) {
        let now = self.gossip.now_ms();
        let names = self.tenants.names();
        let mut remote: std::collections::HashMap<String, Usage> = Default::default();
        let mut pool = PoolSize {
            slots: 0.0,
            capacity_gib: 0.0,
        };
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
                let name = names.get(&t.tenant).unwrap_or(&t.tenant);
                let u = remote.entry(name.clone()).or_default();
                u.slot_seconds += t.slot_seconds;
                u.gib_seconds += t.gib_seconds;
            }
        }
        self.admission.set_pool_usage(remote, pool);
    }

    /// The pool as this worker sees it, its own line fresh, showing only
    /// the tenants' usage the caller `sees`.
    pub(crate) fn peer_views(&self, sees: &Sees) -> Vec<PeerView> {
        let now = self.gossip.now_ms();
        let node = self.gossip.lock();
        // Sealed gossip is the only way into a keyed node's state: it
        // vouches for every record; an unkeyed one for itself alone.
        let keyed = self.gossip.is_keyed();
        let mut views: Vec<PeerView> = node
            .state()
            .iter()
            .map(|(id, s)| PeerView {
                id: id.clone(),
                advert: s.record.clone(),
                liveness: node.liveness(id, now).unwrap_or(Liveness::Alive),
                last_heard_ms: node.silent_ms(id, now),
                vouched: keyed || s.record.addr == self.addr,
            })
            .collect();
        drop(node);
        for v in views.iter_mut().filter(|v| v.advert.addr == self.addr) {
            v.advert = self.advert();
        }
        // A worker that drains has left the pool: it takes no job, and its
        // running ones end with their own requests.
        views.retain(|v| !v.advert.draining);
        let names = self.tenants.names();
        for v in &mut views {
            for t in &mut v.advert.tenants {
                if let Some(name) = names.get(&t.tenant) {
                    t.tenant = name.clone();
                }
            }
            v.advert.tenants.retain(|t| sees.may_see(&t.tenant));
        }
        views
    }
}
