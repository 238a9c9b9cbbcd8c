//! Slot processes: jobs whose code runs with no time-limit instrumentation,
//! each in a child process of the worker that is killed with it.
//!
//! Why: a worker's slots share its process with other tenants' jobs and
//! its HTTP service, so in-process compute must carry fuel to be stoppable
//! (+42% on a tight loop, docs/time-limits.md). A child process can run the
//! job's code unchecked, as `wasmtime run` does, and still be stopped: it
//! ends itself once its job computes past its deadline or a cancel
//! ([`crate::slot`]), and the worker kills it (SIGKILL) if it does not
//! answer within [`BACKSTOP_GRACE`] more. It also keeps a crash of the
//! engine away from the worker.
//!
//! What the job reports while it runs crosses the child's stdout
//! ([`wire`]): its output (kept here, in captures charged to the worker's
//! ledger as in-process output is; the child keeps none), its memory (the
//! ledger's meter), its start. Its stdin, a cancel and "no memory left for
//! output" go the other way. Disk scratch is taken from the worker's total
//! up front, up to the per-job bound, and given back when the job ends.
//!
//! Children are reused: one waits idle per slot, with its engine and the
//! modules it compiled (artifacts are shared on disk with the worker's
//! cache). Which jobs go to a child is the runner's choice
//! ([`SlotPolicy`]): a hand-off costs ~100 µs, so only jobs of modules
//! learned to compute long ([`LONG_JOB_CPU`]) go by default.

mod child;
pub mod wire;

use parking_lot::Mutex;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::source::ModuleSource;
use crate::proto::frame::encode_frame;
use crate::proto::{CacheSource, JobResult, ModuleHash, Outcome};
use crate::sandbox::RunSpec;
use crate::sandbox::{OutputCapture, RunHooks, Sandbox, SandboxConfig, files::ScratchPool};
pub use child::BACKSTOP_GRACE;
use child::{Ended, SlotChild, Talk};
use wire::ToSlot;

/// A module whose last job took at least this much CPU runs its next jobs
/// in a slot process under [`SlotPolicy::Auto`]: the hand-off is then well
/// under 5% of the job, and fuel would have cost up to 40%.
pub const LONG_JOB_CPU: Duration = Duration::from_millis(20);

/// A module at least this large runs every job in a slot process under
/// [`SlotPolicy::Auto`], its first included: it is compiled once, for the
/// slot processes' engine (CPython's 95 MiB takes ~45 s to compile, and
/// ~60 s with fuel, whose code is 37–45% slower on numpy), and a hand-off
/// is nothing beside its start-up.
pub const LARGE_MODULE_BYTES: usize = 16 << 20;

/// The program a slot process runs: this binary, with the arguments that
/// make it `peerwasm slot`.
#[derive(Clone, Debug)]
pub struct SlotProgram {
    /// The executable.
    pub exe: PathBuf,
    /// Its arguments (for `peerwasm`: `["slot"]`).
    pub args: Vec<std::ffi::OsString>,
}

/// What a slot process's scratch directory is named from.
const SCRATCH_PREFIX: &str = "peerwasm-slot-";

/// Which jobs run in slot processes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SlotPolicy {
    /// None: every job runs in the worker's process, with fuel.
    Never,
    /// Jobs of modules whose last job computed at least [`LONG_JOB_CPU`],
    /// and of modules of [`LARGE_MODULE_BYTES`] or more; the rest
    /// in-process. The default.
    #[default]
    Auto,
    /// Every job.
    Always,
}

impl std::str::FromStr for SlotPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "never" | "off" => Ok(SlotPolicy::Never),
            "auto" => Ok(SlotPolicy::Auto),
            "always" => Ok(SlotPolicy::Always),
            _ => Err(format!("expected auto, always or never, not {s:?}")),
        }
    }
}

/// How a runner uses slot processes.
#[derive(Clone, Debug)]
pub struct SlotProcessConfig {
    /// What a child runs.
    pub program: SlotProgram,
    /// Which jobs go to a child. Default: [`SlotPolicy::Auto`].
    pub policy: SlotPolicy,
}

/// A worker's slot processes: idle children, and how to make more.
pub struct SlotProcesses {
    program: SlotProgram,
    /// The worker's sandbox settings, for the children's.
    setup: SandboxConfig,
    /// Where each child gets a scratch directory of its own.
    scratch_root: PathBuf,
    /// The worker's disk total, of which each job is given a share.
    scratch: Option<Arc<ScratchPool>>,
    idle: Mutex<Vec<SlotChild>>,
    max_idle: usize,
    /// The disk cache as the children's engine sees it, once asked.
    artifacts: std::sync::OnceLock<Option<crate::sandbox::ArtifactStore>>,
    /// Jobs run in a child so far.
    jobs: AtomicU64,
    /// Each child's figure of what it holds for the jobs to come; a child
    /// gone drops its own.
    warm: Mutex<Vec<std::sync::Weak<AtomicU64>>>,
}

