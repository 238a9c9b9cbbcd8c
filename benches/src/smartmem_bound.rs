//! Smartmem where memory is the bottleneck: jobs that allocate, then hold
//! their memory while they wait (as I/O-bound analyses do: the `hold`
//! guest sleeps 300 ms holding it), on two workers of 256 MiB × 16 slots —
//! so what each job reserves, not the cores, bounds how many run at once.
//!
//! Two workloads, each against an oracle that asks for every job's exact
//! peak, in the same run:
//! * (a) peak proportional to the input's size, with noise: inputs of
//!   ~1 MiB (every 25th 10 MiB), each held ×15 (±10%): peaks ~16 MiB and
//!   ~160 MiB;
//! * (b) heavy tailed and unrelated to the input's size (the `smartmem`
//!   mix): peaks log-normal around 8 MiB, every 25th 160 MiB, inputs of
//!   random small sizes.
//!
//! For each: a first map of the module with nothing learned (reported),
//! then the next map of the same module, which starts from what the first
//! saved (the measured run), then the oracle — the same `map`, told each
//! input's exact peak (`MapConfig::mem_per_input`). Printed per run: makespan,
//! GiB·s reserved and used, used ÷ reserved, attempts per input, and what
//! was learned.

use std::time::{Duration, Instant};

use peerwasm::client::estimate::EstimateStore;
use peerwasm::client::{Job, MapConfig, MapItem, Target, map};
use peerwasm::proto::MemoryRequest;
use rand::{Rng, SeedableRng};

use crate::Sizes;
use crate::procs::Worker;
use crate::smartmem::Usage;
use crate::summary::Summary;

const MIB: u64 = 1 << 20;

/// One workload: its name, its inputs, and whether it must meet (a)'s
/// goals or (b)'s.
struct Workload {
    name: &'static str,
    inputs: Vec<Vec<u8>>,
    follows_size: bool,
}

