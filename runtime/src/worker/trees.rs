//! A job's shipped trees on the worker: laid out from the file store
//! before the job runs, granted to it as directories, and what it wrote
//! into the writable ones read back when it ends.
//!
//! A read-only tree is made of hard links to the store's files (no bytes
//! copied, however large; the guest's read-only grant and the files' mode
//! keep it from changing them), laid out once and shared by the jobs that
//! mount it (`worker::layouts`). A writable tree is a copy, charged to the
//! worker's disk total while the job runs — by each stored file's real
//! size (which must be what the manifest says), plus a block and an inode
//! per file and directory: the guest may change it freely without
//! touching what other jobs mount.
//!
//! What comes back is every regular file of a writable tree that is new
//! or whose bytes changed, up to a cap (`--max-files-back`); past it the
//! job ends [`Outcome::FilesBackTooLarge`] and nothing comes back, rather
//! than a silent half. Deleted files, symbolic links and empty directories
//! do not come back.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use crate::proto::tree::{FileBack, Manifest, TreeGrant};
use crate::proto::{DirGrant, Outcome};
use crate::sandbox::files::{NEW_INODE_BYTES, ScratchPool};
use crate::units::Bytes;

use super::filestore::FileStore;

/// The most bytes of files a job sends back unless `--max-files-back` says
/// otherwise.
pub const DEFAULT_MAX_FILES_BACK: u64 = 64 << 20;

/// A job's trees, laid out; removed (and their disk given back) on drop.
pub struct Mounted {
    dir: Option<tempfile::TempDir>,
    /// The directories to grant the job, in the order of its trees.
    pub grants: Vec<DirGrant>,
    writable: Vec<Writable>,
    /// The shared layouts of its read-only trees (`worker::layouts`), held
    /// while it runs.
    shared: Vec<Arc<tempfile::TempDir>>,
    disk: Option<Arc<ScratchPool>>,
    charged: u64,
}

/// A writable tree and what each file was when the job started.
struct Writable {
    index: u32,
    root: PathBuf,
    before: HashMap<String, (u64, Option<SystemTime>)>,
}

/// Lays out `trees`, whose `manifests` these are and whose files `store`
/// holds (pinned by the caller), in a new directory under `root`. Blocking. `Err` is why the job cannot run.
pub fn mount(
    store: &FileStore,
    manifests: &[Arc<Manifest>],
    trees: &[TreeGrant],
    root: Option<&Path>,
    disk: Option<Arc<ScratchPool>>,
) -> Result<Mounted, String> {
    let b = tempfile::Builder::new()
        .prefix("peerwasm-trees-")
        .to_owned();
    let dir = match root {
        Some(r) => b.tempdir_in(r),
        None => b.tempdir(),
    }
    .map_err(|e| format!("cannot make a directory for the job's trees: {e}"))?;
    let mut mounted = Mounted {
        dir: None,
        grants: Vec::new(),
        writable: Vec::new(),
        shared: Vec::new(),
        disk,
        charged: 0,
    };
    for (i, (grant, manifest)) in trees.iter().zip(manifests).enumerate() {
        if grant.read_only
            && let Some(shared) = store.shared_layout(grant.manifest, manifest)?
        {
            mounted.grants.push(DirGrant {
                host: shared.path().to_path_buf(),
                guest: grant.guest.clone(),
                read_only: true,
            });
            mounted.shared.push(shared);
            continue;
        }
        let tree_root = dir.path().join(i.to_string());
        std::fs::create_dir(&tree_root)
            .map_err(|e| format!("cannot lay out the job's tree: {e}"))?;
        let mut before = HashMap::new();
        for entry in &manifest.entries {
            let dest = tree_root.join(&entry.path); // checked: relative, no `..`
            let no_room = || {
                format!(
                    "this worker has no disk free for a writable copy of the {} tree at {}: \
                     grant it read-only (:ro) to share the worker's copy",
                    Bytes(manifest.total_bytes()),
                    grant.guest
                )
            };
            let made = match entry.kind {
                crate::proto::tree::EntryKind::Dir => {
                    if !grant.read_only && !mounted.charge(NEW_INODE_BYTES) {
                        return Err(no_room());
                    }
                    std::fs::create_dir_all(&dest)
                }
                crate::proto::tree::EntryKind::File { hash, size } => {
                    if let Some(parent) = dest.parent() {
                        std::fs::create_dir_all(parent)
                            .map_err(|e| format!("cannot lay out the job's tree: {e}"))?;
                    }
                    let src = store.path_of(&hash);
                    let real = stored_size(&src, &entry.path, size)?;
                    if grant.read_only && std::fs::hard_link(&src, &dest).is_ok() {
                        Ok(())
                    } else {
                        // A copy: a writable tree's, or a read-only one's
                        // where the store is on another filesystem.
                        if !mounted.charge(real.saturating_add(NEW_INODE_BYTES)) {
                            return Err(no_room());
                        }
                        let copied = std::fs::copy(&src, &dest).map(|_| ());
                        if !grant.read_only {
                            let _ = std::fs::set_permissions(
                                &dest,
                                std::os::unix::fs::PermissionsExt::from_mode(0o644),
                            );
                            if copied.is_ok() {
                                before.insert(entry.path.clone(), stamp(&dest));
                            }
                        }
                        copied
                    }
                }
            };
            made.map_err(|e| format!("cannot lay out {:?} of the job's tree: {e}", entry.path))?;
        }
        if !grant.read_only {
            mounted.writable.push(Writable {
                index: i as u32,
                root: tree_root.clone(),
                before,
            });
        }
        mounted.grants.push(DirGrant {
            host: tree_root,
            guest: grant.guest.clone(),
            read_only: grant.read_only,
        });
    }
    mounted.dir = Some(dir);
    Ok(mounted)
}

