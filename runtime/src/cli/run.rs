//! `peerwasm run`: one job, on the embedded worker (stdout and stderr
//! streamed as the job writes them) or on a pool (`--peers`), with the job's
//! exit code as ours.

use std::io::{Read, Write};
use std::process::ExitCode;

use anyhow::{Context, bail};

use super::args::SandboxArgs;
use crate::proto::{CacheSource, CancelCause, JobResult, JobSpec, Outcome, StdStream};
use crate::runner::{JobRunner, RunnerConfig};
use crate::sandbox::StdinFeed;
use crate::slot::{Alone, AloneJob, Event, run_alone};
use crate::units::{Bytes, parse_size};

/// The most stdin `run` reads and hands to the job.
pub const MAX_STDIN_BYTES: u64 = 256 << 20;

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Linear-memory limit for the job, e.g. 64MiB, 2GiB, 1.5G [default: 1GiB].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    mem: Option<u64>,
    /// Print peak memory, wall and CPU time to stderr when the job ends.
    #[arg(long, conflicts_with = "json")]
    stats: bool,
    /// Print one JSON result object on stdout instead of the job's output.
    #[arg(long)]
    json: bool,
    /// Submit to the pool and return at once, printing the job's id: the
    /// worker keeps its result until `peerwasm cancel ID` discards it;
    /// `peerwasm logs -f ID` follows its output. Stdin is read to its end
    /// first.
    #[arg(long, conflicts_with_all = ["json", "stats"])]
    detach: bool,
    #[command(flatten)]
    job: super::args::JobArgs,
    #[command(flatten)]
    pub(super) pool: super::args::PoolArgs,
    #[command(flatten)]
    sandbox: SandboxArgs,
    /// The job module, then its arguments, passed verbatim (also those
    /// that start with '-'). With --python: the script (or '-' for one
    /// on stdin), then its arguments.
    #[arg(
        value_name = "JOB.wasm [ARGS]...",
        required = true,
        trailing_var_arg = true
    )]
    module_and_args: Vec<String>,
}

pub fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let (module_path, job_args) = args
        .module_and_args
        .split_first()
        .context("no job module given")?;
    if args.detach {
        return detach(&args, module_path, job_args);
    }
    let (job, _script) = args
        .job
        .job(module_path, job_args, args.sandbox.cache_root())?;
    let stdin = stream_stdin();
    let spec = job.spec(
        Vec::new(),
        args.mem.unwrap_or(crate::proto::DEFAULT_JOB_MEMORY),
    );

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut result = if let Some(target) = args.pool.target(args.sandbox.cache_root())? {
        let crate::client::Target::Pool(pool) = target else {
            unreachable!("--peers gives a pool")
        };
        // Ctrl-C drops the request: the worker sees its client go and
        // cancels the job.
        let show = !args.json;
        let mut on_output = move |stream: StdStream, bytes: &[u8]| {
            if show {
                print_output(stream, bytes);
            }
        };
        let result = runtime.block_on(async {
            tokio::select! {
                r = pool.run_streaming(&job, spec, Some(stdin), &mut on_output) => Some(r),
                _ = tokio::signal::ctrl_c() => None,
            }
        });
        let Some(result) = result else {
            eprintln!("peerwasm: interrupted: the job was cancelled");
            return Ok(ExitCode::from(super::args::EXIT_INTERRUPTED));
        };
        result?
    } else {
        // Per-job scratch directories go under one of this command's own,
        // so that it can remove them when it ends the process.
        let scratch = tempfile::Builder::new().prefix("peerwasm-run-").tempdir()?;
        let runner = JobRunner::new(RunnerConfig {
            sandbox: args.sandbox.one_job_config(scratch.path()),
            ..RunnerConfig::default()
        })?;
        // Compiled code in the cache (checked, not read): the module's
        // bytes are not needed, and not read (left in its file, the module
        // is read only for a compile).
        runner.add_module_source(job.hash(), job.source().clone());
        match runtime.block_on(run_embedded(&runner, spec, stdin, !args.json)) {
            Alone::Ended(result) => result,
            Alone::Overran(result) => {
                // The job is still computing on its slot thread, which
                // nothing can stop but the end of the process.
                finish(&result, &args)?;
                drop(scratch);
                let _ = std::io::stdout().flush();
                std::process::exit(i32::from(exit_byte(&result)));
            }
        }
    };
    // A remote job's files, into the directories they came from.
    if let Err(e) = crate::client::tree::write_back(&job.dirs, &mut result.files, None) {
        eprintln!("peerwasm: cannot write back the files the job made: {e:#}");
        report(&result, args.mem.is_none(), args.stats);
        return Ok(ExitCode::from(super::args::EXIT_USAGE));
    }

    finish(&result, &args)
}

