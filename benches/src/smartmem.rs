//! Smartmem against an oracle: a map whose jobs' memory peaks are heavy
//! tailed (memhog sizes drawn log-normal around 8 MiB, and every 25th input
//! 20× the median) over two workers whose memory, not their slots, bounds
//! how many run at once — once with the memory learned as the map goes
//! (`map` without `--mem`), once placed by an oracle that knew every job's
//! peak in advance and asked for exactly it. Printed: makespan (and the
//! throughput ratio), memory-seconds reserved against used, and how often
//! a job was run again because its estimate was too small.

use std::time::{Duration, Instant};

use futures::StreamExt;
use peerwasm::client::{Job, MapConfig, MapItem, Target, map};
use rand::{Rng, SeedableRng};

use crate::Sizes;
use crate::procs::Worker;
use crate::summary::Summary;

const MIB: u64 = 1 << 20;

pub fn smartmem(sizes: &Sizes, summary: &mut Summary) -> anyhow::Result<()> {
    let n = sizes.smartmem_inputs;
    let dir = tempfile::tempdir()?;
    // 512 MiB and 8 slots each: memory is what bounds them.
    let extra = ["--slot-processes", "never", "--host-ledger", "none"];
    let w1 = Worker::start_with("512MiB", 8, &dir.path().join("w1"), None, &extra)?;
    let w2 = Worker::start_with("512MiB", 8, &dir.path().join("w2"), Some(&w1.addr), &extra)?;
    w1.wait_for_peers(2)?;
    let mibs = draw(n);
    let median = {
        let mut m = mibs.clone();
        m.sort();
        m[n / 2]
    };
    println!(
        "\n## Smartmem against an oracle: {n} memhog jobs of {}–{} MiB (median {median} MiB), two workers of 512 MiB × 8 slots",
        mibs.iter().min().unwrap(),
        mibs.iter().max().unwrap()
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let target = Target::pool(vec![w1.addr.clone(), w2.addr.clone()])?;
    let memhog = Job::new(peerwasm_testkit::guest_wasm_bytes("memhog"));
    let inputs: Vec<Vec<u8>> = mibs.iter().map(|m| m.to_string().into_bytes()).collect();
    // Warm both workers — their module caches and the memory their jobs
    // touch (the first time a worker's jobs touch 160 MiB costs more than
    // every later time): the whole map once, untimed, at a fixed request.
    let warm = MapConfig {
        estimates: None,
        mem: Some((256 * MIB).into()),
        ..MapConfig::default()
    };
    runtime.block_on(map(
        &target,
        &memhog,
        inputs.clone(),
        &warm,
        &mut Vec::new(),
    ))?;

    // Smartmem: the map learns from each result's exact peak.
    let start = Instant::now();
    let mut items: Vec<MapItem> = Vec::new();
    let config = MapConfig {
        estimates: None,
        ..MapConfig::default()
    };
    let learned = runtime.block_on(map(&target, &memhog, inputs.clone(), &config, &mut items))?;
    let smart_time = start.elapsed();
    anyhow::ensure!(
        items.iter().all(MapItem::succeeded),
        "a smartmem job failed"
    );
    let peaks: Vec<u64> = items.iter().map(|i| i.result.peak_memory_bytes).collect();
    let wrong = items.iter().filter(|i| i.attempts > 1).count();
    let retries: u32 = items.iter().map(|i| i.attempts - 1).sum();
    let smart = Usage::of(items.iter().map(|i| &i.result));

    // The oracle: each job asks for exactly its peak (rounded to pages),
    // as many under way as the map keeps.
    let (oracle_time, oracle_results) = oracle(&runtime, &target, &memhog, &inputs, &peaks)?;
    let oracle = Usage::of(oracle_results.iter());

    let ratio = oracle_time.as_secs_f64() / smart_time.as_secs_f64();
    println!(
        "| placement | makespan | GiB·s reserved | GiB·s used | used ÷ reserved | jobs run again |"
    );
    println!("|---|---|---|---|---|---|");
    let row = |name: &str, t: Duration, u: &Usage, again: String| {
        println!(
            "| {name} | {:.2} s | {:.2} | {:.2} | {:.0}% | {again} |",
            t.as_secs_f64(),
            u.reserved,
            u.used,
            100.0 * u.used / u.reserved.max(1e-9)
        )
    };
    row(
        "smartmem (`map`, memory learned)",
        smart_time,
        &smart,
        format!("{wrong} inputs, {retries} retries"),
    );
    row(
        "oracle (every peak known)",
        oracle_time,
        &oracle,
        "0".into(),
    );
    println!(
        "(smartmem's throughput is {:.0}% of the oracle's; {} retries per input whose estimate was too small; learned request {})",
        100.0 * ratio,
        if wrong == 0 {
            "no".to_string()
        } else {
            format!("{:.2}", retries as f64 / wrong as f64)
        },
        learned
            .learned_request
            .map_or("-".into(), |r| format!("{} MiB", r.bytes() / MIB))
    );
    summary.goal(
        "smartmem vs an oracle that knew every peak (heavy-tailed memhog map)",
        format!(
            "{:.0}% of its throughput, {retries} retries for {wrong} inputs",
            100.0 * ratio
        ),
        "≥ 90%, ≤ 1 retry per wrong estimate",
        ratio >= 0.9 && (wrong == 0 || retries as usize <= wrong),
        None,
    );
    Ok(())
}

/// Runs each input asking for exactly its peak (rounded to pages), as many
/// under way as a map keeps: the oracle. Its makespan and results.
pub(crate) fn oracle(
    runtime: &tokio::runtime::Runtime,
    target: &Target,
    job: &Job,
    inputs: &[Vec<u8>],
    peaks: &[u64],
) -> anyhow::Result<(Duration, Vec<peerwasm::proto::JobResult>)> {
    let start = Instant::now();
    let results = runtime.block_on(async {
        futures::stream::iter(inputs.iter().zip(peaks))
            .map(|(input, &peak)| {
                let (target, job) = (target.clone(), job.clone());
                let asked = peak.div_ceil(64 << 10) * (64 << 10);
                async move {
                    // A job lost with its connection (a worker refusing a
                    // body over its request budget closes it) runs again,
                    // as `map` would run it.
                    let mut tries = 0;
                    loop {
                        match target.run(&job, job.spec(input.clone(), asked)).await {
                            Err(peerwasm::client::SubmitError::Lost { .. }) if tries < 5 => {
                                tries += 1
                            }
                            other => return other,
                        }
                    }
                }
            })
            .buffer_unordered(64)
            .collect::<Vec<_>>()
            .await
    });
    let makespan = start.elapsed();
    let results: Vec<_> = results.into_iter().collect::<Result<_, _>>()?;
    anyhow::ensure!(
        results.iter().all(|r| r.outcome.is_success()),
        "an oracle job failed"
    );
    Ok((makespan, results))
}

/// Memory-seconds of a run's jobs: reserved (limit × wall) and used (peak ×
/// wall), in GiB·s.
pub(crate) struct Usage {
    pub reserved: f64,
    pub used: f64,
}

impl Usage {
    pub(crate) fn of<'r>(results: impl Iterator<Item = &'r peerwasm::proto::JobResult>) -> Usage {
        Usage::reserving(results.map(|r| (r, None)))
    }

    /// As [`of`](Self::of), for results that ran under a reserve: the
    /// worker held the reserve, or the peak when it lent past it.
    pub(crate) fn reserving<'r>(
        results: impl Iterator<Item = (&'r peerwasm::proto::JobResult, Option<u64>)>,
    ) -> Usage {
        let gib_s = |bytes: u64, us: u64| bytes as f64 / (1u64 << 30) as f64 * us as f64 / 1e6;
        let (mut reserved, mut used) = (0.0, 0.0);
        for (r, reserve) in results {
            let held = reserve.map_or(r.memory_limit_bytes, |v| v.max(r.peak_memory_bytes));
            reserved += gib_s(held, r.wall_time_us);
            used += gib_s(r.peak_memory_bytes, r.wall_time_us);
        }
        Usage { reserved, used }
    }
}

/// `n` memhog sizes in MiB: log-normal around 8 MiB (σ 0.6), every 25th
/// input 20× the median; seeded, so every run draws the same.
fn draw(n: usize) -> Vec<u64> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
    (0..n)
        .map(|i| {
            if i % 25 == 12 {
                return 160;
            }
            // Box–Muller: a standard normal from two uniforms.
            let (u, v): (f64, f64) = (rng.random::<f64>().max(1e-12), rng.random());
            let z = (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos();
            (8.0 * (0.6 * z).exp()).round().clamp(1.0, 120.0) as u64
        })
        .collect()
}
