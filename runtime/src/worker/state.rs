//! [`Worker`]: what a running `peerwasm worker` holds, as three handles —
//! its job path ([`JobPath`]: runner, admission, tenants, the job table,
//! what tenants keep), its place in the pool ([`Node`]: transport, gossip,
//! backlogs) and what requests may make it hold ([`Requests`]) — and what
//! it derives from them: its advert, its metrics text, the pool's usage
//! for fair share, and the operator's warnings. The HTTP edge (`server/`)
//! holds the whole; the job's life (`jobs`), the detached jobs and the
//! owner take only the job path. It knows nothing of HTTP.

use std::sync::Arc;

use std::sync::atomic::{AtomicU64, Ordering};

use super::fairshare::{PoolSize, Usage};
use super::job_path::JobPath;
use super::tenants::Sees;
use super::warnings::WarningKind;
use crate::gossip::PeerView;
use crate::gossip::transport::SharedNode;
use crate::gossip::{GossipNode, Liveness};
use crate::proto::Advert;
use crate::units::Bytes as Size;

/// What a running worker holds, shared by every request and by gossip:
/// its job path, its place in the pool, and what requests may make it hold.
pub struct Worker {
    /// What a job needs, from its checks to its result.
    pub(crate) jobs: Arc<JobPath>,
    /// The worker as a member of the pool.
    pub(crate) node: Node,
    /// What requests may make it hold, and how long a reader may stall.
    pub(crate) requests: Requests,
}

/// A worker as a member of the pool: how it reaches its peers, its gossip,
/// and what it tells them beyond its jobs.
pub struct Node {
    /// How this worker reaches its peers (gossip, the jobs of maps it
    /// owns): TLS with the pool's CA, or plain HTTP.
    pub(crate) transport: crate::net::Transport,
    pub(crate) gossip: Arc<SharedNode<Advert>>,
    /// The machine's name, in the advert.
    pub(crate) host_id: String,
    /// The maps that report their backlog here (gossiped in the advert).
    pub(crate) backlogs: super::backlogs::Backlogs,
    /// Detached maps its owner runs now (set by the gossip rounds).
    pub(crate) owned_maps: std::sync::atomic::AtomicU32,
}

/// What requests may make a worker hold, charged to who sent them.
pub struct Requests {
    /// Bodies, waiting specs and manifests, per payer.
    pub(crate) budgets: Arc<super::budget::RequestBudgets>,
    /// What each tenant's streamed jobs may hold of output their clients
    /// have not read (`server::stream`).
    pub(crate) unsent_output: super::ledger::Shares,
    /// How long a stream may take nothing before it is dropped
    /// (`--unread-grace`).
    pub(crate) unread_grace: std::time::Duration,
    /// Connections closed because `--max-connections` were open.
    pub(crate) connections_refused: Arc<AtomicU64>,
}

impl Worker {
    /// This worker's advert as it gossips it: without a cluster key, with
    /// `--tenants`, tenants go by pseudonyms (`Tenants::pseudonyms`), since
    /// anyone who reaches the port may ask for it.
    pub(crate) fn gossip_advert(&self) -> Advert {
        let mut advert = self.advert();
        if !self.node.gossip.is_keyed()
            && let Some(pseudonyms) = self.jobs.tenants.pseudonyms()
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
        let (jobs, node) = (&self.jobs, &self.node);
        let snap = jobs.admission.ledger().snapshot();
        let view = jobs.admission.view();
        let (busy, queued) = (view.busy, view.queued);
        // What warm starts keep is let go for a job that needs it
        // (`warm_charge`): the largest job stays the worker's, and the
        // advert says how much of it warm starts hold now, so that a
        // learning map's first jobs (which ask the largest job beside it)
        // start warm, and a larger job is still sent here.
        let largest = jobs.admission.largest_job();
        let warm = snap.held_of(crate::worker::HoldKind::Warm);
        Advert {
            addr: jobs.addr.clone(),
            host_id: node.host_id.clone(),
            capacity_bytes: snap.capacity,
            reserved_bytes: snap.reserved,
            reserved_high_water_bytes: snap.reserved_high_water,
            used_bytes: snap.used,
            host_available_bytes: snap.host_available,
            largest_fit_bytes: if busy >= jobs.admission.slots() {
                0
            } else {
                snap.offer.min(largest.saturating_sub(warm))
            },
            max_job_bytes: Some(largest).filter(|&most| most < snap.capacity),
            warm_bytes: warm.min(snap.capacity),
            slots_total: jobs.admission.slots(),
            slots_busy: busy,
            queue_len: queued,
            jobs_run: jobs.jobs_run.load(Ordering::Relaxed),
            modules_received: jobs.modules_received.load(Ordering::Relaxed),
            draining: jobs.gate.draining(),
            max_job_time_ms: jobs
                .runner
                .sandbox()
                .config()
                .max_job_time
                .map(|d| d.as_millis() as u64),
            gossip_keyed: node.gossip.is_keyed(),
            multi_tenant: jobs.tenants.is_multi(),
            tenants: view.tenants,
            warnings: jobs.warnings.current(),
            backlog: node.backlogs.current(),
            owned_maps: node.owned_maps.load(Ordering::Relaxed),
            batch_job: jobs.gate.lifetime.batch_job.clone(),
            ends_at_ms: jobs.gate.lifetime.ends_at_ms(),
            idle_ms: match node.owned_maps.load(Ordering::Relaxed) {
                0 => view
                    .idle_for
                    .map(|d| d.as_millis().min(u128::from(u64::MAX)) as u64),
                _ => None,
            },
        }
    }

