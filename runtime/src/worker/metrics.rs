//! `GET /metrics`: the worker in Prometheus' text format (OpenMetrics),
//! through `prometheus-client`.
//!
//! Job outcomes, refusals and the job histograms are recorded as jobs end;
//! everything that already has a counter or a gauge elsewhere (the ledger,
//! the module cache, gossip, tenants' accounts, warnings) is read when
//! scraped and encoded as it is, by a collector (`Live`): nothing is
//! counted twice or kept in step by hand.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::gossip::Liveness;
use crate::proto::{Advert, JobResult, Outcome};
use crate::sandbox::CacheStats;

/// The content type of `/metrics`.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

type Labels = Vec<(String, String)>;

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
    /// Module bytes held for compiling (`runner::modules`).
    pub module_bytes: u64,
    /// Bytes held outside reservations, by kind (`ledger::Hold`; indexed
    /// as [`HoldKind::ALL`](crate::worker::HoldKind::ALL)).
    pub held_by: [u64; crate::worker::HoldKind::ALL.len()],
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
    /// Jobs whose code ran in a slot process (`runner::slotproc`).
    pub slot_process_jobs: u64,
    /// The pool's demand as this worker sees it: every live worker's
    /// backlog reports, each map once.
    pub backlog: &'a crate::proto::backlog::PoolBacklog,
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
    /// Files received (`PUT /v1/files/{hash}`).
    pub received: u64,
    /// Their bytes.
    pub received_bytes: u64,
    /// Bytes kept on disk now.
    pub held: u64,
}

/// The worker's metrics: what is recorded as jobs end lives here; the
/// rest is read from where it is kept when scraped ([`Live`]).
pub struct Metrics {
    registry: Registry,
    jobs: Family<Labels, Counter>,
    refused: Family<Labels, Counter>,
    wall: Histogram,
    cpu: Histogram,
    peak: Histogram,
    batch: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// The job metrics, registered under `peerwasm_`.
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
            registry: Registry::default(),
        };
        r.register(
            "jobs",
            "Jobs that ended, by outcome and tenant",
            m.jobs.clone(),
        );
        r.register(
            "refused_jobs",
            "Jobs refused before running, by reason",
            m.refused.clone(),
        );
        r.register("job_wall_seconds", "Wall time of jobs", m.wall.clone());
        r.register("job_cpu_seconds", "CPU time of jobs", m.cpu.clone());
        r.register(
            "job_peak_memory_bytes",
            "Peak linear memory of jobs",
            m.peak.clone(),
        );
        r.register(
            "batch_jobs",
            "Jobs per POST /v1/jobs/batch request",
            m.batch.clone(),
        );
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
        let labels = vec![
            ("outcome".to_string(), outcome.to_string()),
            ("tenant".to_string(), tenant.to_string()),
        ];
        self.jobs.get_or_create(&labels).inc();
    }

    /// A job was refused before running (`never_fits`, `queue_full`,
    /// `draining`, `unauthorized`...).
    pub fn refused(&self, reason: &str) {
        self.refused.get_or_create(&label("reason", reason)).inc();
    }

    /// The text exposition: the job metrics, then the live figures of
    /// `scrape` as they are now.
    pub fn render(&self, scrape: &Scrape<'_>) -> String {
        let mut live = Registry::with_prefix("peerwasm");
        live.register_collector(Box::new(Live::of(scrape)));
        let mut out = String::new();
        encode_registry(&mut out, &self.registry)
            .and_then(|()| encode_registry(&mut out, &live))
            .and_then(|()| encode_eof(&mut out))
            .expect("writing to a String cannot fail");
        out
    }
}

/// A value of a live family.
#[derive(Debug, Clone, Copy)]
enum Value {
    Count(u64),
    CountF(f64),
    Level(u64),
    LevelF(f64),
}

/// One family read at a scrape: name, help and its values by label set.
#[derive(Debug)]
struct LiveFamily {
    name: &'static str,
    help: &'static str,
    values: Vec<(Labels, Value)>,
}

/// What a scrape reads from the rest of the worker — the ledger, the
/// module cache, gossip, tenants' accounts, warnings — encoded as they are
/// (a `prometheus-client` collector), so nothing is counted twice and
/// nothing needs keeping in step.
#[derive(Debug)]
struct Live(Vec<LiveFamily>);

