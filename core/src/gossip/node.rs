//! [`GossipNode`]: one node's gossip state machine.
//!
//! It owns no socket, clock or random source: the caller says what time it
//! is, supplies the randomness, carries the messages and calls the handlers.
//! A round, as the HTTP transport runs it (and the simulation does):
//!
//! ```text
//! initiator                                   peer
//! tick(now); choose_peers(rng, now)
//! syn()                        ── Syn ──▶     handle_syn(syn, now)
//! handle_syn_ack(ack, now)     ◀─ SynAck ──
//!                              ── Ack ──▶     handle_ack(ack, now)
//! ```

use rand::Rng;
use rand::seq::IndexedRandom;

use super::failure::{FailureDetector, FailureDetectorConfig, Liveness};
use super::messages::{Ack, Syn, SynAck};
use super::state::{ClusterState, NodeId, NodeState};

/// Gossip settings. Defaults in `Default`.
#[derive(Clone, Debug)]
pub struct GossipConfig {
    /// Live peers contacted per round. Default: 3.
    pub fanout: usize,
    /// Most node states sent in one message; the stalest go first.
    /// Default: 256.
    pub max_delta: usize,
    /// Most bytes of node states in one message (postcard); the states
    /// that do not fit go in later rounds, as with `max_delta`. With the
    /// digest's bound (`max_nodes` ids) it bounds a whole message below
    /// [`MAX_MESSAGE_BYTES`], which is what a receiver reads before it has
    /// checked who sent it. Default: `MAX_DELTA_BYTES`.
    pub max_delta_bytes: usize,
    /// Chance per round of also contacting a peer believed dead, so a node
    /// that was only cut off rejoins. Default: 0.1.
    pub dead_probe_probability: f64,
    /// Chance per round of also contacting a seed, so partitions heal.
    /// Default: 0.1 (always, while no peer is known).
    pub seed_probability: f64,
    /// Addresses to join through.
    pub seeds: Vec<String>,
    /// When silence means failure.
    pub failure: FailureDetectorConfig,
    /// The most nodes this node keeps records of; states of further new
    /// nodes are dropped (a forger cannot grow the view without end).
    /// Default: 4096.
    pub max_nodes: usize,
    /// A peer dead for this long is forgotten (its record dropped), so
    /// the view does not keep every address that ever gossiped. Default:
    /// 10 minutes.
    pub forget_dead_after_ms: u64,
}

/// Checks a gossiped record before it enters the view; `Err` says why it
/// was dropped.
pub type RecordCheck<R> = fn(&R) -> Result<(), String>;

/// The longest node address accepted, in bytes.
pub const MAX_ADDR_LEN: usize = 256;

/// The default bound on the node states of one message, in bytes.
pub const MAX_DELTA_BYTES: usize = 1 << 20;

/// The largest gossip message a node sends, in bytes: a digest of at most
/// 4,096 ids of at most `MAX_ADDR_LEN` bytes (1.1 MiB), node states of
/// at most `MAX_DELTA_BYTES`, and the MAC's envelope — rounded up. A
/// receiver reads no more than this of a body before its MAC is checked.
pub const MAX_MESSAGE_BYTES: usize = 3 << 20;

impl Default for GossipConfig {
    fn default() -> Self {
        GossipConfig {
            fanout: 3,
            max_delta: 256,
            max_delta_bytes: MAX_DELTA_BYTES,
            dead_probe_probability: 0.1,
            seed_probability: 0.1,
            seeds: Vec::new(),
            failure: FailureDetectorConfig::default(),
            max_nodes: 4096,
            forget_dead_after_ms: 600_000,
        }
    }
}

/// One node of the gossip; see the module docs.
pub struct GossipNode<R> {
    id: NodeId,
    config: GossipConfig,
    state: ClusterState<R>,
    detector: FailureDetector,
    check: Option<RecordCheck<R>>,
    /// States dropped: invalid, or beyond `max_nodes`.
    dropped: u64,
    /// Addresses to contact in the next round, whoever else is chosen:
    /// members found outside gossip (a pool directory), so that workers
    /// that started together, each alone, merge into one pool at once.
    introductions: Vec<String>,
}

impl<R: Clone> GossipNode<R> {
    /// A node publishing `record`, knowing nobody yet.
    pub fn new(id: NodeId, record: R, config: GossipConfig) -> GossipNode<R> {
        let mut state = ClusterState::default();
        state.set(
            id.clone(),
            NodeState {
                record,
                version: 1,
                heartbeat: 1,
            },
        );
        let detector = FailureDetector::new(config.failure.clone());
        GossipNode {
            id,
            config,
            state,
            detector,
            check: None,
            dropped: 0,
            introductions: Vec::new(),
        }
    }

    /// Records from peers must pass `check` to enter the view.
    pub fn with_check(mut self, check: RecordCheck<R>) -> GossipNode<R> {
        self.check = Some(check);
        self
    }

