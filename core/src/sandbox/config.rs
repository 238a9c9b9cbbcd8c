//! How the sandbox is set up: [`SandboxConfig`] (a worker sends it to its
//! slot processes), its defaults, and how compute is made interruptible.

use std::path::PathBuf;
use std::time::Duration;

/// Module bytes a runner keeps for compiling by default (`--module-memory`).
pub const DEFAULT_MODULE_BYTES_HELD: u64 = 1 << 30;

/// The largest module accepted by default (`--max-module-size`): room for
/// CPython with numpy, scipy and pandas compiled in (`python.wasm`, 95 MiB).
pub const DEFAULT_MAX_MODULE_BYTES: u64 = 128 << 20;

/// The most bytes of compiled artifacts a disk cache keeps by default.
pub const DEFAULT_CACHE_MAX: u64 = 4 << 30;

/// How a job that computes without end is made to give the thread back, so
/// its wall-time limit can end it. A job blocked in a host call (sleeping)
/// is ended by the async timeout in either case.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum TimeLimitMechanism {
    /// Epoch interruption: a ticker thread bumps the engine's epoch every
    /// `EPOCH_TICK` (10 ms); compiled code checks it at loop heads and calls.
    Epoch,
    /// Fuel metering: compiled code counts instructions and yields every
    /// `FUEL_YIELD_INTERVAL` units. The default: it measured as cheap as
    /// or cheaper than epochs on our guests (docs/time-limits.md), and the
    /// count is deterministic.
    #[default]
    Fuel,
    /// Neither: a computing job cannot be interrupted. Only for measuring
    /// what the mechanism costs; `timeout_ms` is not enforced on compute.
    Off,
}

