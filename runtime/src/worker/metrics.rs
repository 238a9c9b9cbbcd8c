//! `GET /metrics`: the worker in Prometheus' text format (OpenMetrics),
//! through `prometheus-client`.
//!
//! Job outcomes, refusals and the job histograms are recorded as jobs end;
//! everything that already has a counter or a gauge elsewhere (the ledger,
//! the module cache, gossip, tenants' accounts, warnings) is read when
//! scraped, so nothing is counted twice.

use parking_lot::Mutex;
use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::gossip::Liveness;
use crate::proto::{Advert, JobResult, Outcome};
use crate::sandbox::CacheStats;

/// The content type of `/metrics`.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

type Labels = Vec<(String, String)>;
type FloatCounter = Counter<f64, AtomicU64>;
type FloatGauge = Gauge<f64, AtomicU64>;

fn label(key: &str, value: impl Into<String>) -> Labels {
    vec![(key.to_string(), value.into())]
}

/// What a scrape reads from the rest of the worker.
pub struct Scrape<'a> {
    /// The worker's own advert, fresh.
    pub advert: &'a Advert,
    /// Jobs waiting, per tenant.
    pub queued: &'a [(String, u32)],
    /// The module cache's counters.
    pub cache: CacheStats,
    /// Module bytes held for compiling (`worker::modules`).
    pub module_bytes: u64,
    /// Bytes held for jobs' output and detached results (`ledger::Hold`).
    pub output_bytes: u64,
    /// Gossip's counters.
    pub gossip: GossipCounts,
    /// Peers by how this worker sees them.
    pub peers: &'a [Liveness],
    /// Warnings raised, by kind label.
    pub warnings: &'a [(&'static str, u64)],
    /// Connections closed at `--max-connections`.
    pub connections_refused: u64,
    /// The file store's counters.
    pub files: FileStoreCounts,
    /// Jobs whose code ran in a slot process (`worker::slotproc`).
    pub slot_process_jobs: u64,
}

/// Gossip's counters, as a scrape reads them.
#[derive(Clone, Copy, Debug, Default)]
pub struct GossipCounts {
    pub rounds: u64,
    pub exchanges_ok: u64,
    pub exchanges_failed: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Undecodable messages; invalid records, or new nodes past the
    /// view's bound.
    pub rejected: u64,
    /// Bad MAC, or replayed.
    pub forged: u64,
}

/// The file store's counters, as a scrape reads them.
#[derive(Clone, Copy, Debug, Default)]
pub struct FileStoreCounts {
    /// Files received (`PUT /v1/files`).
    pub received: u64,
    /// Their bytes.
    pub received_bytes: u64,
    /// Bytes kept on disk now.
    pub held: u64,
}

