//! A job's scratch directory ([`Scratch`]): the writable directory a job
//! that can open files sees at [`SCRATCH_GUEST_PATH`](super::SCRATCH_GUEST_PATH),
//! made for it in the sandbox's jobs directory and gone when it ends.
//!
//! Why one is sometimes kept: most jobs of a map never write a file, and
//! making and removing a directory costs ~0.1 ms on a journaled filesystem
//! (ext4 mounted with `discard` here: the freed block is discarded before
//! `rmdir` returns) — a fifth of a small Python item's whole cost. A
//! directory its job left empty holds nothing of that job's: a name is all
//! a WASI preview 1 guest can leave in a directory (it can change neither
//! its mode nor its owner, nor remove or rename the directory it was given),
//! and there is none. So it is kept for the next job, whoever's; one that
//! holds anything is removed with what it holds, as every one was before.
//! Whether it is empty is read from the directory itself once its job can
//! no longer run, not from what the job was counted to have written. What
//! else a guest can leave on it the next job — another tenant's — could
//! read: its times (`path_filestat_set_times` on its `/tmp`), set to the
//! present as it is kept; and its size, which grows with the names a
//! directory has held (ext4 never shrinks one): one no longer the size it
//! was made with is removed.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use tempfile::TempDir;

/// Empty scratch directories a sandbox keeps for the next jobs: as many as
/// jobs run at once on a large worker; beyond that an empty one is removed.
pub(super) const SPARES_KEPT: usize = 16;

/// A job's scratch directory, held while the job runs: dropped, it is
/// removed — or kept for the next job if its job left it empty.
#[derive(Debug)]
pub(super) struct Scratch {
    dir: Option<TempDir>,
    /// Its size as made (`st_size`).
    made: u64,
    spares: Arc<Spares>,
}

impl Scratch {
    /// Where it is on the host.
    pub(super) fn path(&self) -> &Path {
        self.dir.as_ref().map_or(Path::new(""), |d| d.path())
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let Some(dir) = self.dir.take() else { return };
        if as_made(dir.path(), self.made) && times_reset(dir.path()) {
            let mut spares = self.spares.dirs.lock();
            if spares.len() < SPARES_KEPT {
                spares.push((dir, self.made));
            }
        }
        // Otherwise `dir` drops here: removed with what it holds.
    }
}

/// The empty scratch directories a sandbox keeps (removed with it).
#[derive(Debug, Default)]
pub(super) struct Spares {
    dirs: Mutex<Vec<(TempDir, u64)>>,
}

impl Spares {
    /// How many are kept now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.dirs.lock().len()
    }
}

/// Whether `dir` is a directory with nothing in it, of the size it was
/// made with.
fn as_made(dir: &Path, made: u64) -> bool {
    std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir() && m.len() == made)
        && std::fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_none())
}

/// Sets `dir`'s access and modification times to now (what a new one's
/// read); false if they could not be.
fn times_reset(dir: &Path) -> bool {
    let now = std::time::SystemTime::now();
    let times = std::fs::FileTimes::new()
        .set_accessed(now)
        .set_modified(now);
    std::fs::File::open(dir)
        .and_then(|d| d.set_times(times))
        .is_ok()
}

impl super::Sandbox {
    /// A scratch directory for a job: a kept empty one, else a new one in
    /// [`jobs_dir`](Self::jobs_dir).
    pub(super) fn scratch_dir(&self) -> std::io::Result<Scratch> {
        take(&self.spare_scratch, self.jobs_dir())
    }

    /// Where jobs' scratch directories are made, and a worker lays out
    /// their trees: a directory of this sandbox's own under `scratch_root`
    /// when `claim_jobs_dir`, claimed while it lives so that what a killed
    /// process's jobs left is removed by the next one to start there
    /// (`workdir`); else `scratch_root`. None: the system's temporary
    /// directory.
    pub fn jobs_dir(&self) -> Option<PathBuf> {
        super::workdir::for_jobs(self.work.as_ref(), self.config.scratch_root.as_deref())
    }
}

