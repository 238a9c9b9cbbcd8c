//! `peerwasm results ID`, `peerwasm submissions`, `peerwasm history`: what
//! a detached map (`map --detach`) gives back, from any client with the
//! tenant's token, and the pool's record of the jobs it ran (like Slurm's
//! `sacct`).

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;

use super::args::say;
use super::jobs::pool_client;
use super::progress::MapPrinter;
use crate::client::map::{MapItem, MapObserver};
use crate::client::submit;
use crate::proto::submission::SubmissionState;
use crate::units::{Bytes, parse_duration};

#[derive(clap::Args, Debug)]
pub struct ResultsArgs {
    #[command(flatten)]
    pub(super) pool: super::args::PoolArgs,
    /// Write the results here instead of stdout.
    #[arg(short, long, value_name = "OUT.jsonl")]
    output: Option<PathBuf>,
    /// Write the results that are in and exit; without it, wait for all.
    #[arg(long)]
    no_wait: bool,
    /// The submission's id, as `map --detach` printed it.
    #[arg(value_name = "ID")]
    id: String,
}

/// How long one results request waits for the next result.
const WAIT: Duration = Duration::from_secs(20);

/// `peerwasm results ID`: the submission's results as JSON lines, in input
/// order, as they are ready (the same lines `map` writes). Exit code 0 when
/// every job succeeded, 1 when any failed or the map stopped, was cancelled
/// or could not finish, 75 with `--no-wait` while it still runs.
pub fn results(args: ResultsArgs) -> anyhow::Result<ExitCode> {
    let (http, runtime) = pool_client(&args.pool, "results")?;
    let out: Box<dyn Write + Send> = match &args.output {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(path)
                .with_context(|| format!("cannot create {}", path.display()))?,
        )),
        None => Box::new(std::io::BufWriter::new(std::io::stdout())),
    };
    runtime.block_on(async {
        let view = crate::client::fetch_peers(&http, &args.pool.peers).await?;
        let seeds = args.pool.workers_to_ask(&view);
        let Some(info) = submit::find(&http, &view, &seeds, &args.id).await? else {
            eprintln!("peerwasm: {}: {}", args.id, super::jobs::NO_SUCH_SUBMISSION);
            return Ok(ExitCode::from(1));
        };
        let mut printer = MapPrinter::new(out, Some(info.total), false).flushing_each();
        let (mut next, mut failed, mut written) = (0u64, 0u64, 0u64);
        let mut gaps = Gaps::default();
        let info = loop {
            let wait = if args.no_wait { Duration::ZERO } else { WAIT };
            let page = submit::results_page(&http, &info.owner, &args.id, next, wait)
                .await
                .with_context(|| format!("reading the results from its owner {}", info.owner))?
                .ok_or_else(|| anyhow::anyhow!("{}: the submission was discarded", args.id))?;
            let got = page.items.len();
            for item in page.items {
                if item.index < next {
                    continue; // never twice
                }
                gaps.missing(next, item.index);
                next = item.index + 1;
                let item = MapItem {
                    index: item.index as usize,
                    result: item.result,
                    attempts: item.attempts,
                    reserve: None,
                };
                failed += u64::from(!item.succeeded());
                written += 1;
                printer.result(item)?;
            }
            let state = page.info.state;
            if (state.is_final() && got == 0)
                || (args.no_wait && (got == 0 || next >= page.info.total))
            {
                break page.info;
            }
        };
        printer.finish().context("cannot write the results")?;
        // Every input from 0 to N-1 has its line, or the gaps are named.
        if info.state.is_final() {
            gaps.missing(next, info.total);
        }
        let said = match info.state {
            SubmissionState::Running => {
                format!("{written} of {} results so far; it still runs", info.total)
            }
            SubmissionState::Done if gaps.is_empty() => {
                format!("{written} results, {failed} failed")
            }
            st => format!(
                "{written} of {} results; the map {}: {}",
                info.total,
                st.as_str(),
                info.message.as_deref().unwrap_or("")
            ),
        };
        eprintln!("peerwasm results: {said}");
        if !gaps.is_empty() {
            eprintln!("peerwasm results: no result for inputs {gaps} (counted from 0)");
        }
        Ok(match info.state {
            SubmissionState::Running => ExitCode::from(75),
            SubmissionState::Done if failed == 0 && gaps.is_empty() => ExitCode::SUCCESS,
            _ => ExitCode::from(1),
        })
    })
}

/// The inputs a results stream skipped, as ranges.
#[derive(Default)]
struct Gaps(Vec<std::ops::Range<u64>>);