/// The worker's metrics.
pub struct Metrics {
    registry: Registry,
    jobs: Family<Labels, Counter>,
    refused: Family<Labels, Counter>,
    wall: Histogram,
    cpu: Histogram,
    peak: Histogram,
    batch: Histogram,
    slots: Family<Labels, Gauge>,
    memory: Family<Labels, Gauge>,
    queue: Family<Labels, Gauge>,
    cache: Family<Labels, Counter>,
    gossip: Family<Labels, Counter>,
    gossip_bytes: Family<Labels, Counter>,
    peers: Family<Labels, Gauge>,
    tenant_jobs: Family<Labels, Counter>,
    tenant_cpu: Family<Labels, FloatCounter>,
    tenant_slot: Family<Labels, FloatCounter>,
    tenant_reserved: Family<Labels, FloatCounter>,
    tenant_used: Family<Labels, FloatCounter>,
    tenant_usage: Family<Labels, FloatGauge>,
    warnings: Family<Labels, Counter>,
    connections_refused: Counter,
    files_received: Family<Labels, Counter>,
    file_store: Gauge,
    slot_process_jobs: Counter,
    /// Serialises scrapes: syncing counters is read-then-add.
    scrape: Mutex<()>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// All metrics, registered under `peerwasm_`.
    pub fn new() -> Metrics {
        let mut r = Registry::with_prefix("peerwasm");
        let m = Metrics {
            jobs: Family::default(),
            refused: Family::default(),
            // 1 ms … ~9 min.
            wall: Histogram::new(exponential_buckets(0.001, 4.0, 10)),
            cpu: Histogram::new(exponential_buckets(0.001, 4.0, 10)),
            // 64 KiB … 16 GiB.
            peak: Histogram::new(exponential_buckets(65536.0, 4.0, 10)),
            // 1 … 4096 jobs.
            batch: Histogram::new(exponential_buckets(1.0, 2.0, 13)),
            slots: Family::default(),
            memory: Family::default(),
            queue: Family::default(),
            cache: Family::default(),
            gossip: Family::default(),
            gossip_bytes: Family::default(),
            peers: Family::default(),
            tenant_jobs: Family::default(),
            tenant_cpu: Family::default(),
            tenant_slot: Family::default(),
            tenant_reserved: Family::default(),
            tenant_used: Family::default(),
            tenant_usage: Family::default(),
            warnings: Family::default(),
            connections_refused: Counter::default(),
            files_received: Family::default(),
            file_store: Gauge::default(),
            slot_process_jobs: Counter::default(),
            registry: Registry::default(),
            scrape: Mutex::new(()),
        };
        r.register("jobs", "Jobs that ended, by outcome and tenant", m.jobs.clone());
        r.register("refused_jobs", "Jobs refused before running, by reason", m.refused.clone());
        r.register("job_wall_seconds", "Wall time of jobs", m.wall.clone());
        r.register("job_cpu_seconds", "CPU time of jobs", m.cpu.clone());
        r.register("job_peak_memory_bytes", "Peak linear memory of jobs", m.peak.clone());
        r.register("batch_jobs", "Jobs per POST /v1/jobs/batch request", m.batch.clone());
        r.register("slots", "Slots, by state (busy, total)", m.slots.clone());
        r.register("memory_bytes", "Memory: capacity, reserved, used by jobs, host available, largest job that fits now, module bytes held, output and results held", m.memory.clone());
        r.register("queue_length", "Jobs waiting, by tenant", m.queue.clone());
        r.register("module_cache_events", "Module cache: compiles, memory hits, disk hits, rejected disk artifacts (planted, altered, incompatible), evicted disk artifacts", m.cache.clone());
        r.register("gossip_events", "Gossip: rounds, exchanges ok and failed, rejected and forged messages", m.gossip.clone());
        r.register("gossip_bytes", "Gossip bytes, by direction", m.gossip_bytes.clone());
        r.register("peers", "Peers in this worker's view, by liveness", m.peers.clone());
        r.register("tenant_jobs", "Jobs run, by tenant", m.tenant_jobs.clone());
        r.register("tenant_cpu_seconds", "CPU-seconds, by tenant", m.tenant_cpu.clone());
        r.register("tenant_slot_seconds", "Slot-seconds held, by tenant", m.tenant_slot.clone());
        r.register("tenant_reserved_gib_seconds", "Reserved GiB-seconds, by tenant", m.tenant_reserved.clone());
        r.register("tenant_used_gib_seconds", "Used (peak) GiB-seconds, by tenant", m.tenant_used.clone());
        r.register("tenant_usage_slot_seconds", "Decayed slot-seconds fair share ranks by, by tenant", m.tenant_usage.clone());
        r.register("warnings", "Operator warnings raised, by kind", m.warnings.clone());
        r.register("connections_refused", "Connections closed because --max-connections were open", m.connections_refused.clone());
        r.register("files_received", "Files of shipped trees received (PUT /v1/files), in files and bytes", m.files_received.clone());
        r.register("slot_process_jobs", "Jobs whose code ran in a slot process, without fuel (--slot-processes)", m.slot_process_jobs.clone());
        r.register("file_store_bytes", "Bytes of shipped trees' files kept on disk (--file-store)", m.file_store.clone());
        Metrics { registry: r, ..m }
    }

