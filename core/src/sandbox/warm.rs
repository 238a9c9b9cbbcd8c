//! Warm starts ([`WarmStart`]): jobs of a reactor that keeps an
//! interpreter between calls start from a copy-on-write snapshot of the
//! memory its prelude left, instead of from a cold interpreter.
//!
//! Why: an item of a Python map paid for starting CPython and importing
//! its module's imports again — 50 ms bare, 2.6 s with scikit-learn —
//! for a function that may take a millisecond. A process pool pays that
//! once per process, and so does this: once per snapshot.
//!
//! How: CPython for WASI (`python.wasm`) exports `turn(ptr, len) -> i32`,
//! which runs a piece of source in a persistent `__main__` and returns its
//! exit status, and `host_alloc(len) -> ptr` for the source's bytes. The
//! first job of a prelude runs it as its first turn in a fresh instance;
//! if it returns 0, the job's linear memory is copied into a sealed
//! in-memory file (a memfd, its zero pages left as holes) and the job goes
//! on with its own turn. Every later job instantiates the module, grows
//! its memory to the snapshot's size (through its limiter: the snapshot's
//! memory is the job's own, counted in its limit and its peak) and maps
//! the file over it privately — copy-on-write, so a job touches pages, not
//! the whole image — then runs its turn. No job sees another's writes.
//! A job whose turn returned leaves its instance for the next job of the
//! same snapshot, its memory put back to the image ([`resident`](super::resident)).
//!
//! What a snapshot can hold is only linear memory. That is all the state
//! here: `python.wasm` has one mutable global (its stack pointer, back at
//! its initial value whenever no call is running) and a table never
//! written. Host state — open files, the WASI preopens — is not in it, so
//! jobs of one snapshot get the same preopens, arguments and environment
//! the prelude had (they are part of its key), and a prelude that leaves a
//! file open should not return 0 (the Python client's checks).
//!
//! Why an engine of its own: mapping over a memory is sound only for a
//! memory that is this store's alone and goes with it. The pooling
//! allocator keeps memories for the next job and resets them on the
//! assumption that it mapped them; an on-demand memory is an mmap
//! unmapped when its store drops. The module is loaded once into the
//! on-demand engine (the same settings, so the same compiled code).

use std::collections::HashSet;
use std::num::NonZeroUsize;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use lru::LruCache;
use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use wasmtime::{AsContextMut, Engine, ExternType, Instance, InstancePre, Linker, Memory, Module};

use super::image::WASM_PAGE;
use super::job_state::JobState;
use super::spec::RunSpec;
use super::warm_disk::SnapshotDir;
use crate::proto::{ModuleHash, WarmStart};

/// The export that runs a turn: `turn(ptr, len) -> status`.
pub const TURN: &str = "turn";
/// The export that allocates a turn's source: `host_alloc(len) -> ptr`.
pub const HOST_ALLOC: &str = "host_alloc";
/// The memory a snapshot is taken of.
pub const MEMORY: &str = "memory";

/// Snapshots one process keeps (least recently used dropped first). Each
/// holds the non-zero pages of an interpreter's memory: ~25 MiB for a
/// bare CPython, ~90 MiB with pandas and scikit-learn imported.
pub const SNAPSHOTS_KEPT: usize = 4;

/// Modules kept loaded into the warm engine.
const MODULES_KEPT: usize = 4;

/// What a module must export to start warm; `Err` says what is missing.
pub fn check(module: &Module) -> Result<(), String> {
    let func = |name: &str, params: usize| match module.get_export(name) {
        Some(ExternType::Func(f)) => f.params().len() == params && f.results().len() == 1,
        _ => false,
    };
    let memory = matches!(module.get_export(MEMORY), Some(ExternType::Memory(_)));
    if func(TURN, 2) && func(HOST_ALLOC, 1) && memory {
        Ok(())
    } else {
        Err(format!(
            "a warm start needs a reactor that keeps an interpreter between turns: exports \
             `{TURN}(ptr, len) -> status`, `{HOST_ALLOC}(len) -> ptr` and `{MEMORY}` (as CPython for WASI has)"
        ))
    }
}

/// Counters a test or `/metrics` can read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WarmStats {
    /// Snapshots made (preludes that returned 0 and were kept).
    pub snapshots: u64,
    /// Jobs started from a snapshot.
    pub warm_starts: u64,
    /// Jobs of a warm start that ran their prelude themselves.
    pub cold_starts: u64,
    /// Of the warm starts, those that ran in the instance a job of the
    /// same snapshot left, its memory put back to the snapshot's
    /// (`sandbox/resident.rs`): no instantiation, no page faults
    /// for the pages the last job also touched.
    pub resident_starts: u64,
    /// Memory held now between jobs, for the jobs to come: the kept
    /// snapshots' images (the pages their files hold) and the resident
    /// instances' own pages (those a reset copied back). No job's limit
    /// counts it; a worker charges it to its ledger (`warm_held`).
    pub held_bytes: u64,
}

