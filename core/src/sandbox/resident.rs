//! Resident interpreters ([`Residents`]): the instance a warm job started
//! from a snapshot leaves, when its turn returned, kept for the next job of
//! the same snapshot with its memory put back to the snapshot's bytes.
//!
//! Why: a warm start still instantiated CPython for every item, mapped the
//! snapshot over a fresh memory, took a page fault (most of them copies)
//! for every page the item touched, and unmapped it all at the end. For a
//! map of small items that was most of an item's cost: measured on a tiny
//! function, ~1.8 ms of a slot process's CPU per item, over half of it in
//! the kernel (faults, unmapping, TLB shoot-downs), another tenth
//! instantiating. A process pool pays none of that between items — and
//! keeps the state too. This keeps the instance and not the state.
//!
//! What makes the next job's start the same as a fresh one:
//! * **Linear memory.** Over `[base, base + len)` the memory is the image
//!   mapped privately (`warm::restore`), so every page any job since then
//!   wrote is a private copy, and every other page still reads the image.
//!   `PAGEMAP_SCAN` (Linux 6.7+) lists the private pages; each is copied
//!   back from a read-only view of the image. They stay mapped, so the next
//!   job touching the same pages takes no fault. When the scan is not
//!   there or there is more to copy than [`COPY_BACK_MAX`], the image is
//!   mapped afresh over the whole range instead — the same state, at a
//!   fresh start's cost. Copying back every private page, not only those the
//!   last job wrote, is on purpose: tracking the last job's writes with
//!   userfaultfd's asynchronous write protection (`PAGEMAP_SCAN`'s
//!   `PM_SCAN_WP_MATCHING`) was tried and measured slower — a one-line Python
//!   function × 1,000 on two slots 1.44–1.55 s → 1.85–2.41 s, 48 scikit-learn
//!   fits 0.34–0.48 → 0.49–0.58 s — most likely because an item rewrites most
//!   of the pages the items before it wrote, and each such write then takes a
//!   fault and each reset a protection change. A memory that grew past the
//!   image is never kept:
//!   wasm memory cannot shrink, and the next job must start at the
//!   snapshot's size (its peak and limit count from there).
//! * **Globals and table.** Kept only after `turn` *returned*: a trap, a
//!   `proc_exit`, a time limit or a cancel leaves its instance to be
//!   dropped. CPython for WASI has one mutable global, its stack pointer,
//!   which a returning call's epilogue sets back from a wasm local — not
//!   from linear memory, so nothing a job (or the data it parses) writes
//!   changes it — and a table of fixed size its C code never writes.
//! * **Host state.** A new WASI context, memory limiter, file bounds and
//!   time limit for every job (`store::core_state`); the last job's are
//!   dropped when it ends, so nothing of it (its descriptors, its ledger's
//!   lender, its scratch) outlives it.
//!
//! Bounds: keyed by the snapshot's key, which holds the tenant, so an
//! instance only ever serves jobs that would have started from the same
//! snapshot. At most [`RESIDENTS_KEPT`] per process, least recently used
//! dropped first; between jobs each holds at most [`COPY_BACK_MAX`] of
//! private pages (beyond the image, which its snapshot holds anyway) and
//! its memory's address-space reservation.

use std::collections::VecDeque;
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use wasmtime::{Instance, ResourceLimiter, Store};
use wasmtime_wasi::WasiCtxBuilder;

use super::disk::FileUse;
use super::job_state::JobState;
use super::limiter::MemoryLimiter;
use super::warm::{SnapshotImage, map_image, memory_of};

/// Resident instances one process keeps. A slot process runs one job at a
/// time; a worker running jobs in-process, one per slot at most.
pub const RESIDENTS_KEPT: usize = 4;

/// The most a reset copies back; past it the image is mapped afresh.
pub const COPY_BACK_MAX: usize = 16 << 20;

/// An instance a job of a snapshot left, ready for the next.
pub(super) struct Resident {
    key: [u8; 32],
    store: Store<JobState>,
    instance: Instance,
    image: Arc<SnapshotImage>,
    view: ImageView,
    /// Its memory's pages of its own (copied back by its reset): what it
    /// holds beyond the image.
    private: usize,
}

impl Resident {
    /// Its store (holding a blank state: give it the job's), its instance
    /// and the image its memory reads as.
    pub(super) fn into_parts(self) -> (Store<JobState>, Instance, Arc<SnapshotImage>, ImageView) {
        (self.store, self.instance, self.image, self.view)
    }
}

/// The instances kept, most recently kept last.
#[derive(Default)]
pub(super) struct Residents {
    kept: Mutex<VecDeque<Resident>>,
    started: AtomicU64,
}

impl Residents {
    /// The resident instance of `key`, taken out (no other job can have
    /// it). Those of snapshots no longer kept (`kept_snapshot`) go first.
    pub(super) fn take(
        &self,
        key: &[u8; 32],
        kept_snapshot: impl Fn(&[u8; 32]) -> bool,
    ) -> Option<Resident> {
        let mut kept = self.kept.lock();
        kept.retain(|r| kept_snapshot(&r.key));
        let at = kept.iter().rposition(|r| &r.key == key)?;
        self.started.fetch_add(1, Ordering::Relaxed);
        kept.remove(at)
    }

