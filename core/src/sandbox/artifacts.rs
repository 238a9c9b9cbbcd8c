//! The disk half of the module cache: compiled artifacts, authenticated and
//! bounded in size, loaded by mapping them.
//!
//! An artifact is native code that wasmtime maps and runs, so only files
//! this cache wrote itself are ever loaded (as a module or a component,
//! whichever the artifact was). Each `<module sha256>.cwasm` is wasmtime's
//! artifact as it is, so that it can be *mapped* rather than read and
//! copied: CPython's 247 MB artifact starts in milliseconds and costs only
//! the pages its jobs touch, where reading it cost 0.5 s and 600 MB per
//! start. Beside it, `<sha256>.mac` holds two HMAC-SHA256 tags under a
//! secret made for this cache directory (`secret.key`, mode 0600):
//!
//! * over the module's hash, the artifact's kind and its **contents** — the
//!   full check, which reads the whole file;
//! * over the module's hash, the kind and the file's **identity** (device,
//!   inode, size and ctime) — the quick check, which reads nothing. A write
//!   to the file, a file planted or copied in its place, or a rename all
//!   change its inode or ctime, and nobody but root can set a ctime back.
//!
//! A load whose quick check fails falls back to the full check (a
//! directory restored from a backup keeps its artifacts) and, if that
//! passes, stamps the file anew; a file that fails both is removed without
//! being loaded, and counted. The mapping is of the very file that was
//! checked (its open descriptor). wasmtime itself then refuses an artifact
//! of an incompatible engine; artifacts live under a directory named after
//! the engine's compatibility hash, so two builds never fight over one file.
//!
//! The directory is kept under a byte budget: after each write, the least
//! recently used artifacts (by the modification time of their `.mac`,
//! which a load refreshes: the artifact's own would change its ctime) are
//! removed until the rest fit. A removed or replaced artifact that is still
//! mapped stays valid: files are only ever replaced by renaming a new one
//! into place, never written over. Other engines' directories (an older
//! build's) are removed after a compile once unused for two weeks.

use std::fs;
use std::hash::{Hash, Hasher};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use wasmtime::Engine;

use super::code::Code;

use crate::proto::ModuleHash;

/// The first bytes of every `.mac` file; bump on any format change.
const MAC_MAGIC: &[u8; 8] = b"PWASMA3\n";

/// Bytes of a `.mac` file: magic, kind, content tag, identity tag.
const MAC_FILE_LEN: usize = 8 + 1 + 32 + 32;

/// Bytes of the per-cache secret.
const SECRET_LEN: usize = 32;

/// How long another engine's directory must have gone unused before a
/// compile removes it ([`ArtifactStore::remove_unused_engines`]): the
/// engines this build makes (one per time-limit mechanism) are each used
/// whenever their jobs run, and an old one costs only a compile if wrong.
const ENGINE_DIR_UNUSED: std::time::Duration = std::time::Duration::from_secs(14 * 24 * 3600);

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
            Rejected::Unauthenticated => {
                f.write_str("not written by this cache (its MAC does not check out)")
            }
            Rejected::Incompatible(why) => write!(f, "incompatible: {why}"),
        }
    }
}

/// What an artifact holds: wasmtime loads the two kinds by different calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Module = 1,
    Component = 2,
}

/// A `.mac` file, read.
struct Tags {
    kind: Kind,
    content: [u8; 32],
    identity: [u8; 32],
}

/// The identity of an open file: what any change of its bytes changes.
fn identity(meta: &fs::Metadata) -> [i64; 5] {
    [
        meta.dev() as i64,
        meta.ino() as i64,
        meta.size() as i64,
        meta.ctime(),
        meta.ctime_nsec(),
    ]
}

/// Compiled artifacts on disk; see the module docs.
pub struct ArtifactStore {
    dir: PathBuf,
    secret: [u8; SECRET_LEN],
    max_bytes: u64,
}

