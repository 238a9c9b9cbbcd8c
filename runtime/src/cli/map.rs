//! `peerwasm map`: one job over the lines of an inputs file, on the embedded
//! worker or a pool; results as JSON lines in input order, a summary on
//! stderr. Exit code: 0 when every job succeeded, 1 when any failed, 2 for
//! errors that are not a job's.

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use super::SandboxArgs;
use super::progress::MapPrinter;
use crate::client::estimate::EstimateStore;
use crate::client::{Job, MapConfig, Target, map};
use crate::units::{parse_duration, parse_size};
use crate::worker::{JobRunner, RunnerConfig};

#[derive(clap::Args, Debug)]
pub struct MapArgs {
    /// Memory limit for every job, e.g. 64MiB [default: learned from the
    /// jobs' measured peaks, starting from the last run's estimate].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    mem: Option<u64>,
    /// Never ask for less memory than this when learning.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, conflicts_with = "mem")]
    min_mem: Option<u64>,
    /// Wall-time limit per job, e.g. 30s, 5m [default: none].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    timeout: Option<Duration>,
    /// Run a failed job again up to N times.
    #[arg(long, value_name = "N", default_value_t = 0)]
    retries: u32,
    /// Jobs submitted at once [default: two per slot of the pool, more for
    /// short jobs: enough to cover 20 ms of their work per slot, at most 128
    /// per slot].
    #[arg(long, value_name = "N")]
    max_in_flight: Option<usize>,
    /// Go on after a job fails (its result says how it failed); without
    /// this the map stops at the first failure.
    #[arg(long)]
    keep_going: bool,
    /// Write the results here instead of stdout.
    #[arg(short, long, value_name = "OUT.jsonl")]
    output: Option<PathBuf>,
    /// Set an environment variable for every job (NAME=VAL, or NAME to pass
    /// this process's value).
    #[arg(long = "env", value_name = "NAME[=VAL]")]
    env: Vec<String>,
    /// Grant every job a host directory, as `peerwasm run --dir`
    /// (HOST[::GUEST][:ro]). On a pool it is shipped by content hash: once
    /// per worker, however many inputs use it.
    #[arg(long = "dir", value_name = "HOST[::GUEST][:ro]")]
    dirs: Vec<String>,
    /// Write the files each job creates or changes in its writable --dir
    /// into OUT_DIR/<index>/ instead of into the --dir itself (on a pool).
    #[arg(long, value_name = "OUT_DIR")]
    out_dir: Option<PathBuf>,
    /// No progress bar or lines (the summary is still printed).
    #[arg(long)]
    no_progress: bool,
    #[command(flatten)]
    pool: super::PoolArgs,
    #[command(flatten)]
    sandbox: SandboxArgs,
    /// The job module.
    #[arg(value_name = "JOB.wasm")]
    module: PathBuf,
    /// One input per line, given to one job as its stdin; '-' reads stdin.
    #[arg(value_name = "INPUTS.jsonl")]
    inputs: PathBuf,
}

pub fn run(args: MapArgs) -> anyhow::Result<ExitCode> {
    let mut job = Job::from_file(&args.module)?;
    job.env = super::run::parse_env(&args.env)?;
    job.dirs = super::run::parse_dirs(&args.dirs)?;
    job.limits.timeout_ms = args.timeout.map(|d| d.as_millis().max(1) as u64);
    let inputs = read_inputs(&args.inputs)?;
    let total = inputs.len() as u64;

    let target = match args.pool.target(args.sandbox.cache_root())? {
        Some(pool) => pool,
        None => Target::Embedded(Arc::new(JobRunner::new(RunnerConfig { sandbox: args.sandbox.sandbox_config() })?)),
    };
    let config = MapConfig {
        mem: args.mem,
        min_mem: args.min_mem.unwrap_or(0),
        retries: args.retries,
        max_in_flight: args.max_in_flight,
        keep_going: args.keep_going,
        estimates: args.sandbox.cache_root().map(|root| EstimateStore::new(root.join("estimates"))),
        out_dir: args.out_dir.clone(),
        ..MapConfig::default()
    };
    let out: Box<dyn Write + Send> = match &args.output {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?,
        )),
        None => Box::new(std::io::BufWriter::new(std::io::stdout())),
    };
    let mut printer = MapPrinter::new(out, Some(total), !args.no_progress);

    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    // Ctrl-C: stop, write the results that are in, cancel what is under way.
    let interrupt = CancellationToken::new();
    let config = MapConfig { interrupt: Some(interrupt.clone()), ..config };
    let summary = runtime.block_on(async {
        let watcher = tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                interrupt.cancel();
            }
        });
        let summary = map(&target, &job, inputs, &config, &mut printer).await;
        watcher.abort();
        summary
    });
    printer.finish().context("cannot write the results")?;
    let summary = summary?;
    eprintln!("peerwasm map: {}", summary.to_string().replace('\n', "\npeerwasm map: "));
    if let Some(stopped) = &summary.stopped {
        eprintln!("peerwasm map: stopped: {} (--keep-going runs the other inputs)", stopped.message);
    }
    if summary.interrupted {
        eprintln!(
            "peerwasm map: interrupted: {} of {total} results written; the jobs under way were cancelled",
            summary.jobs
        );
        return Ok(ExitCode::from(super::EXIT_INTERRUPTED));
    }
    Ok(if summary.failed > 0 { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// The lines of `path` (or stdin for `-`), each with its newline, as a job
/// reading stdin with `echo LINE |` would see it.
fn read_inputs(path: &PathBuf) -> anyhow::Result<Vec<Vec<u8>>> {
    let mut text = Vec::new();
    if path.as_os_str() == "-" {
        let stdin = std::io::stdin();
        if stdin.is_terminal() {
            anyhow::bail!("reading inputs from a terminal: pipe them in, or give a file");
        }
        stdin.lock().read_to_end(&mut text).context("cannot read the inputs from stdin")?;
    } else {
        text = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    }
    let mut lines: Vec<Vec<u8>> = text
        .split_inclusive(|&b| b == b'\n')
        .map(|line| {
            let mut line = line.strip_suffix(b"\n").unwrap_or(line);
            line = line.strip_suffix(b"\r").unwrap_or(line);
            let mut stdin = line.to_vec();
            stdin.push(b'\n');
            stdin
        })
        .collect();
    if lines.is_empty() {
        anyhow::bail!("{} has no inputs", path.display());
    }
    lines.shrink_to_fit();
    Ok(lines)
}
