//! `peerwasm map`: one job over the lines of an inputs file, on the embedded
//! worker or a pool; results as JSON lines in input order, a summary on
//! stderr. Exit code: 0 when every job succeeded, 1 when any failed, 2 for
//! errors that are not a job's.

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use super::args::SandboxArgs;
use super::progress::MapPrinter;
use crate::client::estimate::EstimateStore;
use crate::client::{Job, MapConfig, Target, map};
use crate::proto::MemoryRequest;
use crate::runner::{JobRunner, RunnerConfig};
use crate::units::parse_size;

#[derive(clap::Args, Debug)]
pub struct MapArgs {
    /// Memory limit for every job, e.g. 64MiB [default: learned from the
    /// jobs' measured peaks, starting from the last run's estimate].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    mem: Option<u64>,
    /// Never ask for less memory than this when learning.
    #[arg(long, value_name = "SIZE", value_parser = parse_size, conflicts_with = "mem")]
    min_mem: Option<u64>,
    /// Each input's memory limit when you know it: one size per line of
    /// FILE (e.g. 64MiB), line i for input i. Each is asked exactly and
    /// never raised, the largest go first; inputs past its end take --mem,
    /// else what is learned.
    #[arg(long, value_name = "FILE", conflicts_with = "detach")]
    mem_per_input: Option<PathBuf>,
    /// Run a failed job again up to N times.
    #[arg(long, value_name = "N", default_value_t = 0)]
    retries: u32,
    /// Give an input up (it fails with outcome `lost`) once the process
    /// running it died under it N times — its worker killed or declared
    /// dead, its slot process killed: a job that kills whatever runs it
    /// does not go round the pool for ever. A worker's orderly shutdown
    /// does not count.
    #[arg(long, value_name = "N", default_value_t = crate::client::DEFAULT_MAX_LOST,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_lost: u32,
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
    /// Write the files each job creates or changes in its writable --dir
    /// into OUT_DIR/<index>/ instead of into the --dir itself (on a pool).
    #[arg(long, value_name = "OUT_DIR")]
    out_dir: Option<PathBuf>,
    /// Hand the whole map to a worker of the pool (its owner: the first of
    /// --peers that takes it, or --owner) and exit at once, printing the
    /// submission id. The owner runs it, keeps its results through
    /// restarts, and hands them to `peerwasm results ID` from anywhere.
    #[arg(long, conflicts_with_all = ["output", "out_dir", "resume"])]
    detach: bool,
    /// The worker to own a detached map.
    #[arg(long, value_name = "ADDR", requires = "detach")]
    owner: Option<String>,
    /// Go on with a map whose client stopped (Ctrl-C, a crash, a closed
    /// laptop): run only the inputs that the results file (-o) has no line
    /// for, and append theirs.
    #[arg(long, requires = "output")]
    resume: bool,
    /// No progress bar or lines (the summary is still printed).
    #[arg(long)]
    no_progress: bool,
    #[command(flatten)]
    job: super::args::JobArgs,
    #[command(flatten)]
    pub(super) pool: super::args::PoolArgs,
    #[command(flatten)]
    sandbox: SandboxArgs,
    /// The job module (with --python: the Python script).
    #[arg(value_name = "JOB.wasm")]
    module: PathBuf,
    /// One input per line, given to one job as its stdin; '-' reads stdin.
    #[arg(value_name = "INPUTS.jsonl")]
    inputs: PathBuf,
}

pub fn run(args: MapArgs) -> anyhow::Result<ExitCode> {
    let module = args.module.to_string_lossy();
    let (job, _script) = args.job.job(&module, &[], args.sandbox.cache_root())?;
    let mut inputs = read_inputs(&args.inputs)?;
    let total = inputs.len() as u64;

    let target = match args.pool.target(args.sandbox.cache_root())? {
        Some(pool) => pool,
        None if args.detach => {
            anyhow::bail!(
                "--detach hands the map to a worker of a pool: give --peers (or PEERWASM_PEERS)"
            )
        }
        None => Target::Embedded(Arc::new(JobRunner::new(RunnerConfig {
            sandbox: args.sandbox.sandbox_config(),
            ..RunnerConfig::default()
        })?)),
    };
    let knobs = MapConfig {
        mem: args.mem.map(Into::into),
        min_mem: args.min_mem.unwrap_or(0),
        retries: args.retries,
        max_lost: args.max_lost,
        max_in_flight: args.max_in_flight,
        keep_going: args.keep_going,
        ..MapConfig::default()
    };
    if let (true, Target::Pool(pool)) = (args.detach, &target) {
        return detach(pool, &job, inputs, (&knobs).into(), args.owner.as_deref());
    }
    // With --resume, the inputs the results file already answers are skipped.
    let first_index = match (&args.output, args.resume) {
        (Some(out), true) => results_written(out, total)?,
        _ => 0,
    };
    if first_index as u64 == total {
        eprintln!(
            "peerwasm map: {} already has all {total} results",
            args.output
                .as_ref()
                .map_or(String::new(), |o| o.display().to_string())
        );
        return Ok(ExitCode::SUCCESS);
    }
    inputs.drain(..first_index);
    if first_index > 0 {
        eprintln!(
            "peerwasm map: resuming at input {first_index}: {} of {total} to run",
            inputs.len()
        );
    }
    let given = args
        .mem_per_input
        .as_deref()
        .map(read_mem_per_input)
        .transpose()?;
    let config = MapConfig {
        first_index,
        mem_per_input: given.map(|g| g[first_index.min(g.len())..].into()),
        estimates: args
            .sandbox
            .cache_root()
            .map(|root| EstimateStore::new(root.join("estimates"))),
        out_dir: args.out_dir.clone(),
        ..knobs
    };
    let to_file = args.output.is_some();
    let mut printer = printer(&args, total - first_index as u64)?;

    // One thread: the client only moves jobs and answers; on one thread no
    // answer or submission crosses threads (a futex wake-up each), which
    // cost a trivial job more than everything else the client does for it.
    // The embedded worker's jobs run on the runner's own threads.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // Ctrl-C: stop, write the results that are in, cancel what is under way.
    let interrupt = CancellationToken::new();
    let config = MapConfig {
        interrupt: Some(interrupt.clone()),
        ..config
    };
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
    report(&summary?, first_index as u64, total, to_file)
}

