//! `peerwasm status`: the pool on one screen, per-tenant usage included.

use std::process::ExitCode;

use super::args::ViewArgs;
use crate::client::status::PoolStatus;

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    pub(super) view: ViewArgs,
}

/// The pool's status and, for `--pool-dir`, what its controller
/// (`peerwasm adapt`) is doing: a pool at `--min 0` has a controller and
/// no worker.
pub fn run(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let controller = args.view.controller();
    let view = match (&controller, args.view.peers.is_empty()) {
        (Some(_), true) => Vec::new(),
        _ => args.view.fetch()?,
    };
    let status = PoolStatus::from_view(&view);
    let Some(c) = controller else {
        return args.view.print(&status, &status);
    };
    let mut json = serde_json::to_value(&status)?;
    json["controller"] = serde_json::to_value(&c)?;
    let text = format!(
        "{status}\ngrown by peerwasm adapt {} (on {}, pid {}, up to {} workers): {}",
        c.name, c.host, c.pid, c.max_workers, c.status
    );
    args.view.print(&json, text)
}
