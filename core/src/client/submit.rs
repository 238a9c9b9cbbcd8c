//! Durable submissions, the client's side: hand a whole map to a worker
//! (its owner) and walk away (`map --detach`), then from any client with
//! the same token read its results (`results`), list (`submissions`),
//! cancel it (`cancel`), and read the pool's job history (`history`).
//!
//! A submission id does not say which worker owns it (as with job ids, each
//! live worker is asked until one knows it); `peerwasm submissions` shows
//! the owner.

use super::api::{ApiError, WorkerApi};
use crate::net::HttpClient;
use std::time::Duration;

use reqwest::StatusCode;

use super::errors::PeerError;
use super::job::Job;
use super::jobs::{CancelReport, lookup_order, trusted_workers};
use super::pool::Pool;
use crate::gossip::PeerView;
use crate::proto::submission::{
    HistoryRecord, ResultsPage, SubmissionInfo, SubmissionSpec, SubmitConfig,
};

impl Pool {
    /// Hands `job` over `inputs` to an owner — `owner`, else the first of
    /// the seeds that takes it — and returns the submission as stored
    /// there. The module is uploaded first if the owner lacks it.
    pub async fn submit_map(
        &self,
        job: &Job,
        inputs: Vec<Vec<u8>>,
        config: SubmitConfig,
        owner: Option<&str>,
    ) -> anyhow::Result<SubmissionInfo> {
        if !job.dirs.is_empty() {
            anyhow::bail!(
                "--detach cannot take --dir yet: run the map attached to ship directories"
            );
        }
        let spec = SubmissionSpec {
            job: job.spec(Vec::new(), 0),
            inputs: inputs.into_iter().map(serde_bytes::ByteBuf::from).collect(),
            config,
        };
        let body = bytes::Bytes::from(postcard::to_allocvec(&spec)?);
        let owners: Vec<String> = match owner {
            Some(o) => vec![o.to_string()],
            None => self.seeds(),
        };
        let mut errors = Vec::new();
        for addr in &owners {
            match self.submit_to_owner(addr, job, body.clone()).await {
                Ok(info) => return Ok(info),
                Err(PeerError::Fatal(why)) => anyhow::bail!("{addr}: {why}"),
                Err(
                    PeerError::Declined(why) | PeerError::Unreachable(why) | PeerError::Lost(why),
                ) => errors.push(format!("{addr}: {why}")),
            }
        }
        anyhow::bail!("no worker took the submission ({})", errors.join("; "))
    }

    async fn submit_to_owner(
        &self,
        addr: &str,
        job: &Job,
        body: bytes::Bytes,
    ) -> Result<SubmissionInfo, PeerError> {
        let resp = self
            .post_providing(addr, super::api::JobPost::Submission, job, &[], body)
            .await?;
        let text = resp.text().await.map_err(|e| PeerError::from_reqwest(&e))?;
        serde_json::from_str(&text).map_err(|e| {
            PeerError::Lost(format!(
                "the owner stored the submission but its answer is unreadable: {e}"
            ))
        })
    }
}

/// Finds submission `id` on the workers of `view` (those that may be sent
/// the token; the dead ones' addresses last, where a restarted owner may
/// be back before the view knows): its owner and how it is now. `None` if
/// no worker asked knows it (or it is another tenant's).
pub async fn find(
    http: &HttpClient,
    view: &[PeerView],
    seeds: &[String],
    id: &str,
) -> anyhow::Result<Option<SubmissionInfo>> {
    let (ask, mut errors) = lookup_order(view, seeds, http);
    let mut answered = 0;
    for worker in ask {
        match WorkerApi::new(http, worker).submission(id).await {
            Ok(info) => return Ok(Some(info)),
            Err(ApiError::Status {
                status: StatusCode::NOT_FOUND,
                ..
            }) => answered += 1,
            Err(e @ ApiError::Unreadable(_)) => anyhow::bail!("{e}"),
            Err(ApiError::Status {
                status, message, ..
            }) => anyhow::bail!("{worker}: {status} {message}"),
            Err(e) => errors.push(format!("{worker}: {e}")),
        }
    }
    if answered == 0 {
        anyhow::bail!("no worker answered ({})", errors.join("; "));
    }
    Ok(None)
}

