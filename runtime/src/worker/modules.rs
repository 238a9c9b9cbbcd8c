//! The module bytes a runner holds, for compiling on a cache miss, within a
//! byte budget.
//!
//! Why a budget: a worker accepts uploads from every client, and without a
//! bound a client (or many) could fill its memory with modules of up to
//! 64 MiB each. When the budget is exceeded the least recently used modules
//! are dropped; a job for a dropped module is answered "module unknown"
//! (404) and the client uploads it again — the path a restarted worker
//! already takes. A module larger than the whole budget is still kept (alone),
//! so that any module within the upload limit can run.

use std::sync::Arc;

use lru::LruCache;

use crate::proto::ModuleHash;

/// Module bytes by hash, least recently used first out.
pub struct ModuleBytes {
    budget: u64,
    held: u64,
    modules: LruCache<ModuleHash, Arc<[u8]>>,
}

impl ModuleBytes {
    /// An empty store that holds at most `budget` bytes.
    pub fn new(budget: u64) -> ModuleBytes {
        ModuleBytes { budget, held: 0, modules: LruCache::unbounded() }
    }

    /// Adds a module (a no-op if it is here), dropping the least recently
    /// used others while over budget.
    pub fn insert(&mut self, hash: ModuleHash, bytes: Arc<[u8]>) {
        if self.modules.get(&hash).is_some() {
            return;
        }
        self.held += bytes.len() as u64;
        self.modules.put(hash, bytes);
        while self.held > self.budget && self.modules.len() > 1 {
            if let Some((_, dropped)) = self.modules.pop_lru() {
                self.held -= dropped.len() as u64;
            }
        }
    }

    /// A module's bytes, marking it used.
    pub fn get(&mut self, hash: &ModuleHash) -> Option<Arc<[u8]>> {
        self.modules.get(hash).cloned()
    }

    /// Whether a module is here.
    pub fn contains(&self, hash: &ModuleHash) -> bool {
        self.modules.contains(hash)
    }

    /// Bytes held now.
    pub fn held(&self) -> u64 {
        self.held
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module(i: u8, len: usize) -> (ModuleHash, Arc<[u8]>) {
        let bytes: Arc<[u8]> = vec![i; len].into();
        (ModuleHash::of(&bytes), bytes)
    }

    #[test]
    fn the_least_recently_used_go_first_when_over_budget() {
        let mut store = ModuleBytes::new(3000);
        let m: Vec<_> = (0..5).map(|i| module(i, 1000)).collect();
        for (h, b) in &m[..3] {
            store.insert(*h, b.clone());
        }
        assert_eq!(store.held(), 3000);
        // Use the first, then add a fourth: the second (least recent) goes.
        assert!(store.get(&m[0].0).is_some());
        store.insert(m[3].0, m[3].1.clone());
        assert!(store.contains(&m[0].0) && !store.contains(&m[1].0));
        assert!(store.contains(&m[2].0) && store.contains(&m[3].0));
        assert_eq!(store.held(), 3000);
        // Adding one already held changes nothing.
        store.insert(m[3].0, m[3].1.clone());
        assert_eq!(store.held(), 3000);
    }

    #[test]
    fn a_module_larger_than_the_budget_is_kept_alone() {
        let mut store = ModuleBytes::new(3000);
        let (small, big) = (module(1, 1000), module(2, 5000));
        store.insert(small.0, small.1);
        store.insert(big.0, big.1);
        assert!(store.contains(&big.0) && !store.contains(&small.0));
        assert_eq!(store.held(), 5000);
    }
}
