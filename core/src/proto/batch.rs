//! Many jobs in one request: `POST /v1/jobs/batch`.
//!
//! Why: one HTTP exchange per job costs the worker and the client tens of
//! microseconds each, as much as a trivial job itself (benches/README.md).
//! A client that has many jobs ready for one worker sends them together;
//! the worker admits each one exactly as `POST /v1/jobs` would and streams
//! each answer back the moment its job ends, so a slow job never holds up
//! the others' results.
//!
//! * Request body: a postcard `Vec<JobSpec>` of at most [`MAX_BATCH_JOBS`]
//!   jobs, all of the caller's tenant.
//! * Response `200`: a stream of frames, in the order the jobs end. A frame
//!   is a 4-byte little-endian length, then a postcard [`BatchItem`].
//! * A refusal of the whole request (401, 400, 413, 503 draining) is a
//!   plain status, as for one job; a refusal of one job (404 module
//!   unknown, 422 never fits, 503 queue full) is its [`BatchAnswer::Refused`].

use serde::{Deserialize, Serialize};

use super::JobResult;
pub use super::frame::{FrameReader, MAX_FRAME, encode_frame};

/// The most jobs one batch may carry.
pub const MAX_BATCH_JOBS: usize = 4096;

/// One job's answer within a batch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BatchItem {
    /// The job's position in the request.
    pub index: u32,
    /// What became of it.
    pub answer: BatchAnswer,
}

/// What became of one job of a batch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum BatchAnswer {
    /// It ran; its result.
    Done(JobResult),
    /// It was refused, as `POST /v1/jobs` would have refused it.
    Refused {
        /// The HTTP status `POST /v1/jobs` would have answered.
        status: u16,
        /// Why, for people.
        message: String,
        /// For 422: the largest job this worker could ever take, in bytes.
        largest_job: Option<u64>,
    },
}

impl super::frame::FrameReader {
    /// The next complete batch frame; see [`FrameReader::next_frame`](super::frame::FrameReader::next_frame).
    pub fn next_item(&mut self) -> Result<Option<BatchItem>, String> {
        self.next_frame()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{CacheSource, Outcome};

    fn item(index: u32) -> BatchItem {
        let answer = if index.is_multiple_of(2) {
            BatchAnswer::Done(JobResult {
                outcome: Outcome::Exited { code: 0 },
                stdout: vec![b'x'; index as usize],
                stderr: Vec::new(),
                peak_memory_bytes: 65536,
                memory_limit_bytes: 1 << 20,
                wall_time_us: 1,
                cpu_time_us: 1,
                cache: CacheSource::Memory,
                peer: "w".into(),
                warnings: Vec::new(),
                files: Vec::new(),
            })
        } else {
            BatchAnswer::Refused {
                status: 503,
                message: "busy".into(),
                largest_job: None,
            }
        };
        BatchItem { index, answer }
    }

    #[test]
    fn frames_split_anywhere_are_read_back_whole() {
        let items: Vec<_> = (0..20).map(item).collect();
        let stream: Vec<u8> = items
            .iter()
            .flat_map(|i| encode_frame(i).unwrap())
            .collect();
        for piece in [1, 3, 7, 64, stream.len()] {
            let mut reader = FrameReader::default();
            let mut got = Vec::new();
            for chunk in stream.chunks(piece) {
                reader.push(chunk);
                while let Some(i) = reader.next_item().unwrap() {
                    got.push(i);
                }
            }
            assert_eq!(got, items, "pieces of {piece}");
            assert_eq!(reader.pending(), 0);
        }
    }

    #[test]
    fn a_truncated_stream_leaves_bytes_pending_and_garbage_is_an_error() {
        let frame = encode_frame(&item(2)).unwrap();
        let mut reader = FrameReader::default();
        reader.push(&frame[..frame.len() - 1]);
        assert_eq!(reader.next_item(), Ok(None));
        assert_eq!(reader.pending(), frame.len() - 1);

        let mut reader = FrameReader::default();
        reader.push(&u32::MAX.to_le_bytes());
        assert!(
            reader
                .next_item()
                .unwrap_err()
                .contains("larger than the limit")
        );

        let mut reader = FrameReader::default();
        reader.push(&[3, 0, 0, 0, 0xff, 0xff, 0xff]);
        assert!(reader.next_item().unwrap_err().contains("unreadable"));
    }
}
