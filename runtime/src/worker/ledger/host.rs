//! What the host has: its physical memory, the limit of the cgroup the
//! worker runs in, and what is available now — read from the machine
//! ([`SystemMemory`]), or set by a test (`FakeMemory`), so that the
//! ledger's and admission's rules do not depend on the machine they run on.

#[cfg(test)]
use std::sync::Arc;
#[cfg(test)]
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use sysinfo::System;

/// How often the host's available memory is re-read.
pub const HOST_REFRESH: Duration = Duration::from_secs(1);

/// Where the ledger reads the host's memory: the machine itself
/// ([`SystemMemory`]), or a fake in tests, so that the ledger's and
/// admission's rules do not depend on the machine they run on.
pub trait HostMemory: Send + Sync {
    /// The machine's physical memory, in bytes.
    fn physical(&self) -> u64;
    /// The memory limit of the cgroup this process runs in (a Slurm job's
    /// allocation), if any.
    fn cgroup_limit(&self) -> Option<u64>;
    /// Memory the host has available now, in bytes. Called on every
    /// reservation: an implementation that reads the OS caches.
    fn available(&self) -> u64;
}

/// The machine's memory, as the OS reports it (sysinfo) and the cgroups
/// limit it (our reader knows v1 and v2 and every ancestor's limit;
/// sysinfo's reads the process's own v2 cgroup: the smaller wins).
/// Available memory is re-read at most once per [`HOST_REFRESH`].
pub struct SystemMemory {
    physical: u64,
    cgroup: Option<u64>,
    now: Mutex<(System, Instant, u64)>,
}

impl SystemMemory {
    /// Reads the machine's memory once.
    pub fn new() -> anyhow::Result<SystemMemory> {
        let mut system =
            System::new().map_err(|e| anyhow::anyhow!("cannot read the host's memory: {e:?}"))?;
        system.refresh_memory();
        let cgroup = [
            crate::worker::cgroup::memory_limit(),
            system
                .cgroup_limits()
                .map(|c| c.total_memory)
                .filter(|&t| t > 0),
        ]
        .into_iter()
        .flatten()
        .min();
        let (physical, available) = (system.total_memory(), system.available_memory());
        Ok(SystemMemory {
            physical,
            cgroup,
            now: Mutex::new((system, Instant::now(), available)),
        })
    }
}

impl HostMemory for SystemMemory {
    fn physical(&self) -> u64 {
        self.physical
    }

    fn cgroup_limit(&self) -> Option<u64> {
        self.cgroup
    }

    fn available(&self) -> u64 {
        let mut now = self.now.lock();
        let (system, read_at, available) = &mut *now;
        if read_at.elapsed() >= HOST_REFRESH {
            system.refresh_memory();
            *available = system.available_memory();
            *read_at = Instant::now();
        }
        *available
    }
}

/// A host whose memory a test sets.
#[cfg(test)]
pub(crate) struct FakeMemory {
    pub physical: u64,
    pub available: AtomicU64,
    pub cgroup: Option<u64>,
}

#[cfg(test)]
impl FakeMemory {
    /// A host of `physical` bytes with `available` of them free.
    pub fn new(physical: u64, available: u64) -> Arc<FakeMemory> {
        Arc::new(FakeMemory {
            physical,
            available: AtomicU64::new(available),
            cgroup: None,
        })
    }

    /// The same host, the worker in a cgroup limited to `limit`.
    pub fn in_cgroup(physical: u64, available: u64, limit: u64) -> Arc<FakeMemory> {
        Arc::new(FakeMemory {
            physical,
            available: AtomicU64::new(available),
            cgroup: Some(limit),
        })
    }
}

#[cfg(test)]
impl HostMemory for Arc<FakeMemory> {
    fn physical(&self) -> u64 {
        self.physical
    }

    fn cgroup_limit(&self) -> Option<u64> {
        self.cgroup
    }

    fn available(&self) -> u64 {
        self.available.load(Ordering::Relaxed)
    }
}
