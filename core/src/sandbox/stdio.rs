//! The guest's stdout and stderr: captured in memory up to a byte cap, and
//! optionally streamed (teed) to whoever submitted the job as it writes.
//!
//! Writing past the cap ends the job with a [`LimitExceeded::Output`] error
//! instead of silently truncating: a user who gets half an output file would
//! rather be told. Exactly the cap is still fine.
//!
//! On a worker the buffered bytes are also memory the host holds for the
//! job, outside its linear memory: an [`OutputBudget`] (the worker's memory
//! ledger) is asked for them in [`BUDGET_STEP`]s as the buffer grows. The
//! first [`OUTPUT_ALLOWANCE`] per stream is taken regardless, so a worker
//! whose memory is all reserved still lets its jobs print; past that, a job
//! the worker has no memory left for ends as
//! [`Outcome::OutputMemoryExhausted`](crate::proto::Outcome::OutputMemoryExhausted).

use parking_lot::Mutex;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::AsyncWrite;
use tokio::sync::mpsc::UnboundedSender;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};

use super::limiter::LimitExceeded;
use crate::proto::StdStream;

/// A chunk of output a running job wrote, for streaming.
pub type OutputChunk = (StdStream, Bytes);

/// Host memory the buffered output is charged to (on a worker, its ledger).
pub trait OutputBudget: Send + Sync {
    /// Takes `bytes` more if there is room, or regardless with `force`;
    /// returns whether they were taken. Whoever owns the budget gives them
    /// back once the output is sent or discarded.
    fn try_take(&self, bytes: u64, force: bool) -> bool;
}

/// The budget is asked for output memory in steps of this many bytes, so a
/// job's writes do not each take the ledger's lock.
pub const BUDGET_STEP: u64 = 256 << 10;

/// Output memory per stream taken from the budget even when it has no room.
pub const OUTPUT_ALLOWANCE: u64 = 1 << 20;

/// One captured output stream. Clones share the same buffer.
#[derive(Clone)]
pub struct OutputCapture {
    stream: StdStream,
    state: Arc<Mutex<CaptureState>>,
}

struct CaptureState {
    buf: Vec<u8>,
    /// Bytes accepted so far: `buf.len()`, unless the bytes are not kept.
    len: usize,
    /// Whether accepted bytes are kept in `buf` (else they are only teed).
    keep: bool,
    cap: usize,
    overflowed: bool,
    tee: Option<UnboundedSender<OutputChunk>>,
    budget: Option<Arc<dyn OutputBudget>>,
    /// Bytes taken from the budget so far.
    charged: u64,
    /// The budget had no room for more (and so the write failed).
    starved: bool,
}

impl OutputCapture {
    /// A capture keeping at most `cap` bytes, sending each write to `tee` too.
    pub fn new(stream: StdStream, cap: u64, tee: Option<UnboundedSender<OutputChunk>>) -> Self {
        let cap = usize::try_from(cap).unwrap_or(usize::MAX);
        OutputCapture {
            stream,
            state: Arc::new(Mutex::new(CaptureState {
                buf: Vec::new(),
                len: 0,
                keep: true,
                cap,
                overflowed: false,
                tee,
                budget: None,
                charged: 0,
                starved: false,
            })),
        }
    }

    /// Charges the buffered bytes to `budget` as they grow.
    pub fn with_budget(self, budget: Option<Arc<dyn OutputBudget>>) -> Self {
        self.lock().budget = budget;
        self
    }

    /// Sends what is written to the tee only, keeping none of it (but
    /// still counting it against the cap): for a slot process, whose parent
    /// keeps the output (`runner::slotproc`).
    pub fn forward_only(self) -> Self {
        self.lock().keep = false;
        self
    }

    /// Makes the next write fail as if the budget had no room: the parent
    /// of a slot process found none for what the job wrote.
    pub fn starve(&self) {
        let mut st = self.lock();
        st.starved = true;
        st.overflowed = true;
    }

    /// Takes `bytes` the job wrote elsewhere (in a slot process) as if it
    /// had written them here: kept, teed, charged; `false` once they do
    /// not fit (the cap, or the budget: see [`starved`](Self::starved)).
    pub fn accept(&self, bytes: &[u8]) -> bool {
        !self.push(bytes).1
    }

    /// Whether a write failed because the budget had no room for it (rather
    /// than the cap).
    pub fn starved(&self) -> bool {
        self.lock().starved
    }

    /// The bytes written so far (buffered, unless [`forward_only`](Self::forward_only)).
    pub fn len(&self) -> u64 {
        self.lock().len as u64
    }

    /// Whether nothing was written so far.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Which stream this captures.
    pub fn stream(&self) -> StdStream {
        self.stream
    }

    /// Whether the guest tried to write past the cap.
    pub fn overflowed(&self) -> bool {
        self.lock().overflowed
    }

    /// The cap, in bytes.
    pub fn cap(&self) -> u64 {
        self.lock().cap as u64
    }

    /// A copy of the bytes captured from `offset` on, at most `max`: what a
    /// follower of a running job's output has not seen yet.
    pub fn read_from(&self, offset: u64, max: usize) -> Vec<u8> {
        let st = self.lock();
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(st.buf.len());
        st.buf[start..].iter().take(max).copied().collect()
    }