impl Gaps {
    /// Notes that inputs `from..to` had no result (nothing if empty).
    fn missing(&mut self, from: u64, to: u64) {
        if from < to {
            self.0.push(from..to);
        }
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Display for Gaps {
    /// `14–30, 42` (at most ten ranges, then how many more).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, r) in self.0.iter().take(10).enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            match r.end - r.start {
                1 => write!(f, "{sep}{}", r.start)?,
                _ => write!(f, "{sep}{}\u{2013}{}", r.start, r.end - 1)?,
            }
        }
        if self.0.len() > 10 {
            write!(f, " and {} more ranges", self.0.len() - 10)?;
        }
        Ok(())
    }
}

#[derive(clap::Args, Debug)]
pub struct SubmissionsArgs {
    #[command(flatten)]
    pub(super) pool: super::args::PoolArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// `peerwasm submissions`: the caller's submissions across the pool.
pub fn submissions(args: SubmissionsArgs) -> anyhow::Result<ExitCode> {
    let (http, runtime) = pool_client(&args.pool, "submissions")?;
    runtime.block_on(async {
        let view = crate::client::fetch_peers(&http, &args.pool.peers).await?;
        let seeds = args.pool.workers_to_ask(&view);
        let (mut list, silent) = submit::list(&http, &view, &seeds).await?;
        list.sort_by_key(|s| std::cmp::Reverse(s.created_ms));
        if args.json {
            say(&serde_json::to_string_pretty(&list)?);
        } else {
            let now = crate::worker::statedb::now_ms();
            let mut rows = vec![
                [
                    "ID",
                    "OWNER",
                    "STATE",
                    "DONE",
                    "FAILED",
                    "MODULE",
                    "SUBMITTED",
                ]
                .map(String::from),
            ];
            for s in &list {
                let age = Duration::from_secs(now.saturating_sub(s.created_ms) / 1000);
                rows.push([
                    s.id.clone(),
                    s.owner.clone(),
                    s.state.as_str().into(),
                    format!("{}/{}", s.done, s.total),
                    s.failed.to_string(),
                    s.module[..12.min(s.module.len())].to_string(),
                    format!("{} ago", humantime::format_duration(age)),
                ]);
            }
            say(&crate::units::render_table(&rows));
        }
        for s in silent {
            eprintln!("peerwasm: not listed: {s}");
        }
        Ok(ExitCode::SUCCESS)
    })
}

#[derive(clap::Args, Debug)]
pub struct HistoryArgs {
    #[command(flatten)]
    pub(super) pool: super::args::PoolArgs,
    /// Only jobs that ended within this long, e.g. 1h, 7days.
    #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "1day")]
    since: Duration,
    /// Only this tenant's jobs (another tenant's needs an operator's token).
    #[arg(long, value_name = "NAME")]
    tenant: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// `peerwasm history`: the jobs the pool ran, oldest first, from every
/// worker's record.
pub fn history(args: HistoryArgs) -> anyhow::Result<ExitCode> {
    let (http, runtime) = pool_client(&args.pool, "history")?;
    runtime.block_on(async {
        let view = crate::client::fetch_peers(&http, &args.pool.peers).await?;
        let seeds = args.pool.workers_to_ask(&view);
        let since = crate::worker::statedb::now_ms().saturating_sub(args.since.as_millis() as u64);
        let (rows, silent) =
            submit::history(&http, &view, &seeds, since, args.tenant.as_deref()).await?;
        if args.json {
            say(&serde_json::to_string_pretty(&rows)?);
        } else {
            let mut table = vec![
                [
                    "ENDED", "TENANT", "MODULE", "INPUT", "TRY", "OUTCOME", "EXIT", "PEAK",
                    "RESERVED", "CPU", "WALL", "PEER",
                ]
                .map(String::from),
            ];
            for r in &rows {
                let ended = std::time::UNIX_EPOCH + Duration::from_millis(r.ended_ms);
                let input = match (&r.submission, r.index) {
                    (Some(s), Some(i)) => format!("{}#{i}", &s[..10.min(s.len())]),
                    (None, Some(i)) => i.to_string(),
                    _ => "-".into(),
                };
                table.push([
                    humantime::format_rfc3339_seconds(ended).to_string(),
                    r.tenant.clone(),
                    r.module[..12.min(r.module.len())].to_string(),
                    input,
                    r.attempt.map_or("-".into(), |a| a.to_string()),
                    r.outcome.clone(),
                    r.exit_code.to_string(),
                    Bytes(r.peak_memory_bytes).to_string(),
                    Bytes(r.reserved_bytes).to_string(),
                    format!("{:.3}s", r.cpu_time_us as f64 / 1e6),
                    format!("{:.3}s", r.wall_time_us as f64 / 1e6),
                    r.peer.clone(),
                ]);
            }
            say(&crate::units::render_table(&table));
        }
        for s in silent {
            eprintln!("peerwasm: not included: {s}");
        }
        Ok(ExitCode::SUCCESS)
    })
}
