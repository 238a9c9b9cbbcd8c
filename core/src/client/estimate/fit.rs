//! What a job's memory follows: a model of peak memory fitted to the
//! (input size, peak) pairs a map has seen, and the request it makes for
//! the next input.
//!
//! Real jobs' memory usually follows their input — the file they parse, the
//! series they load — so a request can follow it too: a small input asks
//! for little, a large one for more, instead of every job asking for the
//! largest peak seen. But not every job's memory follows its input, and a
//! fit to data it does not explain asks for too much everywhere. So two
//! models are fitted to the same history and the one that would have
//! reserved less for it is used:
//!
//! * [`Model::BySize`]: `peak ≈ slope × size + intercept`, fitted with the
//!   Theil–Sen estimator (the median of the slopes between pairs of
//!   points: robust to the odd outlier, where least squares follows it),
//!   kept monotone (`slope ≥ 0`); each request is the fit times `cover`, a
//!   high quantile ([`COVER_QUANTILE`]) of `peak ÷ fit` over the history,
//!   so the noise around the line is covered as often as that quantile
//!   says and no more.
//! * [`Model::Blind`]: one request for every input, chosen over the peaks
//!   seen to minimise what is reserved: `request × n` plus, for each input
//!   over it, the retry at `tail` (the largest peak seen × the margin) —
//!   the classic newsvendor trade. With peaks all alike it is the largest
//!   times the margin, today's rule; with a heavy tail (most small, a few
//!   large) it asks for what the many need, and the few run again, once,
//!   with `tail`.
//!
//! The choice is made on the history itself, so it detects when sizes do
//! not predict memory: the by-size fit's cover then has to stretch over the
//! whole spread of peaks and costs more than the blind request.

use serde::{Deserialize, Serialize};

use super::{WASM_PAGE, round_to_pages};

/// Results needed before a model is fitted (before: the largest peak times
/// the margin).
pub const MIN_OBSERVATIONS: usize = 12;

/// The share of the history the by-size model's cover reaches: about one
/// input in fifty runs twice.
pub const COVER_QUANTILE: f64 = 0.98;

/// The share of the history a model's *reserve* reaches (the by-size
/// model's over its line, the blind one's of the peaks): what a job is
/// sure of, while its request is its limit. Past its
/// reserve a job grows on memory its worker lends (promised to no one):
/// the jobs' noises around the line pool on a worker, so each holding
/// what it uses costs far less than each reserving the top of the noise.
pub const RESERVE_QUANTILE: f64 = 0.5;

/// Pairs sampled for the Theil–Sen slope (of `n(n−1)/2`).
const SLOPE_PAIRS: usize = 4096;

/// The blind request's room over the peak it was chosen at: an input a
/// little over the history's peaks still fits.
const BLIND_SLACK: f64 = 1.05;

/// What to ask of a job that tried to grow to `requested`: a little more
/// (a job that takes its memory in one allocation peaks just past it; one
/// that grows in steps outgrows this too, and then gets the tail).
pub fn grown(requested: u64) -> u64 {
    round_to_pages((requested as f64 * BLIND_SLACK).ceil() as u64)
}

/// The least a job that ran out of memory (`outgrown`) asks for next,
/// model or not: what it tried to grow to (and `BLIND_SLACK` more), and
/// twice its limit, that doubling stopping at `tail` (the largest peak
/// known × the margin) while the job is under it.
pub fn retry_floor(outgrown: Outgrown, tail: Option<u64>) -> u64 {
    let grown = grown(outgrown.requested);
    let twice = outgrown.limit.saturating_mul(2);
    match tail {
        Some(t) if t > outgrown.limit && t > grown => twice.min(t).max(grown),
        _ => twice.max(grown),
    }
}

/// What a job that ran out of memory said of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outgrown {
    /// The limit it ran out of.
    pub limit: u64,
    /// What its memory tried to grow to.
    pub requested: u64,
    /// Whether it is its input's first time out of memory.
    pub first: bool,
}

