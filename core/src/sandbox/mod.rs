//! The sandbox: runs one job's module under wasmtime with exact limits and
//! reports how it ended.
//!
//! Layout:
//! * `spec` — [`RunSpec`]: a job as this machine runs it (the wire
//!   `JobSpec` resolved: trees laid out, the limit reserved);
//! * `config` — [`SandboxConfig`]: how the sandbox is set up, and the
//!   time-limit mechanism;
//! * `engine` — the shared `Engine` (instance allocator, time-limit mechanism);
//! * `code` — what bytes compile to: a core module or a component;
//! * `entry` — where a job starts (`_start`, or a reactor's `--invoke`) and `host::call`;
//! * `cache` — sha256 → compiled module, in memory and on disk;
//! * [`compile_memory`] — what a compile takes of the host's memory, read
//!   while it runs and learned for the next;
//! * [`component`] — WASI preview 2 components (`wasi:cli/command`);
//! * `artifacts` — the disk half: authenticated, bounded artifacts;
//! * `validate` — cheap checks on module bytes, for clear messages;
//! * `limiter` — the per-job memory limit and peak;
//! * [`files`] — what a job's files may take: descriptors and disk;
//! * `cancel` — ending a job early, from outside;
//! * `drive` — running a job's call to its end, deadline or cancel;
//! * `stdio` — captured, capped, optionally streamed stdout/stderr;
//! * `warm` — warm starts: jobs begun from a snapshot of an interpreter's
//!   memory (a Python map's items);
//! * `image` — a snapshot's memory as a sealed in-memory file, made from
//!   a memory or from a file kept on disk;
//! * `resident` — the instance such a job leaves, its memory put back to
//!   the snapshot, for the next job of the snapshot;
//! * `store` — a job's store: WASI, limiter, file bounds, time limit armed;
//! * `kinds` — how a component and a warm start run (a core module's run
//!   is here);
//! * `outcome` — classifying how a job ended;
//! * `wasi_ctx` — a job's WASI context: args, env, stdio, directories;
//! * `workdir` — the claimed directory jobs' scratch is made in;
//! * `scratch` — a job's scratch directory (kept for the next when left empty).
//!
//! A job runs as an async wasmtime call on a Tokio runtime. That is what lets
//! a wall-time limit end a job that is asleep in a host call: the sync WASI
//! implementation blocks its thread, and an epoch deadline is never checked
//! while it does. Compute is made to yield every few milliseconds by epochs
//! (or fuel), so the same timeout ends a busy job too.

pub(crate) mod artifacts;
pub(crate) mod cache;
pub(crate) mod cancel;
pub(crate) mod code;
pub mod compile_memory;
pub mod compiler;
pub mod component;
mod config;
mod disk;
mod drive;
pub(crate) mod engine;
pub(crate) mod entry;
pub mod files;
mod image;
mod job_state;
mod kinds;
pub(crate) mod limiter;
pub(crate) mod outcome;
mod resident;
mod scratch;
mod spec;
pub(crate) mod stdin;
pub(crate) mod stdio;
mod store;
pub(crate) mod validate;
mod warm;
mod warm_disk;
mod wasi_ctx;
mod workdir;

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedSender;
use wasmtime::{Engine, Linker};

pub(crate) use artifacts::ArtifactStore;
pub use cache::{CacheStats, CompiledModule, ModuleCache, max_compiles};
pub use cancel::{Cancel, CancelOnDrop};
pub use code::Code;
pub use compiler::CompileUsage;
pub use config::{
    CompileProgram, DEFAULT_CACHE_MAX, DEFAULT_MAX_MODULE_BYTES, DEFAULT_MODULE_BYTES_HELD,
    SandboxConfig, TimeLimitMechanism,
};
pub use engine::JOB_NATIVE_BYTES;
#[cfg(test)]
pub(crate) use engine::code_key;
pub use job_state::JobState;
pub use limiter::MemoryLender;
pub use spec::RunSpec;
pub use stdin::{StdinFeed, StdinSender};
pub use stdio::{OutputBudget, OutputCapture, OutputChunk};
pub use warm::WarmStats;

use crate::proto::{CacheSource, JobResult, Outcome, StdStream};
use crate::units::Bytes;
use cache::Prepared;
pub(crate) use drive::cpu_clock_nanos;
use drive::{Stopped, drive};
use limiter::MemoryLimiter;
use outcome::Phase;

/// Where a job's scratch directory appears in the guest.
pub const SCRATCH_GUEST_PATH: &str = "/tmp";

