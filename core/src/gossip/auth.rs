//! Authenticated gossip: with a cluster key (`--cluster-key FILE`, or a
//! loopback worker's own per-user key) every gossip body — requests and
//! replies — travels in an envelope
//!
//! ```text
//! "PWG2" | sent at (unix ms, u64 LE) | nonce (16 random bytes) | payload length (u64 LE)
//!        | head MAC (32) | body MAC (32) | payload
//! ```
//!
//! where the head MAC (HMAC-SHA256) covers the fixed fields before it and
//! the body MAC covers the nonce and the payload. A receiver reads the
//! [`HEADER`] bytes first and checks the head ([`ClusterKey::precheck_at`]):
//! only a sender that knows the key gets the rest of its body read and
//! charged, so strangers trickling bodies cannot fill the budget the
//! pool's own messages need. A message whose MAC does not verify is forged;
//! one sent more than [`WINDOW`] ago (or ahead) or whose nonce was already
//! seen within the window is a replay. Both are dropped by the caller and
//! counted. Time is passed in, so the window is tested without waiting.

use parking_lot::Mutex;
use std::collections::HashMap;

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// How far a message's send time may be from the receiver's clock.
pub const WINDOW_MS: u64 = 30_000;
/// [`WINDOW_MS`] as a duration, for docs.
pub const WINDOW: std::time::Duration = std::time::Duration::from_millis(WINDOW_MS);

const MAGIC: &[u8; 4] = b"PWG2";

/// The envelope's fixed part: what a receiver reads and checks before the
/// payload ([`ClusterKey::precheck_at`]).
pub const HEADER: usize = 4 + 8 + 16 + 8 + 32 + 32;

/// Where the fields are.
const HEAD_FIELDS: std::ops::Range<usize> = 0..36;
const HEAD_MAC: std::ops::Range<usize> = 36..68;
const BODY_MAC: std::ops::Range<usize> = 68..100;

/// Why an envelope was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadEnvelope {
    /// Too short, or not an envelope at all.
    #[error("not an authenticated gossip message")]
    Malformed,
    /// The MAC does not verify: another key, or altered bytes.
    #[error("gossip message with a bad MAC (another cluster key?)")]
    Forged,
    /// Sent too long ago, too far ahead, or seen before.
    #[error("replayed or stale gossip message")]
    Replayed,
}

/// A cluster's shared key, and the nonces seen recently.
pub struct ClusterKey {
    key: Vec<u8>,
    seen: Mutex<HashMap<[u8; 16], u64>>,
}

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterKey(..)")
    }
}

impl ClusterKey {
    /// A key of these bytes (at least 16).
    pub fn new(key: impl Into<Vec<u8>>) -> anyhow::Result<ClusterKey> {
        let key = key.into();
        anyhow::ensure!(key.len() >= 16, "a cluster key must be at least 16 bytes");
        Ok(ClusterKey {
            key,
            seen: Mutex::new(HashMap::new()),
        })
    }

    /// Reads a key file (its contents, without trailing whitespace).
    pub fn load(path: &std::path::Path) -> anyhow::Result<ClusterKey> {
        let bytes = std::fs::read(path)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
        let trimmed = bytes.trim_ascii_end().to_vec();
        ClusterKey::new(trimmed).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    }

    fn mac(&self) -> Hmac<Sha256> {
        Hmac::<Sha256>::new_from_slice(&self.key).expect("HMAC takes keys of any length")
    }

    /// Wraps `payload`, sent at `now_ms` (unix milliseconds).
    pub fn seal_at(&self, payload: &[u8], now_ms: u64) -> Vec<u8> {
        let nonce: [u8; 16] = rand::random();
        let mut out = Vec::with_capacity(HEADER + payload.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&now_ms.to_le_bytes());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        let head = self.head_mac(&out[HEAD_FIELDS]);
        out.extend_from_slice(&head);
        out.extend_from_slice(&self.body_mac(&nonce, payload));
        out.extend_from_slice(payload);
        out
    }

    fn head_mac(&self, fields: &[u8]) -> [u8; 32] {
        let mut mac = self.mac();
        mac.update(b"head");
        mac.update(fields);
        mac.finalize().into_bytes().into()
    }

    fn body_mac(&self, nonce: &[u8], payload: &[u8]) -> [u8; 32] {
        let mut mac = self.mac();
        mac.update(b"body");
        mac.update(nonce);
        mac.update(payload);
        mac.finalize().into_bytes().into()
    }

    /// Checks an envelope's first [`HEADER`] bytes, received at `now_ms`,
    /// before its payload is read: the head MAC, the send time, a nonce not
    /// seen yet. Returns the payload's length, which the rest must be.
    pub fn precheck_at(&self, head: &[u8], now_ms: u64) -> Result<u64, BadEnvelope> {
        if head.len() < HEADER || &head[..4] != MAGIC {
            return Err(BadEnvelope::Malformed);
        }
        let expected = self.head_mac(&head[HEAD_FIELDS]);
        if !constant_time_eq(&expected, &head[HEAD_MAC]) {
            return Err(BadEnvelope::Forged);
        }
        let sent = u64::from_le_bytes(head[4..12].try_into().expect("8 bytes"));
        if sent.abs_diff(now_ms) > WINDOW_MS {
            return Err(BadEnvelope::Replayed);
        }
        let nonce: [u8; 16] = head[12..28].try_into().expect("16 bytes");
        if self.seen.lock().contains_key(&nonce) {
            return Err(BadEnvelope::Replayed);
        }
        Ok(u64::from_le_bytes(
            head[28..36].try_into().expect("8 bytes"),
        ))
    }

