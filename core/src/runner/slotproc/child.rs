//! One slot process as the worker holds it ([`SlotChild`]), and one job's
//! conversation with it ([`Talk`]): the frames each way, the job's stdin
//! fed against the child's credit, a cancel, and the backstop that kills
//! a child which does not answer in time.
//!
//! Why apart from the pool of children ([`super`]): the pool decides which
//! child runs a job and what becomes of it after; this file owns what
//! happens while it runs, which is one `select!` with its own state.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin, ChildStdout};

use super::wire::{self, FromSlot, STDIN_CREDIT, ToSlot};
use crate::proto::frame::{FrameReader, encode_frame};
use crate::proto::{CancelCause, JobResult, Outcome, StdStream};
use crate::runner::source::ModuleSource;
use crate::sandbox::{OutputCapture, RunHooks};

/// How long past a job's deadline (and the child's own grace), or a
/// cancel, the worker waits for its slot process to answer before killing
/// it.
pub const BACKSTOP_GRACE: Duration = Duration::from_secs(2);

/// How much of a child's stdout is read at once.
const READ_CHUNK: usize = 64 << 10;

/// One child, between jobs.
pub(super) struct SlotChild {
    process: Child,
    to: ChildStdin,
    from: ChildStdout,
    frames: FrameReader,
    /// What `next` reads into: on the heap, so that the futures of a job
    /// (and of every in-process job, which share the runner's task type)
    /// stay small enough to move cheaply.
    buf: Box<[u8]>,
    /// The child's scratch root: removed when the child is dropped, and
    /// claimed by this process while it lives (`crate::leftovers`).
    _scratch: (tempfile::TempDir, crate::leftovers::Claim),
    /// What the child holds for the jobs to come (its last `Done` said),
    /// counted by [`SlotProcesses::warm_held`](super::SlotProcesses::warm_held)
    /// while the child lives.
    pub(super) warm_held: Arc<AtomicU64>,
}

impl SlotChild {
    /// A child just spawned, with its pipes, and the scratch directory
    /// removed when it is dropped.
    pub(super) fn new(
        process: Child,
        to: ChildStdin,
        from: ChildStdout,
        scratch: (tempfile::TempDir, crate::leftovers::Claim),
    ) -> SlotChild {
        SlotChild {
            process,
            to,
            from,
            frames: FrameReader::default(),
            buf: vec![0; READ_CHUNK].into(),
            _scratch: scratch,
            warm_held: Arc::default(),
        }
    }

    /// The child's scratch root.
    pub(super) fn scratch(&self) -> &std::path::Path {
        self._scratch.0.path()
    }

    /// Whether the child still runs (an idle one may have been killed).
    pub(super) fn is_running(&mut self) -> bool {
        matches!(self.process.try_wait(), Ok(None))
    }

    pub(super) async fn send(&mut self, msg: &ToSlot) -> anyhow::Result<()> {
        self.send_frame(&encode_frame(msg)?).await
    }

    async fn send_frame(&mut self, frame: &[u8]) -> anyhow::Result<()> {
        self.to.write_all(frame).await?;
        self.to.flush().await?;
        Ok(())
    }

    /// The next frame; `None` once the child closed its stdout (it ended).
    async fn next(&mut self) -> Option<FromSlot> {
        loop {
            match self.frames.next_frame::<FromSlot>() {
                Ok(Some(msg)) => return Some(msg),
                Ok(None) => {}
                Err(e) => {
                    tracing::error!("slot process {:?}: {e}", self.process.id());
                    return None;
                }
            }
            match self.from.read(&mut self.buf).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => self.frames.push(&self.buf[..n]),
            }
        }
    }

    /// Kills the child (if it still runs) and says how it ended.
    async fn end(&mut self) -> String {
        let _ = self.process.start_kill();
        match self.process.wait().await {
            Ok(status) => status.to_string(),
            Err(e) => format!("unknown ({e})"),
        }
    }
}

pub(super) type StdinReceiver = tokio::sync::mpsc::Receiver<std::io::Result<bytes::Bytes>>;

/// How a job's conversation with its child ended, for the child.
pub(super) enum Ended {
    /// It answered and may serve another job.
    Reusable,
    /// It may not (it was cancelled, overran or died under the job).
    Spent,
    /// It died before the job started in it and before any of the job's
    /// stdin was sent (which is handed back): the job may run elsewhere.
    Unstarted(Option<StdinReceiver>),
}

/// One job's conversation with its child.
pub(super) struct Talk<'a> {
    pub(super) child: &'a mut SlotChild,
    pub(super) stdout: &'a OutputCapture,
    pub(super) stderr: &'a OutputCapture,
    pub(super) hooks: &'a RunHooks,
    pub(super) deadline: Option<Duration>,
    pub(super) worker_limit: bool,
    pub(super) limit: u64,
    pub(super) bytes: Option<ModuleSource>,
}

