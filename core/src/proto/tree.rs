//! Directory trees shipped to remote jobs by content hash: what a
//! `--dir HOST::GUEST` becomes when the job runs on another machine.
//!
//! A tree travels as a [`Manifest`] — every file's relative path, size and
//! sha256, every directory's path — named by the sha256 of its postcard
//! encoding. A job names the trees it needs ([`TreeGrant`]); a worker that
//! lacks a tree or any file of it answers `424` ([`MISSING_STATUS`]), the
//! client sends the manifest (`PUT /v1/trees/{sha256}`, answered with the
//! files this worker still lacks) and those files (`PUT /v1/files/{sha256}`),
//! then the job again. Files are kept by hash, so a tree shared by every
//! input of a map, or by two maps, crosses the network once per worker.
//!
//! What a job writes into a writable tree comes back in its result
//! ([`FileBack`]), and the client writes it into the host directory.
//!
//! Every path in a manifest or a result is checked with [`check_path`]
//! before anything touches a disk: relative, `/`-separated, no `.`, `..` or
//! empty parts — the same rule on the worker (a hostile client) and on the
//! client (a hostile worker).

use serde::{Deserialize, Serialize};

use super::hash::ModuleHash;
use crate::units::Bytes;

/// The sha256 of a file's bytes (the same kind of name a module goes by).
pub type FileHash = ModuleHash;

/// The status a worker answers a job whose tree (or some file of it) it
/// lacks: `424 Failed Dependency` — send the tree, then the job again.
/// (`404` means the module.)
pub const MISSING_STATUS: u16 = 424;

/// The most entries one manifest may list.
pub const MAX_TREE_ENTRIES: usize = 100_000;

/// The longest path in a manifest, in bytes.
pub const MAX_PATH_BYTES: usize = 4096;

/// The most parts a path in a tree may have. Real trees are a few dozen
/// deep at most.
pub const MAX_PATH_DEPTH: usize = 256;

/// The most an encoded manifest may be, in bytes.
pub const MAX_MANIFEST_BYTES: usize = 32 << 20;

/// A directory tree: its directories and files, by relative path, sorted
/// by path with no duplicates.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Every entry, sorted by `path`.
    pub entries: Vec<TreeEntry>,
}

/// One directory or file of a tree.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeEntry {
    /// Relative to the tree's root, `/`-separated (see [`check_path`]).
    pub path: String,
    /// What it is.
    pub kind: EntryKind,
}

/// A directory, or a file with its size and hash.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EntryKind {
    /// A directory (parents of files need not be listed; empty ones must).
    Dir,
    /// A regular file.
    File {
        /// Its sha256.
        hash: FileHash,
        /// Its length in bytes.
        size: u64,
    },
}

/// A tree a job mounts, as `--dir HOST::GUEST[:ro]` does on the embedded
/// worker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeGrant {
    /// The sha256 of the tree's encoded [`Manifest`].
    pub manifest: ModuleHash,
    /// Where the guest sees it (`/data`, `.`...).
    pub guest: String,
    /// Whether the guest may only read; otherwise what it creates or
    /// changes comes back in its result.
    pub read_only: bool,
}

/// A file a job created or changed in a writable tree, sent back with its
/// result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileBack {
    /// Which of the job's trees (its index in `JobSpec::trees`).
    pub tree: u32,
    /// Relative to the tree's root (see [`check_path`]).
    pub path: String,
    /// Its length in bytes.
    pub size: u64,
    /// Its bytes. Emptied by the client once written to disk, so a JSON
    /// result names the file without carrying it.
    #[serde(with = "serde_bytes")]
    pub contents: Vec<u8>,
}

impl Manifest {
    /// Its name: the sha256 of its postcard encoding.
    pub fn hash(&self) -> ModuleHash {
        ModuleHash::of(&self.encode())
    }

    /// Its postcard encoding, as sent.
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).expect("a manifest always encodes")
    }

    /// The files, with their sizes and hashes.
    pub fn files(&self) -> impl Iterator<Item = (&str, FileHash, u64)> {
        self.entries.iter().filter_map(|e| match e.kind {
            EntryKind::File { hash, size } => Some((e.path.as_str(), hash, size)),
            EntryKind::Dir => None,
        })
    }

    /// The sum of its files' sizes.
    pub fn total_bytes(&self) -> u64 {
        self.files()
            .map(|(_, _, size)| size)
            .fold(0u64, u64::saturating_add)
    }

    /// Checks what a worker must before it writes anything of the tree:
    /// at most [`MAX_TREE_ENTRIES`] entries, every path valid, sorted and
    /// unique, no path both a file and a parent of another, and at most
    /// `max_bytes` in all.
    pub fn check(&self, max_bytes: u64) -> Result<(), String> {
        if self.entries.len() > MAX_TREE_ENTRIES {
            return Err(format!(
                "the tree has {} entries; at most {MAX_TREE_ENTRIES} are accepted",
                self.entries.len()
            ));
        }
        for e in &self.entries {
            check_path(&e.path)?;
        }
        for pair in self.entries.windows(2) {
            if pair[0].path >= pair[1].path {
                return Err(format!(
                    "the manifest is not sorted, or lists {:?} twice",
                    pair[1].path
                ));
            }
        }
        // A file that is also a directory ("a" a file, "a/b" listed too).
        // Paths are sorted, so those under "a/" are one run: a binary
        // search per file finds its start (no walk over every ancestor of
        // every entry, which is quadratic in a path's depth).
        let mut probe = String::new();
        for (path, _, _) in self.files() {
            probe.clear();
            probe.push_str(path);
            probe.push('/');
            let at = self
                .entries
                .partition_point(|e| e.path.as_str() < probe.as_str());
            if let Some(e) = self
                .entries
                .get(at)
                .filter(|e| e.path.starts_with(probe.as_str()))
            {
                return Err(format!(
                    "{path:?} is listed as a file and as the directory of {:?}",
                    e.path
                ));
            }
        }
        let total = self.total_bytes();
        if total > max_bytes {
            return Err(format!(
                "the tree holds {} of files; this worker accepts trees of at most {}",
                Bytes(total),
                Bytes(max_bytes)
            ));
        }
        Ok(())
    }
}

