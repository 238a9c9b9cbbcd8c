//! Warm-start snapshots kept on disk, so that the next process starts warm
//! too: a fresh `python script.py` that maps a function over its embedded
//! worker ran its module's imports again in each slot process (numpy and
//! scikit-learn: ~2 s in the sandbox) before its first item, where a
//! pool's long-lived workers had kept their snapshot in memory.
//!
//! A snapshot is the non-zero pages of an interpreter's linear memory,
//! named by its key (`warm::key`: the module, the prelude, what the
//! interpreter saw, the scope that may share it), in a directory of this
//! user's alone (`0700`, checked: `private_path`). It is written to a
//! temporary file and renamed into place, so a file under its name is
//! whole. A worker's own process does not map it from here: a file that
//! someone shortened while mapped would fault the process. Its data is
//! copied into a sealed in-memory file (`image::of_file`), as a snapshot
//! made here is — ~40 ms for ~90 MiB, against seconds of imports. A slot
//! process maps the file as it is (`SandboxConfig::map_kept_snapshots`),
//! on a filesystem of this machine's own ([`on_local_disk`]): such a fault
//! would end only that child and its job (a host error), and its first
//! item no longer waits for the copy — nor do its slots each hold one:
//! they share the file's page cache. Nothing of ours writes a kept file in
//! place (it is renamed in whole, and removed by name), so a mapping never
//! sees another snapshot's bytes. It holds only guest memory, run only
//! inside the sandbox: no code of the host's.
//!
//! At most [`SNAPSHOTS_ON_DISK`] are kept: the least recently used (by
//! modification time, which a load refreshes) are removed first.

use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use super::image::{WASM_PAGE, all_zero};

/// Snapshots one directory keeps.
pub const SNAPSHOTS_ON_DISK: usize = 4;

/// The largest snapshot read back (a wasm32 memory).
const LARGEST: u64 = 4 << 30;

/// What follows a kept snapshot's memory: [`TRAILER_MAGIC`], the memory's
/// length (little-endian) and the key it was kept under. A file cut short
/// — at any length, a whole number of pages included — loses it, so it is
/// never taken for a smaller snapshot (whose jobs would start from a
/// broken interpreter, in every later process); nor is a file under
/// another key's name. Whatever else it holds is this user's own doing
/// (`0700`), as the cache's compiled code is.
const TRAILER_BYTES: usize = 48;

/// The trailer's first bytes (and its version).
const TRAILER_MAGIC: &[u8; 8] = b"PWSNAP1\0";

/// The trailer of `len` bytes of memory kept under `key`.
fn trailer(key: &[u8; 32], len: u64) -> [u8; TRAILER_BYTES] {
    let mut t = [0u8; TRAILER_BYTES];
    t[..8].copy_from_slice(TRAILER_MAGIC);
    t[8..16].copy_from_slice(&len.to_le_bytes());
    t[16..].copy_from_slice(key);
    t
}

/// A directory of snapshots.
pub(super) struct SnapshotDir {
    dir: PathBuf,
    /// Whether a kept file is handed out to be mapped as it is, rather
    /// than copied into a sealed memfd.
    map_in_place: bool,
}

impl SnapshotDir {
    /// `dir`, made (`0700`) if missing; `Err` when it is not this user's
    /// alone. With `map_in_place`, [`load`](Self::load) hands out the kept
    /// file itself — if `dir` is on a filesystem of this machine's own
    /// ([`on_local_disk`]); elsewhere it copies.
    pub(super) fn open(dir: PathBuf, map_in_place: bool) -> anyhow::Result<SnapshotDir> {
        crate::private_path::private_dir(&dir)?;
        let map_in_place = map_in_place && on_local_disk(&dir);
        Ok(SnapshotDir { dir, map_in_place })
    }

    fn path(&self, key: &[u8; 32]) -> PathBuf {
        self.dir.join(format!("{}.snap", hex::encode(key)))
    }

