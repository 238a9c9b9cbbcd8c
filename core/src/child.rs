//! Child processes of ours — a worker's slot processes, a compile apart —
//! and what they do first.
//!
//! Why not between fork and exec, where such set-up usually goes
//! (`pre_exec`): a parent that embeds us may have fork handlers, and they
//! run on `fork`. The Python client is such a parent: scipy's OpenBLAS
//! shuts its thread pool down before a fork and waits for its threads,
//! which can wait forever — the map hung at its second slot process. A
//! command with no `pre_exec` is started with `posix_spawn`, which runs no
//! fork handlers; so the child does its own set-up, first thing:
//!
//! * it dies with the parent that started it (`PR_SET_PDEATHSIG`), and
//!   ends at once if that parent is already gone — it was told its
//!   parent's pid ([`PARENT_ENV`]), since after a parent's death the
//!   child's parent is whichever process adopts it;
//! * it leaves Ctrl-C to its parent: SIGINT reaches a terminal's whole
//!   process group, and the parent decides what it means (a worker
//!   drains, the Python client cancels its map), where a child ended by it
//!   would turn its job into a failure first.

use std::ffi::OsStr;

/// The environment variable that tells a child its parent's pid.
pub const PARENT_ENV: &str = "PEERWASM_PARENT";

/// A command that starts `exe` with `args` as a child of this process,
/// told whose child it is. Add no `pre_exec` to it (see the module docs).
pub fn command<I, S>(exe: impl AsRef<OsStr>, args: I) -> std::process::Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut command = std::process::Command::new(exe);
    command
        .args(args)
        .env(PARENT_ENV, std::process::id().to_string());
    command
}

/// A child's first step: die with its parent, leave Ctrl-C to it. `Err`
/// when the parent is gone already, or the kernel refuses.
pub fn start() -> anyhow::Result<()> {
    // SAFETY: prctl, signal and getppid have no memory-safety
    // preconditions.
    unsafe {
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
            anyhow::bail!(
                "cannot tie this process to its parent: {}",
                std::io::Error::last_os_error()
            );
        }
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        // Told, and the parent now is another: the one that started us
        // died before the line above took effect.
        let told = std::env::var(PARENT_ENV)
            .ok()
            .and_then(|p| p.parse::<i32>().ok());
        if let Some(parent) = told
            && libc::getppid() != parent
        {
            anyhow::bail!("the process that started this one is gone");
        }
    }
    Ok(())
}
