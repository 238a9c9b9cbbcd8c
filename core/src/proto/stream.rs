//! One job with its stdin and output streamed: `POST /v1/jobs/stream`.
//!
//! Why: `POST /v1/jobs` carries the whole stdin in the request and the
//! whole output in the answer, so a job cannot start before its input has
//! ended, nor show anything before it ends — `sleep 10 | peerwasm run`
//! waited 10 s, and an interactive job (read a line, answer, repeat) could
//! not work at all. Here both directions flow while the job runs, as with
//! `wasmtime run`.
//!
//! * Request body: one frame ([`super::frame`]) holding the [`JobSpec`]
//!   (its `stdin`, usually empty, is the start of stdin), then the rest of
//!   stdin as raw bytes, to the end of the body. The body ending is the end
//!   of stdin. A client sends stdin only once the answer's head has come
//!   (`200`): a refusal then loses none of it.
//! * Refusals before the job is queued are plain statuses, exactly as for
//!   `POST /v1/jobs` (401, 404 module unknown, 422, 503, 400, 413).
//! * Response `200` (header `peerwasm-job-id`): frames of [`StreamEvent`]:
//!   the job's output as it writes it, then its result, whose `stdout` and
//!   `stderr` are empty (they came as events).
//! * The job is cancelled when the client hangs up (the answer is dropped).
//!   The stdin sent counts against the worker's input limit
//!   ([`super::MAX_INPUT_BYTES`]); past it, the job's reads fail.
//!
//! [`JobSpec`]: super::JobSpec

use serde::{Deserialize, Serialize};

use super::{JobResult, StdStream};

/// The largest head frame (the job's spec) a worker reads.
pub const MAX_HEAD: usize = 1 << 20;

/// One event of a streamed job's answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
// `Done` is large, but there is one per job, and it is moved straight onto
// the wire: a box would only add an allocation.
#[allow(clippy::large_enum_variant)]
pub enum StreamEvent {
    /// Bytes the job wrote, in order.
    Output { stream: StdStream, bytes: Vec<u8> },
    /// How it ended; always the last event. Its `stdout` and `stderr` are
    /// empty: they came as [`StreamEvent::Output`].
    Done(JobResult),
}
