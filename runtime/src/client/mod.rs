//! The submitting side, in the order a job meets it:
//!
//! * [`job`] — a module and what its runs share, hashed once;
//! * [`target`] — where jobs go: the embedded worker or a pool;
//! * [`placement`] — best fit over the gossip view;
//! * [`pool`] — one job on the pool: upload the module where missing, try
//!   candidates in order, wait when all are busy;
//! * [`tree`] — host directories hashed into manifests, files coming back
//!   written into them;
//! * `ship` — shipping a job's directories to a worker: the trees and the
//!   files it lacks, once per worker;
//! * [`stream`] — one job with stdin and output flowing while it runs
//!   (`run --peers`);
//! * `batcher` — the jobs bound for one worker, sent together while it is
//!   busy (`POST /v1/jobs/batch`);
//! * [`estimate`] — learned memory requests (smartmem), saved per module;
//! * [`map`] — many inputs, results in order, with retries and progress;
//! * [`status`] — the pool summed up on one screen;
//! * [`jobs`] — a tenant's jobs across the pool: listing and cancelling
//!   them by id;
//! * [`detach`] — submitting a job and walking away; following its output
//!   (`logs -f`);
//! * [`submit`] — handing a whole map to a worker that owns it durably
//!   (`map --detach`), and its results, list, cancel and the pool's history.
//!
//! `peerwasm run` and `peerwasm map` are thin shells over these; a program
//! can do the same:
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use peerwasm::client::{Job, MapConfig, MapItem, Target, map};
//! let job = Job::from_file("primes.wasm")?;
//! let target = Target::pool(vec!["127.0.0.1:7070".into()])?;
//! let inputs = (1..=100).map(|n| format!("{{\"n\": {n}}}").into_bytes());
//! let mut results: Vec<MapItem> = Vec::new();
//! let summary = map(&target, &job, inputs, &MapConfig::default(), &mut results).await?;
//! assert_eq!(results.len(), 100);
//! println!("{summary}");
//! # Ok(()) }
//! ```

mod batcher;
pub mod detach;
pub mod estimate;
pub mod job;
pub mod jobs;
pub mod map;
pub mod placement;
pub mod pool;
mod ship;
pub mod status;
pub mod stream;
pub mod submit;
pub mod target;
pub mod tree;

pub use job::Job;
pub use map::{MapConfig, MapItem, MapObserver, MapSummary, map};
pub use pool::{Pool, PoolConfig};
pub use target::{Capacity, Placed, SubmitError, Target};

use crate::proto::{PeerView, POSTCARD};
use crate::units::Bytes;

/// Fetches the pool view from the first of `peers` that answers.
pub async fn fetch_peers(http: &reqwest::Client, peers: &[String]) -> anyhow::Result<Vec<PeerView>> {
    let mut errors = Vec::new();
    for addr in peers {
        let resp = http
            .get(format!("http://{addr}/v1/peers"))
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
            Err(e) => errors.push(format!("{addr}: {e}")),
        }
    }
    anyhow::bail!("no peer answered ({})", errors.join("; "))
}

/// Whether a tenant's token may go to `addr`: the user named it (one of
/// `seeds`), or every live worker of `view` authenticates its gossip (a
/// keyed pool vouches for the addresses in it). See `pool`'s module docs.
pub fn trusted(addr: &str, seeds: &[String], view: &[PeerView]) -> bool {
    seeds.iter().any(|s| s == addr) || keyed(view)
}

/// Whether every live worker of `view` authenticates its gossip.
pub fn keyed(view: &[PeerView]) -> bool {
    let live = || view.iter().filter(|p| p.liveness == crate::gossip::Liveness::Alive);
    live().next().is_some() && live().all(|p| p.advert.gossip_keyed)
}

/// The pool as a table, one row per peer (FieldTrip's peerlist).
pub fn peers_table(peers: &[PeerView]) -> String {
    let mut rows = vec![[
        "ADDRESS", "HOST", "STATE", "SLOTS", "RESERVED/CAPACITY", "FITS NOW", "MAX TIME", "QUEUE", "JOBS", "HEARD",
    ]
    .map(String::from)];
    let mut sorted: Vec<&PeerView> = peers.iter().collect();
    sorted.sort_by(|a, b| a.advert.addr.cmp(&b.advert.addr));
    for p in sorted {
        let a = &p.advert;
        let state = match p.liveness {
            crate::gossip::Liveness::Alive if a.draining => "leaving",
            crate::gossip::Liveness::Alive if a.slots_busy >= a.slots_total && a.slots_total > 0 => "full",
            crate::gossip::Liveness::Alive if a.slots_busy > 0 => "busy",
            crate::gossip::Liveness::Alive => "idle",
            crate::gossip::Liveness::Suspect => "suspect",
            crate::gossip::Liveness::Dead => "dead",
        };
        rows.push([
            a.addr.clone(),
            a.host_id.clone(),
            state.into(),
            format!("{}/{}", a.slots_busy, a.slots_total),
            format!("{} / {}", Bytes(a.reserved_bytes), Bytes(a.capacity_bytes)),
            Bytes(a.largest_fit_bytes).to_string(),
            match a.max_job_time_ms {
                Some(ms) => humantime::format_duration(std::time::Duration::from_millis(ms)).to_string(),
                None => "none".into(),
            },
            a.queue_len.to_string(),
            a.jobs_run.to_string(),
            format!("{:.1}s ago", p.last_heard_ms as f64 / 1000.0),
        ]);
    }
    render_table(&rows)
}

/// Rows of cells as left-aligned columns two spaces apart.
pub(crate) fn render_table<R: AsRef<[String]>>(rows: &[R]) -> String {
    let columns = rows.first().map_or(0, |r| r.as_ref().len());
    let widths: Vec<usize> =
        (0..columns).map(|c| rows.iter().map(|r| r.as_ref()[c].chars().count()).max().unwrap_or(0)).collect();
    rows.iter()
        .map(|r| {
            let cells = r.as_ref().iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}"));
            cells.collect::<Vec<_>>().join("  ").trim_end().to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
}
