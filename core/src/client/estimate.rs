//! Learned memory estimates — smartmem on the submitting side.
//!
//! FieldTrip's smartmem guessed a job's memory from RSS samples of earlier
//! jobs. Here every result carries the job's exact peak linear memory, and
//! the size of what the job was given (its input's bytes) is known before
//! it runs. Once a dozen results are in, a model of peak against input
//! size is fitted to them ([`fit`]: per input when sizes predict memory,
//! one request for all when they do not — whichever would have reserved
//! less), and each input asks for what the model says inputs of its size
//! need. Before that, the estimate is the largest peak seen times a margin,
//! and before any result, what an earlier run of the same module learned
//! (saved per module hash, model included), else a default capped by what
//! the pool can hold and by the module's own declared memory maximum.
//!
//! The estimate is a *request*, not a promise: a job that outgrows it is
//! retried by `map` (see [`map`](mod@super::map)) with what the model says
//! such an input may need, never less than twice the limit it ran out of.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::proto::{MemoryRequest, ModuleHash};

pub mod fit;

pub use fit::{Model, Observation, Outgrown};

/// Results a model is fitted to: the most recent, so that a job whose
/// memory changed its ways (a new version, another kind of input) is
/// followed.
pub const HISTORY: usize = 1024;

/// One wasm page: limits are always whole pages.
pub const WASM_PAGE: u64 = 64 * 1024;

/// The request before anything is known: 1 GiB, as `peerwasm run`.
pub const DEFAULT_MEMREQ: u64 = crate::proto::DEFAULT_JOB_MEMORY;

/// Default margin over the largest peak seen.
pub const DEFAULT_MARGIN: f64 = 1.25;

/// Rounds `bytes` up to whole wasm pages.
pub fn round_to_pages(bytes: u64) -> u64 {
    bytes.div_ceil(WASM_PAGE).saturating_mul(WASM_PAGE)
}

/// What a module says about its own memory, read from its memory section
/// without compiling it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeclaredMemory {
    /// Σ initial sizes of the memories it defines, in bytes: no limit below
    /// this can even instantiate it.
    pub initial_bytes: u64,
    /// Σ declared maxima, in bytes, when every memory declares one.
    pub maximum_bytes: Option<u64>,
}

impl DeclaredMemory {
    /// Reads the memory section of a core module. Unreadable bytes give the
    /// default (nothing declared): the worker reports them properly.
    pub fn of(module: &[u8]) -> DeclaredMemory {
        let mut out = DeclaredMemory::default();
        let mut all_have_max = true;
        let mut any = false;
        for payload in wasmparser::Parser::new(0).parse_all(module) {
            let Ok(payload) = payload else {
                return DeclaredMemory::default();
            };
            // Memories are declared before any code: stop there rather
            // than walk every function body (CPython has 89,000).
            if let wasmparser::Payload::CodeSectionStart { .. } = payload {
                break;
            }
            if let wasmparser::Payload::MemorySection(reader) = payload {
                for memory in reader {
                    let Ok(memory) = memory else {
                        return DeclaredMemory::default();
                    };
                    any = true;
                    out.initial_bytes = out
                        .initial_bytes
                        .saturating_add(memory.initial.saturating_mul(WASM_PAGE));
                    match memory.maximum {
                        Some(max) => {
                            let max = max.saturating_mul(WASM_PAGE);
                            out.maximum_bytes =
                                Some(out.maximum_bytes.unwrap_or(0).saturating_add(max));
                        }
                        None => all_have_max = false,
                    }
                }
            }
        }
        if !any || !all_have_max {
            out.maximum_bytes = None;
        }
        out
    }
}

/// An estimate as saved between runs, one small JSON file per module.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SavedEstimate {
    /// The largest peak any job of the module reached, in bytes.
    pub peak_bytes: u64,
    /// The request learned from it (peak × margin, whole pages).
    pub memreq_bytes: u64,
    /// How many results it was learned from.
    pub jobs: u64,
    /// The model of peak against input size learned, if results enough
    /// came in (files saved before it existed have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<Model>,
}