pub fn memory_bound(sizes: &Sizes, summary: &mut Summary) -> anyhow::Result<()> {
    let n = sizes.smartmem_bound_inputs;
    let hold_ms = sizes.smartmem_hold_ms;
    let dir = tempfile::tempdir()?;
    let extra = ["--slot-processes", "never", "--host-ledger", "none"];
    let w1 = Worker::start_with("256MiB", 16, &dir.path().join("w1"), None, &extra)?;
    let w2 = Worker::start_with("256MiB", 16, &dir.path().join("w2"), Some(&w1.addr), &extra)?;
    w1.wait_for_peers(2)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let target = Target::pool(vec![w1.addr.clone(), w2.addr.clone()])?;
    let hold = Job::new(peerwasm_testkit::guest_wasm_bytes("hold"));
    println!(
        "\n## Smartmem where memory is the bottleneck: {n} jobs holding their memory {hold_ms} ms, two workers of 256 MiB × 16 slots"
    );
    println!(
        "| workload | run | makespan | GiB·s reserved | GiB·s used | used ÷ reserved | attempts per input | learned |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let mut pairs = Vec::new();
    for w in [proportional(n, hold_ms), unrelated(n, hold_ms)] {
        // Warm the workers' module caches (untimed, a fixed request).
        let warm = MapConfig {
            estimates: None,
            mem: Some((200 * MIB).into()),
            ..MapConfig::default()
        };
        runtime.block_on(map(
            &target,
            &hold,
            w.inputs[..4.min(n)].to_vec(),
            &warm,
            &mut Vec::new(),
        ))?;
        let store = EstimateStore::new(dir.path().join(format!("estimates-{}", w.name.len())));
        let learning = MapConfig {
            estimates: Some(store),
            ..MapConfig::default()
        };
        let first = run_map(&runtime, &target, &hold, &w.inputs, &learning)?;
        first.row(w.name, "first map (nothing learned)");
        // The next maps and the oracle, interleaved, `reps` times each:
        // the median of each (a loaded 2-core machine moves one run by
        // a second).
        let (mut nexts, mut oracles) = (Vec::new(), Vec::new());
        for _ in 0..sizes.reps {
            let next = run_map(&runtime, &target, &hold, &w.inputs, &learning)?;
            oracles.push(run_oracle(
                &runtime,
                &target,
                &hold,
                &w.inputs,
                &next.peaks,
            )?);
            nexts.push(next);
        }
        // The goal's ratio: the median over the pairs, each next map
        // against the oracle run right after it (the machine's load
        // drifts between pairs more than within one).
        let mut ratios: Vec<f64> = nexts
            .iter()
            .zip(&oracles)
            .map(|(n, o)| o.makespan.as_secs_f64() / n.makespan.as_secs_f64())
            .collect();
        ratios.sort_by(f64::total_cmp);
        let ratio = ratios[ratios.len() / 2];
        let (next, oracle) = (median_run(nexts), median_run(oracles));
        next.row(
            w.name,
            &format!(
                "next map (starts from the first's), median of {}",
                sizes.reps
            ),
        );
        oracle.row(
            w.name,
            &format!("oracle (every peak known), median of {}", sizes.reps),
        );
        pairs.push(format!(
            "({}: each next map's throughput against the oracle run right after it: {})",
            w.name,
            ratios
                .iter()
                .map(|r| format!("{:.0}%", 100.0 * r))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        let used = next.usage.used / next.usage.reserved.max(1e-9);
        let attempts = next.attempts as f64 / n as f64;
        let (wrong, retries) = (next.wrong, next.attempts - n);
        if w.follows_size {
            summary.goal(
                "smartmem (a): peak follows the input's size, memory-bound",
                format!("{:.0}% of the oracle's throughput, used ÷ reserved {:.0}%, {attempts:.2} attempts per input", 100.0 * ratio, 100.0 * used),
                "≥ 95%, ≥ 75%, ≤ 1.1",
                ratio >= 0.95 && used >= 0.75 && attempts <= 1.1,
                None,
            );
        } else {
            summary.goal(
                "smartmem (b): heavy tail unrelated to the input, memory-bound",
                format!(
                    "{:.0}% of the oracle's throughput, {retries} retries for {wrong} inputs",
                    100.0 * ratio
                ),
                "≥ 80%, ≤ 1 retry per wrong estimate",
                ratio >= 0.8 && retries <= wrong,
                None,
            );
        }
    }
    for p in pairs {
        println!("{p}");
    }
    Ok(())
}

/// What one run came to.
struct Run {
    makespan: Duration,
    usage: Usage,
    attempts: usize,
    wrong: usize,
    peaks: Vec<u64>,
    learned: String,
    /// Inputs run again for memory (not those lost with a connection).
    memory_retries: u64,
}

impl Run {
    fn row(&self, workload: &str, run: &str) {
        let n = self.peaks.len().max(1);
        println!(
            "| {workload} | {run} | {:.2} s | {:.2} | {:.2} | {:.0}% | {:.2} | {} |",
            self.makespan.as_secs_f64(),
            self.usage.reserved,
            self.usage.used,
            100.0 * self.usage.used / self.usage.reserved.max(1e-9),
            self.attempts as f64 / n as f64,
            self.learned
        );
    }
}

/// The run of median makespan.
fn median_run(mut runs: Vec<Run>) -> Run {
    runs.sort_by_key(|r| r.makespan);
    runs.swap_remove(runs.len() / 2)
}

fn run_map(
    runtime: &tokio::runtime::Runtime,
    target: &Target,
    job: &Job,
    inputs: &[Vec<u8>],
    config: &MapConfig,
) -> anyhow::Result<Run> {
    let start = Instant::now();
    let mut items: Vec<MapItem> = Vec::new();
    let summary = runtime.block_on(map(target, job, inputs.to_vec(), config, &mut items))?;
    let makespan = start.elapsed();
    anyhow::ensure!(
        items.iter().all(MapItem::succeeded),
        "a job of the map failed"
    );
    Ok(Run {
        makespan,
        usage: Usage::reserving(
            items
                .iter()
                .map(|i| (&i.result, i.reserve.map(|r| r.bytes()))),
        ),
        attempts: items.iter().map(|i| i.attempts as usize).sum(),
        wrong: items.iter().filter(|i| i.attempts > 1).count(),
        peaks: items.iter().map(|i| i.result.peak_memory_bytes).collect(),
        learned: summary.learned_model.map_or("-".into(), |m| m.describe()),
        memory_retries: summary.memory_retries as u64,
    })
}

/// Each job asks for exactly its peak (rounded up to 64 KiB), through the
/// same `map` — the same window, batches and largest-first order — so the
/// two runs differ only in what each job asks for.
fn run_oracle(
    runtime: &tokio::runtime::Runtime,
    target: &Target,
    job: &Job,
    inputs: &[Vec<u8>],
    peaks: &[u64],
) -> anyhow::Result<Run> {
    let exact: Vec<MemoryRequest> = peaks
        .iter()
        .map(|p| MemoryRequest::from(p.div_ceil(64 << 10) * (64 << 10)))
        .collect();
    let config = MapConfig {
        mem_per_input: Some(exact.into()),
        ..MapConfig::default()
    };
    let run = run_map(runtime, target, job, inputs, &config)?;
    anyhow::ensure!(
        run.memory_retries == 0,
        "an oracle job ran out of its exact peak"
    );
    Ok(Run {
        learned: "-".into(),
        ..run
    })
}

/// (a): inputs of ~1 MiB (log-normal, σ 0.5; every 25th 10 MiB), each
/// held ×15 ± 10%.
fn proportional(n: usize, hold_ms: u64) -> Workload {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xa11ce);
    let inputs = (0..n)
        .map(|i| {
            let kib = if i % 25 == 12 {
                10 << 10
            } else {
                (1024.0 * (0.5 * normal(&mut rng)).exp())
                    .round()
                    .clamp(64.0, 4096.0) as usize
            };
            let factor = 15.0 * (0.9 + 0.2 * rng.random::<f64>());
            let mut input = format!("{hold_ms} x{factor:.3}\n").into_bytes();
            input.resize(input.len() + (kib << 10), b'a');
            input
        })
        .collect();
    Workload {
        name: "(a) peak ∝ input size",
        inputs,
        follows_size: true,
    }
}

/// (b): peaks log-normal around 8 MiB (σ 0.6), every 25th 160 MiB, whatever
/// the input's size (a few random KiB).
fn unrelated(n: usize, hold_ms: u64) -> Workload {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
    let inputs = (0..n)
        .map(|i| {
            let mib = if i % 25 == 12 {
                160
            } else {
                (8.0 * (0.6 * normal(&mut rng)).exp())
                    .round()
                    .clamp(1.0, 120.0) as u64
            };
            let mut input = format!("{hold_ms} {mib}\n").into_bytes();
            input.resize(input.len() + rng.random_range(0..64 << 10), b'b');
            input
        })
        .collect();
    Workload {
        name: "(b) heavy tail, unrelated",
        inputs,
        follows_size: false,
    }
}

/// A standard normal (Box–Muller).
fn normal(rng: &mut impl Rng) -> f64 {
    let (u, v): (f64, f64) = (rng.random::<f64>().max(1e-12), rng.random());
    (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
}
