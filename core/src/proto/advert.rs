//! What a worker tells the pool about itself ([`Advert`], carried by
//! gossip and read by placement) and what it tells about its tenants'
//! usage ([`TenantUsage`], [`TenantAccount`]).

use serde::{Deserialize, Serialize};

/// What a worker advertises about itself over gossip: the record each node
/// publishes, and what placement reads.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Advert {
    /// Where clients and peers reach the worker (`host:port`).
    pub addr: String,
    /// The machine it runs on (several workers may share one).
    pub host_id: String,
    /// The most memory jobs may hold on this worker, in bytes.
    pub capacity_bytes: u64,
    /// Memory reserved by running jobs now, in bytes.
    pub reserved_bytes: u64,
    /// The most that was ever reserved at once, in bytes (≤ capacity).
    pub reserved_high_water_bytes: u64,
    /// Linear memory running jobs actually hold now, in bytes.
    pub used_bytes: u64,
    /// Memory the host has available now, as the OS reports it, in bytes.
    pub host_available_bytes: u64,
    /// The largest job that would be admitted now, in bytes (≤
    /// [`largest_job`](Self::largest_job)).
    pub largest_fit_bytes: u64,
    /// The most memory one job may have here when that is less than the
    /// capacity: the sandbox's ceiling (4 GiB, all a wasm32 memory
    /// addresses), less what it keeps beside each job and the detached
    /// jobs' results it keeps. `None`: the capacity alone bounds a job.
    pub max_job_bytes: Option<u64>,
    /// Memory held for warm starts now (the snapshots of initialised
    /// interpreters and the instances kept between jobs), in bytes. Let go
    /// for a job that needs it: a job up to
    /// [`largest_job`](Self::largest_job) still runs here; one up to
    /// [`largest_beside_warm`](Self::largest_beside_warm) runs without
    /// costing the next warm start its snapshot.
    pub warm_bytes: u64,
    /// Jobs that may run at once.
    pub slots_total: u32,
    /// Jobs running now.
    pub slots_busy: u32,
    /// Jobs waiting for a slot or memory.
    pub queue_len: u32,
    /// Jobs run since the worker started.
    pub jobs_run: u64,
    /// Module uploads accepted since the worker started.
    pub modules_received: u64,
    /// The worker is shutting down: it finishes its jobs but takes no more.
    pub draining: bool,
    /// The longest a job may run here (`--max-job-time`), in milliseconds;
    /// `None`: no limit. A job that asks for none runs under this one.
    pub max_job_time_ms: Option<u64>,
    /// Whether this worker's gossip is authenticated (`--cluster-key`):
    /// only then can a client trust the addresses in its view with a token.
    pub gossip_keyed: bool,
    /// Whether tenants authenticate here (`--tenants`); `false`: one
    /// tenant, `default`.
    pub multi_tenant: bool,
    /// Per tenant: usage on this worker (decayed, for fair share) and its
    /// account (cumulative, for rent).
    pub tenants: Vec<TenantUsage>,
    /// Warnings for the operator now (host memory low, jobs refused for
    /// memory, cgroup below `--memory`).
    pub warnings: Vec<String>,
    /// What the maps reporting to this worker still have to run (at most
    /// [`MAX_BACKLOGS`](super::backlog::MAX_BACKLOGS)): the pool's demand.
    pub backlog: Vec<super::backlog::Backlog>,
    /// Detached maps this worker runs as their owner now: stopping it
    /// stops them until it is back.
    pub owned_maps: u32,
    /// The batch-system job this worker runs in (Slurm's `SLURM_JOB_ID`),
    /// so that a controller knows which job lends which worker.
    pub batch_job: Option<String>,
    /// When the batch system ends this worker (ms since the epoch), if it
    /// will: it drains before then, and takes no job that asks for longer
    /// than is left.
    pub ends_at_ms: Option<u64>,
    /// How long it has had nothing to do — no job running or waiting, no
    /// detached map it owns — as of this advert; `None` while it has. A
    /// duration, not a time: no clock is compared across machines, and an
    /// advert that arrives late only understates it.
    pub idle_ms: Option<u64>,
}

impl Advert {
    /// The largest job this worker could ever hold, in bytes: its capacity,
    /// or the most one job may have here if that is less. The one answer
    /// to "could this ever fit here": placement's, and what the worker's
    /// admission enforces (`worker::admission::Admission::largest_for`).
    pub fn largest_job(&self) -> u64 {
        self.capacity_bytes
            .min(self.max_job_bytes.unwrap_or(u64::MAX))
    }