    /// The memory kept under `key` as an image to map (and its length), if
    /// there is a whole one — its trailer there and naming this key and
    /// the length before it: a sealed copy, or the file opened read-only
    /// if this directory maps in place.
    pub(super) fn load(&self, key: &[u8; 32]) -> Option<(OwnedFd, usize)> {
        let file = std::fs::File::open(self.path(key)).ok()?;
        let meta = file.metadata().ok()?;
        let len = meta.len().checked_sub(TRAILER_BYTES as u64)?;
        if !meta.is_file() || len == 0 || len > LARGEST || len % WASM_PAGE as u64 != 0 {
            return None;
        }
        let mut found = [0u8; TRAILER_BYTES];
        file.read_exact_at(&mut found, len).ok()?;
        if found != trailer(key, len) {
            tracing::debug!("a kept snapshot's trailer does not match it: ignored");
            return None;
        }
        let _ = file.set_modified(std::time::SystemTime::now());
        if self.map_in_place {
            return Some((OwnedFd::from(file), len as usize));
        }
        super::image::of_file(&file, len as usize).ok()
    }

    /// Keeps `memory` under `key` (its zero pages as holes, its trailer
    /// after it), then removes the least recently used beyond
    /// [`SNAPSHOTS_ON_DISK`].
    pub(super) fn save(&self, key: &[u8; 32], memory: &[u8]) -> std::io::Result<()> {
        let tmp = tempfile::Builder::new()
            .prefix(".partial-")
            .tempfile_in(&self.dir)?;
        let len = memory.len() as u64;
        tmp.as_file().set_len(len + TRAILER_BYTES as u64)?;
        const CHUNK: usize = 64 << 10;
        for (i, chunk) in memory.chunks(CHUNK).enumerate() {
            if !all_zero(chunk) {
                tmp.as_file().write_all_at(chunk, (i * CHUNK) as u64)?;
            }
        }
        tmp.as_file().write_all_at(&trailer(key, len), len)?;
        // On disk before its name is: a crash must not leave a named file
        // whose pages never got there (once per program, beside the
        // seconds its prelude took).
        tmp.as_file().sync_data()?;
        tmp.persist(self.path(key)).map_err(|e| e.error)?;
        self.evict();
        Ok(())
    }