impl SlotProcesses {
    /// Slot processes for a runner over `sandbox`, keeping up to `slots`
    /// idle children.
    pub fn new(program: SlotProgram, sandbox: &Sandbox) -> SlotProcesses {
        let config = sandbox.config();
        let scratch_root = config
            .scratch_root
            .clone()
            .unwrap_or_else(std::env::temp_dir);
        // The scratch of slot processes whose worker was killed.
        crate::leftovers::sweep(
            &scratch_root,
            SCRATCH_PREFIX,
            crate::leftovers::CLAIM_FILE,
            crate::leftovers::GRACE,
        );
        SlotProcesses {
            program,
            setup: wire::child_sandbox(config, None),
            scratch_root,
            scratch: sandbox.scratch_pool(),
            idle: Mutex::new(Vec::new()),
            max_idle: config.slots.max(1),
            artifacts: std::sync::OnceLock::new(),
            jobs: AtomicU64::new(0),
            warm: Mutex::new(Vec::new()),
        }
    }

    /// Compiles `bytes` (whose sha256 is `hash`) for the slot processes'
    /// engine, here, into the disk cache they share with this process, so
    /// that their first job of it loads instead of compiling. Blocks: call
    /// it from a blocking thread. With no time limit on the compile: the
    /// operator asked for it.
    pub fn precompile(&self, hash: &ModuleHash, bytes: &[u8]) -> Result<CacheSource, String> {
        let config = SandboxConfig {
            max_compile_time: None,
            ..self.setup.clone()
        };
        let sandbox = Sandbox::new(config).map_err(|e| format!("{e:#}"))?;
        sandbox
            .load(hash, bytes)
            .map(|(_, source)| source)
            .map_err(|outcome| outcome.to_string())
    }

    /// Whether the disk cache holds `hash` compiled for the slot
    /// processes' engine (which is not this process's when it runs jobs
    /// with fuel or epochs).
    pub fn has_compiled(&self, hash: &ModuleHash) -> bool {
        // Opened once (it builds an engine): a worker asks per job.
        self.artifacts
            .get_or_init(|| crate::sandbox::ArtifactStore::for_config(&self.setup))
            .as_ref()
            .is_some_and(|store| store.has(hash))
    }

    /// Jobs run in slot processes so far.
    pub fn jobs(&self) -> u64 {
        self.jobs.load(Ordering::Relaxed)
    }

    /// Ends the idle children, and with them what they keep warm; busy
    /// ones keep theirs until their job ends.
    pub fn drop_idle(&self) {
        self.idle.lock().clear();
    }

    /// What the living children hold for the jobs to come (kept snapshots,
    /// resident instances: `WarmStats::held_bytes`), in bytes, as each said
    /// after its last job.
    pub fn warm_held(&self) -> u64 {
        let mut held = 0;
        self.warm.lock().retain(|w| {
            w.upgrade()
                .map(|child| held += child.load(Ordering::Relaxed))
                .is_some()
        });
        held
    }

    /// Runs `spec` in a slot process (an idle one, or a new one), with the
    /// module's `bytes` if the child has not got it compiled. `deadline` is
    /// the job's wall-time limit in the worker's sandbox. Every way it can
    /// end, the child's too, is a result.
    pub async fn run(
        &self,
        sandbox: &Sandbox,
        spec: RunSpec,
        bytes: Option<ModuleSource>,
        hooks: RunHooks,
    ) -> JobResult {
        self.jobs.fetch_add(1, Ordering::Relaxed);
        let limit = spec.limits.memory.bytes();
        // The child cannot ask the worker's ledger as it grows: a job under
        // a reserve is lent the rest of its limit now if the worker has it,
        // else runs bounded by its reserve.
        let mut spec = spec;
        if let (Some(reserve), Some(lender)) = (spec.memory_reserve, &hooks.memory_lender)
            && lender.lend(limit.saturating_sub(reserve))
        {
            spec.memory_reserve = None;
        }
        let (deadline, worker_limit) = sandbox.deadline(spec.limits.timeout_ms);
        let (mut child, mut reused) = match self.idle_or_new().await {
            Ok(got) => got,
            Err(e) => {
                return JobResult::host_failure(
                    limit,
                    &format!("cannot start a slot process: {e:#}"),
                );
            }
        };
        let scratch = self.scratch.as_ref().map(|pool| {
            let took = pool.take_up_to(self.setup.max_scratch_bytes.unwrap_or(u64::MAX));
            ScratchShare {
                pool: pool.clone(),
                bytes: took,
            }
        });
        let [stdout, stderr] = captures(sandbox, &spec, &hooks);
        let run = ToSlot::Run {
            spec,
            scratch_bytes: scratch.as_ref().map(|s| s.bytes),
            streamed_stdin: hooks.stdin.is_some(),
        };
        // Encoded once: sent again as it is if a reused child dies first.
        let run = match encode_frame(&run) {
            Ok(frame) => frame,
            Err(e) => {
                return JobResult::host_failure(
                    limit,
                    &format!("cannot encode the job for its slot process: {e}"),
                );
            }
        };
        let mut stdin = hooks.stdin.as_ref().and_then(|feed| feed.take());
        let (mut result, reusable) = loop {
            let job = Talk {
                child: &mut child,
                stdout: &stdout,
                stderr: &stderr,
                hooks: &hooks,
                deadline,
                worker_limit,
                limit,
                bytes: bytes.clone(),
            };
            match job.run(&run, stdin).await {
                // An idle child that died before the job started in it
                // (between our check and the job, or killed then): the
                // job has not begun and nothing of its stdin was sent, so
                // a fresh child runs it.
                (_, Ended::Unstarted(back)) if reused => {
                    tracing::debug!(
                        "an idle slot process ended before its job started; starting another"
                    );
                    stdin = back;
                    reused = false;
                    child = match self.spawn().await {
                        Ok(c) => c,
                        Err(e) => {
                            break (
                                JobResult::host_failure(
                                    limit,
                                    &format!("cannot start a slot process: {e:#}"),
                                ),
                                false,
                            );
                        }
                    };
                }
                (result, ended) => break (result, matches!(ended, Ended::Reusable)),
            }
        };
        drop(scratch);
        with_output(&mut result, [&stdout, &stderr]);
        if reusable {
            let mut idle = self.idle.lock();
            if idle.len() < self.max_idle {
                idle.push(child);
            }
        }
        result
    }

