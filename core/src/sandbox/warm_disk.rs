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
//! process maps the file as it is (`SandboxConfig::map_kept_snapshots`):
//! such a fault would end only that child, which its worker reports and
//! replaces, and its first item no longer waits for the copy — nor do its
//! slots each hold one: they share the file's page cache. Nothing of
//! ours writes a kept file in place (it is renamed in whole, and removed
//! by name), so a mapping never sees another snapshot's bytes. It holds
//! only guest memory, run only inside the sandbox: no code of the host's.
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
    /// file itself.
    pub(super) fn open(dir: PathBuf, map_in_place: bool) -> anyhow::Result<SnapshotDir> {
        crate::private_path::private_dir(&dir)?;
        Ok(SnapshotDir { dir, map_in_place })
    }

    fn path(&self, key: &[u8; 32]) -> PathBuf {
        self.dir.join(format!("{}.snap", hex::encode(key)))
    }

    /// The memory kept under `key` as an image to map (and its length), if
    /// there is a whole one: a sealed copy, or the file opened read-only
    /// if this directory maps in place.
    pub(super) fn load(&self, key: &[u8; 32]) -> Option<(OwnedFd, usize)> {
        let file = std::fs::File::open(self.path(key)).ok()?;
        let meta = file.metadata().ok()?;
        let len = meta.len();
        if !meta.is_file() || len == 0 || len > LARGEST || len % WASM_PAGE as u64 != 0 {
            return None;
        }
        let _ = file.set_modified(std::time::SystemTime::now());
        if self.map_in_place {
            return Some((OwnedFd::from(file), len as usize));
        }
        super::image::of_file(&file, len as usize).ok()
    }

    /// Keeps `memory` under `key` (its zero pages as holes), then removes
    /// the least recently used beyond [`SNAPSHOTS_ON_DISK`].
    pub(super) fn save(&self, key: &[u8; 32], memory: &[u8]) -> std::io::Result<()> {
        let tmp = tempfile::Builder::new()
            .prefix(".partial-")
            .tempfile_in(&self.dir)?;
        tmp.as_file().set_len(memory.len() as u64)?;
        const CHUNK: usize = 64 << 10;
        for (i, chunk) in memory.chunks(CHUNK).enumerate() {
            if !all_zero(chunk) {
                tmp.as_file().write_all_at(chunk, (i * CHUNK) as u64)?;
            }
        }
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
    fn a_directory_that_maps_in_place_hands_out_the_kept_file_itself() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
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
