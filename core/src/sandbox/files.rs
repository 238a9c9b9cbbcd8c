//! What a job's files may take from the host: descriptors and disk.
//!
//! Every file or directory a guest opens is a real descriptor of the host
//! process (wasmtime-wasi opens it through cap-std), and every byte it
//! writes to a file lands on the host's disk; WASI preview 1 bounds
//! neither. One job that opens files in a loop would take all of the
//! worker's descriptors (then the worker cannot accept a connection, answer
//! gossip or run anyone else's job); one that writes without end would fill
//! the disk. So the calls that change either are shadowed here, each
//! delegating to wasmtime-wasi's own implementation:
//!
//! * `path_open` (+1 descriptor), `fd_close` and `fd_renumber` (−1): a job
//!   at its bound gets `EMFILE`, as a process at its `RLIMIT_NOFILE` would.
//!   Descriptors the sandbox opens for the job (stdio, preopened
//!   directories) are not counted;
//! * writes (`fd_write`, `fd_pwrite`) to anything but the job's own stdio,
//!   and every call that creates a name: a job past its disk bound gets
//!   `ENOSPC`. What is counted is what the call can make the disk hold, an
//!   upper bound: the bytes written (overwriting counts again); for each
//!   file, directory or symlink created (`path_open` with `creat`,
//!   `path_create_directory`, `path_symlink`) one block and one inode
//!   ([`NEW_INODE_BYTES`]: so a file's blocks, rounded up, are always
//!   covered, and a symlink's target too); for each name added to a
//!   directory (`path_link`, `path_rename`) one block ([`BLOCK_BYTES`]: the
//!   directory may grow by one). The same count is also added to a
//!   [`ScratchPool`] shared by every running job, so together they stay
//!   within the worker's total too (a job's share is given back when it
//!   ends and its scratch directory is removed).
//!
//! A symbolic link that could point out of its directory (an absolute
//! target, a `..` in it) is not made at all ([`points_out`]): WASI never
//! follows one out, but the host's own programs would, in a directory a
//! job wrote in place.
//!
//! Whether a write lands on disk is decided by what the descriptor *is*,
//! never by its number: descriptors 0–2 are the job's stdio (captured in
//! memory, within their own caps) only until the job closes one or
//! renumbers something onto it ([`FileUse::stdio`]). The counting itself
//! (what a job holds, the worker's total) is `disk.rs`'s; this file is the
//! shadowed calls.

use wasmtime::{AsContextMut, Caller, Extern, Linker};
use wasmtime_wasi::p1::types::Errno;
use wasmtime_wasi::p1::wasi_snapshot_preview1 as p1;
use wasmtime_wasi::p1::wasi_snapshot_preview1::WasiSnapshotPreview1 as _;

pub use super::disk::{BLOCK_BYTES, DEFAULT_MAX_OPEN_FILES, FileUse, NEW_INODE_BYTES, ScratchPool};
use super::job_state::JobState;

const MODULE: &str = "wasi_snapshot_preview1";

/// WASI p1's `oflags::creat`.
const O_CREAT: i32 = 1;

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