impl Live {
    fn of(s: &Scrape<'_>) -> Live {
        let a = s.advert;
        let by = |key: &str, values: Vec<(&str, Value)>| -> Vec<(Labels, Value)> {
            values
                .into_iter()
                .map(|(v, n)| (label(key, v), n))
                .collect()
        };
        let family = |name, help, values| LiveFamily { name, help, values };
        let (count, level) = (Value::Count, Value::Level);
        let g = s.gossip;
        let per_tenant = |f: &dyn Fn(&crate::proto::TenantUsage) -> Value| {
            a.tenants
                .iter()
                .map(|t| (label("tenant", t.tenant.clone()), f(t)))
                .collect::<Vec<_>>()
        };
        let single = |n: Value| vec![(Labels::new(), n)];
        Live(vec![
            family(
                "slots",
                "Slots, by state (busy, total)",
                by(
                    "state",
                    vec![
                        ("busy", level(a.slots_busy as u64)),
                        ("total", level(a.slots_total as u64)),
                    ],
                ),
            ),
            family(
                "memory_bytes",
                "Memory: capacity, reserved, used by jobs, host available, largest job that fits now, module bytes held; held outside reservations: jobs' output and results, requests being read, compiles, warm starts' snapshots and interpreters",
                {
                    let mut values = by(
                        "kind",
                        vec![
                            ("capacity", level(a.capacity_bytes)),
                            ("reserved", level(a.reserved_bytes)),
                            ("used", level(a.used_bytes)),
                            ("host_available", level(a.host_available_bytes)),
                            ("largest_fit", level(a.largest_fit_bytes)),
                            ("module_bytes", level(s.module_bytes)),
                        ],
                    );
                    for (kind, bytes) in crate::worker::HoldKind::ALL.iter().zip(s.held_by) {
                        values.push((
                            label("kind", format!("{}_held", kind.label())),
                            level(bytes),
                        ));
                    }
                    values
                },
            ),
            family(
                "queue_length",
                "Jobs waiting, by tenant",
                s.queued
                    .iter()
                    .map(|(t, n)| (label("tenant", t.clone()), level(u64::from(*n))))
                    .collect(),
            ),
            family(
                "module_cache_events",
                "Module cache: compiles, memory hits, disk hits, rejected disk artifacts (planted, altered, incompatible), evicted disk artifacts",
                by(
                    "event",
                    vec![
                        ("compile", count(s.cache.compiles)),
                        ("memory_hit", count(s.cache.memory_hits)),
                        ("disk_hit", count(s.cache.disk_hits)),
                        ("disk_reject", count(s.cache.disk_rejects)),
                        ("disk_evict", count(s.cache.disk_evictions)),
                    ],
                ),
            ),
            family(
                "gossip_events",
                "Gossip: rounds, exchanges ok and failed, rejected and forged messages",
                by(
                    "event",
                    vec![
                        ("round", count(g.rounds)),
                        ("exchange_ok", count(g.exchanges_ok)),
                        ("exchange_failed", count(g.exchanges_failed)),
                        ("rejected", count(g.rejected)),
                        ("forged", count(g.forged)),
                    ],
                ),
            ),
            family(
                "gossip_bytes",
                "Gossip bytes, by direction",
                by(
                    "direction",
                    vec![
                        ("sent", count(g.bytes_sent)),
                        ("received", count(g.bytes_received)),
                    ],
                ),
            ),
            family(
                "peers",
                "Peers in this worker's view, by liveness",
                by(
                    "liveness",
                    [
                        ("alive", Liveness::Alive),
                        ("suspect", Liveness::Suspect),
                        ("dead", Liveness::Dead),
                    ]
                    .into_iter()
                    .map(|(name, state)| {
                        (
                            name,
                            level(s.peers.iter().filter(|l| **l == state).count() as u64),
                        )
                    })
                    .collect(),
                ),
            ),
            family(
                "tenant_jobs",
                "Jobs run, by tenant",
                per_tenant(&|t| count(t.account.jobs)),
            ),
            family(
                "tenant_cpu_seconds",
                "CPU-seconds, by tenant",
                per_tenant(&|t| Value::CountF(t.account.cpu_seconds)),
            ),
            family(
                "tenant_slot_seconds",
                "Slot-seconds held, by tenant",
                per_tenant(&|t| Value::CountF(t.account.slot_seconds)),
            ),
            family(
                "tenant_reserved_gib_seconds",
                "Reserved GiB-seconds, by tenant",
                per_tenant(&|t| Value::CountF(t.account.reserved_gib_seconds)),
            ),
            family(
                "tenant_used_gib_seconds",
                "Used (peak) GiB-seconds, by tenant",
                per_tenant(&|t| Value::CountF(t.account.used_gib_seconds)),
            ),
            family(
                "tenant_usage_slot_seconds",
                "Decayed slot-seconds fair share ranks by, by tenant",
                per_tenant(&|t| Value::LevelF(t.slot_seconds)),
            ),
            family(
                "warnings",
                "Operator warnings raised, by kind",
                s.warnings
                    .iter()
                    .map(|(kind, n)| (label("kind", *kind), count(*n)))
                    .collect(),
            ),
            family(
                "connections_refused",
                "Connections closed at a cap (--max-connections, per address, per prefix): turned away, or idle ones closed to make room",
                single(count(s.connections_refused)),
            ),
            family(
                "files_received",
                "Files of shipped trees received (PUT /v1/files), in files and bytes",
                by(
                    "unit",
                    vec![
                        ("files", count(s.files.received)),
                        ("bytes", count(s.files.received_bytes)),
                    ],
                ),
            ),
            family(
                "slot_process_jobs",
                "Jobs whose code ran in a slot process, without fuel (--slot-processes)",
                single(count(s.slot_process_jobs)),
            ),
            family(
                "file_store_bytes",
                "Bytes of shipped trees' files kept on disk (--file-store)",
                single(level(s.files.held)),
            ),
            family(
                "pool_backlog_jobs",
                "The pool's demand: jobs its maps still have to run, waiting in their clients or under way",
                by(
                    "state",
                    vec![
                        ("waiting", level(s.backlog.waiting)),
                        ("running", level(s.backlog.running)),
                    ],
                ),
            ),
            family(
                "pool_backlog_maps",
                "Maps reporting a backlog to the pool",
                single(level(s.backlog.maps)),
            ),
            family(
                "pool_backlog_memory_bytes",
                "Memory the waiting jobs ask for, summed (what they would hold if all ran at once)",
                single(level(s.backlog.memory_bytes)),
            ),
            family(
                "pool_backlog_largest_job_bytes",
                "The most any waiting job asks for",
                single(level(s.backlog.largest_bytes)),
            ),
            family(
                "pool_backlog_seconds",
                "Work left in the pool's maps, in slot-seconds (jobs × their mean time)",
                single(Value::LevelF(s.backlog.work_seconds)),
            ),
        ])
    }
}

