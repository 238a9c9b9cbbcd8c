//! What `map` reports: each input's [`MapItem`], running [`Progress`], and
//! the [`MapSummary`] at the end.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::Serialize;

use crate::proto::{JobResult, MemoryRequest, Outcome};
use crate::units::Bytes;

/// One input's result.
#[derive(Clone, Debug)]
pub struct MapItem {
    /// The input's position, from 0 (line `index + 1` of an inputs file).
    pub index: usize,
    /// How its (last) run ended.
    pub result: JobResult,
    /// How many times it was submitted.
    pub attempts: u32,
    /// The reserve its last run asked its worker for, below its limit
    /// (`JobSpec::memory_reserve`): the worker held this, or its peak if
    /// more (lent past it). `None`: its whole limit was reserved — or, for
    /// a detached map's results, not known.
    pub reserve: Option<MemoryRequest>,
}

/// The JSON line `peerwasm map` writes for one input.
#[derive(Serialize)]
struct ItemLine<'a> {
    index: usize,
    exit_code: i32,
    stdout: serde_json::Value,
    stderr: String,
    outcome: &'a Outcome,
    peak_memory_bytes: u64,
    memory_limit_bytes: u64,
    wall_time_us: u64,
    cpu_time_us: u64,
    peer: &'a str,
    attempts: u32,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    warnings: &'a [String],
    /// Files it made, as written (`--dir`, `--out-dir`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    files: Vec<&'a str>,
}

impl MapItem {
    /// Whether the job exited with code 0.
    pub fn succeeded(&self) -> bool {
        self.result.outcome.is_success()
    }

    /// The item as one JSON object: stdout as JSON when it parses as JSON,
    /// else as a string.
    pub fn to_json(&self) -> serde_json::Value {
        let r = &self.result;
        let stdout = serde_json::from_slice(&r.stdout).unwrap_or_else(|_| {
            serde_json::Value::String(String::from_utf8_lossy(&r.stdout).into_owned())
        });
        let line = ItemLine {
            index: self.index,
            exit_code: r.outcome.exit_code(),
            stdout,
            stderr: String::from_utf8_lossy(&r.stderr).into_owned(),
            outcome: &r.outcome,
            peak_memory_bytes: r.peak_memory_bytes,
            memory_limit_bytes: r.memory_limit_bytes,
            wall_time_us: r.wall_time_us,
            cpu_time_us: r.cpu_time_us,
            peer: &r.peer,
            attempts: self.attempts,
            warnings: &r.warnings,
            files: r.files.iter().map(|f| f.path.as_str()).collect(),
        };
        serde_json::to_value(line).expect("plain data serializes")
    }

    /// One line saying why this input failed, naming it.
    pub fn failure_message(&self) -> String {
        let r = &self.result;
        let mut msg = format!(
            "input {} (line {}) failed: {}",
            self.index,
            self.index + 1,
            r.outcome
        );
        let stderr = String::from_utf8_lossy(&r.stderr);
        if let Some(last) = stderr.lines().rev().find(|l| !l.trim().is_empty()) {
            msg.push_str(&format!(": {}", last.trim()));
        }
        msg
    }
}

/// Where a map is, after each result.
#[derive(Clone, Debug, Default)]
pub struct Progress {
    /// Inputs with a final result.
    pub done: u64,
    /// All inputs, when known up front.
    pub total: Option<u64>,
    /// Of `done`, those that did not succeed.
    pub failed: u64,
    /// Resubmissions so far (memory, lost, `--retries`).
    pub retried: u64,
    /// Submissions under way.
    pub in_flight: usize,
    /// Since the map started.
    pub elapsed: Duration,
    /// Time left, from the mean measured job time and the slots in use.
    pub eta: Option<Duration>,
    /// The memory request jobs go out with now.
    pub request: MemoryRequest,
}

