//! The gossip core simulated in one process: 1,000 nodes, message loss, a
//! partition that heals, a node that dies. Deterministic (seeded RNG, a
//! round counter for a clock); message sizes are the postcard encodings the
//! HTTP transport sends. The tests below assert the protocol's properties;
//! the benchmarks (`peerwasm-benches gossip`) measure it at scale.

use std::collections::HashMap;

use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use super::*;

const ROUND_MS: u64 = 1000;

/// `n` gossip nodes in one process, exchanging messages in rounds of one
/// simulated second.
pub struct Simulation {
    nodes: Vec<GossipNode<u64>>,
    index: HashMap<String, usize>,
    rng: SmallRng,
    loss: f64,
    /// Node i can talk to node j iff `side[i] == side[j]`.
    side: Vec<u8>,
    down: Vec<bool>,
    round: u64,
    bytes_sent: u64,
}

type Sim = Simulation;

impl Simulation {
    /// `n` nodes that all join through node 0 and gossip, losing a share
    /// `loss` of messages, until everyone knows everyone (at most 60
    /// rounds); the simulation and the rounds joining took.
    pub fn joined(n: usize, loss: f64, seed: u64) -> (Simulation, u64) {
        let config = GossipConfig {
            seeds: vec![addr(0)],
            ..GossipConfig::default()
        };
        let nodes: Vec<_> = (0..n)
            .map(|i| GossipNode::new(NodeId::new(addr(i), 1), 0u64, config.clone()))
            .collect();
        let index = (0..n).map(|i| (addr(i), i)).collect();
        let mut sim = Sim {
            nodes,
            index,
            rng: SmallRng::seed_from_u64(seed),
            loss,
            side: vec![0; n],
            down: vec![false; n],
            round: 0,
            bytes_sent: 0,
        };
        let rounds = sim.run_until(60, |s| s.nodes.iter().all(|node| node.state().len() == n));
        (sim, rounds.expect("membership converges"))
    }

    /// The simulated time in milliseconds.
    pub fn now(&self) -> u64 {
        self.round * ROUND_MS
    }

    fn delivered(&mut self, from: usize, to: usize) -> bool {
        !self.down[to] && self.side[from] == self.side[to] && !self.rng.random_bool(self.loss)
    }

    /// One round: every live node, in random order, gossips with its peers.
    pub fn round(&mut self) {
        self.round += 1;
        let now = self.now();
        let mut order: Vec<usize> = (0..self.nodes.len()).filter(|&i| !self.down[i]).collect();
        order.shuffle(&mut self.rng);
        for i in order {
            self.nodes[i].tick();
            let targets = self.nodes[i].choose_peers(&mut self.rng, now);
            for target in targets {
                let j = self.index[&target];
                let syn = self.nodes[i].syn();
                self.bytes_sent += size(&syn);
                if !self.delivered(i, j) {
                    continue;
                }
                let syn_ack = self.nodes[j].handle_syn(syn);
                self.bytes_sent += size(&syn_ack);
                if !self.delivered(j, i) {
                    continue;
                }
                let ack = self.nodes[i].handle_syn_ack(syn_ack, now);
                self.bytes_sent += size(&ack);
                if self.delivered(i, j) {
                    self.nodes[j].handle_ack(ack, now);
                }
            }
        }
    }

    /// Runs rounds until `done` (at most `max`); the number of rounds it took.
    pub fn run_until(&mut self, max: u64, done: impl Fn(&Sim) -> bool) -> Option<u64> {
        for r in 1..=max {
            self.round();
            if done(self) {
                return Some(r);
            }
        }
        None
    }

    /// Node `i` changes its record; what to pass to [`share_seeing`](Self::share_seeing).
    pub fn change_record(&mut self, i: usize, record: u64) -> (NodeId, u64) {
        let id = self.nodes[i].id().clone();
        self.nodes[i].set_record(record);
        let version = self.nodes[i]
            .state()
            .get(&id)
            .expect("a node knows itself")
            .version;
        (id, version)
    }

    /// Node `i` stops: it neither sends nor answers; its identity.
    pub fn kill(&mut self, i: usize) -> NodeId {
        self.down[i] = true;
        self.nodes[i].id().clone()
    }

