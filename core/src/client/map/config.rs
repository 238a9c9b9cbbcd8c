//! How a map runs ([`MapConfig`], its knobs and their defaults) and what
//! receives what it produces ([`MapObserver`]).

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::report::{MapItem, Progress};
use crate::client::estimate::{DEFAULT_MARGIN, EstimateStore};
use crate::proto::MemoryRequest;
use crate::proto::submission::SubmitConfig;

pub use crate::proto::submission::DEFAULT_MAX_LOST;

/// How a map runs. `Default` gives the documented defaults.
#[derive(Clone, Debug)]
pub struct MapConfig {
    /// One fixed memory request for every job; `None` learns it
    /// (smartmem). Default: `None`.
    pub mem: Option<MemoryRequest>,
    /// Each input's own memory request, when its submitter knows it (in
    /// input order, the first for input `first_index`): the map asks for
    /// exactly that, as with `mem`, and learns nothing; inputs past its
    /// end take `mem`, else what is learned. Scheduling is as with a
    /// learned per-input model: the largest of the inputs read ahead
    /// goes first. A detached map (`SubmitConfig`) does not carry it (the
    /// command line refuses `--mem-per-input` with `--detach`). Default:
    /// `None`.
    pub mem_per_input: Option<std::sync::Arc<[MemoryRequest]>>,
    /// Never ask for less than this. Default: 0.
    pub min_mem: u64,
    /// Margin over the largest peak seen. Default: 1.25.
    pub margin: f64,
    /// How often a failed job is resubmitted. Default: 0.
    pub retries: u32,
    /// How many times an input may be lost with the process running it —
    /// its worker died (its connection broke and it no longer answers
    /// while others do) or was declared dead, its slot process was killed
    /// — before the map gives it up: it then ends with outcome `lost` (a
    /// failure, as any other). A job that kills whatever runs it would
    /// otherwise go round the pool for ever. Losses to a worker's orderly
    /// shutdown are not counted, nor a slow answer, nor a connection the
    /// network lost (`client::loss`).
    /// As Dask's `allowed-failures`. Default: [`DEFAULT_MAX_LOST`].
    pub max_lost: u32,
    /// Submissions under way at once; `None`: two per slot of the target,
    /// more for short jobs (see the module docs).
    pub max_in_flight: Option<usize>,
    /// Whether to go on after a job fails. Default: false.
    pub keep_going: bool,
    /// Added to 3 × the slowest round trip before a job counts as lost.
    /// Default: 10 s.
    pub lost_slack: Duration,
    /// How far ahead of the oldest result its reader has not taken the
    /// map may run (unordered: how many inputs may be read and not yet
    /// taken; see [`MapObserver::unread`]). Default: 10,000 inputs.
    pub reorder_window: usize,
    /// Whether results reach the observer in input order (else as they
    /// arrive). Default: true.
    pub ordered: bool,
    /// Where learned estimates are loaded from and saved to; `None` keeps
    /// them for this run only. Default: `None`.
    pub estimates: Option<EstimateStore>,
    /// Cancelling this stops the map (see the module docs); the summary
    /// then says it was interrupted. Default: none.
    pub interrupt: Option<CancellationToken>,
    /// Where files that jobs create or change in their writable
    /// directories go, each input's under `out_dir/<index>/`; `None`: into
    /// the directories themselves, as jobs finish. On a pool only (the
    /// embedded worker's jobs write straight into their directories).
    /// Default: none.
    pub out_dir: Option<std::path::PathBuf>,
    /// The index of the first input: a resumed map numbers its inputs (in
    /// results, and in the tags its jobs carry) from where it left off.
    /// Default: 0.
    pub first_index: usize,
    /// The submission this map runs for, named in every job's tag (and so
    /// in the history of the workers that run them). Default: none.
    pub submission: Option<String>,
    /// Start from this estimate instead of the saved one (a resumed map
    /// starts from the peaks of the results it already has). Default: none.
    pub start_estimate: Option<crate::client::estimate::SavedEstimate>,
}