/// The memory request for the next job of one module.
#[derive(Clone, Debug)]
pub struct MemoryEstimator {
    margin: f64,
    min: u64,
    cap: u64,
    /// The most a first request asks (the guess before anything is known):
    /// the largest job a worker takes beside what its warm starts keep.
    start_cap: u64,
    declared: DeclaredMemory,
    start: u64,
    started_from_saved: bool,
    /// The largest peak an earlier run saw: small jobs seen in this run do
    /// not make the estimate forget it.
    saved_peak: u64,
    peak_max: Option<u64>,
    peak_sum: u128,
    jobs: u64,
    /// The latest results, for the model.
    history: VecDeque<Observation>,
    /// The model requests follow: this run's fit, or a saved one until
    /// this run has results enough.
    model: Option<Model>,
    /// `jobs` when the model was last fitted.
    fitted_at: u64,
    /// The median input size at the last fit (0 before).
    typical_size: u64,
}

impl MemoryEstimator {
    /// An estimator that starts from `saved` (if any) or the default, never
    /// asks below `min` (nor below the module's initial memory), and never
    /// above `cap` (the largest job the pool can take) nor the module's
    /// declared maximum.
    pub fn new(
        declared: DeclaredMemory,
        saved: Option<&SavedEstimate>,
        min: u64,
        cap: u64,
        margin: f64,
    ) -> Self {
        let start = match saved {
            Some(s) => s.memreq_bytes,
            None => DEFAULT_MEMREQ.min(declared.maximum_bytes.unwrap_or(u64::MAX)),
        };
        MemoryEstimator {
            margin: margin.max(1.0),
            min,
            cap: (cap / WASM_PAGE * WASM_PAGE).max(WASM_PAGE),
            start_cap: u64::MAX,
            declared,
            start,
            started_from_saved: saved.is_some(),
            saved_peak: saved.map_or(0, |s| s.peak_bytes),
            peak_max: None,
            peak_sum: 0,
            jobs: 0,
            history: VecDeque::new(),
            model: saved.and_then(|s| s.model),
            fitted_at: 0,
            typical_size: 0,
        }
    }

    /// Learns from one measured peak, of an input of `size` bytes.
    pub fn observe(&mut self, size: u64, peak_bytes: u64) {
        let new_largest = self.peak_max.is_none_or(|m| peak_bytes > m);
        self.peak_max = Some(self.peak_max.unwrap_or(0).max(peak_bytes));
        self.peak_sum += peak_bytes as u128;
        self.jobs += 1;
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(Observation {
            size,
            peak: peak_bytes,
        });
        // Fitted again as results come, less often as they pile up (a fit
        // sorts the history, and a fast map brings thousands a second) —
        // but at once for a peak larger than any before: the large ones
        // often come last (they wait for room), and they set the tail.
        let n = self.history.len() as u64;
        if new_largest || self.jobs - self.fitted_at >= (n / 16).max(1) {
            self.refit();
        }
    }

    /// Fits the model to the results so far, if there are enough and any
    /// came since the last fit.
    pub fn refit(&mut self) {
        if self.history.len() >= fit::MIN_OBSERVATIONS && self.fitted_at != self.jobs {
            let history: Vec<Observation> = self.history.iter().copied().collect();
            let largest = self.peak_max.unwrap_or(0).max(self.saved_peak);
            self.model = fit::fit(&history, self.margin, largest);
            self.fitted_at = self.jobs;
            let mut sizes: Vec<u64> = history.iter().map(|o| o.size).collect();
            let mid = sizes.len() / 2;
            self.typical_size = *sizes.select_nth_unstable(mid).1;
        }
    }

    /// The model requests follow now, if any (this run's, or a saved one).
    pub fn model(&self) -> Option<Model> {
        self.model
    }

    /// Whether any peak has been seen in this run.
    pub fn learned(&self) -> bool {
        self.peak_max.is_some()
    }

    /// Whether the first request came from an earlier run's saved estimate.
    pub fn started_from_saved(&self) -> bool {
        self.started_from_saved
    }

    /// The request for the next job of a typical input (the median size
    /// seen at the last fit; the progress line asks it after every result,
    /// so nothing is sorted here): see [`request_for`](Self::request_for).
    pub fn request(&self) -> MemoryRequest {
        self.request_for(self.typical_size)
    }

