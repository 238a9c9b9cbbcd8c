//! `peerwasm peers`: the pool as a worker's gossip sees it (FieldTrip's
//! peerlist).

use std::process::ExitCode;

#[derive(clap::Args, Debug)]
pub struct PeersArgs {
    /// Workers to ask, comma-separated host:port (the first that answers).
    #[arg(long, value_delimiter = ',', env = "PEERWASM_PEERS", value_name = "ADDR,...", required = true)]
    peers: Vec<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(args: PeersArgs) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let http = reqwest::Client::builder().timeout(std::time::Duration::from_secs(10)).build()?;
    let view = runtime.block_on(crate::client::fetch_peers(&http, &args.peers))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&view)?);
    } else {
        println!("{}", crate::client::peers_table(&view));
    }
    Ok(ExitCode::SUCCESS)
}
