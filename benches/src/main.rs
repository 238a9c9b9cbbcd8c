//! peerwasm benchmarks: figures and ratios measured side by side in one run.
//!
//! `cargo run --release -p peerwasm-benches` runs them all and prints a
//! table; `-- --quick` runs a smoke-sized version (seconds); names (`trivial`,
//! `compute`, `fairness`) select benchmarks. See README.md
//! in this folder for the recorded figures.

mod fairness;

use std::time::{Duration, Instant};

use peerwasm::proto::{JobSpec, Outcome};
use peerwasm::sandbox::{SandboxConfig, TimeLimitMechanism};
use peerwasm::worker::{JobRunner, RunnerConfig};

struct Sizes {
    trivial_jobs: usize,
    primes_n: u64,
    reps: usize,
}

fn main() -> anyhow::Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let sizes = if quick {
        Sizes { trivial_jobs: 200, primes_n: 2_000_000, reps: 3 }
    } else {
        Sizes { trivial_jobs: 5_000, primes_n: 10_000_000, reps: 15 }
    };
    println!("peerwasm benchmarks{} — {} cores", if quick { " (quick)" } else { "" }, cores());
    // Benchmark names given on the command line select which run.
    let only: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let wanted = |name: &str| only.is_empty() || only.iter().any(|o| o == name);
    if wanted("trivial") {
        trivial(&sizes)?;
    }
    if wanted("compute") {
        compute(&sizes)?;
    }
    if wanted("fairness") {
        fairness::fairness(quick)?;
    }
    Ok(())
}

fn cores() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

fn runner(pooling: bool, time_limit: TimeLimitMechanism) -> anyhow::Result<JobRunner> {
    JobRunner::new(RunnerConfig {
        sandbox: SandboxConfig { slots: cores(), pooling, time_limit, ..SandboxConfig::default() },
    })
}

fn job(runner: &JobRunner, guest: &str, stdin: &str) -> JobSpec {
    let mut spec = JobSpec::new(runner.add_module(peerwasm_testkit::guest_wasm_bytes(guest)));
    spec.stdin = stdin.as_bytes().to_vec();
    spec
}

/// A trivial job from the cache, one after another: instantiate + run.
fn trivial(sizes: &Sizes) -> anyhow::Result<()> {
    println!("\n## Trivial job from the module cache (hello, no args), sequential");
    println!("| allocator | time limit | µs/job (median of 5 batches) | jobs/s |");
    println!("|---|---|---|---|");
    let mut figures = Vec::new();
    for (pooling, mech) in [
        (true, TimeLimitMechanism::Fuel),
        (false, TimeLimitMechanism::Fuel),
        (true, TimeLimitMechanism::Epoch),
    ] {
        let r = runner(pooling, mech)?;
        let spec = job(&r, "hello", "");
        assert_eq!(r.run_blocking(spec.clone()).outcome, Outcome::Exited { code: 0 });
        let batch = sizes.trivial_jobs / 5;
        let mut per_job = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            for _ in 0..batch {
                let res = r.run_blocking(spec.clone());
                debug_assert!(res.outcome.is_success());
            }
            per_job.push(t.elapsed() / batch as u32);
        }
        let us = median(per_job).as_secs_f64() * 1e6;
        figures.push(us);
        let alloc = if pooling { "pooling" } else { "on-demand" };
        println!("| {alloc} | {mech:?} | {us:.1} | {:.0} |", 1e6 / us);
    }
    println!("pooling / on-demand: {:.2}×", figures[0] / figures[1]);
    Ok(())
}

/// `primes` as wasm vs the same function native, and the cost of each
/// time-limit mechanism. The variants run interleaved, round after round,
/// and each ratio is the median of per-round ratios: this machine's speed
/// drifts by tens of percent between minutes, much less within one round.
fn compute(sizes: &Sizes) -> anyhow::Result<()> {
    let n = sizes.primes_n;
    println!("\n## Compute: primes below {n} (sieve), {} interleaved rounds", sizes.reps);
    let mechs = [TimeLimitMechanism::Off, TimeLimitMechanism::Epoch, TimeLimitMechanism::Fuel];
    let mut variants = Vec::new();
    for mech in mechs {
        let r = runner(true, mech)?;
        let spec = job(&r, "primes", &format!(r#"{{"n": {n}}}"#));
        let warm = r.run_blocking(spec.clone());
        anyhow::ensure!(warm.outcome.is_success(), "primes failed: {}", warm.outcome);
        variants.push((mech, r, spec));
    }
    // times[0] is native, then one per mechanism.
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); 1 + mechs.len()];
    for _ in 0..sizes.reps {
        let t = Instant::now();
        std::hint::black_box(peerwasm_guest_examples::count_primes_below(std::hint::black_box(n)));
        times[0].push(t.elapsed());
        for (i, (_, r, spec)) in variants.iter().enumerate() {
            times[i + 1].push(Duration::from_micros(r.run_blocking(spec.clone()).wall_time_us));
        }
    }
    let ratio = |a: usize, b: usize| {
        let mut v: Vec<f64> =
            times[a].iter().zip(&times[b]).map(|(x, y)| x.as_secs_f64() / y.as_secs_f64()).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!("| variant | median ms | vs native | vs no time limit |");
    println!("|---|---|---|---|");
    println!("| native (same crate, in-process) | {:.1} | 1.00× | |", ms(median(times[0].clone())));
    for (i, mech) in mechs.iter().enumerate() {
        println!(
            "| wasm, time limit: {mech:?} | {:.1} | {:.2}× | {:.3}× |",
            ms(median(times[i + 1].clone())),
            ratio(i + 1, 0),
            ratio(i + 1, 1)
        );
    }
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}
