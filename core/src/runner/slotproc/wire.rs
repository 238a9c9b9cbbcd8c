//! What a worker and its slot processes say to each other: postcard frames
//! ([`crate::proto::frame`]) over the child's stdin and stdout.
//!
//! The conversation for one job: `Run` → (`NeedModule` → `Module`)? →
//! `Started` → any of `Memory`, `Output`, `StdinTaken` from the child and
//! `Stdin…`, `Starved`, `Cancel` from the parent → `Done`. Stdin is sent
//! on credit (at most [`STDIN_CREDIT`] chunks not yet taken by the job),
//! so a fast producer waits for a slow job and a `Cancel` is never stuck
//! behind input the child has no room for.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::proto::{CancelCause, JobResult, StdStream};
use crate::sandbox::RunSpec;
use crate::sandbox::{SandboxConfig, TimeLimitMechanism};

/// Stdin chunks the parent sends ahead of the job's reading.
pub const STDIN_CREDIT: usize = crate::sandbox::stdin::STDIN_CHANNEL_DEPTH;

/// How long past a job's deadline, or an interrupt, the slot (the child,
/// `crate::slot`) waits for the sandbox to end the job before ending the
/// process instead; the parent's backstop counts it in. A job asleep in a
/// host call ends well within it; a computing one does not.
pub const OVERRUN_GRACE: std::time::Duration = std::time::Duration::from_millis(25);

/// Parent to child.
#[derive(Debug, Serialize, Deserialize)]
pub enum ToSlot {
    /// First, once: how the child's sandbox is set up.
    Setup(SandboxConfig),
    /// Run this job; its files may take `scratch_bytes` on disk (what the
    /// parent took from the worker's total for it; `None`: no total). With
    /// `streamed_stdin`, its stdin comes in `Stdin` frames; without, it is
    /// `spec.stdin`.
    Run {
        spec: RunSpec,
        scratch_bytes: Option<u64>,
        streamed_stdin: bool,
    },
    /// The module's bytes, answering `NeedModule` (`None`: the worker has
    /// none, only a compiled form the child cannot use).
    Module(#[serde(with = "serde_bytes")] Option<Vec<u8>>),
    /// A chunk of the job's stdin.
    Stdin(#[serde(with = "serde_bytes")] Vec<u8>),
    /// Reading stdin failed: the job's next read fails with this.
    StdinFailed(String),
    /// The end of the job's stdin.
    StdinEnd,
    /// The worker had no memory left for more of this stream: the job's
    /// next write to it fails (`output memory exhausted`).
    Starved(StdStream),
    /// End the job.
    Cancel(CancelCause),
}

/// Child to parent.
#[derive(Debug, Serialize, Deserialize)]
// The job's result is large, but there is one per job, moved straight onto
// the wire: a box would only add an allocation.
#[allow(clippy::large_enum_variant)]
pub enum FromSlot {
    /// The child has neither the module's compiled form nor its bytes.
    NeedModule,
    /// The job started: its deadline runs from now.
    Started,
    /// The job's linear memory now, in bytes (sent when it changes).
    Memory(u64),
    /// Output the job wrote.
    Output(StdStream, #[serde(with = "serde_bytes")] Vec<u8>),
    /// The job took a stdin chunk: one more may be sent.
    StdinTaken,
    /// How the job ended; with `overran`, the child is ending too (the job
    /// was still computing). `warm_held`: what the child holds for the
    /// jobs to come now (`WarmStats::held_bytes`: its kept snapshots and
    /// resident instances), which its worker charges.
    Done {
        result: JobResult,
        overran: bool,
        warm_held: u64,
    },
}

/// The sandbox a slot process runs its worker's jobs in: the worker's
/// own settings, with one slot, no time-limit instrumentation and file
/// operations on the job's thread (the process is the slot), its scratch
/// directories under `scratch_root` (the child's own directory, which the
/// worker removes whatever way the child ends), and no scratch total of
/// its own (the worker takes each job's share from its total and sends it
/// with the job). Instances on demand, not pooled: a slot runs one job at
/// a time, and warm starts need an on-demand engine (so a pooling one
/// loaded CPython twice). Kept snapshots mapped from their files
/// (`SandboxConfig::map_kept_snapshots`).
pub fn child_sandbox(worker: &SandboxConfig, scratch_root: Option<PathBuf>) -> SandboxConfig {
    SandboxConfig {
        slots: 1,
        pooling: false,
        time_limit: TimeLimitMechanism::Off,
        file_io_on_job_thread: true,
        module_bytes_held: worker.max_module_bytes,
        scratch_root,
        // Its scratch is claimed as a whole already (`slotproc`).
        claim_jobs_dir: false,
        scratch_total_bytes: Some(u64::MAX),
        map_kept_snapshots: true,
        ..worker.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::child_sandbox;
    use crate::sandbox::{SandboxConfig, TimeLimitMechanism, code_key};

    #[test]
    fn slot_processes_compile_for_the_engine_a_whole_process_run_uses() {
        // `peerwasm run` (one job, its process the slot: no instrumentation),
        // a worker's slot processes and the Python client's: one artifact
        // of CPython per machine, whoever compiled it first.
        let whole_process = SandboxConfig {
            time_limit: TimeLimitMechanism::Off,
            pooling: false,
            slots: 1,
            ..SandboxConfig::default()
        };
        for time_limit in [TimeLimitMechanism::Fuel, TimeLimitMechanism::Epoch] {
            let worker = SandboxConfig {
                time_limit,
                slots: 4,
                ..SandboxConfig::default()
            };
            let child = child_sandbox(&worker, None);
            assert_eq!(code_key(&child), code_key(&whole_process), "{time_limit:?}");
        }
    }
}
