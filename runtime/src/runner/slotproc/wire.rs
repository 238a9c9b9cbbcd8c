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
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::proto::{CancelCause, JobResult, JobSpec, StdStream};
use crate::sandbox::{SandboxConfig, TimeLimitMechanism};

/// Stdin chunks the parent sends ahead of the job's reading.
pub const STDIN_CREDIT: usize = crate::sandbox::stdin::STDIN_CHANNEL_DEPTH;

/// Parent to child.
#[derive(Debug, Serialize, Deserialize)]
pub enum ToSlot {
    /// First, once: how the child's sandbox is set up.
    Setup(SlotSetup),
    /// Run this job; its files may take `scratch_bytes` on disk (what the
    /// parent took from the worker's total for it; `None`: no total). With
    /// `streamed_stdin`, its stdin comes in `Stdin` frames; without, it is
    /// `spec.stdin`.
    Run { spec: JobSpec, scratch_bytes: Option<u64>, streamed_stdin: bool },
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
    /// was still computing).
    Done { result: JobResult, overran: bool },
}

/// The sandbox settings a slot process takes from its worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SlotSetup {
    pub max_module_bytes: u64,
    pub max_job_memory: u64,
    pub cache_entries: usize,
    pub cache_dir: Option<PathBuf>,
    pub cache_max_bytes: u64,
    pub max_compile_time: Option<Duration>,
    /// The child's own directory, under the worker's scratch root: the
    /// worker removes it whatever way the child ends.
    pub scratch_root: Option<PathBuf>,
    pub max_job_time: Option<Duration>,
    pub max_open_files: u32,
    pub max_scratch_bytes: Option<u64>,
    pub max_output_bytes: Option<u64>,
}

impl SlotSetup {
    /// The worker's settings, for a child whose scratch directories go
    /// under `scratch_root`.
    pub fn from_worker(c: &SandboxConfig, scratch_root: Option<PathBuf>) -> SlotSetup {
        SlotSetup {
            max_module_bytes: c.max_module_bytes,
            max_job_memory: c.max_job_memory,
            cache_entries: c.cache_entries,
            cache_dir: c.cache_dir.clone(),
            cache_max_bytes: c.cache_max_bytes,
            max_compile_time: c.max_compile_time,
            scratch_root,
            max_job_time: c.max_job_time,
            max_open_files: c.max_open_files,
            max_scratch_bytes: c.max_scratch_bytes,
            max_output_bytes: c.max_output_bytes,
        }
    }

    /// The child's sandbox: one slot, no time-limit instrumentation (the
    /// process is the slot), and a scratch total set per job.
    pub fn sandbox_config(&self) -> SandboxConfig {
        SandboxConfig {
            slots: 1,
            pooling: true,
            time_limit: TimeLimitMechanism::Off,
            max_module_bytes: self.max_module_bytes,
            max_job_memory: self.max_job_memory,
            cache_entries: self.cache_entries,
            module_bytes_held: self.max_module_bytes,
            cache_dir: self.cache_dir.clone(),
            cache_max_bytes: self.cache_max_bytes,
            max_compile_time: self.max_compile_time,
            scratch_root: self.scratch_root.clone(),
            max_job_time: self.max_job_time,
            max_open_files: self.max_open_files,
            max_scratch_bytes: self.max_scratch_bytes,
            scratch_total_bytes: Some(u64::MAX),
            max_output_bytes: self.max_output_bytes,
        }
    }
}
