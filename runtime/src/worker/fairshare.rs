//! Fair share between tenants — smartshare, done right.
//!
//! FieldTrip's smartshare rejected long jobs at random so that short ones
//! got through. Here a worker *queues* every tenant's jobs and, when a slot
//! frees, starts a job of the tenant with the lowest **dominant-resource
//! usage**: per tenant, the larger of its share of slot-seconds and its
//! share of reserved GiB-seconds, divided by its weight, decayed with a
//! half-life (HTCondor and Slurm decay over days; a lab pool wants minutes).
//!
//! Usage is counted pool-wide: each worker gossips its own per-tenant usage,
//! and ranks tenants by the sum over the pool. Time is passed in, never
//! read here, so the arithmetic is tested deterministically.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::proto::{TenantAccount, TenantUsage};

/// How long tenants' usage takes to halve by default (`--usage-half-life`).
pub const DEFAULT_HALF_LIFE: Duration = Duration::from_secs(600);

/// Decayed usage of one tenant.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Usage {
    /// Slot-seconds.
    pub slot_seconds: f64,
    /// Reserved GiB-seconds (a job's memory limit × its run time).
    pub gib_seconds: f64,
}

impl Usage {
    fn decayed(self, by: Duration, half_life: Duration) -> Usage {
        let f = 0.5f64.powf(by.as_secs_f64() / half_life.as_secs_f64().max(1e-9));
        Usage {
            slot_seconds: self.slot_seconds * f,
            gib_seconds: self.gib_seconds * f,
        }
    }

    fn plus(self, o: Usage) -> Usage {
        Usage {
            slot_seconds: self.slot_seconds + o.slot_seconds,
            gib_seconds: self.gib_seconds + o.gib_seconds,
        }
    }

    /// The usage of one job that has held `slots` and `reserved_bytes` for
    /// `time`.
    pub fn of_job(time: Duration, reserved_bytes: u64) -> Usage {
        let s = time.as_secs_f64();
        Usage {
            slot_seconds: s,
            gib_seconds: s * reserved_bytes as f64 / (1u64 << 30) as f64,
        }
    }
}

/// What one finished job used, for its tenant's account.
#[derive(Clone, Copy, Debug, Default)]
pub struct JobUsage {
    /// CPU time.
    pub cpu: Duration,
    /// How long it held its slot (compiling and starting included).
    pub held: Duration,
    /// Its run's wall time.
    pub wall: Duration,
    /// Its reservation (memory limit).
    pub reserved_bytes: u64,
    /// Its peak linear memory.
    pub peak_bytes: u64,
}

/// The pool the shares are taken of.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PoolSize {
    /// Σ slots.
    pub slots: f64,
    /// Σ capacity, in GiB.
    pub capacity_gib: f64,
}

/// Per-tenant usage on this worker, plus the rest of the pool's as last
/// gossiped, and the rent-like accounts.
pub struct FairShare {
    half_life: Duration,
    own: HashMap<String, (Usage, Instant)>,
    remote: HashMap<String, Usage>,
    pool: PoolSize,
    accounts: HashMap<String, TenantAccount>,
}

impl FairShare {
    /// Usage halves every `half_life`; shares are of `pool` until the
    /// gossip says otherwise.
    pub fn new(half_life: Duration, pool: PoolSize) -> FairShare {
        FairShare {
            half_life,
            own: HashMap::new(),
            remote: HashMap::new(),
            pool,
            accounts: HashMap::new(),
        }
    }

    /// Adds a finished (or a running job's accrued) usage.
    pub fn record(&mut self, tenant: &str, usage: Usage, now: Instant) {
        let half_life = self.half_life;
        let entry = self
            .own
            .entry(tenant.to_string())
            .or_insert((Usage::default(), now));
        let since = now.saturating_duration_since(entry.1);
        *entry = (entry.0.decayed(since, half_life).plus(usage), now);
    }

    /// Adds one finished job to its tenant's account: slot and reserved
    /// memory for as long as it held them, used memory as peak × run time.
    pub fn account(&mut self, tenant: &str, job: &JobUsage) {
        let a = self.accounts.entry(tenant.to_string()).or_default();
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        a.jobs += 1;
        a.cpu_seconds += job.cpu.as_secs_f64();
        a.slot_seconds += job.held.as_secs_f64();
        a.reserved_gib_seconds += gib(job.reserved_bytes) * job.held.as_secs_f64();
        a.used_gib_seconds += gib(job.peak_bytes) * job.wall.as_secs_f64();
    }