    /// Whether every live node believes `id` dead.
    pub fn all_declare_dead(&self, id: &NodeId) -> bool {
        let now = self.now();
        (0..self.nodes.len())
            .filter(|&i| !self.down[i])
            .all(|i| self.nodes[i].liveness(id, now) == Some(Liveness::Dead))
    }

    /// Bytes of all messages sent so far (postcard encodings).
    pub fn bytes_sent(&self) -> u64 {
        self.bytes_sent
    }

    /// Share of up nodes (other than `id`'s owner) that see `id` at `version` or newer.
    pub fn share_seeing(&self, id: &NodeId, version: u64) -> f64 {
        let up: Vec<_> = (0..self.nodes.len()).filter(|&i| !self.down[i]).collect();
        let seeing = up
            .iter()
            .filter(|&&i| {
                self.nodes[i]
                    .state()
                    .get(id)
                    .is_some_and(|s| s.version >= version)
            })
            .count();
        seeing as f64 / up.len() as f64
    }
}

fn addr(i: usize) -> String {
    format!("10.0.{}.{}:7070", i / 256, i % 256)
}

fn size<T: serde::Serialize>(msg: &T) -> u64 {
    postcard::to_allocvec(msg).expect("encodes").len() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_reaches_99_percent_of_1000_nodes_under_10_percent_loss() {
        let (mut sim, join_rounds) = Sim::joined(1000, 0.10, 7);
        println!("1,000 nodes joined through one seed in {join_rounds} rounds");
        let id = sim.nodes[500].id().clone();
        sim.nodes[500].set_record(42);
        let version = sim.nodes[500].state().get(&id).unwrap().version;
        let before = sim.bytes_sent;
        let rounds = sim
            .run_until(30, |s| s.share_seeing(&id, version) >= 0.99)
            .expect("converges");
        let per_node_round = (sim.bytes_sent - before) as f64 / (1000.0 * rounds as f64);
        println!(
            "a record change reached 99% of 1,000 nodes in {rounds} rounds; {per_node_round:.0} bytes/node/round"
        );
        assert!(rounds <= 10, "took {rounds} rounds");
    }

    #[test]
    fn a_partition_heals() {
        let (mut sim, _) = Sim::joined(200, 0.10, 11);
        // Split in two; the seed (node 0) is on side 0.
        for i in 100..200 {
            sim.side[i] = 1;
        }
        let id = sim.nodes[150].id().clone();
        sim.nodes[150].set_record(7);
        let version = sim.nodes[150].state().get(&id).unwrap().version;
        for _ in 0..15 {
            sim.round();
        }
        let seen_across = (0..100)
            .filter(|&i| sim.nodes[i].state().get(&id).unwrap().version >= version)
            .count();
        assert_eq!(seen_across, 0, "nothing crosses a partition");
        // Each side now believes the other dead.
        let now = sim.now();
        assert_eq!(sim.nodes[0].liveness(&id, now), Some(Liveness::Dead));

        sim.side.iter_mut().for_each(|s| *s = 0);
        let healed = sim
            .run_until(40, |s| s.share_seeing(&id, version) >= 1.0)
            .expect("the partition heals");
        println!("partition healed: the change crossed in {healed} rounds");
        let now = sim.now();
        assert!(
            sim.run_until(20, |s| s.nodes[0].liveness(&id, now)
                == Some(Liveness::Alive))
                .is_some()
        );
    }

    #[test]
    fn a_dead_node_is_declared_dead_everywhere() {
        let (mut sim, _) = Sim::joined(100, 0.10, 3);
        let victim = sim.nodes[42].id().clone();
        sim.down[42] = true;
        let rounds = sim
            .run_until(40, |s| {
                let now = s.now();
                (0..100)
                    .filter(|&i| !s.down[i])
                    .all(|i| s.nodes[i].liveness(&victim, now) == Some(Liveness::Dead))
            })
            .expect("everyone declares it dead");
        println!("a dead node was declared dead by all 99 others after {rounds} rounds");
        assert!(rounds >= 5, "not before the detector's threshold: {rounds}");
    }
}