/// A result whose peak is above this share of its limit carries a warning.
pub const PEAK_WARNING_SHARE: f64 = 0.9;

/// What a running job reports to its caller besides its result.
#[derive(Clone, Default)]
pub struct RunHooks {
    /// Receives the job's output as it is written.
    pub tee: Option<UnboundedSender<OutputChunk>>,
    /// Holds the job's current linear memory in bytes while it runs.
    pub memory_meter: Option<Arc<AtomicU64>>,
    /// Lends the job memory past its reserve; none: the reserve bounds it.
    pub memory_lender: Option<Arc<dyn MemoryLender>>,
    /// Ends the job early when cancelled (outcome `cancelled`).
    pub cancel: Option<Cancel>,
    /// Host memory the job's buffered output is charged to (a worker's
    /// ledger); none: output is bounded by its caps only.
    pub output_budget: Option<Arc<dyn OutputBudget>>,
    /// Stdin as it arrives, after the spec's `stdin`; none: the spec's
    /// `stdin` is all of it.
    pub stdin: Option<StdinFeed>,
    /// Filled with the job's stdout and stderr captures once it starts, so
    /// that its output can be read while it runs (`peerwasm logs -f`).
    pub captures: Option<LiveOutput>,
    /// Notified (`notify_one`, so the news waits for a late listener) the
    /// moment the job starts: its module is loaded and its wall-time limit
    /// runs from now on. For a caller that keeps a watch of its own.
    pub started: Option<Arc<tokio::sync::Notify>>,
    /// Output goes to `tee` only and is not kept in the result: a slot
    /// process's parent keeps it (`runner::slotproc`). Default: false.
    pub forward_only: bool,
}

/// Where a running job's output captures are published; see
/// [`RunHooks::captures`].
pub type LiveOutput = Arc<parking_lot::Mutex<Option<[OutputCapture; 2]>>>;

/// One engine, one linker and one module cache, shared by every job of a
/// process.
pub struct Sandbox {
    /// The worker's scratch total, shared by its running jobs.
    scratch: Option<Arc<files::ScratchPool>>,
    engine: Engine,
    linker: Linker<JobState>,
    /// Components run on an engine of their own (on-demand allocation).
    component_engine: Engine,
    components: wasmtime::component::Linker<component::ComponentState>,
    cache: ModuleCache,
    config: SandboxConfig,
    /// Snapshots of interpreters, and the engine jobs started from them run on.
    warm: warm::WarmStarts,
    /// Instances jobs of a snapshot left, for the next of them.
    residents: resident::Residents,
    /// Where jobs' scratch directories are made (none: not asked for,
    /// `claim_jobs_dir`, or it could not be made, and they go under
    /// `scratch_root` as they are).
    work: Option<workdir::WorkDir>,
    /// Empty scratch directories kept for the next jobs (`scratch`).
    spare_scratch: Arc<scratch::Spares>,
}

impl Sandbox {
    /// Creates the engine (and its epoch ticker), the WASI linker and the cache.
    pub fn new(config: SandboxConfig) -> anyhow::Result<Sandbox> {
        let engine = engine::build(&config)?;
        let component_engine = engine::build_for_components(&config)?;
        if config.time_limit == TimeLimitMechanism::Epoch {
            engine::start_epoch_ticker(&engine);
            engine::start_epoch_ticker(&component_engine);
        }
        let linker = core_linker(&engine)?;
        // Warm starts need memories of their own (see `warm`): the
        // components' on-demand engine when the main one pools.
        // Their snapshots also kept beside the compiled modules, if asked.
        let kept = config
            .cache_dir
            .as_ref()
            .filter(|_| config.keep_snapshots_on_disk)
            .map(|d| d.join("snapshots"));
        let warm = if config.pooling {
            warm::WarmStarts::new(
                component_engine.clone(),
                core_linker(&component_engine)?,
                kept,
                config.map_kept_snapshots,
            )
        } else {
            warm::WarmStarts::new(
                engine.clone(),
                linker.clone(),
                kept,
                config.map_kept_snapshots,
            )
        };
        let components = component::linker(&component_engine)?;
        let cache = ModuleCache::new(engine.clone(), component_engine.clone(), &config)?;
        let scratch = config
            .scratch_total_bytes
            .map(|total| Arc::new(files::ScratchPool::new(total)));
        let work = config
            .claim_jobs_dir
            .then(|| {
                workdir::WorkDir::make(config.scratch_root.as_deref())
                    .inspect_err(|e| {
                        tracing::warn!("cannot make a directory for the jobs' scratch: {e}")
                    })
                    .ok()
            })
            .flatten();
        Ok(Sandbox {
            work,
            scratch,
            engine,
            linker,
            component_engine,
            components,
            cache,
            config,
            warm,
            residents: resident::Residents::default(),
            spare_scratch: Arc::default(),
        })
    }

