//! [`JobRunner`]: runs jobs in a fixed number of slots on this machine —
//! the layer between the sandbox and its two users: the embedded worker
//! (a runner inside `run`'s or `map`'s process, through
//! [`Target`](crate::client::Target)) and `peerwasm worker`.
//!
//! * this file — the runner: slots, the module store, which jobs go to a
//!   slot process;
//! * `modules` — module bytes held for compiling, within a byte budget;
//! * [`source`] — a module's bytes in hand, or left in their file until a
//!   compile needs them;
//! * [`slotproc`] — slot processes as the worker sees them: children that
//!   run jobs with no time-limit instrumentation, killed at their deadline
//!   (`peerwasm slot`; the child's side is [`crate::slot`], a floor above).
//!
//! Jobs run on a Tokio runtime of their own with one thread per slot, apart
//! from whatever runtime the caller uses (the CLI's, or an HTTP server's): a
//! job computing between two yields then never delays request handling. A
//! worker puts each job's whole life on these threads ([`JobRunner::spawn`]):
//! a job that ends there starts the next one on the same thread, where a
//! hand-off to and from the HTTP threads cost a trivial job more than its
//! run.
//! Compiling a module happens on a blocking thread, once per module (the
//! sandbox's cache sees to that).
//!
//! With slot processes configured ([`RunnerConfig::slot_processes`]), a job
//! may instead run in a child process with no time-limit instrumentation
//! ([`slotproc`]); the runner decides which, per job, by its policy
//! and what it learned of the module's last job.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::sync::mpsc::UnboundedSender;

pub(crate) mod modules;
pub mod slotproc;
pub mod source;

pub use source::ModuleSource;

use crate::proto::{CacheSource, CancelCause, JobResult, JobSpec, ModuleHash, Outcome};
use crate::sandbox::RunSpec;
use crate::sandbox::{Cancel, OutputChunk, RunHooks, Sandbox, SandboxConfig};
use modules::ModuleBytes;
use slotproc::{LARGE_MODULE_BYTES, LONG_JOB_CPU, SlotPolicy, SlotProcessConfig, SlotProcesses};

/// How a runner is set up.
#[derive(Clone, Debug, Default)]
pub struct RunnerConfig {
    /// The sandbox; its `slots` is also the number of jobs run at once.
    pub sandbox: SandboxConfig,
    /// Child processes that run jobs without time-limit instrumentation,
    /// and which jobs go to them. Default: none (every job in-process:
    /// a library caller has no `peerwasm slot` program to start).
    pub slot_processes: Option<SlotProcessConfig>,
}

/// Modules the runner remembers the last job's CPU of, at most.
const LEARNED_MODULES: usize = 4096;

/// Runs jobs in N slots; see the module docs.
pub struct JobRunner {
    sandbox: Arc<Sandbox>,
    slots: Arc<Semaphore>,
    /// Module bytes by hash, for compiling on a cache miss.
    modules: Arc<Mutex<ModuleBytes>>,
    /// Slot processes and the policy that sends jobs to them.
    children: Option<(Arc<SlotProcesses>, SlotPolicy)>,
    /// Modules whose last job computed at least `LONG_JOB_CPU` (true) or
    /// less (false): also which modules have run here at all.
    long: Arc<Mutex<HashMap<ModuleHash, bool>>>,
    /// `Some` until drop; dropped in the background so that dropping a
    /// runner inside another runtime does not panic.
    runtime: Option<tokio::runtime::Runtime>,
}

impl JobRunner {
    /// Creates the sandbox and the slot threads.
    pub fn new(config: RunnerConfig) -> anyhow::Result<JobRunner> {
        let slots = config.sandbox.slots.max(1);
        let modules = ModuleBytes::new(config.sandbox.module_bytes_held);
        let sandbox = Arc::new(Sandbox::new(config.sandbox)?);
        let children = config
            .slot_processes
            .filter(|c| c.policy != SlotPolicy::Never)
            .map(|c| (Arc::new(SlotProcesses::new(c.program, &sandbox)), c.policy));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(slots)
            .thread_name("peerwasm-slot")
            .enable_all()
            .build()?;
        Ok(JobRunner {
            sandbox,
            slots: Arc::new(Semaphore::new(slots)),
            modules: Arc::new(Mutex::new(modules)),
            children,
            long: Arc::default(),
            runtime: Some(runtime),
        })
    }

