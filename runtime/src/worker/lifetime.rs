//! [`Lifetime`]: how long this worker lives when a batch system lends it.
//!
//! On Slurm a worker runs inside a job that ends at its walltime: the
//! worker knows that time (`--ends-at`, or read from Slurm at start by
//! `peerwasm worker --slurm`), drains before it (the sbatch `--signal`
//! does the same from outside), and refuses a job whose stated time limit
//! would outlast it — the client then places it on a worker that can finish
//! it, rather than losing it at the walltime. It also names the batch job
//! (`SLURM_JOB_ID`), so that a controller knows which job lends which worker.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The batch job a worker runs in, and when it ends.
#[derive(Clone, Debug, Default)]
pub struct Lifetime {
    /// The batch-system job id (`SLURM_JOB_ID`), if any.
    pub batch_job: Option<String>,
    /// When the batch system ends this worker; `None`: it may run forever.
    pub ends_at: Option<SystemTime>,
    /// How long before `ends_at` it drains (stops taking jobs and lets the
    /// running ones finish). Default: 0.
    pub drain_before: Duration,
}

impl Lifetime {
    /// `ends_at` in ms since the epoch, as the advert carries it.
    pub fn ends_at_ms(&self) -> Option<u64> {
        self.ends_at.map(|t| {
            t.duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64)
        })
    }

    /// How long jobs may still run here (until the drain begins), from
    /// `now`; `None`: without end.
    pub fn left(&self, now: SystemTime) -> Option<Duration> {
        let end = self.ends_at?;
        Some(
            end.duration_since(now)
                .unwrap_or_default()
                .saturating_sub(self.drain_before),
        )
    }

    /// Why a job asking for a time limit of `asked` cannot run here now, if
    /// it cannot: it would outlast the worker.
    pub fn refuses(&self, asked: Duration, now: SystemTime) -> Option<String> {
        let left = self.left(now)?;
        (asked > left).then(|| {
            format!(
                "the job asks for up to {} but this worker's batch job ends in {}: another worker will take it",
                humantime::format_duration(Duration::from_secs(asked.as_secs())),
                humantime::format_duration(Duration::from_secs(left.as_secs()))
            )
        })
    }

    /// When the drain should begin (`ends_at` less `drain_before`).
    pub fn drain_at(&self) -> Option<SystemTime> {
        self.ends_at
            .map(|t| t.checked_sub(self.drain_before).unwrap_or(UNIX_EPOCH))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_that_would_outlast_the_worker_is_refused_and_one_that_fits_is_not() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000_000);
        let life = Lifetime {
            batch_job: Some("42".into()),
            ends_at: Some(now + Duration::from_secs(600)),
            drain_before: Duration::from_secs(60),
        };
        assert_eq!(life.left(now), Some(Duration::from_secs(540)));
        assert!(life.refuses(Duration::from_secs(300), now).is_none());
        let why = life
            .refuses(Duration::from_secs(541), now)
            .expect("past the drain");
        assert!(why.contains("ends in 9m"), "{why}");
        assert_eq!(life.drain_at(), Some(now + Duration::from_secs(540)));
        // Past its end, nothing fits; without an end, everything does.
        assert!(
            life.refuses(Duration::from_millis(1), now + Duration::from_secs(700))
                .is_some()
        );
        assert!(
            Lifetime::default()
                .refuses(Duration::from_secs(1 << 30), now)
                .is_none()
        );
    }
}