    /// Lets go of what warm starts keep for the next jobs — snapshots,
    /// resident instances — when the memory is wanted: the next job of
    /// each snapshot makes it again (from the disk, where kept).
    pub fn drop_warm(&self) {
        self.residents.clear();
        self.warm.drop_snapshots();
    }

    /// The warm starts' counters.
    pub fn warm_stats(&self) -> WarmStats {
        let warm = self.warm.stats();
        WarmStats {
            resident_starts: self.residents.started(),
            held_bytes: warm.held_bytes + self.residents.held_bytes(|k| self.warm.holds(k)),
            ..warm
        }
    }

    /// The shared engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The configuration it was made with.
    pub fn config(&self) -> &SandboxConfig {
        &self.config
    }

    /// The worker's disk total shared by running jobs (`scratch_total_bytes`),
    /// for whatever else the worker keeps on disk for jobs.
    pub fn scratch_pool(&self) -> Option<Arc<files::ScratchPool>> {
        self.scratch.clone()
    }

    /// The module cache's counters.
    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// The compiled module, if it is in memory. Cheap; never compiles.
    pub fn cached(&self, hash: &crate::proto::ModuleHash) -> Option<Arc<CompiledModule>> {
        self.cache.get(hash)
    }

    /// The compiled module from the memory or disk cache, never compiling.
    /// Blocks while reading the disk: call it from a blocking thread.
    pub fn load_cached(
        &self,
        hash: &crate::proto::ModuleHash,
    ) -> Option<(Arc<CompiledModule>, CacheSource)> {
        self.cache.load_cached(hash)
    }

    /// Whether the memory or disk cache has the compiled module.
    pub fn has_compiled(&self, hash: &crate::proto::ModuleHash) -> bool {
        self.cache.has(hash)
    }

    /// What compiles take of the host's memory here: the estimate for the
    /// next, and the resident memory of those running now.
    pub fn compile_memory(&self) -> &compile_memory::CompileMemory {
        self.cache.compile_memory()
    }

    /// The compiled module for `bytes` (whose sha256 is `hash`), compiling
    /// it if no cache has it. Blocks while compiling: call it from a
    /// blocking thread. `Err` is the outcome to report (invalid, rejected).
    pub fn load(
        &self,
        hash: &crate::proto::ModuleHash,
        bytes: &[u8],
    ) -> Result<(Arc<CompiledModule>, CacheSource), Outcome> {
        self.load_for(hash, bytes, None)
    }

    /// [`load`](Self::load) for a job that may be cancelled: a compile in a
    /// child process (`compile_program`) is ended once `cancel` is, rather
    /// than run on after the job.
    pub fn load_for(
        &self,
        hash: &crate::proto::ModuleHash,
        bytes: &[u8],
        cancel: Option<&Cancel>,
    ) -> Result<(Arc<CompiledModule>, CacheSource), Outcome> {
        if bytes.len() as u64 > self.config.max_module_bytes {
            return Err(Outcome::Rejected {
                reason: format!(
                    "module is {}, larger than the {} this worker accepts",
                    Bytes(bytes.len() as u64),
                    Bytes(self.config.max_module_bytes)
                ),
            });
        }
        let wanted = || cancel.is_none_or(|c| !c.is_cancelled());
        self.cache.load(hash, bytes, &wanted)
    }

    /// Whether a compile is ended when its job is cancelled (compiles run
    /// in child processes): the job's charges can then wait for it to end.
    pub fn compiles_apart(&self) -> bool {
        self.config.compile_program.is_some()
    }