    /// The request for a job whose input is `size` bytes: the model's once
    /// there is one; else `max(peaks) × margin` in whole pages once
    /// something was measured; else the starting request. Then clamped to
    /// `[max(min, initial memory), min(cap, declared max)]`.
    pub fn request_for(&self, size: u64) -> MemoryRequest {
        let raw = match (self.model, self.peak_max) {
            (Some(model), _) => model.request(size),
            (None, Some(peak)) => {
                round_to_pages((peak.max(self.saved_peak) as f64 * self.margin).ceil() as u64)
            }
            (None, None) if self.started_from_saved => self.start,
            (None, None) => self.start.min(self.start_cap),
        };
        MemoryRequest::from(self.clamp(raw))
    }

    /// What the worker should reserve for a job of `size` before it
    /// starts, below its request (its limit): the by-size model's reserve
    /// ([`Model::reserve`]), clamped; none without such a model. Past it
    /// the job grows on memory its worker lends.
    pub fn reserve_for(&self, size: u64) -> Option<MemoryRequest> {
        let reserve = self.model?.reserve(size)?;
        Some(MemoryRequest::from(self.clamp(reserve)))
    }

    /// The request for a job of `size` that ran out of memory
    /// (`outgrown`): what the model says such an input may need
    /// ([`Model::retry`]); without a model, twice its limit or what it
    /// tried to grow to ([`fit::grown`]), whichever is more — in both
    /// cases the doubling stops at the tail, the largest peak known × the
    /// margin, while the job has not outgrown that too; clamped.
    pub fn retry(&self, size: u64, outgrown: Outgrown) -> MemoryRequest {
        let known = self.peak_max.unwrap_or(0).max(self.saved_peak);
        let tail = (known > 0).then(|| round_to_pages((known as f64 * self.margin).ceil() as u64));
        let raw = match self.model {
            Some(model) => model.retry(size, outgrown, self.margin, tail),
            None => fit::retry_floor(outgrown, tail),
        };
        MemoryRequest::from(self.clamp(raw))
    }

    /// Clamps any request (the estimate, or a retry's larger one) to what
    /// can run: not below the floor, not above the pool or the module's max.
    pub fn clamp(&self, bytes: u64) -> u64 {
        let floor = round_to_pages(self.min.max(self.declared.initial_bytes));
        let ceiling = self.ceiling();
        round_to_pages(bytes).max(floor).min(ceiling.max(floor))
    }

    /// Follows the pool as it is now: `cap` is the largest job it can take
    /// (workers join and leave while a map runs), in whole pages below it
    /// (a worker keeping results takes less than its capacity);
    /// `beside_warm` the largest it takes beside what its warm starts keep,
    /// which bounds the guess made before anything is known (a saved
    /// estimate is known): a guess that did not fit beside them would have
    /// the worker let its snapshots go, and the map start cold. A job that
    /// outgrows the guess is retried up to `cap`.
    pub fn set_caps(&mut self, cap: u64, beside_warm: u64) {
        self.cap = (cap / WASM_PAGE * WASM_PAGE).max(WASM_PAGE);
        self.start_cap = (beside_warm / WASM_PAGE * WASM_PAGE).max(WASM_PAGE);
    }

    /// The largest request worth making: the pool's largest job, or the
    /// module's declared maximum if smaller.
    pub fn ceiling(&self) -> u64 {
        self.cap
            .min(self.declared.maximum_bytes.unwrap_or(u64::MAX))
    }

    /// Largest peak seen in this run.
    pub fn peak_max(&self) -> Option<u64> {
        self.peak_max
    }

    /// Mean peak over this run's results.
    pub fn peak_mean(&self) -> Option<u64> {
        (self.jobs > 0).then(|| (self.peak_sum / self.jobs as u128) as u64)
    }

    /// What to save for the next run, if anything was learned.
    pub fn to_saved(&self) -> Option<SavedEstimate> {
        let peak = self.peak_max?.max(self.saved_peak);
        Some(SavedEstimate {
            peak_bytes: peak,
            memreq_bytes: self.request().bytes(),
            jobs: self.jobs,
            model: self.model,
        })
    }
}

/// Where estimates live: one `<sha256>.json` per module under a directory
/// (by default `~/.cache/peerwasm/estimates`).
#[derive(Clone, Debug)]
pub struct EstimateStore {
    dir: PathBuf,
}

