//! The module cache: sha256 of the bytes → compiled module, kept in memory (a
//! bounded LRU) and on disk (serialized artifacts), so a module is compiled
//! once per machine, not once per job.
//!
//! Disk artifacts are native code that wasmtime will map and run, so they are
//! never trusted blindly: each file carries a sha256 of the artifact, checked
//! before wasmtime sees it, and wasmtime itself refuses an artifact made by an
//! incompatible engine. Anything that fails either check is recompiled and
//! overwritten. Artifacts live under a directory named after the engine's
//! compatibility hash, so two builds of peerwasm never fight over one file.

use std::fs;
use std::hash::{Hash, Hasher};
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use lru::LruCache;
use sha2::{Digest, Sha256};
use wasmtime::{Engine, InstancePre, Module};

use super::JobState;
use super::validate;
use crate::proto::{CacheSource, ModuleHash, Outcome};

/// The first bytes of every artifact file; bump on any format change.
const ARTIFACT_MAGIC: &[u8; 8] = b"PWASMA1\n";

/// A compiled module, ready to instantiate.
pub struct CompiledModule {
    /// The sha256 of the module's bytes.
    pub hash: ModuleHash,
    /// The compiled module.
    pub module: Module,
    /// Imports resolved against the sandbox's linker, once per module;
    /// `Err` names what is wrong (an import we do not provide, no `_start`).
    pub(crate) prepared: OnceLock<Result<Prepared, String>>,
}

/// A module made ready to instantiate.
#[derive(Clone)]
pub(crate) struct Prepared {
    pub pre: InstancePre<JobState>,
    /// Whether it can open files at all (imports `path_open`). A module that
    /// cannot needs no scratch directory, which saves two filesystem
    /// round trips per job.
    pub opens_files: bool,
}

/// Counters a test or `/metrics` can read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Modules compiled from wasm bytes (including ones that failed to compile).
    pub compiles: u64,
    /// Lookups served from memory.
    pub memory_hits: u64,
    /// Modules loaded from a disk artifact.
    pub disk_hits: u64,
    /// Disk artifacts found corrupt or incompatible, and recompiled.
    pub disk_rejects: u64,
}

/// Where compiled modules are kept.
pub struct ModuleCache {
    engine: Engine,
    memory: Mutex<LruCache<ModuleHash, Arc<CompiledModule>>>,
    disk: Option<PathBuf>,
    /// Held while loading or compiling, so two jobs of one new module
    /// compile it once. Compilation is itself parallel (cranelift uses all
    /// cores), so serializing whole compiles costs little.
    loading: Mutex<()>,
    compiles: AtomicU64,
    memory_hits: AtomicU64,
    disk_hits: AtomicU64,
    disk_rejects: AtomicU64,
}

impl ModuleCache {
    /// A cache of at most `entries` compiled modules in memory, with disk
    /// artifacts under `disk_dir` if given.
    pub fn new(engine: Engine, entries: usize, disk_dir: Option<&Path>) -> anyhow::Result<Self> {
        let disk = match disk_dir {
            Some(dir) => {
                let mut h = std::hash::DefaultHasher::new();
                engine.precompile_compatibility_hash().hash(&mut h);
                let dir = dir.join(format!("engine-{:016x}", h.finish()));
                fs::create_dir_all(&dir).map_err(|e| {
                    anyhow::anyhow!("cannot create module cache dir {}: {e}", dir.display())
                })?;
                Some(dir)
            }
            None => None,
        };
        let entries = NonZeroUsize::new(entries.max(1)).expect("max(1) is non-zero");
        Ok(ModuleCache {
            engine,
            memory: Mutex::new(LruCache::new(entries)),
            disk,
            loading: Mutex::new(()),
            compiles: AtomicU64::new(0),
            memory_hits: AtomicU64::new(0),
            disk_hits: AtomicU64::new(0),
            disk_rejects: AtomicU64::new(0),
        })
    }

