//! The sandbox alone (no HTTP, no client): what a trivial job costs from
//! the module cache, and kernels as wasm against the same Rust code native,
//! with each time-limit mechanism and in a slot process (a worker's way to
//! run long jobs with none).

use std::time::{Duration, Instant};

use peerwasm::proto::{JobSpec, Outcome};
use peerwasm::runner::slotproc::{SlotPolicy, SlotProcessConfig, SlotProgram};
use peerwasm::runner::{JobRunner, RunnerConfig};
use peerwasm::sandbox::{SandboxConfig, TimeLimitMechanism};

use crate::summary::Summary;
use crate::{Sizes, cores, median, ms};

pub fn runner(pooling: bool, time_limit: TimeLimitMechanism) -> anyhow::Result<JobRunner> {
    JobRunner::new(RunnerConfig {
        sandbox: SandboxConfig {
            slots: cores(),
            pooling,
            time_limit,
            ..SandboxConfig::default()
        },
        ..RunnerConfig::default()
    })
}

/// A worker's runner that sends every job to a slot process: this binary
/// as `peerwasm-benches peerwasm slot`.
pub fn slot_process_runner() -> anyhow::Result<JobRunner> {
    let program = SlotProgram {
        exe: std::env::current_exe()?,
        args: vec!["peerwasm".into(), "slot".into()],
    };
    JobRunner::new(RunnerConfig {
        sandbox: SandboxConfig {
            slots: cores(),
            ..SandboxConfig::default()
        },
        slot_processes: Some(SlotProcessConfig {
            program,
            policy: SlotPolicy::Always,
        }),
    })
}

pub fn job(runner: &JobRunner, guest: &str, stdin: &str) -> JobSpec {
    let mut spec = JobSpec::new(runner.add_module(peerwasm_testkit::guest_wasm_bytes(guest)));
    spec.stdin = stdin.as_bytes().to_vec();
    spec
}

/// `jobs` trivial jobs from the cache on the default runner, from one
/// caller per core: the in-process limit of dispatch, in jobs/s.
pub fn in_process_rate(jobs: usize) -> anyhow::Result<f64> {
    let r = runner(true, TimeLimitMechanism::Fuel)?;
    let spec = job(&r, "hello", "");
    anyhow::ensure!(
        r.run_blocking(spec.clone()).outcome == Outcome::Exited { code: 0 },
        "hello failed"
    );
    let callers = cores();
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..callers {
            s.spawn(|| {
                for _ in 0..jobs / callers {
                    let res = r.run_blocking(spec.clone());
                    assert!(res.outcome.is_success(), "hello failed: {}", res.outcome);
                }
            });
        }
    });
    Ok((jobs / callers * callers) as f64 / start.elapsed().as_secs_f64())
}

/// A trivial job from the cache, one after another: instantiate + run.
pub fn trivial(sizes: &Sizes, summary: &mut Summary) -> anyhow::Result<()> {
    println!("\n## Trivial job from the module cache (hello, no args), sequential, sandbox alone");
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
        anyhow::ensure!(
            r.run_blocking(spec.clone()).outcome == Outcome::Exited { code: 0 },
            "hello failed"
        );
        let batch = (sizes.trivial_jobs / 5).max(1);
        let mut per_job = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            for _ in 0..batch {
                let res = r.run_blocking(spec.clone());
                anyhow::ensure!(res.outcome.is_success(), "hello failed: {}", res.outcome);
            }
            per_job.push(t.elapsed() / batch as u32);
        }
        let us = median(per_job).as_secs_f64() * 1e6;
        figures.push(us);
        let alloc = if pooling { "pooling" } else { "on-demand" };
        println!("| {alloc} | {mech:?} | {us:.1} | {:.0} |", 1e6 / us);
    }
    println!("pooling / on-demand: {:.2}×", figures[0] / figures[1]);
    summary.goal(
        "trivial job from cache, sandbox alone",
        format!("{:.0} µs", figures[0]),
        "~30–60 µs",
        figures[0] <= 60.0,
        Some("`wasmtime run` starts a process per job (ms)"),
    );
    Ok(())
}

/// A kernel run both ways.
struct Kernel {
    name: String,
    guest: &'static str,
    stdin: String,
    native: Box<dyn Fn()>,
}

