//! peerwasm benchmarks: figures and ratios measured side by side in one run.
//!
//! `cargo run --release -p peerwasm-benches` runs them all and prints a
//! table per benchmark, then a summary against the goals of DESIGN.md and
//! the anchors (Ray, Dask, Slurm, FieldTrip); `-- --quick` runs a
//! smoke-sized version (seconds, what CI runs); names select benchmarks.
//! README.md in this folder has the recorded figures.
//!
//! Layout, one benchmark a file:
//! * [`dispatch`] — trivial jobs through `map`: embedded, one worker, two
//!   workers, against the sandbox alone and one native process per input;
//! * [`latency`] — `peerwasm run` of a cached trivial job, whole command;
//! * [`compute`] — the sandbox alone: trivial job cost, and kernels as
//!   wasm vs native with each time-limit mechanism;
//! * [`cache`] — compile vs memory hit vs disk hit of a multi-MB module;
//! * [`gossip`] — the gossip core simulated at 1,000 and 10,000 nodes;
//! * [`files`] — a map's shared data shipped as `--dir` (once per worker)
//!   vs inlined in every input;
//! * [`submit`] — a map attached vs detached (`map --detach`), and the
//!   state database's commit cost per result;
//! * [`anchors`] — the wasmtime CLI, Ray and Dask, measured in the same
//!   run (installed into a benchmark venv; not with `--quick`);
//! * [`footprint`] — worker RSS idle, with jobs running, after many jobs;
//! * [`fairness`] — the smartshare seed's experiment, fair share on and off;
//! * [`elastic`] — `peerwasm adapt` against dask-jobqueue's adapt on a
//!   real Slurm (`tests/slurm/cluster.sh`; needs root; not with `--quick`);
//! * [`procs`] — real `peerwasm` processes (workers, commands);
//! * [`summary`] — the closing table.

mod anchors;
mod cache;
mod compute;
mod dispatch;
mod elastic;
mod fairness;
mod files;
mod footprint;
mod gossip;
mod hostledger;
mod latency;
mod procs;
mod python;
mod python_map;
mod smartmem;
mod smartmem_bound;
mod submit;
mod summary;

use std::process::ExitCode;
use std::time::Duration;

use summary::Summary;

/// How big each benchmark runs.
pub struct Sizes {
    /// Smoke-sized: seconds, not minutes.
    pub quick: bool,
    /// Repetitions of each timed whole command (the median is reported).
    pub reps: usize,
    /// Jobs per `map` in the dispatch benchmark.
    pub dispatch_jobs: usize,
    /// Runs of `peerwasm run` per latency figure.
    pub latency_runs: usize,
    /// Trivial jobs per sandbox-alone figure.
    pub trivial_jobs: usize,
    /// The sieve's bound in the compute benchmark.
    pub primes_n: u64,
    /// MiB touched by the memory-heavy kernel.
    pub hog_mib: u64,
    /// Interleaved rounds of the compute benchmark.
    pub compute_rounds: usize,
    /// Functions in the generated multi-MB module.
    pub big_module_functions: usize,
    /// Node counts of the gossip simulation.
    pub gossip_nodes: Vec<usize>,
    /// Trivial jobs between the footprint's RSS readings.
    pub footprint_jobs: usize,
    /// How long the footprint's jobs run while RSS is sampled.
    pub footprint_sleep_ms: u64,
    /// The fairness experiment's unit of work.
    pub fairness_unit_ms: u64,
    /// MiB of shared data in the files benchmark.
    pub files_data_mib: usize,
    /// Inputs of its maps.
    pub files_inputs: usize,
    /// Inputs of the submit benchmark's maps.
    pub submit_inputs: usize,
    /// Results stored by its database figure.
    pub submit_commits: usize,
    /// Reservations made by the host ledger's figure.
    pub ledger_cycles: usize,
    /// Inputs of the smartmem-against-an-oracle map.
    pub smartmem_inputs: usize,
    /// Inputs of each memory-bound smartmem workload.
    pub smartmem_bound_inputs: usize,
    /// How long each of their jobs holds its memory, in ms.
    pub smartmem_hold_ms: u64,
}

impl Sizes {
    fn full() -> Sizes {
        Sizes {
            quick: false,
            reps: 3,
            dispatch_jobs: 10_000,
            latency_runs: 100,
            trivial_jobs: 5_000,
            primes_n: 10_000_000,
            hog_mib: 256,
            compute_rounds: 15,
            big_module_functions: 20_000,
            gossip_nodes: vec![1_000, 10_000],
            footprint_jobs: 10_000,
            footprint_sleep_ms: 1500,
            fairness_unit_ms: 100,
            files_data_mib: 16,
            files_inputs: 100,
            submit_inputs: 5_000,
            submit_commits: 20_000,
            ledger_cycles: 20_000,
            smartmem_inputs: 500,
            smartmem_bound_inputs: 200,
            smartmem_hold_ms: 300,
        }
    }

