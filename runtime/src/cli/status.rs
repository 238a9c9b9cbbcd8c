//! `peerwasm status`: the pool on one screen, per-tenant usage included.

use std::process::ExitCode;

use crate::client::status::PoolStatus;

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// Workers to ask, comma-separated host:port (the first that answers).
    #[arg(long, value_delimiter = ',', env = "PEERWASM_PEERS", value_name = "ADDR,...", required = true)]
    peers: Vec<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let http = reqwest::Client::builder().timeout(std::time::Duration::from_secs(10)).build()?;
    let view = runtime.block_on(crate::client::fetch_peers(&http, &args.peers))?;
    let status = PoolStatus::from_view(&view);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        println!("{status}");
    }
    Ok(ExitCode::SUCCESS)
}