/// Shadows the calls named in the module docs in `linker` (which already
/// has wasmtime-wasi's p1 functions) with the counting versions.
///
/// Long for a reason: it is the table of shadowed calls, one registration
/// each, read best side by side with the module docs' list.
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
                if caller.data().files.open >= caller.data().files.max_open {
                    return Ok(Errno::Mfile as i32);
                }
                let creates = if oflags & O_CREAT != 0 {
                    NEW_INODE_BYTES
                } else {
                    0
                };
                if !caller.data_mut().files.take(creates) {
                    return Ok(Errno::Nospc as i32);
                }
                let errno = delegate!(
                    &mut caller,
                    path_open(
                        fd, dirflags, path, path_len, oflags, base, inheriting, fdflags, opened
                    )
                )?;
                let files = &mut caller.data_mut().files;
                if errno == Errno::Success as i32 {
                    files.open += 1;
                } else {
                    files.settle(creates, 0);
                }
                Ok(errno)
            })
        },
    )?;
    linker.func_wrap_async(
        MODULE,
        "fd_close",
        |mut caller: Caller<'_, JobState>, (fd,): (i32,)| {
            Box::new(async move {
                let errno = delegate!(&mut caller, fd_close(fd))?;
                if errno == Errno::Success as i32 {
                    caller.data_mut().files.closed(fd);
                }
                closed(&mut caller, errno);
                Ok(errno)
            })
        },
    )?;
    linker.func_wrap_async(
        MODULE,
        "fd_renumber",
        |mut caller: Caller<'_, JobState>, (from, to): (i32, i32)| {
            Box::new(async move {
                // Renumbering onto `to` closes what `to` was.
                let errno = delegate!(&mut caller, fd_renumber(from, to))?;
                if errno == Errno::Success as i32 {
                    caller.data_mut().files.renumbered(from, to);
                }
                closed(&mut caller, errno);
                Ok(errno)
            })
        },
    )?;
    // Calls that create a name: each takes its charge first, and gives it
    // back if the call failed.
    macro_rules! counted_name {
        ($name:literal, $func:ident, $charge:expr, ($($arg:ident: $ty:ty),*) $(, refused_if $guard:ident($($garg:ident),*))?) => {
            linker.func_wrap_async(MODULE, $name, |mut caller: Caller<'_, JobState>, ($($arg,)*): ($($ty,)*)| {
                Box::new(async move {
                    $(if $guard(&mut caller, $($garg),*) {
                        return Ok(Errno::Perm as i32);
                    })?
                    let charge: u64 = $charge;
                    if !caller.data_mut().files.take(charge) {
                        return Ok(Errno::Nospc as i32);
                    }
                    let errno = delegate!(&mut caller, $func($($arg),*))?;
                    let kept = if errno == Errno::Success as i32 { charge } else { 0 };
                    caller.data_mut().files.settle(charge, kept);
                    Ok(errno)
                })
            })?;
        };
    }
    counted_name!("path_create_directory", path_create_directory, NEW_INODE_BYTES, (fd: i32, path: i32, path_len: i32));
    counted_name!(
        "path_symlink",
        path_symlink,
        NEW_INODE_BYTES,
        (old_path: i32, old_path_len: i32, fd: i32, new_path: i32, new_path_len: i32),
        refused_if link_points_out(old_path, old_path_len)
    );
    counted_name!(
        "path_link",
        path_link,
        BLOCK_BYTES,
        (old_fd: i32, old_flags: i32, old_path: i32, old_path_len: i32, new_fd: i32, new_path: i32, new_path_len: i32)
    );
    counted_name!(
        "path_rename",
        path_rename,
        BLOCK_BYTES,
        (fd: i32, old_path: i32, old_path_len: i32, new_fd: i32, new_path: i32, new_path_len: i32)
    );
    // A write to a file first takes what it asks for from the job's (and
    // the worker's) bound, then keeps what it wrote.
    macro_rules! counted_write {
        ($name:literal, $func:ident, ($($arg:ident: $ty:ty),*)) => {
            linker.func_wrap_async(
                MODULE,
                $name,
                |mut caller: Caller<'_, JobState>, (fd, iovs, iovs_len, $($arg,)* written): (i32, i32, i32, $($ty,)* i32)| {
                    Box::new(async move {
                        let taken = if caller.data().files.on_disk(fd) { asked(&mut caller, iovs, iovs_len) } else { 0 };
                        if !caller.data_mut().files.take(taken) {
                            return Ok(Errno::Nospc as i32);
                        }
                        let errno = delegate!(&mut caller, $func(fd, iovs, iovs_len, $($arg,)* written))?;
                        settle(&mut caller, errno, taken, written);
                        Ok(errno)
                    })
                },
            )?;
        };
    }
    counted_write!("fd_write", fd_write, ());
    counted_write!("fd_pwrite", fd_pwrite, (offset: i64));
    linker.allow_shadowing(false);
    Ok(())
}