/// Where the results go (`-o FILE`, appended to with `--resume`, else
/// stdout), with the progress bar unless `--no-progress`.
fn printer(args: &MapArgs, to_run: u64) -> anyhow::Result<MapPrinter> {
    let out: Box<dyn Write + Send> = match &args.output {
        Some(path) => {
            let mut open = std::fs::OpenOptions::new();
            if args.resume {
                open.append(true)
            } else {
                open.write(true).create(true).truncate(true)
            };
            let file = open
                .open(path)
                .with_context(|| format!("cannot open {}", path.display()))?;
            Box::new(std::io::BufWriter::new(file))
        }
        None => Box::new(std::io::BufWriter::new(std::io::stdout())),
    };
    let printer = MapPrinter::new(out, Some(to_run), !args.no_progress);
    // Each line is on disk as its result comes: `--resume` goes on from there.
    Ok(if args.output.is_some() {
        printer.flushing_each()
    } else {
        printer
    })
}

/// The map's summary on stderr, and the exit code it makes: 0, 1 when a
/// job failed, [`EXIT_INTERRUPTED`](super::args::EXIT_INTERRUPTED) on Ctrl-C.
fn report(
    summary: &crate::client::MapSummary,
    first_index: u64,
    total: u64,
    to_file: bool,
) -> anyhow::Result<ExitCode> {
    eprintln!(
        "peerwasm map: {}",
        summary.to_string().replace('\n', "\npeerwasm map: ")
    );
    if let Some(stopped) = &summary.stopped {
        eprintln!(
            "peerwasm map: stopped: {} (--keep-going runs the other inputs)",
            stopped.message
        );
    }
    if summary.interrupted {
        eprintln!(
            "peerwasm map: interrupted: {} of {total} results written; the jobs under way were cancelled{}",
            first_index + summary.jobs,
            if to_file {
                " (--resume goes on from there)"
            } else {
                ""
            }
        );
        return Ok(ExitCode::from(super::args::EXIT_INTERRUPTED));
    }
    Ok(if summary.failed > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// `peerwasm map --detach`: the map goes to its owner; the id to stdout.
fn detach(
    pool: &crate::client::Pool,
    job: &Job,
    inputs: Vec<Vec<u8>>,
    config: crate::proto::submission::SubmitConfig,
    owner: Option<&str>,
) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let n = inputs.len();
    let info = runtime.block_on(pool.submit_map(job, inputs, config, owner))?;
    super::args::say(&info.id);
    eprintln!(
        "peerwasm map: {n} inputs submitted to {}; `peerwasm results {}` writes their results as they come",
        info.owner, info.id
    );
    Ok(ExitCode::SUCCESS)
}

/// How many results the results file of a stopped map holds: its complete
/// lines, which must be inputs 0, 1, 2... in order. A last line cut off
/// by a crash is removed.
fn results_written(path: &PathBuf, total: u64) -> anyhow::Result<usize> {
    let text = match std::fs::read(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let complete = text.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let mut lines = 0usize;
    for line in text[..complete]
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
    {
        let index = serde_json::from_slice::<serde_json::Value>(line)
            .ok()
            .and_then(|v| v.get("index")?.as_u64());
        if index != Some(lines as u64) {
            anyhow::bail!(
                "{} is not the results of this map in order (line {} is not input {lines}'s): --resume needs the file a map wrote",
                path.display(),
                lines + 1
            );
        }
        lines += 1;
    }
    if lines as u64 > total {
        anyhow::bail!(
            "{} has {lines} results but the inputs are only {total}",
            path.display()
        );
    }
    if complete < text.len() {
        std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .and_then(|f| f.set_len(complete as u64))
            .with_context(|| format!("cannot cut the partial last line of {}", path.display()))?;
    }
    Ok(lines)
}

/// The lines of `path` (or stdin for `-`), each with its newline, as a job
/// reading stdin with `echo LINE |` would see it.
/// `--mem-per-input`: a size per line; a line that is not one is an error
/// naming it.
fn read_mem_per_input(path: &std::path::Path) -> anyhow::Result<Vec<MemoryRequest>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read --mem-per-input {}", path.display()))?;
    text.lines()
        .enumerate()
        .map(|(i, line)| {
            parse_size(line.trim())
                .map(MemoryRequest::from)
                .map_err(|e| anyhow::anyhow!("{} line {}: {e}", path.display(), i + 1))
        })
        .collect()
}

fn read_inputs(path: &PathBuf) -> anyhow::Result<Vec<Vec<u8>>> {
    let mut text = Vec::new();
    if path.as_os_str() == "-" {
        let stdin = std::io::stdin();
        if stdin.is_terminal() {
            anyhow::bail!("reading inputs from a terminal: pipe them in, or give a file");
        }
        stdin
            .lock()
            .read_to_end(&mut text)
            .context("cannot read the inputs from stdin")?;
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
