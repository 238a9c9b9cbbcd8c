//! The files of shipped trees (`proto::tree`), kept on disk by sha256 and
//! shared by every job and tenant, within a byte budget.
//!
//! Why a store and not a directory per job: a map's inputs, and the maps
//! after it, use the same data. Kept by hash, a file crosses the network
//! once per worker however many jobs mount it, and the least recently used
//! files go when the budget (`--file-store`) is reached. What a file takes
//! on disk — its bytes plus a block and an inode ([`NEW_INODE_BYTES`]), so
//! twenty thousand 4-byte files count as the 90 MB they hold, not 80 KB —
//! counts against the budget and the worker's disk total
//! (`--scratch-total`, shared with what running jobs write), so files and
//! jobs' scratch never fill the disk together.
//!
//! A file that a queued or running job needs is *pinned* ([`TreePins`]):
//! no upload can push it out before the job is done. A file is written to
//! a temporary name while its bytes arrive and hashed on the way; only
//! bytes whose sha256 is their name are kept.
//!
//! With `--tenants`, a tenant may mount only files and manifests it has
//! shown the worker (uploaded), as for modules (`worker::uploaders`): a hash
//! that leaks does not give another tenant the data.

use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use lru::LruCache;

use crate::leftovers;
use crate::proto::ModuleHash;
use crate::proto::tree::{FileHash, Manifest, TreeGrant};
use crate::sandbox::files::{NEW_INODE_BYTES, ScratchPool};
use crate::units::Bytes;

use super::layouts::Kept;

/// Bytes of files a worker keeps unless `--file-store` says otherwise.
pub const DEFAULT_FILE_STORE: u64 = 10 << 30;

/// Why a file or a tree was not taken.
#[derive(Debug, PartialEq, Eq)]
pub enum StoreError {
    /// The request is wrong (bad bytes, a bad manifest): 400.
    Invalid(String),
    /// Larger than this worker ever keeps: 413.
    TooLarge(String),
    /// No room now (the disk total is taken by pinned files and jobs): 507.
    Full(String),
    /// Writing failed on this host: 500.
    Io(String),
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Invalid(m)
            | StoreError::TooLarge(m)
            | StoreError::Full(m)
            | StoreError::Io(m) => f.write_str(m),
        }
    }
}

/// What a store's directory is named from (a temporary name after it).
const PREFIX: &str = "peerwasm-files-";

/// Files by hash, on disk; see the module docs.
#[derive(Debug)]
pub struct FileStore {
    /// Holds the files; removed with the store.
    dir: tempfile::TempDir,
    /// Held while the store lives: a worker starting later removes the
    /// store only once this process is gone.
    _claim: leftovers::Claim,
    budget: u64,
    disk: Option<Arc<ScratchPool>>,
    /// Whether tenants must show what they mount.
    multi_tenant: bool,
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Kept files and what each takes on disk, most recently used first.
    files: LruCache<FileHash, u64>,
    held: u64,
    pins: HashMap<FileHash, u32>,
    /// Within a byte budget per tenant (`worker::manifests`).
    manifests: super::manifests::Manifests,
    /// Tenants that uploaded each file or manifest (multi-tenant only).
    shown: HashMap<ModuleHash, HashSet<String>>,
    /// Files received, and their bytes (`/metrics`, tests).
    received: (u64, u64),
    /// Read-only trees laid out once and shared (`worker::layouts`).
    layouts: HashMap<ModuleHash, Kept>,
}

