//! Read-only trees laid out once and shared by every job that mounts them.
//!
//! A read-only tree's layout — a directory of hard links into the file
//! store — depends on its manifest alone, so the jobs that mount the same
//! tree read-only (every input of a map with `--dir …:ro`, every item of a
//! Python map with its function's files and packages) can share one rather
//! than link its files afresh: ~3 ms for a tree of 200 files, per job, on
//! this machine — a third of a tiny Python item's time on a worker.
//!
//! The store keeps the [`MAX_KEPT`] layouts used last, each with its files
//! pinned (the store deletes no file a kept layout links); a layout unused
//! for [`IDLE`] is dropped, and every idle one is dropped when the store
//! needs room for a file it is sent. A job holds its layout's directory
//! while it runs, so dropping a layout from the store never pulls it from
//! under a job. A layout is only ever shared between jobs that may read
//! the tree (the store checked each job's tenant before it pinned the
//! tree), and only read-only: a guest's read-only grant cannot change it.
//! A tree that cannot be laid out with hard links alone (the store on
//! another filesystem than the scratch directory) is laid out per job, as
//! before.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::proto::tree::{EntryKind, FileHash, Manifest};

/// How many read-only layouts a store keeps.
pub const MAX_KEPT: usize = 16;

/// How long a kept layout may go unused before it is dropped.
pub const IDLE: Duration = Duration::from_secs(60);

/// A layout the store keeps: its directory (shared with the jobs that
/// mount it), the files it pins, and when a job last asked for it.
#[derive(Debug)]
pub(super) struct Kept {
    pub dir: Arc<tempfile::TempDir>,
    pub files: Vec<FileHash>,
    pub used: Instant,
}

impl Kept {
    /// Whether no job holds its directory now.
    pub fn idle(&self) -> bool {
        Arc::strong_count(&self.dir) == 1
    }
}

