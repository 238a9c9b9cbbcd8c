//! The client's half of shipped trees (`proto::tree`): a host directory
//! hashed into a manifest, and the files a remote job wrote back into the
//! host directory (or a map's `--out-dir`).
//!
//! Hashing a large directory on every run would cost more than sending
//! it once, so each file's hash is kept in the cache directory beside its
//! size, modification time and inode; a repeated run hashes again only the
//! files where one of those changed (as `make` and `rsync` decide).
//!
//! Symbolic links are followed while they stay inside the tree (a worker
//! sees their targets' contents); one that points out of it is refused,
//! naming it, rather than shipping whatever it points at. Files coming
//! back are checked with the same path rule as manifests, never written
//! through a symbolic link, and written whole (a temporary file renamed
//! into place).

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use crate::proto::tree::{
    EntryKind, FileBack, FileHash, Manifest, TreeEntry, TreeGrant, check_path,
};
use crate::proto::{DirGrant, ModuleHash};

/// Host directories hashed for shipping, each once per pool handle.
pub(crate) type ShippedTrees = parking_lot::Mutex<
    std::collections::HashMap<
        DirGrant,
        std::sync::Arc<tokio::sync::OnceCell<std::sync::Arc<ShippedTree>>>,
    >,
>;

/// A host directory ready to ship: its manifest, and where each file's
/// bytes are.
#[derive(Debug)]
pub struct ShippedTree {
    /// What the job asks the worker for.
    pub grant: TreeGrant,
    /// The tree.
    pub manifest: Manifest,
    /// The manifest as sent.
    pub encoded: bytes::Bytes,
    /// Each file's bytes on this machine, by hash.
    pub sources: HashMap<FileHash, PathBuf>,
    /// What scanning it took.
    pub stats: ScanStats,
}

/// What a scan found and did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanStats {
    /// Files in the tree.
    pub files: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Files whose bytes were read and hashed (the others' hashes were
    /// known from an earlier scan).
    pub hashed: usize,
}

/// What a file's kept hash was computed for: if its size, modification
/// time (to the nanosecond) and inode are still these, it is taken as
/// unchanged (the trade `make` and cargo make).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct FileStamp {
    size: u64,
    mtime_ns: i128,
    inode: u64,
}

impl FileStamp {
    /// The stamp of a file with this metadata.
    pub(crate) fn of(meta: &std::fs::Metadata) -> FileStamp {
        FileStamp {
            size: meta.len(),
            mtime_ns: meta.mtime() as i128 * 1_000_000_000 + meta.mtime_nsec() as i128,
            inode: meta.ino(),
        }
    }
}

/// A file's hash as last computed, and what it was computed for.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Known {
    stamp: FileStamp,
    hash: FileHash,
}

