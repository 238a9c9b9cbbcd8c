//! `peerwasm cancel ID...`: cancel jobs on the pool, by id (detached jobs,
//! or any job whose id you have). A queued job leaves its queue at once; a
//! running one stops at its next yield; its outcome becomes `cancelled`.

use std::process::ExitCode;

use crate::client::cancel::{CancelReport, cancel};
use crate::client::pool::http_client;

#[derive(clap::Args, Debug)]
pub struct CancelArgs {
    #[command(flatten)]
    pool: super::PoolArgs,
    /// The ids of the jobs to cancel (as `GET /v1/jobs` lists them).
    #[arg(value_name = "ID", required = true)]
    ids: Vec<String>,
}

pub fn run(args: CancelArgs) -> anyhow::Result<ExitCode> {
    if args.pool.peers.is_empty() {
        anyhow::bail!("cancel needs the pool: give --peers or PEERWASM_PEERS (a job of the embedded worker ends with its command)");
    }
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let http = http_client(args.pool.token.as_deref())?;
        let view = crate::client::fetch_peers(&http, &args.pool.peers).await?;
        let mut missing = 0;
        for id in &args.ids {
            match cancel(&http, &view, id).await? {
                CancelReport::Cancelled { worker, was } => println!("{id}: cancelled on {worker} (it was {was})"),
                CancelReport::AlreadyEnded { worker, message } => println!("{id}: on {worker}: {message}"),
                CancelReport::NotFound => {
                    missing += 1;
                    eprintln!("peerwasm: {id}: no such job of yours on any live worker");
                }
            }
        }
        Ok(if missing > 0 { ExitCode::from(1) } else { ExitCode::SUCCESS })
    })
}
