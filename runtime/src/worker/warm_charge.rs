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
//! ever — so it is charged as room, and a job that waits for memory alone
//! (a slot free, its tenant below its slot limit) has the warm state dropped: the next job of each
//! snapshot makes it again. Under memory pressure a map then runs cold,
//! which is correct, only slower. The worker's advert says how much it
//! holds (`warm_bytes`, `state.rs`): a learning map's first jobs ask the
//! largest job beside it — else each would have the snapshot dropped and
//! start cold — while a job that needs more is still sent here. An idle
//! worker lets it go after [`KEEP_IDLE`].

use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::admission::Admission;
use super::ledger::{Hold, HoldKind};
use crate::runner::JobRunner;

/// How often the charge follows what the runner holds, and looks for a
/// job waiting for the memory.
pub const WARM_READING: Duration = Duration::from_millis(100);

/// How long a job must have waited for memory alone before what warm
/// starts keep is let go (not a job queued a moment before its dispatch).
pub const RECLAIM_AFTER: Duration = Duration::from_millis(200);

/// How long a worker with nothing to run keeps its warm state: memory the
/// host gets back from a worker idle this long.
pub const KEEP_IDLE: Duration = Duration::from_secs(10 * 60);

/// The hold of what warm starts keep, and since when a job has waited for
/// memory alone.
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
    /// waited [`RECLAIM_AFTER`] for memory alone, or the worker has been
    /// idle [`KEEP_IDLE`], while some is kept ([`let_go`]).
    pub fn tick(&self, runner: &JobRunner, admission: &Admission) {
        self.follow(runner);
        let view = admission.view();
        let waiting = view.waits_for_memory;
        let mut since = self.waiting_since.lock();
        *since = match (*since, waiting) {
            (_, false) => None,
            (None, true) => Some(Instant::now()),
            (t, true) => t,
        };
        if let Some(why) = let_go(since.map(|t| t.elapsed()), view.idle_for, self.hold.bytes()) {
            tracing::info!(
                held = self.hold.bytes(),
                "{why}: letting go of what warm starts keep"
            );
            runner.drop_warm();
            self.follow(runner);
            *since = None;
        }
    }
}

/// Why the warm state should go now, if it should: a job has waited
/// `waiting` for memory alone (a slot free, its tenant below its limit) at least
/// [`RECLAIM_AFTER`], or the worker has been idle at least [`KEEP_IDLE`] —
/// and `held` bytes are kept.
fn let_go(waiting: Option<Duration>, idle: Option<Duration>, held: u64) -> Option<&'static str> {
    if held == 0 {
        None
    } else if waiting.is_some_and(|w| w >= RECLAIM_AFTER) {
        Some("a job waits for the memory")
    } else if idle.is_some_and(|i| i >= KEEP_IDLE) {
        Some("the worker has been idle")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warm_state_goes_for_a_job_that_waits_or_after_a_long_idle_and_only_if_there_is_some() {
        let ms = Duration::from_millis;
        assert_eq!(let_go(Some(ms(199)), None, 1), None, "queued a moment");
        assert!(let_go(Some(RECLAIM_AFTER), None, 1).is_some());
        assert_eq!(let_go(Some(RECLAIM_AFTER), None, 0), None, "nothing kept");
        assert_eq!(let_go(None, Some(KEEP_IDLE - ms(1)), 1), None);
        assert!(let_go(None, Some(KEEP_IDLE), 1).is_some());
        assert_eq!(let_go(None, None, 1), None, "busy, nothing waiting");
    }
}
