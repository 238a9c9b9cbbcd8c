//! The disk half of the module cache: compiled artifacts, authenticated and
//! bounded in size.
//!
//! An artifact is native code that wasmtime maps and runs, so only files
//! this cache wrote itself are ever deserialized (as a module or a
//! component, whichever the artifact says it is). Each
//! carries an HMAC-SHA256, under a secret made for this cache directory
//! (`secret.key`, mode 0600), over the module's hash and the artifact: a
//! file planted in the directory, altered, or renamed to another module's
//! name fails the check, is removed without being deserialized, and is
//! counted. wasmtime itself then refuses an artifact of an incompatible
//! engine; artifacts live under a directory named after the engine's
//! compatibility hash, so two builds never fight over one file.
//!
//! The directory is kept under a byte budget: after each write, the least
//! recently used artifacts (by modification time, which a load refreshes)
//! are removed until the rest fit.

use std::fs;
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use wasmtime::Engine;

use super::code::Code;

use crate::proto::ModuleHash;

/// The first bytes of every artifact file; bump on any format change.
const ARTIFACT_MAGIC: &[u8; 8] = b"PWASMA2\n";

/// Bytes of the per-cache secret.
const SECRET_LEN: usize = 32;

/// Why an artifact file was not used.
#[derive(Debug, PartialEq, Eq)]
pub enum Rejected {
    /// Not written by this cache: planted, altered, renamed or truncated.
    Unauthenticated,
    /// Ours, but wasmtime would not load it (an incompatible engine).
    Incompatible(String),
}

impl std::fmt::Display for Rejected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rejected::Unauthenticated => f.write_str("not written by this cache (its MAC does not check out)"),
            Rejected::Incompatible(why) => write!(f, "incompatible: {why}"),
        }
    }
}

/// Compiled artifacts on disk; see the module docs.
pub struct ArtifactStore {
    dir: PathBuf,
    secret: [u8; SECRET_LEN],
    max_bytes: u64,
}

