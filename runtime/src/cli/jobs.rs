//! `peerwasm jobs`: your jobs on the pool; `peerwasm cancel ID...`: cancel
//! some of them. A queued job leaves its queue at once; a running one stops
//! at its next yield; its outcome becomes `cancelled` (and an attached
//! job's client gets that as its result).

use std::process::ExitCode;

use crate::client::jobs::{CancelReport, cancel, list};
use crate::net::HttpClient;
use crate::units::Bytes;

#[derive(clap::Args, Debug)]
pub struct JobsArgs {
    #[command(flatten)]
    pub(super) pool: super::args::PoolArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn list_jobs(args: JobsArgs) -> anyhow::Result<ExitCode> {
    let (http, runtime) = pool_client(&args.pool, "jobs")?;
    runtime.block_on(async {
        let view = crate::client::fetch_peers(&http, &args.pool.peers).await?;
        let seeds = args.pool.workers_to_ask(&view);
        let (mut jobs, silent) = list(&http, &view, &seeds).await?;
        jobs.sort_by(|a, b| (&a.worker, &a.status.id).cmp(&(&b.worker, &b.status.id)));
        if args.json {
            super::args::say(&serde_json::to_string_pretty(&jobs)?);
        } else {
            let mut rows = vec![["ID", "WORKER", "STATE", "MEMORY"].map(String::from)];
            for j in &jobs {
                let s = &j.status;
                rows.push([
                    s.id.clone(),
                    j.worker.clone(),
                    s.state.clone(),
                    Bytes(s.memory_bytes).to_string(),
                ]);
            }
            super::args::say(&crate::units::render_table(&rows));
        }
        for s in silent {
            eprintln!("peerwasm: not listed: {s}");
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// The HTTP client with the tenant's token, and a runtime to use it on.
pub(super) fn pool_client(
    pool: &super::args::PoolArgs,
    what: &str,
) -> anyhow::Result<(HttpClient, tokio::runtime::Runtime)> {
    if pool.peers.is_empty() {
        anyhow::bail!(
            "{what} needs the pool: give --peers or PEERWASM_PEERS (a job of the embedded worker ends with its command)"
        );
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    Ok((
        pool.tls.client(pool.token.as_deref(), &pool.peers)?,
        runtime,
    ))
}

#[derive(clap::Args, Debug)]
pub struct LogsArgs {
    #[command(flatten)]
    pub(super) pool: super::args::PoolArgs,
    /// Follow: print the output as the job writes it until it ends, then
    /// exit with its exit code.
    #[arg(short, long)]
    follow: bool,
    /// The job's id (as `run --detach` printed it, or `peerwasm jobs` lists it).
    #[arg(value_name = "ID")]
    id: String,
}

/// `peerwasm logs [-f] ID`: a detached job's output so far, or all of it
/// as it comes (like `kubectl logs -f`, `tail -f` on a Slurm job's output).
pub fn logs(args: LogsArgs) -> anyhow::Result<ExitCode> {
    let (http, runtime) = pool_client(&args.pool, "logs")?;
    runtime.block_on(async {
        let view = crate::client::fetch_peers(&http, &args.pool.peers).await?;
        let seeds = args.pool.workers_to_ask(&view);
        let mut print = |stream, bytes: &[u8]| super::run::print_output(stream, bytes);
        let mut notice = |what: &str| eprintln!("peerwasm: {what}");
        let found = crate::client::detach::follow(
            &http,
            &view,
            &seeds,
            &args.id,
            args.follow,
            &mut print,
            &mut notice,
        );
        match found.await? {
            None => {
                eprintln!(
                    "peerwasm: {}: no such detached job of yours on any worker of the pool",
                    args.id
                );
                Ok(ExitCode::from(1))
            }
            Some((_, Some(outcome))) if args.follow => {
                if !matches!(outcome, crate::proto::Outcome::Exited { .. }) {
                    eprintln!("peerwasm: {outcome}");
                }
                Ok(ExitCode::from((outcome.exit_code() & 0xff) as u8))
            }
            Some(_) => Ok(ExitCode::SUCCESS),
        }
    })
}

/// What a submission id no live worker knows is told.
pub(super) const NO_SUCH_SUBMISSION: &str = "no such submission of yours on any worker of the pool (a submission lives on \
     the worker that owns it: if that worker is down, it is back when the worker is)";

#[derive(clap::Args, Debug)]
pub struct CancelArgs {
    #[command(flatten)]
    pub(super) pool: super::args::PoolArgs,
    /// The ids of the jobs to cancel (as `peerwasm jobs` lists them), or of
    /// submissions (`s-...`, as `map --detach` printed them).
    #[arg(value_name = "ID", required = true)]
    ids: Vec<String>,
}

pub fn cancel_jobs(args: CancelArgs) -> anyhow::Result<ExitCode> {
    let (http, runtime) = pool_client(&args.pool, "cancel")?;
    runtime.block_on(async {
        let view = crate::client::fetch_peers(&http, &args.pool.peers).await?;
        let seeds = args.pool.workers_to_ask(&view);
        let mut missing = 0;
        for id in &args.ids {
            let report = match crate::proto::submission::is_submission_id(id) {
                true => crate::client::submit::cancel(&http, &view, &seeds, id).await?,
                false => cancel(&http, &view, &seeds, id).await?,
            };
            match report {
                CancelReport::Cancelled { worker, was } if was == "done" => {
                    let what = if crate::proto::submission::is_submission_id(id) {
                        "results were"
                    } else {
                        "result was"
                    };
                    super::args::say(&format!(
                        "{id}: had ended on {worker}; its {what} discarded"
                    ))
                }
                CancelReport::Cancelled { worker, was } => {
                    super::args::say(&format!("{id}: cancelled on {worker} (it was {was})"))
                }
                CancelReport::AlreadyEnded { worker, message } => {
                    super::args::say(&format!("{id}: on {worker}: {message}"))
                }
                CancelReport::NotFound => {
                    missing += 1;
                    match crate::proto::submission::is_submission_id(id) {
                        true => eprintln!("peerwasm: {id}: {NO_SUCH_SUBMISSION}"),
                        false => {
                            eprintln!(
                                "peerwasm: {id}: no such job of yours on any worker of the pool"
                            )
                        }
                    }
                }
            }
        }
        Ok(if missing > 0 {
            ExitCode::from(1)
        } else {
            ExitCode::SUCCESS
        })
    })
}