    fn evict(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mut kept: Vec<(std::time::SystemTime, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter(|e| e.path().extension().is_some_and(|x| x == "snap"))
            .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
            .collect();
        kept.sort();
        let excess = kept.len().saturating_sub(SNAPSHOTS_ON_DISK);
        for (_, path) in kept.into_iter().take(excess) {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Filesystems whose files stay whole for whoever has them open when they
/// are renamed over or removed by name (`statfs`'s `f_type`): ext2/3/4,
/// XFS, Btrfs, tmpfs, overlayfs, F2FS, ZFS, bcachefs.
const LOCAL_FILESYSTEMS: [u64; 8] = [
    0xEF53,
    0x5846_5342,
    0x9123_683E,
    0x0102_1994,
    0x794C_7630,
    0xF2F5_2010,
    0x2FC1_2FC1,
    0xCA45_1A4E,
];

/// Whether `dir` is on a filesystem of this machine's own. Not on a network
/// one (NFS: a cluster's home directories, where the cache is by default):
/// another machine's process that renames a snapshot over this one's, or
/// evicts it, leaves a mapping here stale, and the next page read faults.
/// An unknown filesystem counts as not local (a copy costs only time).
fn on_local_disk(dir: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: a NUL-terminated path and a `statfs` to fill, both alive for
    // the call; all-zero is a valid `statfs`.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(path.as_ptr(), &mut st) } != 0 {
        return false;
    }
    LOCAL_FILESYSTEMS.contains(&(st.f_type as u64 & 0xFFFF_FFFF))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory(seed: u8) -> Vec<u8> {
        let mut m = vec![0u8; 4 * WASM_PAGE];
        m[10] = seed;
        m[3 * WASM_PAGE + 5] = seed.wrapping_add(1);
        m
    }

    fn read(image: Option<(OwnedFd, usize)>) -> Option<Vec<u8>> {
        let (fd, len) = image?;
        let mut out = vec![0u8; len];
        std::fs::File::from(fd).read_exact_at(&mut out, 0).unwrap();
        Some(out)
    }

    #[test]
    fn a_kept_snapshot_cut_short_or_under_another_name_is_not_taken() {
        let dir = tempfile::tempdir().unwrap();
        let disk = SnapshotDir::open(dir.path().join("snapshots"), false).unwrap();
        let (key, other) = ([5u8; 32], [6u8; 32]);
        disk.save(&key, &memory(2)).unwrap();
        assert_eq!(read(disk.load(&key)), Some(memory(2)));
        // Cut at a whole number of pages (or anywhere else): not a smaller
        // snapshot.
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(disk.path(&key))
            .unwrap();
        for cut in [
            3 * WASM_PAGE as u64,
            WASM_PAGE as u64,
            4 * WASM_PAGE as u64 + 7,
            0,
        ] {
            file.set_len(cut).unwrap();
            assert!(disk.load(&key).is_none(), "taken when cut to {cut}");
        }
        // Another key's snapshot under this name.
        disk.save(&other, &memory(4)).unwrap();
        std::fs::rename(disk.path(&other), disk.path(&key)).unwrap();
        assert!(disk.load(&key).is_none());
        // Saved again, it is taken again.
        disk.save(&key, &memory(2)).unwrap();
        assert_eq!(read(disk.load(&key)), Some(memory(2)));
    }

    #[test]
    fn a_directory_that_maps_in_place_hands_out_the_kept_file_itself() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        if !on_local_disk(dir.path()) {
            eprintln!("skipped: the temporary directory is not on a local filesystem");
            return;
        }
        let copies = SnapshotDir::open(dir.path().join("snapshots"), false).unwrap();
        let mapped = SnapshotDir::open(dir.path().join("snapshots"), true).unwrap();
        let key = [9u8; 32];
        copies.save(&key, &memory(3)).unwrap();
        let on_disk = std::fs::metadata(copies.path(&key)).unwrap().ino();
        let inode = |image: &Option<(OwnedFd, usize)>| {
            let (fd, _) = image.as_ref().unwrap();
            std::fs::File::from(fd.try_clone().unwrap())
                .metadata()
                .unwrap()
                .ino()
        };
        let (copy, file) = (copies.load(&key), mapped.load(&key));
        assert_ne!(inode(&copy), on_disk, "copied into a memfd of its own");
        assert_eq!(inode(&file), on_disk, "the kept file, opened");
        assert_eq!(read(file), Some(memory(3)));
        assert_eq!(read(copy), Some(memory(3)));
        // What is not a snapshot is not handed out either way.
        std::fs::write(mapped.path(&[8u8; 32]), b"short").unwrap();
        assert!(mapped.load(&[8u8; 32]).is_none());
    }

    #[test]
    fn only_a_filesystem_of_this_machine_s_own_is_mapped_in_place() {
        assert!(
            on_local_disk(std::path::Path::new("/dev/shm"))
                || !std::path::Path::new("/dev/shm").exists()
        );
        // procfs is no disk, and a path that is not there is not one either.
        assert!(!on_local_disk(std::path::Path::new("/proc")));
        assert!(!on_local_disk(std::path::Path::new("/no/such/dir")));
    }

    #[test]
    fn a_kept_snapshot_is_read_back_whole_and_only_the_last_few_stay() {
        let dir = tempfile::tempdir().unwrap();
        let disk = SnapshotDir::open(dir.path().join("snapshots"), false).unwrap();
        let key = [7u8; 32];
        assert!(disk.load(&key).is_none());
        disk.save(&key, &memory(1)).unwrap();
        assert_eq!(read(disk.load(&key)), Some(memory(1)), "read back whole");
        // A file of another length than whole pages is not a snapshot.
        std::fs::write(disk.path(&[8u8; 32]), b"short").unwrap();
        assert!(disk.load(&[8u8; 32]).is_none());
        // Beyond the bound, the least recently used go.
        for k in 0..(SNAPSHOTS_ON_DISK as u8 + 2) {
            std::thread::sleep(std::time::Duration::from_millis(20));
            disk.save(&[100 + k; 32], &memory(k)).unwrap();
        }
        let left = std::fs::read_dir(dir.path().join("snapshots"))
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .path()
                    .extension()
                    .is_some_and(|x| x == "snap")
            })
            .count();
        assert_eq!(left, SNAPSHOTS_ON_DISK);
        assert!(disk.load(&key).is_none(), "the oldest went first");
        assert!(
            disk.load(&[100 + SNAPSHOTS_ON_DISK as u8 + 1; 32])
                .is_some()
        );
    }
}