impl Progress {
    /// Results per second so far.
    pub fn rate(&self) -> f64 {
        self.done as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// A map that stopped at a failing input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stopped {
    /// The failing input.
    pub index: usize,
    /// What happened, naming the input.
    pub message: String,
}

/// Figures of a whole map.
#[derive(Clone, Debug, Default)]
pub struct MapSummary {
    /// Inputs that got a result.
    pub jobs: u64,
    /// Of those, the ones that did not succeed.
    pub failed: u64,
    /// Resubmissions after a memory limit we had estimated.
    pub memory_retries: u64,
    /// Of those, inputs that outgrew their reserve where their worker had
    /// no memory left to lend (`JobSpec::memory_reserve`): run again with
    /// their whole request reserved.
    pub lend_retries: u64,
    /// Resubmissions after a worker lost the job, or was slow to answer
    /// (one copy sent elsewhere).
    pub lost: u64,
    /// Resubmissions of failed jobs (`--retries`).
    pub failure_retries: u64,
    /// Answers that came after their input already had a result (ignored).
    pub late_answers: u64,
    /// Wall time of the whole map.
    pub elapsed: Duration,
    /// CPU time of all the results' jobs.
    pub cpu_time: Duration,
    /// Largest and mean peak memory over the results, in bytes.
    pub peak_max: u64,
    pub peak_mean: u64,
    /// The memory request learned (`None` when `--mem` fixed it), for a
    /// typical input.
    pub learned_request: Option<MemoryRequest>,
    /// What the memory of its jobs was learned to follow, once results
    /// enough came in (`Model::describe` says it in words).
    pub learned_model: Option<crate::client::estimate::Model>,
    /// Whether the first jobs started from an earlier run's estimate.
    pub started_from_saved: bool,
    /// Results per worker.
    pub per_peer: BTreeMap<String, u64>,
    /// Results that carried a warning (e.g. peak above 90% of the limit).
    pub warned: u64,
    /// Warnings about the map as a whole.
    pub warnings: Vec<String>,
    /// Set when a failure stopped the map.
    pub stopped: Option<Stopped>,
    /// Whether the map was interrupted (`MapConfig::interrupt`): inputs
    /// without a result were not run to their end.
    pub interrupted: bool,
}

impl MapSummary {
    /// All resubmissions.
    pub fn retries(&self) -> u64 {
        self.memory_retries + self.lost + self.failure_retries
    }

    /// Total CPU / elapsed: how many cores the map kept busy.
    pub fn speedup(&self) -> f64 {
        self.cpu_time.as_secs_f64() / self.elapsed.as_secs_f64().max(1e-9)
    }
}

impl fmt::Display for MapSummary {
    /// A few lines for people, as `peerwasm map` prints at the end.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} jobs, {} failed, {} retried ({} memory, {} lost, {} failed) in {:.2} s · {:.0} jobs/s",
            self.jobs,
            self.failed,
            self.retries(),
            self.memory_retries,
            self.lost,
            self.failure_retries,
            self.elapsed.as_secs_f64(),
            self.jobs as f64 / self.elapsed.as_secs_f64().max(1e-9),
        )?;
        writeln!(
            f,
            "cpu {:.2} s · speed-up {:.2}×",
            self.cpu_time.as_secs_f64(),
            self.speedup()
        )?;
        write!(
            f,
            "peak memory max {} · mean {}",
            Bytes(self.peak_max),
            Bytes(self.peak_mean)
        )?;
        match self.learned_request {
            Some(m) => writeln!(
                f,
                " · memory request learned {}{}",
                m,
                if self.started_from_saved {
                    " (started from the saved estimate)"
                } else {
                    ""
                }
            )?,
            None => writeln!(f)?,
        }
        if let Some(model) = &self.learned_model {
            writeln!(f, "memory learned: {}", model.describe())?;
        }
        if self.lend_retries > 0 {
            writeln!(
                f,
                "{} of the memory retries outgrew their reserve where the worker had nothing to lend",
                self.lend_retries
            )?;
        }
        let peers: Vec<String> = self
            .per_peer
            .iter()
            .map(|(p, n)| format!("{p} {n}"))
            .collect();
        write!(f, "jobs per peer: {}", peers.join(" · "))?;
        if self.late_answers > 0 {
            write!(
                f,
                "\n{} late answers of resubmitted jobs were dropped (each input has one result)",
                self.late_answers
            )?;
        }
        if self.warned > 0 {
            write!(
                f,
                "\n{} results carried a warning (see their \"warnings\")",
                self.warned
            )?;
        }
        for w in &self.warnings {
            write!(f, "\nwarning: {w}")?;
        }
        Ok(())
    }
}
