//! What warm starts keep for the next jobs — kept snapshots of readied
//! interpreters, resident instances, in the worker's process and its slot
//! processes (`JobRunner::warm_held_bytes`) — charged to the ledger
//! ([`WarmCharge`], a hold of kind `Warm`), and let go when a job waits
//! for the memory they take.
//!
//! Why: a snapshot (~90 MiB with scikit-learn imported) outlives the job
//! that made it, and no job's limit counts it; uncharged, a worker lent
//! its whole `--memory` to jobs beside it. Charged but never let go, it
//! would keep a job that needs the worker's whole memory waiting for
//! ever — so it is charged as room, not taken from the largest job, and a
//! job that waits with a slot free (for memory, then) has the warm state
//! dropped: the next job of each snapshot makes it again. Under memory
//! pressure a map then runs cold, which is correct, only slower.

use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::admission::Admission;
use super::ledger::{Hold, HoldKind};
use crate::runner::JobRunner;

/// How often the charge follows what the runner holds, and looks for a
/// job waiting for the memory.
pub const WARM_READING: Duration = Duration::from_millis(100);

/// How long a job must have waited with a slot free before what warm
/// starts keep is let go (not a job queued a moment before its dispatch).
pub const RECLAIM_AFTER: Duration = Duration::from_millis(200);

/// The hold of what warm starts keep, and since when a job has waited with
/// a slot free.
pub struct WarmCharge {
    hold: Hold,
    waiting_since: Mutex<Option<Instant>>,
}

impl WarmCharge {
    /// A charge of nothing yet, on `admission`'s ledger.
    pub fn new(admission: &Admission) -> WarmCharge {
        WarmCharge {
            hold: admission.ledger().hold(HoldKind::Warm),
            waiting_since: Mutex::new(None),
        }
    }

    /// Sets the charge to what `runner` keeps now (taken even past the
    /// ledger's room: the memory is taken either way, and what the worker
    /// offers must say so).
    pub fn follow(&self, runner: &JobRunner) {
        let now = runner.warm_held_bytes();
        let held = self.hold.bytes();
        if now > held {
            self.hold.try_grow(now - held, true);
        } else {
            self.hold.release(held - now);
        }
    }

    /// Follows `runner`, and lets go of its warm state when a job has
    /// waited [`RECLAIM_AFTER`] with a slot free while some is kept.
    pub fn tick(&self, runner: &JobRunner, admission: &Admission) {
        self.follow(runner);
        let view = admission.view();
        let waiting = view.queued > 0 && view.busy < admission.slots();
        let mut since = self.waiting_since.lock();
        match (*since, waiting) {
            (_, false) => *since = None,
            (None, true) => *since = Some(Instant::now()),
            (Some(t), true) if t.elapsed() >= RECLAIM_AFTER && self.hold.bytes() > 0 => {
                tracing::info!(
                    held = self.hold.bytes(),
                    "a job waits for memory that warm starts keep: letting it go"
                );
                runner.drop_warm();
                self.follow(runner);
                *since = None;
            }
            (Some(_), true) => {}
        }
    }
}