    /// The counters so far.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            compiles: self.compiles.load(Ordering::Relaxed),
            memory_hits: self.memory_hits.load(Ordering::Relaxed),
            disk_hits: self.disk_hits.load(Ordering::Relaxed),
            disk_rejects: self.disk_rejects.load(Ordering::Relaxed),
        }
    }

    /// The compiled module if it is in memory; never blocks on a compile.
    pub fn get(&self, hash: &ModuleHash) -> Option<Arc<CompiledModule>> {
        let found = lock(&self.memory).get(hash).cloned();
        if found.is_some() {
            self.memory_hits.fetch_add(1, Ordering::Relaxed);
        }
        found
    }

    /// The compiled module for `bytes` (whose sha256 is `hash`): from memory,
    /// else from disk, else compiled now. Blocks while compiling; call it off
    /// the async executor.
    pub fn load(&self, hash: &ModuleHash, bytes: &[u8]) -> Result<(Arc<CompiledModule>, CacheSource), Outcome> {
        self.load_with(hash, Some(bytes)).transpose().expect("with bytes, a module is always found or compiled")
    }

    /// The compiled module from memory or disk only, never compiling:
    /// `None` if neither has it. What a worker that lost a module's bytes
    /// (a restart) but kept its artifact runs a job from.
    pub fn load_cached(&self, hash: &ModuleHash) -> Option<(Arc<CompiledModule>, CacheSource)> {
        self.load_with(hash, None).ok().flatten()
    }

    /// Whether memory or disk has the compiled module (disk: an artifact
    /// file exists; it is checked when loaded).
    pub fn has(&self, hash: &ModuleHash) -> bool {
        lock(&self.memory).contains(hash) || self.artifact_path(hash).is_some_and(|p| p.exists())
    }

    fn load_with(
        &self,
        hash: &ModuleHash,
        bytes: Option<&[u8]>,
    ) -> Result<Option<(Arc<CompiledModule>, CacheSource)>, Outcome> {
        if let Some(m) = self.get(hash) {
            return Ok(Some((m, CacheSource::Memory)));
        }
        let _loading = lock(&self.loading);
        if let Some(m) = self.get(hash) {
            return Ok(Some((m, CacheSource::Memory)));
        }
        let (module, source) = match (self.load_from_disk(hash), bytes) {
            (Some(module), _) => (module, CacheSource::Disk),
            (None, Some(bytes)) => (self.compile(hash, bytes)?, CacheSource::Compiled),
            (None, None) => return Ok(None),
        };
        let compiled = Arc::new(CompiledModule { hash: *hash, module, prepared: OnceLock::new() });
        lock(&self.memory).put(*hash, compiled.clone());
        Ok(Some((compiled, source)))
    }

    fn compile(&self, hash: &ModuleHash, bytes: &[u8]) -> Result<Module, Outcome> {
        if ModuleHash::of(bytes) != *hash {
            return Err(Outcome::Rejected { reason: format!("module bytes do not match their hash {hash}") });
        }
        validate::check_header(bytes).map_err(|reason| Outcome::InvalidModule { reason })?;
        self.compiles.fetch_add(1, Ordering::Relaxed);
        let module = Module::new(&self.engine, bytes).map_err(|e| Outcome::InvalidModule {
            reason: format!("it does not compile: {}", one_line(&e)),
        })?;
        if let Some(path) = self.artifact_path(hash) {
            if let Err(e) = self.store_artifact(&module, &path) {
                tracing::warn!(path = %path.display(), "could not write module artifact: {e}");
            }
        }
        Ok(module)
    }

    fn artifact_path(&self, hash: &ModuleHash) -> Option<PathBuf> {
        self.disk.as_ref().map(|d| d.join(format!("{}.cwasm", hash.to_hex())))
    }

    fn load_from_disk(&self, hash: &ModuleHash) -> Option<Module> {
        let path = self.artifact_path(hash)?;
        let file = match fs::read(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::warn!(path = %path.display(), "cannot read module artifact: {e}");
                return None;
            }
        };
        match self.decode_artifact(&file) {
            Ok(module) => {
                self.disk_hits.fetch_add(1, Ordering::Relaxed);
                Some(module)
            }
            Err(why) => {
                tracing::warn!(path = %path.display(), "ignoring module artifact ({why}); recompiling");
                self.disk_rejects.fetch_add(1, Ordering::Relaxed);
                let _ = fs::remove_file(&path);
                None
            }
        }
    }

    fn decode_artifact(&self, file: &[u8]) -> Result<Module, String> {
        let header = ARTIFACT_MAGIC.len() + 32;
        if file.len() < header || &file[..ARTIFACT_MAGIC.len()] != ARTIFACT_MAGIC {
            return Err("not a peerwasm artifact".into());
        }
        let (sum, artifact) = file[ARTIFACT_MAGIC.len()..].split_at(32);
        if Sha256::digest(artifact).as_slice() != sum {
            return Err("checksum mismatch: the file is corrupt".into());
        }
        // SAFETY: the artifact was written by `store_artifact` of an engine
        // with the same compatibility hash (the directory is keyed on it),
        // and its checksum matches what was written. wasmtime additionally
        // checks the engine configuration recorded in the artifact. Artifacts
        // are never accepted from peers.
        unsafe { Module::deserialize(&self.engine, artifact) }.map_err(|e| one_line(&e))
    }

    fn store_artifact(&self, module: &Module, path: &Path) -> anyhow::Result<()> {
        let artifact = module.serialize().map_err(|e| anyhow::anyhow!("{e}"))?;
        let mut file = Vec::with_capacity(ARTIFACT_MAGIC.len() + 32 + artifact.len());
        file.extend_from_slice(ARTIFACT_MAGIC);
        file.extend_from_slice(&Sha256::digest(&artifact));
        file.extend_from_slice(&artifact);
        // Write then rename, so a reader never sees half a file.
        let dir = path.parent().expect("artifact paths have a parent");
        let tmp = tempfile::NamedTempFile::new_in(dir)?;
        fs::write(tmp.path(), &file)?;
        tmp.persist(path)?;
        Ok(())
    }
}

/// The error and its causes on one line.
pub(crate) fn one_line(e: &wasmtime::Error) -> String {
    let mut s = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !s.contains(&c) {
            s.push_str(": ");
            s.push_str(&c);
        }
    }
    s.replace('\n', " ")
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
