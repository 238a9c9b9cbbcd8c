//! The module cache: sha256 of the bytes → compiled module, kept in memory (a
//! bounded LRU) and on disk ([`super::artifacts`]: authenticated, bounded),
//! so a module is compiled once per machine, not once per job.
//!
//! Loading or compiling holds a lock for that module only: two jobs of one
//! new module compile it once, and a large module compiling does not make
//! jobs of other modules wait for it.

use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use lru::LruCache;
use wasmtime::{Engine, InstancePre};

use super::artifacts::ArtifactStore;
use super::code::{Code, one_line};
use super::compile_memory::CompileMemory;
use super::component::CommandPre;
use super::config::SandboxConfig;
use super::job_state::JobState;
use super::validate;
use crate::proto::{CacheSource, ModuleHash, Outcome};

/// A compiled module, ready to instantiate.
pub struct CompiledModule {
    /// The sha256 of the module's bytes.
    pub hash: ModuleHash,
    /// The compiled code: a core module or a component.
    pub code: Code,
    /// Imports resolved against the sandbox's linker, once per module;
    /// `Err` names what is wrong (an import we do not provide, no `_start`).
    pub(crate) prepared: OnceLock<Result<Prepared, String>>,
}

/// Code made ready to instantiate.
pub(crate) enum Prepared {
    /// A core module.
    Module {
        pre: InstancePre<JobState>,
        /// Whether it can open files at all (imports `path_open`). A module
        /// that cannot needs no scratch directory, which saves two
        /// filesystem round trips per job.
        opens_files: bool,
    },
    /// A `wasi:cli/command` component.
    Component { pre: CommandPre },
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
    /// Disk artifacts not written by this cache (planted, altered) or
    /// incompatible: removed unused, and recompiled.
    pub disk_rejects: u64,
    /// Disk artifacts removed to keep the cache within its byte budget.
    pub disk_evictions: u64,
}

/// Where compiled modules are kept.
pub struct ModuleCache {
    /// The engines code is compiled for: core modules', components'.
    engines: (Engine, Engine),
    memory: Mutex<LruCache<ModuleHash, Arc<CompiledModule>>>,
    disk: Option<ArtifactStore>,
    /// One lock per module being loaded or compiled (removed when done).
    loading: Mutex<HashMap<ModuleHash, Arc<Mutex<()>>>>,
    compiles: AtomicU64,
    memory_hits: AtomicU64,
    disk_hits: AtomicU64,
    disk_rejects: AtomicU64,
    disk_evictions: AtomicU64,
    /// How long a compile may take (`SandboxConfig::max_compile_time`).
    max_compile_time: Option<Duration>,
    /// Modules whose compile ran past it: refused at once from then on.
    too_slow: Mutex<HashSet<ModuleHash>>,
    /// The sandbox's configuration, for a compile child
    /// (`SandboxConfig::compile_program`) to build the same engines.
    config: SandboxConfig,
    /// Compiles running now, at most [`max_compiles`] at once.
    compiling: Mutex<usize>,
    compile_done: parking_lot::Condvar,
    /// What compiles take of the host's memory: live, and learned.
    compile_memory: CompileMemory,
}

/// Compiles run at once by one cache: one per core. Each compiles its
/// functions on every core already; more at once only share the cores
/// thinner while each holds its memory (CPython's takes 2 GB), and a
/// tenant's burst of new modules would take the machine.
pub fn max_compiles() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

impl ModuleCache {
    /// A cache as `config` says: `cache_entries` compiled modules in
    /// memory, artifacts under `cache_dir` (at most `cache_max_bytes`) if
    /// given, compiles bounded by `max_compile_time`.
    pub fn new(
        engine: Engine,
        component_engine: Engine,
        config: &SandboxConfig,
    ) -> anyhow::Result<Self> {
        let disk = config
            .cache_dir
            .as_deref()
            .map(|dir| ArtifactStore::open(dir, &engine, config.cache_max_bytes))
            .transpose()?;
        let entries = NonZeroUsize::new(config.cache_entries.max(1)).expect("max(1) is non-zero");
        Ok(ModuleCache {
            engines: (engine, component_engine),
            memory: Mutex::new(LruCache::new(entries)),
            disk,
            loading: Mutex::new(HashMap::new()),
            compiles: AtomicU64::new(0),
            memory_hits: AtomicU64::new(0),
            disk_hits: AtomicU64::new(0),
            disk_rejects: AtomicU64::new(0),
            disk_evictions: AtomicU64::new(0),
            max_compile_time: config.max_compile_time,
            too_slow: Mutex::new(HashSet::new()),
            config: config.clone(),
            compiling: Mutex::new(0),
            compile_done: parking_lot::Condvar::new(),
            compile_memory: CompileMemory::default(),
        })
    }