    /// Takes the captured bytes.
    pub fn take(&self) -> Vec<u8> {
        std::mem::take(&mut self.lock().buf)
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, CaptureState> {
        // A poisoned lock only means another thread panicked mid-push; the
        // buffer is still a valid Vec.
        self.state.lock()
    }

    /// Appends what fits; returns how much was taken and whether the cap was hit.
    fn push(&self, bytes: &[u8]) -> (usize, bool) {
        let mut st = self.lock();
        if st.overflowed {
            return (0, true);
        }
        let room = st.cap - st.len;
        let mut n = bytes.len().min(room);
        let wanted = (st.len + n) as u64;
        if wanted > st.charged
            && let Some(budget) = st.budget.clone()
        {
            let step = (wanted - st.charged).div_ceil(BUDGET_STEP) * BUDGET_STEP;
            if budget.try_take(step, st.charged + step <= OUTPUT_ALLOWANCE) {
                st.charged += step;
            } else {
                n = (st.charged as usize).saturating_sub(st.len).min(n);
                st.starved = true;
            }
        }
        st.len += n;
        if st.keep {
            st.buf.extend_from_slice(&bytes[..n]);
        }
        if let Some(tee) = &st.tee
            && n > 0
        {
            // The receiver may be gone (the submitter stopped listening);
            // the capture still holds everything.
            let _ = tee.send((self.stream, Bytes::copy_from_slice(&bytes[..n])));
        }
        if n < bytes.len() {
            st.overflowed = true;
            return (n, true);
        }
        (n, false)
    }

    fn limit_error(&self) -> StreamError {
        StreamError::Trap(self.limit_exceeded().into())
    }

    fn limit_exceeded(&self) -> LimitExceeded {
        let st = self.lock();
        let limit = if st.starved {
            st.len as u64
        } else {
            st.cap as u64
        };
        LimitExceeded::Output {
            stream: self.stream,
            limit,
        }
    }
}

impl IsTerminal for OutputCapture {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for OutputCapture {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

impl OutputStream for OutputCapture {
    fn write(&mut self, bytes: Bytes) -> Result<(), StreamError> {
        match self.push(&bytes) {
            (_, false) => Ok(()),
            (_, true) => Err(self.limit_error()),
        }
    }

    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }

    fn check_write(&mut self) -> Result<usize, StreamError> {
        let st = self.lock();
        if st.overflowed {
            drop(st);
            return Err(self.limit_error());
        }
        // Never report 0: that means "not ready, wait", and a full capture
        // never becomes ready. Offering one more byte lets the next write
        // find the cap and end the job with a clear error.
        Ok((st.cap - st.len).max(1))
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for OutputCapture {
    async fn ready(&mut self) {}
}

impl AsyncWrite for OutputCapture {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.push(buf) {
            (n, false) => Poll::Ready(Ok(n)),
            (_, true) => Poll::Ready(Err(std::io::Error::other(self.limit_exceeded()))),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_exactly_the_cap_then_refuses() {
        let mut c = OutputCapture::new(StdStream::Stdout, 10, None);
        c.write(Bytes::from_static(b"hello")).unwrap();
        assert_eq!(c.check_write().unwrap(), 5);
        c.write(Bytes::from_static(b"world")).unwrap();
        assert!(!c.overflowed());
        assert_eq!(c.check_write().unwrap(), 1);
        assert!(matches!(
            c.write(Bytes::from_static(b"!")),
            Err(StreamError::Trap(_))
        ));
        assert!(c.overflowed());
        assert!(c.check_write().is_err());
        assert_eq!(c.take(), b"helloworld");
    }

    /// A budget with `room` bytes; counts what it was asked for.
    struct Room(parking_lot::Mutex<u64>);

    impl OutputBudget for Room {
        fn try_take(&self, bytes: u64, force: bool) -> bool {
            let mut room = self.0.lock();
            if force {
                return true;
            }
            if bytes > *room {
                return false;
            }
            *room -= bytes;
            true
        }
    }

    #[test]
    fn output_past_the_allowance_needs_room_in_the_budget() {
        let room = Arc::new(Room(parking_lot::Mutex::new(BUDGET_STEP)));
        let mut c =
            OutputCapture::new(StdStream::Stdout, 64 << 20, None).with_budget(Some(room.clone()));
        let chunk = Bytes::from(vec![b'x'; 64 << 10]);
        let fits = (OUTPUT_ALLOWANCE + BUDGET_STEP) / (64 << 10);
        for _ in 0..fits {
            c.write(chunk.clone()).unwrap();
        }
        assert!(!c.starved());
        assert!(matches!(c.write(chunk), Err(StreamError::Trap(_))));
        assert!(c.starved() && c.overflowed());
        assert_eq!(
            c.len(),
            OUTPUT_ALLOWANCE + BUDGET_STEP,
            "it keeps exactly what was charged"
        );
        assert_eq!(*room.0.lock(), 0);
    }

    #[test]
    fn tees_what_it_keeps() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut c = OutputCapture::new(StdStream::Stderr, 4, Some(tx));
        let _ = c.write(Bytes::from_static(b"abcdef"));
        let (stream, chunk) = rx.try_recv().unwrap();
        assert_eq!(stream, StdStream::Stderr);
        assert_eq!(&chunk[..], b"abcd");
    }
}
