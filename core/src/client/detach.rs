//! Detached jobs: submit one and walk away (`peerwasm run --detach`), then
//! follow its output from anywhere (`peerwasm logs -f ID`).
//!
//! The worker keeps a detached job's result until its owner discards it
//! (`peerwasm cancel ID`), so following it again, or after a lost answer,
//! gives the same bytes. Its output is read by offset
//! (`GET /v1/jobs/{id}/output`), polled every [`FOLLOW_INTERVAL`] while it
//! runs; a follower waits out its worker's restart and reads the run the
//! restarted worker begins from its start.

use super::api::{ApiError, WorkerApi};
use crate::net::HttpClient;
use std::time::Duration;

use reqwest::StatusCode;

use super::errors::{PeerError, SubmitError};
use super::job::Job;
use super::pool::{Pool, backoff_wait};
use super::ship::ShippedTree;
use crate::gossip::PeerView;
use crate::proto::{JOB_ID_HEADER, JobSpec, Outcome, StdStream};

/// How often a follower asks for more output.
pub const FOLLOW_INTERVAL: Duration = Duration::from_millis(100);

/// How long a follower waits for the worker of the job it follows to answer
/// again (restarting, or the network back) before it gives up.
pub const FOLLOW_GONE_MAX: Duration = Duration::from_secs(300);

/// How often a follower asks a worker that stopped answering.
const GONE_RETRY: Duration = Duration::from_millis(500);

impl Pool {
    /// Submits a detached job: placed as any job, then the worker answers
    /// at once with its id. Returns the worker and the id.
    /// Its directories must be read-only (`:ro`): nobody waits to write
    /// what it changes back.
    pub async fn submit_detached(
        &self,
        job: &Job,
        spec: &JobSpec,
    ) -> Result<(String, String), SubmitError> {
        if let Some(d) = spec.dirs.iter().find(|d| !d.read_only) {
            return Err(SubmitError::Fatal(format!(
                "--dir {}: a detached job's directories must be read-only (add :ro): nobody would be there to \
                 write back what it changes",
                d.host.display()
            )));
        }
        let shipped = self.ship(spec).await?;
        let body = bytes::Bytes::from(
            postcard::to_allocvec(shipped.spec()).map_err(|e| SubmitError::Fatal(e.to_string()))?,
        );
        let mut backoff = Duration::from_millis(10);
        let mut no_peer_since = None;
        loop {
            for (addr, _) in self.candidates_now(spec, &mut no_peer_since).await? {
                match self
                    .detach_to(&addr, job, &shipped.trees, body.clone())
                    .await
                {
                    Ok(id) => return Ok((addr, id)),
                    Err(PeerError::Fatal(why)) => {
                        return Err(SubmitError::Fatal(format!("{addr}: {why}")));
                    }
                    Err(
                        PeerError::Declined(why)
                        | PeerError::Unreachable(why)
                        | PeerError::Lost(why),
                    ) => {
                        tracing::debug!(peer = %addr, "detached job not taken: {why}");
                    }
                }
            }
            backoff_wait(&mut backoff).await;
        }
    }

    async fn detach_to(
        &self,
        addr: &str,
        job: &Job,
        trees: &[std::sync::Arc<ShippedTree>],
        body: bytes::Bytes,
    ) -> Result<String, PeerError> {
        let resp = self
            .post_providing(addr, super::api::JobPost::Detached, job, trees, body)
            .await?;
        let id = resp
            .headers()
            .get(JOB_ID_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(String::from);
        id.ok_or_else(|| PeerError::Lost("the worker took the job but sent no id".into()))
    }
}

/// Prints (through `on_output`) job `id`'s output, wherever in `view` it is,
/// and with `follow` goes on until the job ends. Returns the worker and the
/// outcome if the job has ended; `Ok(None)` if no worker knows the id.
///
/// Workers are asked live ones first, the dead ones' addresses last: one
/// killed and started again on its address holds its detached jobs again
/// before the view says it is back. One that cannot be reached before the
/// job is found is passed over; `Err` if none answered at all.
///
/// Following, a worker that stops answering is waited for (its detached
/// jobs come back with it when it restarts), up to [`FOLLOW_GONE_MAX`];
/// a job it took again after a restart is followed from its start. Both are
/// said through `on_notice`.
pub async fn follow(
    http: &HttpClient,
    view: &[PeerView],
    seeds: &[String],
    id: &str,
    follow: bool,
    on_output: &mut (dyn FnMut(StdStream, &[u8]) + Send),
    on_notice: &mut (dyn FnMut(&str) + Send),
) -> anyhow::Result<Option<(String, Option<Outcome>)>> {
    let (ask, mut unanswered) = super::jobs::lookup_order(view, seeds, http);
    let mut answered = 0;
    for worker in ask {
        let mut seen = [0u64; 2];
        // The run being read (`JobOutput::run`), once the worker has the job.
        let mut run: Option<u64> = None;
        let mut gone_since: Option<std::time::Instant> = None;
        loop {
            let out = match WorkerApi::new(http, worker).job_output(id, seen).await {
                Ok(out) => out,
                Err(ApiError::Status {
                    status: StatusCode::NOT_FOUND,
                    ..
                }) if run.is_none() => {
                    answered += 1;
                    break; // not this worker's
                }
                Err(e @ ApiError::Unreadable(_)) => anyhow::bail!("{e}"),
                Err(e @ ApiError::Status { .. }) => anyhow::bail!("{worker}: {e}"),
                // Not reached yet: a dead address, or one gone a moment.
                Err(e) if run.is_none() => {
                    unanswered.push(format!("{worker}: {e}"));
                    break;
                }
                // Gone under the job followed: restarting, or the network.
                Err(e) if follow => {
                    let since = *gone_since.get_or_insert_with(|| {
                        on_notice(&format!(
                            "{worker} does not answer ({e}); waiting for it to come back"
                        ));
                        std::time::Instant::now()
                    });
                    if since.elapsed() > FOLLOW_GONE_MAX {
                        anyhow::bail!(
                            "{worker}: {e} (for {})",
                            humantime::format_duration(FOLLOW_GONE_MAX)
                        );
                    }
                    tokio::time::sleep(GONE_RETRY).await;
                    continue;
                }
                Err(e) => anyhow::bail!("{worker}: {e}"),
            };
            if gone_since.take().is_some() {
                on_notice(&format!("{worker} answers again"));
            }
            match run {
                Some(r) if out.run != 0 && out.run != r => {
                    on_notice(
                        "the job started again (its worker restarted): its output from the start",
                    );
                    (run, seen) = (Some(out.run), [0, 0]);
                    continue;
                }
                Some(_) => {}
                None => run = Some(out.run),
            }
            for (i, (stream, bytes)) in [
                (StdStream::Stdout, &out.stdout),
                (StdStream::Stderr, &out.stderr),
            ]
            .into_iter()
            .enumerate()
            {
                if !bytes.is_empty() {
                    on_output(stream, bytes);
                    seen[i] += bytes.len() as u64;
                }
            }
            let more = !out.stdout.is_empty() || !out.stderr.is_empty();
            match out.ended {
                // Ended, and all of its output read (a page may hold less).
                Some(outcome) if !more => return Ok(Some((worker.clone(), Some(outcome)))),
                Some(_) => continue,
                None if !follow => return Ok(Some((worker.clone(), None))),
                None if more => continue,
                None => tokio::time::sleep(FOLLOW_INTERVAL).await,
            }
        }
    }
    if answered == 0 && !unanswered.is_empty() {
        anyhow::bail!("no worker answered ({})", unanswered.join("; "));
    }
    Ok(None)
}
