//! The module bytes a runner holds, for compiling on a cache miss, within a
//! byte budget (a module left in its file counts its length too).
//!
//! Why a budget: a worker accepts uploads from every client, and without a
//! bound a client (or many) could fill its memory with modules of up to
//! 64 MiB each. When the budget is exceeded the least recently used modules
//! are dropped; a job for a dropped module is answered "module unknown"
//! (404) and the client uploads it again — the path a restarted worker
//! already takes. A module larger than the whole budget is still kept (alone),
//! so that any module within the upload limit can run.
//!
//! A module that a queued or running job needs is *pinned*: no upload can
//! push it out before that job has started (and compiled it), so one
//! tenant's uploads cannot make another tenant's queued jobs fail. Pinned
//! bytes may take the store over its budget; the queue limits bound them.

use std::collections::HashMap;

use lru::LruCache;

use super::source::ModuleSource;
use crate::proto::ModuleHash;

/// Module bytes by hash, least recently used first out.
pub struct ModuleBytes {
    budget: u64,
    held: u64,
    modules: LruCache<ModuleHash, ModuleSource>,
    /// Jobs that need each module, for those that any job needs.
    pins: HashMap<ModuleHash, u32>,
}

impl ModuleBytes {
    /// An empty store that holds at most `budget` bytes.
    pub fn new(budget: u64) -> ModuleBytes {
        ModuleBytes {
            budget,
            held: 0,
            modules: LruCache::unbounded(),
            pins: HashMap::new(),
        }
    }

    /// Adds a module (a no-op if it is here), dropping the least recently
    /// used others while over budget. One left in its file counts its
    /// whole length: it is read when a job needs it.
    pub fn insert(&mut self, hash: ModuleHash, source: ModuleSource) {
        if self.modules.get(&hash).is_some() {
            return;
        }
        self.held += source.len();
        self.modules.put(hash, source);
        self.shrink(&hash);
    }

    /// Drops the least recently used unpinned modules, never `keep` and
    /// never the last one, while over budget.
    fn shrink(&mut self, keep: &ModuleHash) {
        while self.held > self.budget && self.modules.len() > 1 {
            let victim = self
                .modules
                .iter()
                .rev() // least recently used first
                .map(|(h, _)| *h)
                .find(|h| h != keep && !self.pins.contains_key(h));
            let Some(victim) = victim else { return };
            if let Some(dropped) = self.modules.pop(&victim) {
                self.held -= dropped.len();
            }
        }
    }

    /// Marks `hash` as needed by one more job: it stays until unpinned.
    pub fn pin(&mut self, hash: &ModuleHash) {
        *self.pins.entry(*hash).or_insert(0) += 1;
    }

    /// One job fewer needs `hash`.
    pub fn unpin(&mut self, hash: &ModuleHash) {
        if let Some(n) = self.pins.get_mut(hash) {
            *n -= 1;
            if *n == 0 {
                self.pins.remove(hash);
            }
        }
        self.shrink(hash);
    }

    /// A module's source, marking it used.
    pub fn get(&mut self, hash: &ModuleHash) -> Option<ModuleSource> {
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

    fn module(i: u8, len: usize) -> (ModuleHash, ModuleSource) {
        let bytes = vec![i; len];
        (ModuleHash::of(&bytes), bytes.into())
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
    fn a_pinned_module_outlives_uploads_until_unpinned() {
        let mut store = ModuleBytes::new(2000);
        let m: Vec<_> = (0..4).map(|i| module(i, 1000)).collect();
        store.insert(m[0].0, m[0].1.clone());
        store.pin(&m[0].0); // a queued job needs it
        for (h, b) in &m[1..] {
            store.insert(*h, b.clone());
        }
        assert!(store.contains(&m[0].0), "evicted while a job needed it");
        assert!(store.contains(&m[3].0) && !store.contains(&m[1].0));
        store.unpin(&m[0].0);
        store.insert(m[1].0, m[1].1.clone());
        assert!(
            !store.contains(&m[0].0),
            "unpinned, it is the least recently used"
        );
        assert_eq!(store.held(), 2000);
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
