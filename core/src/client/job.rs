//! [`Job`]: a module and everything its runs share (arguments, environment,
//! limits), hashed once; each run adds its stdin and memory request.

use std::path::Path;
use std::sync::Arc;

use super::estimate::DeclaredMemory;
use crate::proto::{DirGrant, JobLimits, JobSpec, MemoryRequest, ModuleHash, WarmStart};
use crate::runner::ModuleSource;
use crate::runner::source::read_module;

/// What `module-hashes/` keeps about a module file: enough to use it
/// without reading it while its stamp is unchanged.
#[derive(serde::Serialize, serde::Deserialize)]
struct KnownModule {
    stamp: super::tree::FileStamp,
    hash: ModuleHash,
    declared: DeclaredMemory,
}

/// Every limit of a job's runs but their memory (each run asks for its
/// own: [`Job::spec`]); the wire's [`JobLimits`] less `memory_bytes`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunLimits {
    /// Wall-time limit of each run, in ms; `None`: none. Default: none.
    pub timeout_ms: Option<u64>,
    /// Bytes of stdout kept; writing more ends the run. Default: 64 MiB.
    pub stdout_bytes: u64,
    /// Bytes of stderr kept; writing more ends the run. Default: 16 MiB.
    pub stderr_bytes: u64,
}

impl Default for RunLimits {
    fn default() -> Self {
        RunLimits::of(&JobLimits::default())
    }
}

impl RunLimits {
    /// Those of `limits`, without its memory.
    pub fn of(limits: &JobLimits) -> RunLimits {
        RunLimits {
            timeout_ms: limits.timeout_ms,
            stdout_bytes: limits.stdout_bytes,
            stderr_bytes: limits.stderr_bytes,
        }
    }

    /// The wire's limits of a run that asks for `memory`.
    pub fn with_memory(&self, memory: impl Into<MemoryRequest>) -> JobLimits {
        JobLimits {
            memory: memory.into(),
            timeout_ms: self.timeout_ms,
            stdout_bytes: self.stdout_bytes,
            stderr_bytes: self.stderr_bytes,
        }
    }
}

/// A job module ready to submit any number of times.
///
/// ```no_run
/// # async fn demo() -> anyhow::Result<()> {
/// use peerwasm_core::client::{Job, Target};
/// let job = Job::from_file("primes.wasm")?;
/// let target = Target::embedded(2)?;
/// let result = target.run(&job, job.spec(br#"{"n": 100}"#.to_vec(), 64 << 20)).await?;
/// assert_eq!(result.stdout, br#"{"count":25}"#);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Job {
    source: ModuleSource,
    hash: ModuleHash,
    declared: DeclaredMemory,
    /// `argv[0]` as the guest sees it.
    pub program_name: String,
    /// Arguments after `argv[0]`, the same for every run.
    pub args: Vec<String>,
    /// The guest's whole environment.
    pub env: Vec<(String, String)>,
    /// Every limit of a run but its memory, which each run asks for
    /// itself ([`spec`](Self::spec)).
    pub limits: RunLimits,
    /// Host directories granted to every run (`--dir`): mounted as they
    /// are on the embedded worker, shipped by content hash to a pool.
    pub dirs: Vec<DirGrant>,
    /// The export to call instead of `_start` (`--invoke`); see
    /// [`JobSpec::invoke`].
    pub invoke: Option<String>,
    /// Start each run from a snapshot of an interpreter made ready once;
    /// see [`WarmStart`].
    pub warm: Option<WarmStart>,
}

impl Job {
    /// A job of these module bytes, named `job.wasm`, with default limits.
    pub fn new(bytes: impl Into<Arc<[u8]>>) -> Job {
        let bytes = bytes.into();
        let hash = ModuleHash::of(&bytes);
        Job::hashed(bytes, hash)
    }

    /// [`new`](Self::new) for bytes whose sha256 is known to be `hash`.
    fn hashed(bytes: Arc<[u8]>, hash: ModuleHash) -> Job {
        Job {
            declared: DeclaredMemory::of(&bytes),
            ..Job::of(ModuleSource::in_hand(bytes), hash)
        }
    }

    fn of(source: ModuleSource, hash: ModuleHash) -> Job {
        Job {
            hash,
            declared: DeclaredMemory::default(),
            source,
            program_name: "job.wasm".into(),
            args: Vec::new(),
            env: Vec::new(),
            limits: RunLimits::default(),
            dirs: Vec::new(),
            invoke: None,
            warm: None,
        }
    }

