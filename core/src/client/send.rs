//! Sending one job to the pool: its directories shipped as trees, the
//! candidates tried best first (each through its worker's batcher), the
//! module or files a worker lacks provided and the job sent again, and a
//! wait with backoff when every worker declines.

use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::StatusCode;

use super::errors::{PeerError, SubmitError};
use super::job::Job;
use super::pool::{Pool, backoff_wait};
use super::ship::{PROVIDE_ATTEMPTS, ShippedTree};
use super::submitter::Placed;
use crate::proto::batch::BatchAnswer;
use crate::proto::{CancelCause, JobResult, JobSpec, Outcome};

impl Pool {
    /// Runs one job on the pool; `placed` is set to the worker while the
    /// job is on it (so a caller can tell which worker lost it).
    pub async fn run(
        &self,
        job: &Job,
        spec: &JobSpec,
        placed: &Placed,
    ) -> Result<JobResult, SubmitError> {
        let shipped = self.ship(spec).await?;
        let body: bytes::Bytes = postcard::to_allocvec(shipped.spec())
            .map_err(|e| SubmitError::Fatal(e.to_string()))?
            .into();
        let mut backoff = Duration::from_millis(10);
        let mut no_peer_since: Option<Instant> = None;
        loop {
            let candidates = self.candidates_now(spec, &mut no_peer_since).await?;
            let mut declined = Vec::new();
            for (addr, slots) in candidates {
                placed.set(Some(&addr));
                self.add_load(&addr, 1);
                let outcome = self
                    .submit_to(&addr, slots, job, &shipped.trees, body.clone())
                    .await;
                self.add_load(&addr, -1);
                if let Some(result) = self.settle(&addr, outcome, &mut declined).await? {
                    return Ok(result);
                }
            }
            placed.set(None);
            tracing::trace!(
                "every worker declined ({}); waiting {backoff:?}",
                declined.join("; ")
            );
            backoff_wait(&mut backoff).await;
        }
    }

    /// What one worker's answer means for a job being placed: its result
    /// (`Some`), try the next worker (`None`; a refusal is noted in
    /// `declined`, an unreachable worker avoided for a while), or give up
    /// (`Err`: lost with its worker, or a request no worker would take).
    pub(super) async fn settle(
        &self,
        addr: &str,
        answer: Result<JobResult, PeerError>,
        declined: &mut Vec<String>,
    ) -> Result<Option<JobResult>, SubmitError> {
        match answer {
            // A worker that shut down under the job did not run it to its
            // end: that is a lost job, to run elsewhere.
            Ok(JobResult {
                outcome:
                    Outcome::Cancelled {
                        cause: CancelCause::Shutdown,
                    },
                ..
            }) => Err(SubmitError::Lost {
                peer: addr.into(),
                reason: "the worker shut down".into(),
                killed: false,
            }),
            // The process running it died under it: lost too.
            Ok(JobResult {
                outcome: Outcome::Lost { reason },
                ..
            }) => Err(SubmitError::Lost {
                peer: addr.into(),
                reason,
                killed: true,
            }),
            Ok(result) => Ok(Some(result)),
            Err(PeerError::Declined(why)) => {
                declined.push(format!("{addr}: {why}"));
                Ok(None)
            }
            Err(PeerError::Unreachable(why)) => {
                tracing::debug!(peer = %addr, "unreachable: {why}");
                self.avoid(addr);
                Ok(None)
            }
            // The connection broke: counted only if the worker is gone
            // (`loss.rs`), not for a network that went away.
            Err(PeerError::Lost(why)) => {
                self.avoid(addr);
                let broken = self.judge_broken(addr).await;
                Err(SubmitError::Lost {
                    peer: addr.into(),
                    reason: format!("{why}{}", broken.said()),
                    killed: broken.counts(),
                })
            }
            Err(PeerError::Fatal(why)) => Err(SubmitError::Fatal(format!("{addr}: {why}"))),
        }
    }

    /// Submits to one worker. The job goes first, without the module or
    /// its trees: a worker that already has them (from another client, an
    /// earlier run, or its disk cache) runs it at once. A worker that
    /// answers "module unknown" (404) or "files missing" (424) gets them
    /// and the job again ([`provide`](Self::provide)).
    async fn submit_to(
        &self,
        addr: &str,
        slots: u32,
        job: &Job,
        trees: &[Arc<ShippedTree>],
        body: bytes::Bytes,
    ) -> Result<JobResult, PeerError> {
        for attempt in 0..PROVIDE_ATTEMPTS {
            let sent = Instant::now();
            let http = self.client_for(addr);
            let (status, message, largest) = match self
                .batchers
                .submit(addr, slots, body.clone(), http)
                .await?
            {
                BatchAnswer::Done(result) => return Ok(result),
                BatchAnswer::Refused {
                    status,
                    message,
                    largest_job,
                } => (status, message, largest_job),
            };
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            if attempt + 1 < PROVIDE_ATTEMPTS
                && self.provide(addr, status, job, trees, sent).await?
            {
                continue;
            }
            return Err(self.read_refusal(addr, status, message, largest));
        }
        unreachable!("the last attempt returns")
    }
}