/// The real size of the stored file `src`, which the tree names `path` and
/// its manifest says has `size` bytes: what a copy takes is the stored
/// file's real size, never what the manifest claims, and the two must
/// agree.
pub(super) fn stored_size(src: &Path, path: &str, size: u64) -> Result<u64, String> {
    let real = std::fs::metadata(src)
        .map_err(|e| format!("cannot lay out {path:?} of the job's tree: {e}"))?
        .len();
    if real != size {
        return Err(format!(
            "the tree's manifest says {path:?} has {size} bytes, but the file it names has {real}"
        ));
    }
    Ok(real)
}

/// A file's size and modification time.
fn stamp(path: &Path) -> (u64, Option<SystemTime>) {
    match std::fs::symlink_metadata(path) {
        Ok(m) => (m.len(), m.modified().ok()),
        Err(_) => (u64::MAX, None),
    }
}

impl Mounted {
    fn charge(&mut self, bytes: u64) -> bool {
        match &self.disk {
            Some(disk) if !disk.take(bytes) => false,
            _ => {
                self.charged += bytes;
                true
            }
        }
    }

    /// The files the job created or changed in its writable trees, with
    /// warnings about what could not come back; `Err` if they are more
    /// than `max` bytes. Blocking.
    pub fn files_back(&self, max: u64) -> Result<(Vec<FileBack>, Vec<String>), Outcome> {
        let mut changed: Vec<(u32, String, PathBuf, u64)> = Vec::new();
        let mut warnings = Vec::new();
        for tree in &self.writable {
            for entry in walkdir::WalkDir::new(&tree.root)
                .follow_links(false)
                .into_iter()
                .filter_map(Result::ok)
            {
                if !entry.file_type().is_file() {
                    continue;
                }
                let Ok(rel) = entry.path().strip_prefix(&tree.root) else {
                    continue;
                };
                let Some(rel) = rel.to_str().map(str::to_string) else {
                    warnings.push(format!(
                        "{} has a name that is not UTF-8; it was not sent back",
                        rel.display()
                    ));
                    continue;
                };
                let now = stamp(entry.path());
                if tree.before.get(&rel) == Some(&now) {
                    continue; // as it was laid out
                }
                changed.push((tree.index, rel, entry.path().to_path_buf(), now.0));
            }
        }
        let size: u64 = changed.iter().map(|c| c.3).sum();
        if size > max {
            return Err(Outcome::FilesBackTooLarge { size, limit: max });
        }
        let mut files = Vec::with_capacity(changed.len());
        for (tree, path, on_disk, _) in changed {
            match std::fs::read(&on_disk) {
                Ok(contents) => files.push(FileBack {
                    tree,
                    path,
                    size: contents.len() as u64,
                    contents,
                }),
                Err(e) => warnings.push(format!("{path}: cannot read it back: {e}")),
            }
        }
        Ok((files, warnings))
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        // The tree goes before its disk is given back.
        drop(self.dir.take());
        if let Some(disk) = &self.disk {
            disk.give_back(self.charged);
        }
    }
}
