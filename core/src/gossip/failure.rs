//! The failure detector: a peer whose heartbeat has not advanced for k times
//! its mean observed interval is suspect, and later dead.
//!
//! Intervals are measured here, between heartbeat changes *as seen by this
//! node*, so they include gossip's propagation delay: a node far away in the
//! gossip graph gets proportionally more slack. Time is passed in (ms from
//! any origin), so tests are deterministic.

use std::collections::{HashMap, VecDeque};

use super::state::NodeId;

/// How quickly silence becomes suspicion. Defaults in `Default`.
#[derive(Clone, Debug)]
pub struct FailureDetectorConfig {
    /// Silence longer than this many mean intervals makes a peer suspect.
    /// Default: 5.
    pub suspect_after: f64,
    /// Silence longer than this many mean intervals makes a peer dead.
    /// Default: 10.
    pub dead_after: f64,
    /// The interval assumed before any has been observed, in ms.
    /// Default: 1000 (the default gossip round).
    pub initial_interval_ms: u64,
    /// How many recent intervals the mean is taken over. Default: 16.
    pub window: usize,
}

impl Default for FailureDetectorConfig {
    fn default() -> Self {
        FailureDetectorConfig {
            suspect_after: 5.0,
            dead_after: 10.0,
            initial_interval_ms: 1000,
            window: 16,
        }
    }
}

/// What this node believes about a peer.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Liveness {
    Alive,
    Suspect,
    Dead,
}

#[derive(Debug)]
struct PeerClock {
    heartbeat: u64,
    last_change_ms: u64,
    intervals: VecDeque<u64>,
}

/// Heartbeat bookkeeping for every peer.
#[derive(Debug, Default)]
pub struct FailureDetector {
    config: FailureDetectorConfig,
    peers: HashMap<NodeId, PeerClock>,
}

impl FailureDetector {
    pub fn new(config: FailureDetectorConfig) -> FailureDetector {
        FailureDetector {
            config,
            peers: HashMap::new(),
        }
    }

    /// Records that `id`'s heartbeat is `heartbeat` at `now_ms`.
    pub fn observe(&mut self, id: &NodeId, heartbeat: u64, now_ms: u64) {
        let window = self.config.window.max(1);
        match self.peers.get_mut(id) {
            None => {
                self.peers.insert(
                    id.clone(),
                    PeerClock {
                        heartbeat,
                        last_change_ms: now_ms,
                        intervals: VecDeque::new(),
                    },
                );
            }
            Some(p) if heartbeat > p.heartbeat => {
                if p.intervals.len() == window {
                    p.intervals.pop_front();
                }
                p.intervals
                    .push_back(now_ms.saturating_sub(p.last_change_ms));
                p.heartbeat = heartbeat;
                p.last_change_ms = now_ms;
            }
            Some(_) => {}
        }
    }

    /// What is believed of `id` at `now_ms`; `None` if never heard of.
    pub fn liveness(&self, id: &NodeId, now_ms: u64) -> Option<Liveness> {
        let p = self.peers.get(id)?;
        let mean = if p.intervals.is_empty() {
            self.config.initial_interval_ms as f64
        } else {
            p.intervals.iter().sum::<u64>() as f64 / p.intervals.len() as f64
        }
        .max(1.0);
        let silent = now_ms.saturating_sub(p.last_change_ms) as f64;
        Some(if silent > self.config.dead_after * mean {
            Liveness::Dead
        } else if silent > self.config.suspect_after * mean {
            Liveness::Suspect
        } else {
            Liveness::Alive
        })
    }

    /// Milliseconds since `id`'s heartbeat last advanced, if known.
    pub fn silent_ms(&self, id: &NodeId, now_ms: u64) -> Option<u64> {
        self.peers
            .get(id)
            .map(|p| now_ms.saturating_sub(p.last_change_ms))
    }

    /// Forgets a peer (e.g. an older generation that was replaced).
    pub fn forget(&mut self, id: &NodeId) {
        self.peers.remove(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silence_turns_into_suspicion_then_death() {
        let mut d = FailureDetector::new(FailureDetectorConfig::default());
        let a = NodeId::new("a", 1);
        for (i, t) in (0..10u64).map(|i| (i, i * 1000)) {
            d.observe(&a, i, t);
        }
        assert_eq!(d.liveness(&a, 9_000), Some(Liveness::Alive));
        assert_eq!(d.liveness(&a, 13_000), Some(Liveness::Alive));
        assert_eq!(d.liveness(&a, 14_500), Some(Liveness::Suspect));
        assert_eq!(d.liveness(&a, 19_500), Some(Liveness::Dead));
        d.observe(&a, 10, 20_000);
        assert_eq!(d.liveness(&a, 20_000), Some(Liveness::Alive));
        assert_eq!(d.liveness(&NodeId::new("b", 1), 0), None);
    }
}