    fn quick() -> Sizes {
        Sizes {
            quick: true,
            reps: 1,
            dispatch_jobs: 300,
            latency_runs: 5,
            trivial_jobs: 200,
            primes_n: 1_000_000,
            hog_mib: 16,
            compute_rounds: 3,
            big_module_functions: 500,
            gossip_nodes: vec![100],
            footprint_jobs: 200,
            footprint_sleep_ms: 300,
            fairness_unit_ms: 5,
            files_data_mib: 1,
            files_inputs: 10,
            submit_inputs: 100,
            submit_commits: 200,
            ledger_cycles: 500,
            smartmem_inputs: 50,
            smartmem_bound_inputs: 30,
            smartmem_hold_ms: 50,
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    // `peerwasm-benches peerwasm ARGS...` is the peerwasm command line: the
    // workers and commands under test are this binary in that role.
    if args.get(1).is_some_and(|a| a == "peerwasm") {
        return peerwasm::cli::main_from(&args[1..]);
    }
    match benchmarks(&args[1..]) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("peerwasm-benches: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The benchmarks, in the order of issue 8; names select a subset.
const NAMES: [&str; 16] = [
    "dispatch",
    "latency",
    "compute",
    "trivial",
    "cache",
    "gossip",
    "footprint",
    "fairness",
    "files",
    "submit",
    "hostledger",
    "smartmem",
    "python",
    "python-map",
    "anchors",
    "elastic",
];

fn benchmarks(args: &[String]) -> anyhow::Result<()> {
    let quick = args.iter().any(|a| a == "--quick");
    let only: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    if let Some(bad) = only.iter().find(|o| !NAMES.contains(&o.as_str())) {
        anyhow::bail!(
            "no benchmark named {bad:?}; the benchmarks are {}",
            NAMES.join(", ")
        );
    }
    let wanted = |name: &str| only.is_empty() || only.iter().any(|o| *o == name);
    let sizes = if quick { Sizes::quick() } else { Sizes::full() };
    let mut summary = Summary::default();
    println!(
        "peerwasm benchmarks{} — {} cores, commit {}",
        if quick { " (quick)" } else { "" },
        cores(),
        commit()
    );
    if wanted("dispatch") {
        dispatch::dispatch(&sizes, &mut summary)?;
    }
    if wanted("latency") {
        latency::latency(&sizes, &mut summary)?;
    }
    if wanted("trivial") {
        compute::trivial(&sizes, &mut summary)?;
    }
    if wanted("compute") {
        compute::compute(&sizes, &mut summary)?;
    }
    if wanted("cache") {
        cache::cache(&sizes, &mut summary)?;
    }
    if wanted("gossip") {
        gossip::gossip(&sizes, &mut summary)?;
    }
    if wanted("footprint") {
        footprint::footprint(&sizes, &mut summary)?;
    }
    if wanted("fairness") {
        fairness::fairness(&sizes, &mut summary)?;
    }
    if wanted("files") {
        files::files(&sizes, &mut summary)?;
    }
    if wanted("submit") {
        submit::submit(&sizes, &mut summary)?;
    }
    if wanted("hostledger") {
        hostledger::hostledger(&sizes, &mut summary)?;
    }
    if wanted("smartmem") {
        smartmem::smartmem(&sizes, &mut summary)?;
        smartmem_bound::memory_bound(&sizes, &mut summary)?;
    }
    if wanted("python") {
        python::python(&sizes, &mut summary)?;
    }
    if wanted("python-map") {
        python_map::python_map(&sizes, &mut summary)?;
    }
    if wanted("anchors") {
        anchors::anchors(&sizes, &mut summary)?;
    }
    if wanted("elastic") {
        elastic::elastic(&sizes, &mut summary)?;
    }
    summary.print();
    Ok(())
}

/// The commit being measured, from git (with `+` if the tree has changes).
fn commit() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(peerwasm_testkit::workspace_root())
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let head = git(&["rev-parse", "--short", "HEAD"])
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown".into());
    let dirty =
        git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    format!("{head}{}", if dirty { "+" } else { "" })
}

/// The cores this machine has.
pub fn cores() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Milliseconds, as a float.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The median of `v` (which must not be empty).
pub fn median<T: Ord + Copy>(mut v: Vec<T>) -> T {
    v.sort();
    v[v.len() / 2]
}

/// The `q` quantile (0..=1) of `v`, nearest rank.
pub fn quantile<T: Ord + Copy>(mut v: Vec<T>, q: f64) -> T {
    v.sort();
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}
