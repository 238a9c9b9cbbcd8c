//! The tree manifests a worker remembers (`PUT /v1/trees/{sha256}`), within
//! a byte budget per tenant and in all.
//!
//! A manifest is kept from its upload until a job mounts it, and may be
//! large (a tree of 100,000 files is ~14 MiB in memory). Bounded by count
//! alone, 4,096 manifests of 32 MiB each could be parked by a tenant who
//! never sends a file. Here each kept manifest is charged, by its size in
//! memory, to the tenant who sent it first: past [`PER_TENANT`] that
//! tenant's own least recently used manifests go; past [`TOTAL`] anyone's.
//! A job that has mounted a manifest holds it (an `Arc`) whatever happens
//! here; a client whose manifest went sends it again (its job is refused
//! "send it first").

use std::collections::HashMap;
use std::sync::Arc;

use lru::LruCache;

use crate::proto::ModuleHash;
use crate::proto::tree::Manifest;
use crate::units::Bytes;

/// Bytes of manifests one tenant may have kept here.
pub const PER_TENANT: u64 = 16 << 20;

/// Bytes of manifests kept here in all.
pub const TOTAL: u64 = 32 << 20;

/// The memory a manifest takes, estimated from its entries (each a
/// `String` and its kind) — not its encoding, which is smaller.
pub fn size_of(m: &Manifest) -> u64 {
    let per_entry = (std::mem::size_of::<crate::proto::tree::TreeEntry>() + 16) as u64;
    m.entries
        .iter()
        .map(|e| e.path.len() as u64 + per_entry)
        .sum::<u64>()
        + 64
}

#[derive(Debug)]
struct Kept {
    manifest: Arc<Manifest>,
    bytes: u64,
    payer: String,
}

/// Kept manifests by hash, least recently used first out.
#[derive(Debug)]
pub struct Manifests {
    kept: LruCache<ModuleHash, Kept>,
    total: u64,
    by_tenant: HashMap<String, u64>,
}

impl Default for Manifests {
    fn default() -> Self {
        Manifests {
            kept: LruCache::unbounded(),
            total: 0,
            by_tenant: HashMap::new(),
        }
    }
}

impl Manifests {
    /// The manifest named `hash`, if kept (it becomes the most recently used).
    pub fn get(&mut self, hash: &ModuleHash) -> Option<Arc<Manifest>> {
        self.kept.get(hash).map(|k| k.manifest.clone())
    }

    /// Bytes kept in all, and for `tenant`.
    #[cfg(test)]
    pub fn held(&self, tenant: &str) -> (u64, u64) {
        (self.total, self.by_tenant.get(tenant).copied().unwrap_or(0))
    }

    /// Keeps `manifest` for `tenant`, making room by dropping the least
    /// recently used (the tenant's own first); refused if it alone is more
    /// than a tenant may keep.
    pub fn put(
        &mut self,
        hash: ModuleHash,
        manifest: Manifest,
        tenant: &str,
    ) -> Result<(), String> {
        if self.kept.promote(&hash) {
            return Ok(()); // kept already, charged to whoever sent it first
        }
        let bytes = size_of(&manifest);
        if bytes > PER_TENANT {
            return Err(format!(
                "the tree's manifest takes {} in memory; a worker keeps at most {} of one tenant's manifests",
                Bytes(bytes),
                Bytes(PER_TENANT)
            ));
        }
        while self.by_tenant.get(tenant).copied().unwrap_or(0) + bytes > PER_TENANT {
            let oldest = self
                .kept
                .iter()
                .rev()
                .find(|(_, k)| k.payer == tenant)
                .map(|(h, _)| *h);
            self.remove(&oldest.expect("a tenant holding bytes has manifests"));
        }
        while self.total + bytes > TOTAL {
            let (oldest, _) = self
                .kept
                .peek_lru()
                .expect("bytes held means manifests kept");
            let oldest = *oldest;
            self.remove(&oldest);
        }
        self.total += bytes;
        *self.by_tenant.entry(tenant.to_string()).or_insert(0) += bytes;
        self.kept.put(
            hash,
            Kept {
                manifest: Arc::new(manifest),
                bytes,
                payer: tenant.to_string(),
            },
        );
        Ok(())
    }

    fn remove(&mut self, hash: &ModuleHash) {
        if let Some(k) = self.kept.pop(hash) {
            self.total -= k.bytes;
            if let Some(t) = self.by_tenant.get_mut(&k.payer) {
                *t -= k.bytes;
                if *t == 0 {
                    self.by_tenant.remove(&k.payer);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::tree::{EntryKind, TreeEntry};

    fn manifest(tag: usize, files: usize, path_len: usize) -> Manifest {
        let entries = (0..files)
            .map(|i| TreeEntry {
                path: format!("{tag:04}-{i:06}-{}", "x".repeat(path_len)),
                kind: EntryKind::File {
                    hash: ModuleHash::of(&i.to_le_bytes()),
                    size: 1,
                },
            })
            .collect();
        Manifest { entries }
    }

    #[test]
    fn a_tenant_parks_no_more_than_its_share_and_others_keep_theirs() {
        let mut m = Manifests::default();
        let bob = manifest(0, 100, 10);
        m.put(bob.hash(), bob.clone(), "bob").unwrap();
        // Alice sends manifest after manifest of ~1 MiB each.
        for tag in 1..100 {
            let big = manifest(tag, 8000, 30);
            m.put(big.hash(), big, "alice").unwrap();
            let (total, alice) = m.held("alice");
            assert!(alice <= PER_TENANT && total <= TOTAL, "{alice} / {total}");
        }
        assert!(
            m.get(&bob.hash()).is_some(),
            "bob's manifest was pushed out by alice's"
        );
        // One manifest larger than a tenant's share is refused.
        let huge = manifest(200, 120_000, 40);
        assert!(
            m.put(huge.hash(), huge, "alice")
                .unwrap_err()
                .contains("at most")
        );
    }
}