impl ArtifactStore {
    /// The store under `root` for `engine`, at most `max_bytes` in all;
    /// makes the directory (0700) and the secret (0600) if they are missing.
    pub fn open(root: &Path, engine: &Engine, max_bytes: u64) -> anyhow::Result<ArtifactStore> {
        let mut h = std::hash::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut h);
        let dir = root.join(format!("engine-{:016x}", h.finish()));
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| anyhow::anyhow!("cannot create module cache dir {}: {e}", dir.display()))?;
        let secret = secret(&root.join("secret.key"))?;
        Ok(ArtifactStore { dir, secret, max_bytes })
    }

    fn path(&self, hash: &ModuleHash) -> PathBuf {
        self.dir.join(format!("{}.cwasm", hash.to_hex()))
    }

    /// Whether a usable artifact of `hash` is here: it exists and this
    /// cache wrote it (an old-format or planted file is not one, so the
    /// client is asked for the module instead of the job failing later).
    pub fn has(&self, hash: &ModuleHash) -> bool {
        fs::read(self.path(hash)).is_ok_and(|file| self.authentic(hash, &file).is_some())
    }

    /// The artifact inside `file`, if this cache wrote it for `hash`.
    fn authentic<'f>(&self, hash: &ModuleHash, file: &'f [u8]) -> Option<&'f [u8]> {
        let rest = file.strip_prefix(ARTIFACT_MAGIC.as_slice())?;
        let (tag, artifact) = rest.split_at_checked(32)?;
        self.mac(hash, artifact).verify_slice(tag).ok()?;
        Some(artifact)
    }

    fn mac(&self, hash: &ModuleHash, artifact: &[u8]) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.secret).expect("HMAC takes keys of any length");
        mac.update(&hash.0);
        mac.update(artifact);
        mac
    }

    /// The compiled module for `hash`: `Ok(None)` if there is no artifact,
    /// `Err` if there was one that could not be used (it is removed).
    pub fn load(&self, engines: &(Engine, Engine), hash: &ModuleHash) -> Result<Option<Code>, Rejected> {
        let path = self.path(hash);
        let file = match fs::read(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                tracing::warn!(path = %path.display(), "cannot read module artifact: {e}");
                return Ok(None);
            }
        };
        let Some(artifact) = self.authentic(hash, &file) else {
            let _ = fs::remove_file(&path);
            return Err(Rejected::Unauthenticated);
        };
        // SAFETY: the MAC proves this cache wrote these bytes for this
        // module, with an engine of the same compatibility hash (the
        // directory is keyed on it); wasmtime also checks the engine
        // configuration recorded in the artifact. Artifacts never come from
        // peers.
        match unsafe { Code::deserialize(engines, artifact) } {
            Ok(module) => {
                // A load is a use: keep it from being evicted first.
                if let Ok(f) = fs::File::options().write(true).open(&path) {
                    let _ = f.set_modified(SystemTime::now());
                }
                Ok(Some(module))
            }
            Err(e) => {
                let _ = fs::remove_file(&path);
                Err(Rejected::Incompatible(super::code::one_line(&e)))
            }
        }
    }

    /// Writes `module`'s artifact for `hash` (then evicts down to the
    /// budget). Returns the artifacts evicted.
    pub fn store(&self, hash: &ModuleHash, module: &Code) -> anyhow::Result<usize> {
        let artifact = module.serialize().map_err(|e| anyhow::anyhow!("{e}"))?;
        let tag = self.mac(hash, &artifact).finalize().into_bytes();
        // Write then rename, so a reader never sees half a file.
        let mut tmp = tempfile::NamedTempFile::new_in(&self.dir)?;
        tmp.write_all(ARTIFACT_MAGIC)?;
        tmp.write_all(&tag)?;
        tmp.write_all(&artifact)?;
        tmp.persist(self.path(hash))?;
        Ok(self.evict())
    }

    /// Removes the least recently used artifacts until the rest fit the
    /// budget; returns how many went.
    fn evict(&self) -> usize {
        let Ok(entries) = fs::read_dir(&self.dir) else { return 0 };
        let mut files: Vec<(SystemTime, u64, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter(|e| e.path().extension().is_some_and(|x| x == "cwasm"))
            .filter_map(|e| {
                let meta = e.metadata().ok()?;
                Some((meta.modified().ok()?, meta.len(), e.path()))
            })
            .collect();
        let mut total: u64 = files.iter().map(|(_, len, _)| len).sum();
        files.sort();
        let mut evicted = 0;
        for (_, len, path) in files {
            if total <= self.max_bytes {
                break;
            }
            if fs::remove_file(&path).is_ok() {
                total -= len;
                evicted += 1;
            }
        }
        evicted
    }
}

/// The cache's secret at `path`, made (0600) if missing. Made whole in a
/// temporary file and linked into place only if none is there, so workers
/// that share a cache directory and start together agree on one secret.
fn secret(path: &Path) -> anyhow::Result<[u8; SECRET_LEN]> {
    // Read first: every `peerwasm run` opens the cache, and it is made once.
    match fs::read(path) {
        Ok(bytes) => return secret_from(path, bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => anyhow::bail!("cannot read the module cache's secret {}: {e}", path.display()),
    }
    let fresh: [u8; SECRET_LEN] = rand::random();
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::Builder::new()
        .permissions(fs::Permissions::from_mode(0o600))
        .tempfile_in(dir)
        .map_err(|e| anyhow::anyhow!("cannot create the module cache's secret in {}: {e}", dir.display()))?;
    tmp.write_all(&fresh)?;
    match tmp.persist_noclobber(path) {
        Ok(_) => return Ok(fresh),
        Err(e) if e.error.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => anyhow::bail!("cannot create the module cache's secret {}: {}", path.display(), e.error),
    }
    let bytes = fs::read(path).map_err(|e| anyhow::anyhow!("cannot read the module cache's secret {}: {e}", path.display()))?;
    secret_from(path, bytes)
}

/// The secret read from `path`, if it has the right length.
fn secret_from(path: &Path, bytes: Vec<u8>) -> anyhow::Result<[u8; SECRET_LEN]> {
    bytes.try_into().map_err(|_| {
        anyhow::anyhow!(
            "the module cache's secret {} is damaged: remove it (cached modules are then compiled again)",
            path.display()
        )
    })
}
