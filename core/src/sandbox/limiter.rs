//! The per-job `ResourceLimiter`: enforces the job's linear-memory limit
//! exactly, summed over all of its memories, and records the peak and any
//! refusal so the outcome is classified from this record, not guessed from a
//! trap's text.
//!
//! Why a store-wide sum: wasmtime's `StoreLimits::memory_size` limits each
//! memory on its own, so a module with two memories could use twice its
//! budget (Spin learned this the hard way).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use wasmtime::ResourceLimiter;

use crate::proto::StdStream;

/// Largest number of elements one table may grow to. Rust guests use a few
/// hundred; a table-growth bomb is refused long before it costs the host much.
pub const MAX_TABLE_ELEMENTS: usize = 1 << 20;

/// A limit a job ran into. Returned as the error that ends the job, so it can
/// be recognised by `downcast_ref` when the outcome is classified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LimitExceeded {
    /// A memory grow (or a new memory) would have taken the job past its limit.
    Memory { limit: u64, requested: u64 },
    /// A table would have grown past [`MAX_TABLE_ELEMENTS`].
    Table { limit: u64, requested: u64 },
    /// The job wrote more than its cap to an output stream.
    Output { stream: StdStream, limit: u64 },
}

impl fmt::Display for LimitExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LimitExceeded::Memory { limit, requested } => {
                write!(
                    f,
                    "memory limit of {limit} bytes exceeded (asked for {requested})"
                )
            }
            LimitExceeded::Table { limit, requested } => {
                write!(
                    f,
                    "table limit of {limit} elements exceeded (asked for {requested})"
                )
            }
            LimitExceeded::Output { stream, limit } => {
                write!(f, "{stream} limit of {limit} bytes exceeded")
            }
        }
    }
}

impl std::error::Error for LimitExceeded {}

/// Lends a running job memory past its reserve: a worker's ledger
/// (`JobSpec::memory_reserve`).
pub trait MemoryLender: Send + Sync {
    /// Adds `bytes` to the job's reservation if the worker has them
    /// promised to no one now; `false` if it has not.
    fn lend(&self, bytes: u64) -> bool;
}

/// Tracks one job's linear memory. Wasm memories never shrink (a failed grow is
/// rolled back), so the total only rises and the peak *is* the current total.
pub struct MemoryLimiter {
    limit: u64,
    /// What the job may grow to without asking: its reserve and what it
    /// was lent since (at most `limit`).
    granted: u64,
    /// Asked for memory past `granted`; none: `granted` is the bound.
    lender: Option<Arc<dyn MemoryLender>>,
    /// The bound the job was refused at: `limit`, or `granted` when the
    /// lender had nothing for it.
    refused_at: u64,
    total: u64,
    /// The growth the limiter last allowed, rolled back if the grow then fails.
    pending: u64,
    /// The total the job asked for when it was refused, if it was.
    refused: Option<u64>,
    /// Where the current total is published for others (the host ledger).
    meter: Option<Arc<AtomicU64>>,
    /// Instances the store may hold: 1 for a core module, a component's
    /// inner core instances for a component.
    instances: usize,
}

impl MemoryLimiter {
    /// A limiter for a job that may hold `limit` bytes of linear memory.
    pub fn new(limit: u64) -> MemoryLimiter {
        MemoryLimiter {
            limit,
            granted: limit,
            lender: None,
            refused_at: limit,
            total: 0,
            pending: 0,
            refused: None,
            meter: None,
            instances: 1,
        }
    }

    /// Lets the store hold `n` instances (a component's core instances)
    /// rather than one.
    pub fn allowing_instances(mut self, n: usize) -> MemoryLimiter {
        self.instances = n;
        self
    }

    /// A job's limiter: `limits.memory`, under `reserve` if any (see
    /// [`with_reserve`](Self::with_reserve)).
    pub fn of(
        limits: &crate::proto::JobLimits,
        reserve: Option<u64>,
        lender: Option<Arc<dyn MemoryLender>>,
    ) -> MemoryLimiter {
        MemoryLimiter::new(limits.memory.bytes()).with_reserve(reserve, lender)
    }

