//! The directory a sandbox makes its jobs' scratch directories in (and a
//! worker lays out their shipped trees in): one of its own,
//! `peerwasm-jobs-*` under `scratch_root` (or the system's temporary
//! directory), claimed while the sandbox lives ([`crate::leftovers`]).
//!
//! Why: a job's scratch is removed when the job ends, and a worker's own
//! directories when it stops — but a worker killed mid-job (the OOM
//! killer, `scancel` past its grace, `kill -9`) removed neither, and its
//! running jobs' scratch and laid-out trees (whatever the guests wrote, up
//! to the disk budget; a copy of each tree) stayed on the node's disk. Now
//! they live inside one claimed directory, which the next sandbox to start
//! under the same parent removes. The claim's lock file is in this
//! directory, beside the jobs' — never in a directory a guest sees.

use std::path::{Path, PathBuf};

use crate::leftovers::{self, Claim};

/// What the directories are named.
pub const PREFIX: &str = "peerwasm-jobs-";

/// A sandbox's directory for its jobs, claimed while this lives; removed
/// (with what is left in it) when it is dropped.
#[derive(Debug)]
pub(super) struct WorkDir {
    // Declared first: the lock is let go before the directory goes.
    _claim: Claim,
    dir: tempfile::TempDir,
}

impl WorkDir {
    /// Makes one under `root` (the system's temporary directory when
    /// none), after removing those of dead processes there.
    pub(super) fn make(root: Option<&Path>) -> std::io::Result<WorkDir> {
        let parent = root.map_or_else(std::env::temp_dir, Path::to_path_buf);
        std::fs::create_dir_all(&parent)?;
        let swept = leftovers::sweep(&parent, PREFIX, leftovers::CLAIM_FILE, leftovers::GRACE);
        if swept > 0 {
            tracing::info!(
                "removed {swept} job directories killed processes left in {}",
                parent.display()
            );
        }
        let dir = tempfile::Builder::new()
            .prefix(PREFIX)
            .tempdir_in(&parent)?;
        let claim = leftovers::claim(dir.path())?;
        Ok(WorkDir { _claim: claim, dir })
    }

    pub(super) fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// Where jobs' directories go: `work`'s, else `root` (else the system's
/// temporary directory).
pub(super) fn for_jobs(work: Option<&WorkDir>, root: Option<&Path>) -> Option<PathBuf> {
    work.map(|w| w.path().to_path_buf())
        .or_else(|| root.map(Path::to_path_buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_work_dir_is_claimed_and_a_dead_ones_is_swept() {
        let root = tempfile::tempdir().unwrap();
        // What a killed process left: its claim file, held by nobody, old.
        let dead = root.path().join(format!("{PREFIX}dead"));
        std::fs::create_dir_all(dead.join("peerwasm-job-x")).unwrap();
        std::fs::write(dead.join("peerwasm-job-x/out.bin"), b"left").unwrap();
        let lock = std::fs::File::create(dead.join(leftovers::CLAIM_FILE)).unwrap();
        let old = std::time::SystemTime::now() - leftovers::GRACE * 2;
        lock.set_modified(old).unwrap();
        drop(lock);
        let work = WorkDir::make(Some(root.path())).unwrap();
        assert!(!dead.exists(), "a dead process's job directories go");
        assert!(work.path().join(leftovers::CLAIM_FILE).is_file());
        // A live one's stays, however old its lock file.
        let lock = std::fs::File::open(work.path().join(leftovers::CLAIM_FILE)).unwrap();
        lock.set_modified(old).unwrap();
        let other = WorkDir::make(Some(root.path())).unwrap();
        assert!(work.path().is_dir() && other.path().is_dir());
        let path = work.path().to_path_buf();
        drop(work);
        assert!(!path.exists(), "removed when dropped");
    }
}