/// A snapshot of an interpreter's memory, or the news that its prelude
/// cannot make one.
enum Snapshot {
    Image {
        file: OwnedFd,
        len: usize,
        /// The memory its file takes (its data pages, not its holes).
        held: u64,
    },
    /// The prelude did not return 0: its jobs run it themselves.
    Refused,
}

/// What a job of a warm start begins from.
pub(super) enum Start {
    /// Map this image over the job's memory and run its turn.
    From(Arc<SnapshotImage>),
    /// Run the prelude first; `keep` says whether this job makes the
    /// snapshot (the first of its key to get there).
    Cold { keep: Option<Claim> },
}

/// A snapshot ready to map.
pub(super) struct SnapshotImage(Arc<Snapshot>);

impl SnapshotImage {
    /// The file holding the image (a sealed memfd, or a kept snapshot's
    /// file in a slot process: `warm_disk`), and its length in bytes.
    pub(super) fn file(&self) -> (&OwnedFd, usize) {
        match &*self.0 {
            Snapshot::Image { file, len, .. } => (file, *len),
            Snapshot::Refused => unreachable!("a SnapshotImage holds an image"),
        }
    }
}

/// The right to make a key's snapshot, given back when dropped.
pub(super) struct Claim {
    key: [u8; 32],
    warm: Arc<WarmStartsInner>,
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.warm.building.lock().remove(&self.key);
        self.warm.made_one.notify_waiters();
    }
}

/// Snapshots by what made them, and the warm engine's modules.
pub(super) struct WarmStarts {
    engine: Engine,
    linker: Linker<JobState>,
    modules: Mutex<LruCache<ModuleHash, Arc<InstancePre<JobState>>>>,
    inner: Arc<WarmStartsInner>,
    /// Where snapshots are also kept for the next process (`disk`).
    disk: Option<SnapshotDir>,
}

struct WarmStartsInner {
    snapshots: Mutex<LruCache<[u8; 32], Arc<Snapshot>>>,
    building: Mutex<HashSet<[u8; 32]>>,
    /// Told when a claim ends: jobs waiting for a snapshot look again.
    made_one: tokio::sync::Notify,
    made: AtomicU64,
    warm: AtomicU64,
    cold: AtomicU64,
}

impl WarmStarts {
    /// Warm starts on `engine` (on-demand allocation), whose core modules
    /// link with `linker`; snapshots also kept in `disk`, if given, for
    /// the next process, and mapped from there as they are if
    /// `map_kept` (`SandboxConfig::map_kept_snapshots`).
    pub(super) fn new(
        engine: Engine,
        linker: Linker<JobState>,
        disk: Option<std::path::PathBuf>,
        map_kept: bool,
    ) -> WarmStarts {
        let n = |k: usize| NonZeroUsize::new(k).expect("non-zero");
        WarmStarts {
            engine,
            linker,
            modules: Mutex::new(LruCache::new(n(MODULES_KEPT))),
            inner: Arc::new(WarmStartsInner {
                snapshots: Mutex::new(LruCache::new(n(SNAPSHOTS_KEPT))),
                building: Mutex::new(HashSet::new()),
                made_one: tokio::sync::Notify::new(),
                made: AtomicU64::new(0),
                warm: AtomicU64::new(0),
                cold: AtomicU64::new(0),
            }),
            disk: disk.and_then(|dir| match SnapshotDir::open(dir, map_kept) {
                Ok(d) => Some(d),
                Err(e) => {
                    tracing::warn!("snapshots are kept in memory only: {e:#}");
                    None
                }
            }),
        }
    }

    /// Whether `key`'s snapshot is still kept: an instance left for it
    /// must not hold on to a snapshot the cache let go.
    pub(super) fn holds(&self, key: &[u8; 32]) -> bool {
        self.inner.snapshots.lock().peek(key).is_some()
    }

    /// Lets go of every kept snapshot (jobs running from one keep theirs
    /// until they end); the next job of each makes it again.
    pub(super) fn drop_snapshots(&self) {
        self.inner.snapshots.lock().clear();
    }

    /// The engine warm jobs run on.
    pub(super) fn engine(&self) -> &Engine {
        &self.engine
    }

    pub(super) fn stats(&self) -> WarmStats {
        let held_bytes = self
            .inner
            .snapshots
            .lock()
            .iter()
            .map(|(_, s)| match &**s {
                Snapshot::Image { held, .. } => *held,
                Snapshot::Refused => 0,
            })
            .sum();
        WarmStats {
            snapshots: self.inner.made.load(Ordering::Relaxed),
            warm_starts: self.inner.warm.load(Ordering::Relaxed),
            cold_starts: self.inner.cold.load(Ordering::Relaxed),
            // The sandbox's count and pages (`resident`).
            resident_starts: 0,
            held_bytes,
        }
    }