    /// What its compiles take of the host's memory.
    pub fn compile_memory(&self) -> &CompileMemory {
        &self.compile_memory
    }

    /// The counters so far.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            compiles: self.compiles.load(Ordering::Relaxed),
            memory_hits: self.memory_hits.load(Ordering::Relaxed),
            disk_hits: self.disk_hits.load(Ordering::Relaxed),
            disk_rejects: self.disk_rejects.load(Ordering::Relaxed),
            disk_evictions: self.disk_evictions.load(Ordering::Relaxed),
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
    /// else from disk, else compiled now — while `wanted()` (a compile in a
    /// child process is ended once it is not). Blocks while compiling; call
    /// it off the async executor.
    pub fn load(
        &self,
        hash: &ModuleHash,
        bytes: &[u8],
        wanted: &dyn Fn() -> bool,
    ) -> Result<(Arc<CompiledModule>, CacheSource), Outcome> {
        self.load_with(hash, Some((bytes, wanted)))
            .transpose()
            .expect("with bytes, a module is always found or compiled")
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
        lock(&self.memory).contains(hash) || self.disk.as_ref().is_some_and(|d| d.has(hash))
    }

    fn load_with(
        &self,
        hash: &ModuleHash,
        bytes: Option<(&[u8], &dyn Fn() -> bool)>,
    ) -> Result<Option<(Arc<CompiledModule>, CacheSource)>, Outcome> {
        if let Some(m) = self.get(hash) {
            return Ok(Some((m, CacheSource::Memory)));
        }
        let this_module = lock(&self.loading).entry(*hash).or_default().clone();
        let loaded = {
            let _loading = lock(&this_module);
            self.load_locked(hash, bytes)
        };
        // The last one out removes the module's lock.
        let mut loading = lock(&self.loading);
        if Arc::strong_count(&this_module) == 2 {
            loading.remove(hash);
        }
        loaded
    }

    fn load_locked(
        &self,
        hash: &ModuleHash,
        bytes: Option<(&[u8], &dyn Fn() -> bool)>,
    ) -> Result<Option<(Arc<CompiledModule>, CacheSource)>, Outcome> {
        if let Some(m) = self.get(hash) {
            return Ok(Some((m, CacheSource::Memory)));
        }
        let (module, source) = match (self.load_from_disk(hash), bytes) {
            (Some(module), _) => (module, CacheSource::Disk),
            (None, Some((bytes, wanted))) => {
                (self.compile(hash, bytes, wanted)?, CacheSource::Compiled)
            }
            (None, None) => return Ok(None),
        };
        let compiled = Arc::new(CompiledModule {
            hash: *hash,
            code: module,
            prepared: OnceLock::new(),
        });
        lock(&self.memory).put(*hash, compiled.clone());
        Ok(Some((compiled, source)))
    }

    fn compile(
        &self,
        hash: &ModuleHash,
        bytes: &[u8],
        wanted: &dyn Fn() -> bool,
    ) -> Result<Code, Outcome> {
        if ModuleHash::of(bytes) != *hash {
            return Err(Outcome::Rejected {
                reason: format!("module bytes do not match their hash {hash}"),
            });
        }
        validate::check_header(bytes).map_err(|reason| Outcome::InvalidModule { reason })?;
        let apart = self.config.compile_program.is_some();
        let slow = |limit: Duration| Outcome::Rejected {
            reason: format!(
                "compiling it takes more than {} of {} (this worker's --max-compile-time)",
                humantime::format_duration(limit),
                if apart { "CPU time" } else { "time" }
            ),
        };
        if let Some(limit) = self.max_compile_time
            && lock(&self.too_slow).contains(hash)
        {
            return Err(slow(compile_limit(limit, bytes.len())));
        }
        let _running = self.compile_turn(wanted)?;
        self.compiles.fetch_add(1, Ordering::Relaxed);
        let module = match &self.config.compile_program {
            Some(program) => self.compile_in_child(program, hash, bytes, wanted, slow)?,
            None => self.compile_here(hash, bytes, slow)?,
        };
        if let Some(disk) = &self.disk {
            match disk.store(hash, &module) {
                Ok(evicted) => {
                    self.disk_evictions
                        .fetch_add(evicted as u64, Ordering::Relaxed);
                }
                Err(e) => {
                    tracing::warn!(module = %hash, "could not write the module's artifact: {e}")
                }
            }
        }
        Ok(module)
    }