/// Prints the result (`--json`) or what the user should know of it, and
/// gives the job's exit code as ours.
fn finish(result: &JobResult, args: &RunArgs) -> anyhow::Result<ExitCode> {
    if args.json {
        let mut out = std::io::stdout().lock();
        serde_json::to_writer(&mut out, result)?;
        writeln!(out)?;
    } else {
        report(result, args.mem.is_none(), args.stats);
    }
    Ok(ExitCode::from(exit_byte(result)))
}

/// The job's exit code as a process's.
fn exit_byte(result: &JobResult) -> u8 {
    (result.outcome.exit_code() & 0xff) as u8
}

/// `run --detach`: submits, prints the id, returns.
fn detach(args: &RunArgs, module_path: &str, job_args: &[String]) -> anyhow::Result<ExitCode> {
    let Some(crate::client::Target::Pool(pool)) = args.pool.target(args.sandbox.cache_root())?
    else {
        bail!(
            "--detach needs a pool (--peers or PEERWASM_PEERS): a job of the embedded worker ends with its command"
        );
    };
    let (job, _script) = args
        .job
        .job(module_path, job_args, args.sandbox.cache_root())?;
    let stdin = if std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        Vec::new()
    } else {
        let mut buf = Vec::new();
        std::io::stdin()
            .lock()
            .take(MAX_STDIN_BYTES + 1)
            .read_to_end(&mut buf)
            .context("cannot read stdin")?;
        if buf.len() as u64 > MAX_STDIN_BYTES {
            bail!(
                "stdin is larger than {}; give the job a file with --dir instead",
                Bytes(MAX_STDIN_BYTES)
            );
        }
        buf
    };
    let spec = job.spec(stdin, args.mem.unwrap_or(crate::proto::DEFAULT_JOB_MEMORY));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (worker, id) = runtime.block_on(pool.submit_detached(&job, &spec))?;
    super::args::say(&id);
    eprintln!(
        "peerwasm: detached on {worker}: follow it with `peerwasm logs -f {id}`, discard its result with `peerwasm cancel {id}`"
    );
    Ok(ExitCode::SUCCESS)
}

/// Runs one job on the embedded worker, its output forwarded to ours as it
/// is written if `stream`.
///
/// This command's process is the job's slot (`TimeLimitMechanism::Off`), so its code
/// runs without time-limit instrumentation (no fuel, no epochs: as fast as
/// under `wasmtime run`, see docs/time-limits.md). A job asleep in a host
/// call ends at its deadline or on Ctrl-C inside the sandbox, as on a
/// worker; a job computing past either is ended with the process once
/// [`OVERRUN_GRACE`](crate::slot::OVERRUN_GRACE) has passed too,
/// reported as the sandbox would have: time limit (exit 124) or cancelled
/// (130), its peak memory and output so far.
async fn run_embedded(runner: &JobRunner, spec: JobSpec, stdin: StdinFeed, stream: bool) -> Alone {
    let limit = spec.limits.memory.bytes();
    let spec = match crate::sandbox::RunSpec::local(spec) {
        Ok(spec) => spec,
        Err(reason) => {
            return Alone::Ended(JobResult::never_ran(limit, Outcome::Rejected { reason }));
        }
    };
    let job = AloneJob {
        spec,
        stdin: Some(stdin),
        stream,
        forward_only: false,
        memory: Default::default(),
        captures: Default::default(),
    };
    let interrupt = async {
        tokio::signal::ctrl_c()
            .await
            .ok()
            .map(|()| CancelCause::Interrupted)
    };
    run_alone(runner, job, interrupt, |event| {
        if let Event::Output((stream, bytes)) = event {
            print_output(stream, &bytes);
        }
    })
    .await
}

