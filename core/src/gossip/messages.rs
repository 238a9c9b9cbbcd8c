//! What travels between nodes in one push-pull round. The transport carries
//! them as postcard; the core never sees bytes.

use serde::{Deserialize, Serialize};

use super::state::{Digest, NodeId, NodeState};

/// Round opener, initiator → peer: "this is what I have".
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Syn {
    pub digest: Digest,
}

/// Peer → initiator: what the initiator lacks, and what the peer has.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SynAck<R> {
    pub delta: Vec<(NodeId, NodeState<R>)>,
    pub digest: Digest,
}

/// Initiator → peer: what the peer lacks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Ack<R> {
    pub delta: Vec<(NodeId, NodeState<R>)>,
}