/// One result: the input's size and the job's peak, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observation {
    /// What the submitter could see of the input before it ran (its stdin
    /// bytes, the files given to it).
    pub size: u64,
    /// The job's exact peak memory.
    pub peak: u64,
}

/// What the history says a job needs; see the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Model {
    /// `peak ≈ slope × size + intercept`, requests × `cover`.
    BySize {
        /// Bytes of peak per byte of input (≥ 0).
        slope: f64,
        /// Bytes of peak at size 0.
        intercept: f64,
        /// The requests' factor over the fit (≥ 1): the jobs' limits.
        cover: f64,
        /// The reserves' factor over the fit (≤ `cover`): what each job's
        /// worker reserves for it before it starts (0 in files saved before
        /// it existed: the whole request is reserved).
        #[serde(default)]
        center: f64,
        /// The largest `peak ÷ fit` seen: a retry asks for at least this.
        worst: f64,
        /// The smallest input it was fitted to: a smaller one asks as this
        /// one would. Below the sizes seen, the line is a guess (a map that
        /// launches its largest inputs first fits its first results to
        /// those alone), and a guess too low costs a retry.
        #[serde(default)]
        smallest: u64,
        /// The largest input it was fitted to: a retry of one no larger
        /// asks for no more than the largest peak known × the margin
        /// (0 in files saved before it existed: no such cap).
        #[serde(default)]
        largest: u64,
    },
    /// Size does not predict memory: `request` for every input, `tail`
    /// after one runs out of memory.
    Blind {
        /// Bytes every input asks for.
        request: u64,
        /// Bytes an input asks for after running out of `request`.
        tail: u64,
        /// Bytes each input's worker reserves before it starts (the
        /// [`RESERVE_QUANTILE`] of the peaks, at most `request`): past it
        /// the job grows on lent memory, up to `request`. 0 in files saved
        /// before it existed: the whole request is reserved.
        #[serde(default)]
        reserve: u64,
    },
}

impl Model {
    /// The line of a by-size model at `size` (at least a page).
    fn line(slope: f64, intercept: f64, size: u64) -> f64 {
        (slope * size as f64 + intercept).max(WASM_PAGE as f64)
    }

    /// The request for an input of `size` bytes (whole pages).
    pub fn request(&self, size: u64) -> u64 {
        match *self {
            Model::BySize {
                slope,
                intercept,
                cover,
                smallest,
                ..
            } => round_to_pages(
                (Model::line(slope, intercept, size.max(smallest)) * cover).ceil() as u64,
            ),
            Model::Blind { request, .. } => request,
        }
    }

    /// What the worker should reserve for an input of `size` bytes before
    /// it starts, if less than [`request`](Self::request) (whole pages):
    /// the line × `center`; for a blind model, its `reserve` (the peaks'
    /// middle). `None` for a model saved without one.
    pub fn reserve(&self, size: u64) -> Option<u64> {
        match *self {
            Model::BySize {
                slope,
                intercept,
                center,
                smallest,
                ..
            } if center > 0.0 => Some(
                round_to_pages(
                    (Model::line(slope, intercept, size.max(smallest)) * center).ceil() as u64,
                )
                .min(self.request(size)),
            ),
            Model::Blind {
                request, reserve, ..
            } if reserve > 0 => Some(reserve.min(request)),
            _ => None,
        }
    }