impl Default for MapConfig {
    fn default() -> Self {
        MapConfig {
            mem: None,
            mem_per_input: None,
            min_mem: 0,
            margin: DEFAULT_MARGIN,
            retries: 0,
            max_lost: DEFAULT_MAX_LOST,
            max_in_flight: None,
            keep_going: false,
            lost_slack: Duration::from_secs(10),
            reorder_window: 10_000,
            ordered: true,
            estimates: None,
            interrupt: None,
            out_dir: None,
            first_index: 0,
            submission: None,
            start_estimate: None,
        }
    }
}

/// Receives what a map produces.
pub trait MapObserver {
    /// Each input's result: in input order, or as it arrives when the map
    /// is not `ordered`. An error stops the map.
    fn result(&mut self, item: MapItem) -> anyhow::Result<()>;
    /// After each result (in any order) and each resubmission.
    fn progress(&mut self, _progress: &Progress) {}
    /// When an input is submitted again, and why.
    fn retry(&mut self, _index: usize, _why: &str) {}
    /// How many of the results it was handed its reader has not taken
    /// yet (a stream read as it goes). The map counts them in its
    /// `reorder_window`, so a reader slower than the map holds at most
    /// that many results, not every one: the map waits for it. Default:
    /// none (every result is taken as it is handed over).
    fn unread(&self) -> usize {
        0
    }
}

/// Collects the items in order: the simplest observer.
impl MapObserver for Vec<MapItem> {
    fn result(&mut self, item: MapItem) -> anyhow::Result<()> {
        self.push(item);
        Ok(())
    }
}

/// The knobs of a map that travel with it to an owner (`map --detach`):
/// [`SubmitConfig`] is their wire form, and these two are the only
/// translations between it and [`MapConfig`] — the command line builds one
/// `MapConfig` whether the map runs here or on an owner, and the owner
/// gets it back.
impl From<&MapConfig> for SubmitConfig {
    fn from(c: &MapConfig) -> SubmitConfig {
        SubmitConfig {
            mem: c.mem,
            min_mem: c.min_mem,
            retries: c.retries,
            max_in_flight: c.max_in_flight.map(|n| n as u64),
            keep_going: c.keep_going,
            max_lost: c.max_lost,
        }
    }
}

impl MapConfig {
    /// `self` with the knobs a submission carries (see
    /// [`SubmitConfig`]'s `From`).
    pub fn with_submitted(self, s: &SubmitConfig) -> MapConfig {
        MapConfig {
            mem: s.mem,
            min_mem: s.min_mem,
            retries: s.retries,
            max_in_flight: s
                .max_in_flight
                .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
            keep_going: s.keep_going,
            max_lost: s.max_lost.max(1),
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_submitted_map_keeps_every_knob_it_travels_with() {
        let here = MapConfig {
            mem: Some((3 << 20).into()),
            min_mem: 1 << 20,
            retries: 2,
            max_in_flight: Some(7),
            keep_going: true,
            max_lost: 5,
            ..MapConfig::default()
        };
        let wire = SubmitConfig::from(&here);
        let back = MapConfig::default().with_submitted(&wire);
        assert_eq!(
            (
                back.mem,
                back.min_mem,
                back.retries,
                back.max_in_flight,
                back.keep_going,
                back.max_lost
            ),
            (
                here.mem,
                here.min_mem,
                here.retries,
                here.max_in_flight,
                here.keep_going,
                here.max_lost
            )
        );
        assert_eq!(SubmitConfig::from(&back), wire);
        // A config kept before `max_lost` travelled reads as the default.
        let mut kept = postcard::to_allocvec(&wire).unwrap();
        kept.pop();
        assert_eq!(
            SubmitConfig::from_stored(&kept).unwrap(),
            SubmitConfig {
                max_lost: DEFAULT_MAX_LOST,
                ..wire.clone()
            }
        );
        assert_eq!(
            SubmitConfig::from_stored(&postcard::to_allocvec(&wire).unwrap()).unwrap(),
            wire
        );
    }
}