    /// `module` ready to instantiate on the warm engine: itself if it was
    /// compiled for it, else loaded into it once — its artifact mapped
    /// from the disk cache (`mapped`), or its compiled code copied (the
    /// engines share their settings, so nothing is compiled again).
    pub(super) fn module(
        &self,
        hash: &ModuleHash,
        module: &Module,
        mapped: impl FnOnce(&Engine) -> Option<Module>,
    ) -> Result<Arc<InstancePre<JobState>>, String> {
        if let Some(pre) = self.modules.lock().get(hash) {
            return Ok(pre.clone());
        }
        let here = if Engine::same(module.engine(), &self.engine) {
            module.clone()
        } else if let Some(m) = mapped(&self.engine) {
            m
        } else {
            let bytes = module
                .serialize()
                .map_err(|e| format!("cannot copy its compiled code for a warm start: {e}"))?;
            // SAFETY: the bytes were serialized just now by this process's
            // wasmtime from a module it compiled or loaded (never from a
            // peer), for an engine of the same settings.
            unsafe { Module::deserialize(&self.engine, bytes) }
                .map_err(|e| format!("cannot load its compiled code for a warm start: {e}"))?
        };
        let pre = Arc::new(
            self.linker
                .instantiate_pre(&here)
                .map_err(|e| format!("its imports cannot be satisfied: {e}"))?,
        );
        self.modules.lock().put(*hash, pre.clone());
        Ok(pre)
    }

    /// Where a job of `spec` (with `warm`) begins: the snapshot its key
    /// has; else cold, making the snapshot. While another job is making
    /// it, this one waits for it: it would take as long to run the prelude
    /// itself, and then not start warm.
    pub(super) async fn start(&self, key: Option<[u8; 32]>) -> Start {
        let Some(key) = key else {
            self.inner.cold.fetch_add(1, Ordering::Relaxed);
            return Start::Cold { keep: None };
        };
        loop {
            let made = self.inner.made_one.notified();
            let found = self.inner.snapshots.lock().get(&key).cloned();
            match found {
                Some(s) if matches!(*s, Snapshot::Image { .. }) => {
                    self.inner.warm.fetch_add(1, Ordering::Relaxed);
                    return Start::From(Arc::new(SnapshotImage(s)));
                }
                Some(_) => {
                    self.inner.cold.fetch_add(1, Ordering::Relaxed);
                    return Start::Cold { keep: None };
                }
                None if self.inner.building.lock().insert(key) => {
                    let claim = Claim {
                        key,
                        warm: self.inner.clone(),
                    };
                    // An earlier process's, kept on disk: read once here
                    // (others wait for it as for a prelude).
                    let kept = self.disk.as_ref().and_then(|d| d.load(&key));
                    if let Some((file, len)) = kept {
                        let held = allocated_bytes(&file);
                        let image = Arc::new(Snapshot::Image { file, len, held });
                        self.inner.snapshots.lock().put(key, image.clone());
                        drop(claim);
                        self.inner.warm.fetch_add(1, Ordering::Relaxed);
                        return Start::From(Arc::new(SnapshotImage(image)));
                    }
                    self.inner.cold.fetch_add(1, Ordering::Relaxed);
                    return Start::Cold { keep: Some(claim) };
                }
                // Woken when any claim ends (its snapshot kept, refused,
                // or its job gone); the bound covers a wake-up missed
                // between the look and the wait.
                None => {
                    let _ = tokio::time::timeout(std::time::Duration::from_millis(100), made).await;
                }
            }
        }
    }

    /// Keeps what `claim`'s prelude left: the memory's image if it returned
    /// 0 (`status`), else the news that it cannot make one.
    pub(super) fn keep(&self, claim: Claim, status: i32, memory: &[u8]) -> std::io::Result<()> {
        let snapshot = if status == 0 {
            let (file, len) = super::image::of_memory(memory)?;
            self.inner.made.fetch_add(1, Ordering::Relaxed);
            if let Some(disk) = &self.disk
                && let Err(e) = disk.save(&claim.key, memory)
            {
                tracing::warn!("cannot keep a warm start's snapshot on disk: {e}");
            }
            let held = allocated_bytes(&file);
            Snapshot::Image { file, len, held }
        } else {
            Snapshot::Refused
        };
        self.inner
            .snapshots
            .lock()
            .put(claim.key, Arc::new(snapshot));
        Ok(())
    }
}

