//! Durable submissions on the wire: a whole map handed to a worker (its
//! *owner*) to run on the pool while its client is away, and what the
//! owner says about it later.
//!
//! * `POST /v1/submissions` — a postcard [`SubmissionSpec`]; answered `201`
//!   with the id (header [`SUBMISSION_ID_HEADER`] and body) once the
//!   submission is committed to the owner's state database;
//! * `GET /v1/submissions` — the caller's submissions (JSON list of
//!   [`SubmissionInfo`]); `GET /v1/submissions/{id}` — one;
//! * `GET /v1/submissions/{id}/results?from=N&wait_ms=T` — results from
//!   input `N` on, in input order (postcard [`ResultsPage`]), waiting up to
//!   `T` ms for the next one;
//! * `DELETE /v1/submissions/{id}` — cancels it (its jobs under way are
//!   cancelled on their workers), or discards a finished one;
//! * `GET /v1/history?since_ms=&tenant=` — the jobs this worker ran
//!   (JSON list of [`HistoryRecord`]).

use serde::{Deserialize, Serialize};

use super::{JobResult, JobSpec};

/// The prefix of every submission id, so that `peerwasm cancel ID` tells
/// a submission from a job.
pub const SUBMISSION_PREFIX: &str = "s-";

/// Response header carrying a new submission's id.
pub const SUBMISSION_ID_HEADER: &str = "peerwasm-submission-id";

/// The most a `POST /v1/submissions` body may be: the job and all inputs.
pub const MAX_SUBMISSION_BYTES: u64 = 256 << 20;

/// The most inputs one submission may have.
pub const MAX_SUBMISSION_INPUTS: u64 = 1_000_000;

/// Whether `id` names a submission (rather than a job).
pub fn is_submission_id(id: &str) -> bool {
    id.starts_with(SUBMISSION_PREFIX)
}

/// Whether `id` is a submission id as an owner issues them: the prefix and
/// 32 hex digits (so a job's tag, kept in every worker's history, is
/// never more than an id).
pub fn is_issued_submission_id(id: &str) -> bool {
    id.strip_prefix(SUBMISSION_PREFIX)
        .is_some_and(|h| h.len() == 32 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Identifies one attempt of one input of a map, so that the worker
/// running it can say so in its history.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobTag {
    /// The submission it belongs to; empty for an attached map.
    pub submission: String,
    /// The input's index, from 0.
    pub index: u64,
    /// Which submission of that input this is, from 1.
    pub attempt: u32,
}

/// Losses with the process running it an input may have before its map
/// gives it up (`MapConfig::max_lost`, [`SubmitConfig::max_lost`]).
pub const DEFAULT_MAX_LOST: u32 = 3;

/// The most a submission's [`SubmitConfig::retries`] and
/// [`SubmitConfig::max_lost`] may be: its owner runs the map in its own
/// process, for as long as its inputs keep failing.
pub const MOST_ATTEMPTS: u32 = 100;

/// The most a submission's [`SubmitConfig::max_in_flight`] may be: the
/// submissions its owner keeps under way at once, each held in its memory.
pub const MOST_IN_FLIGHT: u64 = 65_536;

/// How the owner runs a submission's map: the map's own settings that a
/// client would give on its command line. `Default` gives the map's
/// defaults.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SubmitConfig {
    /// One fixed memory request for every job; `None` learns it.
    pub mem: Option<super::MemoryRequest>,
    /// Never ask for less than this when learning.
    pub min_mem: u64,
    /// How often a failed job is run again (at most [`MOST_ATTEMPTS`]).
    pub retries: u32,
    /// Submissions under way at once (1 to [`MOST_IN_FLIGHT`]); `None`:
    /// the map's default.
    pub max_in_flight: Option<u64>,
    /// Go on after a job fails.
    pub keep_going: bool,
    /// Losses with the process running it before an input is given up
    /// (1 to [`MOST_ATTEMPTS`]; its last field: a config kept before protocol 14 had none, and
    /// reads as [`DEFAULT_MAX_LOST`], see [`from_stored`](Self::from_stored)).
    pub max_lost: u32,
}

impl Default for SubmitConfig {
    fn default() -> Self {
        SubmitConfig {
            mem: None,
            min_mem: 0,
            retries: 0,
            max_in_flight: None,
            keep_going: false,
            max_lost: DEFAULT_MAX_LOST,
        }
    }
}