/// `primes` (CPU) and `memhog` (touches fresh memory) as wasm vs the same
/// function native, and the cost of each time-limit mechanism. The
/// variants run interleaved, round after round, and each ratio is the
/// median of per-round ratios: this machine's speed drifts by tens of
/// percent between minutes, much less within one round.
pub fn compute(sizes: &Sizes, summary: &mut Summary) -> anyhow::Result<()> {
    let (n, mib) = (sizes.primes_n, sizes.hog_mib);
    let kernels = [
        Kernel {
            name: format!("primes below {n} (sieve)"),
            guest: "primes",
            stdin: format!(r#"{{"n": {n}}}"#),
            native: Box::new(move || {
                std::hint::black_box(peerwasm_guest_examples::count_primes_below(
                    std::hint::black_box(n),
                ));
            }),
        },
        Kernel {
            name: format!("memhog {mib} MiB (allocate, touch every page)"),
            guest: "memhog",
            stdin: mib.to_string(),
            native: Box::new(move || {
                std::hint::black_box(peerwasm_guest_examples::hog(std::hint::black_box(mib)));
            }),
        },
    ];
    let mechs = [
        TimeLimitMechanism::Off,
        TimeLimitMechanism::Epoch,
        TimeLimitMechanism::Fuel,
    ];
    let mut runners: Vec<JobRunner> = mechs
        .iter()
        .map(|&m| runner(true, m))
        .collect::<anyhow::Result<_>>()?;
    runners.push(slot_process_runner()?);
    let variants = [
        "time limit: Off (`peerwasm run`)",
        "time limit: Epoch",
        "time limit: Fuel (in-process)",
        "slot process (a worker's long jobs)",
    ];
    for kernel in &kernels {
        println!(
            "\n## Compute: {}, {} interleaved rounds",
            kernel.name, sizes.compute_rounds
        );
        let mut specs = Vec::new();
        for r in &runners {
            let mut spec = job(r, kernel.guest, &kernel.stdin);
            spec.limits.memory = peerwasm::proto::MemoryRequest::from((mib + 64) << 20);
            let warm = r.run_blocking(spec.clone());
            anyhow::ensure!(
                warm.outcome.is_success(),
                "{} failed: {}",
                kernel.guest,
                warm.outcome
            );
            specs.push(spec);
        }
        // times[0] is native, then one per variant, each timed by its
        // caller: a slot process's hand-off counts.
        let mut times: Vec<Vec<Duration>> = vec![Vec::new(); 1 + runners.len()];
        for _ in 0..sizes.compute_rounds {
            let t = Instant::now();
            (kernel.native)();
            times[0].push(t.elapsed());
            for (i, (r, spec)) in runners.iter().zip(&specs).enumerate() {
                let t = Instant::now();
                let res = r.run_blocking(spec.clone());
                times[i + 1].push(t.elapsed());
                anyhow::ensure!(
                    res.outcome.is_success(),
                    "{} failed: {}",
                    kernel.guest,
                    res.outcome
                );
            }
        }
        let ratio = |a: usize, b: usize| {
            let v = times[a]
                .iter()
                .zip(&times[b])
                .map(|(x, y)| Ratio(x.as_secs_f64() / y.as_secs_f64()))
                .collect();
            median(v).0
        };
        println!("| variant | median ms | vs native | vs no time limit |");
        println!("|---|---|---|---|");
        println!(
            "| native (same crate, in-process) | {:.1} | 1.00× | |",
            ms(median(times[0].clone()))
        );
        for (i, variant) in variants.iter().enumerate() {
            println!(
                "| wasm, {variant} | {:.1} | {:.2}× | {:.3}× |",
                ms(median(times[i + 1].clone())),
                ratio(i + 1, 0),
                ratio(i + 1, 1)
            );
        }
        let (vs_native, fuel_cost, slot_cost) = (ratio(3, 0), ratio(3, 1), ratio(4, 1));
        summary.goal(
            format!("{}: wasm (fuel) vs native", kernel.guest),
            format!("{vs_native:.2}×"),
            "≤ 1.25×",
            vs_native <= 1.25,
            None,
        );
        summary.figure(
            format!(
                "{}: cost of the time limit, fuel in the worker's process (short jobs)",
                kernel.guest
            ),
            format!("{:+.1}%", (fuel_cost - 1.0) * 100.0),
            None,
        );
        summary.goal(
            // `peerwasm run` has none: see the anchors' time-limited row.
            format!(
                "{}: cost of the time limit on a worker (slot process)",
                kernel.guest
            ),
            format!("{:+.1}%", (slot_cost - 1.0) * 100.0),
            "≤ 5%",
            slot_cost <= 1.05,
            None,
        );
    }
    Ok(())
}

/// An `f64` that sorts (ratios are never NaN here).
#[derive(Clone, Copy, PartialEq)]
pub struct Ratio(pub f64);

impl Eq for Ratio {}

impl PartialOrd for Ratio {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ratio {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}
