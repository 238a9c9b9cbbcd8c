//! The pool's view as a client gets it (`GET /v1/peers` from the first seed
//! that answers), and whom a tenant's token may be sent to.

use crate::gossip::PeerView;

/// Fetches the pool view from the first of `peers` that answers.
pub async fn fetch_peers(
    http: &crate::net::HttpClient,
    peers: &[String],
) -> anyhow::Result<Vec<PeerView>> {
    fetch_peers_noting(http, peers, &mut |_| {}).await
}

/// [`fetch_peers`], telling `silent` of each one asked that did not answer
/// (so that a caller asking again can ask it last).
pub async fn fetch_peers_noting(
    http: &crate::net::HttpClient,
    peers: &[String],
    silent: &mut (dyn FnMut(&str) + Send),
) -> anyhow::Result<Vec<PeerView>> {
    let mut errors = Vec::new();
    for addr in peers {
        match super::api::WorkerApi::new(http, addr).peers().await {
            Ok(view) => return Ok(view),
            Err(e @ super::api::ApiError::Unreadable(_)) => anyhow::bail!("{e}"),
            Err(e) => {
                silent(addr);
                errors.push(format!("{addr}: {e}"));
            }
        }
    }
    anyhow::bail!("no peer answered ({})", errors.join("; "))
}

/// Whether jobs and a tenant's token may go to `addr`: the user named it
/// (one of `seeds`), or the worker that answered with `view` vouches for
/// it ([`PeerView::vouched`]: heard in gossip sealed with the pool's key).
/// See `pool`'s module docs.
pub fn trusted(addr: &str, seeds: &[String], view: &[PeerView]) -> bool {
    seeds.iter().any(|s| s == addr) || view.iter().any(|p| p.advert.addr == addr && p.vouched)
}