impl FileStore {
    /// An empty store in a new directory under `root` (the system's
    /// temporary directory if `None`), keeping at most `budget` bytes and
    /// charging them to `disk`.
    pub fn new(
        root: Option<&Path>,
        budget: u64,
        disk: Option<Arc<ScratchPool>>,
        multi_tenant: bool,
    ) -> anyhow::Result<FileStore> {
        let parent = root.map_or_else(std::env::temp_dir, Path::to_path_buf);
        // What workers killed here left (`peerwasm::leftovers`).
        let swept = leftovers::sweep(&parent, PREFIX, leftovers::CLAIM_FILE, leftovers::GRACE);
        if swept > 0 {
            tracing::info!(swept, dir = %parent.display(), "removed the file stores of workers that were killed");
        }
        let dir = tempfile::Builder::new()
            .prefix(PREFIX)
            .tempdir_in(&parent)
            .map_err(|e| anyhow::anyhow!("cannot make the file store's directory: {e}"))?;
        let claim = leftovers::claim(dir.path())
            .map_err(|e| anyhow::anyhow!("cannot claim the file store's directory: {e}"))?;
        Ok(FileStore {
            dir,
            _claim: claim,
            budget,
            disk,
            multi_tenant,
            inner: Mutex::new(Inner {
                files: LruCache::unbounded(),
                held: 0,
                pins: HashMap::new(),
                manifests: Default::default(),
                shown: HashMap::new(),
                received: (0, 0),
                layouts: HashMap::new(),
            }),
        })
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, Inner> {
        self.inner.lock()
    }

    /// Where a kept file is.
    pub fn path_of(&self, hash: &FileHash) -> PathBuf {
        self.dir.path().join(hash.to_hex())
    }

    /// Bytes kept now.
    pub fn held(&self) -> u64 {
        self.lock().held
    }

    /// Files received so far, and their bytes.
    pub fn received(&self) -> (u64, u64) {
        self.lock().received
    }

    fn may_use(&self, inner: &Inner, hash: &ModuleHash, tenant: &str) -> bool {
        !self.multi_tenant || inner.shown.get(hash).is_some_and(|t| t.contains(tenant))
    }

    fn record_shown(&self, inner: &mut Inner, hash: ModuleHash, tenant: &str) {
        if self.multi_tenant {
            inner
                .shown
                .entry(hash)
                .or_default()
                .insert(tenant.to_string());
        }
    }

    /// Takes a manifest from `tenant` (already checked against its hash
    /// by the caller) and returns the files of it this tenant must still
    /// send. Checking a large manifest takes milliseconds: call it on a
    /// blocking thread.
    pub fn put_manifest(
        &self,
        tenant: &str,
        hash: ModuleHash,
        manifest: Manifest,
    ) -> Result<Vec<FileHash>, StoreError> {
        manifest.check(self.budget).map_err(|e| {
            if e.contains("accepts trees of at most") {
                StoreError::TooLarge(e)
            } else {
                StoreError::Invalid(e)
            }
        })?;
        let mut inner = self.lock();
        let mut missing: Vec<FileHash> = manifest
            .files()
            .filter(|(_, h, _)| !(inner.files.contains(h) && self.may_use(&inner, h, tenant)))
            .map(|(_, h, _)| h)
            .collect();
        missing.sort_unstable();
        missing.dedup();
        inner
            .manifests
            .put(hash, manifest, tenant)
            .map_err(StoreError::TooLarge)?;
        self.record_shown(&mut inner, hash, tenant);
        Ok(missing)
    }

    /// Whether `tenant` already may use the file (then its upload can be
    /// skipped).
    pub fn has_file(&self, tenant: &str, hash: &FileHash) -> bool {
        let inner = self.lock();
        inner.files.contains(hash) && self.may_use(&inner, hash, tenant)
    }

    /// Starts receiving a file whose bytes should hash to `hash`.
    pub fn receive(self: &Arc<Self>, hash: FileHash) -> Result<Incoming, StoreError> {
        let tmp = tempfile::Builder::new()
            .prefix(".incoming-")
            .tempfile_in(self.dir.path())
            .map_err(|e| StoreError::Io(format!("cannot make a file in the store: {e}")))?;
        // A file holds a block and an inode however small it is: charged
        // before a byte arrives, and counted with it while it is kept.
        if !self.charge(NEW_INODE_BYTES) {
            return Err(full());
        }
        Ok(Incoming {
            store: self.clone(),
            hash,
            file: Some(tmp),
            len: 0,
            hasher: Default::default(),
            charged: NEW_INODE_BYTES,
        })
    }

    /// Takes `bytes` of the disk total, evicting unpinned files if need be
    /// (and, for that, dropping the shared layouts no job uses).
    fn charge(&self, bytes: u64) -> bool {
        let Some(disk) = &self.disk else { return true };
        loop {
            if disk.take(bytes) {
                return true;
            }
            let mut inner = self.lock();
            if !self.evict_one(&mut inner, None) && !drop_layouts(&mut inner, Kept::idle) {
                return false;
            }
        }
    }

    /// The shared read-only layout of the tree `manifest` (whose hash is
    /// `hash`), laid out now if none is kept: its directory, for the caller
    /// to hold while its job runs. `Ok(None)`: it cannot be shared (lay it
    /// out for the job alone). The caller has the tree's files pinned.
    /// Blocking. See `worker::layouts`.
    pub fn shared_layout(
        &self,
        hash: ModuleHash,
        manifest: &Manifest,
    ) -> Result<Option<Arc<tempfile::TempDir>>, String> {
        let now = Instant::now();
        {
            let mut inner = self.lock();
            drop_layouts(&mut inner, |k| {
                k.idle() && now.duration_since(k.used) > super::layouts::IDLE
            });
            if let Some(kept) = inner.layouts.get_mut(&hash) {
                kept.used = now;
                return Ok(Some(kept.dir.clone()));
            }
        }
        let parent = self.dir.path().join("layouts");
        if std::fs::create_dir_all(&parent).is_err() {
            return Ok(None);
        }
        let Some(dir) = super::layouts::lay_out(&parent, manifest, |h| self.path_of(h))? else {
            return Ok(None);
        };
        let mut inner = self.lock();
        if let Some(kept) = inner.layouts.get_mut(&hash) {
            // Laid out by another job meanwhile: theirs is kept, ours goes.
            kept.used = now;
            return Ok(Some(kept.dir.clone()));
        }
        let dir = Arc::new(dir);
        if inner.layouts.len() >= super::layouts::MAX_KEPT {
            let oldest = inner
                .layouts
                .iter()
                .filter(|(_, k)| k.idle())
                .min_by_key(|(_, k)| k.used)
                .map(|(h, _)| *h);
            let Some(oldest) = oldest else {
                // Every kept one is in use: this one serves its job alone.
                return Ok(Some(dir));
            };
            if let Some(kept) = inner.layouts.remove(&oldest) {
                for f in &kept.files {
                    unpin(&mut inner, f);
                }
            }
        }
        let files: Vec<FileHash> = manifest.files().map(|(_, h, _)| h).collect();
        for h in &files {
            *inner.pins.entry(*h).or_insert(0) += 1;
        }
        inner.layouts.insert(
            hash,
            Kept {
                dir: dir.clone(),
                files,
                used: now,
            },
        );
        Ok(Some(dir))
    }

    fn uncharge(&self, bytes: u64) {
        if let Some(disk) = &self.disk {
            disk.give_back(bytes);
        }
    }

    /// Removes the least recently used unpinned file other than `keep`;
    /// false if there is none.
    fn evict_one(&self, inner: &mut Inner, keep: Option<&FileHash>) -> bool {
        let victim = inner
            .files
            .iter()
            .rev()
            .map(|(h, _)| *h)
            .find(|h| Some(h) != keep && !inner.pins.contains_key(h));
        let Some(victim) = victim else { return false };
        if let Some(size) = inner.files.pop(&victim) {
            inner.held -= size;
            inner.shown.remove(&victim);
            let _ = std::fs::remove_file(self.path_of(&victim));
            self.uncharge(size);
        }
        true
    }

    /// Pins every file of `trees` for a job of `tenant`, or says what is
    /// missing (the client is to send the tree again).
    pub fn pin_trees(
        self: &Arc<Self>,
        tenant: &str,
        trees: &[TreeGrant],
    ) -> Result<TreePins, String> {
        let mut inner = self.lock();
        let mut manifests = Vec::with_capacity(trees.len());
        for grant in trees {
            let Some(m) = inner.manifests.get(&grant.manifest) else {
                return Err(format!(
                    "tree {} unknown here: send it first",
                    &grant.manifest.to_hex()[..12]
                ));
            };
            if !self.may_use(&inner, &grant.manifest, tenant) {
                return Err(format!(
                    "tree {} not sent by you: send it first",
                    &grant.manifest.to_hex()[..12]
                ));
            }
            if let Some((path, _, _)) = m
                .files()
                .find(|(_, h, _)| !(inner.files.contains(h) && self.may_use(&inner, h, tenant)))
            {
                return Err(format!(
                    "file {path:?} of tree {} is not here: send it",
                    &grant.manifest.to_hex()[..12]
                ));
            }
            manifests.push(m);
        }
        let mut pinned = Vec::new();
        for m in &manifests {
            for (_, h, _) in m.files() {
                inner.files.promote(&h);
                *inner.pins.entry(h).or_insert(0) += 1;
                pinned.push(h);
            }
        }
        Ok(TreePins {
            store: self.clone(),
            pinned,
            manifests,
        })
    }
}

/// The files of a job's trees, kept until the job is done.
#[derive(Debug)]
pub struct TreePins {
    store: Arc<FileStore>,
    pinned: Vec<FileHash>,
    /// The job's trees' manifests, in the order of its `trees`.
    pub manifests: Vec<Arc<Manifest>>,
}

/// One pin of `h` fewer.
fn unpin(inner: &mut Inner, h: &FileHash) {
    if let Some(n) = inner.pins.get_mut(h) {
        *n -= 1;
        if *n == 0 {
            inner.pins.remove(h);
        }
    }
}

/// Drops the kept layouts `which` says, unpinning their files; whether any
/// was. (A job holding one keeps its directory until it ends.)
fn drop_layouts(inner: &mut Inner, which: impl Fn(&Kept) -> bool) -> bool {
    let gone: Vec<ModuleHash> = inner
        .layouts
        .iter()
        .filter(|(_, k)| which(k))
        .map(|(h, _)| *h)
        .collect();
    for h in &gone {
        if let Some(kept) = inner.layouts.remove(h) {
            for f in &kept.files {
                unpin(inner, f);
            }
        }
    }
    !gone.is_empty()
}

impl Drop for TreePins {
    fn drop(&mut self) {
        let mut inner = self.store.lock();
        for h in &self.pinned {
            unpin(&mut inner, h);
        }
        let store = &self.store;
        while inner.held > store.budget
            && (store.evict_one(&mut inner, None) || drop_layouts(&mut inner, Kept::idle))
        {}
    }
}

fn full() -> StoreError {
    StoreError::Full("this worker's disk total is taken (by files jobs need now, and what they write): try another worker".into())
}

/// A file arriving: written, hashed and charged as its bytes come.
pub struct Incoming {
    store: Arc<FileStore>,
    hash: FileHash,
    file: Option<tempfile::NamedTempFile>,
    len: u64,
    hasher: sha2::Sha256,
    charged: u64,
}

impl Incoming {
    /// Writes the next bytes. Blocking: call from a blocking thread or with
    /// small chunks.
    pub fn write(&mut self, chunk: &[u8]) -> Result<(), StoreError> {
        use sha2::Digest;
        use std::io::Write;
        let len = self.len + chunk.len() as u64;
        if len.saturating_add(NEW_INODE_BYTES) > self.store.budget {
            return Err(StoreError::TooLarge(format!(
                "the file is larger than the {} this worker keeps (its --file-store)",
                Bytes(self.store.budget)
            )));
        }
        if !self.store.charge(chunk.len() as u64) {
            return Err(full());
        }
        self.charged += chunk.len() as u64;
        self.hasher.update(chunk);
        let file = self.file.as_mut().expect("written until finished");
        file.write_all(chunk)
            .map_err(|e| StoreError::Io(format!("cannot write to the file store: {e}")))?;
        self.len = len;
        Ok(())
    }