    /// Waits for one of the [`max_compiles`] turns (while `wanted()`),
    /// given back when the guard drops.
    fn compile_turn(&self, wanted: &dyn Fn() -> bool) -> Result<CompileTurn<'_>, Outcome> {
        let mut running = lock(&self.compiling);
        while *running >= max_compiles() {
            if !wanted() {
                return Err(Outcome::Cancelled {
                    cause: crate::proto::CancelCause::ClientGone,
                });
            }
            self.compile_done
                .wait_for(&mut running, Duration::from_millis(20));
        }
        *running += 1;
        Ok(CompileTurn(self))
    }

    /// Compiles in a child process (`compiler`): ended past its CPU time
    /// or once not `wanted()`.
    fn compile_in_child(
        &self,
        program: &super::config::CompileProgram,
        hash: &ModuleHash,
        bytes: &[u8],
        wanted: &dyn Fn() -> bool,
        slow: impl Fn(Duration) -> Outcome,
    ) -> Result<Code, Outcome> {
        use super::compiler::{ChildCompile, compile_in_child};
        // No limit: a day of CPU, the kernel's limit being whole seconds.
        let cpu = self
            .max_compile_time
            .map_or(Duration::from_secs(24 * 3600), |l| {
                compile_limit(l, bytes.len())
            });
        let config = SandboxConfig {
            compile_program: None,
            ..self.config.clone()
        };
        let live = self.compile_memory.start(hash);
        let compiled = compile_in_child(
            program,
            &config,
            &self.engines,
            bytes,
            cpu,
            wanted,
            &live.resident,
        );
        drop(live);
        match compiled {
            ChildCompile::Code(code, usage) => {
                tracing::debug!(module = %hash, cpu = ?usage.cpu, peak = usage.peak_bytes, "compiled in a child process");
                self.compile_memory
                    .learn(bytes.len() as u64, usage.peak_bytes);
                Ok(code)
            }
            ChildCompile::Invalid(why) => Err(Outcome::InvalidModule {
                reason: format!("it does not compile: {why}"),
            }),
            ChildCompile::TooSlow(usage) => {
                tracing::warn!(module = %hash, cpu = ?usage.cpu, "compile ran past --max-compile-time: ended, and the module refused from now on");
                if self.max_compile_time.is_some() {
                    lock(&self.too_slow).insert(*hash);
                }
                Err(slow(cpu))
            }
            ChildCompile::Cancelled => {
                tracing::info!(module = %hash, "compile ended: its job was cancelled");
                Err(Outcome::Cancelled {
                    cause: crate::proto::CancelCause::ClientGone,
                })
            }
            ChildCompile::Failed(why) => {
                tracing::warn!(module = %hash, "{why}: compiling in this process instead");
                self.compile_here(hash, bytes, slow)
            }
        }
    }

    /// Compiles on threads of this process, refusing the job past the
    /// wall-time limit (the compile runs on to its end, its result dropped:
    /// wasmtime cannot stop it).
    fn compile_here(
        &self,
        hash: &ModuleHash,
        bytes: &[u8],
        slow: impl Fn(Duration) -> Outcome,
    ) -> Result<Code, Outcome> {
        let module = match self
            .max_compile_time
            .map(|limit| compile_limit(limit, bytes.len()))
        {
            None => compile_apart(|| Code::compile(&self.engines, bytes)),
            Some(limit) => {
                let (tx, rx) = std::sync::mpsc::channel();
                let (engines, owned) = (self.engines.clone(), bytes.to_vec());
                std::thread::Builder::new()
                    .name("peerwasm-compile".into())
                    .spawn(move || {
                        let _ = tx.send(compile_apart(|| Code::compile(&engines, &owned)));
                    })
                    .map_err(|e| Outcome::Rejected {
                        reason: format!("cannot start compiling: {e}"),
                    })?;
                match rx.recv_timeout(limit) {
                    Ok(compiled) => compiled,
                    Err(_) => {
                        tracing::warn!(module = %hash, "compile ran past --max-compile-time: module refused from now on");
                        lock(&self.too_slow).insert(*hash);
                        return Err(slow(limit));
                    }
                }
            }
        };
        module.map_err(|e| Outcome::InvalidModule {
            reason: format!("it does not compile: {}", one_line(&e)),
        })
    }

    /// A core module's artifact mapped from disk for `engine` (one of the
    /// same settings as the cache's: the warm starts' on-demand engine),
    /// if the disk cache has it: its code then shares the page cache with
    /// the cache's own mapping, where a copy would take its size again.
    pub(crate) fn map_for(&self, engine: &Engine, hash: &ModuleHash) -> Option<wasmtime::Module> {
        // An artifact that does not load is removed as incompatible: ask
        // only an engine the artifacts were written for.
        let compat = |e: &Engine| {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            e.precompile_compatibility_hash().hash(&mut h);
            h.finish()
        };
        if compat(engine) != compat(&self.engines.0) {
            return None;
        }
        let engines = (engine.clone(), engine.clone());
        match self.disk.as_ref()?.load(&engines, hash) {
            Ok(Some(Code::Module(m))) => Some(m),
            _ => None,
        }
    }

    fn load_from_disk(&self, hash: &ModuleHash) -> Option<Code> {
        match self.disk.as_ref()?.load(&self.engines, hash) {
            Ok(Some(module)) => {
                self.disk_hits.fetch_add(1, Ordering::Relaxed);
                Some(module)
            }
            Ok(None) => None,
            Err(why) => {
                tracing::warn!(module = %hash, "ignored and removed a module artifact ({why}); compiling instead");
                self.disk_rejects.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }
}

/// One of the cache's compile turns, given back when dropped.
struct CompileTurn<'c>(&'c ModuleCache);