/// Lays out `manifest` under `parent` with hard links to `path_of` each
/// file: `Ok(None)` if a link cannot be made (laid out per job instead);
/// `Err` if a stored file is not the size its manifest says. Blocking.
pub(super) fn lay_out(
    parent: &Path,
    manifest: &Manifest,
    path_of: impl Fn(&FileHash) -> std::path::PathBuf,
) -> Result<Option<tempfile::TempDir>, String> {
    let Ok(dir) = tempfile::Builder::new().prefix("tree-").tempdir_in(parent) else {
        return Ok(None);
    };
    for entry in &manifest.entries {
        let dest = dir.path().join(&entry.path); // checked: relative, no `..`
        let made = match entry.kind {
            EntryKind::Dir => std::fs::create_dir_all(&dest),
            EntryKind::File { hash, size } => {
                let src = path_of(&hash);
                super::trees::stored_size(&src, &entry.path, size)?;
                dest.parent()
                    .map_or(Ok(()), std::fs::create_dir_all)
                    .and_then(|()| std::fs::hard_link(&src, &dest))
            }
        };
        if made.is_err() {
            return Ok(None);
        }
    }
    Ok(Some(dir))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::filestore::FileStore;
    use super::super::trees;
    use crate::proto::ModuleHash;
    use crate::proto::tree::{EntryKind, FileHash, Manifest, TreeEntry, TreeGrant};
    use crate::sandbox::files::{NEW_INODE_BYTES, ScratchPool};

    /// A store holding a tree of `files` (named `f0`, `f1`, … under `d/`),
    /// and the tree's hash.
    fn store_with(files: &[&[u8]], budget: u64) -> (Arc<FileStore>, ModuleHash, Arc<ScratchPool>) {
        let disk = Arc::new(ScratchPool::new(budget));
        let store = Arc::new(FileStore::new(None, budget, Some(disk.clone()), false).unwrap());
        let mut entries = vec![TreeEntry {
            path: "d".into(),
            kind: EntryKind::Dir,
        }];
        for (i, b) in files.iter().enumerate() {
            entries.push(TreeEntry {
                path: format!("d/f{i}"),
                kind: EntryKind::File {
                    hash: FileHash::of(b),
                    size: b.len() as u64,
                },
            });
        }
        let manifest = Manifest { entries };
        let hash = manifest.hash();
        store.put_manifest("t", hash, manifest).unwrap();
        for b in files {
            let mut incoming = store.receive(FileHash::of(b)).unwrap();
            incoming.write(b).unwrap();
            incoming.finish("t").unwrap();
        }
        (store, hash, disk)
    }

    fn grant(hash: ModuleHash, read_only: bool) -> TreeGrant {
        TreeGrant {
            manifest: hash,
            guest: "/data".into(),
            read_only,
        }
    }

    /// Mounts the tree as one job would: pinned, then laid out.
    fn mount(
        store: &Arc<FileStore>,
        g: &TreeGrant,
    ) -> (trees::Mounted, super::super::filestore::TreePins) {
        let pins = store.pin_trees("t", std::slice::from_ref(g)).unwrap();
        let mounted =
            trees::mount(store, &pins.manifests, std::slice::from_ref(g), None, None).unwrap();
        (mounted, pins)
    }

    #[test]
    fn jobs_mounting_a_tree_read_only_share_one_layout_and_writable_ones_do_not() {
        let (store, hash, _) = store_with(&[b"one", b"two"], 1 << 20);
        let (first, first_pins) = mount(&store, &grant(hash, true));
        let (second, _second_pins) = mount(&store, &grant(hash, true));
        let at = first.grants[0].host.clone();
        assert_eq!(second.grants[0].host, at, "one layout for both");
        assert_eq!(std::fs::read(at.join("d/f1")).unwrap(), b"two");
        drop((first, first_pins, second));
        // Kept for the next job, though no job holds it now.
        let (third, _) = mount(&store, &grant(hash, true));
        assert_eq!(third.grants[0].host, at);
        // A writable mount is its own copy, elsewhere.
        let (own, _) = mount(&store, &grant(hash, false));
        assert_ne!(own.grants[0].host, at);
        std::fs::write(own.grants[0].host.join("d/f0"), b"changed").unwrap();
        assert_eq!(
            std::fs::read(at.join("d/f0")).unwrap(),
            b"one",
            "the shared one is untouched"
        );
    }

    #[test]
    fn a_kept_layout_pins_its_files_until_the_store_needs_the_room() {
        let cost = 1000 + NEW_INODE_BYTES;
        let (a, b) = (vec![1u8; 1000], vec![2u8; 1000]);
        let (store, hash, disk) = store_with(&[&a], 2 * cost);
        let (mounted, pins) = mount(&store, &grant(hash, true));
        let at = mounted.grants[0].host.clone();
        drop((mounted, pins));
        // Only the layout holds `a` now. An unpinned file goes before it:
        let mut incoming = store.receive(FileHash::of(&b)).unwrap();
        incoming.write(&b).unwrap();
        incoming.finish("t").unwrap();
        let c = vec![3u8; 1000];
        let mut incoming = store.receive(FileHash::of(&c)).unwrap();
        incoming.write(&c).unwrap();
        incoming.finish("t").unwrap();
        assert!(
            !store.has_file("t", &FileHash::of(&b)),
            "the unpinned one went"
        );
        assert!(
            store.has_file("t", &FileHash::of(&a)) && at.exists(),
            "the layout's stayed"
        );
        // A file larger than what unpinned files free: the idle layout
        // lets go of `a`, which goes too.
        let big = vec![4u8; 2 * 1000];
        let mut incoming = store.receive(FileHash::of(&big)).unwrap();
        incoming.write(&big).unwrap();
        incoming.finish("t").unwrap();
        assert!(
            !store.has_file("t", &FileHash::of(&a)),
            "evicted once the layout let go"
        );
        assert!(!at.exists(), "and the layout removed");
        assert!(
            disk.in_use() <= 2 * cost + NEW_INODE_BYTES,
            "{}",
            disk.in_use()
        );
    }

    #[test]
    fn a_layout_in_use_is_never_pulled_from_under_its_job() {
        let cost = 1000 + NEW_INODE_BYTES;
        let (a, b) = (vec![1u8; 1000], vec![2u8; 1000]);
        let (store, hash, _) = store_with(&[&a], cost);
        let (mounted, pins) = mount(&store, &grant(hash, true));
        let at = mounted.grants[0].host.clone();
        // The store is full of what a running job needs: no room is made.
        let refused = store
            .receive(FileHash::of(&b))
            .and_then(|mut i| i.write(&b));
        assert!(refused.is_err(), "room made from a layout in use");
        assert_eq!(
            std::fs::read(at.join("d/f0")).unwrap(),
            a,
            "still there for its job"
        );
        drop((mounted, pins));
        // Its job done, the layout is idle: now it goes, and `a` with it.
        let mut incoming = store.receive(FileHash::of(&b)).unwrap();
        incoming.write(&b).unwrap();
        incoming.finish("t").unwrap();
        assert!(!at.exists() && !store.has_file("t", &FileHash::of(&a)));
    }
}
