//! A per-job bound on open descriptors.
//!
//! Every file or directory a guest opens is a real descriptor of the host
//! process (wasmtime-wasi opens it through cap-std), and WASI preview 1 sets
//! no bound of its own: one job that opens files in a loop takes all of the
//! worker's descriptors, and then the worker cannot accept a connection,
//! answer gossip or run anyone else's job. So the three calls that change
//! how many descriptors a job holds are shadowed here — `path_open` (+1),
//! `fd_close` and `fd_renumber` (−1) — each delegating to wasmtime-wasi's
//! own implementation, and a job at its bound gets `EMFILE` from
//! `path_open`, as a process at its `RLIMIT_NOFILE` would.
//!
//! Descriptors the sandbox opens for the job (stdio, preopened
//! directories) are not counted; closing one of those lets the job open one
//! more, so a job holds at most its bound plus those few.

use wasmtime::{AsContextMut, Caller, Extern, Linker};
use wasmtime_wasi::p1::types::Errno;
use wasmtime_wasi::p1::wasi_snapshot_preview1 as p1;
use wasmtime_wasi::p1::wasi_snapshot_preview1::WasiSnapshotPreview1 as _;

use super::JobState;

const MODULE: &str = "wasi_snapshot_preview1";

/// Descriptors a job may hold open unless the worker says otherwise
/// (`--max-open-files`).
pub const DEFAULT_MAX_OPEN_FILES: u32 = 256;

/// How many descriptors a job holds, against its bound.
#[derive(Clone, Copy, Debug)]
pub struct OpenFiles {
    /// Opened by the job and not closed.
    pub open: u32,
    /// The most it may hold.
    pub max: u32,
}

/// Calls wasmtime-wasi's implementation of a WASI p1 function with the
/// caller's memory and WASI context, as its own linker glue does.
macro_rules! delegate {
    ($caller:expr, $func:ident($($arg:expr),*)) => {{
        let caller: &mut Caller<'_, JobState> = $caller;
        let fuel = caller.as_context_mut().hostcall_fuel();
        match caller.get_export("memory") {
            Some(Extern::Memory(m)) => {
                let (mem, state) = m.data_and_store_mut(&mut *caller);
                state.wasi.set_hostcall_fuel(fuel);
                p1::$func(&mut state.wasi, &mut wiggle::GuestMemory::Unshared(mem), $($arg),*).await
            }
            Some(Extern::SharedMemory(m)) => {
                let state = caller.data_mut();
                state.wasi.set_hostcall_fuel(fuel);
                p1::$func(&mut state.wasi, &mut wiggle::GuestMemory::Shared(m.data()), $($arg),*).await
            }
            _ => Err(wasmtime::Error::msg("missing required memory export")),
        }
    }};
}

/// Shadows `path_open`, `fd_close` and `fd_renumber` in `linker` (which
/// already has wasmtime-wasi's p1 functions) with the counting versions.
pub fn add_to_linker(linker: &mut Linker<JobState>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    linker.func_wrap_async(
        MODULE,
        "path_open",
        |mut caller: Caller<'_, JobState>,
         (fd, dirflags, path, path_len, oflags, base, inheriting, fdflags, opened): (
            i32,
            i32,
            i32,
            i32,
            i32,
            i64,
            i64,
            i32,
            i32,
        )| {
            Box::new(async move {
                let files = caller.data().files;
                if files.open >= files.max {
                    return Ok(Errno::Mfile as i32);
                }
                let errno = delegate!(
                    &mut caller,
                    path_open(fd, dirflags, path, path_len, oflags, base, inheriting, fdflags, opened)
                )?;
                if errno == Errno::Success as i32 {
                    caller.data_mut().files.open += 1;
                }
                Ok(errno)
            })
        },
    )?;
    linker.func_wrap_async(MODULE, "fd_close", |mut caller: Caller<'_, JobState>, (fd,): (i32,)| {
        Box::new(async move {
            let errno = delegate!(&mut caller, fd_close(fd))?;
            closed(&mut caller, errno);
            Ok(errno)
        })
    })?;
    linker.func_wrap_async(MODULE, "fd_renumber", |mut caller: Caller<'_, JobState>, (from, to): (i32, i32)| {
        Box::new(async move {
            // Renumbering onto `to` closes what `to` was.
            let errno = delegate!(&mut caller, fd_renumber(from, to))?;
            closed(&mut caller, errno);
            Ok(errno)
        })
    })?;
    linker.allow_shadowing(false);
    Ok(())
}

fn closed(caller: &mut Caller<'_, JobState>, errno: i32) {
    if errno == Errno::Success as i32 {
        let files = &mut caller.data_mut().files;
        files.open = files.open.saturating_sub(1);
    }
}