#[cfg(test)]
mod tests {
    //! What one worker's answer means for a job being placed.

    use super::*;
    use crate::client::errors::Broken;
    use crate::client::pool::PoolConfig;
    use std::sync::atomic::{AtomicU64, Ordering};

    fn result(outcome: Outcome) -> JobResult {
        JobResult::never_ran(1 << 20, outcome)
    }

    fn avoided(pool: &Pool, addr: &str) -> bool {
        let view = [crate::gossip::PeerView {
            id: crate::gossip::NodeId::new(addr, 1),
            advert: crate::proto::Advert {
                addr: addr.into(),
                slots_total: 1,
                ..Default::default()
            },
            liveness: crate::gossip::Liveness::Alive,
            last_heard_ms: 0,
            vouched: true,
        }];
        pool.order_by_load(vec![addr.to_string()], &view).is_empty()
    }

    #[tokio::test]
    async fn a_result_is_kept_a_refusal_moves_on_and_a_broken_worker_is_avoided() {
        let pool = Pool::new(PoolConfig::new(vec!["a:1".into()])).unwrap();
        let mut declined = Vec::new();
        let ok = pool
            .settle(
                "a:1",
                Ok(result(Outcome::Exited { code: 0 })),
                &mut declined,
            )
            .await
            .unwrap();
        assert!(ok.is_some(), "a result is the answer");
        let next = pool
            .settle(
                "a:1",
                Err(PeerError::Declined("too large here".into())),
                &mut declined,
            )
            .await
            .unwrap();
        assert!(
            next.is_none() && declined == ["a:1: too large here"],
            "{declined:?}"
        );
        assert!(!avoided(&pool, "a:1"), "a refusal is not a fault");

        assert!(
            pool.settle(
                "b:2",
                Err(PeerError::Unreachable("refused".into())),
                &mut declined
            )
            .await
            .unwrap()
            .is_none()
        );
        assert!(
            avoided(&pool, "b:2"),
            "an unreachable worker is skipped for a while"
        );
    }

    #[tokio::test]
    async fn a_job_lost_or_ended_by_a_shutdown_is_run_again_and_a_bad_request_is_fatal() {
        let pool = Pool::new(PoolConfig::new(vec!["a:1".into()])).unwrap();
        let mut declined = Vec::new();
        let shutdown = result(Outcome::Cancelled {
            cause: CancelCause::Shutdown,
        });
        assert!(matches!(
            pool.settle("a:1", Ok(shutdown), &mut declined).await,
            Err(SubmitError::Lost { killed: false, .. })
        ));
        // The process running it died under it: lost, and counted.
        let died = result(Outcome::Lost {
            reason: "the slot process running it ended without a result: signal: 9 (SIGKILL)"
                .into(),
        });
        assert!(matches!(
            pool.settle("a:1", Ok(died), &mut declined).await,
            Err(SubmitError::Lost { killed: true, ref reason, .. }) if reason.contains("SIGKILL")
        ));
        assert!(!avoided(&pool, "a:1"), "its worker is alive");
        // A broken connection, nobody answering: not counted (see below).
        let lost = pool
            .settle(
                "c:3",
                Err(PeerError::Lost("connection reset".into())),
                &mut declined,
            )
            .await;
        assert!(matches!(lost, Err(SubmitError::Lost { peer, .. }) if peer == "c:3"));
        assert!(avoided(&pool, "c:3"));
        let fatal = pool
            .settle(
                "a:1",
                Err(PeerError::Fatal("bad spec".into())),
                &mut declined,
            )
            .await;
        assert_eq!(
            fatal.unwrap_err(),
            SubmitError::Fatal("a:1: bad spec".into())
        );
        assert!(declined.is_empty());
    }