impl Talk<'_> {
    /// Runs the job (`run`, an encoded `ToSlot::Run`) with its streamed
    /// `stdin`; returns its result and what is left of the child.
    ///
    /// Long for a reason: it is one `select!` over the child's messages,
    /// the cancel, stdin and the backstop, whose arms share the
    /// conversation's state (credit, started, cancelled, peak); split
    /// apart, every arm would take all of it.
    pub(super) async fn run(
        mut self,
        run: &[u8],
        mut stdin: Option<StdinReceiver>,
    ) -> (JobResult, Ended) {
        if let Err(e) = self.child.send_frame(run).await {
            let status = self.child.end().await;
            let result = JobResult::host_failure(
                self.limit,
                &format!("the slot process did not take the job ({e}); it ended: {status}"),
            );
            return (result, Ended::Unstarted(stdin));
        }
        let cancel = self.hooks.cancel.clone().unwrap_or_default();
        let mut fed = false;
        let mut credit = STDIN_CREDIT;
        let mut starved = [false; 2];
        let mut peak = 0u64;
        let (mut started, mut cancelled) = (None::<tokio::time::Instant>, None::<CancelCause>);
        let backstop = tokio::time::sleep(Duration::MAX / 4);
        tokio::pin!(backstop);
        let mut armed = false;
        loop {
            let mut failed_send = None;
            tokio::select! {
                biased;
                msg = self.child.next() => match msg {
                    Some(FromSlot::Done { result, overran, warm_held }) => {
                        self.child.warm_held.store(warm_held, Ordering::Relaxed);
                        if overran {
                            self.child.end().await;
                        }
                        let mut result = result;
                        if let (Some(cause), Outcome::Cancelled { .. }) = (cancelled, &result.outcome) {
                            result.outcome = Outcome::Cancelled { cause };
                        }
                        let reusable = !overran && cancelled.is_none();
                        return (result, if reusable { Ended::Reusable } else { Ended::Spent });
                    }
                    Some(FromSlot::NeedModule) => {
                        // Read now if still in its file (on a blocking
                        // thread: the other slots' jobs go on meanwhile).
                        let bytes = match self.bytes.take() {
                            Some(s) => tokio::task::spawn_blocking(move || s.bytes().to_vec())
                                .await
                                .ok(),
                            None => None,
                        };
                        if let Err(e) = self.child.send(&ToSlot::Module(bytes)).await {
                            failed_send = Some(e);
                        }
                    }
                    Some(FromSlot::Started) => {
                        started = Some(tokio::time::Instant::now());
                        if let Some(notify) = &self.hooks.started {
                            notify.notify_one();
                        }
                        if let (Some(d), false) = (self.deadline, armed) {
                            backstop.as_mut().reset(tokio::time::Instant::now() + d + wire::OVERRUN_GRACE + BACKSTOP_GRACE);
                            armed = true;
                        }
                    }
                    Some(FromSlot::Memory(bytes)) => {
                        peak = peak.max(bytes);
                        if let Some(meter) = &self.hooks.memory_meter {
                            meter.store(bytes, Ordering::Relaxed);
                        }
                    }
                    Some(FromSlot::Output(stream, bytes)) => {
                        let i = usize::from(stream == StdStream::Stderr);
                        let capture = [self.stdout, self.stderr][i];
                        if !capture.accept(&bytes) && capture.starved() && !starved[i] {
                            starved[i] = true;
                            if let Err(e) = self.child.send(&ToSlot::Starved(stream)).await {
                                failed_send = Some(e);
                            }
                        }
                    }
                    Some(FromSlot::StdinTaken) => credit += 1,
                    None => {
                        // Killed from outside, by the out-of-memory killer,
                        // or crashed: the job did not end, it was lost (a
                        // map runs it again, a bounded number of times).
                        let status = self.child.end().await;
                        let outcome = match cancelled {
                            Some(cause) => Outcome::Cancelled { cause },
                            None => Outcome::Lost {
                                reason: format!("the slot process running it ended without a result: {status}"),
                            },
                        };
                        let mut result = JobResult::never_ran(self.limit, outcome);
                        result.peak_memory_bytes = peak;
                        if started.is_none() && !fed && cancelled.is_none() {
                            return (result, Ended::Unstarted(stdin));
                        }
                        return (result, Ended::Spent);
                    }
                },
                cause = cancel.cancelled(), if cancelled.is_none() => {
                    cancelled = Some(cause);
                    if let Err(e) = self.child.send(&ToSlot::Cancel(cause)).await {
                        failed_send = Some(e);
                    }
                    backstop.as_mut().reset(tokio::time::Instant::now() + wire::OVERRUN_GRACE + BACKSTOP_GRACE);
                    armed = true;
                }
                item = async { stdin.as_mut().expect("polled only with stdin").recv().await }, if stdin.is_some() && credit > 0 => {
                    let msg = match item {
                        Some(Ok(bytes)) => ToSlot::Stdin(bytes.to_vec()),
                        Some(Err(e)) => ToSlot::StdinFailed(e.to_string()),
                        None => ToSlot::StdinEnd,
                    };
                    if !matches!(msg, ToSlot::Stdin(_)) {
                        stdin = None;
                    }
                    credit -= 1;
                    fed = true;
                    if let Err(e) = self.child.send(&msg).await {
                        failed_send = Some(e);
                    }
                }
                () = &mut backstop, if armed => {
                    let status = self.child.end().await;
                    tracing::warn!("a slot process did not end its job in time and was killed ({status})");
                    let outcome = match cancelled {
                        Some(cause) => Outcome::Cancelled { cause },
                        None => Outcome::TimeLimitExceeded {
                            limit_ms: self.deadline.map_or(0, |d| d.as_millis() as u64),
                            worker_limit: self.worker_limit,
                        },
                    };
                    let mut result = JobResult::never_ran(self.limit, outcome);
                    result.peak_memory_bytes = peak;
                    result.wall_time_us = started.map_or(0, |s| s.elapsed().as_micros() as u64);
                    return (result, Ended::Spent);
                }
            }
            if let Some(e) = failed_send {
                // The child is gone or going: its frames, if any are left,
                // say how; the next read finds the end.
                tracing::debug!("writing to a slot process failed: {e}");
            }
        }
    }
}