    /// The sandbox the jobs run in.
    pub fn sandbox(&self) -> &Sandbox {
        &self.sandbox
    }

    /// Jobs run in slot processes so far (0 without them).
    pub fn slot_process_jobs(&self) -> u64 {
        self.children.as_ref().map_or(0, |(c, _)| c.jobs())
    }

    /// What this runner holds between jobs for the jobs to come — warm
    /// starts' kept snapshots and resident instances, in this process and
    /// in its slot processes — in bytes. No job's limit counts it: a worker
    /// charges it to its ledger.
    pub fn warm_held_bytes(&self) -> u64 {
        let children = self.children.as_ref().map_or(0, |(c, _)| c.warm_held());
        self.sandbox.warm_stats().held_bytes + children
    }

    /// Lets go of what [`warm_held_bytes`](Self::warm_held_bytes) counts:
    /// this process's snapshots and resident instances, and its idle slot
    /// processes (a busy one keeps its own until its job ends).
    pub fn drop_warm(&self) {
        self.sandbox.drop_warm();
        if let Some((children, _)) = &self.children {
            children.drop_idle();
        }
    }

    /// How many jobs run at once.
    pub fn slots(&self) -> usize {
        self.sandbox.config().slots.max(1)
    }

    /// Makes a module's bytes available to jobs; returns its hash. Hashing
    /// happens here, once, not per job.
    pub fn add_module(&self, bytes: impl Into<Arc<[u8]>>) -> ModuleHash {
        let bytes = bytes.into();
        let hash = ModuleHash::of(&bytes);
        self.add_module_hashed(hash, bytes);
        hash
    }

    /// [`add_module`](Self::add_module) for bytes whose sha256 the caller
    /// has already computed (or verified). A wrong hash is caught when the
    /// module is compiled: the cache checks it again then.
    pub fn add_module_hashed(&self, hash: ModuleHash, bytes: impl Into<Arc<[u8]>>) {
        self.add_module_source(hash, ModuleSource::in_hand(bytes.into()));
    }

    /// [`add_module_hashed`](Self::add_module_hashed) for a module that may
    /// still be in its file ([`Job::source`](crate::client::Job::source)):
    /// read only if a job of it needs compiling or a slot process lacks it.
    /// A no-op if the runner holds it already.
    pub fn add_module_source(&self, hash: ModuleHash, source: ModuleSource) {
        self.lock_modules().insert(hash, source);
    }

    /// Whether the runner can run this module: it has its bytes, or its
    /// compiled form in memory or on disk (after a restart, the bytes are
    /// gone but the artifact is not, and nothing needs uploading again).
    pub fn has_module(&self, hash: &ModuleHash) -> bool {
        self.lock_modules().contains(hash) || self.sandbox.has_compiled(hash)
    }

    /// Compiles `bytes` ahead of its jobs (`peerwasm worker --precompile`),
    /// for the engine they will run on: the slot processes' for a module
    /// that goes to them (every module under `always`; one of
    /// [`LARGE_MODULE_BYTES`] or more under `auto`), else this process's.
    /// Keeps the bytes for its jobs as [`add_module`](Self::add_module)
    /// does. Blocks for the compile (CPython: ~45 s): call it from a
    /// blocking thread. Returns the module's hash, whether its jobs run in
    /// slot processes, and where its code came from (a module compiled
    /// before comes from the disk cache).
    pub fn precompile(&self, bytes: Arc<[u8]>) -> Result<(ModuleHash, bool, CacheSource), String> {
        let hash = ModuleHash::of(&bytes);
        self.add_module_hashed(hash, bytes.clone());
        let children = self.children.as_ref().filter(|(_, policy)| match policy {
            SlotPolicy::Always => true,
            SlotPolicy::Auto => bytes.len() >= LARGE_MODULE_BYTES,
            SlotPolicy::Never => false,
        });
        let source = match children {
            Some((children, _)) => children.precompile(&hash, &bytes)?,
            None => self
                .sandbox
                .load(&hash, &bytes)
                .map(|(_, source)| source)
                .map_err(|o| o.to_string())?,
        };
        Ok((hash, children.is_some(), source))
    }

    /// Whether this module's code is ready to run without compiling: a job
    /// of it has run here (in this process or a slot process), or its
    /// compiled form is in this process's memory or disk cache, or in the
    /// disk cache for the slot processes' engine.
    pub fn is_compiled(&self, hash: &ModuleHash) -> bool {
        self.lock_long().contains_key(hash)
            || self.sandbox.has_compiled(hash)
            || self
                .children
                .as_ref()
                .is_some_and(|(children, _)| children.has_compiled(hash))
    }

