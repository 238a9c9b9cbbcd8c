//! The pool's view as a client gets it (`GET /v1/peers` from the first seed
//! that answers), and whom a tenant's token may be sent to.

use crate::gossip::PeerView;
use crate::proto::POSTCARD;

/// Fetches the pool view from the first of `peers` that answers.
pub async fn fetch_peers(http: &crate::net::HttpClient, peers: &[String]) -> anyhow::Result<Vec<PeerView>> {
    let mut errors = Vec::new();
    for addr in peers {
        let resp = http
            .get(http.url(addr, crate::proto::routes::PEERS))
            .header(reqwest::header::ACCEPT, POSTCARD)
            .send()
            .await;
        match resp {
            Ok(r) if r.status().is_success() => {
                let bytes = r.bytes().await?;
                return postcard::from_bytes(&bytes)
                    .map_err(|e| anyhow::anyhow!("{addr} sent a pool view we cannot read: {e}"));
            }
            Ok(r) => {
                let status = r.status();
                let why = r.text().await.unwrap_or_default();
                errors.push(format!("{addr}: {status} {}", why.trim()).trim_end().to_string());
            }
            Err(e) => errors.push(format!("{addr}: {}", crate::net::describe(&e))),
        }
    }
    anyhow::bail!("no peer answered ({})", errors.join("; "))
}

/// Whether a tenant's token may go to `addr`: the user named it (one of
/// `seeds`), or every live worker of `view` authenticates its gossip (a
/// keyed pool vouches for the addresses in it). See `pool`'s module docs.
pub fn trusted(addr: &str, seeds: &[String], view: &[PeerView]) -> bool {
    seeds.iter().any(|s| s == addr) || crate::gossip::keyed(view)
}

