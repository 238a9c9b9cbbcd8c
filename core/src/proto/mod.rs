//! Wire types shared by the client, the embedded worker and remote
//! workers: what a job asks for ([`JobSpec`]) and how it ended ([`JobResult`],
//! [`Outcome`], `outcome.rs`), what a worker advertises (`advert.rs`), and the framing,
//! batch, stream, tree and submission messages of the HTTP API (one file
//! each).
//!
//! These are plain serde types. On the wire they travel as postcard; `peerwasm
//! run --json` and `map` print them as JSON, which is why durations and sizes
//! are flat integers with their unit in the field name rather than
//! `std::time::Duration` (serde would print `{"secs":..,"nanos":..}`).

mod advert;
pub mod backlog;
pub mod batch;
pub mod frame;
mod hash;
mod outcome;
pub mod routes;
pub mod stored;
pub mod stream;
pub mod submission;
pub mod tree;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use advert::{Advert, TenantAccount, TenantUsage};
pub use hash::ModuleHash;
pub use outcome::{CancelCause, Outcome, StdStream};

/// Everything a worker needs to run one job, apart from the module bytes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    /// The module to run, by content hash.
    pub module: ModuleHash,
    /// `argv[0]` as the guest sees it (the wasmtime CLI uses the file name).
    pub program_name: String,
    /// The job's arguments, verbatim, without `argv[0]`.
    pub args: Vec<String>,
    /// The job's whole environment; nothing of the host's leaks in.
    pub env: Vec<(String, String)>,
    /// The job's standard input. (Bytes, not a sequence: the same postcard
    /// encoding, copied whole instead of byte by byte.)
    #[serde(with = "serde_bytes")]
    pub stdin: Vec<u8>,
    /// Host directories granted to the job, on the embedded worker: never
    /// on the wire (a pool gets them as `trees`, by content hash), so a
    /// worker cannot be asked to open a path of its own host.
    #[serde(skip)]
    pub dirs: Vec<DirGrant>,
    /// Directory trees shipped to the worker by content hash, mounted for
    /// the job (see [`tree`]).
    pub trees: Vec<tree::TreeGrant>,
    /// What the job may use.
    pub limits: JobLimits,
    /// Which input and attempt of a map this is, for the worker's history.
    pub tag: Option<submission::JobTag>,
    /// The exported function to call instead of `_start` (`--invoke`, as
    /// `wasmtime run` has), for a *reactor* such as CPython's `python.wasm`:
    /// `_initialize` is called first if exported, then this function with
    /// no arguments (the job's `args` are its WASI argv as always); an
    /// `i32` it returns is the job's exit code. Default: none (`_start`).
    pub invoke: Option<String>,
    /// Start from a snapshot of an interpreter made ready once, rather than
    /// from a cold one (see [`WarmStart`]). Default: none.
    pub warm: Option<WarmStart>,
    /// What the worker reserves before the job starts, if less than its
    /// limit (a Kubernetes pod's request beside its limit): past it the job
    /// grows on memory the worker promised no one, or ends out of memory
    /// ([`JobResult::ran_out_of_lent_memory`]). Default: none, the whole
    /// limit. Last, so that a spec kept before it existed still decodes.
    pub memory_reserve: Option<MemoryRequest>,
}

/// A warm start: how a job of a reactor that keeps an interpreter between
/// calls — CPython for WASI, whose `turn(ptr, len)` export runs a piece of
/// source in a persistent `__main__` — starts from a copy-on-write snapshot
/// of memory rather than from a cold interpreter.
///
/// The worker runs `prelude` once as the first turn of a fresh instance
/// (imports, definitions: what every job of a map shares), keeps a
/// snapshot of the memory it left, and starts each job from that snapshot
/// with `turn` as its one turn. A job so started sees exactly the state the
/// prelude left, never another job's; its memory limit and peak count the
/// snapshot's memory as its own. When no snapshot can be made (the prelude
/// did not return 0), each job runs `prelude` and then `turn` in one fresh
/// instance: the same result, at a cold start's cost.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WarmStart {
    /// Source run once, whose resulting state jobs start from.
    pub prelude: String,
    /// Source each job runs; its exit status is the job's exit code.
    pub turn: String,
}

/// Where a job's directories that only its turn reads are mounted: at this
/// guest path or under it (the Python client's arguments moved as files,
/// `peerwasm/_arrays.py`). What they hold is not part of a warm snapshot's
/// scope (`RunSpec::warm_scope`): a prelude does not read them, and a map
/// over new data starts from the snapshot the last one made, not from a
/// cold interpreter.
pub const TURN_ONLY_DIR: &str = "/_pw_arrays";

impl JobSpec {
    /// Its size as encoded on the wire: what a worker holds while the job
    /// waits (args, env, stdin, tag and all), and what
    /// `--max-queued-bytes` counts.
    pub fn encoded_len(&self) -> u64 {
        postcard::serialize_with_flavor::<_, postcard::ser_flavors::Size, usize>(
            self,
            postcard::ser_flavors::Size::default(),
        )
        .map_or(u64::MAX, |n| n as u64)
    }

