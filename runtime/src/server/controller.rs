//! The notice of the controller that grows a pool directory's pool
//! (`peerwasm adapt`): who it is, the largest job it can bring a worker
//! for, and what it is doing as of its last poll — the figures and its
//! last few decisions in words. It is written into `DIR/controller.json`
//! (`pooldir`), read by clients (a map waits for the workers it brings),
//! shown by `peerwasm status --pool-dir` and on every worker's status page
//! (`GET /v1/pool/controller`); `adapt --metrics` exports the same figures.

use std::fmt;

/// The controller growing a pool, as it describes itself in
/// `controller.json`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Controller {
    /// Its Slurm job name (how its worker jobs are found in `squeue`).
    pub name: String,
    /// The host and process it runs as.
    pub host: String,
    pub pid: u32,
    /// The most workers it keeps.
    pub max_workers: u32,
    /// The largest job it can bring a worker for (`--max-mem` less the
    /// worker's overhead), in bytes.
    pub largest_job: u64,
    /// What it is doing, as of its last poll (`peerwasm status` shows it).
    #[serde(default)]
    pub status: ControllerStatus,
}

/// How many decisions the status keeps (the newest last).
pub const DECISIONS_KEPT: usize = 5;
/// A decision's words are cut to this many bytes in the status (the log
/// has them whole).
const DECISION_BYTES: usize = 400;

/// The controller as of its last poll.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct ControllerStatus {
    /// Workers the backlog asks for, within `--min..=--max`.
    pub target: u32,
    /// Its workers in the pool now.
    pub workers: u32,
    /// Its batch jobs not (yet) in the pool: capacity coming.
    pub pending: u32,
    /// Jobs the maps still have to run, as the controller counts them.
    pub backlog_jobs: u64,
    /// What it did since it started.
    pub submitted: u64,
    pub cancelled: u64,
    pub cancelled_unused: u64,
    pub refused: u64,
    /// The last [`DECISIONS_KEPT`] decisions: when (Unix ms) and why.
    pub decisions: Vec<(u64, String)>,
}

impl ControllerStatus {
    /// Keeps `why` as the newest decision.
    pub fn said(&mut self, why: &str) {
        let mut why = why.to_string();
        if why.len() > DECISION_BYTES {
            let mut cut = DECISION_BYTES;
            while !why.is_char_boundary(cut) {
                cut -= 1;
            }
            why.truncate(cut);
            why.push('…');
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        self.decisions.push((now, why));
        let extra = self.decisions.len().saturating_sub(DECISIONS_KEPT);
        self.decisions.drain(..extra);
    }
}

impl fmt::Display for ControllerStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "target {} worker{}: {} in the pool, {} coming; {} jobs to run",
            self.target,
            if self.target == 1 { "" } else { "s" },
            self.workers,
            self.pending,
            self.backlog_jobs
        )?;
        write!(
            f,
            "batch jobs: {} submitted, {} cancelled ({} without having run a job), {} refused",
            self.submitted, self.cancelled, self.cancelled_unused, self.refused
        )?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        for (at, why) in &self.decisions {
            let ago = std::time::Duration::from_secs(now.saturating_sub(*at) / 1000);
            write!(f, "\n  {} ago: {why}", humantime::format_duration(ago))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_keeps_the_last_decisions_and_says_them() {
        let mut s = ControllerStatus {
            target: 4,
            workers: 3,
            pending: 1,
            backlog_jobs: 120,
            refused: 2,
            ..ControllerStatus::default()
        };
        for i in 0..7 {
            s.said(&format!("decision {i}"));
        }
        s.said(&"é".repeat(300));
        assert_eq!(s.decisions.len(), DECISIONS_KEPT);
        assert_eq!(s.decisions[0].1, "decision 3");
        assert!(s.decisions[4].1.len() <= DECISION_BYTES + '…'.len_utf8());
        let text = s.to_string();
        assert!(
            text.contains("target 4 workers: 3 in the pool, 1 coming; 120 jobs"),
            "{text}"
        );
        assert!(
            text.contains("2 refused") && text.contains("ago: decision 6"),
            "{text}"
        );
        // Through the notice, as JSON.
        let back: ControllerStatus =
            serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
    }
}