impl SubmitConfig {
    /// Decodes a config kept in a state database by this build, or by one
    /// before `max_lost` (its last field) existed: that reads as the
    /// default, so submissions kept across an upgrade still resume.
    pub fn from_stored(bytes: &[u8]) -> Result<SubmitConfig, postcard::Error> {
        postcard::from_bytes(bytes).or_else(|e| {
            let mut older = bytes.to_vec();
            // One byte: postcard's varint of a u32 below 128.
            older.push(DEFAULT_MAX_LOST as u8);
            postcard::from_bytes(&older).map_err(|_| e)
        })
    }
}

/// A whole map, as handed to its owner.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SubmissionSpec {
    /// Every job's spec but its stdin (empty here) and memory request
    /// (the map's to choose). Its module must be on the owner.
    pub job: JobSpec,
    /// One job's stdin per input, in order.
    pub inputs: Vec<serde_bytes::ByteBuf>,
    /// How to run the map.
    pub config: SubmitConfig,
}

/// Where a submission is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SubmissionState {
    /// Its map runs (or will, once its owner is back).
    Running,
    /// Every input has its result (some may have failed with `keep_going`).
    Done,
    /// A job failed and the map stopped there (no `keep_going`).
    Stopped,
    /// Cancelled by its tenant: the results in so far are kept.
    Cancelled,
    /// The map could not go on (no worker can take its jobs): see `message`.
    Failed,
}

impl SubmissionState {
    /// The state's name as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            SubmissionState::Running => "running",
            SubmissionState::Done => "done",
            SubmissionState::Stopped => "stopped",
            SubmissionState::Cancelled => "cancelled",
            SubmissionState::Failed => "failed",
        }
    }

    /// Parses [`as_str`](Self::as_str)'s form.
    pub fn parse(s: &str) -> Option<SubmissionState> {
        [
            SubmissionState::Running,
            SubmissionState::Done,
            SubmissionState::Stopped,
            SubmissionState::Cancelled,
            SubmissionState::Failed,
        ]
        .into_iter()
        .find(|st| st.as_str() == s)
    }

    /// Whether no more results will come.
    pub fn is_final(self) -> bool {
        self != SubmissionState::Running
    }
}

/// One submission, as its owner reports it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SubmissionInfo {
    /// Its id: `s-` and 128 random bits in hex.
    pub id: String,
    /// The worker that owns it.
    pub owner: String,
    /// Its tenant.
    pub tenant: String,
    /// The module's sha256 (hex).
    pub module: String,
    /// How many inputs it has.
    pub total: u64,
    /// How many have their result (the first `done` inputs).
    pub done: u64,
    /// How many of those failed.
    pub failed: u64,
    /// Where it is.
    pub state: SubmissionState,
    /// Why it stopped or failed.
    pub message: Option<String>,
    /// When it was submitted, in ms since the Unix epoch.
    pub created_ms: u64,
    /// When it ended, in ms since the Unix epoch.
    pub ended_ms: Option<u64>,
}

/// One input's result, as stored by the owner.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SubmittedResult {
    /// The input's index, from 0.
    pub index: u64,
    /// How many times it was submitted.
    pub attempts: u32,
    /// Its (last) run's result.
    pub result: JobResult,
}

/// A page of results, in input order, and the submission as it is now.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ResultsPage {
    /// The submission.
    pub info: SubmissionInfo,
    /// Results from the index asked for on, consecutive.
    pub items: Vec<SubmittedResult>,
}

/// One job a worker ran, as its history keeps it (like a line of `sacct`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryRecord {
    /// When it ended, in ms since the Unix epoch.
    pub ended_ms: u64,
    /// Its tenant.
    pub tenant: String,
    /// The module's sha256 (hex).
    pub module: String,
    /// The submission it was part of, if any.
    pub submission: Option<String>,
    /// Its input's index in a map, if it was one.
    pub index: Option<u64>,
    /// Which attempt at that input it was, from 1.
    pub attempt: Option<u32>,
    /// How it ended (`exited`, `memory_limit_exceeded`, ...).
    pub outcome: String,
    /// Its exit code.
    pub exit_code: i32,
    /// Its exact peak linear memory, in bytes.
    pub peak_memory_bytes: u64,
    /// The memory it was given (its reservation), in bytes.
    pub reserved_bytes: u64,
    /// CPU time, in microseconds.
    pub cpu_time_us: u64,
    /// Wall time, in microseconds.
    pub wall_time_us: u64,
    /// The worker that ran it.
    pub peer: String,
}
