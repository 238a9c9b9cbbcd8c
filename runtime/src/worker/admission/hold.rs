//! When a waiting job gets memory held for it: after `--hold-after` (30 s
//! by default; it then also starts first if it fits), or — if it waits
//! because it does not fit — sooner on a worker whose jobs are short:
//! after [`HOLD_AFTER_JOBS`] × the mean time of its recent jobs
//! ([`JobTimes::hold_after`]), never sooner than [`MIN_HOLD_AFTER`]
//! ([`gathering`]). Only memory gathers for it then; it keeps its
//! fair-share turn, so a job waiting for a slot is never moved ahead of a
//! tenant with less usage.
//!
//! Why: small jobs may pass a large one that does not fit yet (backfill);
//! a hold then stops them, so the memory the large one needs gathers as
//! running jobs end. With only the fixed bound, on a worker of 0.3 s jobs
//! a large job waited until every small one had passed it: a map's large
//! jobs all ran at its end, one at a time with nothing beside them, and
//! were the map's tail. Slurm's backfill reserves for its first job at
//! once, knowing every job's time limit; here jobs state none, so the bound
//! is "passed over for longer than a few typical jobs", which scales with
//! the work — seconds for short jobs, the configured bound for long ones.

use std::time::Duration;

use tokio::time::Instant;

/// A waiting job is held after this many mean job times (if sooner than
/// the configured bound).
pub const HOLD_AFTER_JOBS: f64 = 3.0;

/// The shortest wait before a hold, however short the jobs.
pub const MIN_HOLD_AFTER: Duration = Duration::from_millis(250);

/// Weight of each new job's time in the running mean (about the last ten
/// jobs count).
const WEIGHT: f64 = 0.1;

/// The mean time of the worker's recent jobs (admission to end).
#[derive(Debug, Default)]
pub(super) struct JobTimes {
    mean_secs: Option<f64>,
}

impl JobTimes {
    /// Counts a job that held its slot for `took`.
    pub fn record(&mut self, took: Duration) {
        let t = took.as_secs_f64();
        self.mean_secs = Some(match self.mean_secs {
            None => t,
            Some(m) => m + WEIGHT * (t - m),
        });
    }

    /// How long a job may wait before memory is held for it: `configured`,
    /// or [`HOLD_AFTER_JOBS`] × the mean job time if shorter (at least
    /// [`MIN_HOLD_AFTER`]). Before any job has ended, `configured`.
    pub fn hold_after(&self, configured: Duration) -> Duration {
        match self.mean_secs {
            None => configured,
            Some(m) => Duration::from_secs_f64(m * HOLD_AFTER_JOBS)
                .max(MIN_HOLD_AFTER)
                .min(configured),
        }
    }
}

/// Memory to gather for the first of `firsts` (each tenant's first
/// waiting job: since when, and what it needs to start; in fair-share
/// order) passed over for longer than `bound` because it does not fit:
/// others start only beside it, but it keeps its fair-share turn — a job
/// that waits for a slot, not for memory, is not moved ahead. 0 if none,
/// or none the host could ever hold (`room`: what a job is offered now,
/// and the most it could ever be; read only if some job is that late):
/// those wait for `--hold-after`, then are refused.
pub(super) fn gathering(
    firsts: impl Iterator<Item = (Instant, u64)>,
    now: Instant,
    bound: Duration,
    room: impl FnOnce() -> (u64, u64),
) -> u64 {
    let mut late = firsts
        .filter(|&(since, _)| overdue(since, now, bound))
        .map(|(_, need)| need)
        .peekable();
    if late.peek().is_none() {
        return 0; // the usual case reads no host memory
    }
    let (offer, ceiling) = room();
    late.find(|&need| need > offer && need <= ceiling)
        .unwrap_or(0)
}

/// Whether a job waiting `since` has waited past `hold_after` (the
/// [`JobTimes::hold_after`] of this pass) and gets memory held for it.
pub(super) fn overdue(since: Instant, now: Instant, hold_after: Duration) -> bool {
    now.saturating_duration_since(since) > hold_after
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hold_follows_the_jobs_times_between_its_floor_and_the_bound() {
        let bound = Duration::from_secs(30);
        let mut times = JobTimes::default();
        assert_eq!(times.hold_after(bound), bound, "nothing known yet");
        for _ in 0..50 {
            times.record(Duration::from_millis(400));
        }
        let held = times.hold_after(bound);
        assert!(
            held > Duration::from_millis(1100) && held < Duration::from_millis(1300),
            "3 × 0.4 s: {held:?}"
        );
        // Instant jobs: the floor.
        for _ in 0..200 {
            times.record(Duration::ZERO);
        }
        assert_eq!(times.hold_after(bound), MIN_HOLD_AFTER);
        // Long jobs: the configured bound.
        for _ in 0..200 {
            times.record(Duration::from_secs(60));
        }
        assert_eq!(times.hold_after(bound), bound);
        // A bound set below the floor is kept.
        assert_eq!(
            times.hold_after(Duration::from_millis(50)),
            Duration::from_millis(50)
        );
    }

    #[test]
    fn memory_gathers_for_the_first_late_job_that_does_not_fit() {
        let now = Instant::now();
        let ago = |ms| now - Duration::from_millis(ms);
        let bound = Duration::from_millis(500);
        let room = || (100, 1000);
        // None late: nothing, and host memory is not read.
        let unread = || -> (u64, u64) { panic!("read host memory") };
        assert_eq!(
            gathering([(ago(100), 400)].into_iter(), now, bound, unread),
            0
        );
        // Late but fitting (it waits for a slot): nothing.
        assert_eq!(gathering([(ago(900), 50)].into_iter(), now, bound, room), 0);
        // The first late one that does not fit, in the order given.
        let firsts = [
            (ago(900), 50),
            (ago(100), 300),
            (ago(700), 400),
            (ago(800), 600),
        ];
        assert_eq!(gathering(firsts.into_iter(), now, bound, room), 400);
        // One the host could never hold is not gathered for.
        assert_eq!(
            gathering([(ago(900), 2000)].into_iter(), now, bound, room),
            0
        );
    }

    #[test]
    fn one_slow_job_moves_the_mean_by_a_tenth() {
        let mut times = JobTimes::default();
        for _ in 0..100 {
            times.record(Duration::from_millis(100));
        }
        times.record(Duration::from_secs(10));
        let held = times.hold_after(Duration::from_secs(30));
        assert!(
            held > Duration::from_secs(3) && held < Duration::from_secs(4),
            "(0.1 + 0.1 × 9.9) × 3 ≈ 3.27 s: {held:?}"
        );
    }
}
