//! [`Job`]: a module and everything its runs share (arguments, environment,
//! limits), hashed once; each run adds its stdin and memory request.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;

use super::estimate::DeclaredMemory;
use crate::proto::{DirGrant, JobLimits, JobSpec, ModuleHash};

/// A job module ready to submit any number of times.
///
/// ```no_run
/// # async fn demo() -> anyhow::Result<()> {
/// use peerwasm::client::{Job, Target};
/// let job = Job::from_file("primes.wasm")?;
/// let target = Target::embedded(2)?;
/// let result = target.run(&job, job.spec(br#"{"n": 100}"#.to_vec(), 64 << 20)).await?;
/// assert_eq!(result.stdout, br#"{"count":25}"#);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Job {
    bytes: Arc<[u8]>,
    hash: ModuleHash,
    declared: DeclaredMemory,
    /// `argv[0]` as the guest sees it.
    pub program_name: String,
    /// Arguments after `argv[0]`, the same for every run.
    pub args: Vec<String>,
    /// The guest's whole environment.
    pub env: Vec<(String, String)>,
    /// Limits; `memory_bytes` is replaced by each run's request.
    pub limits: JobLimits,
    /// Host directories granted to every run (`--dir`): mounted as they
    /// are on the embedded worker, shipped by content hash to a pool.
    pub dirs: Vec<DirGrant>,
}

impl Job {
    /// A job of these module bytes, named `job.wasm`, with default limits.
    pub fn new(bytes: impl Into<Arc<[u8]>>) -> Job {
        let bytes = bytes.into();
        Job {
            hash: ModuleHash::of(&bytes),
            declared: DeclaredMemory::of(&bytes),
            bytes,
            program_name: "job.wasm".into(),
            args: Vec::new(),
            env: Vec::new(),
            limits: JobLimits::default(),
            dirs: Vec::new(),
        }
    }

    /// Reads the module at `path`; the guest's `argv[0]` is the path.
    pub fn from_file(path: impl AsRef<Path>) -> anyhow::Result<Job> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        let mut job = Job::new(bytes);
        job.program_name = path.display().to_string();
        Ok(job)
    }

    /// The module's bytes.
    pub fn bytes(&self) -> &Arc<[u8]> {
        &self.bytes
    }

    /// The module's sha256.
    pub fn hash(&self) -> ModuleHash {
        self.hash
    }

    /// What the module declares about its memory.
    pub fn declared_memory(&self) -> DeclaredMemory {
        self.declared
    }

    /// The spec of one run: this job with `stdin` and a limit of `memreq`.
    pub fn spec(&self, stdin: Vec<u8>, memreq: u64) -> JobSpec {
        JobSpec {
            module: self.hash,
            program_name: self.program_name.clone(),
            args: self.args.clone(),
            env: self.env.clone(),
            stdin,
            dirs: self.dirs.clone(),
            trees: Vec::new(),
            limits: JobLimits { memory_bytes: memreq, ..self.limits.clone() },
            tag: None,
        }
    }
}
