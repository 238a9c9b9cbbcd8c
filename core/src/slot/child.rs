//! The child's side: `peerwasm slot`, a process that runs a worker's jobs
//! one at a time with no time-limit instrumentation, and ends itself when
//! one of them computes past its deadline or a cancel ([`crate::slot`]).
//!
//! It reads [`ToSlot`] frames on stdin and writes [`FromSlot`] frames on
//! stdout, nothing else (its logs go to stderr). Its parent going away
//! (stdin closed) cancels the job that runs and ends the process.

use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use super::{Alone, AloneJob, Event, run_alone};
use crate::proto::frame::{FrameReader, encode_frame};
use crate::proto::{CancelCause, StdStream};
use crate::runner::slotproc::wire::{FromSlot, ToSlot};
use crate::runner::{JobRunner, RunnerConfig};
use crate::sandbox::{LiveOutput, StdinFeed, StdinSender};

/// How often a running job's memory is reported when it changed.
const MEMORY_REPORT_INTERVAL: Duration = Duration::from_millis(10);

/// Serves jobs until the parent closes stdin; never returns after an
/// overrun (the process exits).
pub fn serve() -> anyhow::Result<()> {
    crate::child::start()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(serve_async())
}

/// Where the reader sends what the parent says to the job that runs now.
#[derive(Default)]
struct Current {
    stdin: Option<mpsc::UnboundedSender<Option<std::io::Result<bytes::Bytes>>>>,
    captures: Option<LiveOutput>,
    cancel: Option<oneshot::Sender<CancelCause>>,
}

/// What the reader passes to the main loop.
enum Request {
    Setup(crate::sandbox::SandboxConfig),
    /// A job, with its ends of what the reader routes to it: made when its
    /// `Run` is read, so that nothing sent after it reaches another job.
    Run {
        spec: crate::sandbox::RunSpec,
        scratch_bytes: Option<u64>,
        streamed_stdin: bool,
        stdin: mpsc::UnboundedReceiver<Option<std::io::Result<bytes::Bytes>>>,
        captures: LiveOutput,
        cancel: oneshot::Receiver<CancelCause>,
    },
    Module(Option<Vec<u8>>),
}

/// An item for the writer: a frame, or a request to say when all before
/// it are written.
#[allow(clippy::large_enum_variant)] // as `FromSlot`: one large frame per job
enum Out {
    Frame(FromSlot),
    Flushed(oneshot::Sender<()>),
}