/// Whether a symbolic link to `target` could lead out of the directory it
/// is made in, for whoever follows it later on the host — the caller of an
/// embedded job reading its `outputs=` directory, a tool working in a
/// writable `--dir`: an absolute target, or one with a `..` component.
/// WASI itself never follows a link out, but the host's own programs do.
/// A link that only points down cannot lead out however links are chained
/// or moved; one with `..` can (`s -> .`, then `t -> s/s/../..`), so none
/// is made (`EPERM`, as for an absolute target).
pub fn points_out(target: &[u8]) -> bool {
    target.first() == Some(&b'/') || target.split(|&b| b == b'/').any(|part| part == b"..")
}

/// [`points_out`] for the target a guest's `path_symlink` names at
/// `at..at + len` of its memory (false when that is out of bounds: the
/// call itself then fails).
fn link_points_out(caller: &mut Caller<'_, JobState>, at: i32, len: i32) -> bool {
    let Some(Extern::Memory(m)) = caller.get_export("memory") else {
        return false;
    };
    let (at, len) = (at as u32 as usize, len as u32 as usize);
    m.data(&*caller)
        .get(at..at.saturating_add(len))
        .is_some_and(points_out)
}

/// After a write that took `taken` bytes: keeps what it wrote (the count
/// the guest's memory holds at `written`), gives back the rest.
fn settle(caller: &mut Caller<'_, JobState>, errno: i32, taken: u64, written: i32) {
    if taken == 0 {
        return;
    }
    let n = if errno == Errno::Success as i32 {
        read_u32(caller, written).min(taken)
    } else {
        0
    };
    caller.data_mut().files.settle(taken, n);
}

/// The bytes a write of the iovecs at `iovs` asks for: all of them, every
/// iovec counted however many there are (an upper bound: wasmtime-wasi
/// writes the first that is not empty). Iovecs past the guest's memory
/// count nothing; the write itself then fails.
fn asked(caller: &mut Caller<'_, JobState>, iovs: i32, iovs_len: i32) -> u64 {
    let Some(Extern::Memory(m)) = caller.get_export("memory") else {
        return 0;
    };
    let data = m.data(&*caller);
    let (base, n) = (iovs as u32 as usize, iovs_len as u32 as usize);
    (0..n)
        .map_while(|i| data.get(base + 8 * i + 4..base + 8 * i + 8))
        .map(|len| u32::from_le_bytes(len.try_into().expect("four bytes")) as u64)
        .fold(0u64, u64::saturating_add)
}

/// The little-endian u32 the guest's memory holds at `at` (0 if out of
/// bounds).
fn read_u32(caller: &mut Caller<'_, JobState>, at: i32) -> u64 {
    let Some(Extern::Memory(m)) = caller.get_export("memory") else {
        return 0;
    };
    let at = at as u32 as usize;
    m.data(&*caller).get(at..at + 4).map_or(0, |b| {
        u32::from_le_bytes(b.try_into().expect("four bytes")) as u64
    })
}

fn closed(caller: &mut Caller<'_, JobState>, errno: i32) {
    if errno == Errno::Success as i32 {
        let files = &mut caller.data_mut().files;
        files.open = files.open.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::points_out;

    #[test]
    fn links_that_could_lead_out_of_their_directory_are_told_apart() {
        for out in ["/etc", "..", "../x", "a/../../x", "a/..", "s/s/../..", "/"] {
            assert!(points_out(out.as_bytes()), "{out}");
        }
        for inside in ["x", "a/b", "./a", ".", "", "a/..b", "..a/b", "a//b"] {
            assert!(!points_out(inside.as_bytes()), "{inside}");
        }
    }
}