/// A kept empty directory of `spares`, else a new one under `root` (the
/// system's temporary directory when none).
fn take(spares: &Arc<Spares>, root: Option<PathBuf>) -> std::io::Result<Scratch> {
    // One removed from under us since (a cleaner of old temporary files)
    // is let go, and a new one made.
    let kept = spares
        .dirs
        .lock()
        .pop()
        .filter(|(dir, _)| dir.path().is_dir());
    let (dir, made) = match kept {
        Some(kept) => kept,
        None => {
            let b = tempfile::Builder::new().prefix("peerwasm-job-").to_owned();
            let dir = match root {
                Some(root) => b.tempdir_in(root)?,
                None => b.tempdir()?,
            };
            let made = std::fs::metadata(dir.path())?.len();
            (dir, made)
        }
    };
    Ok(Scratch {
        dir: Some(dir),
        made,
        spares: spares.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_scratch_is_kept_for_the_next_job_and_one_holding_anything_is_removed() {
        let root = tempfile::tempdir().unwrap();
        let spares = Arc::new(Spares::default());
        let first = take(&spares, Some(root.path().into())).unwrap();
        let kept = first.path().to_path_buf();
        drop(first);
        assert!(kept.is_dir(), "left empty: kept");
        assert_eq!(spares.len(), 1);

        let second = take(&spares, Some(root.path().into())).unwrap();
        assert_eq!(second.path(), kept, "the next job has it");
        assert_eq!(spares.len(), 0, "and no one else while it runs");
        std::fs::create_dir(second.path().join("d")).unwrap();
        std::fs::write(second.path().join("d/f"), b"tenant A's").unwrap();
        drop(second);
        assert!(!kept.exists(), "it held something: removed with it");
        assert_eq!(spares.len(), 0);

        let third = take(&spares, Some(root.path().into())).unwrap();
        assert_ne!(third.path(), kept, "a new one");
        assert_eq!(std::fs::read_dir(third.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_kept_scratch_does_not_carry_the_times_its_job_set() {
        let root = tempfile::tempdir().unwrap();
        let spares = Arc::new(Spares::default());
        let first = take(&spares, Some(root.path().into())).unwrap();
        // What a guest can do to its /tmp: set its times, to anything.
        let long_ago = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1234567);
        let times = std::fs::FileTimes::new()
            .set_accessed(long_ago)
            .set_modified(long_ago);
        std::fs::File::open(first.path())
            .unwrap()
            .set_times(times)
            .unwrap();
        drop(first);
        let second = take(&spares, Some(root.path().into())).unwrap();
        let meta = std::fs::metadata(second.path()).unwrap();
        let age = |t: std::time::SystemTime| t.elapsed().unwrap_or_default();
        assert_eq!(spares.len(), 0, "the kept one");
        assert!(age(meta.modified().unwrap()) < std::time::Duration::from_secs(600));
        assert!(age(meta.accessed().unwrap()) < std::time::Duration::from_secs(600));
    }

    #[test]
    fn an_empty_scratch_grown_by_the_names_it_held_is_removed() {
        let root = tempfile::tempdir().unwrap();
        let spares = Arc::new(Spares::default());
        let first = take(&spares, Some(root.path().into())).unwrap();
        let made = std::fs::metadata(first.path()).unwrap().len();
        // Names enough to grow the directory past its first block, then
        // removed: empty, but its size tells how many there were.
        let mut n = 0;
        while std::fs::metadata(first.path()).unwrap().len() == made && n < 100_000 {
            std::fs::write(first.path().join(format!("{n:0>200}")), b"").unwrap();
            n += 1;
        }
        for entry in std::fs::read_dir(first.path()).unwrap() {
            std::fs::remove_file(entry.unwrap().path()).unwrap();
        }
        let grown = std::fs::metadata(first.path()).unwrap().len();
        let path = first.path().to_path_buf();
        drop(first);
        if grown != made {
            assert!(!path.exists(), "{made} -> {grown} bytes: removed");
            assert_eq!(spares.len(), 0);
        } else {
            // A filesystem that shrinks directories (tmpfs): nothing to tell.
            assert_eq!(spares.len(), 1);
        }
    }

    #[test]
    fn a_kept_scratch_removed_from_under_the_sandbox_is_made_again() {
        let root = tempfile::tempdir().unwrap();
        let spares = Arc::new(Spares::default());
        let first = take(&spares, Some(root.path().into())).unwrap();
        let kept = first.path().to_path_buf();
        drop(first);
        std::fs::remove_dir(&kept).unwrap();
        let second = take(&spares, Some(root.path().into())).unwrap();
        assert!(second.path().is_dir(), "{}", second.path().display());
    }

    #[test]
    fn at_most_spares_kept_empty_directories_stay() {
        let root = tempfile::tempdir().unwrap();
        let spares = Arc::new(Spares::default());
        let running: Vec<Scratch> = (0..SPARES_KEPT + 3)
            .map(|_| take(&spares, Some(root.path().into())).unwrap())
            .collect();
        drop(running);
        assert_eq!(spares.len(), SPARES_KEPT);
        assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), SPARES_KEPT);
        drop(spares);
        assert_eq!(
            std::fs::read_dir(root.path()).unwrap().count(),
            0,
            "removed with the sandbox"
        );
    }
}