async fn serve_async() -> anyhow::Result<()> {
    let (out, out_rx) = mpsc::unbounded_channel::<Out>();
    tokio::spawn(write_frames(out_rx));
    let (requests, mut requests_rx) = mpsc::unbounded_channel::<Request>();
    let reader = tokio::spawn(read_frames(requests));

    let setup = match requests_rx.recv().await {
        Some(Request::Setup(setup)) => setup,
        Some(_) => bail!("a slot process expects its setup first"),
        None => return Ok(()),
    };
    let config = setup;
    let runner = JobRunner::new(RunnerConfig {
        sandbox: config,
        ..RunnerConfig::default()
    })
    .context("cannot set up the slot's sandbox")?;
    let send = |m: FromSlot| {
        let _ = out.send(Out::Frame(m));
    };
    loop {
        let (spec, scratch_bytes, streamed_stdin, stdin_rx, captures, cancel_rx) =
            match requests_rx.recv().await {
                Some(Request::Run {
                    spec,
                    scratch_bytes,
                    streamed_stdin,
                    stdin,
                    captures,
                    cancel,
                }) => (spec, scratch_bytes, streamed_stdin, stdin, captures, cancel),
                Some(_) => bail!("a slot process expects a job"),
                None => break, // the parent is gone
            };
        if !runner.has_module(&spec.module) {
            send(FromSlot::NeedModule);
            match requests_rx.recv().await {
                Some(Request::Module(Some(bytes))) => runner.add_module_hashed(spec.module, bytes),
                Some(Request::Module(None)) => {}
                Some(_) => bail!("a slot process expects the module"),
                None => break,
            }
        }
        if let Some(pool) = runner.sandbox().scratch_pool() {
            pool.set_total(scratch_bytes.unwrap_or(u64::MAX));
        }

        // Streamed stdin is fed as it comes; otherwise the job reads
        // `spec.stdin`, as in the worker's process.
        let (feed_tx, feed) = StdinFeed::channel();
        let forwarder = tokio::spawn(forward_stdin(stdin_rx, feed_tx, out.clone()));
        let feed = streamed_stdin.then_some(feed);
        let memory = Arc::new(AtomicU64::new(0));
        let meter = tokio::spawn(report_memory(memory.clone(), out.clone()));
        let job = AloneJob {
            spec,
            stdin: feed,
            stream: true,
            forward_only: true,
            memory,
            captures,
        };
        let interrupt = async move { cancel_rx.await.ok() };
        let ended = run_alone(&runner, job, interrupt, |event| match event {
            Event::Started => send(FromSlot::Started),
            Event::Output((stream, bytes)) => send(FromSlot::Output(stream, bytes.to_vec())),
        })
        .await;
        meter.abort();
        forwarder.abort();
        let (result, overran) = match ended {
            Alone::Ended(result) => (result, false),
            Alone::Overran(result) => (result, true),
        };
        let warm_held = runner.sandbox().warm_stats().held_bytes;
        send(FromSlot::Done {
            result,
            overran,
            warm_held,
        });
        if overran {
            // The job still computes on the slot thread: say so, then end.
            let (flushed, written) = oneshot::channel();
            let _ = out.send(Out::Flushed(flushed));
            let _ = tokio::time::timeout(Duration::from_secs(5), written).await;
            drop(
                runner
                    .sandbox()
                    .config()
                    .scratch_root
                    .as_ref()
                    .map(std::fs::remove_dir_all),
            );
            std::process::exit(0);
        }
    }
    reader.abort();
    Ok(())
}

/// Reads the parent's frames: jobs and modules to the main loop, a job's
/// stdin, cancel and starvation to the job that runs. Stdin closing is the
/// parent going away: the running job is cancelled and the loop told.
async fn read_frames(requests: mpsc::UnboundedSender<Request>) {
    let mut cur = Current::default();
    let mut stdin = from_parent();
    let mut frames = FrameReader::default();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        loop {
            let msg = match frames.next_frame::<ToSlot>() {
                Ok(Some(msg)) => msg,
                Ok(None) => break,
                Err(e) => {
                    tracing::error!("slot process: unreadable frame from the worker: {e}");
                    return parent_gone(&mut cur);
                }
            };
            match msg {
                ToSlot::Stdin(bytes) => send_stdin(&cur, Some(Ok(bytes.into()))),
                ToSlot::StdinFailed(why) => send_stdin(&cur, Some(Err(std::io::Error::other(why)))),
                ToSlot::StdinEnd => send_stdin(&cur, None),
                ToSlot::Starved(stream) => {
                    if let Some(live) = &cur.captures
                        && let Some(captures) = live.lock().as_ref()
                    {
                        captures[usize::from(stream == StdStream::Stderr)].starve();
                    }
                }
                ToSlot::Cancel(cause) => {
                    if let Some(cancel) = cur.cancel.take() {
                        let _ = cancel.send(cause);
                    }
                }
                ToSlot::Run {
                    spec,
                    scratch_bytes,
                    streamed_stdin,
                } => {
                    let (stdin_tx, stdin) = mpsc::unbounded_channel();
                    let (cancel_tx, cancel) = oneshot::channel();
                    let captures = LiveOutput::default();
                    cur = Current {
                        stdin: Some(stdin_tx),
                        captures: Some(captures.clone()),
                        cancel: Some(cancel_tx),
                    };
                    if requests
                        .send(Request::Run {
                            spec,
                            scratch_bytes,
                            streamed_stdin,
                            stdin,
                            captures,
                            cancel,
                        })
                        .is_err()
                    {
                        return;
                    }
                }
                ToSlot::Setup(setup) => {
                    if requests.send(Request::Setup(setup)).is_err() {
                        return;
                    }
                }
                ToSlot::Module(bytes) => {
                    if requests.send(Request::Module(bytes)).is_err() {
                        return;
                    }
                }
            }
        }
        match stdin.read(&mut buf).await {
            Ok(0) | Err(_) => return parent_gone(&mut cur),
            Ok(n) => frames.push(&buf[..n]),
        }
    }
}