impl Collector for Live {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in &self.0 {
            let Some((_, first)) = f.values.first() else {
                continue;
            };
            let kind = match first {
                Value::Count(_) | Value::CountF(_) => MetricType::Counter,
                Value::Level(_) | Value::LevelF(_) => MetricType::Gauge,
            };
            // As `Registry::register` writes help: ending in a full stop.
            let help = format!("{}.", f.help);
            let mut family = encoder.encode_descriptor(f.name, &help, None, kind)?;
            if let [(labels, value)] = f.values.as_slice()
                && labels.is_empty()
            {
                value.encode(family)?;
                continue;
            }
            for (labels, value) in &f.values {
                value.encode(family.encode_family(labels)?)?;
            }
        }
        Ok(())
    }
}

impl Value {
    fn encode(
        self,
        sample: prometheus_client::encoding::MetricEncoder<'_>,
    ) -> Result<(), std::fmt::Error> {
        match self {
            Value::Count(n) => ConstCounter::new(n).encode(sample),
            Value::CountF(x) => ConstCounter::new(x).encode(sample),
            Value::Level(n) => ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX)).encode(sample),
            Value::LevelF(x) => ConstGauge::new(x).encode(sample),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_openmetrics_text_with_live_figures() {
        let m = Metrics::new();
        let advert = Advert {
            slots_total: 4,
            slots_busy: 1,
            capacity_bytes: 1 << 30,
            ..Advert::default()
        };
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
            cache: CacheStats {
                compiles: 1,
                memory_hits: 5,
                ..CacheStats::default()
            },
            module_bytes: 0,
            files: FileStoreCounts::default(),
            slot_process_jobs: 2,
            held_by: [0; crate::worker::HoldKind::ALL.len()],
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
            backlog: &crate::proto::backlog::PoolBacklog {
                maps: 1,
                waiting: 40,
                running: 8,
                memory_bytes: 40 << 20,
                largest_bytes: 2 << 20,
                work_seconds: 24.0,
                reports: Vec::new(),
            },
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
            "peerwasm_pool_backlog_jobs{state=\"waiting\"} 40",
            "peerwasm_pool_backlog_memory_bytes 41943040",
            "peerwasm_pool_backlog_seconds 24.0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        // Scraping again does not count twice.
        let again = m.render(&scrape);
        assert!(again.contains("peerwasm_module_cache_events_total{event=\"memory_hit\"} 5"));
    }
}
