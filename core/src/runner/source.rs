//! [`ModuleSource`]: a module's bytes as a job and a runner hold them — in
//! hand, or in a file whose hash is known by its stamp, read the first time
//! something needs them.
//!
//! Why: what needs a module's bytes is a compile (a cache miss) or an
//! upload to a worker that lacks it. A run whose compiled code is cached
//! needs only the hash and the length (which decides whether its jobs go to
//! slot processes). CPython for WASI is ~95 MB: reading it took 63 ms of a
//! 132 ms `peerwasm run`, ~50 ms of a fresh Python process's first map on
//! the embedded worker, and kept 95 MB in that process (a notebook's) for
//! nothing.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use anyhow::Context;

/// A module's bytes, in hand or left in their file until needed. Clones
/// share one read.
#[derive(Clone, Debug)]
pub struct ModuleSource(Inner);

#[derive(Clone, Debug)]
enum Inner {
    InHand(Arc<[u8]>),
    InFile {
        path: PathBuf,
        len: u64,
        read: Arc<OnceLock<Arc<[u8]>>>,
    },
}

impl ModuleSource {
    /// Bytes already read.
    pub fn in_hand(bytes: Arc<[u8]>) -> ModuleSource {
        ModuleSource(Inner::InHand(bytes))
    }

    /// The module in the regular file at `path`, `len` bytes long when its
    /// hash was taken; read on first [`bytes`](Self::bytes).
    pub fn in_file(path: PathBuf, len: u64) -> ModuleSource {
        ModuleSource(Inner::InFile {
            path,
            len,
            read: Arc::default(),
        })
    }

    /// Its length in bytes, without reading it.
    pub fn len(&self) -> u64 {
        match &self.0 {
            Inner::InHand(bytes) => bytes.len() as u64,
            Inner::InFile { len, .. } => *len,
        }
    }

    /// Whether it has no bytes (no module has none).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes, read now if they were left in their file. A file that
    /// can no longer be read gives no bytes, said in the log: whatever
    /// needs them then finds they do not match the module's hash and says
    /// so, as for any wrong bytes.
    pub fn bytes(&self) -> &Arc<[u8]> {
        match &self.0 {
            Inner::InHand(bytes) => bytes,
            Inner::InFile { path, read, .. } => read.get_or_init(|| match read_module(path) {
                Ok((bytes, _)) => bytes,
                Err(e) => {
                    tracing::warn!("{e:#}");
                    Arc::from(&[][..])
                }
            }),
        }
    }

    /// Whether the bytes are in hand (or were read since).
    pub fn is_read(&self) -> bool {
        match &self.0 {
            Inner::InHand(_) => true,
            Inner::InFile { read, .. } => read.get().is_some(),
        }
    }
}

impl From<Arc<[u8]>> for ModuleSource {
    fn from(bytes: Arc<[u8]>) -> ModuleSource {
        ModuleSource::in_hand(bytes)
    }
}

impl From<Vec<u8>> for ModuleSource {
    fn from(bytes: Vec<u8>) -> ModuleSource {
        ModuleSource::in_hand(bytes.into())
    }
}

/// The module file at `path`, read straight into the buffer jobs share
/// (a module of 20 MB is neither copied nor written twice on its way to
/// the engine), and its metadata as it was when opened: a regular file in
/// one read of its length, anything else (a pipe: `run <(curl ...)`) to
/// its end.
pub(crate) fn read_module(path: &Path) -> anyhow::Result<(Arc<[u8]>, std::fs::Metadata)> {
    let read = || -> std::io::Result<_> {
        let mut file = std::fs::File::open(path)?;
        let metadata = file.metadata()?;
        if !metadata.is_file() {
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut file, &mut bytes)?;
            return Ok((bytes.into(), metadata));
        }
        let len = usize::try_from(metadata.len()).map_err(std::io::Error::other)?;
        // SAFETY: all zeros is a valid `u8`.
        let mut bytes = unsafe { Arc::<[u8]>::new_zeroed_slice(len).assume_init() };
        std::io::Read::read_exact(&mut file, Arc::get_mut(&mut bytes).expect("not shared yet"))?;
        Ok((bytes, metadata))
    };
    read().with_context(|| format!("cannot read {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_source_is_read_once_when_its_bytes_are_asked_for() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.wasm");
        std::fs::write(&path, b"\0asm\x01\0\0\0").unwrap();
        let source = ModuleSource::in_file(path.clone(), 8);
        let shared = source.clone();
        assert_eq!(source.len(), 8);
        assert!(!source.is_read(), "its length needs no read");
        assert_eq!(&source.bytes()[..], b"\0asm\x01\0\0\0");
        assert!(shared.is_read(), "clones share the read");
        std::fs::remove_file(&path).unwrap();
        assert_eq!(shared.bytes().len(), 8, "read once, kept");
        // Gone before it was read: no bytes, which no hash matches.
        let gone = ModuleSource::in_file(path, 8);
        assert!(gone.bytes().is_empty());
    }
}