    /// Drops every kept instance.
    pub(super) fn clear(&self) {
        self.kept.lock().clear();
    }

    /// Jobs that started in a resident instance.
    pub(super) fn started(&self) -> u64 {
        self.started.load(Ordering::Relaxed)
    }

    /// The pages the kept instances of snapshots still kept
    /// (`kept_snapshot`) hold of their own, in bytes.
    pub(super) fn held_bytes(&self, kept_snapshot: impl Fn(&[u8; 32]) -> bool) -> u64 {
        let mut kept = self.kept.lock();
        kept.retain(|r| kept_snapshot(&r.key));
        kept.iter().map(|r| r.private as u64).sum()
    }

    /// Keeps `instance` for the next job of `key` if its memory is still
    /// the image's size, after putting it back to the image; else drops it.
    /// `view` is the image's read-only view if this instance had one. Only
    /// instances of snapshots still kept (`kept_snapshot`) stay: one must
    /// not hold an image the snapshots' cache let go.
    pub(super) fn keep(
        &self,
        key: [u8; 32],
        mut store: Store<JobState>,
        instance: Instance,
        image: Arc<SnapshotImage>,
        view: Option<ImageView>,
        kept_snapshot: impl Fn(&[u8; 32]) -> bool,
    ) {
        if !kept_snapshot(&key) {
            return;
        }
        let Ok(memory) = memory_of(&mut store, &instance) else {
            return;
        };
        let (file, len) = image.file();
        if memory.data_size(&store) != len {
            return;
        }
        let view = match view {
            Some(v) => v,
            None => match ImageView::of(file, len) {
                Ok(v) => v,
                Err(e) => {
                    tracing::debug!("no resident instance: cannot view the snapshot: {e}");
                    return;
                }
            },
        };
        let base = memory.data_ptr(&store);
        // SAFETY: `[base, base + len)` is this store's own linear memory,
        // the image mapped privately over it (`warm::restore`; its size
        // checked above); no wasm runs in the store while it is reset, and
        // wasmtime keeps no view of its contents.
        let private = match unsafe { reset(base, file, &view) } {
            Ok(private) => private,
            Err(e) => {
                tracing::debug!("no resident instance: cannot reset its memory: {e}");
                return;
            }
        };
        let mut kept = self.kept.lock();
        kept.retain(|r| kept_snapshot(&r.key));
        if kept.len() >= RESIDENTS_KEPT {
            kept.pop_front();
        }
        kept.push_back(Resident {
            key,
            store,
            instance,
            image,
            view,
            private,
        });
    }
}

/// The state a kept store holds between jobs: no descriptors, no limits,
/// nothing of the job before.
pub(super) fn blank_state() -> JobState {
    JobState {
        wasi: WasiCtxBuilder::new().build_p1(),
        limiter: MemoryLimiter::new(0),
        files: FileUse::new(0, 0, None),
    }
}

/// Charges a resident's memory to the job about to use it, as
/// instantiating it (`minimum` bytes) and growing it to the image (`len`)
/// would have: within its limit or refused as a grow past it is.
pub(super) fn charge(
    limiter: &mut MemoryLimiter,
    minimum: usize,
    len: usize,
) -> wasmtime::Result<()> {
    limiter.memory_growing(0, minimum, None)?;
    limiter.memory_growing(minimum, len, None)?;
    Ok(())
}

/// A read-only shared view of an image's file: where a reset copies from.
pub(super) struct ImageView {
    at: *const u8,
    len: usize,
}

// SAFETY: a read-only mapping of the image's file (sealed, or a kept file
// nothing writes in place: `warm_disk`), owned by this value alone.
unsafe impl Send for ImageView {}

impl ImageView {
    fn of(file: &OwnedFd, len: usize) -> std::io::Result<ImageView> {
        // SAFETY: a new read-only shared mapping of `len` bytes of `file`
        // (sealed against writes, or a kept snapshot that is replaced by
        // renaming, never written in place: it does not change under the
        // view).
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if at == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(ImageView { at: at.cast(), len })
    }
}

impl Drop for ImageView {
    fn drop(&mut self) {
        // SAFETY: the mapping this value made, unmapped once.
        unsafe { libc::munmap(self.at as *mut libc::c_void, self.len) };
    }
}

/// Puts `[base, base + view.len)` back to the image: the pages written
/// since it was mapped copied back from `view`, or the image mapped afresh.
/// Returns the bytes of the range that are its own pages now (those
/// copied back; none after a fresh mapping).
///
/// # Safety
///
/// As [`map_image`]'s: the range is mapped memory nothing else uses while
/// this runs, over which `file` was mapped privately.
unsafe fn reset(base: *mut u8, file: &OwnedFd, view: &ImageView) -> std::io::Result<usize> {
    let len = view.len;
    let private = |p: &Vec<(usize, usize)>| p.iter().map(|(s, e)| e - s).sum::<usize>();
    if let Some(pages) = written_pages(base as usize, len).filter(|p| private(p) <= COPY_BACK_MAX) {
        let copied = private(&pages);
        for (start, end) in pages {
            let offset = start - base as usize;
            // SAFETY: `[start, end)` lies within the memory and the view
            // (the scan was of `[base, base + len)`); they never overlap.
            unsafe {
                std::ptr::copy_nonoverlapping(view.at.add(offset), start as *mut u8, end - start)
            };
        }
        return Ok(copied);
    }
    // SAFETY: as the caller promised.
    unsafe { map_image(base, len, file) }.map(|()| 0)
}

