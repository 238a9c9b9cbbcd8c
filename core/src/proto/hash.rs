//! [`ModuleHash`]: the sha256 a module (or a shipped file) goes by.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The sha256 of a module's bytes: the name a module goes by everywhere.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ModuleHash(pub [u8; 32]);

impl ModuleHash {
    /// Hashes `bytes`.
    pub fn of(bytes: &[u8]) -> ModuleHash {
        use sha2::Digest;
        ModuleHash(sha2::Sha256::digest(bytes).into())
    }

    /// The lowercase hex form, as used in URLs and file names.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// Parses the hex form; `None` unless it is exactly 64 hex digits.
    pub fn from_hex(s: &str) -> Option<ModuleHash> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out).ok()?;
        Some(ModuleHash(out))
    }
}

impl fmt::Debug for ModuleHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ModuleHash({})", &self.to_hex()[..12])
    }
}

impl fmt::Display for ModuleHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}