    /// Runs the job under `reserve` (at most its limit): past it, each grow
    /// asks `lender`, and without one, or when it has nothing to lend, is
    /// refused as a grow past the limit is. `None`: the whole limit is the
    /// job's.
    pub fn with_reserve(
        mut self,
        reserve: Option<u64>,
        lender: Option<Arc<dyn MemoryLender>>,
    ) -> MemoryLimiter {
        if let Some(reserve) = reserve {
            self.granted = reserve.min(self.limit);
            self.lender = lender;
        }
        self
    }

    /// Also publishes the job's current total into `meter` as it changes.
    pub fn with_meter(mut self, meter: Option<Arc<AtomicU64>>) -> MemoryLimiter {
        self.meter = meter;
        self
    }

    fn publish(&self) {
        if let Some(m) = &self.meter {
            m.store(self.total, Ordering::Relaxed);
        }
    }

    /// The largest total the job held, in bytes.
    pub fn peak(&self) -> u64 {
        self.total
    }

    /// The limit, in bytes.
    #[cfg(test)]
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The bound a refused grow met: the limit, or below it what the job
    /// held when the worker had nothing more to lend it.
    pub fn refused_at(&self) -> u64 {
        self.refused_at
    }

    /// What the job holds the right to now: its reserve and what it was
    /// lent (its limit when it runs under none).
    #[cfg(test)]
    pub fn granted(&self) -> u64 {
        self.granted
    }

    /// The total the job asked for when a grow was refused, if one was.
    pub fn refused(&self) -> Option<u64> {
        self.refused
    }
}

impl MemoryLimiter {
    fn refuse(&mut self, bound: u64, requested: u64) -> wasmtime::Error {
        self.refused = Some(requested);
        self.refused_at = bound;
        LimitExceeded::Memory {
            limit: bound,
            requested,
        }
        .into()
    }
}

