//! How a job ended ([`Outcome`]), who cancelled it ([`CancelCause`]) and
//! which of its output streams a limit was about ([`StdStream`]):
//! every way a job can end is one value, with its exit code for `peerwasm
//! run`, its name in JSON and metrics, and one line for people.

use std::fmt;

use serde::{Deserialize, Serialize};

/// How a job ended. Every way a job can end is one of these values; none is a
/// panic of the host.
///
/// Externally tagged (`{"exited": {"code": 0}}` in JSON): postcard cannot
/// decode serde's internally tagged enums.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// `_start` returned (code 0) or the guest called `proc_exit(code)`.
    Exited { code: i32 },
    /// The job asked for more linear memory than its limit.
    MemoryLimitExceeded {
        /// The limit, in bytes.
        limit: u64,
        /// The largest total the job held, in bytes.
        peak: u64,
        /// The total it asked for when it was refused, in bytes.
        requested: u64,
    },
    /// The job ran past its wall-time limit.
    TimeLimitExceeded {
        /// The limit it ran under, in milliseconds.
        limit_ms: u64,
        /// Whether that was the worker's own limit (`--max-job-time`) rather
        /// than one the job asked for.
        worker_limit: bool,
    },
    /// The job wrote more than its cap to stdout or stderr.
    OutputLimitExceeded { stream: StdStream, limit: u64 },
    /// The guest trapped (or a host call failed fatally).
    Trapped {
        /// The trap code (`unreachable`, `stack overflow`...) or `host error`.
        trap: String,
        /// One line describing what happened.
        message: String,
        /// Innermost frame first, at most a few frames.
        backtrace: Vec<String>,
    },
    /// The bytes are not a runnable wasm32-wasip1 command module.
    InvalidModule { reason: String },
    /// The job was not run: too large, or not allowed.
    Rejected { reason: String },
    /// The job was ended (or taken out of its queue) before it finished.
    Cancelled { cause: CancelCause },
    /// The worker had no free memory to buffer more of the job's output
    /// (every byte held counts against the worker's memory), though the job
    /// was within its output cap. `held`: the bytes it kept.
    OutputMemoryExhausted { stream: StdStream, held: u64 },
    /// The files the job created or changed in its writable trees are more
    /// than the worker sends back (its `--max-files-back`); none came back.
    FilesBackTooLarge {
        /// What they came to, in bytes.
        size: u64,
        /// The cap, in bytes.
        limit: u64,
    },
    /// The job was lost: the process running it died under it (killed from
    /// outside, by the machine's out-of-memory killer, or a crash) and
    /// left no result. The job may not be at fault: a map runs it again,
    /// up to its `max_lost` times, and then ends it with this outcome.
    Lost {
        /// What happened, in words (`its slot process ended under it:
        /// signal: 9 (SIGKILL)`).
        reason: String,
    },
}

/// Who or what cancelled a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CancelCause {
    /// Its owner asked (`peerwasm cancel`, `DELETE /v1/jobs/{id}`).
    Owner,
    /// The client waiting for it went away (its connection closed).
    ClientGone,
    /// The worker shut down before the job ended (past its drain grace).
    /// The job did nothing wrong: a client runs it again elsewhere.
    Shutdown,
    /// The person running `peerwasm run` or `map` pressed Ctrl-C.
    Interrupted,
}

impl fmt::Display for CancelCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CancelCause::Owner => "by its owner",
            CancelCause::ClientGone => "because its client went away",
            CancelCause::Shutdown => "because the worker shut down",
            CancelCause::Interrupted => "by an interrupt (Ctrl-C)",
        })
    }
}

impl Outcome {
    /// The process exit code `peerwasm run` uses for this outcome: the job's
    /// own code, 124 for time (as `timeout(1)`), 137 for memory (as an OOM
    /// kill), 134 for a trap (as `wasmtime run`), 130 when cancelled (as for
    /// SIGINT), 2 for everything that is not the job's doing.
    pub fn exit_code(&self) -> i32 {
        match self {
            Outcome::Exited { code } => *code,
            Outcome::Cancelled { .. } => 130,
            Outcome::TimeLimitExceeded { .. } => 124,
            Outcome::MemoryLimitExceeded { .. } | Outcome::OutputMemoryExhausted { .. } => 137,
            Outcome::Trapped { .. }
            | Outcome::OutputLimitExceeded { .. }
            | Outcome::FilesBackTooLarge { .. } => 134,
            Outcome::InvalidModule { .. } | Outcome::Rejected { .. } | Outcome::Lost { .. } => 2,
        }
    }