    /// States received and dropped: invalid records, over-long addresses,
    /// new nodes beyond `max_nodes`.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Forgets peers that have been dead longer than
    /// `forget_dead_after_ms`; they come back if they gossip again.
    pub fn forget_dead(&mut self, now_ms: u64) {
        let forget: Vec<NodeId> = self
            .state
            .iter()
            .filter(|(id, _)| **id != self.id)
            .filter(|(id, _)| {
                self.detector.liveness(id, now_ms) == Some(Liveness::Dead)
                    && self.detector.silent_ms(id, now_ms).unwrap_or(0)
                        > self.config.forget_dead_after_ms
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in forget {
            self.state.remove(&id);
            self.detector.forget(&id);
        }
    }

    /// This node's id.
    pub fn id(&self) -> &NodeId {
        &self.id
    }

    /// What this node knows of everyone, itself included.
    pub fn state(&self) -> &ClusterState<R> {
        &self.state
    }

    fn own(&self) -> &NodeState<R> {
        self.state
            .get(&self.id)
            .expect("a node always knows itself")
    }

    /// Publishes a new record for this node.
    pub fn set_record(&mut self, record: R) {
        let own = self.own();
        let next = NodeState {
            record,
            version: own.version + 1,
            heartbeat: own.heartbeat,
        };
        self.state.set(self.id.clone(), next);
    }

    /// Starts a round: bumps this node's heartbeat.
    pub fn tick(&mut self) {
        let own = self.own().clone();
        let next = NodeState {
            version: own.version + 1,
            heartbeat: own.heartbeat + 1,
            ..own
        };
        self.state.set(self.id.clone(), next);
    }

    /// What this node believes of `id` at `now_ms` (itself: alive).
    pub fn liveness(&self, id: &NodeId, now_ms: u64) -> Option<Liveness> {
        if *id == self.id {
            return Some(Liveness::Alive);
        }
        self.detector.liveness(id, now_ms)
    }

    /// Milliseconds since `id`'s heartbeat last advanced here (0 for itself).
    pub fn silent_ms(&self, id: &NodeId, now_ms: u64) -> u64 {
        if *id == self.id {
            return 0;
        }
        self.detector.silent_ms(id, now_ms).unwrap_or(0)
    }

    /// Peers (not this node) with their state and liveness.
    pub fn peers(&self, now_ms: u64) -> impl Iterator<Item = (&NodeId, &NodeState<R>, Liveness)> {
        self.state
            .iter()
            .filter(move |(id, _)| **id != self.id)
            .map(move |(id, s)| {
                (
                    id,
                    s,
                    self.detector
                        .liveness(id, now_ms)
                        .unwrap_or(Liveness::Alive),
                )
            })
    }

    /// The addresses to gossip with this round: `fanout` random live peers,
    /// sometimes a dead one, sometimes a seed (always a seed while no live
    /// peer is known).
    pub fn choose_peers(&self, rng: &mut impl Rng, now_ms: u64) -> Vec<String> {
        let mut live = Vec::new();
        let mut dead = Vec::new();
        for (id, _, liveness) in self.peers(now_ms) {
            match liveness {
                Liveness::Dead => dead.push(id.addr.as_str()),
                _ => live.push(id.addr.as_str()),
            }
        }
        let mut out: Vec<String> = live
            .choose_multiple(rng, self.config.fanout)
            .map(|a| a.to_string())
            .collect();
        if !dead.is_empty() && rng.random_bool(self.config.dead_probe_probability) {
            out.extend(dead.choose(rng).map(|a| a.to_string()));
        }
        let seeds: Vec<&String> = self
            .config
            .seeds
            .iter()
            .filter(|s| **s != self.id.addr)
            .collect();
        if !seeds.is_empty() && (live.is_empty() || rng.random_bool(self.config.seed_probability)) {
            let seed = (*seeds.choose(rng).expect("not empty")).clone();
            if !out.contains(&seed) {
                out.push(seed);
            }
        }
        out
    }

    /// Has the next round contact `addr` if it is not a peer already (nor
    /// this node): how a member found outside gossip joins the view. At
    /// most `fanout` × 4 wait at once.
    pub fn introduce(&mut self, addr: &str) {
        let known = addr == self.id.addr || self.state.iter().any(|(id, _)| id.addr == addr);
        if !known
            && !self.introductions.iter().any(|a| a == addr)
            && self.introductions.len() < self.config.fanout.max(1) * 4
        {
            self.introductions.push(addr.to_string());
        }
    }

    /// The introductions waiting, taken by the round that contacts them.
    pub fn take_introductions(&mut self) -> Vec<String> {
        std::mem::take(&mut self.introductions)
    }

    /// The round opener.
    pub fn syn(&self) -> Syn {
        Syn {
            digest: self.state.digest(),
        }
    }

    /// Answers a round opener.
    pub fn handle_syn(&mut self, syn: Syn) -> SynAck<R>
    where
        R: serde::Serialize,
    {
        SynAck {
            delta: self.state.delta_for(
                &syn.digest,
                self.config.max_delta,
                self.config.max_delta_bytes,
            ),
            digest: self.state.digest(),
        }
    }

    /// Takes the answer; returns what the peer lacks.
    pub fn handle_syn_ack(&mut self, ack: SynAck<R>, now_ms: u64) -> Ack<R>
    where
        R: serde::Serialize,
    {
        self.apply(ack.delta, now_ms);
        Ack {
            delta: self.state.delta_for(
                &ack.digest,
                self.config.max_delta,
                self.config.max_delta_bytes,
            ),
        }
    }

    /// Takes the last message of a round.
    pub fn handle_ack(&mut self, ack: Ack<R>, now_ms: u64) {
        self.apply(ack.delta, now_ms);
    }

    fn apply(&mut self, delta: Vec<(NodeId, NodeState<R>)>, now_ms: u64) {
        let received = delta.len();
        let mut room = self.config.max_nodes.saturating_sub(self.state.len());
        let delta: Vec<_> = delta
            .into_iter()
            // Never let others rewrite what this node says about itself.
            .filter(|(id, _)| id.addr != self.id.addr)
            .filter(|(id, s)| {
                id.addr.len() <= MAX_ADDR_LEN
                    && self.check.is_none_or(|check| check(&s.record).is_ok())
            })
            .filter(|(id, _)| {
                let known = self.state.knows_addr(&id.addr);
                let fits = known || room > 0;
                if fits && !known {
                    room -= 1;
                }
                fits
            })
            .collect();
        self.dropped += (received - delta.len()) as u64;
        for id in self.state.apply(delta) {
            let heartbeat = self.state.get(&id).expect("just applied").heartbeat;
            self.detector.observe(&id, heartbeat, now_ms);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(record: i64, version: u64) -> NodeState<i64> {
        NodeState {
            record,
            version,
            heartbeat: version,
        }
    }

    fn non_negative(r: &i64) -> Result<(), String> {
        if *r >= 0 {
            Ok(())
        } else {
            Err(format!("{r} < 0"))
        }
    }

    #[test]
    fn invalid_records_and_nodes_past_the_bound_are_dropped_and_counted() {
        let config = GossipConfig {
            max_nodes: 3,
            ..GossipConfig::default()
        };
        let mut node = GossipNode::new(NodeId::new("me", 1), 0i64, config).with_check(non_negative);
        let delta = vec![
            (NodeId::new("a", 1), state(5, 1)),
            (NodeId::new("forged", 1), state(-1, 1)),
            (NodeId::new("x".repeat(MAX_ADDR_LEN + 1), 1), state(1, 1)),
            (NodeId::new("b", 1), state(7, 1)),
            (NodeId::new("c", 1), state(9, 1)), // a 4th node: past the bound
        ];
        node.handle_ack(Ack { delta }, 0);
        let known: Vec<&str> = node
            .state()
            .iter()
            .map(|(id, _)| id.addr.as_str())
            .collect();
        assert_eq!(known, ["a", "b", "me"]);
        assert_eq!(node.dropped(), 3);
        // A newer state of a known node still enters; a forged one does not.
        node.handle_ack(
            Ack {
                delta: vec![
                    (NodeId::new("a", 1), state(6, 2)),
                    (NodeId::new("b", 1), state(-5, 2)),
                ],
            },
            0,
        );
        assert_eq!(node.state().get(&NodeId::new("a", 1)).unwrap().record, 6);
        assert_eq!(node.state().get(&NodeId::new("b", 1)).unwrap().record, 7);
    }

    #[test]
    fn peers_dead_long_enough_are_forgotten() {
        let failure = FailureDetectorConfig {
            initial_interval_ms: 100,
            ..FailureDetectorConfig::default()
        };
        let config = GossipConfig {
            forget_dead_after_ms: 5_000,
            failure,
            ..GossipConfig::default()
        };
        let mut node = GossipNode::new(NodeId::new("me", 1), 0i64, config);
        node.handle_ack(
            Ack {
                delta: vec![(NodeId::new("gone", 1), state(1, 1))],
            },
            0,
        );
        node.forget_dead(2_000); // dead (silent > 10 intervals) but not for long
        assert!(node.state().knows_addr("gone"));
        node.forget_dead(6_000);
        assert!(!node.state().knows_addr("gone"));
        assert!(node.state().knows_addr("me"), "a node never forgets itself");
    }

    #[test]
    fn members_found_outside_gossip_are_contacted_once_unless_known() {
        let config = GossipConfig {
            fanout: 1,
            ..GossipConfig::default()
        };
        let mut node = GossipNode::new(NodeId::new("me", 1), 0i64, config);
        node.handle_ack(
            Ack {
                delta: vec![(NodeId::new("known", 1), state(1, 1))],
            },
            0,
        );
        for addr in ["me", "known", "new-a", "new-a", "new-b"] {
            node.introduce(addr);
        }
        assert_eq!(node.take_introductions(), ["new-a", "new-b"]);
        assert!(node.take_introductions().is_empty(), "taken by one round");
        for i in 0..10 {
            node.introduce(&format!("n{i}"));
        }
        assert_eq!(node.take_introductions().len(), 4, "bounded by fanout x 4");
    }
}
