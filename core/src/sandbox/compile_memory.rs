//! What compiling a module takes of the host's memory: read off each
//! compile while it runs, and learned for the next one.
//!
//! A compile is not part of any job's linear memory, yet Cranelift's IR of
//! every function, built in parallel, is the largest thing a worker holds
//! (CPython's 95 MiB module peaks past 2 GB). The worker charges it to its
//! ledger beside the reservations, so it must know it: *before* the
//! compile, from what earlier compiles took ([`CompileMemory::estimate`]);
//! *during* it, from the compile child's resident memory, read every few
//! milliseconds ([`CompileMemory::live`]) so the charge follows a compile
//! that takes more than estimated.
//!
//! The estimate is `max(largest small compile, bytes per module byte ×
//! module bytes)`: below [`LARGE_MODULE`] a compile's memory is mostly the
//! compile process's own (its engines, its runtime), above it the module's
//! functions dominate and scale with its size. The ratio starts at
//! [`DEFAULT_BYTES_PER_BYTE`] until a large compile was measured; from then
//! on both only grow (the largest measured), so the charge errs on the safe
//! side.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::proto::ModuleHash;

/// Host memory per byte of module before any compile was measured:
/// CPython's 95 MiB peaked at 2.08 GB of RSS (~21×), rounded up.
pub const DEFAULT_BYTES_PER_BYTE: u64 = 24;

/// Modules from this size on teach the per-byte ratio; smaller ones teach
/// the floor (the compile process's own memory dominates theirs).
pub const LARGE_MODULE: u64 = 1 << 20;

/// Compiles running now (their resident memory, as last read) and what
/// finished ones took; see the module docs. One per module cache.
#[derive(Debug)]
pub struct CompileMemory {
    live: Mutex<HashMap<ModuleHash, Arc<AtomicU64>>>,
    /// Bytes per module byte, the most measured of modules of
    /// [`LARGE_MODULE`] or more (0 before any).
    per_byte: AtomicU64,
    /// The largest peak of a compile of a smaller module.
    floor: AtomicU64,
    /// Compiles measured.
    measured: AtomicU64,
}

impl Default for CompileMemory {
    fn default() -> Self {
        CompileMemory {
            live: Mutex::default(),
            per_byte: AtomicU64::new(0),
            floor: AtomicU64::new(0),
            measured: AtomicU64::new(0),
        }
    }
}

/// A compile's place in [`CompileMemory::live`], removed when dropped.
pub(crate) struct LiveCompile<'a> {
    memory: &'a CompileMemory,
    hash: ModuleHash,
    /// Its resident bytes, as last read.
    pub(crate) resident: Arc<AtomicU64>,
}

impl Drop for LiveCompile<'_> {
    fn drop(&mut self) {
        self.memory.live.lock().remove(&self.hash);
    }
}

impl CompileMemory {
    /// What compiling a module of `module_bytes` is expected to take.
    pub fn estimate(&self, module_bytes: u64) -> u64 {
        let per_byte = match self.per_byte.load(Ordering::Relaxed) {
            0 => DEFAULT_BYTES_PER_BYTE,
            measured => measured,
        };
        module_bytes
            .saturating_mul(per_byte)
            .max(self.floor.load(Ordering::Relaxed))
    }

    /// The resident memory of `hash`'s compile as last read, while one
    /// runs in a child process (`None`: none does, or it compiles in
    /// this process, where it cannot be told apart).
    pub fn live(&self, hash: &ModuleHash) -> Option<u64> {
        self.live
            .lock()
            .get(hash)
            .map(|r| r.load(Ordering::Relaxed))
            .filter(|&r| r > 0)
    }

    /// How many compiles were measured.
    pub fn measured(&self) -> u64 {
        self.measured.load(Ordering::Relaxed)
    }

    /// Marks `hash`'s compile as running, for its readings.
    pub(crate) fn start(&self, hash: &ModuleHash) -> LiveCompile<'_> {
        let resident = Arc::new(AtomicU64::new(0));
        self.live.lock().insert(*hash, resident.clone());
        LiveCompile {
            memory: self,
            hash: *hash,
            resident,
        }
    }

    /// Learns from a compile of `module_bytes` that peaked at `peak`.
    pub fn learn(&self, module_bytes: u64, peak: u64) {
        if peak == 0 {
            return;
        }
        self.measured.fetch_add(1, Ordering::Relaxed);
        if module_bytes >= LARGE_MODULE {
            self.per_byte
                .fetch_max(peak.div_ceil(module_bytes), Ordering::Relaxed);
        } else {
            self.floor.fetch_max(peak, Ordering::Relaxed);
        }
    }
}

/// The resident and peak resident memory of process `pid` (`VmRSS`,
/// `VmHWM` in `/proc/<pid>/status`), if it can be read.
pub(crate) fn resident_of(pid: i32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .map(|kib| kib * 1024)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn the_estimate_starts_at_the_default_and_learns_upwards() {
        let m = CompileMemory::default();
        assert_eq!(m.estimate(10 * MIB), 240 * MIB);
        // A small module teaches the floor, not the ratio.
        m.learn(64 << 10, 40 * MIB);
        assert_eq!(m.estimate(64 << 10), 40 * MIB);
        assert_eq!(m.estimate(10 * MIB), 240 * MIB);
        // The first large one replaces the default (10×, not 24×); a
        // heavier one raises it, a lighter one after does not lower it.
        m.learn(4 * MIB, 40 * MIB);
        assert_eq!(m.estimate(10 * MIB), 100 * MIB);
        m.learn(4 * MIB, 120 * MIB);
        assert_eq!(m.estimate(10 * MIB), 300 * MIB);
        m.learn(4 * MIB, 20 * MIB);
        assert_eq!(m.estimate(10 * MIB), 300 * MIB);
        assert_eq!(m.estimate(MIB), 40 * MIB, "never below the floor");
        assert_eq!(m.measured(), 4);
        m.learn(MIB, 0);
        assert_eq!(m.measured(), 4, "no reading: nothing learned");
    }

    #[test]
    fn a_running_compile_is_seen_until_it_ends() {
        let m = CompileMemory::default();
        let hash = ModuleHash::of(b"a module");
        assert_eq!(m.live(&hash), None);
        let live = m.start(&hash);
        assert_eq!(m.live(&hash), None, "nothing read yet");
        live.resident.store(70 * MIB, Ordering::Relaxed);
        assert_eq!(m.live(&hash), Some(70 * MIB));
        drop(live);
        assert_eq!(m.live(&hash), None);
    }

    #[test]
    fn this_process_resident_memory_reads() {
        let (rss, hwm) = resident_of(std::process::id() as i32).expect("/proc is there");
        assert!(rss > 0 && hwm >= rss, "{rss} {hwm}");
        assert_eq!(resident_of(i32::MAX), None);
    }
}
