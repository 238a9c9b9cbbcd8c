//! Authenticated gossip: with a cluster key (`--cluster-key FILE`) every
//! gossip body — requests and replies — travels in an envelope
//!
//! ```text
//! "PWG1" | sent at (unix ms, u64 LE) | nonce (16 random bytes) | HMAC-SHA256 (32) | payload
//! ```
//!
//! where the MAC covers everything before and after it. A message whose MAC
//! does not verify is forged; one sent more than [`WINDOW`] ago (or ahead)
//! or whose nonce was already seen within the window is a replay. Both are
//! dropped by the caller and counted. Time is passed in, so the window is
//! tested without waiting.

use std::collections::HashMap;
use parking_lot::Mutex;

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// How far a message's send time may be from the receiver's clock.
pub const WINDOW_MS: u64 = 30_000;
/// [`WINDOW_MS`] as a duration, for docs.
pub const WINDOW: std::time::Duration = std::time::Duration::from_millis(WINDOW_MS);

const MAGIC: &[u8; 4] = b"PWG1";
const HEADER: usize = 4 + 8 + 16 + 32;

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
        Ok(ClusterKey { key, seen: Mutex::new(HashMap::new()) })
    }

    /// Reads a key file (its contents, without trailing whitespace).
    pub fn load(path: &std::path::Path) -> anyhow::Result<ClusterKey> {
        let bytes = std::fs::read(path).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
        let trimmed = bytes.trim_ascii_end().to_vec();
        ClusterKey::new(trimmed).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    }

    fn mac(&self) -> Hmac<Sha256> {
        Hmac::<Sha256>::new_from_slice(&self.key).expect("HMAC takes keys of any length")
    }

    /// Wraps `payload`, sent at `now_ms` (unix milliseconds).
    pub fn seal_at(&self, payload: &[u8], now_ms: u64) -> Vec<u8> {
        let nonce: [u8; 16] = rand::random();
        let mut mac = self.mac();
        mac.update(MAGIC);
        mac.update(&now_ms.to_le_bytes());
        mac.update(&nonce);
        mac.update(payload);
        let tag = mac.finalize().into_bytes();
        let mut out = Vec::with_capacity(HEADER + payload.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&now_ms.to_le_bytes());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&tag);
        out.extend_from_slice(payload);
        out
    }

    /// Checks an envelope received at `now_ms`; returns its payload.
    pub fn open_at<'a>(&self, wire: &'a [u8], now_ms: u64) -> Result<&'a [u8], BadEnvelope> {
        if wire.len() < HEADER || &wire[..4] != MAGIC {
            return Err(BadEnvelope::Malformed);
        }
        let sent = u64::from_le_bytes(wire[4..12].try_into().expect("8 bytes"));
        let nonce: [u8; 16] = wire[12..28].try_into().expect("16 bytes");
        let (tag, payload) = (&wire[28..60], &wire[60..]);
        let mut mac = self.mac();
        mac.update(&wire[..28]);
        mac.update(payload);
        mac.verify_slice(tag).map_err(|_| BadEnvelope::Forged)?;
        if sent.abs_diff(now_ms) > WINDOW_MS {
            return Err(BadEnvelope::Replayed);
        }
        let mut seen = self.seen.lock();
        seen.retain(|_, at| at.abs_diff(now_ms) <= WINDOW_MS);
        if seen.insert(nonce, sent).is_some() {
            return Err(BadEnvelope::Replayed);
        }
        Ok(payload)
    }

    /// [`seal_at`](Self::seal_at) now.
    pub fn seal(&self, payload: &[u8]) -> Vec<u8> {
        self.seal_at(payload, unix_ms())
    }

    /// [`open_at`](Self::open_at) now.
    pub fn open<'a>(&self, wire: &'a [u8]) -> Result<&'a [u8], BadEnvelope> {
        self.open_at(wire, unix_ms())
    }
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
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
        assert_eq!(key.open_at(&wire, T + 6), Err(BadEnvelope::Replayed), "the same message twice");

        let other = ClusterKey::new(*b"another key of 16+ bytes").unwrap();
        assert_eq!(other.open_at(&key.seal_at(b"x", T), T), Err(BadEnvelope::Forged));
        let mut altered = key.seal_at(b"hello", T);
        *altered.last_mut().unwrap() ^= 1;
        assert_eq!(key.open_at(&altered, T), Err(BadEnvelope::Forged));

        let stale = key.seal_at(b"old", T);
        assert_eq!(key.open_at(&stale, T + WINDOW_MS + 1), Err(BadEnvelope::Replayed));
        assert_eq!(key.open_at(b"PWG1 too short", T), Err(BadEnvelope::Malformed));
        assert_eq!(key.open_at(&[0u8; 100], T), Err(BadEnvelope::Malformed));
        assert!(ClusterKey::new(*b"short").is_err());
    }
}