    /// The rest of the pool: Σ usage other workers gossiped, and the pool's
    /// size (this worker included).
    pub fn set_remote(&mut self, remote: HashMap<String, Usage>, pool: PoolSize) {
        self.remote = remote;
        if pool.slots > 0.0 && pool.capacity_gib > 0.0 {
            self.pool = pool;
        }
    }

    /// This worker's usage of `tenant` at `now`, plus `running` (what its
    /// running jobs have accrued).
    pub fn own_usage(&self, tenant: &str, running: Usage, now: Instant) -> Usage {
        let own = self
            .own
            .get(tenant)
            .map(|(u, at)| u.decayed(now.saturating_duration_since(*at), self.half_life))
            .unwrap_or_default();
        own.plus(running)
    }

    /// The tenant's dominant share of the pool, divided by its weight:
    /// lower goes first.
    pub fn share(&self, tenant: &str, weight: f64, running: Usage, now: Instant) -> f64 {
        let u = self
            .own_usage(tenant, running, now)
            .plus(self.remote.get(tenant).copied().unwrap_or_default());
        let slots = u.slot_seconds / self.pool.slots.max(1e-9);
        let memory = u.gib_seconds / self.pool.capacity_gib.max(1e-9);
        slots.max(memory) / weight.max(1e-9)
    }

    /// What this worker gossips: per tenant its decayed usage (running jobs'
    /// included via `running`) and its account.
    pub fn report(&self, running: &HashMap<String, Usage>, now: Instant) -> Vec<TenantUsage> {
        let mut names: Vec<&String> = self
            .own
            .keys()
            .chain(running.keys())
            .chain(self.accounts.keys())
            .collect();
        names.sort();
        names.dedup();
        names
            .into_iter()
            .map(|t| {
                let u = self.own_usage(t, running.get(t).copied().unwrap_or_default(), now);
                TenantUsage {
                    tenant: t.clone(),
                    slot_seconds: u.slot_seconds,
                    gib_seconds: u.gib_seconds,
                    account: self.accounts.get(t).cloned().unwrap_or_default(),
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POOL: PoolSize = PoolSize {
        slots: 2.0,
        capacity_gib: 8.0,
    };

    #[test]
    fn usage_decays_by_half_life_and_ranks_by_dominant_share_over_weight() {
        let t0 = Instant::now();
        let mut fs = FairShare::new(Duration::from_secs(600), POOL);
        // a: 100 slot-seconds at 1 GiB; b: 50 slot-seconds at 8 GiB.
        fs.record("a", Usage::of_job(Duration::from_secs(100), 1 << 30), t0);
        fs.record("b", Usage::of_job(Duration::from_secs(50), 8 << 30), t0);
        let none = Usage::default();
        // a: max(100/2, 100/8) = 50; b: max(50/2, 400/8) = 50.
        assert!((fs.share("a", 1.0, none, t0) - 50.0).abs() < 1e-9);
        assert!((fs.share("b", 1.0, none, t0) - 50.0).abs() < 1e-9);
        assert!(
            (fs.share("b", 2.0, none, t0) - 25.0).abs() < 1e-9,
            "weight divides"
        );
        let later = t0 + Duration::from_secs(600);
        assert!(
            (fs.share("a", 1.0, none, later) - 25.0).abs() < 1e-9,
            "halved after one half-life"
        );
        assert_eq!(fs.share("nobody", 1.0, none, t0), 0.0);
        // A running job counts.
        assert!(fs.share("nobody", 1.0, Usage::of_job(Duration::from_secs(10), 0), t0) > 0.0);
    }

    #[test]
    fn remote_usage_counts_and_reports_carry_accounts() {
        let t0 = Instant::now();
        let mut fs = FairShare::new(Duration::from_secs(600), POOL);
        let mut remote = HashMap::new();
        remote.insert(
            "b".to_string(),
            Usage {
                slot_seconds: 40.0,
                gib_seconds: 0.0,
            },
        );
        fs.set_remote(
            remote,
            PoolSize {
                slots: 4.0,
                capacity_gib: 16.0,
            },
        );
        assert!((fs.share("b", 1.0, Usage::default(), t0) - 10.0).abs() < 1e-9);
        fs.account(
            "a",
            &JobUsage {
                cpu: Duration::from_secs(1),
                held: Duration::from_secs(2),
                wall: Duration::from_secs(2),
                reserved_bytes: 1 << 30,
                peak_bytes: 1 << 29,
            },
        );
        let report = fs.report(&HashMap::new(), t0);
        assert_eq!(report.len(), 1, "only this worker's own tenants");
        assert_eq!(report[0].account.jobs, 1);
        assert!((report[0].account.used_gib_seconds - 1.0).abs() < 1e-9);
        assert!((report[0].account.reserved_gib_seconds - 2.0).abs() < 1e-9);
    }
}