    /// An idle child (and `true`: reused), else a new one. An idle child
    /// that ended meanwhile (killed from outside, say) is dropped, not
    /// handed the job; one that ends before the job starts in it is
    /// replaced by a fresh one (in [`run`](Self::run)).
    async fn idle_or_new(&self) -> anyhow::Result<(SlotChild, bool)> {
        let idle = loop {
            let Some(mut c) = self.idle.lock().pop() else {
                break None;
            };
            if c.is_running() {
                break Some(c);
            }
        };
        match idle {
            Some(c) => Ok((c, true)),
            None => Ok((self.spawn().await?, false)),
        }
    }

    /// Starts a child and sends it its setup.
    async fn spawn(&self) -> anyhow::Result<SlotChild> {
        let scratch = tempfile::Builder::new()
            .prefix(SCRATCH_PREFIX)
            .tempdir_in(&self.scratch_root)?;
        // Held by this process, not the child (the descriptor is not
        // inherited): the child dies with it.
        let claim = crate::leftovers::claim(scratch.path())?;
        // Started without `pre_exec` (`crate::child`): the child ties
        // itself to this process and leaves Ctrl-C to it.
        let mut command = tokio::process::Command::from(crate::child::command(
            &self.program.exe,
            &self.program.args,
        ));
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        let mut process = command
            .spawn()
            .map_err(|e| anyhow::anyhow!("{}: {e}", self.program.exe.display()))?;
        let (Some(to), Some(from)) = (process.stdin.take(), process.stdout.take()) else {
            anyhow::bail!("the slot process has no pipes");
        };
        let mut child = SlotChild::new(process, to, from, (scratch, claim));
        self.warm.lock().push(Arc::downgrade(&child.warm_held));
        let setup = SandboxConfig {
            scratch_root: Some(child.scratch().to_path_buf()),
            ..self.setup.clone()
        };
        child.send(&ToSlot::Setup(setup)).await?;
        Ok(child)
    }
}

/// Where the job's output is captured in the worker (the child sends it
/// here as it comes): within the sandbox's caps, forwarded only if the
/// hooks ask, published for readers while the job runs.
fn captures(sandbox: &Sandbox, spec: &RunSpec, hooks: &RunHooks) -> [OutputCapture; 2] {
    let [mut stdout, mut stderr] =
        sandbox.output_captures(spec, hooks.tee.clone(), hooks.output_budget.clone());
    if hooks.forward_only {
        (stdout, stderr) = (stdout.forward_only(), stderr.forward_only());
    }
    if let Some(live) = &hooks.captures {
        *live.lock() = Some([stdout.clone(), stderr.clone()]);
    }
    [stdout, stderr]
}

/// The job's output, as the worker captured it, into its result; a
/// capture that ran out of the worker's memory ends the job as such.
fn with_output(result: &mut JobResult, captures: [&OutputCapture; 2]) {
    result.stdout = captures[0].take();
    result.stderr = captures[1].take();
    for capture in captures {
        if capture.starved() {
            result.outcome = Outcome::OutputMemoryExhausted {
                stream: capture.stream(),
                held: capture.len(),
            };
        }
    }
}

/// Disk scratch taken from the worker's total for one job.
struct ScratchShare {
    pool: Arc<ScratchPool>,
    bytes: u64,
}

impl Drop for ScratchShare {
    fn drop(&mut self) {
        self.pool.give_back(self.bytes);
    }
}
