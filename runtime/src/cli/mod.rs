//! The `peerwasm` command line. Each subcommand has its own file; what
//! they share (arguments, exit codes) is `args.rs`'s; this one holds the
//! commands and the dispatch.

mod adapt;
mod args;
mod batch;
mod jobs;
mod map;
mod peers;
mod progress;
mod run;
mod status;
mod submissions;
mod tls;
mod worker;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use args::THIS_PROGRAM;
pub use args::{EXIT_INTERRUPTED, EXIT_USAGE, JobArgs, PoolArgs, SandboxArgs, ViewArgs};

/// Run WebAssembly (wasm32-wasip1) jobs with exact memory limits, locally or
/// on a pool of peer machines.
#[derive(Parser, Debug)]
#[command(name = "peerwasm", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run one job and exit with its exit code.
    Run(run::RunArgs),
    /// Run a job once per input line; write the results in input order.
    Map(map::MapArgs),
    /// List your jobs on the pool: queued, running, results waiting.
    Jobs(jobs::JobsArgs),
    /// Cancel jobs or submissions on the pool by id.
    Cancel(jobs::CancelArgs),
    /// Write a detached map's results in input order, as they come.
    Results(submissions::ResultsArgs),
    /// List your submissions (detached maps) with their progress.
    Submissions(submissions::SubmissionsArgs),
    /// The jobs the pool ran: tenant, outcome, peak, CPU, wall, worker.
    History(submissions::HistoryArgs),
    /// Print a detached job's output (-f: follow it until it ends).
    Logs(jobs::LogsArgs),
    /// Lend this machine to a pool: serve jobs over HTTP and gossip.
    Worker(worker::WorkerArgs),
    /// List the pool's workers.
    Peers(peers::PeersArgs),
    /// Make the pool's TLS certificates: a CA, then one per worker.
    #[command(subcommand)]
    Tls(tls::TlsCommand),
    /// The pool on one screen: workers, slots, memory, per-tenant usage.
    Status(status::StatusArgs),
    /// Keep a pool on Slurm sized to its backlog: submit and cancel
    /// one-worker Slurm jobs, each shaped for the jobs that wait.
    Adapt(adapt::AdaptArgs),
    /// A worker's slot process (started by `peerwasm worker`, not by hand):
    /// runs jobs sent on stdin, answers on stdout.
    #[command(hide = true)]
    Slot,
    /// A worker's compile process (started by `peerwasm worker`, not by
    /// hand): compiles the module sent on stdin, answers on stdout.
    #[command(hide = true)]
    CompileChild,
}

/// Fills the pool arguments of a client command from its `--pool-dir`.
fn resolve_pool_dir(command: &mut Command) -> anyhow::Result<()> {
    match command {
        Command::Run(a) => a.pool.resolve(),
        Command::Map(a) => a.pool.resolve(),
        Command::Jobs(a) => a.pool.resolve(),
        Command::Cancel(a) => a.pool.resolve(),
        Command::Logs(a) => a.pool.resolve(),
        Command::Results(a) => a.pool.resolve(),
        Command::Submissions(a) => a.pool.resolve(),
        Command::History(a) => a.pool.resolve(),
        Command::Peers(a) => a.view.resolve(),
        Command::Status(a) => a.view.resolve(),
        _ => Ok(()),
    }
}

/// Parses the command line, runs the command, and returns the exit code.
pub fn main() -> ExitCode {
    main_from(std::env::args_os())
}

/// [`main`] with the arguments given (the first is the program name): how
/// a program that embeds peerwasm, such as the benchmarks, runs its
/// commands in a process of its own.
pub fn main_from<I, T>(args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
    // What comes between our executable and these arguments (for the
    // benchmarks' binary, `peerwasm`): a slot process is started the same way.
    let before = std::env::args_os()
        .skip(1)
        .take(std::env::args_os().count().saturating_sub(args.len()));
    let program = std::env::current_exe().map(|exe| {
        std::iter::once(exe.into_os_string())
            .chain(before)
            .collect()
    });
    main_as(program, args)
}

/// [`main_from`] for a program that says itself how it is started again
/// (`program`: the executable and the arguments before a command; an `Err`
/// says why it cannot be): what a slot process, a compile apart and a
/// worker that `adapt` submits run. The Python package's `peerwasm`
/// command is `[sys.executable, "-m", "peerwasm"]`: the executable of a
/// virtual environment is a link, which the process's own path
/// (`current_exe`) would resolve past the environment.
pub fn main_as(
    program: std::io::Result<Vec<std::ffi::OsString>>,
    args: Vec<std::ffi::OsString>,
) -> ExitCode {
    let _ = THIS_PROGRAM.set(program.map_err(|e| e.to_string()));
    let cli = Cli::parse_from(args);
    // A worker is a service: tell its operator what it does. The other
    // commands speak only when something is wrong.
    let default_log = if matches!(cli.command, Command::Worker(_)) {
        "info"
    } else {
        "warn"
    };
    // `try_`: a program that embeds the command line may run it twice.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_log)),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let mut command = cli.command;
    if let Err(e) = resolve_pool_dir(&mut command) {
        eprintln!("peerwasm: {e:#}");
        return ExitCode::from(EXIT_USAGE);
    }
    let result = match command {
        Command::Run(args) => run::run(args),
        Command::Map(args) => map::run(args),
        Command::Jobs(args) => jobs::list_jobs(args),
        Command::Cancel(args) => jobs::cancel_jobs(args),
        Command::Logs(args) => jobs::logs(args),
        Command::Results(args) => submissions::results(args),
        Command::Submissions(args) => submissions::submissions(args),
        Command::History(args) => submissions::history(args),
        Command::Worker(args) => worker::run(args),
        Command::Peers(args) => peers::run(args),
        Command::Status(args) => status::run(args),
        Command::Adapt(args) => adapt::run(args),
        Command::Tls(command) => tls::run(command),
        Command::Slot => crate::slot::child::serve().map(|()| ExitCode::SUCCESS),
        Command::CompileChild => crate::sandbox::compiler::serve().map(|()| ExitCode::SUCCESS),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("peerwasm: {e:#}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}
