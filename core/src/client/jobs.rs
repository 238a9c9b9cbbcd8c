//! A tenant's jobs across the pool, by id: listing them (`peerwasm jobs`,
//! like Slurm's `squeue` or HTCondor's `condor_q`) and cancelling them
//! (`peerwasm cancel`, like `scancel` or `condor_rm`). An id names a job on
//! one worker and does not say which: ids are 128 random bits, so each live
//! worker is asked in turn until one knows it. A worker answers 404 for
//! another tenant's job exactly as for one that does not exist.

use super::api::{ApiError, WorkerApi};
use crate::net::HttpClient;
use reqwest::StatusCode;

use crate::gossip::Liveness;
use crate::gossip::PeerView;
use crate::proto::JobStatus;

/// One of the caller's jobs, and where it is.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PoolJob {
    /// The worker holding it.
    pub worker: String,
    /// Its id and state there.
    #[serde(flatten)]
    pub status: JobStatus,
}

/// The workers of `view` that are not dead and may be sent the token
/// (`super::trusted`); the others are named in the second list.
pub(super) fn trusted_workers<'v>(
    view: &'v [PeerView],
    seeds: &[String],
    http: &HttpClient,
) -> (Vec<&'v String>, Vec<String>) {
    trusted_of(
        view.iter().filter(|p| p.liveness != Liveness::Dead),
        seeds,
        view,
        http,
    )
}

/// Where to look for one id: [`trusted_workers`], then the addresses of the
/// dead ones that no live worker holds. A worker killed and started again
/// on the same address (and state) holds its ids again at once, but the
/// view it is looked up in may still call it dead for a round or more (its
/// old generation fell silent, its new one has not gossiped yet): asked
/// last, it answers for itself; a truly dead one only fails to connect.
pub(super) fn lookup_order<'v>(
    view: &'v [PeerView],
    seeds: &[String],
    http: &HttpClient,
) -> (Vec<&'v String>, Vec<String>) {
    let (mut ask, mut skipped) = trusted_workers(view, seeds, http);
    let dead = view.iter().filter(|p| p.liveness == Liveness::Dead);
    let (again, more) = trusted_of(dead, seeds, view, http);
    for addr in again {
        if !ask.contains(&addr) {
            ask.push(addr);
        }
    }
    skipped.extend(more);
    (ask, skipped)
}

/// The addresses of `peers` that may be sent the token (`super::trusted`
/// against `view`); the others are named in the second list.
fn trusted_of<'v>(
    peers: impl Iterator<Item = &'v PeerView>,
    seeds: &[String],
    view: &[PeerView],
    http: &HttpClient,
) -> (Vec<&'v String>, Vec<String>) {
    let mut ask = Vec::new();
    let mut skipped = Vec::new();
    for p in peers {
        let addr = &p.advert.addr;
        if !http.may_send_to(addr) {
            skipped.push(format!("{addr}: not asked, the token would cross the network in clear (give --tls-ca, or --insecure-http)"));
        } else if super::trusted(addr, seeds, view) {
            ask.push(addr);
        } else {
            skipped.push(format!("{addr}: not named, and no worker vouches for it (its advert was not sealed with the pool's key)"));
        }
    }
    (ask, skipped)
}

/// The caller's jobs on every worker of `view` that is not dead and may be
/// sent the token, with `http` (which carries it): queued, running, and
/// detached ones whose result waits. Workers not asked or not answering are
/// named in the second list.
pub async fn list(
    http: &HttpClient,
    view: &[PeerView],
    seeds: &[String],
) -> anyhow::Result<(Vec<PoolJob>, Vec<String>)> {
    let mut jobs = Vec::new();
    let (ask, mut silent) = trusted_workers(view, seeds, http);
    for worker in ask {
        match WorkerApi::new(http, worker).jobs().await {
            Ok(mine) => jobs.extend(mine.into_iter().map(|status| PoolJob {
                worker: worker.clone(),
                status,
            })),
            Err(e @ ApiError::Unreadable(_)) => anyhow::bail!("{e}"),
            Err(e) => silent.push(format!("{worker}: {e}")),
        }
    }
    Ok((jobs, silent))
}
/// What became of one id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CancelReport {
    /// Cancelled on `worker`; it was `queued` or `running` — or `done`, and
    /// its result was discarded.
    Cancelled { worker: String, was: String },
    /// It had already ended on `worker` (the worker's message says how).
    AlreadyEnded { worker: String, message: String },
    /// No live worker knows it (or it is another tenant's).
    NotFound,
}

/// Cancels job `id` wherever in `view` it is (on the workers that may be
/// sent the token), with `http` (which carries it). `Err` for what is not about the job: a refused
/// token, no worker answering.
pub async fn cancel(
    http: &HttpClient,
    view: &[PeerView],
    seeds: &[String],
    id: &str,
) -> anyhow::Result<CancelReport> {
    let mut answered = 0;
    let (ask, mut errors) = lookup_order(view, seeds, http);
    for worker in ask {
        match WorkerApi::new(http, worker).cancel_job(id).await {
            Ok(was) => {
                return Ok(CancelReport::Cancelled {
                    worker: worker.clone(),
                    was,
                });
            }
            Err(ApiError::Status {
                status: StatusCode::CONFLICT,
                message,
                ..
            }) => {
                return Ok(CancelReport::AlreadyEnded {
                    worker: worker.clone(),
                    message,
                });
            }
            Err(ApiError::Status {
                status: StatusCode::NOT_FOUND,
                ..
            }) => answered += 1,
            Err(ApiError::Status {
                status, message, ..
            }) => anyhow::bail!("{worker} refused: {status} {message}"),
            Err(e) => errors.push(format!("{worker}: {e}")),
        }
    }
    if answered == 0 {
        anyhow::bail!("no worker answered ({})", errors.join("; "));
    }
    Ok(CancelReport::NotFound)
}