/// Results of submission `id` on `owner` from input `from` on, waiting up
/// to `wait` for the next one.
pub async fn results_page(
    http: &HttpClient,
    owner: &str,
    id: &str,
    from: u64,
    wait: Duration,
) -> anyhow::Result<Option<ResultsPage>> {
    match WorkerApi::new(http, owner)
        .submission_results(id, from, wait)
        .await
    {
        Ok(page) => Ok(Some(page)),
        Err(ApiError::Status {
            status: StatusCode::NOT_FOUND,
            ..
        }) => Ok(None),
        Err(e @ ApiError::Unreadable(_)) => anyhow::bail!("{e}"),
        Err(e) => anyhow::bail!("{owner}: {e}"),
    }
}

/// The caller's submissions on every trusted_workers worker of `view`; workers not
/// asked or not answering are named in the second list.
pub async fn list(
    http: &HttpClient,
    view: &[PeerView],
    seeds: &[String],
) -> anyhow::Result<(Vec<SubmissionInfo>, Vec<String>)> {
    gather(
        http,
        view,
        seeds,
        |api| async move { api.submissions().await },
    )
    .await
}

/// The job history of every trusted worker of `view` since `since_ms`
/// (only `tenant`'s when given, which needs an operator's token for
/// another tenant), oldest first.
pub async fn history(
    http: &HttpClient,
    view: &[PeerView],
    seeds: &[String],
    since_ms: u64,
    tenant: Option<&str>,
) -> anyhow::Result<(Vec<HistoryRecord>, Vec<String>)> {
    let (mut rows, silent) = gather(http, view, seeds, |api| async move {
        api.history(since_ms, tenant).await
    })
    .await?;
    rows.sort_by(|a, b| (a.ended_ms, &a.peer).cmp(&(b.ended_ms, &b.peer)));
    Ok((rows, silent))
}

/// Asks every trusted worker of `view` with `ask` (a list route) and
/// concatenates; a refused token ends it, other workers not answering are
/// named in the second list.
async fn gather<'h, T, F, Fut>(
    http: &'h HttpClient,
    view: &'h [PeerView],
    seeds: &[String],
    ask: F,
) -> anyhow::Result<(Vec<T>, Vec<String>)>
where
    F: Fn(WorkerApi<'h>) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<T>, ApiError>>,
{
    let (workers, mut silent) = trusted_workers(view, seeds, http);
    let mut all = Vec::new();
    for worker in workers {
        match ask(WorkerApi::new(http, worker)).await {
            Ok(mut some) => all.append(&mut some),
            Err(ApiError::Status {
                status: StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN,
                message,
                ..
            }) => {
                anyhow::bail!("{worker}: {message}")
            }
            Err(e @ ApiError::Unreadable(_)) => anyhow::bail!("{e}"),
            Err(ApiError::Status { status, .. }) => silent.push(format!("{worker}: {status}")),
            Err(e) => silent.push(format!("{worker}: {e}")),
        }
    }
    Ok((all, silent))
}

/// Cancels submission `id` wherever it is: its map stops and its jobs
/// under way are cancelled; a finished one is discarded.
pub async fn cancel(
    http: &HttpClient,
    view: &[PeerView],
    seeds: &[String],
    id: &str,
) -> anyhow::Result<CancelReport> {
    let Some(info) = find(http, view, seeds, id).await? else {
        return Ok(CancelReport::NotFound);
    };
    match WorkerApi::new(http, &info.owner)
        .cancel_submission(id)
        .await
    {
        Ok(was) => Ok(CancelReport::Cancelled {
            worker: info.owner,
            was,
        }),
        Err(ApiError::Status {
            status: StatusCode::NOT_FOUND,
            ..
        }) => Ok(CancelReport::NotFound),
        Err(e) => anyhow::bail!("{} refused: {e}", info.owner),
    }
}