    /// Checks an envelope received at `now_ms`; returns its payload.
    pub fn open_at<'a>(&self, wire: &'a [u8], now_ms: u64) -> Result<&'a [u8], BadEnvelope> {
        let len = self.precheck_at(wire, now_ms)?;
        let payload = &wire[HEADER..];
        if payload.len() as u64 != len {
            return Err(BadEnvelope::Forged);
        }
        let nonce = &wire[12..28];
        if !constant_time_eq(&self.body_mac(nonce, payload), &wire[BODY_MAC]) {
            return Err(BadEnvelope::Forged);
        }
        let sent = u64::from_le_bytes(wire[4..12].try_into().expect("8 bytes"));
        let mut seen = self.seen.lock();
        seen.retain(|_, at| at.abs_diff(now_ms) <= WINDOW_MS);
        if seen
            .insert(nonce.try_into().expect("16 bytes"), sent)
            .is_some()
        {
            return Err(BadEnvelope::Replayed);
        }
        Ok(payload)
    }

    /// [`seal_at`](Self::seal_at) now.
    pub fn seal(&self, payload: &[u8]) -> Vec<u8> {
        self.seal_at(payload, unix_ms())
    }

    /// [`precheck_at`](Self::precheck_at) now.
    pub fn precheck(&self, head: &[u8]) -> Result<u64, BadEnvelope> {
        self.precheck_at(head, unix_ms())
    }

    /// [`open_at`](Self::open_at) now.
    pub fn open<'a>(&self, wire: &'a [u8]) -> Result<&'a [u8], BadEnvelope> {
        self.open_at(wire, unix_ms())
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: u64 = 1_800_000_000_000;

    #[test]
    fn sealed_messages_open_once_and_forgeries_do_not() {
        let key = ClusterKey::new(*b"0123456789abcdef-cluster").unwrap();
        let wire = key.seal_at(b"hello", T);
        assert_eq!(key.open_at(&wire, T + 5).unwrap(), b"hello");
        assert_eq!(
            key.open_at(&wire, T + 6),
            Err(BadEnvelope::Replayed),
            "the same message twice"
        );

        let other = ClusterKey::new(*b"another key of 16+ bytes").unwrap();
        assert_eq!(
            other.open_at(&key.seal_at(b"x", T), T),
            Err(BadEnvelope::Forged)
        );
        let mut altered = key.seal_at(b"hello", T);
        *altered.last_mut().unwrap() ^= 1;
        assert_eq!(key.open_at(&altered, T), Err(BadEnvelope::Forged));

        let stale = key.seal_at(b"old", T);
        assert_eq!(
            key.open_at(&stale, T + WINDOW_MS + 1),
            Err(BadEnvelope::Replayed)
        );
        assert_eq!(
            key.open_at(b"PWG2 too short", T),
            Err(BadEnvelope::Malformed)
        );
        assert_eq!(key.open_at(&[0u8; 100], T), Err(BadEnvelope::Malformed));
        assert!(ClusterKey::new(*b"short").is_err());
    }

    #[test]
    fn the_head_is_checked_before_the_payload_is_read() {
        let key = ClusterKey::new(*b"0123456789abcdef-cluster").unwrap();
        let wire = key.seal_at(&[7u8; 1000], T);
        assert_eq!(
            key.precheck_at(&wire[..HEADER], T),
            Ok(1000),
            "the payload's length, from the head alone"
        );
        let stranger = ClusterKey::new(*b"a stranger's key, 16+ bytes").unwrap();
        assert_eq!(
            key.precheck_at(&stranger.seal_at(&[7u8; 1000], T)[..HEADER], T),
            Err(BadEnvelope::Forged)
        );
        // A head that claims another length fails its MAC.
        let mut longer = wire.clone();
        longer[28] ^= 0x40;
        assert_eq!(
            key.precheck_at(&longer[..HEADER], T),
            Err(BadEnvelope::Forged)
        );
        // A true head on another payload: the body MAC catches it.
        let mut swapped = wire.clone();
        swapped[HEADER + 3] ^= 1;
        assert_eq!(key.precheck_at(&swapped[..HEADER], T), Ok(1000));
        assert_eq!(key.open_at(&swapped, T), Err(BadEnvelope::Forged));
        // Once opened, its head is a replay before anything more is read.
        key.open_at(&wire, T).unwrap();
        assert_eq!(
            key.precheck_at(&wire[..HEADER], T),
            Err(BadEnvelope::Replayed)
        );
    }
}
