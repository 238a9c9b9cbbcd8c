//! Demand: what a running map still has to run ([`Backlog`]), as its client
//! reports it to a worker (`POST /v1/backlog`), the worker gossips it in its
//! advert, and anyone reading the pool view adds it up ([`PoolBacklog`]).
//!
//! Without it the backlog waits in the client, invisible: every advert says
//! "queue 0" while every slot is busy, and nothing (a person, `peerwasm
//! adapt`) can tell how many workers the pool should have. A report says
//! only figures — how many jobs, how much memory each, how long each — and
//! lives a few seconds unless renewed, so a client that dies stops counting
//! within a few rounds.

use serde::{Deserialize, Serialize};

/// How long a report counts after it was received, unless renewed. A map
/// renews it every [`BACKLOG_EVERY`].
pub const BACKLOG_TTL_MS: u64 = 5_000;

/// How often a running map reports its backlog.
pub const BACKLOG_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// The most backlog reports one advert carries (and one worker keeps).
pub const MAX_BACKLOGS: usize = 64;

/// What one map still has to run, as its client sees it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Backlog {
    /// The map's own random id (a submission's id for a detached map): the
    /// same map reported to two workers counts once.
    pub id: String,
    /// Inputs without a result that are not under way: they wait in the
    /// client for room. A stream of inputs of unknown length counts those
    /// read so far.
    pub waiting: u64,
    /// Submissions under way (running or queued on a worker).
    pub running: u64,
    /// The memory a typical waiting job asks for, as smartmem learned it
    /// (the starting request before anything is learned), in bytes.
    pub memory_bytes: u64,
    /// The most any job without a result asks for (waiting, or under way
    /// and perhaps waiting for a worker that can hold it), in bytes.
    pub largest_bytes: u64,
    /// Mean wall time of its jobs so far, in milliseconds; 0: none ended yet.
    pub job_ms: u64,
}

impl Backlog {
    /// Whether a report is one a client could have sent: bounded figures
    /// (a forged one must not make a controller ask a cluster for a
    /// billion workers) and a short id.
    pub fn check(&self) -> Result<(), String> {
        const MAX_JOBS: u64 = 1 << 40;
        const MAX_JOB_MS: u64 = 366 * 24 * 3600 * 1000;
        if self.id.is_empty()
            || self.id.len() > 64
            || !self.id.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err("a backlog's id is 1 to 64 printable characters".into());
        }
        if self.waiting > MAX_JOBS || self.running > MAX_JOBS {
            return Err(format!(
                "a backlog of {} waiting and {} running jobs",
                self.waiting, self.running
            ));
        }
        if self.largest_bytes < self.memory_bytes || self.largest_bytes > 1 << 48 {
            return Err(
                "a backlog's largest request is below its typical one, or past 256 TiB".into(),
            );
        }
        if self.job_ms > MAX_JOB_MS {
            return Err("a backlog's job time is over a year".into());
        }
        Ok(())
    }

    /// Whether there is nothing left: the report ends the map's entry.
    pub fn is_empty(&self) -> bool {
        self.waiting == 0 && self.running == 0
    }
}

/// The pool's demand: every live worker's reports, each map counted once.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PoolBacklog {
    /// Maps reporting.
    pub maps: u64,
    /// Jobs waiting in their clients.
    pub waiting: u64,
    /// Jobs under way.
    pub running: u64,
    /// Σ waiting × the memory each asks for, in bytes: what the backlog
    /// would hold if it all ran at once.
    pub memory_bytes: u64,
    /// The most any waiting job asks for, in bytes.
    pub largest_bytes: u64,
    /// Σ (waiting + running) × mean job time, in seconds: the work left,
    /// in slot-seconds. Maps with no job time yet count none.
    pub work_seconds: f64,
    /// The backlogs themselves, largest request first.
    pub reports: Vec<Backlog>,
}

