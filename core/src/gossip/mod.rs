//! Membership and capacity adverts: anti-entropy gossip, Scuttlebutt style.
//!
//! Every node publishes one versioned record about itself and keeps the
//! latest record of every peer. A round is one push-pull exchange with a few
//! peers: the initiator sends a digest (node → version), the peer answers
//! with what the initiator lacks plus its own digest, and the initiator
//! pushes back what the peer lacks. A heartbeat in every record shows that
//! its owner is alive; a failure detector turns a stalled heartbeat into
//! *suspect*, then *dead*.
//!
//! Layout (one concept per file, as chitchat does):
//! * `state` — the node table: records, versions, digests and deltas;
//! * `messages` — what travels between nodes;
//! * `failure` — the heartbeat-interval failure detector;
//! * `node` — [`GossipNode`]: one node's state machine, driven by the
//!   caller with the time and the randomness, so that it can be simulated
//!   in one process (see the tests) and carried over any transport;
//! * [`auth`] — the HMAC envelope under a cluster key (forged and replayed
//!   messages are dropped);
//! * [`transport`] — the shell: a node shared by the request handler and
//!   the round loop, sealed messages, one round over a
//!   [`GossipTransport`](transport::GossipTransport) (HTTP: `POST /v1/gossip`);
//! * `memory` — the same rounds carried in memory, for tests;
//! * `view` — [`PeerView`]: one peer as a worker sees it (`GET /v1/peers`),
//!   and the pool drawn as a table;
//! * [`simulation`] — many nodes in one process, for tests and benchmarks.
//!
//! Why our own and not chitchat, foca or memberlist: docs/gossip.md.

pub mod auth;
pub(crate) mod failure;
#[cfg(test)]
pub(crate) mod memory;
pub(crate) mod messages;
pub(crate) mod node;
pub(crate) mod state;
pub mod transport;
pub(crate) mod view;

pub use failure::{FailureDetectorConfig, Liveness};
pub use messages::{Ack, Syn, SynAck};
pub use node::{GossipConfig, GossipNode, MAX_MESSAGE_BYTES};
pub use state::{NodeId, NodeState};
pub use view::{PeerView, peers_table};

pub mod simulation;