    /// Whether the job ran to an exit of its own with code 0.
    pub fn is_success(&self) -> bool {
        matches!(self, Outcome::Exited { code: 0 })
    }

    /// The outcome's name as in JSON: `exited`, `memory_limit_exceeded`...
    pub fn kind(&self) -> &'static str {
        match self {
            Outcome::Exited { .. } => "exited",
            Outcome::MemoryLimitExceeded { .. } => "memory_limit_exceeded",
            Outcome::TimeLimitExceeded { .. } => "time_limit_exceeded",
            Outcome::OutputLimitExceeded { .. } => "output_limit_exceeded",
            Outcome::Trapped { .. } => "trapped",
            Outcome::InvalidModule { .. } => "invalid_module",
            Outcome::Rejected { .. } => "rejected",
            Outcome::Cancelled { .. } => "cancelled",
            Outcome::OutputMemoryExhausted { .. } => "output_memory_exhausted",
            Outcome::FilesBackTooLarge { .. } => "files_back_too_large",
            Outcome::Lost { .. } => "lost",
        }
    }
}

impl fmt::Display for Outcome {
    /// One line, for people: what `peerwasm run` prints on stderr.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use crate::units::Bytes;
        match self {
            Outcome::Exited { code } => write!(f, "job exited with code {code}"),
            Outcome::MemoryLimitExceeded {
                limit,
                peak,
                requested,
            } => write!(
                f,
                "job exceeded its memory limit of {} (peak {}, asked for {})",
                Bytes(*limit),
                Bytes(*peak),
                Bytes(*requested)
            ),
            Outcome::TimeLimitExceeded {
                limit_ms,
                worker_limit,
            } => {
                let limit = humantime::format_duration(std::time::Duration::from_millis(*limit_ms));
                if *worker_limit {
                    write!(
                        f,
                        "job exceeded the worker's time limit of {limit} (its --max-job-time)"
                    )
                } else {
                    write!(f, "job exceeded its time limit of {limit}")
                }
            }
            Outcome::OutputLimitExceeded { stream, limit } => {
                write!(
                    f,
                    "job wrote more than its {stream} limit of {}",
                    Bytes(*limit)
                )
            }
            Outcome::Trapped {
                trap,
                message,
                backtrace,
            } => {
                write!(f, "job trapped: {trap}")?;
                if !message.is_empty() && message != trap {
                    write!(f, " ({message})")?;
                }
                if let Some(top) = backtrace.first() {
                    write!(f, " in {top}")?;
                }
                Ok(())
            }
            Outcome::InvalidModule { reason } => write!(f, "invalid module: {reason}"),
            Outcome::Rejected { reason } => write!(f, "job rejected: {reason}"),
            Outcome::Cancelled { cause } => write!(f, "job cancelled {cause}"),
            Outcome::OutputMemoryExhausted { stream, held } => write!(
                f,
                "the worker had no free memory to hold more of the job's {stream} (it held {}): \
                 write less to {stream}, or run it where more memory is free",
                Bytes(*held)
            ),
            Outcome::FilesBackTooLarge { size, limit } => write!(
                f,
                "the files the job wrote come to {}, more than the {} a worker sends back (its --max-files-back): \
                 none were returned; write less, or raise the worker's --max-files-back",
                Bytes(*size),
                Bytes(*limit)
            ),
            Outcome::Lost { reason } => write!(f, "job lost: {reason}"),
        }
    }
}

/// Which output stream a message is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StdStream {
    Stdout,
    Stderr,
}

impl fmt::Display for StdStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StdStream::Stdout => "stdout",
            StdStream::Stderr => "stderr",
        })
    }
}
