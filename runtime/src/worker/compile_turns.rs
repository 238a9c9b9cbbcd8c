//! How many modules one tenant may have compiling at once on a worker
//! ([`compile_turns_per_tenant`]), and each tenant's turns
//! ([`CompileTurns`]): a tenant's burst of new modules waits its turn
//! (`compile_charge`) rather than taking the machine.

use std::sync::Arc;

/// Each tenant's compile turns: [`compile_turns_per_tenant`] each, made
/// when the tenant first compiles.
#[derive(Default)]
pub struct CompileTurns(
    parking_lot::Mutex<std::collections::HashMap<String, Arc<tokio::sync::Semaphore>>>,
);

impl CompileTurns {
    /// `tenant`'s turns.
    pub(super) fn of(&self, tenant: &str) -> Arc<tokio::sync::Semaphore> {
        self.0
            .lock()
            .entry(tenant.to_string())
            .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(compile_turns_per_tenant())))
            .clone()
    }
}

/// How many modules one tenant may have compiling at once here: half the
/// compiles the cache runs at once (one per core), at least one.
pub fn compile_turns_per_tenant() -> usize {
    (crate::sandbox::max_compiles() / 2).max(1)
}