    #[tokio::test]
    async fn jobs_whose_connections_broke_together_share_one_probe() {
        // A hundred jobs lost with one worker, whose address refuses now;
        // another answers (and counts what it is asked).
        let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = asked.clone();
        let other = serving(move |_| {
            counter.fetch_add(1, Ordering::Relaxed);
            (503, Vec::new())
        })
        .await;
        let gone = silent();
        let pool = Pool::new(PoolConfig::new(vec![gone.clone(), other])).unwrap();
        let verdicts = futures::future::join_all((0..100).map(|_| pool.judge_broken(&gone))).await;
        assert!(
            verdicts.iter().all(|v| *v == Broken::WorkerGone),
            "{verdicts:?}"
        );
        // One probe: the view it reads and the other worker asked; not a
        // hundred of each.
        let probes = asked.load(Ordering::Relaxed);
        assert!((1..=4).contains(&probes), "{probes} requests");
        // A break after the answer is asked afresh.
        assert_eq!(pool.judge_broken(&gone).await, Broken::WorkerGone);
        assert!(asked.load(Ordering::Relaxed) > probes);
    }

    /// A worker at `127.0.0.1:port` that answers every request with a
    /// status (a refusal is an answer).
    async fn answering() -> String {
        serving(|_| (503, Vec::new())).await
    }

    /// A worker that answers its view, itself of the generation in `generation`
    /// (another process on the same address when it changes).
    async fn of_generation(generation: Arc<AtomicU64>) -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        drop(listener);
        let me = addr.clone();
        serving_on(&addr, move |_| {
            let view = vec![crate::gossip::PeerView {
                id: crate::gossip::NodeId::new(me.clone(), generation.load(Ordering::Relaxed)),
                advert: crate::proto::Advert {
                    addr: me.clone(),
                    slots_total: 1,
                    ..Default::default()
                },
                liveness: crate::gossip::Liveness::Alive,
                last_heard_ms: 0,
                vouched: true,
            }];
            (200, postcard::to_allocvec(&view).unwrap())
        })
        .await
    }

    async fn serving(answer: impl Fn(&[u8]) -> (u16, Vec<u8>) + Send + Sync + 'static) -> String {
        serving_on("127.0.0.1:0", answer).await
    }

    /// Answers each request (one per connection) with `answer`'s status and body.
    async fn serving_on(
        at: &str,
        answer: impl Fn(&[u8]) -> (u16, Vec<u8>) + Send + Sync + 'static,
    ) -> String {
        let listener = tokio::net::TcpListener::bind(at).await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let answer = Arc::new(answer);
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let answer = answer.clone();
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let mut buf = [0u8; 4096];
                    let n = conn.read(&mut buf).await.unwrap_or(0);
                    let (status, body) = answer(&buf[..n]);
                    let head = format!(
                        "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = conn.write_all(head.as_bytes()).await;
                    let _ = conn.write_all(&body).await;
                });
            }
        });
        addr
    }

    fn silent() -> String {
        let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        socket.local_addr().unwrap().to_string()
    }

    #[tokio::test]
    async fn a_broken_connection_counts_only_when_its_worker_is_gone_and_the_pool_answers() {
        let broken = |pool: Pool, addr: String| async move {
            let mut declined = Vec::new();
            match pool
                .settle(
                    &addr,
                    Err(PeerError::Lost("connection reset".into())),
                    &mut declined,
                )
                .await
            {
                Err(SubmitError::Lost { killed, reason, .. }) => (killed, reason),
                other => panic!("{other:?}"),
            }
        };
        // Its worker still answers: the network lost the connection.
        let alive = answering().await;
        let pool = Pool::new(PoolConfig::new(vec![alive.clone()])).unwrap();
        let (killed, reason) = broken(pool, alive.clone()).await;
        assert!(!killed && reason.contains("still answers"), "{reason}");
        // Its worker is gone and another answers: counted.
        let gone = silent();
        let pool = Pool::new(PoolConfig::new(vec![gone.clone(), alive])).unwrap();
        let (killed, reason) = broken(pool, gone.clone()).await;
        assert!(killed, "{reason}");
        assert_eq!(reason, "connection reset");
        // Nobody answers: this client may be the one cut off.
        let pool = Pool::new(PoolConfig::new(vec![gone.clone(), silent()])).unwrap();
        let (killed, reason) = broken(pool, gone).await;
        assert!(!killed && reason.contains("cut off"), "{reason}");
        // It answers, as the process the job was sent to: not counted; as
        // another one (restarted by a supervisor): counted.
        let generation = Arc::new(AtomicU64::new(1));
        let restarting = of_generation(generation.clone()).await;
        let pool = Pool::new(PoolConfig::new(vec![restarting.clone()])).unwrap();
        pool.view().await.unwrap();
        assert_eq!(pool.judge_broken(&restarting).await, Broken::WorkerAnswers);
        generation.store(2, Ordering::Relaxed);
        assert_eq!(pool.judge_broken(&restarting).await, Broken::WorkerGone);
    }
}
