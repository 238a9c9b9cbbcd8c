//! [`MemoryTransport`]: gossip carried in memory between nodes of one
//! process, for tests of the shell around the core — sealing, the
//! exchange, the counters, the round — without sockets or real time (each
//! node can run on a [`GossipClock::Manual`](super::transport::GossipClock)).
//! The core's own properties at scale are `simulation`'s.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use futures::future::BoxFuture;
use parking_lot::Mutex;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::transport::{GossipTransport, SharedNode};

/// Nodes by address; a request to an address is handled by that node's
/// [`SharedNode::handle`], as the HTTP handler does.
pub struct MemoryTransport<R> {
    nodes: Mutex<HashMap<String, Arc<SharedNode<R>>>>,
    cut: Mutex<HashSet<String>>,
}

impl<R> Default for MemoryTransport<R> {
    fn default() -> Self {
        MemoryTransport {
            nodes: Mutex::new(HashMap::new()),
            cut: Mutex::new(HashSet::new()),
        }
    }
}

impl<R> MemoryTransport<R> {
    /// Makes `node` reachable at `addr`.
    pub fn add(&self, addr: &str, node: Arc<SharedNode<R>>) {
        self.nodes.lock().insert(addr.to_string(), node);
    }

    /// Cuts `addr` off (`true`) or heals it: while cut, requests to it fail
    /// as to a dead machine.
    pub fn set_cut(&self, addr: &str, cut: bool) {
        let mut set = self.cut.lock();
        if cut {
            set.insert(addr.to_string());
        } else {
            set.remove(addr);
        }
    }
}

impl<R> GossipTransport for MemoryTransport<R>
where
    R: Clone + Serialize + DeserializeOwned + Send + Sync,
{
    fn post<'a>(&'a self, addr: &'a str, body: Vec<u8>) -> BoxFuture<'a, Result<Vec<u8>, String>> {
        let reply = match (
            self.cut.lock().contains(addr),
            self.nodes.lock().get(addr).cloned(),
        ) {
            (false, Some(node)) => node.handle(&body).map_err(|e| e.to_string()),
            _ => Err(format!("{addr}: connection refused")),
        };
        Box::pin(async move { reply })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    use super::*;
    use crate::gossip::auth::ClusterKey;
    use crate::gossip::transport::{GossipClock, round};
    use crate::gossip::{GossipConfig, GossipNode, Liveness, NodeId};

    const ROUND_MS: u64 = 1000;

    /// `n` nodes (`n0`…) on a manual clock, all joining through `n0`,
    /// each sealing with `key(i)`.
    fn pool(
        n: usize,
        key: impl Fn(usize) -> Option<ClusterKey>,
    ) -> (Arc<MemoryTransport<u64>>, Vec<Arc<SharedNode<u64>>>) {
        let transport = Arc::new(MemoryTransport::default());
        let config = GossipConfig {
            seeds: vec!["n0".into()],
            ..GossipConfig::default()
        };
        let nodes: Vec<_> = (0..n)
            .map(|i| {
                let node = GossipNode::new(
                    NodeId::new(format!("n{i}"), 1),
                    i as u64 * 100,
                    config.clone(),
                );
                let shared =
                    SharedNode::with_clock(node, key(i), GossipClock::Manual(Default::default()));
                transport.add(&format!("n{i}"), shared.clone());
                shared
            })
            .collect();
        (transport, nodes)
    }

    /// One round of every node, then a second of everyone's clock.
    async fn rounds(
        transport: &MemoryTransport<u64>,
        nodes: &[Arc<SharedNode<u64>>],
        k: usize,
        rng: &mut SmallRng,
    ) {
        for _ in 0..k {
            for node in nodes {
                round(node, transport, rng, &mut |_: &mut GossipNode<u64>| {}).await;
            }
            for node in nodes {
                node.clock().advance(ROUND_MS);
            }
        }
    }

    fn knows(node: &SharedNode<u64>) -> usize {
        node.lock().state().len()
    }

    #[tokio::test]
    async fn nodes_join_through_a_seed_and_learn_each_others_records() {
        let (transport, nodes) = pool(5, |_| None);
        let mut rng = SmallRng::seed_from_u64(7);
        rounds(&transport, &nodes, 6, &mut rng).await;
        for node in &nodes {
            assert_eq!(knows(node), 5, "everyone knows everyone");
            let mut records: Vec<u64> = node
                .lock()
                .state()
                .iter()
                .map(|(_, state)| state.record)
                .collect();
            records.sort();
            assert_eq!(
                records,
                [0, 100, 200, 300, 400],
                "every node's record, as it published it"
            );
            assert!(node.stats.exchanges_ok.load(Ordering::Relaxed) > 0);
            assert_eq!(node.stats.exchanges_failed.load(Ordering::Relaxed), 0);
            assert!(node.stats.bytes_sent.load(Ordering::Relaxed) > 0);
        }
    }

    #[tokio::test]
    async fn a_node_cut_off_is_counted_failing_then_seen_dead_and_rejoins_when_healed() {
        let (transport, nodes) = pool(4, |_| None);
        let mut rng = SmallRng::seed_from_u64(11);
        rounds(&transport, &nodes, 6, &mut rng).await;
        let (live, cut) = (&nodes[..3], &nodes[3]);
        let id = cut.lock().id().clone();
        assert_eq!(
            live[0].lock().liveness(&id, live[0].now_ms()),
            Some(Liveness::Alive)
        );

        transport.set_cut("n3", true);
        // Only the live ones run rounds: the cut node's heartbeat stalls.
        rounds(&transport, live, 15, &mut rng).await;
        for node in live {
            assert_eq!(
                node.lock().liveness(&id, node.now_ms()),
                Some(Liveness::Dead),
                "ten silent intervals: dead"
            );
        }
        let failed: u64 = live
            .iter()
            .map(|n| n.stats.exchanges_failed.load(Ordering::Relaxed))
            .sum();
        assert!(
            failed > 0,
            "exchanges with the cut node fail and are counted"
        );

        transport.set_cut("n3", false);
        rounds(&transport, &nodes, 6, &mut rng).await;
        for node in live {
            assert_eq!(
                node.lock().liveness(&id, node.now_ms()),
                Some(Liveness::Alive),
                "healed: alive again"
            );
        }
    }

    #[tokio::test]
    async fn a_node_with_another_cluster_key_is_never_heard() {
        let key = |i: usize| {
            Some(
                ClusterKey::new(if i == 2 {
                    *b"the-wrong-key-0123456789"
                } else {
                    *b"the-pool-key-0123456789!"
                })
                .unwrap(),
            )
        };
        let (transport, nodes) = pool(3, key);
        let mut rng = SmallRng::seed_from_u64(3);
        rounds(&transport, &nodes, 6, &mut rng).await;
        assert_eq!(knows(&nodes[0]), 2, "n0 knows n1, never n2");
        assert_eq!(knows(&nodes[1]), 2);
        assert_eq!(knows(&nodes[2]), 1, "n2 knows only itself");
        assert!(
            nodes[0].stats.forged.load(Ordering::Relaxed) > 0,
            "n2's messages are counted forged"
        );
    }
}
