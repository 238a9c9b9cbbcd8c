//! Temporary directories a worker makes for itself — its file store
//! (`peerwasm-files-*`, up to `--file-store`, 10 GiB by default), a
//! temporary state dir (`peerwasm-state-*`), each slot process's scratch
//! (`peerwasm-slot-*`), the directory a sandbox makes its jobs' scratch
//! and laid-out trees in (`peerwasm-jobs-*`: `sandbox::workdir`) — and
//! what a worker that was killed leaves of them.
//!
//! Why: a worker removes them as it stops, but one killed with SIGKILL (the
//! kernel's OOM killer, Slurm's `scancel` past its grace, a laptop's lid
//! shut mid-job and a `kill -9` later) cannot, and on a cluster node's
//! shared `/tmp` every such death left up to hundreds of MiB (found here:
//! the state dirs, file stores and slot scratch of thousands of killed
//! test workers filled the disk). So each directory is *claimed* while in use — an
//! exclusive `flock` on a file inside it, which the kernel lets go when the
//! process dies however it dies — and a worker starting *sweeps* its
//! parent: a directory of its kind whose lock nobody holds is a dead
//! process's, and goes.
//!
//! What is never swept: anything that is not a real directory of this
//! user's named with the prefix, a directory without the lock file (a
//! process that has not claimed it yet, or an older version's), and one
//! whose lock file is younger than the grace period (made, not yet locked).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

/// The lock file a claimed directory holds (a state dir's is its own,
/// `lock`).
pub const CLAIM_FILE: &str = ".peerwasm-claim";

/// How young a lock file may be and still be spared: the moment between
/// making it and locking it.
pub const GRACE: Duration = Duration::from_secs(30);

/// A directory claimed by this process: held while this value lives (and
/// let go by the kernel when the process dies).
#[derive(Debug)]
pub struct Claim {
    _lock: File,
}

/// Claims `dir`, just made by this process, through its [`CLAIM_FILE`].
pub fn claim(dir: &Path) -> std::io::Result<Claim> {
    let file = File::create(dir.join(CLAIM_FILE))?;
    // SAFETY: flock(2) on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(Claim { _lock: file })
}

/// Removes the directories under `parent` named `prefix*` whose lock file
/// (`lock_name` inside each) no process holds and is older than `grace`;
/// returns how many went. Errors reading `parent` or removing one are
/// left alone: sweeping is tidying, never a reason to fail.
pub fn sweep(parent: &Path, prefix: &str, lock_name: &str, grace: Duration) -> usize {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return 0;
    };
    // SAFETY: geteuid(2) has no failure mode.
    let me = unsafe { libc::geteuid() };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with(prefix) {
            continue;
        }
        let dir = entry.path();
        // Not followed: a link named like ours is not ours to judge.
        match std::fs::symlink_metadata(&dir) {
            Ok(m) if m.is_dir() && m.uid() == me => {}
            _ => continue,
        }
        if dead(&dir.join(lock_name), grace) && std::fs::remove_dir_all(&dir).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// Whether the lock file at `path` is a dead process's: a plain file older
/// than `grace` whose exclusive lock can be taken. The lock is held until
/// this returns — by then the directory is being removed by the caller, and
/// no process can come back to it.
fn dead(path: &Path, grace: Duration) -> bool {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return false;
    };
    let old = meta
        .modified()
        .ok()
        .and_then(|t| SystemTime::now().duration_since(t).ok())
        .is_some_and(|age| age >= grace);
    if !meta.is_file() || !old {
        return false;
    }
    let Ok(file) = File::open(path) else {
        return false;
    };
    // SAFETY: flock(2) on a descriptor we own.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_directories_nobody_holds_go() {
        let parent = tempfile::tempdir().unwrap();
        let make = |name: &str| {
            let dir = parent.path().join(name);
            std::fs::create_dir(&dir).unwrap();
            std::fs::write(dir.join("data"), b"x").unwrap();
            dir
        };
        let live = make("peerwasm-files-live");
        let _held = claim(&live).unwrap();
        let dead_dir = make("peerwasm-files-dead");
        drop(claim(&dead_dir).unwrap()); // as the kernel does when it dies
        let unclaimed = make("peerwasm-files-unclaimed");
        let other = make("mine-files-dead");
        drop(claim(&other).unwrap());
        let target = make("elsewhere");
        drop(claim(&target).unwrap());
        std::os::unix::fs::symlink(&target, parent.path().join("peerwasm-files-link")).unwrap();

        // Within the grace period even a dead one stays (made, not locked yet).
        assert_eq!(
            sweep(parent.path(), "peerwasm-files-", CLAIM_FILE, GRACE),
            0
        );
        assert_eq!(
            sweep(parent.path(), "peerwasm-files-", CLAIM_FILE, Duration::ZERO),
            1
        );
        assert!(!dead_dir.exists(), "a dead process's directory went");
        for kept in [&live, &unclaimed, &other, &target] {
            assert!(kept.join("data").exists(), "{} was kept", kept.display());
        }
        assert!(parent.path().join("peerwasm-files-link").exists());
    }
}