    /// Raises the warnings that depend on how memory was sized.
    pub(crate) fn check_sizing(&self) {
        let ledger = self.jobs.admission.ledger();
        let sizing = ledger.sizing();
        if let (Some(cgroup), Some(memory)) = (sizing.cgroup, sizing.requested)
            && cgroup.saturating_sub(sizing.overhead) < memory
        {
            self.jobs.warnings.condition(
                WarningKind::CgroupBelowMemory,
                Some(format!(
                    "the cgroup's memory limit {} less --overhead {} is lower than --memory {}: jobs get at most {}",
                    Size(cgroup),
                    Size(sizing.overhead),
                    Size(memory),
                    Size(ledger.largest_job())
                )),
            );
        }
        let physical_less_reserve = sizing.physical.saturating_sub(ledger.reserve());
        if let Some(memory) = sizing.requested
            && memory > physical_less_reserve
        {
            self.jobs.warnings.condition(
                WarningKind::MemoryAbovePhysical,
                Some(format!("--memory {} is more than physical memory less --reserve ({}): jobs get at most {}", Size(memory), Size(physical_less_reserve), Size(ledger.largest_job()))),
            );
        }
    }

    /// Raises (or ends) the host-memory-low warning.
    pub(crate) fn check_host_memory(&self) {
        let snap = self.jobs.admission.ledger().snapshot();
        let reserve = self.jobs.admission.ledger().reserve();
        let low = (snap.host_available < reserve).then(|| {
            format!(
                "host available memory {} is below the reserve of {}: no job can start until it frees up",
                Size(snap.host_available),
                Size(reserve)
            )
        });
        self.jobs
            .warnings
            .condition(WarningKind::HostMemoryLow, low);
    }

    /// The `/metrics` text.
    pub(crate) fn metrics_text(&self) -> String {
        let (jobs, node) = (&self.jobs, &self.node);
        let advert = self.advert();
        let queued = jobs.admission.queued_by_tenant();
        let g = &node.gossip.stats;
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let now = node.gossip.now_ms();
        let (peers, dropped): (Vec<Liveness>, u64) = {
            let gossip = node.gossip.lock();
            let peers = gossip
                .state()
                .iter()
                .map(|(id, _)| gossip.liveness(id, now).unwrap_or(Liveness::Alive))
                .collect();
            (peers, gossip.dropped())
        };
        let warnings: Vec<(&'static str, u64)> = jobs
            .warnings
            .counts()
            .into_iter()
            .map(|(k, n)| (k.label(), n))
            .collect();
        jobs.metrics.render(&super::metrics::Scrape {
            advert: &advert,
            queued: &queued,
            cache: jobs.runner.sandbox().cache_stats(),
            module_bytes: jobs.runner.module_bytes_held(),
            held_by: jobs.admission.ledger().snapshot().held_by,
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
            connections_refused: self.requests.connections_refused.load(Ordering::Relaxed),
            files: {
                let (received, received_bytes) = jobs.files.received();
                super::metrics::FileStoreCounts {
                    received,
                    received_bytes,
                    held: jobs.files.held(),
                }
            },
            slot_process_jobs: jobs.runner.slot_process_jobs(),
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
        let now = self.node.gossip.now_ms();
        let names = self.jobs.tenants.names();
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
            if s.record.addr == self.jobs.addr {
                continue;
            }
            for t in &s.record.tenants {
                let name = names.get(&t.tenant).unwrap_or(&t.tenant);
                let u = remote.entry(name.clone()).or_default();
                u.slot_seconds += t.slot_seconds;
                u.gib_seconds += t.gib_seconds;
            }
        }
        self.jobs.admission.set_pool_usage(remote, pool);
    }

    /// The pool as this worker sees it, its own line fresh, showing only
    /// the tenants' usage the caller `sees`.
    pub(crate) fn peer_views(&self, sees: &Sees) -> Vec<PeerView> {
        let now = self.node.gossip.now_ms();
        let node = self.node.gossip.lock();
        // Sealed gossip is the only way into a keyed node's state: it
        // vouches for every record; an unkeyed one for itself alone.
        let keyed = self.node.gossip.is_keyed();
        let mut views: Vec<PeerView> = node
            .state()
            .iter()
            .map(|(id, s)| PeerView {
                id: id.clone(),
                advert: s.record.clone(),
                liveness: node.liveness(id, now).unwrap_or(Liveness::Alive),
                last_heard_ms: node.silent_ms(id, now),
                vouched: keyed || s.record.addr == self.jobs.addr,
            })
            .collect();
        drop(node);
        for v in views.iter_mut().filter(|v| v.advert.addr == self.jobs.addr) {
            v.advert = self.advert();
        }
        // A worker that drains has left the pool: it takes no job, and its
        // running ones end with their own requests.
        views.retain(|v| !v.advert.draining);
        let names = self.jobs.tenants.names();
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