    /// Reads the module at `path`; the guest's `argv[0]` is the path.
    pub fn from_file(path: impl AsRef<Path>) -> anyhow::Result<Job> {
        let path = path.as_ref();
        let (bytes, _) = read_module(path)?;
        Ok(Job::new(bytes).named_after(path))
    }

    /// [`from_file`](Self::from_file), with the module's sha256 kept under
    /// `cache` (in `module-hashes/`) by the file's path, size, modification
    /// time and inode, with its declared memory: an unchanged module is not
    /// read again until its bytes are needed (a compile or an upload).
    /// Without `cache`, the same as `from_file`.
    pub fn from_file_cached(path: impl AsRef<Path>, cache: Option<&Path>) -> anyhow::Result<Job> {
        let path = path.as_ref();
        let Some(cache) = cache else {
            return Job::from_file(path);
        };
        let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        let kept = cache
            .join("module-hashes")
            .join(ModuleHash::of(absolute.as_os_str().as_encoded_bytes()).to_hex());
        let known = std::fs::read(&kept)
            .ok()
            .and_then(|b| postcard::from_bytes::<KnownModule>(&b).ok());
        // Known by its stamp: the bytes are read only if they are needed.
        if let (Some(known), Ok(metadata)) = (&known, std::fs::metadata(path))
            && metadata.is_file()
            && super::tree::FileStamp::of(&metadata) == known.stamp
        {
            let source = ModuleSource::in_file(path.to_path_buf(), metadata.len());
            return Ok(Job {
                declared: known.declared,
                ..Job::of(source, known.hash)
            }
            .named_after(path));
        }
        let (bytes, metadata) = read_module(path)?;
        if !metadata.is_file() {
            // A pipe's stamp says nothing about what comes through it next.
            return Ok(Job::new(bytes).named_after(path));
        }
        let stamp = super::tree::FileStamp::of(&metadata);
        let hash = match known {
            Some(known) if known.stamp == stamp => known.hash,
            _ => ModuleHash::of(&bytes),
        };
        let job = Job::hashed(bytes, hash).named_after(path);
        let record = KnownModule {
            stamp,
            hash,
            declared: job.declared,
        };
        // A record that cannot be kept only costs reading and hashing next time.
        let _ = std::fs::create_dir_all(kept.parent().expect("has a parent")).and_then(|()| {
            let record = postcard::to_allocvec(&record).unwrap_or_default();
            crate::private_path::replace(&kept, &record, 0o600)
        });
        Ok(job)
    }

    /// The guest's `argv[0]` becomes the module's path, as the user gave it.
    fn named_after(mut self, path: &Path) -> Job {
        self.program_name = path.display().to_string();
        self
    }

    /// The module's bytes, read now if they were left in their file. A
    /// file that can no longer be read gives no bytes (whoever needs them
    /// then says the module does not match its hash).
    pub fn bytes(&self) -> &Arc<[u8]> {
        self.source.bytes()
    }

    /// Whether the bytes are in hand (or were read since).
    pub fn bytes_read(&self) -> bool {
        self.source.is_read()
    }

    /// The module's bytes as they are held: in hand, or left in their file
    /// until something needs them ([`JobRunner::add_module_source`](crate::runner::JobRunner::add_module_source)).
    pub fn source(&self) -> &ModuleSource {
        &self.source
    }

    /// The module's sha256.
    pub fn hash(&self) -> ModuleHash {
        self.hash
    }

    /// What the module declares about its memory.
    pub fn declared_memory(&self) -> DeclaredMemory {
        self.declared
    }