impl PoolBacklog {
    /// Adds up `reports` (from every live worker's advert), each map once.
    pub fn sum<'a>(reports: impl IntoIterator<Item = &'a Backlog>) -> PoolBacklog {
        let mut seen = std::collections::HashSet::new();
        let mut out = PoolBacklog::default();
        for b in reports {
            if !seen.insert(b.id.as_str()) {
                continue;
            }
            out.maps += 1;
            out.waiting = out.waiting.saturating_add(b.waiting);
            out.running = out.running.saturating_add(b.running);
            out.memory_bytes = out
                .memory_bytes
                .saturating_add(b.waiting.saturating_mul(b.memory_bytes));
            if b.waiting > 0 {
                out.largest_bytes = out.largest_bytes.max(b.largest_bytes);
            }
            out.work_seconds += (b.waiting + b.running) as f64 * b.job_ms as f64 / 1000.0;
            out.reports.push(b.clone());
        }
        out.reports.sort_by(|a, b| {
            b.largest_bytes
                .cmp(&a.largest_bytes)
                .then_with(|| a.id.cmp(&b.id))
        });
        out
    }

    /// Jobs the pool has yet to finish: waiting and under way.
    pub fn jobs(&self) -> u64 {
        self.waiting.saturating_add(self.running)
    }
}

/// The pool's demand in one line: `backlog: 120 waiting, 8 running in 2
/// maps · ~60 slot-s of work · largest job 256 MiB`.
impl std::fmt::Display for PoolBacklog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.maps == 0 {
            return f.write_str("backlog: none");
        }
        write!(
            f,
            "backlog: {} waiting, {} running in {} map{} · ~{:.0} slot-s of work · largest job {}",
            self.waiting,
            self.running,
            self.maps,
            if self.maps == 1 { "" } else { "s" },
            self.work_seconds,
            crate::units::Bytes(self.largest_bytes)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(id: &str, waiting: u64, running: u64, mem: u64, job_ms: u64) -> Backlog {
        Backlog {
            id: id.into(),
            waiting,
            running,
            memory_bytes: mem,
            largest_bytes: 2 * mem,
            job_ms,
        }
    }

    #[test]
    fn the_pool_adds_each_map_once_whichever_workers_carry_it() {
        let reports = [
            b("m1", 10, 4, 100, 500),
            b("m2", 0, 2, 1000, 2000),
            b("m1", 10, 4, 100, 500),
        ];
        let sum = PoolBacklog::sum(&reports);
        assert_eq!(
            (sum.maps, sum.waiting, sum.running, sum.jobs()),
            (2, 10, 6, 16)
        );
        assert_eq!(sum.memory_bytes, 1000, "waiting jobs × their request");
        assert_eq!(
            sum.largest_bytes, 200,
            "m2 has nothing waiting: its requests are held already"
        );
        assert!(
            (sum.work_seconds - (14.0 * 0.5 + 2.0 * 2.0)).abs() < 1e-9,
            "{}",
            sum.work_seconds
        );
        assert_eq!(sum.reports[0].id, "m2", "largest request first");
        assert_eq!(
            sum.to_string(),
            "backlog: 10 waiting, 6 running in 2 maps · ~11 slot-s of work · largest job 200 B"
        );
    }

    #[test]
    fn a_forged_report_is_refused() {
        assert!(b("m", 5, 1, 1 << 20, 100).check().is_ok());
        assert!(b("", 5, 1, 1, 1).check().is_err(), "no id");
        assert!(b(&"x".repeat(65), 5, 1, 1, 1).check().is_err(), "long id");
        assert!(b("m\n", 5, 1, 1, 1).check().is_err(), "unprintable id");
        assert!(
            b("m", u64::MAX, 1, 1, 1).check().is_err(),
            "a billion billion jobs"
        );
        assert!(b("m", 5, 1, 1 << 50, 1).check().is_err(), "a PiB job");
        assert!(
            b("m", 5, 1, 1, u64::MAX).check().is_err(),
            "jobs of forever"
        );
        let inverted = Backlog {
            largest_bytes: 1,
            ..b("m", 5, 1, 10, 1)
        };
        assert!(inverted.check().is_err());
        // Saturating sums: the pool's figures never wrap.
        let huge = b("h", 1 << 40, 0, 1 << 47, 1);
        let sum = PoolBacklog::sum([
            &huge,
            &Backlog {
                id: "h2".into(),
                ..huge.clone()
            },
        ]);
        assert_eq!(sum.memory_bytes, u64::MAX);
    }
}
