//! [`PeerView`]: one peer as a worker sees it — its latest advert and what
//! gossip believes of it — as `GET /v1/peers` returns it, and the pool
//! drawn as a table (`peerwasm peers`, `GET /v1/peers`).

use serde::{Deserialize, Serialize};

use super::failure::Liveness;
use super::state::NodeId;
use crate::proto::Advert;
use crate::units::Bytes;

/// One peer as a worker sees it: `GET /v1/peers` returns a list of these.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeerView {
    /// Its gossip identity (address and generation).
    pub id: NodeId,
    /// Its latest advert.
    pub advert: Advert,
    /// What the answering worker believes of it.
    pub liveness: Liveness,
    /// Milliseconds since its heartbeat last advanced, as seen by the
    /// answering worker (0 for the answering worker itself).
    pub last_heard_ms: u64,
    /// Whether the answering worker vouches for it: it is that worker, or
    /// its advert arrived in gossip sealed with the pool's key (every
    /// worker's gossip is keyed unless started with `--insecure-gossip`).
    /// An advert anyone could have sent vouches for nothing: a client
    /// places jobs, and sends its token, only to vouched workers and those
    /// the user named.
    #[serde(default)]
    pub vouched: bool,
}

/// The pool as a table, one row per peer (FieldTrip's peerlist).
pub fn peers_table(peers: &[PeerView]) -> String {
    let mut rows = vec![
        [
            "ADDRESS",
            "HOST",
            "STATE",
            "SLOTS",
            "RESERVED/CAPACITY",
            "FITS NOW",
            "MAX TIME",
            "QUEUE",
            "JOBS",
            "HEARD",
        ]
        .map(String::from),
    ];
    let mut sorted: Vec<&PeerView> = peers.iter().collect();
    sorted.sort_by(|a, b| a.advert.addr.cmp(&b.advert.addr));
    for p in sorted {
        let a = &p.advert;
        let state = match p.liveness {
            Liveness::Alive if a.draining => "leaving",
            Liveness::Alive if a.slots_busy >= a.slots_total && a.slots_total > 0 => "full",
            Liveness::Alive if a.slots_busy > 0 => "busy",
            Liveness::Alive => "idle",
            Liveness::Suspect => "suspect",
            Liveness::Dead => "dead",
        };
        rows.push([
            a.addr.clone(),
            a.host_id.clone(),
            state.into(),
            format!("{}/{}", a.slots_busy, a.slots_total),
            format!("{} / {}", Bytes(a.reserved_bytes), Bytes(a.capacity_bytes)),
            Bytes(a.largest_fit_bytes).to_string(),
            match a.max_job_time_ms {
                Some(ms) => {
                    humantime::format_duration(std::time::Duration::from_millis(ms)).to_string()
                }
                None => "none".into(),
            },
            a.queue_len.to_string(),
            a.jobs_run.to_string(),
            format!("{:.1}s ago", p.last_heard_ms as f64 / 1000.0),
        ]);
    }
    let backlog = crate::proto::backlog::PoolBacklog::sum(
        peers
            .iter()
            .filter(|p| p.liveness == Liveness::Alive)
            .flat_map(|p| p.advert.backlog.iter()),
    );
    format!("{}\n{}\n", crate::units::render_table(&rows), backlog)
}