    /// The largest job that runs here beside what warm starts keep
    /// ([`warm_bytes`](Self::warm_bytes)): what a map that has learned
    /// nothing yet asks, so that its first jobs start warm rather than have
    /// the worker let its snapshots go.
    pub fn largest_beside_warm(&self) -> u64 {
        self.largest_job().saturating_sub(self.warm_bytes)
    }

    /// Whether a job asking `bytes` could ever run here, now or later.
    pub fn could_ever_fit(&self, bytes: u64) -> bool {
        bytes <= self.largest_job()
    }

    /// Whether a job asking `bytes` would be admitted now.
    pub fn fits_now(&self, bytes: u64) -> bool {
        bytes <= self.largest_fit_bytes
    }

    /// Whether a gossiped advert is one a worker could have sent: bounded
    /// sizes, slot counts that add up, and usage figures that are finite
    /// and not negative. A forged huge or negative usage would otherwise
    /// starve or favour a tenant in every worker's fair share.
    pub fn check(&self) -> Result<(), String> {
        const MAX_TEXT: usize = 256;
        const MAX_TENANTS: usize = 1024;
        const MAX_WARNINGS: usize = 64;
        const MAX_SLOTS: u32 = 1 << 16;
        // A pool-wide day of 65,536 slots, or of a PiB of reservations.
        const MAX_USAGE: f64 = 1e13;
        let figure = |what: &str, v: f64| {
            if v.is_finite() && (0.0..=MAX_USAGE).contains(&v) {
                Ok(())
            } else {
                Err(format!("{what} is {v}"))
            }
        };
        if self.addr.len() > MAX_TEXT || self.host_id.len() > MAX_TEXT {
            return Err("address or host id too long".into());
        }
        if self.slots_total > MAX_SLOTS || self.slots_busy > self.slots_total {
            return Err(format!(
                "{} of {} slots busy",
                self.slots_busy, self.slots_total
            ));
        }
        if self.reserved_bytes > self.capacity_bytes
            || self.warm_bytes > self.capacity_bytes
            || self.largest_fit_bytes > self.largest_job()
        {
            return Err(
                "more reserved or offered than the capacity, or offered more than a job may have"
                    .into(),
            );
        }
        if self.tenants.len() > MAX_TENANTS || self.warnings.len() > MAX_WARNINGS {
            return Err("too many tenants or warnings".into());
        }
        if self.warnings.iter().any(|w| w.len() > 4 * MAX_TEXT) {
            return Err("a warning is too long".into());
        }
        if self.backlog.len() > super::backlog::MAX_BACKLOGS
            || self.batch_job.as_ref().is_some_and(|j| j.len() > MAX_TEXT)
        {
            return Err("too many backlogs, or a batch job id too long".into());
        }
        for b in &self.backlog {
            b.check()?;
        }
        for t in &self.tenants {
            if t.tenant.len() > MAX_TEXT {
                return Err("a tenant name is too long".into());
            }
            let a = &t.account;
            for (what, v) in [
                ("slot_seconds", t.slot_seconds),
                ("gib_seconds", t.gib_seconds),
                ("account cpu_seconds", a.cpu_seconds),
                ("account slot_seconds", a.slot_seconds),
                ("account reserved_gib_seconds", a.reserved_gib_seconds),
                ("account used_gib_seconds", a.used_gib_seconds),
            ] {
                figure(&format!("{}'s {what}", t.tenant), v)?;
            }
        }
        Ok(())
    }
}

/// One tenant's usage on one worker, as gossiped.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TenantUsage {
    /// The tenant's name.
    pub tenant: String,
    /// Decayed slot-seconds (fair share).
    pub slot_seconds: f64,
    /// Decayed reserved GiB-seconds (fair share).
    pub gib_seconds: f64,
    /// What the tenant has used here since the worker started.
    pub account: TenantAccount,
}

/// What a tenant used — the figures rent could be charged on (seeds/003).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TenantAccount {
    /// Jobs that ran.
    pub jobs: u64,
    /// CPU time of its jobs.
    pub cpu_seconds: f64,
    /// Wall time its jobs held a slot.
    pub slot_seconds: f64,
    /// Σ memory limit × wall time, in GiB-seconds.
    pub reserved_gib_seconds: f64,
    /// Σ peak memory × wall time, in GiB-seconds.
    pub used_gib_seconds: f64,
}

impl TenantAccount {
    /// Adds `other` into this one.
    pub fn add(&mut self, other: &TenantAccount) {
        self.jobs += other.jobs;
        self.cpu_seconds += other.cpu_seconds;
        self.slot_seconds += other.slot_seconds;
        self.reserved_gib_seconds += other.reserved_gib_seconds;
        self.used_gib_seconds += other.used_gib_seconds;
    }
}
