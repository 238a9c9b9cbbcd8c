//! `peerwasm status`: the pool on one screen, per-tenant usage included.

use std::process::ExitCode;

use super::args::ViewArgs;
use crate::client::status::PoolStatus;

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    pub(super) view: ViewArgs,
}

pub fn run(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let status = PoolStatus::from_view(&args.view.fetch()?);
    args.view.print(&status, &status)
}