fn send_stdin(cur: &Current, item: Option<std::io::Result<bytes::Bytes>>) {
    if let Some(stdin) = &cur.stdin {
        let _ = stdin.send(item);
    }
}

/// The parent is gone: nobody will read the job's result, so it is
/// cancelled (and `requests` closing ends the loop after it).
fn parent_gone(cur: &mut Current) {
    if let Some(cancel) = cur.cancel.take() {
        let _ = cancel.send(CancelCause::ClientGone);
    }
}

/// Passes stdin chunks to the job as it takes them, telling the parent
/// each time one was taken (its credit back). `None` is the end of input.
async fn forward_stdin(
    mut from_parent: mpsc::UnboundedReceiver<Option<std::io::Result<bytes::Bytes>>>,
    to_job: StdinSender,
    out: mpsc::UnboundedSender<Out>,
) {
    while let Some(Some(item)) = from_parent.recv().await {
        let failed = item.is_err();
        if to_job.send(item).await.is_err() || failed {
            return;
        }
        let _ = out.send(Out::Frame(FromSlot::StdinTaken));
    }
}

/// Tells the parent the job's memory whenever it changed.
async fn report_memory(memory: Arc<AtomicU64>, out: mpsc::UnboundedSender<Out>) {
    let mut told = 0;
    let mut tick = tokio::time::interval(MEMORY_REPORT_INTERVAL);
    loop {
        tick.tick().await;
        let now = memory.load(Ordering::Relaxed);
        if now != told {
            told = now;
            if out.send(Out::Frame(FromSlot::Memory(now))).is_err() {
                return;
            }
        }
    }
}

/// The pipe the parent writes to (stdin), read with epoll on this
/// thread. Tokio's own stdin and stdout hand every read and write to a
/// blocking thread: two thread hops per frame, each a wake-up and a
/// switch, and on a job of a millisecond those were a large part of its
/// cost. Not a pipe (a test run by hand): tokio's stdin.
fn from_parent() -> std::pin::Pin<Box<dyn tokio::io::AsyncRead + Send>> {
    match std::io::stdin()
        .as_fd()
        .try_clone_to_owned()
        .and_then(tokio::net::unix::pipe::Receiver::from_owned_fd)
    {
        Ok(pipe) => Box::pin(pipe),
        Err(_) => Box::pin(tokio::io::stdin()),
    }
}

/// The pipe to the parent (stdout), as [`from_parent`].
fn to_parent() -> std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>> {
    match std::io::stdout()
        .as_fd()
        .try_clone_to_owned()
        .and_then(tokio::net::unix::pipe::Sender::from_owned_fd)
    {
        Ok(pipe) => Box::pin(pipe),
        Err(_) => Box::pin(tokio::io::stdout()),
    }
}

/// Writes frames to stdout in order.
async fn write_frames(mut items: mpsc::UnboundedReceiver<Out>) {
    let mut stdout = to_parent();
    while let Some(item) = items.recv().await {
        match item {
            Out::Frame(msg) => {
                let frame = match encode_frame(&msg) {
                    Ok(f) => f,
                    Err(e) => {
                        tracing::error!("slot process: cannot encode a frame: {e}");
                        continue;
                    }
                };
                if stdout.write_all(&frame).await.is_err() {
                    return; // the parent is gone; the reader sees it too
                }
                // More frames waiting are written before the flush.
                if items.is_empty() && stdout.flush().await.is_err() {
                    return;
                }
            }
            Out::Flushed(done) => {
                let _ = stdout.flush().await;
                let _ = done.send(());
            }
        }
    }
}