/// Whether `path` may name an entry of a tree: non-empty, relative,
/// `/`-separated parts that are neither empty, `.` nor `..`, no NUL, at
/// most [`MAX_PATH_BYTES`] in at most [`MAX_PATH_DEPTH`] parts. Nothing
/// named so can leave the tree's root.
pub fn check_path(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("an empty path".into());
    }
    if path.len() > MAX_PATH_BYTES {
        return Err(format!(
            "a path of {} bytes (at most {MAX_PATH_BYTES})",
            path.len()
        ));
    }
    if path.starts_with('/') {
        return Err(format!(
            "{path:?} is absolute; paths in a tree are relative to its root"
        ));
    }
    if path.contains('\0') || path.contains('\\') {
        return Err(format!("{path:?} has a NUL or a backslash"));
    }
    for (depth, part) in path.split('/').enumerate() {
        if depth >= MAX_PATH_DEPTH {
            return Err(format!(
                "a path {MAX_PATH_DEPTH} directories deep or more (real trees are far shallower)"
            ));
        }
        match part {
            "" => return Err(format!("{path:?} has an empty part")),
            "." | ".." => {
                return Err(format!(
                    "{path:?} has a {part:?} part; nothing may leave the tree"
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, size: u64) -> TreeEntry {
        TreeEntry {
            path: path.into(),
            kind: EntryKind::File {
                hash: ModuleHash::of(path.as_bytes()),
                size,
            },
        }
    }

    #[test]
    fn paths_that_could_leave_the_tree_are_refused() {
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../x",
            "a//b",
            "./a",
            "a/.",
            "a\0b",
            "a\\..\\b",
            "a/",
        ] {
            assert!(check_path(bad).is_err(), "{bad:?} accepted");
        }
        for good in ["a", "a/b.txt", "..a", "a..", ".hidden/x"] {
            assert_eq!(check_path(good), Ok(()), "{good:?}");
        }
    }

    #[test]
    fn a_manifest_must_be_sorted_unique_consistent_and_within_size() {
        let ok = Manifest {
            entries: vec![
                file("a", 1),
                TreeEntry {
                    path: "d".into(),
                    kind: EntryKind::Dir,
                },
                file("d/x", 2),
            ],
        };
        assert_eq!(ok.check(3), Ok(()));
        assert!(
            ok.check(2).unwrap_err().contains("at most 2 B"),
            "{:?}",
            ok.check(2)
        );
        let unsorted = Manifest {
            entries: vec![file("b", 1), file("a", 1)],
        };
        assert!(unsorted.check(10).is_err());
        let twice = Manifest {
            entries: vec![file("a", 1), file("a", 1)],
        };
        assert!(twice.check(10).is_err());
        let file_as_dir = Manifest {
            entries: vec![file("a", 1), file("a/b", 1)],
        };
        assert!(
            file_as_dir
                .check(10)
                .unwrap_err()
                .contains("as a file and as the directory")
        );
        let traversal = Manifest {
            entries: vec![file("../../etc/cron.d/x", 1)],
        };
        assert!(traversal.check(10).is_err());
    }

    #[test]
    fn a_deep_manifest_is_checked_quickly_and_too_deep_refused() {
        // 2,000 files, each 255 parts deep under its own top directory:
        // walking every ancestor of every entry took seconds.
        let deep = |i: usize| format!("{i:04}/{}", vec!["d"; 254].join("/"));
        let entries = (0..2000).map(|i| file(&deep(i), 1)).collect();
        let m = Manifest { entries };
        let t = std::time::Instant::now();
        assert_eq!(m.check(u64::MAX), Ok(()));
        assert!(
            t.elapsed() < std::time::Duration::from_millis(500),
            "{:?}",
            t.elapsed()
        );
        let too_deep = vec!["d"; MAX_PATH_DEPTH + 1].join("/");
        assert!(check_path(&too_deep).unwrap_err().contains("deep"));
        // A file under a file, many levels down, is still found.
        let m = Manifest {
            entries: vec![
                file("a", 1),
                file("a-b", 1),
                file(&format!("a/{}", deep(1)), 1),
            ],
        };
        assert!(
            m.check(10)
                .unwrap_err()
                .contains("as a file and as the directory")
        );
    }

    #[test]
    fn the_name_of_a_manifest_changes_with_any_entry() {
        let a = Manifest {
            entries: vec![file("a", 1)],
        };
        let b = Manifest {
            entries: vec![file("a", 2)],
        };
        assert_ne!(a.hash(), b.hash());
        assert_eq!(a.hash(), a.clone().hash());
    }
}