/// What a snapshot is keyed by: everything its state may depend on — the
/// module, the prelude, the arguments, environment and preopens (where
/// they are mounted; what they hold is in the scope) the interpreter saw,
/// and the scope that may share it. Not stdin, limits or the job's own
/// turn. None for a job that must start cold: what a prelude writes into
/// a directory a job keeps would not be in the next job's copy of it.
pub(super) fn key(spec: &RunSpec, warm: &WarmStart, scratch: bool) -> Option<[u8; 32]> {
    if spec.dirs.iter().any(|d| !d.read_only) {
        return None;
    }
    let preopens: Vec<(&str, bool)> = spec
        .dirs
        .iter()
        .map(|d| (d.guest.as_str(), d.read_only))
        .collect();
    let parts = (
        &spec.module,
        &warm.prelude,
        &spec.program_name,
        &spec.args,
        &spec.env,
        preopens,
        scratch,
        &spec.warm_scope,
    );
    let bytes = postcard::to_allocvec(&parts).expect("encoding a key to memory cannot fail");
    Some(Sha256::digest(bytes).into())
}

/// Calls `instance`'s `turn` with `source`; its exit status (the low 8
/// bits of what it returns: 256 and up mean the interpreter quit).
pub(super) async fn turn(
    mut store: impl AsContextMut<Data = JobState>,
    instance: &Instance,
    source: &str,
) -> wasmtime::Result<i32> {
    let alloc = instance.get_typed_func::<i32, i32>(&mut store, HOST_ALLOC)?;
    let run = instance.get_typed_func::<(i32, i32), i32>(&mut store, TURN)?;
    let memory = memory_of(&mut store, instance)?;
    let len = i32::try_from(source.len())
        .map_err(|_| wasmtime::format_err!("a turn's source is over 2 GiB"))?;
    let at = alloc.call_async(&mut store, len).await?;
    if at == 0 && len > 0 {
        wasmtime::bail!("the interpreter has no memory left for the turn's source");
    }
    memory.write(&mut store, at as u32 as usize, source.as_bytes())?;
    let status = run.call_async(&mut store, (at, len)).await?;
    Ok(status & 0xFF)
}

/// The instance's exported memory.
pub(super) fn memory_of(
    mut store: impl AsContextMut<Data = JobState>,
    instance: &Instance,
) -> wasmtime::Result<Memory> {
    instance
        .get_memory(&mut store, MEMORY)
        .ok_or_else(|| wasmtime::format_err!("the module exports no `{MEMORY}`"))
}

/// Gives `instance`'s memory the snapshot's contents: grown to its size
/// through the store's limiter, then the image mapped over it privately.
pub(super) async fn restore(
    mut store: impl AsContextMut<Data = JobState>,
    instance: &Instance,
    image: &SnapshotImage,
) -> wasmtime::Result<()> {
    let (file, len) = image.file();
    let memory = memory_of(&mut store, instance)?;
    let have = memory.data_size(&store);
    if len > have {
        memory
            .grow_async(&mut store, ((len - have) / WASM_PAGE) as u64)
            .await?;
    }
    let base = memory.data_ptr(&store);
    // SAFETY: `[base, base + len)` is accessible linear memory of this
    // store's own instance, allocated on demand (`WarmStarts`: an mmap of
    // its own, unmapped whole when the store drops; wasmtime keeps no
    // view of its contents). No wasm runs while it is replaced, and the
    // file is at least `len` long. The mapping is private: the job's
    // writes never reach the file or another job.
    unsafe { map_image(base, len, file) }
        .map_err(|e| wasmtime::format_err!("cannot map the snapshot into the job's memory: {e}"))
}

/// Maps `file`'s first `len` bytes privately over `[base, base + len)`:
/// the memory reads as the image, and a write copies the page it lands on
/// for this mapping alone.
///
/// # Safety
///
/// `[base, base + len)` is mapped memory that nothing reads or writes while
/// this runs and that may be replaced (its old pages are gone after); `file`
/// is at least `len` long.
pub(super) unsafe fn map_image(base: *mut u8, len: usize, file: &OwnedFd) -> std::io::Result<()> {
    // SAFETY: as the caller promised.
    let mapped = unsafe {
        libc::mmap(
            base.cast(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_FIXED,
            file.as_raw_fd(),
            0,
        )
    };
    if mapped == libc::MAP_FAILED || mapped != base.cast() {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The memory `file` takes: its allocated blocks (a memfd's or a kept
/// file's data pages; its holes take none).
fn allocated_bytes(file: &OwnedFd) -> u64 {
    // SAFETY: fstat(2) on a descriptor we own, into a zeroed struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(file.as_raw_fd(), &mut st) } != 0 {
        return 0;
    }
    u64::try_from(st.st_blocks).unwrap_or(0).saturating_mul(512)
}