impl Drop for CompileTurn<'_> {
    fn drop(&mut self) {
        *lock(&self.0.compiling) -= 1;
        self.0.compile_done.notify_one();
    }
}

/// Module bytes a compile-time limit covers as it is; a larger module gets
/// [`COMPILE_TIME_PER_MIB_ABOVE`] more per MiB beyond it.
pub const COMPILE_LIMIT_COVERS: usize = 16 << 20;

/// See [`COMPILE_LIMIT_COVERS`]: CPython's 95 MiB compiles in ~45 s on an
/// idle 2-core machine and gets 60 s + 40 s, so that a loaded worker does
/// not refuse it for good; a compile bomb packs its functions into a
/// small module, which gets the limit as it is.
pub const COMPILE_TIME_PER_MIB_ABOVE: Duration = Duration::from_millis(500);

/// The compile-time limit of a module of `len` bytes under `limit`.
fn compile_limit(limit: Duration, len: usize) -> Duration {
    let above = len.saturating_sub(COMPILE_LIMIT_COVERS) >> 20;
    limit + COMPILE_TIME_PER_MIB_ABOVE * above as u32
}

/// Runs `compile` on a thread pool of its own. wasmtime compiles a module's
/// functions in parallel on rayon's current pool; on the one global pool,
/// a small module's functions would queue behind every function of a large
/// module compiling at the same time. With a pool per compile, concurrent
/// compiles share the cores through the OS scheduler instead.
fn compile_apart<T: Send>(compile: impl FnOnce() -> T + Send) -> T {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    match rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("peerwasm-compile-{i}"))
        .build()
    {
        Ok(pool) => pool.install(compile),
        Err(_) => compile(),
    }
}

fn lock<T>(m: &Mutex<T>) -> parking_lot::MutexGuard<'_, T> {
    m.lock()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_compile_limit_grows_only_for_modules_past_16_mib() {
        let limit = Duration::from_secs(60);
        assert_eq!(
            compile_limit(limit, 6 << 20),
            limit,
            "a compile bomb of 6 MB gets the limit as it is"
        );
        assert_eq!(compile_limit(limit, 16 << 20), limit);
        assert_eq!(
            compile_limit(limit, 96 << 20),
            Duration::from_secs(100),
            "CPython's size: 60 s + 80 × 0.5 s"
        );
        assert_eq!(
            compile_limit(Duration::from_secs(1), 1 << 20),
            Duration::from_secs(1)
        );
    }
}
