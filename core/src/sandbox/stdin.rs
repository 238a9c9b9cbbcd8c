//! A job's stdin as it arrives: from the terminal or a pipe (`peerwasm
//! run`), or from a streamed request's body (a worker). The job reads what
//! has come and waits (asynchronously: its slot thread serves other jobs,
//! and cancelling it still works) for more; a job that never reads stdin
//! never waits for it.
//!
//! The producer holds a [`StdinSender`]: it sends chunks, an error (the
//! job's next read fails with it), or drops the sender (end of input).
//! The channel is bounded, so a fast producer waits for a slow job instead
//! of the host buffering the input.

use parking_lot::Mutex;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::mpsc;

/// Chunks of input in flight between the producer and the job.
pub const STDIN_CHANNEL_DEPTH: usize = 16;

/// Where a producer sends a job's stdin.
pub type StdinSender = mpsc::Sender<io::Result<Bytes>>;

/// The job's end of a stdin channel; see the module docs. Clones share it,
/// and only the first job run with it reads it.
#[derive(Clone)]
pub struct StdinFeed(Arc<Mutex<Option<mpsc::Receiver<io::Result<Bytes>>>>>);

impl StdinFeed {
    /// A channel: the sender for the producer, the feed for the job.
    pub fn channel() -> (StdinSender, StdinFeed) {
        let (tx, rx) = mpsc::channel(STDIN_CHANNEL_DEPTH);
        (tx, StdinFeed(Arc::new(Mutex::new(Some(rx)))))
    }

    /// The receiving end, for whoever forwards it (a client sending it to a
    /// worker). `None` if it was taken already.
    pub fn take(&self) -> Option<mpsc::Receiver<io::Result<Bytes>>> {
        self.0.lock().take()
    }

    /// The reader for the job: `first` (the spec's stdin), then the feed.
    /// `None` if another job took it already.
    pub(crate) fn reader(&self, first: Vec<u8>) -> Option<FeedReader> {
        let rx = self.take()?;
        Some(FeedReader {
            chunk: Bytes::from(first),
            rx,
        })
    }
}

/// Reads a feed: what is left of the current chunk, then the next one.
pub(crate) struct FeedReader {
    chunk: Bytes,
    rx: mpsc::Receiver<io::Result<Bytes>>,
}

impl AsyncRead for FeedReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        while self.chunk.is_empty() {
            match self.rx.poll_recv(cx) {
                Poll::Ready(Some(Ok(chunk))) => self.chunk = chunk,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(e)),
                Poll::Ready(None) => return Poll::Ready(Ok(())), // the end
                Poll::Pending => return Poll::Pending,
            }
        }
        let n = self.chunk.len().min(buf.remaining());
        buf.put_slice(&self.chunk.split_to(n));
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn reads_the_first_bytes_then_the_feed_to_its_end() {
        let (tx, feed) = StdinFeed::channel();
        let mut r = feed.reader(b"ab".to_vec()).unwrap();
        assert!(feed.reader(Vec::new()).is_none(), "one reader only");
        tokio::spawn(async move {
            tx.send(Ok(Bytes::from_static(b"cd"))).await.unwrap();
            tx.send(Ok(Bytes::from_static(b"ef"))).await.unwrap();
        });
        let mut all = Vec::new();
        r.read_to_end(&mut all).await.unwrap();
        assert_eq!(all, b"abcdef");
    }

    #[tokio::test]
    async fn an_error_reaches_the_reader() {
        let (tx, feed) = StdinFeed::channel();
        let mut r = feed.reader(Vec::new()).unwrap();
        tx.send(Err(io::Error::other("too much"))).await.unwrap();
        let mut all = Vec::new();
        assert_eq!(
            r.read_to_end(&mut all).await.unwrap_err().to_string(),
            "too much"
        );
    }
}