    /// The request for an input of `size` that ran out of memory
    /// (`outgrown`), when the largest peak known × the margin is `tail`
    /// (`None` before any): never less than [`retry_floor`]; for a by-size
    /// model, what its worst ratio says an input of its size may need (no
    /// more than `tail` within the sizes it was fitted to); for a blind
    /// one, its own tail once the input has outgrown a retry too. A job
    /// that takes its memory in one allocation (most do: a buffer, an
    /// array) needs one retry.
    pub fn retry(&self, size: u64, outgrown: Outgrown, margin: f64, tail: Option<u64>) -> u64 {
        let floor = retry_floor(outgrown, tail);
        let tail = tail.filter(|&t| t >= floor);
        let model = match *self {
            Model::BySize {
                slope,
                intercept,
                worst,
                smallest,
                largest,
                ..
            } => {
                let need = (Model::line(slope, intercept, size.max(smallest)) * worst * margin)
                    .ceil() as u64;
                match tail {
                    Some(t) if size <= largest => need.min(t),
                    _ => need,
                }
            }
            Model::Blind { tail, .. } if !outgrown.first => tail,
            Model::Blind { .. } => 0,
        };
        round_to_pages(model.max(floor))
    }

    /// What was learned, in words: `peak ≈ 8.1 × input bytes + 3.0 MiB
    /// (requests cover it × 1.06)`, or `peak does not follow input size:
    /// 10.0 MiB per job, 200.0 MiB after a memory limit`.
    pub fn describe(&self) -> String {
        let mib = |b: f64| format!("{:.1} MiB", b / (1u64 << 20) as f64);
        match *self {
            Model::BySize {
                slope,
                intercept,
                cover,
                center,
                ..
            } => {
                let sign = if intercept < 0.0 { "−" } else { "+" };
                let reserve = if center > 0.0 {
                    format!(", reserve × {center:.2}")
                } else {
                    String::new()
                };
                format!(
                    "peak ≈ {slope:.2} × input bytes {sign} {} (requests cover it × {cover:.2}{reserve})",
                    mib(intercept.abs())
                )
            }
            Model::Blind {
                request,
                tail,
                reserve,
            } => {
                let reserved = if reserve > 0 && reserve < request {
                    format!(" (reserve {})", mib(reserve as f64))
                } else {
                    String::new()
                };
                format!(
                    "peak does not follow input size: {} per job{reserved}, {} after a memory limit",
                    mib(request as f64),
                    mib(tail as f64)
                )
            }
        }
    }
}

/// Fits both models to `obs` (at least [`MIN_OBSERVATIONS`]) and returns
/// the one that would have reserved less for them; `margin` pads the
/// blind model's tail, which is at least `largest` (the largest peak known,
/// beyond `obs`: an earlier run's, or one that left the window) × the
/// margin. `None` with too few observations.
pub fn fit(obs: &[Observation], margin: f64, largest: u64) -> Option<Model> {
    if obs.len() < MIN_OBSERVATIONS {
        return None;
    }
    let blind = fit_blind(obs, margin, largest);
    let Some(by_size) = fit_by_size(obs) else {
        return Some(blind);
    };
    // No request need be over the largest peak seen × the margin: an
    // input the line would ask the moon for (a huge one with a tiny peak)
    // costs no more than that.
    let Model::Blind { tail, .. } = blind else {
        unreachable!("fit_blind makes a blind model")
    };
    Some(
        if cost(&by_size, obs, margin, tail) < cost(&blind, obs, margin, tail) {
            by_size
        } else {
            blind
        },
    )
}

/// What `model` would have reserved for `obs`: every request (at most
/// `cap`), plus the retry of each input it was too small for (as if it
/// had tried to grow straight to its peak), plus `retry_overhead` per retry.
pub fn cost(model: &Model, obs: &[Observation], margin: f64, cap: u64) -> f64 {
    let overhead = retry_overhead(obs);
    obs.iter()
        .map(|o| {
            let asked = model.request(o.size).min(cap);
            let retry = if o.peak > asked {
                let outgrown = Outgrown {
                    limit: asked,
                    requested: o.peak,
                    first: true,
                };
                model
                    .retry(o.size, outgrown, margin, Some(cap))
                    .min(cap.max(o.peak)) as f64
                    + overhead
            } else {
                0.0
            };
            asked as f64 + retry
        })
        .sum()
}