/// Hashes `dir.host` into a manifest, using and refreshing the hashes kept
/// under `cache` (none: hash everything). Blocking.
pub fn scan(dir: &DirGrant, cache: Option<&Path>) -> anyhow::Result<ShippedTree> {
    let root = std::fs::canonicalize(&dir.host)
        .with_context(|| format!("--dir {}", dir.host.display()))?;
    let cache_file = cache.map(|c| {
        c.join("file-hashes")
            .join(ModuleHash::of(root.as_os_str().as_encoded_bytes()).to_hex())
    });
    let mut known: HashMap<String, Known> = cache_file
        .as_ref()
        .and_then(|f| std::fs::read(f).ok())
        .and_then(|b| postcard::from_bytes(&b).ok())
        .unwrap_or_default();
    let mut now_known = HashMap::new();
    let mut entries = Vec::new();
    let mut sources = HashMap::new();
    let mut stats = ScanStats::default();
    for entry in walkdir::WalkDir::new(&root).follow_links(true).min_depth(1) {
        let entry = entry.map_err(|e| match e.loop_ancestor() {
            Some(a) => anyhow::anyhow!(
                "--dir {}: a symbolic link loops back to {}",
                dir.host.display(),
                a.display()
            ),
            None => anyhow::anyhow!("--dir {}: {e}", dir.host.display()),
        })?;
        let rel = entry.path().strip_prefix(&root).expect("under the root");
        let Some(rel) = rel.to_str().map(str::to_string) else {
            bail!(
                "--dir {}: {} has a name that is not UTF-8, which cannot be shipped",
                dir.host.display(),
                rel.display()
            );
        };
        if entry.path_is_symlink() {
            let target = std::fs::canonicalize(entry.path())?;
            if !target.starts_with(&root) {
                bail!(
                    "--dir {}: {rel} is a symbolic link to {}, outside the directory; only what is inside is shipped",
                    dir.host.display(),
                    target.display()
                );
            }
        }
        check_path(&rel).map_err(|e| anyhow::anyhow!("--dir {}: {e}", dir.host.display()))?;
        let kind = if entry.file_type().is_dir() {
            EntryKind::Dir
        } else if entry.file_type().is_file() {
            let meta = entry.metadata()?;
            let stamp = FileStamp::of(&meta);
            let hash = match known.remove(&rel) {
                Some(k) if k.stamp == stamp => k.hash,
                _ => {
                    stats.hashed += 1;
                    hash_file(entry.path())?
                }
            };
            now_known.insert(rel.clone(), Known { stamp, hash });
            stats.files += 1;
            stats.bytes += meta.len();
            sources
                .entry(hash)
                .or_insert_with(|| entry.path().to_path_buf());
            EntryKind::File {
                hash,
                size: meta.len(),
            }
        } else {
            continue; // sockets, fifos, devices: nothing a job reads as data
        };
        entries.push(TreeEntry { path: rel, kind });
    }
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    if let Some(f) = &cache_file
        && stats.hashed > 0
    {
        // A cache that cannot be written only costs hashing next time.
        let _ = std::fs::create_dir_all(f.parent().expect("has a parent")).and_then(|()| {
            // Whole or not at all: two maps of the same tree write it at once.
            crate::private_path::replace(
                f,
                &postcard::to_allocvec(&now_known).unwrap_or_default(),
                0o600,
            )
        });
    }
    let manifest = Manifest { entries };
    let encoded = bytes::Bytes::from(manifest.encode());
    let grant = TreeGrant {
        manifest: ModuleHash::of(&encoded),
        guest: dir.guest.clone(),
        read_only: dir.read_only,
    };
    Ok(ShippedTree {
        grant,
        manifest,
        encoded,
        sources,
        stats,
    })
}

fn hash_file(path: &Path) -> anyhow::Result<FileHash> {
    use sha2::Digest;
    let mut file =
        std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut hasher = sha2::Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file
            .read(&mut buf)
            .with_context(|| format!("cannot read {}", path.display()))?;
        if n == 0 {
            return Ok(ModuleHash(hasher.finalize().into()));
        }
        hasher.update(&buf[..n]);
    }
}

/// Where files coming back from a job with these `dirs` go: into each
/// writable directory itself, or with `out` into `out` (a map's
/// `OUT_DIR/<index>`; with several writable directories, each under its
/// guest path).
pub fn destination(dirs: &[DirGrant], tree: u32, out: Option<&Path>) -> anyhow::Result<PathBuf> {
    let Some(dir) = dirs.get(tree as usize) else {
        bail!("the worker sent back a file of directory #{tree}, which the job does not have");
    };
    if dir.read_only {
        bail!(
            "the worker sent back a file of {}, which the job had read-only",
            dir.host.display()
        );
    }
    Ok(match out {
        None => dir.host.clone(),
        Some(out) if dirs.iter().filter(|d| !d.read_only).count() == 1 => out.to_path_buf(),
        Some(out) => out.join(dir.guest.trim_matches('/').replace('/', "_")),
    })
}

