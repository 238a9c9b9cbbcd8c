//! The node table: each node's latest record with its version, and the
//! digest/delta arithmetic of anti-entropy.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A node's identity: its address plus a generation that changes when the
/// node restarts, so records of a restarted node supersede the old ones even
/// though its versions start again from 1.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeId {
    /// Where the node is reached (`host:port`).
    pub addr: String,
    /// Start time of the node process (e.g. ms since the epoch).
    pub generation: u64,
}

impl NodeId {
    pub fn new(addr: impl Into<String>, generation: u64) -> NodeId {
        NodeId {
            addr: addr.into(),
            generation,
        }
    }
}

/// One node's published state: its record, the version of this record and
/// its heartbeat. Only the owner changes it; every change bumps `version`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeState<R> {
    /// What the node advertises.
    pub record: R,
    /// Bumped on every change, heartbeats included.
    pub version: u64,
    /// Bumped by the owner once per gossip round: proof of life.
    pub heartbeat: u64,
}

/// A digest: the version this side has of every node it knows.
pub type Digest = BTreeMap<NodeId, u64>;

/// Every node's latest state, as known here.
#[derive(Clone, Debug)]
pub struct ClusterState<R> {
    nodes: BTreeMap<NodeId, NodeState<R>>,
}

impl<R> Default for ClusterState<R> {
    fn default() -> Self {
        ClusterState {
            nodes: BTreeMap::new(),
        }
    }
}

impl<R: Clone> ClusterState<R> {
    /// The state of `id`, if known.
    pub fn get(&self, id: &NodeId) -> Option<&NodeState<R>> {
        self.nodes.get(id)
    }

    /// Every known node.
    pub fn iter(&self) -> impl Iterator<Item = (&NodeId, &NodeState<R>)> {
        self.nodes.iter()
    }

    /// How many nodes are known.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether no node is known.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Forgets a node.
    pub fn remove(&mut self, id: &NodeId) {
        self.nodes.remove(id);
    }

    /// Whether any generation of the node at `addr` is known.
    pub fn knows_addr(&self, addr: &str) -> bool {
        self.nodes
            .range(NodeId::new(addr, 0)..)
            .next()
            .is_some_and(|(id, _)| id.addr == addr)
    }

    /// Sets a node's state outright (the owner, for itself).
    pub fn set(&mut self, id: NodeId, state: NodeState<R>) {
        self.nodes.insert(id, state);
    }

    /// The digest of what is known here.
    pub fn digest(&self) -> Digest {
        self.nodes
            .iter()
            .map(|(id, s)| (id.clone(), s.version))
            .collect()
    }

    /// The states the holder of `theirs` lacks or has older, stalest first
    /// (most versions behind), at most `max` of them and `max_bytes` of
    /// their encoding. A node whose older generation the other side holds
    /// is sent too.
    pub fn delta_for(
        &self,
        theirs: &Digest,
        max: usize,
        max_bytes: usize,
    ) -> Vec<(NodeId, NodeState<R>)>
    where
        R: serde::Serialize,
    {
        let mut out: Vec<(u64, &NodeId, &NodeState<R>)> = self
            .nodes
            .iter()
            .filter_map(|(id, s)| match theirs.get(id) {
                Some(&v) if v >= s.version => None,
                Some(&v) => Some((s.version - v, id, s)),
                None => Some((s.version, id, s)),
            })
            .collect();
        out.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
        let mut bytes = 0usize;
        out.into_iter()
            .take(max)
            .take_while(|(_, id, s)| {
                let size =
                    postcard::serialize_with_flavor::<_, postcard::ser_flavors::Size, usize>(
                        &(*id, *s),
                        postcard::ser_flavors::Size::default(),
                    )
                    .unwrap_or(usize::MAX);
                bytes = bytes.saturating_add(size);
                bytes <= max_bytes
            })
            .map(|(_, id, s)| (id.clone(), s.clone()))
            .collect()
    }

    /// Takes what is newer in `delta`; returns the ids that changed. A
    /// state of an older generation of a node known in a newer one is
    /// ignored; a newer generation replaces the older one.
    pub fn apply(&mut self, delta: Vec<(NodeId, NodeState<R>)>) -> Vec<NodeId> {
        let mut changed = Vec::new();
        for (id, state) in delta {
            let newer_generation_known = self
                .nodes
                .range(NodeId::new(id.addr.clone(), id.generation + 1)..)
                .next()
                .is_some_and(|(other, _)| other.addr == id.addr);
            if newer_generation_known {
                continue;
            }
            match self.nodes.get(&id) {
                Some(have) if have.version >= state.version => {}
                _ => {
                    // Drop older generations of the same address (ids sort
                    // by address, then generation).
                    let older: Vec<NodeId> = self
                        .nodes
                        .range(NodeId::new(id.addr.clone(), 0)..id.clone())
                        .map(|(other, _)| other.clone())
                        .collect();
                    for other in older {
                        self.nodes.remove(&other);
                    }
                    self.nodes.insert(id.clone(), state);
                    changed.push(id);
                }
            }
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st(version: u64) -> NodeState<u32> {
        NodeState {
            record: version as u32,
            version,
            heartbeat: version,
        }
    }

    #[test]
    fn delta_sends_what_is_missing_or_newer_stalest_first() {
        let mut s = ClusterState::default();
        s.set(NodeId::new("a", 1), st(5));
        s.set(NodeId::new("b", 1), st(9));
        s.set(NodeId::new("c", 1), st(2));
        let theirs: Digest = [(NodeId::new("a", 1), 5), (NodeId::new("b", 1), 1)].into();
        let d = s.delta_for(&theirs, 10, usize::MAX);
        let ids: Vec<_> = d.iter().map(|(id, _)| id.addr.as_str()).collect();
        assert_eq!(ids, ["b", "c"]);
        assert_eq!(s.delta_for(&theirs, 1, usize::MAX).len(), 1);
    }

    #[test]
    fn delta_stays_within_its_byte_bound() {
        let mut s = ClusterState::default();
        for i in 0..100 {
            s.set(NodeId::new(format!("node-{i:03}"), 1), st(i + 1));
        }
        let one = postcard::to_allocvec(&(NodeId::new("node-000", 1), st(1)))
            .unwrap()
            .len();
        let d = s.delta_for(&Digest::default(), 256, 10 * one + one / 2);
        assert_eq!(d.len(), 10, "ten states of {one} bytes fit");
        let encoded = postcard::to_allocvec(&d).unwrap().len();
        assert!(encoded <= 10 * one + 8, "{encoded} bytes");
        // The stalest still go first.
        assert_eq!(d[0].0.addr, "node-099");
    }

    #[test]
    fn apply_keeps_the_newest_and_the_newest_generation() {
        let mut s = ClusterState::default();
        s.set(NodeId::new("a", 1), st(5));
        assert!(s.apply(vec![(NodeId::new("a", 1), st(3))]).is_empty());
        assert_eq!(s.apply(vec![(NodeId::new("a", 1), st(7))]).len(), 1);
        // The node restarted: generation 2 replaces generation 1.
        assert_eq!(s.apply(vec![(NodeId::new("a", 2), st(1))]).len(), 1);
        assert_eq!(s.len(), 1);
        // A late record of generation 1 is ignored.
        assert!(s.apply(vec![(NodeId::new("a", 1), st(50))]).is_empty());
        assert_eq!(s.get(&NodeId::new("a", 2)).unwrap().version, 1);
    }
}