    /// A job of `module` with no arguments, no input and default limits.
    pub fn new(module: ModuleHash) -> JobSpec {
        JobSpec {
            module,
            program_name: "job.wasm".into(),
            args: Vec::new(),
            env: Vec::new(),
            stdin: Vec::new(),
            dirs: Vec::new(),
            trees: Vec::new(),
            limits: JobLimits::default(),
            tag: None,
            invoke: None,
            warm: None,
            memory_reserve: None,
        }
    }

    /// What the worker reserves before the job starts: `memory_reserve`,
    /// never more than the limit; the limit when no reserve is given.
    ///
    /// ```
    /// use peerwasm_core::proto::{JobSpec, MemoryRequest, ModuleHash};
    /// let mut spec = JobSpec::new(ModuleHash::of(b"\0asm"));
    /// spec.limits.memory = MemoryRequest::from(96u64 << 20);
    /// spec.memory_reserve = Some(MemoryRequest::from(64u64 << 20));
    /// assert_eq!(spec.reserved().bytes(), 64 << 20);
    /// spec.memory_reserve = Some(MemoryRequest::from(128u64 << 20));
    /// assert_eq!(spec.reserved().bytes(), 96 << 20, "never past the limit");
    /// ```
    pub fn reserved(&self) -> MemoryRequest {
        self.memory_reserve
            .map_or(self.limits.memory, |r| r.min(self.limits.memory))
    }
}

/// A host directory mapped into the guest, like `wasmtime run --dir HOST::GUEST`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DirGrant {
    /// The directory on the worker's host.
    pub host: PathBuf,
    /// Where the guest sees it (`/in`, `/`, `.`...).
    pub guest: String,
    /// Whether the guest may only read.
    pub read_only: bool,
}

/// The memory limit of a job that names none, in bytes: 1 GiB (`run`
/// without `--mem`, a library [`JobSpec`], `map`'s first estimate).
pub const DEFAULT_JOB_MEMORY: u64 = 1 << 30;

/// What a job asks for of linear memory (summed over all its memories),
/// in bytes: the one carrier of a job's memory request from the command
/// line (`--mem`, or what `map` learned) to the sandbox's limiter. The
/// worker reserves it in its ledger before the job starts, and the limiter
/// enforces it exactly; the job's result reports it back as
/// `memory_limit_bytes`. On the wire it is the bare number.
///
/// ```
/// use peerwasm_core::proto::MemoryRequest;
/// let asked = MemoryRequest::from(64u64 << 20);
/// assert_eq!(asked.bytes(), 64 << 20);
/// assert_eq!(asked.to_string(), "64 MiB");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct MemoryRequest(pub u64);

impl MemoryRequest {
    /// The bytes asked for.
    pub fn bytes(self) -> u64 {
        self.0
    }
}

/// [`DEFAULT_JOB_MEMORY`]: what a job asks when nobody said.
impl Default for MemoryRequest {
    fn default() -> MemoryRequest {
        MemoryRequest(DEFAULT_JOB_MEMORY)
    }
}

impl From<u64> for MemoryRequest {
    fn from(bytes: u64) -> MemoryRequest {
        MemoryRequest(bytes)
    }
}

impl std::fmt::Display for MemoryRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        crate::units::Bytes(self.0).fmt(f)
    }
}

/// Per-job limits. Every field is enforced by the sandbox.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobLimits {
    /// The job's memory request. Default: [`DEFAULT_JOB_MEMORY`].
    #[serde(rename = "memory_bytes")]
    pub memory: MemoryRequest,
    /// Wall-clock time; `None` means no limit. Default: none.
    pub timeout_ms: Option<u64>,
    /// Bytes of stdout kept; writing more ends the job. Default: 64 MiB.
    pub stdout_bytes: u64,
    /// Bytes of stderr kept; writing more ends the job. Default: 16 MiB.
    pub stderr_bytes: u64,
}

impl Default for JobLimits {
    fn default() -> Self {
        JobLimits {
            memory: MemoryRequest(DEFAULT_JOB_MEMORY),
            timeout_ms: None,
            stdout_bytes: 64 << 20,
            stderr_bytes: 16 << 20,
        }
    }
}

/// Where a job's compiled module came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheSource {
    /// Found compiled in memory.
    Memory,
    /// Loaded from a serialized artifact on disk.
    Disk,
    /// Compiled for this job.
    Compiled,
    /// The job never got as far as a compiled module.
    None,
}

/// What `GET /v1/jobs/{id}/output` answers: a detached job's output past
/// what the caller has seen, and its outcome once it has ended (`peerwasm
/// logs -f` asks again until then).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobOutput {
    /// Stdout from the offset asked for.
    #[serde(with = "serde_bytes")]
    pub stdout: Vec<u8>,
    /// Stderr from the offset asked for.
    #[serde(with = "serde_bytes")]
    pub stderr: Vec<u8>,
    /// How the job ended; `None` while it is queued or running.
    pub ended: Option<Outcome>,
    /// Which run of the job the output is of: a token the worker draws when
    /// it takes the job — again, under the same id, after it restarted, the
    /// output then starting over — or 0 for a result kept across a restart
    /// (the whole output of the run that ended). A follower that sees
    /// another token reads the output again from its start.
    pub run: u64,
}

