//! `peerwasm peers`: the pool as a worker's gossip sees it (FieldTrip's
//! peerlist).

use std::process::ExitCode;

use super::args::ViewArgs;

#[derive(clap::Args, Debug)]
pub struct PeersArgs {
    #[command(flatten)]
    pub(super) view: ViewArgs,
}

pub fn run(args: PeersArgs) -> anyhow::Result<ExitCode> {
    let view = args.view.fetch()?;
    args.view.print(&view, crate::gossip::peers_table(&view))
}