/// The job's output, on ours as it comes. A closed stdout (`| head`) must
/// not stop the job's stderr, so errors are ignored.
pub(super) fn print_output(stream: StdStream, bytes: &[u8]) {
    fn write_all_flush(mut w: impl Write, bytes: &[u8]) -> std::io::Result<()> {
        w.write_all(bytes)?;
        w.flush()
    }
    let _ = match stream {
        StdStream::Stdout => write_all_flush(std::io::stdout().lock(), bytes),
        StdStream::Stderr => write_all_flush(std::io::stderr().lock(), bytes),
    };
}

/// One clear line on stderr for every ending that is not the job's own exit;
/// the warnings; and the figures with `--stats`.
pub(super) fn report(result: &JobResult, default_mem: bool, stats: bool) {
    match &result.outcome {
        Outcome::Exited { .. } => {}
        Outcome::MemoryLimitExceeded { .. } if default_mem => {
            eprintln!("peerwasm: {} — raise it with --mem", result.outcome)
        }
        other => eprintln!("peerwasm: {other}"),
    }
    for w in &result.warnings {
        eprintln!("peerwasm: warning: {w}");
    }
    if stats {
        let module = match result.cache {
            CacheSource::Memory => "cached in memory",
            CacheSource::Disk => "loaded from the disk cache",
            CacheSource::Compiled => "compiled",
            CacheSource::None => "not loaded",
        };
        eprintln!(
            "peerwasm: exit {} · peak memory {} of {} · wall {:.1} ms · cpu {:.1} ms · module {module} · on {}",
            result.outcome.exit_code(),
            Bytes(result.peak_memory_bytes),
            Bytes(result.memory_limit_bytes),
            result.wall_time_us as f64 / 1000.0,
            result.cpu_time_us as f64 / 1000.0,
            result.peer,
        );
    }
}

/// Our stdin, handed to the job as it arrives (as `wasmtime run` does): a
/// job that never reads it neither waits for it nor makes us wait, and an
/// interactive job gets each line as it is typed or piped. Read on a
/// thread of its own, in chunks, through a bounded channel, so a fast pipe
/// waits for a slow job; past [`MAX_STDIN_BYTES`] the job's reads fail.
/// The thread ends with the process.
fn stream_stdin() -> StdinFeed {
    let (tx, feed) = StdinFeed::channel();
    let spawned = std::thread::Builder::new()
        .name("peerwasm-stdin".into())
        .spawn(move || {
            let mut stdin = std::io::stdin().lock();
            let mut total = 0u64;
            let mut buf = vec![0u8; 64 << 10];
            loop {
                let item = match stdin.read(&mut buf) {
                    Ok(0) => return, // the end: dropping `tx` tells the job
                    Ok(n) => {
                        total += n as u64;
                        if total > MAX_STDIN_BYTES {
                            let why = format!(
                                "stdin is larger than {}; give the job a file with --dir instead",
                                Bytes(MAX_STDIN_BYTES)
                            );
                            eprintln!("peerwasm: {why}");
                            let _ = tx.blocking_send(Err(std::io::Error::other(why)));
                            return;
                        }
                        Ok(bytes::Bytes::copy_from_slice(&buf[..n]))
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => Err(e),
                };
                let failed = item.is_err();
                if tx.blocking_send(item).is_err() || failed {
                    return; // the job has ended, or stdin failed
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot read stdin: {e}; the job gets none");
    }
    feed
}
