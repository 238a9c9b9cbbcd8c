//! The guest's stdout and stderr: captured in memory up to a byte cap, and
//! optionally streamed (teed) to whoever submitted the job as it writes.
//!
//! Writing past the cap ends the job with a [`LimitExceeded::Output`] error
//! instead of silently truncating: a user who gets half an output file would
//! rather be told. Exactly the cap is still fine.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
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

/// One captured output stream. Clones share the same buffer.
#[derive(Clone)]
pub struct OutputCapture {
    stream: StdStream,
    state: Arc<Mutex<CaptureState>>,
}

struct CaptureState {
    buf: Vec<u8>,
    cap: usize,
    overflowed: bool,
    tee: Option<UnboundedSender<OutputChunk>>,
}

impl OutputCapture {
    /// A capture keeping at most `cap` bytes, sending each write to `tee` too.
    pub fn new(stream: StdStream, cap: u64, tee: Option<UnboundedSender<OutputChunk>>) -> Self {
        let cap = usize::try_from(cap).unwrap_or(usize::MAX);
        OutputCapture {
            stream,
            state: Arc::new(Mutex::new(CaptureState {
                buf: Vec::new(),
                cap,
                overflowed: false,
                tee,
            })),
        }
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

    /// Takes the captured bytes.
    pub fn take(&self) -> Vec<u8> {
        std::mem::take(&mut self.lock().buf)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CaptureState> {
        // A poisoned lock only means another thread panicked mid-push; the
        // buffer is still a valid Vec.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends what fits; returns how much was taken and whether the cap was hit.
    fn push(&self, bytes: &[u8]) -> (usize, bool) {
        let mut st = self.lock();
        let room = st.cap - st.buf.len();
        let n = bytes.len().min(room);
        st.buf.extend_from_slice(&bytes[..n]);
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
        StreamError::Trap(
            LimitExceeded::Output { stream: self.stream, limit: self.cap() }.into(),
        )
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
        Ok((st.cap - st.buf.len()).max(1))
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for OutputCapture {
    async fn ready(&mut self) {}
}

impl AsyncWrite for OutputCapture {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.push(buf) {
            (n, false) => Poll::Ready(Ok(n)),
            (_, true) => Poll::Ready(Err(std::io::Error::other(LimitExceeded::Output {
                stream: self.stream,
                limit: self.cap(),
            }))),
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
        assert!(matches!(c.write(Bytes::from_static(b"!")), Err(StreamError::Trap(_))));
        assert!(c.overflowed());
        assert!(c.check_write().is_err());
        assert_eq!(c.take(), b"helloworld");
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
