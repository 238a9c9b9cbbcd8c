//! Which tenants have shown a module's bytes (uploaded it), so that with
//! `--tenants` a module hash is runnable only by them: a hash that leaks (a
//! log, a shared script) must not let another tenant run a private module
//! without having it.
//!
//! Durable: each first showing is also written to the state database
//! (`uploaders` table) and read back at start, so a tenant's detached jobs
//! and maps run again after a restart instead of being refused as "module
//! unknown". Bounded: the [`UPLOADERS_REMEMBERED`] most recently shown
//! modules are kept, in memory and on disk ([`Uploaders::expire`]); a
//! tenant whose module was forgotten uploads it again (a 404 asks it to).

use std::collections::HashSet;
use std::num::NonZeroUsize;
use std::sync::Arc;

use lru::LruCache;
use parking_lot::Mutex;
use rusqlite::params;

use super::statedb::{StateDb, now_ms};
use crate::proto::ModuleHash;

/// Modules whose uploaders a worker remembers.
pub const UPLOADERS_REMEMBERED: usize = 65_536;

/// Who showed which module; see the module docs.
pub struct Uploaders {
    shown: Mutex<LruCache<ModuleHash, HashSet<String>>>,
    db: Arc<StateDb>,
}

impl Uploaders {
    /// The uploaders kept in `db`, most recently shown last (so the LRU
    /// order is theirs). Blocking: read once, at start.
    pub fn load(db: Arc<StateDb>) -> anyhow::Result<Uploaders> {
        let rows: Vec<(String, String)> = db.read_blocking(|c| {
            let mut stmt = c.prepare(
                "SELECT module, tenant FROM uploaders WHERE module IN \
                 (SELECT module FROM uploaders GROUP BY module ORDER BY max(shown_ms) DESC LIMIT ?1) \
                 ORDER BY shown_ms",
            )?;
            let rows = stmt.query_map([UPLOADERS_REMEMBERED as i64], |r| Ok((r.get(0)?, r.get(1)?)))?;
            rows.collect()
        })?;
        let mut shown = LruCache::new(NonZeroUsize::new(UPLOADERS_REMEMBERED).expect("non-zero"));
        for (module, tenant) in rows {
            if let Some(hash) = ModuleHash::from_hex(&module) {
                shown.get_or_insert_mut(hash, HashSet::new).insert(tenant);
            }
        }
        Ok(Uploaders {
            shown: Mutex::new(shown),
            db,
        })
    }

    /// `tenant` showed it has `module`'s bytes. Returns whether it had not
    /// before (as far as this worker remembers).
    pub fn record(&self, module: ModuleHash, tenant: &str) -> bool {
        let first = self
            .shown
            .lock()
            .get_or_insert_mut(module, HashSet::new)
            .insert(tenant.to_string());
        // Every showing refreshes its time on disk too: what is forgotten
        // first there is what was shown longest ago, as in memory.
        let (module, tenant) = (module.to_hex(), tenant.to_string());
        self.db.write_later(move |c| {
            c.prepare_cached(
                "INSERT OR REPLACE INTO uploaders (module, tenant, shown_ms) VALUES (?1, ?2, ?3)",
            )?
            .execute(params![module, tenant, now_ms() as i64])
            .map(drop)
        });
        first
    }

    /// Whether `tenant` has shown it has `module`.
    pub fn has_shown(&self, module: &ModuleHash, tenant: &str) -> bool {
        self.shown
            .lock()
            .get(module)
            .is_some_and(|t| t.contains(tenant))
    }

    /// Forgets, on disk, the modules past the [`UPLOADERS_REMEMBERED`] most
    /// recently shown (memory forgets them as it goes).
    pub fn expire(&self) {
        self.db.write_later(|c| {
            c.execute(
                "DELETE FROM uploaders WHERE module NOT IN \
                 (SELECT module FROM uploaders GROUP BY module ORDER BY max(shown_ms) DESC LIMIT ?1)",
                [UPLOADERS_REMEMBERED as i64],
            )
            .map(drop)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn who_showed_a_module_outlives_the_worker() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (ModuleHash::of(b"a"), ModuleHash::of(b"b"));
        {
            let db = Arc::new(StateDb::open(dir.path()).unwrap());
            let up = Uploaders::load(db.clone()).unwrap();
            assert!(up.record(a, "alice"));
            assert!(
                !up.record(a, "alice"),
                "the second showing is not the first"
            );
            assert!(up.record(b, "bob"));
            db.sync().await.unwrap();
        }
        let up = Uploaders::load(Arc::new(StateDb::open(dir.path()).unwrap())).unwrap();
        assert!(up.has_shown(&a, "alice") && up.has_shown(&b, "bob"));
        assert!(!up.has_shown(&a, "bob") && !up.has_shown(&b, "alice"));
    }
}