    /// A batch of `jobs` jobs arrived.
    pub fn batch_received(&self, jobs: usize) {
        self.batch.observe(jobs as f64);
    }

    /// A job of `tenant` ended with `result`.
    pub fn job_ended(&self, tenant: &str, result: &JobResult) {
        let outcome = match &result.outcome {
            Outcome::Exited { code: 0 } => "exited_ok",
            Outcome::Exited { .. } => "exited_error",
            other => other.kind(),
        };
        self.count_job(tenant, outcome);
        self.wall.observe(result.wall_time_us as f64 / 1e6);
        self.cpu.observe(result.cpu_time_us as f64 / 1e6);
        self.peak.observe(result.peak_memory_bytes as f64);
    }

    /// A job cancelled while it waited for a slot: it ended (outcome
    /// `cancelled`) without running, so no time or memory is observed.
    pub fn cancelled_in_queue(&self, tenant: &str) {
        self.count_job(tenant, "cancelled");
    }

    fn count_job(&self, tenant: &str, outcome: &str) {
        let labels = vec![("outcome".to_string(), outcome.to_string()), ("tenant".to_string(), tenant.to_string())];
        self.jobs.get_or_create(&labels).inc();
    }

    /// A job was refused before running (`never_fits`, `queue_full`,
    /// `draining`, `unauthorized`...).
    pub fn refused(&self, reason: &str) {
        self.refused.get_or_create(&label("reason", reason)).inc();
    }