    /// Runs `spec` with the compiled `module`. Every way the job can end is
    /// an [`Outcome`] in the result; this never panics because of the job.
    /// `hooks` receive the output and the memory in use as the job runs.
    pub async fn run(
        &self,
        module: &CompiledModule,
        spec: &RunSpec,
        cache: CacheSource,
        hooks: RunHooks,
    ) -> JobResult {
        let limits = &spec.limits;
        let mut result = JobResult {
            cache,
            ..JobResult::never_ran(limits.memory.bytes(), Outcome::Exited { code: 0 })
        };
        let prepared = match self.ready_to_run(module, spec) {
            Ok(prepared) => prepared,
            Err(outcome) => return JobResult { outcome, ..result },
        };

        let [mut stdout, mut stderr] = self.output_captures(spec, hooks.tee, hooks.output_budget);
        if hooks.forward_only {
            (stdout, stderr) = (stdout.forward_only(), stderr.forward_only());
        }
        if let Some(live) = &hooks.captures {
            *live.lock() = Some([stdout.clone(), stderr.clone()]);
        }
        if let Some(started) = &hooks.started {
            started.notify_one();
        }
        let io = JobIo {
            stdin: hooks.stdin.as_ref(),
            stdout: &stdout,
            stderr: &stderr,
        };
        let (deadline, worker_limit) = self.deadline(limits.timeout_ms);
        let bounds = Bounds {
            limiter: MemoryLimiter::of(limits, spec.memory_reserve, hooks.memory_lender)
                .with_meter(hooks.memory_meter),
            deadline,
            cancel: hooks.cancel.unwrap_or_default(),
        };
        let ran = match (prepared, &spec.warm, &module.code) {
            (Prepared::Module { opens_files, .. }, Some(warm), Code::Module(m)) => {
                self.run_warm(module.hash, m, *opens_files, warm, spec, io, bounds)
                    .await
            }
            (Prepared::Module { pre, opens_files }, _, _) => {
                self.run_module(pre, *opens_files, spec, io, bounds).await
            }
            (Prepared::Component { pre }, _, _) => self.run_component(pre, spec, io, bounds).await,
        };
        let ran = match ran {
            Ok(ran) => ran,
            Err(reason) => {
                return JobResult {
                    outcome: Outcome::Rejected { reason },
                    ..result
                };
            }
        };
        result.wall_time_us = ran.wall_time_us;
        result.cpu_time_us = ran.cpu_time_us;
        result.peak_memory_bytes = ran.limiter.peak();
        result.outcome = match ran.ended {
            Err(Stopped::Elapsed) => Outcome::TimeLimitExceeded {
                limit_ms: deadline.map_or(0, |d| d.as_millis() as u64),
                worker_limit,
            },
            Err(Stopped::Cancelled(cause)) => Outcome::Cancelled { cause },
            Ok(Ok(())) => Outcome::Exited { code: 0 },
            Ok(Err((phase, err))) => {
                outcome::classify(&err, phase, &ran.limiter, [&stdout, &stderr])
            }
        };
        result.stdout = stdout.take();
        result.stderr = stderr.take();
        if result.peak_memory_bytes as f64 > PEAK_WARNING_SHARE * limits.memory.bytes() as f64
            && !matches!(result.outcome, Outcome::MemoryLimitExceeded { .. })
        {
            result.warnings.push(format!(
                "peak memory {} is over {:.0}% of the {} limit; the next run may need more",
                Bytes(result.peak_memory_bytes),
                PEAK_WARNING_SHARE * 100.0,
                Bytes(limits.memory.bytes())
            ));
        }
        result
    }

