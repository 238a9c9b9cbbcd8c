//! Warnings to the worker's operator (seeds/003: a memory-tracking network
//! should alert node operators): host memory below the reserve, jobs refused
//! for memory, a cgroup limit below `--memory`. Each is logged when it
//! starts, counted by kind for `/metrics`, and kept for a while so that the
//! advert (and `peerwasm status`, and the status page) can show it.

use parking_lot::Mutex;
use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

/// How long a passing warning stays on show.
pub const SHOWN_FOR: Duration = Duration::from_secs(60);
/// How many recent warnings are kept.
const KEPT: usize = 20;

/// What a warning is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum WarningKind {
    /// The host's available memory fell below `--reserve`.
    HostMemoryLow,
    /// A job was refused because it could never fit here.
    RefusedForMemory,
    /// The cgroup's limit (a Slurm job's, say) is below `--memory`.
    CgroupBelowMemory,
    /// `--memory` is more than physical memory less `--reserve`.
    MemoryAbovePhysical,
}

impl WarningKind {
    /// The label used in `/metrics`.
    pub fn label(self) -> &'static str {
        match self {
            WarningKind::HostMemoryLow => "host_memory_low",
            WarningKind::RefusedForMemory => "refused_for_memory",
            WarningKind::CgroupBelowMemory => "cgroup_below_memory",
            WarningKind::MemoryAbovePhysical => "memory_above_physical",
        }
    }
}

#[derive(Default)]
struct State {
    recent: VecDeque<(WarningKind, String, Instant)>,
    /// Conditions that hold until they end (not just events).
    standing: BTreeMap<WarningKind, String>,
    counts: BTreeMap<WarningKind, u64>,
}

/// A worker's warnings.
#[derive(Default)]
pub struct Warnings {
    state: Mutex<State>,
}

impl Warnings {
    fn lock(&self) -> parking_lot::MutexGuard<'_, State> {
        self.state.lock()
    }

    /// Something happened: log, count and show it for [`SHOWN_FOR`].
    pub fn event(&self, kind: WarningKind, message: String) {
        tracing::warn!(kind = kind.label(), "{message}");
        let mut st = self.lock();
        *st.counts.entry(kind).or_default() += 1;
        st.recent.push_back((kind, message, Instant::now()));
        if st.recent.len() > KEPT {
            st.recent.pop_front();
        }
    }

    /// A condition holds (`Some`) or has ended (`None`); logged and counted
    /// when it starts, shown while it holds.
    pub fn condition(&self, kind: WarningKind, message: Option<String>) {
        let mut st = self.lock();
        match message {
            Some(m) => {
                if !st.standing.contains_key(&kind) {
                    tracing::warn!(kind = kind.label(), "{m}");
                    *st.counts.entry(kind).or_default() += 1;
                }
                st.standing.insert(kind, m);
            }
            None => {
                if st.standing.remove(&kind).is_some() {
                    tracing::info!(kind = kind.label(), "no longer: {}", kind.label());
                }
            }
        }
    }

    /// What to show now: standing conditions, then recent events.
    pub fn current(&self) -> Vec<String> {
        let mut st = self.lock();
        st.recent.retain(|(_, _, at)| at.elapsed() < SHOWN_FOR);
        st.standing
            .values()
            .cloned()
            .chain(st.recent.iter().map(|(_, m, _)| m.clone()))
            .collect()
    }

    /// How many times each kind was raised.
    pub fn counts(&self) -> Vec<(WarningKind, u64)> {
        self.lock().counts.iter().map(|(k, n)| (*k, *n)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_and_conditions_are_counted_and_shown() {
        let w = Warnings::default();
        w.event(WarningKind::RefusedForMemory, "refused a 9 GiB job".into());
        w.condition(WarningKind::HostMemoryLow, Some("low".into()));
        w.condition(WarningKind::HostMemoryLow, Some("still low".into()));
        assert_eq!(w.current(), ["still low", "refused a 9 GiB job"]);
        assert_eq!(
            w.counts(),
            [
                (WarningKind::HostMemoryLow, 1),
                (WarningKind::RefusedForMemory, 1)
            ]
        );
        w.condition(WarningKind::HostMemoryLow, None);
        assert_eq!(w.current(), ["refused a 9 GiB job"]);
    }
}
