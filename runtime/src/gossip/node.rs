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
}

impl Default for GossipConfig {
    fn default() -> Self {
        GossipConfig {
            fanout: 3,
            max_delta: 256,
            dead_probe_probability: 0.1,
            seed_probability: 0.1,
            seeds: Vec::new(),
            failure: FailureDetectorConfig::default(),
        }
    }
}

/// One node of the gossip; see the module docs.
pub struct GossipNode<R> {
    id: NodeId,
    config: GossipConfig,
    state: ClusterState<R>,
    detector: FailureDetector,
}

impl<R: Clone> GossipNode<R> {
    /// A node publishing `record`, knowing nobody yet.
    pub fn new(id: NodeId, record: R, config: GossipConfig) -> GossipNode<R> {
        let mut state = ClusterState::default();
        state.set(id.clone(), NodeState { record, version: 1, heartbeat: 1 });
        let detector = FailureDetector::new(config.failure.clone());
        GossipNode { id, config, state, detector }
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
        self.state.get(&self.id).expect("a node always knows itself")
    }

    /// Publishes a new record for this node.
    pub fn set_record(&mut self, record: R) {
        let own = self.own();
        let next = NodeState { record, version: own.version + 1, heartbeat: own.heartbeat };
        self.state.set(self.id.clone(), next);
    }

    /// Starts a round: bumps this node's heartbeat.
    pub fn tick(&mut self) {
        let own = self.own().clone();
        let next = NodeState { version: own.version + 1, heartbeat: own.heartbeat + 1, ..own };
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
        self.state.iter().filter(move |(id, _)| **id != self.id).map(move |(id, s)| {
            (id, s, self.detector.liveness(id, now_ms).unwrap_or(Liveness::Alive))
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
        let mut out: Vec<String> =
            live.choose_multiple(rng, self.config.fanout).map(|a| a.to_string()).collect();
        if !dead.is_empty() && rng.random_bool(self.config.dead_probe_probability) {
            out.extend(dead.choose(rng).map(|a| a.to_string()));
        }
        let seeds: Vec<&String> = self.config.seeds.iter().filter(|s| **s != self.id.addr).collect();
        if !seeds.is_empty() && (live.is_empty() || rng.random_bool(self.config.seed_probability)) {
            let seed = (*seeds.choose(rng).expect("not empty")).clone();
            if !out.contains(&seed) {
                out.push(seed);
            }
        }
        out
    }

    /// The round opener.
    pub fn syn(&self) -> Syn {
        Syn { digest: self.state.digest() }
    }

    /// Answers a round opener.
    pub fn handle_syn(&mut self, syn: Syn) -> SynAck<R> {
        SynAck { delta: self.state.delta_for(&syn.digest, self.config.max_delta), digest: self.state.digest() }
    }

    /// Takes the answer; returns what the peer lacks.
    pub fn handle_syn_ack(&mut self, ack: SynAck<R>, now_ms: u64) -> Ack<R> {
        self.apply(ack.delta, now_ms);
        Ack { delta: self.state.delta_for(&ack.digest, self.config.max_delta) }
    }

    /// Takes the last message of a round.
    pub fn handle_ack(&mut self, ack: Ack<R>, now_ms: u64) {
        self.apply(ack.delta, now_ms);
    }

    fn apply(&mut self, delta: Vec<(NodeId, NodeState<R>)>, now_ms: u64) {
        // Never let others rewrite what this node says about itself.
        let delta = delta.into_iter().filter(|(id, _)| id.addr != self.id.addr).collect();
        for id in self.state.apply(delta) {
            let heartbeat = self.state.get(&id).expect("just applied").heartbeat;
            self.detector.observe(&id, heartbeat, now_ms);
        }
    }
}