    /// What must hold before a job may start: a memory limit this sandbox
    /// allows, and a module whose imports resolve (trees cannot be left:
    /// a [`RunSpec`] has none). `Err` is how the job ends instead.
    fn ready_to_run<'m>(
        &self,
        module: &'m CompiledModule,
        spec: &RunSpec,
    ) -> Result<&'m Prepared, Outcome> {
        if spec.limits.memory.bytes() > self.config.max_job_memory {
            return Err(Outcome::Rejected {
                reason: format!(
                    "a memory limit of {} is more than the {} a job may have here",
                    Bytes(spec.limits.memory.bytes()),
                    Bytes(self.config.max_job_memory)
                ),
            });
        }
        let prepared = module
            .prepared
            .get_or_init(|| self.prepare(module))
            .as_ref()
            .map_err(|reason| Outcome::InvalidModule {
                reason: reason.clone(),
            })?;
        // Per job, not per module: one module may be invoked by several names.
        match &module.code {
            Code::Module(m) if spec.warm.is_some() => warm::check(m),
            Code::Module(m) => entry::check(m, spec.invoke.as_deref()),
            Code::Component(_) if spec.invoke.is_some() => Err(
                "--invoke names an export of a core module; a component runs its `wasi:cli/run`"
                    .to_string(),
            ),
            Code::Component(_) if spec.warm.is_some() => Err(
                "a warm start needs a core module that keeps an interpreter (CPython for WASI)"
                    .to_string(),
            ),
            Code::Component(_) => Ok(()),
        }
        .map_err(|reason| Outcome::InvalidModule { reason })?;
        Ok(prepared)
    }

    /// Runs a core module's entry (`_start`, or `--invoke`) in a fresh store. `Err` is why the
    /// job could not start (its scratch directory, a granted directory).
    async fn run_module(
        &self,
        pre: &wasmtime::InstancePre<JobState>,
        opens_files: bool,
        spec: &RunSpec,
        io: JobIo<'_>,
        bounds: Bounds,
    ) -> Result<Ran, String> {
        let (mut store, _scratch) =
            self.core_store(&self.engine, opens_files, spec, io, bounds.limiter)?;
        let call = async {
            let instance = pre
                .instantiate_async(&mut store)
                .await
                .map_err(|e| (Phase::Instantiate, e))?;
            entry::call(&mut store, &instance, spec.invoke.as_deref())
                .await
                .map_err(|e| (Phase::Run, e))
        };
        let (ended, wall_time_us, cpu_time_us) = drive(call, bounds.deadline, &bounds.cancel).await;
        Ok(Ran {
            ended,
            wall_time_us,
            cpu_time_us,
            limiter: store.into_data().limiter,
        })
    }

    /// A job's stdout and stderr captures: the caps it asked for, within
    /// the sandbox's `max_output_bytes`.
    pub fn output_captures(
        &self,
        spec: &RunSpec,
        tee: Option<UnboundedSender<OutputChunk>>,
        budget: Option<Arc<dyn OutputBudget>>,
    ) -> [OutputCapture; 2] {
        let cap = |asked: u64| {
            self.config
                .max_output_bytes
                .map_or(asked, |max| asked.min(max))
        };
        [
            OutputCapture::new(
                StdStream::Stdout,
                cap(spec.limits.stdout_bytes),
                tee.clone(),
            )
            .with_budget(budget.clone()),
            OutputCapture::new(StdStream::Stderr, cap(spec.limits.stderr_bytes), tee)
                .with_budget(budget),
        ]
    }

    /// The wall-time limit a job asking for `timeout_ms` runs under, and
    /// whether it is the sandbox's own (`max_job_time`) rather than the
    /// job's: the smaller of the two wins.
    pub fn deadline(&self, timeout_ms: Option<u64>) -> (Option<Duration>, bool) {
        let asked = timeout_ms.map(Duration::from_millis);
        match (asked, self.config.max_job_time) {
            (Some(a), Some(max)) if max < a => (Some(max), true),
            (None, Some(max)) => (Some(max), true),
            (asked, _) => (asked, false),
        }
    }

    /// Resolves the module's imports against our linker, once per module.
    fn prepare(&self, module: &CompiledModule) -> Result<Prepared, String> {
        let m = match &module.code {
            Code::Module(m) => m,
            Code::Component(c) => {
                return component::prepare(&self.component_engine, &self.components, c)
                    .map(|pre| Prepared::Component { pre });
            }
        };
        for import in m.imports() {
            if !entry::is_provided(import.module(), import.name()) {
                return Err(format!(
                    "it imports `{}::{}`, which peerwasm does not provide (only wasi_snapshot_preview1 and host::call)",
                    import.module(),
                    import.name()
                ));
            }
        }
        let pre = self
            .linker
            .instantiate_pre(m)
            .map_err(|e| format!("its imports cannot be satisfied: {}", code::one_line(&e)))?;
        let opens_files = m.imports().any(|i| i.name() == "path_open");
        Ok(Prepared::Module { pre, opens_files })
    }
}

/// A linker for core modules on `engine`: WASI preview 1 (with our file
/// bounds) and `host::call`.
fn core_linker(engine: &Engine) -> anyhow::Result<Linker<JobState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p1::add_to_linker_async(&mut linker, |s: &mut JobState| &mut s.wasi)
        .and_then(|()| files::add_to_linker(&mut linker))
        .and_then(|()| entry::add_host_stub(&mut linker))
        .map_err(|e| anyhow::anyhow!("cannot link WASI: {e}"))?;
    Ok(linker)
}

/// A job's stdio, shared by both kinds of code.
#[derive(Clone, Copy)]
struct JobIo<'a> {
    stdin: Option<&'a StdinFeed>,
    stdout: &'a OutputCapture,
    stderr: &'a OutputCapture,
}

/// What bounds a job while it runs, besides its output caps.
struct Bounds {
    limiter: MemoryLimiter,
    deadline: Option<Duration>,
    cancel: Cancel,
}

/// How a job's call ended, and what it used.
struct Ran {
    ended: Result<Result<(), (Phase, wasmtime::Error)>, Stopped>,
    wall_time_us: u64,
    cpu_time_us: u64,
    limiter: MemoryLimiter,
}