    /// The module's bytes, if this runner holds them (after a restart it
    /// may hold only the compiled form).
    pub fn module_bytes(&self, hash: &ModuleHash) -> Option<Arc<[u8]>> {
        let source = self.lock_modules().get(hash)?;
        Some(source.bytes().clone()).filter(|b| !b.is_empty())
    }

    /// Runs one job when a slot is free and returns how it ended. Output is
    /// also sent to `tee` as the job writes it, if given. Never panics
    /// because of the job: even a panic inside wasmtime comes back as an
    /// outcome.
    pub async fn run(&self, spec: JobSpec, tee: Option<UnboundedSender<OutputChunk>>) -> JobResult {
        self.run_with(
            spec,
            RunHooks {
                tee,
                ..RunHooks::default()
            },
        )
        .await
    }

    /// [`run`](Self::run) with all the hooks. The job is resolved as the
    /// embedded worker runs it ([`RunSpec::local`]): one naming shipped
    /// trees is rejected.
    pub async fn run_with(&self, spec: JobSpec, hooks: RunHooks) -> JobResult {
        let limit = spec.limits.memory.bytes();
        match RunSpec::local(spec) {
            Ok(spec) => self.run_resolved(spec, hooks).await,
            Err(reason) => JobResult::never_ran(limit, Outcome::Rejected { reason }),
        }
    }

    /// Runs a job already resolved for this machine (a worker's: its trees
    /// laid out, its limit the reservation) with all the hooks.
    ///
    /// The job is cancelled (cause: its client went away) if this future is
    /// dropped before it ends: nobody would read its result. With
    /// `hooks.cancel`, whoever holds that handle can end it too, while it
    /// waits for a slot, compiles or runs.
    pub async fn run_resolved(&self, spec: RunSpec, mut hooks: RunHooks) -> JobResult {
        let source = self.lock_modules().get(&spec.module);
        let limit = spec.limits.memory.bytes();
        let sandbox = self.sandbox.clone();
        let slots = self.slots.clone();
        let long = self.long.clone();
        let hash = spec.module;
        let child = self.slot_processes_for(&hash, source.as_ref().map(ModuleSource::len));
        let cancel = hooks.cancel.get_or_insert_with(Cancel::new).clone();
        let abandoned = cancel.on_drop(CancelCause::ClientGone);
        let task = async move {
            let cancel = hooks.cancel.clone().unwrap_or_default();
            let permit = tokio::select! {
                biased;
                cause = cancel.cancelled() => return JobResult::never_ran(limit, Outcome::Cancelled { cause }),
                permit = slots.acquire_owned() => permit,
            };
            let Ok(_permit) = permit else {
                return JobResult::host_failure(limit, "the runner is shutting down");
            };
            if let Some(children) = child {
                return children.run(&sandbox, spec, source, hooks).await;
            }
            match load(&sandbox, spec.module, source, &cancel, limit).await {
                Ok((module, source)) => sandbox.run(&module, &spec, source, hooks).await,
                Err(ended) => ended,
            }
        };
        let handle = self
            .runtime
            .as_ref()
            .expect("runtime lives until drop")
            .spawn(task);
        let result = match handle.await {
            Ok(result) => result,
            Err(e) => JobResult::host_failure(limit, &format!("the job's task failed: {e}")),
        };
        abandoned.disarm();
        if result.wall_time_us > 0 {
            let mut long = long.lock();
            if long.len() >= LEARNED_MODULES && !long.contains_key(&hash) {
                long.clear();
            }
            long.insert(
                hash,
                Duration::from_micros(result.cpu_time_us) >= LONG_JOB_CPU,
            );
        }
        result
    }

    /// The slot processes a job of module `hash` runs in, if it goes to
    /// them: always, never, or (auto) a large module or one whose jobs
    /// were long. `len`: the length of the module's bytes, if the runner
    /// holds them; without them (a restarted worker that kept only the
    /// compiled form), only this process's cache can run it.
    fn slot_processes_for(
        &self,
        hash: &ModuleHash,
        len: Option<u64>,
    ) -> Option<Arc<SlotProcesses>> {
        let (children, policy) = self.children.as_ref()?;
        let go = match policy {
            SlotPolicy::Always => true,
            SlotPolicy::Auto => {
                len.is_some_and(|n| n >= LARGE_MODULE_BYTES as u64)
                    || self.lock_long().get(hash).copied().unwrap_or(false)
            }
            SlotPolicy::Never => false,
        };
        (go && len.is_some()).then(|| children.clone())
    }