/// `PAGEMAP_SCAN`'s ABI (`linux/fs.h`, Linux 6.7).
mod scan {
    pub const PAGE_IS_FILE: u64 = 1 << 2;
    pub const PAGE_IS_PRESENT: u64 = 1 << 3;
    pub const PAGE_IS_SWAPPED: u64 = 1 << 4;
    /// `_IOWR('f', 16, struct pm_scan_arg)`.
    pub const PAGEMAP_SCAN: libc::c_ulong =
        (3 << 30) | (96 << 16) | ((b'f' as libc::c_ulong) << 8) | 16;

    #[repr(C)]
    #[derive(Default)]
    pub struct Arg {
        pub size: u64,
        pub flags: u64,
        pub start: u64,
        pub end: u64,
        pub walk_end: u64,
        pub vec: u64,
        pub vec_len: u64,
        pub max_pages: u64,
        pub category_inverted: u64,
        pub category_mask: u64,
        pub category_anyof_mask: u64,
        pub return_mask: u64,
    }

    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    pub struct Region {
        pub start: u64,
        pub end: u64,
        pub categories: u64,
    }
}

/// The ranges of `[start, start + len)` whose pages are this process's own
/// (anonymous: written, so copied from the file), present or swapped out;
/// None when the kernel cannot say (before Linux 6.7, or no `/proc`).
fn written_pages(start: usize, len: usize) -> Option<Vec<(usize, usize)>> {
    static PAGEMAP: OnceLock<Option<File>> = OnceLock::new();
    let pagemap = PAGEMAP
        .get_or_init(|| File::open("/proc/self/pagemap").ok())
        .as_ref()?;
    let end = (start + len) as u64;
    let mut regions = [scan::Region::default(); 64];
    let mut arg = scan::Arg {
        size: std::mem::size_of::<scan::Arg>() as u64,
        start: start as u64,
        end,
        vec: regions.as_mut_ptr() as u64,
        vec_len: regions.len() as u64,
        // Not a file page (the image's), and there.
        category_inverted: scan::PAGE_IS_FILE,
        category_mask: scan::PAGE_IS_FILE,
        category_anyof_mask: scan::PAGE_IS_PRESENT | scan::PAGE_IS_SWAPPED,
        return_mask: scan::PAGE_IS_FILE,
        ..scan::Arg::default()
    };
    let mut out = Vec::new();
    loop {
        // SAFETY: `arg` is a valid `pm_scan_arg` whose `vec` points at
        // `regions` (`vec_len` of them), alive for the call.
        let n = unsafe { libc::ioctl(pagemap.as_raw_fd(), scan::PAGEMAP_SCAN, &mut arg) };
        if n < 0 {
            return None;
        }
        out.extend(
            regions[..n as usize]
                .iter()
                .map(|r| (r.start as usize, r.end as usize)),
        );
        if arg.walk_end >= end {
            return Some(out);
        }
        arg.start = arg.walk_end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scan_finds_exactly_the_pages_written_over_a_private_file_mapping() {
        use std::io::Write;
        let page = 4096;
        let len = 64 * page;
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&vec![7u8; len]).unwrap();
        let file = OwnedFd::from(f);
        // SAFETY: a fresh anonymous reservation of `len` bytes, then the
        // file mapped privately over it; only this test uses it.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        } as *mut u8;
        unsafe { map_image(base, len, &file) }.unwrap();
        // Read every page (file pages), write pages 3 and 40..42.
        let sum: u64 = (0..64).map(|p| unsafe { *base.add(p * page) } as u64).sum();
        assert_eq!(sum, 7 * 64);
        unsafe {
            *base.add(3 * page + 5) = 1;
            *base.add(40 * page) = 2;
            *base.add(41 * page + 4095) = 3;
        }
        let Some(written) = written_pages(base as usize, len) else {
            eprintln!("PAGEMAP_SCAN not available here: the reset maps the image afresh");
            return;
        };
        let b = base as usize;
        assert_eq!(
            written,
            vec![(b + 3 * page, b + 4 * page), (b + 40 * page, b + 42 * page)]
        );
        let view = ImageView::of(&file, len).unwrap();
        let private = unsafe { reset(base, &file, &view) }.unwrap();
        assert_eq!(private, 3 * page, "the pages copied back stay its own");
        assert!(
            (0..len).all(|i| unsafe { *base.add(i) } == 7),
            "every byte back"
        );
        // Still private copies, now holding the image's bytes: found again,
        // and the next reset copies them once more.
        assert_eq!(written_pages(b, len).unwrap().len(), 2);
        unsafe { libc::munmap(base.cast(), len) };
    }
}