    /// The text exposition, after reading the live figures.
    pub fn render(&self, s: &Scrape<'_>) -> String {
        let _one_at_a_time = self.scrape.lock();
        let a = s.advert;
        let set = |f: &Family<Labels, Gauge>, k: &str, v: &str, n: u64| {
            f.get_or_create(&label(k, v)).set(i64::try_from(n).unwrap_or(i64::MAX));
        };
        set(&self.slots, "state", "busy", a.slots_busy as u64);
        set(&self.slots, "state", "total", a.slots_total as u64);
        for (kind, n) in [
            ("capacity", a.capacity_bytes),
            ("reserved", a.reserved_bytes),
            ("used", a.used_bytes),
            ("host_available", a.host_available_bytes),
            ("largest_fit", a.largest_fit_bytes),
            ("module_bytes", s.module_bytes),
            ("output_held", s.output_bytes),
        ] {
            set(&self.memory, "kind", kind, n);
        }
        self.queue.clear();
        for (tenant, n) in s.queued {
            set(&self.queue, "tenant", tenant, *n as u64);
        }
        for (event, n) in [
            ("compile", s.cache.compiles),
            ("memory_hit", s.cache.memory_hits),
            ("disk_hit", s.cache.disk_hits),
            ("disk_reject", s.cache.disk_rejects),
            ("disk_evict", s.cache.disk_evictions),
        ] {
            sync(&self.cache.get_or_create(&label("event", event)), n);
        }
        let g = s.gossip;
        for (event, n) in [
            ("round", g.rounds),
            ("exchange_ok", g.exchanges_ok),
            ("exchange_failed", g.exchanges_failed),
            ("rejected", g.rejected),
            ("forged", g.forged),
        ] {
            sync(&self.gossip.get_or_create(&label("event", event)), n);
        }
        sync(&self.slot_process_jobs, s.slot_process_jobs);
        sync(&self.gossip_bytes.get_or_create(&label("direction", "sent")), g.bytes_sent);
        sync(&self.gossip_bytes.get_or_create(&label("direction", "received")), g.bytes_received);
        for (name, state) in [("alive", Liveness::Alive), ("suspect", Liveness::Suspect), ("dead", Liveness::Dead)] {
            set(&self.peers, "liveness", name, s.peers.iter().filter(|l| **l == state).count() as u64);
        }
        for t in &a.tenants {
            let l = label("tenant", t.tenant.clone());
            sync(&self.tenant_jobs.get_or_create(&l), t.account.jobs);
            sync_f(&self.tenant_cpu.get_or_create(&l), t.account.cpu_seconds);
            sync_f(&self.tenant_slot.get_or_create(&l), t.account.slot_seconds);
            sync_f(&self.tenant_reserved.get_or_create(&l), t.account.reserved_gib_seconds);
            sync_f(&self.tenant_used.get_or_create(&l), t.account.used_gib_seconds);
            self.tenant_usage.get_or_create(&l).set(t.slot_seconds);
        }
        sync(&self.connections_refused, s.connections_refused);
        sync(&self.files_received.get_or_create(&label("unit", "files")), s.files.received);
        sync(&self.files_received.get_or_create(&label("unit", "bytes")), s.files.received_bytes);
        self.file_store.set(i64::try_from(s.files.held).unwrap_or(i64::MAX));
        for (kind, n) in s.warnings {
            sync(&self.warnings.get_or_create(&label("kind", *kind)), *n);
        }
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

/// Brings a counter up to a monotonic value kept elsewhere.
fn sync(c: &Counter, value: u64) {
    let current = c.get();
    if value > current {
        c.inc_by(value - current);
    }
}

fn sync_f(c: &FloatCounter, value: f64) {
    let current = c.get();
    if value > current {
        c.inc_by(value - current);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_openmetrics_text_with_live_figures() {
        let m = Metrics::new();
        let advert = Advert { slots_total: 4, slots_busy: 1, capacity_bytes: 1 << 30, ..Advert::default() };
        let result = JobResult {
            outcome: Outcome::Exited { code: 0 },
            stdout: Vec::new(),
            stderr: Vec::new(),
            peak_memory_bytes: 1 << 20,
            memory_limit_bytes: 1 << 30,
            wall_time_us: 1500,
            cpu_time_us: 1000,
            cache: crate::proto::CacheSource::Memory,
            peer: "x".into(),
            warnings: Vec::new(),
            files: Vec::new(),
        };
        m.job_ended("alice", &result);
        m.refused("never_fits");
        let scrape = Scrape {
            advert: &advert,
            queued: &[("alice".into(), 2)],
            cache: CacheStats { compiles: 1, memory_hits: 5, ..CacheStats::default() },
            module_bytes: 0,
            files: FileStoreCounts::default(),
            slot_process_jobs: 2,
            output_bytes: 0,
            gossip: GossipCounts {
                rounds: 3,
                exchanges_ok: 2,
                exchanges_failed: 1,
                bytes_sent: 100,
                bytes_received: 200,
                ..GossipCounts::default()
            },
            peers: &[Liveness::Alive, Liveness::Dead],
            warnings: &[("refused_for_memory", 1)],
            connections_refused: 7,
        };
        let text = m.render(&scrape);
        for line in [
            "peerwasm_jobs_total{outcome=\"exited_ok\",tenant=\"alice\"} 1",
            "peerwasm_refused_jobs_total{reason=\"never_fits\"} 1",
            "peerwasm_connections_refused_total 7",
            "peerwasm_slot_process_jobs_total 2",
            "peerwasm_slots{state=\"total\"} 4",
            "peerwasm_queue_length{tenant=\"alice\"} 2",
            "peerwasm_module_cache_events_total{event=\"memory_hit\"} 5",
            "peerwasm_gossip_bytes_total{direction=\"received\"} 200",
            "peerwasm_peers{liveness=\"dead\"} 1",
            "peerwasm_job_wall_seconds_count 1",
            "peerwasm_warnings_total{kind=\"refused_for_memory\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        // Scraping again does not count twice.
        let again = m.render(&scrape);
        assert!(again.contains("peerwasm_module_cache_events_total{event=\"memory_hit\"} 5"));
    }
}
