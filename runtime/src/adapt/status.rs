//! The controller's figures for Prometheus (`peerwasm adapt --metrics
//! ADDR`), from the same [`ControllerStatus`] its notice carries (so
//! `peerwasm status`, the status page and the metrics say one thing).

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::server::controller::ControllerStatus;

/// `status` in Prometheus' text format (OpenMetrics), under
/// `peerwasm_adapt_`, labelled with the controller's name.
pub fn metrics_text(status: &ControllerStatus, name: &str) -> String {
    let mut registry = Registry::with_prefix_and_labels(
        "peerwasm_adapt",
        [("controller".into(), name.to_string().into())].into_iter(),
    );
    let gauges: [(&str, &str, u64); 4] = [
        (
            "target_workers",
            "Workers the backlog asks for",
            u64::from(status.target),
        ),
        (
            "workers",
            "Its workers in the pool",
            u64::from(status.workers),
        ),
        (
            "pending_jobs",
            "Its batch jobs not yet in the pool",
            u64::from(status.pending),
        ),
        (
            "backlog_jobs",
            "Jobs the maps still have to run",
            status.backlog_jobs,
        ),
    ];
    for (name, help, value) in gauges {
        registry.register(name, help, ConstGauge::new(value as i64));
    }
    let counters = [
        ("submitted", "Batch jobs submitted", status.submitted),
        ("cancelled", "Batch jobs cancelled", status.cancelled),
        (
            "cancelled_unused",
            "Batch jobs cancelled whose worker never ran a job",
            status.cancelled_unused,
        ),
        (
            "refused",
            "Batch jobs refused, or found never to start",
            status.refused,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_figures_are_exported_labelled_with_the_controller() {
        let s = ControllerStatus {
            target: 4,
            pending: 1,
            submitted: 5,
            refused: 2,
            ..ControllerStatus::default()
        };
        let metrics = metrics_text(&s, "peerwasm-adapt-7");
        for line in [
            "peerwasm_adapt_target_workers{controller=\"peerwasm-adapt-7\"} 4",
            "peerwasm_adapt_pending_jobs{controller=\"peerwasm-adapt-7\"} 1",
            "peerwasm_adapt_submitted_total{controller=\"peerwasm-adapt-7\"} 5",
            "peerwasm_adapt_refused_total{controller=\"peerwasm-adapt-7\"} 2",
        ] {
            assert!(metrics.contains(line), "{line} missing:\n{metrics}");
        }
        assert!(metrics.ends_with("# EOF\n"));
    }
}
