//! peerwasm benchmarks: figures and ratios measured side by side in one run.
//!
//! `cargo run --release -p peerwasm-benches` runs them all and prints a
//! table; `-- --quick` runs a smoke-sized version (seconds). See README.md
//! in this folder for the recorded figures.

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
        Sizes { trivial_jobs: 5_000, primes_n: 50_000_000, reps: 7 }
    };
    println!("peerwasm benchmarks{} — {} cores", if quick { " (quick)" } else { "" }, cores());
    trivial(&sizes)?;
    compute(&sizes)?;
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
    println!("| allocator | µs/job (median of batches) | jobs/s |");
    println!("|---|---|---|");
    let mut figures = Vec::new();
    for pooling in [true, false] {
        let r = runner(pooling, TimeLimitMechanism::Epoch)?;
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
        println!("| {} | {us:.1} | {:.0} |", if pooling { "pooling" } else { "on-demand" }, 1e6 / us);
    }
    println!("pooling / on-demand: {:.2}×", figures[0] / figures[1]);
    Ok(())
}

/// `primes` as wasm vs the same function native, and the cost of each
/// time-limit mechanism.
fn compute(sizes: &Sizes) -> anyhow::Result<()> {
    let n = sizes.primes_n;
    println!("\n## Compute: primes below {n} (sieve), median of {} runs", sizes.reps);
    let native = median(
        (0..sizes.reps)
            .map(|_| {
                let t = Instant::now();
                std::hint::black_box(peerwasm_guest_examples::count_primes_below(std::hint::black_box(n)));
                t.elapsed()
            })
            .collect(),
    );
    println!("| variant | ms | vs native | vs no time limit |");
    println!("|---|---|---|---|");
    println!("| native (same crate, in-process) | {:.1} | 1.00× | |", ms(native));
    let mut off = None;
    for mech in [TimeLimitMechanism::Off, TimeLimitMechanism::Epoch, TimeLimitMechanism::Fuel] {
        let r = runner(true, mech)?;
        let spec = job(&r, "primes", &format!(r#"{{"n": {n}}}"#));
        let warm = r.run_blocking(spec.clone());
        anyhow::ensure!(warm.outcome.is_success(), "primes failed: {}", warm.outcome);
        let t = median(
            (0..sizes.reps)
                .map(|_| Duration::from_micros(r.run_blocking(spec.clone()).wall_time_us))
                .collect(),
        );
        let base = *off.get_or_insert(t);
        println!(
            "| wasm, time limit: {mech:?} | {:.1} | {:.2}× | {:.3}× |",
            ms(t),
            t.as_secs_f64() / native.as_secs_f64(),
            t.as_secs_f64() / base.as_secs_f64()
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
