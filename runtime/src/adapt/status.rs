//! What the controller is doing, as of its last poll: the figures and the
//! last few decisions in words. It travels in the pool directory's
//! controller notice (so `peerwasm status --pool-dir` shows it beside the
//! workers) and is exported as Prometheus metrics by `peerwasm adapt
//! --metrics ADDR`, one source for both.

use std::fmt;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use super::AdaptSummary;

/// How many decisions the status keeps (the newest last).
pub const DECISIONS_KEPT: usize = 5;
/// A decision's words are cut to this many bytes in the status (the log
/// has them whole).
const DECISION_BYTES: usize = 400;

/// The controller as of its last poll.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct AdaptStatus {
    /// Workers the backlog asks for, within `--min..=--max`.
    pub target: u32,
    /// Its workers in the pool now.
    pub workers: u32,
    /// Its batch jobs not (yet) in the pool: capacity coming.
    pub pending: u32,
    /// Jobs the maps still have to run, as the controller counts them.
    pub backlog_jobs: u64,
    /// What it did since it started.
    pub submitted: u64,
    pub cancelled: u64,
    pub cancelled_unused: u64,
    pub refused: u64,
    /// The last [`DECISIONS_KEPT`] decisions: when (Unix ms) and why.
    pub decisions: Vec<(u64, String)>,
}

impl AdaptStatus {
    /// Takes the counters of `summary`.
    pub fn count(&mut self, summary: &AdaptSummary) {
        self.submitted = summary.submitted;
        self.cancelled = summary.cancelled;
        self.cancelled_unused = summary.cancelled_unused;
        self.refused = summary.refused;
    }

    /// Keeps `why` as the newest decision.
    pub fn said(&mut self, why: &str) {
        let mut why = why.to_string();
        if why.len() > DECISION_BYTES {
            let mut cut = DECISION_BYTES;
            while !why.is_char_boundary(cut) {
                cut -= 1;
            }
            why.truncate(cut);
            why.push('…');
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        self.decisions.push((now, why));
        let extra = self.decisions.len().saturating_sub(DECISIONS_KEPT);
        self.decisions.drain(..extra);
    }

    /// The status in Prometheus' text format (OpenMetrics), under
    /// `peerwasm_adapt_`, labelled with the controller's name.
    pub fn metrics_text(&self, name: &str) -> String {
        let mut registry = Registry::with_prefix_and_labels(
            "peerwasm_adapt",
            [("controller".into(), name.to_string().into())].into_iter(),
        );
        let gauges: [(&str, &str, u64); 4] = [
            (
                "target_workers",
                "Workers the backlog asks for",
                u64::from(self.target),
            ),
            (
                "workers",
                "Its workers in the pool",
                u64::from(self.workers),
            ),
            (
                "pending_jobs",
                "Its batch jobs not yet in the pool",
                u64::from(self.pending),
            ),
            (
                "backlog_jobs",
                "Jobs the maps still have to run",
                self.backlog_jobs,
            ),
        ];
        for (name, help, value) in gauges {
            registry.register(name, help, ConstGauge::new(value as i64));
        }
        let counters = [
            ("submitted", "Batch jobs submitted", self.submitted),
            ("cancelled", "Batch jobs cancelled", self.cancelled),
            (
                "cancelled_unused",
                "Batch jobs cancelled whose worker never ran a job",
                self.cancelled_unused,
            ),
            (
                "refused",
                "Batch jobs refused, or found never to start",
                self.refused,
            ),
        ];
        for (name, help, value) in counters {
            registry.register(name, help, ConstCounter::new(value));
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &registry);
        out
    }
}

impl fmt::Display for AdaptStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "target {} worker{}: {} in the pool, {} coming; {} jobs to run",
            self.target,
            if self.target == 1 { "" } else { "s" },
            self.workers,
            self.pending,
            self.backlog_jobs
        )?;
        write!(
            f,
            "batch jobs: {} submitted, {} cancelled ({} without having run a job), {} refused",
            self.submitted, self.cancelled, self.cancelled_unused, self.refused
        )?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        for (at, why) in &self.decisions {
            let ago = std::time::Duration::from_secs(now.saturating_sub(*at) / 1000);
            write!(f, "\n  {} ago: {why}", humantime::format_duration(ago))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_keeps_the_last_decisions_and_exports_its_figures() {
        let mut s = AdaptStatus {
            target: 4,
            workers: 3,
            pending: 1,
            backlog_jobs: 120,
            ..AdaptStatus::default()
        };
        s.count(&AdaptSummary {
            submitted: 5,
            cancelled: 1,
            cancelled_unused: 0,
            refused: 2,
        });
        for i in 0..7 {
            s.said(&format!("decision {i}"));
        }
        s.said(&"é".repeat(300));
        assert_eq!(s.decisions.len(), DECISIONS_KEPT);
        assert_eq!(s.decisions[0].1, "decision 3");
        assert!(s.decisions[4].1.len() <= DECISION_BYTES + '…'.len_utf8());
        let text = s.to_string();
        assert!(
            text.contains("target 4 workers: 3 in the pool, 1 coming; 120 jobs"),
            "{text}"
        );
        assert!(
            text.contains("2 refused") && text.contains("ago: decision 6"),
            "{text}"
        );
        let metrics = s.metrics_text("peerwasm-adapt-7");
        for line in [
            "peerwasm_adapt_target_workers{controller=\"peerwasm-adapt-7\"} 4",
            "peerwasm_adapt_pending_jobs{controller=\"peerwasm-adapt-7\"} 1",
            "peerwasm_adapt_submitted_total{controller=\"peerwasm-adapt-7\"} 5",
            "peerwasm_adapt_refused_total{controller=\"peerwasm-adapt-7\"} 2",
        ] {
            assert!(metrics.contains(line), "{line} missing:\n{metrics}");
        }
        assert!(metrics.ends_with("# EOF\n"));
        // Through the notice, as JSON.
        let back: AdaptStatus = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
    }
}