impl EstimateStore {
    /// A store under `dir` (created when first saving).
    pub fn new(dir: impl Into<PathBuf>) -> EstimateStore {
        EstimateStore { dir: dir.into() }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, module: &ModuleHash) -> PathBuf {
        self.dir.join(format!("{}.json", module.to_hex()))
    }

    /// The saved estimate of `module`; `None` if there is none or it cannot
    /// be read (a damaged file only costs the head start).
    pub fn load(&self, module: &ModuleHash) -> Option<SavedEstimate> {
        let bytes = std::fs::read(self.path(module)).ok()?;
        match serde_json::from_slice(&bytes) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(path = %self.path(module).display(), "ignoring an unreadable saved estimate: {e}");
                None
            }
        }
    }

    /// Saves `estimate` for `module`, atomically (write, then rename).
    pub fn save(&self, module: &ModuleHash, estimate: &SavedEstimate) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let text = serde_json::to_vec_pretty(estimate)?;
        crate::private_path::replace(&self.path(module), &text, 0o600)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn learns_max_peak_times_margin_in_pages() {
        let mut e = MemoryEstimator::new(DeclaredMemory::default(), None, 0, 8 << 30, 1.25);
        assert_eq!(e.request().bytes(), DEFAULT_MEMREQ);
        e.observe(0, 10 * MIB);
        e.observe(0, 40 * MIB + 1);
        e.observe(0, 20 * MIB);
        let req = e.request().bytes();
        assert_eq!(req % WASM_PAGE, 0);
        assert!((50 * MIB..=50 * MIB + WASM_PAGE).contains(&req), "{req}");
        assert_eq!(e.peak_mean(), Some((70 * MIB + 1) / 3));
    }

    #[test]
    fn clamped_by_min_initial_cap_and_declared_max() {
        let declared = DeclaredMemory {
            initial_bytes: 2 * MIB,
            maximum_bytes: Some(64 * MIB),
        };
        let e = MemoryEstimator::new(declared, None, 0, 8 << 30, 1.25);
        assert_eq!(
            e.request().bytes(),
            64 * MIB,
            "the default is capped by the declared max"
        );
        let mut e =
            MemoryEstimator::new(DeclaredMemory::default(), None, 16 * MIB, 512 * MIB, 1.25);
        assert_eq!(
            e.request().bytes(),
            512 * MIB,
            "the default is capped by the pool"
        );
        e.observe(0, MIB);
        assert_eq!(e.request().bytes(), 16 * MIB, "never below --min-mem");
        let e = MemoryEstimator::new(declared, None, 0, 8 << 30, 1.25);
        assert_eq!(e.clamp(0), 2 * MIB, "never below the initial memory");
    }

    #[test]
    fn the_first_guess_fits_beside_warm_state_and_a_retry_may_ask_past_it() {
        // A worker of 1 GiB keeping 97 MiB warm: the guess asks what fits
        // beside it; a job that outgrows that may ask the whole GiB.
        let mut e = MemoryEstimator::new(DeclaredMemory::default(), None, 0, 1 << 30, 1.25);
        e.set_caps(1 << 30, (1 << 30) - 97 * MIB);
        assert_eq!(e.request().bytes(), (1 << 30) - 97 * MIB);
        assert_eq!(e.ceiling(), 1 << 30);
        let outgrown = Outgrown {
            limit: (1 << 30) - 97 * MIB,
            requested: (1 << 30) - 90 * MIB,
            first: true,
        };
        assert_eq!(e.retry(0, outgrown).bytes(), 1 << 30);
        // A saved estimate is knowledge, not a guess: asked as it is.
        let saved = SavedEstimate {
            peak_bytes: 900 * MIB,
            memreq_bytes: 1000 * MIB,
            jobs: 3,
            model: None,
        };
        let mut e = MemoryEstimator::new(DeclaredMemory::default(), Some(&saved), 0, 1 << 30, 1.25);
        e.set_caps(1 << 30, (1 << 30) - 97 * MIB);
        assert_eq!(e.request().bytes(), 1000 * MIB);
    }

    #[test]
    fn starts_from_saved_and_reads_declared_memory() {
        let saved = SavedEstimate {
            peak_bytes: 4 * MIB,
            memreq_bytes: 5 * MIB,
            jobs: 3,
            model: None,
        };
        let e = MemoryEstimator::new(DeclaredMemory::default(), Some(&saved), 0, 8 << 30, 1.25);
        assert_eq!(e.request().bytes(), 5 * MIB);
        assert!(e.started_from_saved());
        let mut e = e;
        e.observe(0, MIB);
        assert_eq!(
            e.request().bytes(),
            5 * MIB,
            "a small job does not make it forget the saved peak"
        );

        let wasm = wat::parse_str("(module (memory 3 10))").unwrap();
        assert_eq!(
            DeclaredMemory::of(&wasm),
            DeclaredMemory {
                initial_bytes: 3 * WASM_PAGE,
                maximum_bytes: Some(10 * WASM_PAGE)
            }
        );
        let wasm = wat::parse_str("(module (memory 1))").unwrap();
        assert_eq!(DeclaredMemory::of(&wasm).maximum_bytes, None);
        assert_eq!(DeclaredMemory::of(b"not wasm"), DeclaredMemory::default());

        let dir = tempfile::tempdir().unwrap();
        let store = EstimateStore::new(dir.path().join("estimates"));
        let hash = ModuleHash::of(&wasm);
        assert_eq!(store.load(&hash), None);
        store.save(&hash, &saved).unwrap();
        assert_eq!(store.load(&hash), Some(saved));
    }

    #[test]
    fn a_learned_model_is_saved_and_the_next_run_starts_from_it() {
        let mut e = MemoryEstimator::new(DeclaredMemory::default(), None, 0, 8 << 30, 1.25);
        for i in 1..=40u64 {
            // Peak 8 × size + 2 MiB, exactly.
            e.observe(i * MIB / 4, 8 * (i * MIB / 4) + 2 * MIB);
        }
        let Some(Model::BySize { .. }) = e.model() else {
            panic!("{:?}", e.model())
        };
        assert!(
            e.request_for(MIB / 4) < e.request_for(4 * MIB),
            "a larger input asks for more"
        );
        let small = e.request_for(MIB / 4);
        assert!((4 * MIB..=5 * MIB).contains(&small.bytes()), "{small}");
        // A retry asks for twice the limit it ran out of, but no more than
        // the largest peak seen (82 MiB) × the margin while under it; once
        // over that, twice again.
        let tail = round_to_pages(82 * MIB * 5 / 4);
        assert_eq!(
            e.retry(
                MIB,
                Outgrown {
                    limit: 32 * MIB,
                    requested: 33 * MIB,
                    first: true
                }
            ),
            MemoryRequest::from(64 * MIB)
        );
        assert_eq!(
            e.retry(
                MIB,
                Outgrown {
                    limit: 64 * MIB,
                    requested: 65 * MIB,
                    first: true
                }
            ),
            MemoryRequest::from(tail)
        );
        assert_eq!(
            e.retry(
                MIB,
                Outgrown {
                    limit: 64 * MIB,
                    requested: 120 * MIB,
                    first: true
                }
            ),
            MemoryRequest::from(128 * MIB),
            "past the tail: twice"
        );
        assert_eq!(
            e.retry(
                MIB,
                Outgrown {
                    limit: tail,
                    requested: tail + 1,
                    first: false
                }
            ),
            MemoryRequest::from(2 * tail)
        );
        // Saved (JSON), and the next run's first jobs ask per input.
        let saved = e.to_saved().unwrap();
        let json = serde_json::to_string(&saved).unwrap();
        let back: SavedEstimate = serde_json::from_str(&json).unwrap();
        assert_eq!(back, saved);
        let next = MemoryEstimator::new(DeclaredMemory::default(), Some(&back), 0, 8 << 30, 1.25);
        assert_eq!(
            next.request_for(MIB / 4),
            small,
            "informed from its first job"
        );
        // A file saved before models existed still reads.
        let old: SavedEstimate =
            serde_json::from_str(r#"{"peak_bytes": 4096, "memreq_bytes": 65536, "jobs": 1}"#)
                .unwrap();
        assert_eq!(old.model, None);
    }
}
