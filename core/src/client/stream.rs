//! One job on the pool with its stdin and output streamed
//! (`POST /v1/jobs/stream`, format in [`crate::proto::stream`]): what
//! `peerwasm run --peers` uses, so that a remote job starts before its
//! input has ended, shows its output as it writes it, and can hold a
//! conversation on stdin and stdout.
//!
//! Placement is the same as for any job (`Pool::candidates_now`). What
//! differs is when a job can go elsewhere: only until a worker has
//! accepted it. Stdin is sent only after the worker's `200`, so a refusal
//! (module unknown, too large, busy) loses none of it; once stdin flows,
//! a job lost with its worker cannot be run again and is reported lost.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::mpsc;

use super::api::{ApiError, WorkerApi};
use super::errors::{PeerError, SubmitError};
use super::job::Job;
use super::pool::{Pool, backoff_wait};
use super::ship::{PROVIDE_ATTEMPTS, ShippedTree};
use crate::proto::frame::{FrameReader, encode_frame};
use crate::proto::stream::StreamEvent;
use crate::proto::{JobResult, JobSpec, StdStream};
use crate::sandbox::StdinFeed;

/// Receives a streamed job's output as it arrives.
pub type OnOutput<'a> = &'a mut (dyn FnMut(StdStream, &[u8]) + Send);

/// A stdin receiver, taken from its [`StdinFeed`].
type StdinRx = mpsc::Receiver<std::io::Result<Bytes>>;

impl Pool {
    /// Runs one job with its stdin (`spec.stdin`, then `stdin` as it
    /// arrives) and output streamed; `on_output` hears the output as the
    /// job writes it, and the result carries all of it too.
    pub async fn run_streaming(
        &self,
        job: &Job,
        mut spec: JobSpec,
        stdin: Option<StdinFeed>,
        on_output: OnOutput<'_>,
    ) -> Result<JobResult, SubmitError> {
        let mut first = std::mem::take(&mut spec.stdin);
        let shipped = self.ship(&spec).await?;
        let head = Bytes::from(
            encode_frame(shipped.spec()).map_err(|e| SubmitError::Fatal(e.to_string()))?,
        );
        let mut stdin = stdin.and_then(|feed| feed.take());
        let mut backoff = Duration::from_millis(10);
        let mut no_peer_since = None;
        loop {
            let mut declined = Vec::new();
            for (addr, _slots) in self.candidates_now(&spec, &mut no_peer_since).await? {
                self.add_load(&addr, 1);
                let answer = self
                    .stream_to(
                        &addr,
                        job,
                        &shipped.trees,
                        &head,
                        &mut first,
                        &mut stdin,
                        on_output,
                    )
                    .await;
                self.add_load(&addr, -1);
                if let Some(result) = self.settle(&addr, answer, &mut declined).await? {
                    return Ok(result);
                }
            }
            tracing::trace!(
                "every worker declined ({}); waiting {backoff:?}",
                declined.join("; ")
            );
            backoff_wait(&mut backoff).await;
        }
    }

    /// One worker: the head, then (once it answers 200) stdin, while its
    /// events are read. A 404 or 424 sends what the worker lacks and asks
    /// again ([`Pool::provide`]).
    #[allow(clippy::too_many_arguments)]
    async fn stream_to(
        &self,
        addr: &str,
        job: &Job,
        trees: &[Arc<ShippedTree>],
        head: &Bytes,
        first: &mut Vec<u8>,
        stdin: &mut Option<StdinRx>,
        on_output: OnOutput<'_>,
    ) -> Result<JobResult, PeerError> {
        for attempt in 0..PROVIDE_ATTEMPTS {
            let sent = Instant::now();
            let (body, body_rx) = mpsc::channel::<Bytes>(16);
            body.try_send(head.clone())
                .expect("an empty channel has room");
            let stream = futures::stream::unfold(body_rx, |mut rx| async move {
                rx.recv().await.map(|b| (Ok::<_, std::io::Error>(b), rx))
            });
            let api = WorkerApi::new(self.client_for(addr), addr);
            let mut resp = match api.post_stream(reqwest::Body::wrap_stream(stream)).await {
                Ok(resp) => resp,
                Err(ApiError::Status {
                    status,
                    message,
                    largest,
                }) => {
                    if attempt + 1 < PROVIDE_ATTEMPTS
                        && self.provide(addr, status, job, trees, sent).await?
                    {
                        continue;
                    }
                    return Err(self.read_refusal(addr, status, message, largest));
                }
                Err(e) => return Err(e.into()),
            };
            // Accepted: from here on stdin is spent on this worker.
            let _pump = AbortOnDrop(tokio::spawn(pump(
                std::mem::take(first),
                stdin.take(),
                body,
            )));
            let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
            let mut frames = FrameReader::default();
            while let Some(chunk) = resp
                .chunk()
                .await
                .map_err(|e| PeerError::from_reqwest(&e))?
            {
                frames.push(&chunk);
                while let Some(event) = frames
                    .next_frame::<StreamEvent>()
                    .map_err(PeerError::Lost)?
                {
                    match event {
                        StreamEvent::Output { stream, bytes } => {
                            on_output(stream, &bytes);
                            match stream {
                                StdStream::Stdout => stdout.extend_from_slice(&bytes),
                                StdStream::Stderr => stderr.extend_from_slice(&bytes),
                            }
                        }
                        StreamEvent::Done(mut result) => {
                            result.stdout = stdout;
                            result.stderr = stderr;
                            return Ok(result);
                        }
                    }
                }
            }
            return Err(PeerError::Lost(
                "the worker's answer ended before the job did".into(),
            ));
        }
        unreachable!("the last attempt returns")
    }
}

/// Sends `first`, then what arrives on `stdin`, as the request body; ends
/// the body (the job's end of input) when stdin ends or fails locally.
async fn pump(first: Vec<u8>, stdin: Option<StdinRx>, body: mpsc::Sender<Bytes>) {
    if !first.is_empty() && body.send(Bytes::from(first)).await.is_err() {
        return;
    }
    let Some(mut stdin) = stdin else { return };
    loop {
        tokio::select! {
            chunk = stdin.recv() => match chunk {
                Some(Ok(bytes)) => {
                    if body.send(bytes).await.is_err() {
                        return;
                    }
                }
                _ => return,
            },
            () = body.closed() => return,
        }
    }
}

/// Aborts the task when dropped: the stdin pump lives as long as its job's
/// answer is read.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