    /// The spec of one run: this job with `stdin`, asking for `memory`.
    pub fn spec(&self, stdin: Vec<u8>, memory: impl Into<MemoryRequest>) -> JobSpec {
        JobSpec {
            module: self.hash,
            program_name: self.program_name.clone(),
            args: self.args.clone(),
            env: self.env.clone(),
            stdin,
            dirs: self.dirs.clone(),
            trees: Vec::new(),
            limits: self.limits.with_memory(memory),
            tag: None,
            invoke: self.invoke.clone(),
            warm: self.warm.clone(),
            memory_reserve: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_hash_is_used_only_while_the_file_is_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        let path = dir.path().join("m.wasm");
        std::fs::write(&path, b"\0asm\x01\0\0\0").unwrap();
        let first = Job::from_file_cached(&path, Some(&cache)).unwrap();
        assert_eq!(first.hash(), ModuleHash::of(first.bytes()));
        assert_eq!(
            std::fs::read_dir(cache.join("module-hashes"))
                .unwrap()
                .count(),
            1,
            "the hash is kept"
        );
        // Kept: a planted wrong hash for the same stamp is believed (what makes it fast)...
        let kept = std::fs::read_dir(cache.join("module-hashes"))
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        let record: KnownModule = postcard::from_bytes(&std::fs::read(&kept).unwrap()).unwrap();
        let planted = KnownModule {
            hash: ModuleHash([7; 32]),
            ..record
        };
        std::fs::write(&kept, postcard::to_allocvec(&planted).unwrap()).unwrap();
        assert_eq!(
            Job::from_file_cached(&path, Some(&cache)).unwrap().hash(),
            ModuleHash([7; 32])
        );
        // A record in the earlier format (stamp, hash) is not misread: the file is hashed again.
        std::fs::write(
            &kept,
            postcard::to_allocvec(&(planted.stamp, planted.hash)).unwrap(),
        )
        .unwrap();
        assert_eq!(
            Job::from_file_cached(&path, Some(&cache)).unwrap().hash(),
            first.hash()
        );
        // ...and a changed file is hashed again.
        std::fs::write(&path, b"\0asm\x01\0\0\0\0").unwrap();
        let changed = Job::from_file_cached(&path, Some(&cache)).unwrap();
        assert_eq!(changed.hash(), ModuleHash::of(changed.bytes()));
        assert_ne!(changed.hash(), first.hash());
    }

    #[test]
    fn a_module_known_by_its_stamp_is_read_only_when_its_bytes_are_needed() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        let path = dir.path().join("m.wasm");
        let wasm = wat::parse_str("(module (memory 3 9) (func (export \"_start\")))").unwrap();
        std::fs::write(&path, &wasm).unwrap();
        let first = Job::from_file_cached(&path, Some(&cache)).unwrap();
        assert!(first.bytes_read(), "unknown: read and hashed");
        let again = Job::from_file_cached(&path, Some(&cache)).unwrap();
        assert!(!again.bytes_read(), "known by its stamp: not read");
        assert_eq!(again.hash(), first.hash());
        assert_eq!(
            again.declared_memory(),
            first.declared_memory(),
            "declared memory from the kept record"
        );
        assert_eq!(again.declared_memory().maximum_bytes, Some(9 * 65536));
        assert_eq!(&again.bytes()[..], &wasm[..], "read when asked for");
        assert!(again.bytes_read());
    }

    #[test]
    fn the_embedded_worker_reads_a_module_left_in_its_file_only_to_compile_it() {
        use super::super::Target;
        use crate::runner::{JobRunner, RunnerConfig};
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        let path = dir.path().join("m.wasm");
        let wasm = wat::parse_str("(module (memory 1) (func (export \"_start\")))").unwrap();
        std::fs::write(&path, &wasm).unwrap();
        Job::from_file_cached(&path, Some(&cache)).unwrap(); // keeps its hash
        let runtime = tokio::runtime::Runtime::new().unwrap();
        // An embedded worker as a process starts one: compiled code kept
        // on disk under `cache`.
        let embedded = || {
            let mut config = RunnerConfig::default();
            config.sandbox.slots = 1;
            config.sandbox.cache_dir = Some(cache.clone());
            Target::Embedded(Arc::new(JobRunner::new(config).unwrap()))
        };
        let run = |target: &Target, job: &Job| {
            let result = runtime
                .block_on(target.run(job, job.spec(Vec::new(), 16 << 20)))
                .unwrap();
            assert!(
                matches!(result.outcome, crate::proto::Outcome::Exited { code: 0 }),
                "{:?}",
                result.outcome
            );
        };
        // Nothing compiled yet: read for the compile.
        let compiles = Job::from_file_cached(&path, Some(&cache)).unwrap();
        assert!(!compiles.bytes_read());
        run(&embedded(), &compiles);
        assert!(compiles.bytes_read(), "read to compile it");
        // The next process finds it compiled: its jobs run without a read.
        let compiled = Job::from_file_cached(&path, Some(&cache)).unwrap();
        let next = embedded();
        run(&next, &compiled);
        run(&next, &compiled);
        assert!(!compiled.bytes_read(), "its compiled code was on disk");
    }
}