/// What a retry costs beyond its request, in bytes: the median peak (a
/// retry is one more job to place, and its first attempt's work is lost).
fn retry_overhead(obs: &[Observation]) -> f64 {
    let mut peaks: Vec<f64> = obs.iter().map(|o| o.peak as f64).collect();
    median(&mut peaks)
}

fn fit_blind(obs: &[Observation], margin: f64, largest: u64) -> Model {
    let mut peaks: Vec<u64> = obs.iter().map(|o| o.peak).collect();
    peaks.sort_unstable();
    let largest = (*peaks.last().expect("at least one observation")).max(largest);
    let tail = round_to_pages((largest as f64 * margin).ceil() as u64);
    // Asking for peaks[k] (a little over: pages) covers the k+1 smallest;
    // the others run again (see `cost`). The cheapest wins.
    let sorted: Vec<f64> = peaks.iter().map(|&p| p as f64).collect();
    let center = round_to_pages(quantile(&sorted, RESERVE_QUANTILE).ceil() as u64);
    let mut best: Option<(f64, Model)> = None;
    let mut last = 0;
    for &peak in &peaks {
        let request = round_to_pages((peak as f64 * BLIND_SLACK).ceil() as u64).min(tail);
        if request == last {
            continue;
        }
        last = request;
        let model = Model::Blind {
            request,
            tail,
            reserve: center.min(request),
        };
        let cost = cost(&model, obs, margin, tail);
        if best.as_ref().is_none_or(|(c, _)| cost < *c) {
            best = Some((cost, model));
        }
    }
    best.map_or(
        Model::Blind {
            request: tail,
            tail,
            reserve: center.min(tail),
        },
        |(_, m)| m,
    )
}

fn fit_by_size(obs: &[Observation]) -> Option<Model> {
    let n = obs.len();
    let mut slopes = Vec::with_capacity(SLOPE_PAIRS.min(n * (n - 1) / 2));
    // Every pair when there are few, else a spread of them: pair i with
    // i + 1 + (k·stride mod n−1), deterministic.
    let pairs = n * (n - 1) / 2;
    if pairs <= SLOPE_PAIRS {
        for i in 0..n {
            for j in i + 1..n {
                push_slope(&mut slopes, obs[i], obs[j]);
            }
        }
    } else {
        for k in 0..SLOPE_PAIRS {
            let i = (k * 7919) % n;
            let j = (i + 1 + (k * 104_729) % (n - 1)) % n;
            push_slope(&mut slopes, obs[i], obs[j]);
        }
    }
    if slopes.is_empty() {
        return None; // every input the same size: size cannot tell them apart
    }
    let slope = median(&mut slopes).max(0.0);
    let mut rests: Vec<f64> = obs
        .iter()
        .map(|o| o.peak as f64 - slope * o.size as f64)
        .collect();
    let intercept = median(&mut rests);
    let mut ratios: Vec<f64> = obs
        .iter()
        .map(|o| o.peak as f64 / Model::line(slope, intercept, o.size))
        .collect();
    ratios.sort_unstable_by(f64::total_cmp);
    let cover = quantile(&ratios, COVER_QUANTILE).max(1.0);
    let center = quantile(&ratios, RESERVE_QUANTILE).min(cover);
    let worst = ratios.last().copied().unwrap_or(1.0).max(cover);
    let smallest = obs.iter().map(|o| o.size).min().unwrap_or(0);
    let largest = obs.iter().map(|o| o.size).max().unwrap_or(0);
    Some(Model::BySize {
        slope,
        intercept,
        cover,
        center,
        worst,
        smallest,
        largest,
    })
}

fn push_slope(slopes: &mut Vec<f64>, a: Observation, b: Observation) {
    if a.size != b.size {
        slopes.push((b.peak as f64 - a.peak as f64) / (b.size as f64 - a.size as f64));
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_unstable_by(f64::total_cmp);
    quantile(v, 0.5)
}

/// The `q` quantile of sorted `v` (nearest rank).
fn quantile(v: &[f64], q: f64) -> f64 {
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

#[cfg(test)]
mod tests;