impl fmt::Debug for MemoryLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryLimiter")
            .field("limit", &self.limit)
            .field("granted", &self.granted)
            .field("lends", &self.lender.is_some())
            .field("total", &self.total)
            .field("refused", &self.refused)
            .finish()
    }
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let delta = desired.saturating_sub(current) as u64;
        let requested = self.total.saturating_add(delta);
        if requested > self.limit {
            return Err(self.refuse(self.limit, requested));
        }
        if requested > self.granted {
            let more = requested - self.granted;
            if !self.lender.as_ref().is_some_and(|l| l.lend(more)) {
                return Err(self.refuse(self.granted, requested));
            }
            self.granted = requested;
        }
        self.total = requested;
        self.pending = delta;
        self.publish();
        Ok(true)
    }

    fn memory_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        // We allowed it but the host could not give it (the pooling
        // allocator's ceiling, or mmap failing): roll back, and record the
        // refusal, since the job did not get the memory it needed.
        let requested = self.total;
        self.total -= self.pending;
        self.pending = 0;
        self.refused.get_or_insert(requested);
        self.publish();
        Ok(())
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > MAX_TABLE_ELEMENTS {
            return Err(LimitExceeded::Table {
                limit: MAX_TABLE_ELEMENTS as u64,
                requested: desired as u64,
            }
            .into());
        }
        Ok(true)
    }

    fn instances(&self) -> usize {
        self.instances
    }

    fn tables(&self) -> usize {
        16
    }

    fn memories(&self) -> usize {
        16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_memories_and_refuses_past_the_limit() {
        let mut l = MemoryLimiter::new(10 * 65536);
        assert!(l.memory_growing(0, 4 * 65536, None).unwrap());
        assert!(l.memory_growing(0, 4 * 65536, None).unwrap()); // a second memory
        assert_eq!(l.peak(), 8 * 65536);
        let err = l.memory_growing(4 * 65536, 7 * 65536, None).unwrap_err();
        assert_eq!(
            err.downcast_ref::<LimitExceeded>(),
            Some(&LimitExceeded::Memory {
                limit: 10 * 65536,
                requested: 11 * 65536
            })
        );
        assert_eq!(l.refused(), Some(11 * 65536));
        assert_eq!(l.peak(), 8 * 65536);
    }

    /// Lends up to a budget, counting what it lent.
    struct Budget(parking_lot::Mutex<u64>);

    impl MemoryLender for Budget {
        fn lend(&self, bytes: u64) -> bool {
            let mut left = self.0.lock();
            let ok = bytes <= *left;
            if ok {
                *left -= bytes;
            }
            ok
        }
    }

    #[test]
    fn past_its_reserve_a_job_grows_on_what_is_lent_and_never_past_its_limit() {
        const P: u64 = 65536;
        let lender = Arc::new(Budget(parking_lot::Mutex::new(3 * P)));
        let mut l = MemoryLimiter::new(10 * P).with_reserve(Some(4 * P), Some(lender.clone()));
        assert!(l.memory_growing(0, 4 * (P as usize), None).unwrap());
        assert_eq!(*lender.0.lock(), 3 * P, "within the reserve: nothing asked");
        assert!(
            l.memory_growing(4 * P as usize, 6 * P as usize, None)
                .unwrap()
        );
        assert_eq!(
            (l.granted(), *lender.0.lock()),
            (6 * P, P),
            "two pages lent"
        );
        // Two more are not there to lend: refused below the limit, at what it held.
        let err = l
            .memory_growing(6 * P as usize, 8 * P as usize, None)
            .unwrap_err();
        assert_eq!(
            err.downcast_ref::<LimitExceeded>(),
            Some(&LimitExceeded::Memory {
                limit: 6 * P,
                requested: 8 * P
            })
        );
        assert_eq!(
            (l.refused(), l.refused_at(), l.peak()),
            (Some(8 * P), 6 * P, 6 * P)
        );
        // One is: lent. And the limit holds whatever could be lent.
        assert!(
            l.memory_growing(6 * P as usize, 7 * P as usize, None)
                .unwrap()
        );
        let mut l = MemoryLimiter::new(10 * P).with_reserve(
            Some(4 * P),
            Some(Arc::new(Budget(parking_lot::Mutex::new(100 * P)))),
        );
        let err = l.memory_growing(0, 11 * P as usize, None).unwrap_err();
        assert_eq!(l.refused_at(), 10 * P);
        assert!(err.to_string().contains(&format!("limit of {}", 10 * P)));
    }

    #[test]
    fn without_a_lender_the_reserve_is_the_bound() {
        const P: u64 = 65536;
        let mut l = MemoryLimiter::new(10 * P).with_reserve(Some(4 * P), None);
        assert!(l.memory_growing(0, 4 * P as usize, None).unwrap());
        assert!(
            l.memory_growing(4 * P as usize, 5 * P as usize, None)
                .is_err()
        );
        assert_eq!((l.refused_at(), l.limit()), (4 * P, 10 * P));
        // A reserve over the limit is the limit.
        let l = MemoryLimiter::new(10 * P).with_reserve(Some(20 * P), None);
        assert_eq!(l.granted(), 10 * P);
    }

    #[test]
    fn a_failed_grow_is_rolled_back() {
        let mut l = MemoryLimiter::new(100 * 65536);
        assert!(l.memory_growing(0, 65536, None).unwrap());
        assert!(l.memory_growing(65536, 3 * 65536, None).unwrap());
        l.memory_grow_failed(wasmtime::format_err!("no room"))
            .unwrap();
        assert!(l.memory_growing(65536, 2 * 65536, None).unwrap());
        assert_eq!(l.peak(), 2 * 65536);
        assert_eq!(l.refused(), Some(3 * 65536));
    }
}
