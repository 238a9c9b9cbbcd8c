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
    /// What the cgroup whose limit binds this process has free now (its
    /// limit less its working set), if there is one: memory taken in it
    /// beside the jobs, by this worker's processes or others of the same
    /// batch job, is not the jobs'. Read as often as `available`.
    fn cgroup_free(&self) -> Option<u64> {
        None
    }
    /// Both, from one reading.
    fn now(&self) -> HostNow {
        HostNow {
            available: self.available(),
            cgroup_free: self.cgroup_free(),
        }
    }
    /// Reads again now if the last reading is older than `_older_than`;
    /// whether it did.
    fn refresh(&self, _older_than: Duration) -> bool {
        false
    }
}

/// What the host and the cgroup had free at one reading.
#[derive(Clone, Copy, Debug)]
pub struct HostNow {
    /// The host's available memory.
    pub available: u64,
    /// The binding cgroup's limit less its working set, if in one.
    pub cgroup_free: Option<u64>,
}

/// What the capacity was taken from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sizing {
    /// `--memory`, if given.
    pub requested: Option<u64>,
    /// The memory limit of the cgroup this process runs in, if any.
    pub cgroup: Option<u64>,
    /// What of the cgroup's limit the worker keeps for itself.
    pub overhead: u64,
    /// The machine's physical memory.
    pub physical: u64,
}

impl Sizing {
    /// What the machine has for jobs: the cgroup's limit less the worker's
    /// own overhead, or physical memory less `reserve`, whichever is less.
    pub(super) fn for_jobs(&self, reserve: u64) -> u64 {
        self.cgroup
            .map_or(u64::MAX, |c| c.saturating_sub(self.overhead))
            .min(self.physical.saturating_sub(reserve))
    }
}

/// The machine's memory, as the OS reports it (sysinfo) and the cgroups
/// limit it (our reader knows v1 and v2 and every ancestor's limit;
/// sysinfo's reads the process's own v2 cgroup: the smaller wins).
/// Available memory is re-read at most once per [`HOST_REFRESH`].
pub struct SystemMemory {
    physical: u64,
    cgroup: Option<u64>,
    /// The binding cgroup's limit and directory (our reader's), for its
    /// working set.
    domain: Option<(u64, std::path::PathBuf)>,
    now: Mutex<Reading>,
}

/// The last reading: when, the host's available memory, the cgroup's free.
struct Reading {
    system: System,
    at: Instant,
    available: u64,
    cgroup_free: Option<u64>,
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
        let domain = crate::worker::cgroup::binding_limit();
        let cgroup_free = domain.as_ref().and_then(free_in);
        Ok(SystemMemory {
            physical,
            cgroup,
            domain,
            now: Mutex::new(Reading {
                system,
                at: Instant::now(),
                available,
                cgroup_free,
            }),
        })
    }

    /// The reading, re-read if older than `older_than`, and whether it was.
    fn read<T>(&self, older_than: Duration, f: impl FnOnce(&Reading) -> T) -> (T, bool) {
        let mut now = self.now.lock();
        let stale = now.at.elapsed() >= older_than;
        if stale {
            now.system.refresh_memory();
            now.available = now.system.available_memory();
            now.cgroup_free = self.domain.as_ref().and_then(free_in);
            now.at = Instant::now();
        }
        (f(&now), stale)
    }
}

/// A cgroup's limit less its working set.
fn free_in((limit, dir): &(u64, std::path::PathBuf)) -> Option<u64> {
    crate::worker::cgroup::working_set(dir).map(|used| limit.saturating_sub(used))
}

impl HostMemory for SystemMemory {
    fn physical(&self) -> u64 {
        self.physical
    }

    fn cgroup_limit(&self) -> Option<u64> {
        self.cgroup
    }

    fn available(&self) -> u64 {
        self.read(HOST_REFRESH, |r| r.available).0
    }

    fn cgroup_free(&self) -> Option<u64> {
        self.read(HOST_REFRESH, |r| r.cgroup_free).0
    }

    fn now(&self) -> HostNow {
        self.read(HOST_REFRESH, |r| HostNow {
            available: r.available,
            cgroup_free: r.cgroup_free,
        })
        .0
    }

    fn refresh(&self, older_than: Duration) -> bool {
        self.read(older_than, |_| ()).1
    }
}

/// A host whose memory a test sets.
#[cfg(test)]
pub(crate) struct FakeMemory {
    pub physical: u64,
    pub available: AtomicU64,
    pub cgroup: Option<u64>,
    /// The cgroup's free memory now (`u64::MAX`: not read).
    pub cgroup_free: AtomicU64,
    /// What a fresh reading of it would find (`u64::MAX`: no fresher one).
    pub cgroup_free_fresh: AtomicU64,
}

#[cfg(test)]
impl FakeMemory {
    /// A host of `physical` bytes with `available` of them free.
    pub fn new(physical: u64, available: u64) -> Arc<FakeMemory> {
        Arc::new(FakeMemory {
            physical,
            available: AtomicU64::new(available),
            cgroup: None,
            cgroup_free: AtomicU64::new(u64::MAX),
            cgroup_free_fresh: AtomicU64::new(u64::MAX),
        })
    }

    /// The same host, the worker in a cgroup limited to `limit`.
    pub fn in_cgroup(physical: u64, available: u64, limit: u64) -> Arc<FakeMemory> {
        Arc::new(FakeMemory {
            physical,
            available: AtomicU64::new(available),
            cgroup: Some(limit),
            cgroup_free: AtomicU64::new(u64::MAX),
            cgroup_free_fresh: AtomicU64::new(u64::MAX),
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

    fn cgroup_free(&self) -> Option<u64> {
        Some(self.cgroup_free.load(Ordering::Relaxed)).filter(|&f| f != u64::MAX)
    }

    fn refresh(&self, _older_than: Duration) -> bool {
        let fresh = self.cgroup_free_fresh.swap(u64::MAX, Ordering::Relaxed);
        if fresh != u64::MAX {
            self.cgroup_free.store(fresh, Ordering::Relaxed);
        }
        fresh != u64::MAX
    }
}
