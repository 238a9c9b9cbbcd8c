//! [`Refused`]: why a worker did not run a job — the one error its job
//! path, detached jobs and submissions give, and which `server/` turns into a
//! status (`server/response.rs`).

use crate::proto::ModuleHash;

/// Why a job was not run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The request is wrong: no worker would take it as it is.
    Invalid(String),
    /// Its input is over the limit.
    InputTooLarge(String),
    /// The worker does not have the module: upload it, then ask again.
    UnknownModule(ModuleHash),
    /// The worker lacks a tree of the job, or files of one: send the
    /// tree, then ask again.
    MissingFiles(String),
    /// It asks for more memory than this worker could ever give.
    TooLarge { message: String, largest: u64 },
    /// It asks for a longer time limit than this worker allows.
    TooLong(String),
    /// Not now: the tenant's queue is full or the worker is shutting down.
    Busy(String),
    /// The worker failed (a bug): not the request's fault.
    Internal(String),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Invalid(m)
            | Refused::InputTooLarge(m)
            | Refused::TooLong(m)
            | Refused::Busy(m)
            | Refused::MissingFiles(m)
            | Refused::Internal(m) => f.write_str(m),
            Refused::TooLarge { message, .. } => f.write_str(message),
            Refused::UnknownModule(hash) => write!(f, "module {hash} unknown: upload it first"),
        }
    }
}