    /// Runs `task` on the slot threads, where [`run_with`](Self::run_with)
    /// runs jobs. A worker runs each job's whole life there (its wait for
    /// a turn, its run, its accounting), so that a job ending hands its slot
    /// to the next on the same thread: no wake-up of another thread between
    /// two jobs.
    pub fn spawn<F>(&self, task: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.runtime
            .as_ref()
            .expect("runtime lives until drop")
            .spawn(task)
    }

    /// Keeps `hash`'s bytes from being dropped for other uploads until the
    /// returned pin is dropped: what a queued job holds until it starts.
    pub fn pin_module(&self, hash: &ModuleHash) -> ModulePin {
        self.lock_modules().pin(hash);
        ModulePin {
            modules: self.modules.clone(),
            hash: *hash,
        }
    }

    /// Module bytes held now (within `SandboxConfig::module_bytes_held`).
    pub fn module_bytes_held(&self) -> u64 {
        self.lock_modules().held()
    }

    /// [`run`](Self::run) for callers outside any async runtime.
    pub fn run_blocking(&self, spec: JobSpec) -> JobResult {
        self.runtime
            .as_ref()
            .expect("runtime lives until drop")
            .block_on(self.run(spec, None))
    }

    fn lock_long(&self) -> parking_lot::MutexGuard<'_, HashMap<ModuleHash, bool>> {
        self.long.lock()
    }

    fn lock_modules(&self) -> parking_lot::MutexGuard<'_, ModuleBytes> {
        self.modules.lock()
    }
}

/// A module kept for a job; see [`JobRunner::pin_module`].
pub struct ModulePin {
    modules: Arc<Mutex<ModuleBytes>>,
    hash: ModuleHash,
}

impl Drop for ModulePin {
    fn drop(&mut self) {
        self.modules.lock().unpin(&self.hash);
    }
}

impl Drop for JobRunner {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// Module `hash`'s compiled code, from the memory cache, else the disk
/// cache or a compile of `bytes` on a blocking thread (without the bytes —
/// a restarted worker — the disk cache may still have it). `Err` is how
/// the job ended without running. A cancelled job's compile is ended if it
/// runs in a child process (`sandbox::compiler`); one on a thread finishes
/// and lands in the cache.
async fn load(
    sandbox: &Arc<Sandbox>,
    hash: ModuleHash,
    source: Option<ModuleSource>,
    cancel: &Cancel,
    limit: u64,
) -> Result<(Arc<crate::sandbox::CompiledModule>, CacheSource), JobResult> {
    if let Some(module) = sandbox.cached(&hash) {
        return Ok((module, CacheSource::Memory));
    }
    let (loader, wants) = (sandbox.clone(), cancel.clone());
    // A module still in its file is read only if neither memory nor disk
    // has its compiled code (a new process's first job finds it on disk).
    let mut loaded = tokio::task::spawn_blocking(move || match source {
        Some(source) => match (!source.is_read())
            .then(|| loader.load_cached(&hash))
            .flatten()
        {
            Some(found) => Ok(Some(found)),
            None => loader
                .load_for(&hash, source.bytes(), Some(&wants))
                .map(Some),
        },
        None => Ok(loader.load_cached(&hash)),
    });
    let loaded = tokio::select! {
        biased;
        cause = cancel.cancelled() => {
            // A compile in a child process sees the cancel and is ended
            // within milliseconds: until then it is still this job's, and
            // so are its charges. One on a thread runs on to its end.
            if sandbox.compiles_apart() {
                let _ = (&mut loaded).await;
            }
            return Err(JobResult::never_ran(limit, Outcome::Cancelled { cause }));
        }
        loaded = &mut loaded => loaded,
    };
    match loaded {
        Ok(Ok(Some(loaded))) => Ok(loaded),
        Ok(Ok(None)) => Err(JobResult::never_ran(
            limit,
            Outcome::Rejected {
                reason: format!("module {hash} is unknown here"),
            },
        )),
        Ok(Err(outcome)) => Err(JobResult::never_ran(limit, outcome)),
        Err(e) => Err(JobResult::host_failure(
            limit,
            &format!("compiling the module failed: {e}"),
        )),
    }
}
