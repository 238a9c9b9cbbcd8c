//! Length-prefixed postcard frames: how a byte stream (a batch's answers,
//! a streamed job's events, the head of a streamed job's request) carries
//! one message after another. A frame is a 4-byte little-endian length,
//! then that many bytes of postcard.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The largest frame a reader accepts: a result with both output streams
/// at their largest allowed size fits many times over.
pub const MAX_FRAME: usize = 1 << 30;

/// `item` as one frame: length, then postcard.
pub fn encode_frame<T: Serialize>(item: &T) -> Result<Vec<u8>, postcard::Error> {
    let body = postcard::to_allocvec(item)?;
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
    frame.extend_from_slice(&body);
    Ok(frame)
}

/// Splits a byte stream, arriving in pieces of any size, into frames.
#[derive(Default)]
pub struct FrameReader {
    buf: Vec<u8>,
    start: usize,
}

impl FrameReader {
    /// Adds bytes as they arrive.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.start > 0 && self.start >= self.buf.len() / 2 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete frame, `Ok(None)` if it has not all arrived yet,
    /// or an error for bytes that are not frames (the stream is then
    /// unusable).
    pub fn next_frame<T: DeserializeOwned>(&mut self) -> Result<Option<T>, String> {
        self.next_frame_within(MAX_FRAME)
    }

    /// [`next_frame`](Self::next_frame) with a smaller bound on the frame.
    pub fn next_frame_within<T: DeserializeOwned>(
        &mut self,
        max: usize,
    ) -> Result<Option<T>, String> {
        let rest = &self.buf[self.start..];
        let Some(len) = rest.get(..4) else {
            return Ok(None);
        };
        let len = u32::from_le_bytes(len.try_into().expect("four bytes")) as usize;
        if len > max {
            return Err(format!(
                "a frame of {len} bytes is larger than the limit of {max}"
            ));
        }
        let Some(body) = rest.get(4..4 + len) else {
            return Ok(None);
        };
        let item = postcard::from_bytes(body).map_err(|e| format!("unreadable frame: {e}"))?;
        self.start += 4 + len;
        Ok(Some(item))
    }

    /// Bytes received that do not yet make a whole frame.
    pub fn pending(&self) -> usize {
        self.buf.len() - self.start
    }

    /// The bytes received past the last whole frame, taken out.
    pub fn take_rest(&mut self) -> Vec<u8> {
        let rest = self.buf.split_off(self.start);
        self.buf.clear();
        self.start = 0;
        rest
    }
}