/// How the sandbox is set up. Every field has a default (see `Default`).
/// Serializable: a worker sends it to its slot processes.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct SandboxConfig {
    /// How many jobs run at once; sizes the pooling allocator.
    /// Default: the number of cores.
    pub slots: usize,
    /// Use wasmtime's pooling instance allocator (faster instantiation,
    /// fixed address-space reservation per slot). Default: true.
    pub pooling: bool,
    /// How compute is made interruptible. Default: fuel.
    pub time_limit: TimeLimitMechanism,
    /// The largest module accepted, in bytes; larger ones are rejected.
    /// Default: [`DEFAULT_MAX_MODULE_BYTES`].
    pub max_module_bytes: u64,
    /// The largest memory limit a job may ask for, in bytes. Default: 4 GiB
    /// (all a wasm32 memory can address).
    pub max_job_memory: u64,
    /// Compiled modules kept in memory. Default: 64.
    pub cache_entries: usize,
    /// Module bytes a runner keeps for compiling on a cache miss, in bytes;
    /// the least recently used go first (`runner::modules`). Default:
    /// [`DEFAULT_MODULE_BYTES_HELD`].
    pub module_bytes_held: u64,
    /// Where compiled artifacts are kept on disk; `None` keeps them in
    /// memory only. Default: none.
    pub cache_dir: Option<PathBuf>,
    /// The most bytes of artifacts kept on disk; the least recently used
    /// go first. Default: [`DEFAULT_CACHE_MAX`].
    pub cache_max_bytes: u64,
    /// How long compiling one module may take; past it the job is
    /// `rejected` naming the limit, and so is every later job of that
    /// module. CPU time (all its threads) when compiles run in a child
    /// process (`compile_program`), wall time otherwise. Default: none
    /// (`peerwasm worker` sets 60 s).
    pub max_compile_time: Option<Duration>,
    /// Compile modules in a child process started from this program
    /// (`sandbox::compiler`): a compile can then be ended — past its CPU
    /// time, or when its job is cancelled — rather than run on after its
    /// job. Default: none, compiles run on threads of this process
    /// (`peerwasm worker` sets its own executable).
    #[serde(default)]
    pub compile_program: Option<CompileProgram>,
    /// Where per-job scratch directories are made. Default: the system's
    /// temporary directory.
    pub scratch_root: Option<PathBuf>,
    /// Whether jobs' scratch directories (and a worker's laid-out trees)
    /// are made inside one directory of this sandbox's own, claimed while
    /// it lives, so that what a killed process's jobs left is removed by
    /// the next to start there (`peerwasm worker` sets it; a one-shot
    /// `peerwasm run`, whose process may end without unwinding, does not).
    /// Default: false.
    #[serde(default)]
    pub claim_jobs_dir: bool,
    /// The longest any job may run, whatever it asks (a worker's
    /// `--max-job-time`); a job that asks for no limit gets this one.
    /// Default: none (as `wasmtime run`; `peerwasm worker` sets 24 h).
    pub max_job_time: Option<Duration>,
    /// Descriptors (files, directories) a job may hold open; past it,
    /// opening gives the job `EMFILE`. Default:
    /// [`DEFAULT_MAX_OPEN_FILES`](super::files::DEFAULT_MAX_OPEN_FILES).
    pub max_open_files: u32,
    /// Bytes a job may write to files (its scratch directory and granted
    /// directories); past it, writing gives the job `ENOSPC`. Default: none
    /// (as `wasmtime run`; `peerwasm worker` sets 1 GiB, `--scratch`).
    pub max_scratch_bytes: Option<u64>,
    /// Bytes all running jobs together may write to files (a worker's
    /// `--scratch-total`); past it, writing gives `ENOSPC` even within a
    /// job's own bound. Default: none.
    pub scratch_total_bytes: Option<u64>,
    /// Whether a job's file operations run on its own thread rather than
    /// hopping to Tokio's blocking pool for each one: right where the
    /// thread is the job's alone (`peerwasm run`, a slot process), where
    /// it made CPython's `import numpy` — thousands of small reads of the
    /// stdlib zip — 0.1 s faster. Default: false (a worker's jobs share
    /// its threads).
    pub file_io_on_job_thread: bool,
    /// Whether warm-start snapshots are also kept on disk, under
    /// `cache_dir` (`warm_disk`), for the next process. Right for a
    /// machine's own user (the Python client's embedded worker: the next
    /// `python script.py` starts warm); not for a worker, whose disk they
    /// would take on its tenants' behalf without being charged to them.
    /// Default: false.
    #[serde(default)]
    pub keep_snapshots_on_disk: bool,
    /// Whether a snapshot kept on disk is mapped from its file as it is,
    /// rather than copied into a sealed in-memory file first
    /// (`warm_disk`). Right for a slot process (`runner::slotproc`): its
    /// first item does not wait for the copy (~40 ms for CPython with
    /// scikit-learn), and its slots share the file's page cache instead of
    /// holding a private copy each. Only on a filesystem of this machine's
    /// own (on NFS another machine's process removing the file leaves the
    /// mapping stale). A file shortened under it — by this user's hand,
    /// never by a job or by peerwasm, which replaces kept files whole —
    /// would fault the child: its job ends with a host error saying so,
    /// and its worker starts another child. Not for a worker's own
    /// process. Default: false.
    #[serde(default)]
    pub map_kept_snapshots: bool,
    /// The most stdout, and the most stderr, a job's output is buffered to,
    /// whatever the job asks (a worker's `--max-output`); past it the job
    /// ends with *output limit*. Default: none (the job's own limits).
    pub max_output_bytes: Option<u64>,
}

/// How to start a compile child (`sandbox::compiler`): this executable and
/// the arguments that make it one (`peerwasm compile-child`).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct CompileProgram {
    /// The executable.
    pub exe: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            slots: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            pooling: true,
            time_limit: TimeLimitMechanism::default(),
            max_module_bytes: DEFAULT_MAX_MODULE_BYTES,
            max_job_memory: 4 << 30,
            cache_entries: 64,
            module_bytes_held: DEFAULT_MODULE_BYTES_HELD,
            cache_dir: None,
            cache_max_bytes: DEFAULT_CACHE_MAX,
            max_compile_time: None,
            compile_program: None,
            scratch_root: None,
            claim_jobs_dir: false,
            max_job_time: None,
            max_open_files: super::files::DEFAULT_MAX_OPEN_FILES,
            max_scratch_bytes: None,
            scratch_total_bytes: None,
            max_output_bytes: None,
            file_io_on_job_thread: false,
            keep_snapshots_on_disk: false,
            map_kept_snapshots: false,
        }
    }
}