    /// Keeps the file if its bytes hash to its name; `tenant` has then
    /// shown it.
    pub fn finish(mut self, tenant: &str) -> Result<(), StoreError> {
        use sha2::Digest;
        let got = ModuleHash(std::mem::take(&mut self.hasher).finalize().into());
        if got != self.hash {
            return Err(StoreError::Invalid("the bytes do not match the sha256 in the URL (did the file change while it was sent?)".into()));
        }
        let file = self.file.take().expect("finished once");
        let store = &self.store;
        let mut inner = store.lock();
        store.record_shown(&mut inner, self.hash, tenant);
        inner.received.0 += 1;
        inner.received.1 += self.len;
        if inner.files.contains(&self.hash) {
            return Ok(()); // sent twice at once: keep one (this one's charge goes with `self`)
        }
        let path = store.path_of(&self.hash);
        file.persist(&path)
            .map_err(|e| StoreError::Io(format!("cannot keep the file: {e}")))?;
        let _ =
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o444));
        let cost = self.len + NEW_INODE_BYTES;
        inner.files.put(self.hash, cost);
        inner.held += cost;
        self.charged = 0; // now the store's, given back when it is evicted
        let hash = self.hash;
        while inner.held > store.budget
            && (store.evict_one(&mut inner, Some(&hash)) || drop_layouts(&mut inner, Kept::idle))
        {
        }
        Ok(())
    }
}

impl Drop for Incoming {
    /// An upload that failed or was not kept gives back its charge (its
    /// temporary file removes itself).
    fn drop(&mut self) {
        self.store.uncharge(self.charged);
    }
}

#[cfg(test)]
mod tests;
