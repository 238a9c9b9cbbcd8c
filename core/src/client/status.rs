//! [`PoolStatus`]: the pool on one screen — workers up, suspect and dead,
//! slots, memory, queues, and each tenant's usage and account summed over
//! the pool (`peerwasm status`).

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use crate::gossip::Liveness;
use crate::gossip::PeerView;
use crate::proto::TenantAccount;
use crate::units::Bytes;

/// A summary of the pool.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PoolStatus {
    /// Workers alive, suspected, dead.
    pub workers_up: u32,
    pub workers_suspect: u32,
    pub workers_dead: u32,
    /// Slots of live workers: busy and total.
    pub slots_busy: u32,
    pub slots_total: u32,
    /// Memory of live workers: reserved by jobs, in use by jobs, capacity.
    pub reserved_bytes: u64,
    pub used_bytes: u64,
    pub capacity_bytes: u64,
    /// Jobs waiting on live workers.
    pub queued: u32,
    /// Per tenant, over all workers the view knows (dead ones' accounts too).
    pub tenants: BTreeMap<String, TenantStatus>,
    /// Warnings of live workers, each prefixed by its address.
    pub warnings: Vec<String>,
    /// The pool's demand: what its maps still have to run.
    pub backlog: crate::proto::backlog::PoolBacklog,
}

/// One tenant over the pool.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TenantStatus {
    /// Decayed usage (what fair share ranks by), slot-seconds and GiB-seconds.
    pub usage_slot_seconds: f64,
    pub usage_gib_seconds: f64,
    /// Cumulative account.
    pub account: TenantAccount,
}

impl PoolStatus {
    /// Sums a pool view.
    pub fn from_view(view: &[PeerView]) -> PoolStatus {
        let mut s = PoolStatus::default();
        for p in view {
            let a = &p.advert;
            match p.liveness {
                Liveness::Alive => s.workers_up += 1,
                Liveness::Suspect => s.workers_suspect += 1,
                Liveness::Dead => s.workers_dead += 1,
            }
            if p.liveness != Liveness::Dead {
                s.slots_busy += a.slots_busy;
                s.slots_total += a.slots_total;
                s.reserved_bytes += a.reserved_bytes;
                s.used_bytes += a.used_bytes;
                s.capacity_bytes += a.capacity_bytes;
                s.queued += a.queue_len;
                s.warnings
                    .extend(a.warnings.iter().map(|w| format!("{}: {w}", a.addr)));
            }
            for t in &a.tenants {
                let e = s.tenants.entry(t.tenant.clone()).or_default();
                if p.liveness != Liveness::Dead {
                    e.usage_slot_seconds += t.slot_seconds;
                    e.usage_gib_seconds += t.gib_seconds;
                }
                e.account.add(&t.account);
            }
        }
        s.backlog = crate::proto::backlog::PoolBacklog::sum(
            view.iter()
                .filter(|p| p.liveness == Liveness::Alive)
                .flat_map(|p| p.advert.backlog.iter()),
        );
        s
    }
}

impl fmt::Display for PoolStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "workers: {} up, {} suspect, {} dead · slots {}/{} busy · memory {} reserved ({} in use) of {} · {} queued",
            self.workers_up,
            self.workers_suspect,
            self.workers_dead,
            self.slots_busy,
            self.slots_total,
            Bytes(self.reserved_bytes),
            Bytes(self.used_bytes),
            Bytes(self.capacity_bytes),
            self.queued
        )?;
        writeln!(f, "{}", self.backlog)?;
        for w in &self.warnings {
            writeln!(f, "warning: {w}")?;
        }
        if self.tenants.is_empty() {
            return write!(f, "no jobs have run yet");
        }
        let mut rows = vec![
            [
                "TENANT",
                "JOBS",
                "CPU-S",
                "SLOT-S",
                "RESERVED GIB-S",
                "USED GIB-S",
                "USAGE (DECAYED SLOT-S)",
            ]
            .map(String::from),
        ];
        for (name, t) in &self.tenants {
            let a = &t.account;
            rows.push([
                name.clone(),
                a.jobs.to_string(),
                format!("{:.1}", a.cpu_seconds),
                format!("{:.1}", a.slot_seconds),
                format!("{:.2}", a.reserved_gib_seconds),
                format!("{:.3}", a.used_gib_seconds),
                format!("{:.1}", t.usage_slot_seconds),
            ]);
        }
        write!(f, "{}", crate::units::render_table(&rows))
    }
}