/// Writes the files a job sent back (see [`destination`]) and empties
/// their contents in the result; returns how many were written. Blocking.
pub fn write_back(
    dirs: &[DirGrant],
    files: &mut [FileBack],
    out: Option<&Path>,
) -> anyhow::Result<usize> {
    for f in files.iter_mut() {
        check_path(&f.path)
            .map_err(|e| anyhow::anyhow!("the worker sent back a file with a bad path: {e}"))?;
        let root = destination(dirs, f.tree, out)?;
        std::fs::create_dir_all(&root)
            .with_context(|| format!("cannot make {}", root.display()))?;
        let target = root.join(&f.path);
        // Parents are made one by one, never through a symbolic link.
        let mut at = root.clone();
        let parts: Vec<&str> = f.path.split('/').collect();
        for part in &parts[..parts.len() - 1] {
            at.push(part);
            match std::fs::symlink_metadata(&at) {
                Ok(m) if m.file_type().is_symlink() => {
                    bail!(
                        "{} is a symbolic link: {} is not written through it",
                        at.display(),
                        f.path
                    )
                }
                Ok(m) if m.is_dir() => {}
                Ok(_) => bail!(
                    "{} is a file, so {} cannot be written under it",
                    at.display(),
                    f.path
                ),
                Err(_) => std::fs::create_dir(&at)
                    .with_context(|| format!("cannot make {}", at.display()))?,
            }
        }
        let parent = target.parent().expect("a file under the root");
        let mut tmp = tempfile::Builder::new()
            .prefix(".peerwasm-")
            .tempfile_in(parent)
            .with_context(|| format!("cannot write into {}", parent.display()))?;
        std::io::Write::write_all(&mut tmp, &f.contents)
            .with_context(|| format!("cannot write {}", target.display()))?;
        tmp.persist(&target)
            .with_context(|| format!("cannot write {}", target.display()))?;
        f.contents = Vec::new();
    }
    Ok(files.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(dir: &Path) -> DirGrant {
        DirGrant {
            host: dir.to_path_buf(),
            guest: "/d".into(),
            read_only: false,
        }
    }

    #[test]
    fn a_second_scan_hashes_only_what_changed() {
        let dir = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::create_dir(dir.path().join("empty")).unwrap();
        std::fs::write(dir.path().join("a.txt"), b"alpha").unwrap();
        std::fs::write(dir.path().join("sub/b.txt"), b"beta").unwrap();
        let first = scan(&grant(dir.path()), Some(cache.path())).unwrap();
        assert_eq!(
            first.stats,
            ScanStats {
                files: 2,
                bytes: 9,
                hashed: 2
            }
        );
        let paths: Vec<&str> = first
            .manifest
            .entries
            .iter()
            .map(|e| e.path.as_str())
            .collect();
        assert_eq!(paths, ["a.txt", "empty", "sub", "sub/b.txt"]);
        assert_eq!(first.manifest.check(u64::MAX), Ok(()));

        let again = scan(&grant(dir.path()), Some(cache.path())).unwrap();
        assert_eq!(again.stats.hashed, 0, "nothing changed");
        assert_eq!(again.grant.manifest, first.grant.manifest);

        std::fs::write(dir.path().join("sub/b.txt"), b"beta, longer").unwrap();
        let changed = scan(&grant(dir.path()), Some(cache.path())).unwrap();
        assert_eq!(changed.stats.hashed, 1);
        assert_ne!(changed.grant.manifest, first.grant.manifest);
    }

    #[test]
    fn links_inside_are_followed_and_links_out_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("real.txt"), b"in").unwrap();
        std::os::unix::fs::symlink(dir.path().join("real.txt"), dir.path().join("alias.txt"))
            .unwrap();
        let tree = scan(&grant(dir.path()), None).unwrap();
        assert_eq!(tree.stats.files, 2);
        std::fs::write(outside.path().join("secret"), b"key").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), dir.path().join("leak")).unwrap();
        let err = scan(&grant(dir.path()), None).unwrap_err().to_string();
        assert!(
            err.contains("leak is a symbolic link to") && err.contains("outside the directory"),
            "{err}"
        );
    }

    #[test]
    fn files_back_are_written_under_the_root_and_never_outside_it() {
        let dir = tempfile::tempdir().unwrap();
        let dirs = [grant(dir.path())];
        let back = |path: &str| FileBack {
            tree: 0,
            path: path.into(),
            size: 2,
            contents: b"hi".to_vec(),
        };
        let mut files = vec![back("out/x.txt")];
        assert_eq!(write_back(&dirs, &mut files, None).unwrap(), 1);
        assert_eq!(std::fs::read(dir.path().join("out/x.txt")).unwrap(), b"hi");
        assert!(files[0].contents.is_empty());
        for bad in ["../escape", "/etc/x", "a/../../b"] {
            assert!(write_back(&dirs, &mut [back(bad)], None).is_err(), "{bad}");
        }
        let elsewhere = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), dir.path().join("link")).unwrap();
        let err = write_back(&dirs, &mut [back("link/x")], None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("symbolic link"), "{err}");
        assert!(!elsewhere.path().join("x").exists());
        let out = tempfile::tempdir().unwrap();
        write_back(&dirs, &mut [back("y.txt")], Some(&out.path().join("7"))).unwrap();
        assert_eq!(std::fs::read(out.path().join("7/y.txt")).unwrap(), b"hi");
    }
}