impl ArtifactStore {
    /// The disk cache of `config` for the engine `config` makes — another
    /// process's, such as a slot process's — opened without making that
    /// engine's instance pool (the pool does not change what code is
    /// compiled for, as `engine`'s tests show). `None` without a cache dir
    /// or when it cannot be opened.
    pub fn for_config(config: &super::config::SandboxConfig) -> Option<ArtifactStore> {
        let dir = config.cache_dir.as_deref()?;
        let probe = super::config::SandboxConfig {
            pooling: false,
            ..config.clone()
        };
        super::engine::build(&probe)
            .and_then(|engine| ArtifactStore::open(dir, &engine, config.cache_max_bytes))
            .ok()
    }

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
            .map_err(|e| {
                anyhow::anyhow!("cannot create module cache dir {}: {e}", dir.display())
            })?;
        let secret = secret(&root.join("secret.key"))?;
        Ok(ArtifactStore {
            dir,
            secret,
            max_bytes,
        })
    }

    fn path(&self, hash: &ModuleHash) -> PathBuf {
        self.dir.join(format!("{}.cwasm", hash.to_hex()))
    }

    fn mac_path(&self, hash: &ModuleHash) -> PathBuf {
        self.dir.join(format!("{}.mac", hash.to_hex()))
    }

    fn mac(&self, what: &[u8], hash: &ModuleHash, kind: Kind) -> Hmac<Sha256> {
        let mut mac =
            Hmac::<Sha256>::new_from_slice(&self.secret).expect("HMAC takes keys of any length");
        mac.update(what);
        mac.update(&hash.0);
        mac.update(&[kind as u8]);
        mac
    }

    fn identity_tag(&self, hash: &ModuleHash, kind: Kind, meta: &fs::Metadata) -> [u8; 32] {
        let mut mac = self.mac(b"identity", hash, kind);
        for n in identity(meta) {
            mac.update(&n.to_le_bytes());
        }
        mac.finalize().into_bytes().into()
    }

    fn read_tags(&self, hash: &ModuleHash) -> Option<Tags> {
        let bytes = fs::read(self.mac_path(hash)).ok()?;
        let rest = bytes
            .strip_prefix(MAC_MAGIC.as_slice())
            .filter(|_| bytes.len() == MAC_FILE_LEN)?;
        let kind = match rest[0] {
            1 => Kind::Module,
            2 => Kind::Component,
            _ => return None,
        };
        Some(Tags {
            kind,
            content: rest[1..33].try_into().ok()?,
            identity: rest[33..65].try_into().ok()?,
        })
    }

    fn write_tags(&self, hash: &ModuleHash, tags: &Tags) -> std::io::Result<()> {
        let mut tmp = tempfile::NamedTempFile::new_in(&self.dir)?;
        tmp.write_all(MAC_MAGIC)?;
        tmp.write_all(&[tags.kind as u8])?;
        tmp.write_all(&tags.content)?;
        tmp.write_all(&tags.identity)?;
        tmp.persist(self.mac_path(hash))?;
        Ok(())
    }

    /// The artifact of `hash`, opened and checked: `Ok(None)` if there is
    /// none, `Err` if there is one this cache did not write as it is now
    /// (both of its files are then removed if `remove`: a load removes and
    /// counts it; a mere look leaves that to the load).
    fn open_checked(
        &self,
        hash: &ModuleHash,
        remove: bool,
    ) -> Result<Option<(fs::File, Kind)>, Rejected> {
        let path = self.path(hash);
        let mut file = match fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                tracing::warn!(path = %path.display(), "cannot read module artifact: {e}");
                return Ok(None);
            }
        };
        let checked = (|| {
            let tags = self.read_tags(hash)?;
            let meta = file.metadata().ok()?;
            if self.identity_tag(hash, tags.kind, &meta) == tags.identity {
                return Some(tags.kind);
            }
            // The quick check failed: read it all.
            let mut contents = Vec::new();
            file.read_to_end(&mut contents).ok()?;
            let mut mac = self.mac(b"content", hash, tags.kind);
            mac.update(&contents);
            mac.verify_slice(&tags.content).ok()?;
            let identity = self.identity_tag(hash, tags.kind, &meta);
            let _ = self.write_tags(hash, &Tags { identity, ..tags });
            Some(tags.kind)
        })();
        match checked {
            Some(kind) => Ok(Some((file, kind))),
            None => {
                if remove {
                    let _ = fs::remove_file(&path);
                    let _ = fs::remove_file(self.mac_path(hash));
                }
                Err(Rejected::Unauthenticated)
            }
        }
    }

    /// Whether a usable artifact of `hash` is here: it exists and this
    /// cache wrote it (an old-format or planted file is not one, so the
    /// client is asked for the module instead of the job failing later).
    pub fn has(&self, hash: &ModuleHash) -> bool {
        matches!(self.open_checked(hash, false), Ok(Some(_)))
    }

    /// The compiled module for `hash`, mapped from its file: `Ok(None)` if
    /// there is no artifact, `Err` if there was one that could not be used
    /// (it is removed).
    pub fn load(
        &self,
        engines: &(Engine, Engine),
        hash: &ModuleHash,
    ) -> Result<Option<Code>, Rejected> {
        let Some((file, kind)) = self.open_checked(hash, true)? else {
            return Ok(None);
        };
        // SAFETY: the MAC proves this cache wrote this very file (the one
        // open here) for this module, with an engine of the same
        // compatibility hash (the directory is keyed on it); wasmtime also
        // checks the engine configuration recorded in the artifact.
        // Artifacts never come from peers, and are never written over in
        // place (see the module docs), so the mapping stays as checked.
        let loaded = unsafe { Code::map(engines, file, kind == Kind::Component) };
        match loaded {
            Ok(module) => {
                // A load is a use: keep it from being evicted first.
                if let Ok(f) = fs::File::options().write(true).open(self.mac_path(hash)) {
                    let _ = f.set_modified(SystemTime::now());
                }
                Ok(Some(module))
            }
            Err(e) => {
                let _ = fs::remove_file(self.path(hash));
                let _ = fs::remove_file(self.mac_path(hash));
                Err(Rejected::Incompatible(super::code::one_line(&e)))
            }
        }
    }

    /// Writes `module`'s artifact for `hash` (then evicts down to the
    /// budget). Returns the artifacts evicted.
    pub fn store(&self, hash: &ModuleHash, module: &Code) -> anyhow::Result<usize> {
        let artifact = module.serialize().map_err(|e| anyhow::anyhow!("{e}"))?;
        let kind = match module {
            Code::Module(_) => Kind::Module,
            Code::Component(_) => Kind::Component,
        };
        let mut content = self.mac(b"content", hash, kind);
        content.update(&artifact);
        // Write then rename, so a reader never sees half a file; the
        // identity is taken after the rename (which sets the ctime).
        let mut tmp = tempfile::NamedTempFile::new_in(&self.dir)?;
        tmp.write_all(&artifact)?;
        tmp.as_file().sync_data()?;
        let file = tmp.persist(self.path(hash))?;
        let identity = self.identity_tag(hash, kind, &file.metadata()?);
        self.write_tags(
            hash,
            &Tags {
                kind,
                content: content.finalize().into_bytes().into(),
                identity,
            },
        )?;
        self.remove_unused_engines(ENGINE_DIR_UNUSED);
        Ok(self.evict())
    }

    /// Removes the other engines' directories that nothing has loaded from
    /// for `unused`: those of an older peerwasm or wasmtime, whose engine
    /// this build no longer makes, would otherwise keep up to their budget
    /// each for ever. A directory is as recent as its newest `.mac` (a load
    /// refreshes it) or, holding none, as itself. Run after a compile, not
    /// on a job's way in; a still-mapped artifact stays valid when removed.
    fn remove_unused_engines(&self, unused: std::time::Duration) {
        let (Some(root), Some(own)) = (self.dir.parent(), self.dir.file_name()) else {
            return;
        };
        let Ok(entries) = fs::read_dir(root) else {
            return;
        };
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name();
            if name == own
                || !name.to_string_lossy().starts_with("engine-")
                || !entry.path().is_dir()
            {
                continue;
            }
            let dir = entry.path();
            let macs = fs::read_dir(&dir)
                .into_iter()
                .flatten()
                .filter_map(Result::ok)
                .filter(|e| e.path().extension().is_some_and(|x| x == "mac"));
            let last_used = macs
                .filter_map(|e| e.metadata().and_then(|m| m.modified()).ok())
                .max()
                .or_else(|| fs::metadata(&dir).and_then(|m| m.modified()).ok());
            if last_used
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age >= unused)
            {
                match fs::remove_dir_all(&dir) {
                    Ok(()) => {
                        tracing::info!(dir = %dir.display(), "removed another engine's compiled modules, unused for {}", humantime::format_duration(unused))
                    }
                    Err(e) => {
                        tracing::warn!(dir = %dir.display(), "cannot remove another engine's unused compiled modules: {e}")
                    }
                }
            }
        }
    }

    /// Removes the least recently used artifacts until the rest fit the
    /// budget; returns how many went.
    fn evict(&self) -> usize {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return 0;
        };
        let mut files: Vec<(SystemTime, u64, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter(|e| e.path().extension().is_some_and(|x| x == "cwasm"))
            .filter_map(|e| {
                let meta = e.metadata().ok()?;
                let used = fs::metadata(e.path().with_extension("mac"))
                    .and_then(|m| m.modified())
                    .unwrap_or(SystemTime::UNIX_EPOCH);
                Some((used, meta.len() + MAC_FILE_LEN as u64, e.path()))
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
                let _ = fs::remove_file(path.with_extension("mac"));
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
        Err(e) => anyhow::bail!(
            "cannot read the module cache's secret {}: {e}",
            path.display()
        ),
    }
    let fresh: [u8; SECRET_LEN] = rand::random();
    match crate::private_path::create_once(path, &fresh) {
        Ok(true) => return Ok(fresh),
        Ok(false) => {}
        Err(e) => anyhow::bail!(
            "cannot create the module cache's secret {}: {e}",
            path.display()
        ),
    }
    let bytes = fs::read(path).map_err(|e| {
        anyhow::anyhow!(
            "cannot read the module cache's secret {}: {e}",
            path.display()
        )
    })?;
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