/// What a worker sends back for one job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobResult {
    /// How the job ended.
    pub outcome: Outcome,
    /// Standard output, up to the cap.
    #[serde(with = "lossy_bytes")]
    pub stdout: Vec<u8>,
    /// Standard error, up to the cap.
    #[serde(with = "lossy_bytes")]
    pub stderr: Vec<u8>,
    /// The largest linear memory the job held, initial size included, in bytes.
    pub peak_memory_bytes: u64,
    /// The memory limit the job ran under, in bytes.
    pub memory_limit_bytes: u64,
    /// Wall time from the start of instantiation to the end, in microseconds.
    pub wall_time_us: u64,
    /// CPU time the job's thread spent in the job, in microseconds.
    pub cpu_time_us: u64,
    /// Where the compiled module came from.
    pub cache: CacheSource,
    /// Who ran it (`embedded` or a peer address).
    pub peer: String,
    /// Things the submitter should know (e.g. peak close to the limit).
    pub warnings: Vec<String>,
    /// Files the job created or changed in its writable trees, to be
    /// written into the host directories they came from.
    pub files: Vec<tree::FileBack>,
}

impl JobResult {
    /// The result of a job that a failure of the host, not the job, ended
    /// (a task that failed, a slot process that died), saying what failed.
    pub fn host_failure(memory_limit_bytes: u64, message: &str) -> JobResult {
        JobResult::never_ran(
            memory_limit_bytes,
            Outcome::Trapped {
                trap: "host error".into(),
                message: message.into(),
                backtrace: Vec::new(),
            },
        )
    }

    /// Whether the job ran out of memory below its limit: it ran under a
    /// reserve ([`JobSpec::memory_reserve`]), grew past it, and the worker
    /// had nothing left to lend. It may well fit its limit where memory is
    /// free (reserved whole, say): unlike reaching its limit, this says
    /// nothing of what it needs beyond `requested`.
    pub fn ran_out_of_lent_memory(&self) -> bool {
        matches!(self.outcome, Outcome::MemoryLimitExceeded { limit, .. }
            if limit < self.memory_limit_bytes)
    }

    /// The result of a job that ended as `outcome` without running (refused,
    /// cancelled in its queue, its module unknown), under a memory limit of
    /// `memory_limit_bytes`.
    pub fn never_ran(memory_limit_bytes: u64, outcome: Outcome) -> JobResult {
        JobResult {
            outcome,
            stdout: Vec::new(),
            stderr: Vec::new(),
            peak_memory_bytes: 0,
            memory_limit_bytes,
            wall_time_us: 0,
            cpu_time_us: 0,
            cache: CacheSource::None,
            peer: "embedded".into(),
            warnings: Vec::new(),
            files: Vec::new(),
        }
    }
}

/// Output bytes: raw in postcard, as a (lossy) UTF-8 string in JSON, which is
/// what a person or a script reading `--json` wants.
mod lossy_bytes {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            s.serialize_str(&String::from_utf8_lossy(bytes))
        } else {
            s.serialize_bytes(bytes)
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        if d.is_human_readable() {
            Ok(String::deserialize(d)?.into_bytes())
        } else {
            Ok(serde_bytes::ByteBuf::deserialize(d)?.into_vec())
        }
    }
}

/// Request header naming the protocol version the sender speaks. Workers
/// refuse other versions with 400; a request without it is taken as
/// [`PROTOCOL_VERSION`].
pub const PROTOCOL_HEADER: &str = "peerwasm-protocol";

/// The protocol version of this build: bumped when a message's encoding
/// changes incompatibly (postcard has no field tags to fall back on).
pub const PROTOCOL_VERSION: &str = "14";

/// The most a job's input (its stdin) may be, in bytes.
pub const MAX_INPUT_BYTES: u64 = 64 << 20;

/// The content type of postcard bodies.
pub const POSTCARD: &str = "application/x-postcard";

/// Response header of a refusal that names the largest job this worker
/// could ever take, in bytes.
pub const LARGEST_JOB_HEADER: &str = "peerwasm-largest-job";

/// Response header carrying a job's id (for `GET /v1/jobs/{id}`).
pub const JOB_ID_HEADER: &str = "peerwasm-job-id";

/// One of a tenant's jobs on a worker, as `GET /v1/jobs` lists them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobStatus {
    /// The job's id: 128 random bits in hex, unguessable.
    pub id: String,
    /// `queued`, `running` or `done` (result not yet taken; a cancelled
    /// job is `done` with a `cancelled` outcome).
    pub state: String,
    /// Its memory request, in bytes.
    pub memory_bytes: u64,
}

#[cfg(test)]
mod tests;
