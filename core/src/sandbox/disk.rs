//! What a job's files take, as counted against its bounds ([`FileUse`]) and
//! against the worker's total ([`ScratchPool`]); the rules are in the
//! docs of `files.rs`, which shadows the WASI calls that change them.

/// Descriptors a job may hold open unless the worker says otherwise
/// (`--max-open-files`).
pub const DEFAULT_MAX_OPEN_FILES: u32 = 256;

/// One block of the disk, as counted.
pub const BLOCK_BYTES: u64 = 4096;

/// What creating a file, a directory or a symlink counts against the disk
/// bound: one block and one inode.
pub const NEW_INODE_BYTES: u64 = BLOCK_BYTES + 512;

/// Bytes every running job has written, against the worker's total.
#[derive(Debug)]
pub struct ScratchPool {
    in_use: std::sync::atomic::AtomicU64,
    total: std::sync::atomic::AtomicU64,
}

impl ScratchPool {
    /// A pool of `total` bytes.
    pub fn new(total: u64) -> ScratchPool {
        ScratchPool {
            in_use: std::sync::atomic::AtomicU64::new(0),
            total: std::sync::atomic::AtomicU64::new(total),
        }
    }

    /// Takes `bytes` if they fit.
    pub fn take(&self, bytes: u64) -> bool {
        use std::sync::atomic::Ordering;
        let total = self.total.load(Ordering::Relaxed);
        self.in_use
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(bytes).filter(|&after| after <= total)
            })
            .is_ok()
    }

    /// Takes as much of `bytes` as is free; returns how much it took. What
    /// a job run in a slot process is given up front (its process cannot
    /// share this pool's counter).
    pub fn take_up_to(&self, bytes: u64) -> u64 {
        use std::sync::atomic::Ordering;
        let total = self.total.load(Ordering::Relaxed);
        let mut took = 0;
        let _ = self
            .in_use
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                took = total.saturating_sub(used).min(bytes);
                Some(used + took)
            });
        took
    }

    /// Sets the total (a slot process: to what its parent gave the job).
    pub fn set_total(&self, total: u64) {
        self.total
            .store(total, std::sync::atomic::Ordering::Relaxed);
    }

    /// Gives back what a job that ended had taken.
    pub fn give_back(&self, bytes: u64) {
        let _ = self.in_use.fetch_update(
            std::sync::atomic::Ordering::Relaxed,
            std::sync::atomic::Ordering::Relaxed,
            |used| Some(used.saturating_sub(bytes)),
        );
    }

    /// Bytes taken now.
    pub fn in_use(&self) -> u64 {
        self.in_use.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// What a job's files hold, against its bounds.
#[derive(Clone, Debug)]
pub struct FileUse {
    /// Descriptors opened by the job and not closed.
    pub open: u32,
    /// The most it may hold.
    pub max_open: u32,
    /// Bytes written to files and created, as counted (see the module docs).
    pub written: u64,
    /// The most it may write.
    pub max_written: u64,
    /// The worker's total, shared with the other running jobs.
    pub pool: Option<std::sync::Arc<ScratchPool>>,
    /// The descriptors that are still the job's stdio (0, 1, 2 at start):
    /// writes to them are not on disk. Closing one, or renumbering onto
    /// it, takes it out; renumbering one moves it.
    pub stdio: Vec<i32>,
}

impl FileUse {
    /// Nothing used yet, under these bounds.
    pub fn new(
        max_open: u32,
        max_written: u64,
        pool: Option<std::sync::Arc<ScratchPool>>,
    ) -> FileUse {
        FileUse {
            open: 0,
            max_open,
            written: 0,
            max_written,
            pool,
            stdio: vec![0, 1, 2],
        }
    }

    /// Whether writes to `fd` land on disk: anything but the job's stdio.
    pub(super) fn on_disk(&self, fd: i32) -> bool {
        !self.stdio.contains(&fd)
    }

    /// `fd` was closed.
    pub(super) fn closed(&mut self, fd: i32) {
        self.stdio.retain(|&s| s != fd);
    }

    /// `from` was renumbered onto `to` (closing what `to` was).
    pub(super) fn renumbered(&mut self, from: i32, to: i32) {
        let was_stdio = self.stdio.contains(&from);
        self.stdio.retain(|&s| s != from && s != to);
        if was_stdio {
            self.stdio.push(to);
        }
    }

    /// Counts `bytes` about to be written, if they fit the job's bound and
    /// the worker's; `false` (nothing counted) if not.
    pub(super) fn take(&mut self, bytes: u64) -> bool {
        if bytes == 0 {
            return true; // stdio, or a write of nothing: the common case
        }
        if self.written.saturating_add(bytes) > self.max_written {
            return false;
        }
        if let Some(pool) = &self.pool
            && !pool.take(bytes)
        {
            return false;
        }
        self.written += bytes;
        true
    }

    /// Gives back what was taken for a write that then wrote only
    /// `written` of `taken` bytes.
    pub(super) fn settle(&mut self, taken: u64, written: u64) {
        let unused = taken.saturating_sub(written);
        self.written -= unused;
        if let Some(pool) = &self.pool {
            pool.give_back(unused);
        }
    }
}

impl Drop for FileUse {
    /// The job has ended: its scratch goes, and its share of the pool.
    fn drop(&mut self) {
        if let Some(pool) = &self.pool {
            pool.give_back(self.written);
        }
    }
}
