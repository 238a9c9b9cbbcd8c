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
    // A pool directory with a controller may have no worker yet.
    let view = if args.view.peers.is_empty() {
        Vec::new()
    } else {
        args.view.fetch()?
    };
    args.view.print(&view, crate::gossip::peers_table(&view))
}
