//! [`Growth`]: a pool that grows on demand, as the client sees it.
//!
//! An elastic pool (`peerwasm adapt` on Slurm) has no fixed members: its
//! workers come and go, the ones a client started from included, and while
//! it is at zero workers there is no one to tell of the work. So a client
//! of such a pool reads its seeds again whenever it looks (the pool
//! directory's `members/`), tells the controller of its backlog directly
//! (a file in the pool directory) as well as through the workers, and a
//! job that no worker can hold *yet* — none is running, or none is large
//! enough — waits for one the controller can bring, instead of failing. A
//! job larger than anything the controller can ask for still fails at
//! once, saying so.

use std::sync::Arc;
use std::time::Duration;

use crate::proto::MemoryRequest;
use crate::proto::backlog::Backlog;

/// How a pool grows, for a client that uses it. Built by whoever knows the
/// controller (the command line reads it from the pool directory).
#[derive(Clone)]
pub struct Growth {
    /// The pool's members now (read again at every pool view): trusted as
    /// the seeds are, since they come from the user's own pool directory.
    pub members: Arc<dyn Fn() -> Vec<String> + Send + Sync>,
    /// The largest job the controller can get a worker for.
    pub largest_job: u64,
    /// How long a job waits for a worker that can hold it before the map
    /// fails. Default (on the command line): 10 minutes.
    pub patience: Duration,
    /// Tells the controller of a map's backlog directly (best effort: the
    /// workers hear it too).
    pub report: Arc<dyn Fn(&Backlog) + Send + Sync>,
}

impl std::fmt::Debug for Growth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Growth")
            .field("largest_job", &self.largest_job)
            .field("patience", &self.patience)
            .finish_non_exhaustive()
    }
}

impl Growth {
    /// Whether a job that asks `request` may wait for the pool to grow.
    pub fn can_bring(&self, request: MemoryRequest) -> bool {
        request.bytes() <= self.largest_job
    }
}
