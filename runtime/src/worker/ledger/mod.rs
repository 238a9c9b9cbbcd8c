//! The host memory ledger: smartmem, made exact.
//!
//! FieldTrip's smartmem divided free memory among idle workers and assumed a
//! busy one had already allocated its memory; when it had not, a second job
//! over-committed the host. Here every running job holds a *reservation*
//! (its memory limit) and publishes what it actually holds (its linear
//! memory, exact), and a new job is offered
//!
//! ```text
//! min(capacity − Σ reservations,
//!     host available now − Σ (reservation − in use) − reserve,
//!     cgroup free now − Σ (reservation − in use))      (in a cgroup)
//! ```
//!
//! so memory the host's interactive users take shrinks the offer, and
//! memory a running job has not touched yet is still counted as taken.
//! Σ reservations never exceeds capacity. In a cgroup (a Slurm job's
//! `--mem`), capacity is its limit less `--overhead`, what the worker's
//! own processes take in it; the cgroup's free memory (its limit less its
//! working set, read with the host's) shrinks the offer further when they,
//! or another program of the same batch job, take more.
//!
//! Bytes the worker holds *for* jobs outside their linear memory — the
//! output they buffer, and detached results waiting to be fetched — are
//! [`Hold`]s: they come out of capacity beside the reservations, so a
//! tenant that parks gigabytes of output shrinks what the worker offers
//! instead of pushing the host past it. A hold grows as the output does
//! and is given back when the bytes are sent or discarded.
//!
//! Other workers on the same machine are in view too, through the host's
//! shared ledger (`hostledger.rs`): their untouched reservations come out
//! of what the host has available, and all workers of one memory domain
//! (a cgroup, or the host) together take no more than its limit. What the
//! host has is read in `host.rs`.

mod fresh;
mod hold;
mod host;
mod lend;

use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

pub use super::hostledger::Others;
pub use hold::{Hold, HoldKind, Shares};
#[cfg(test)]
pub(crate) use host::FakeMemory;
use host::HostNow;
pub use host::{HostMemory, Sizing, SystemMemory};

/// Memory always left to the host and its users by default (`--reserve`).
pub const DEFAULT_RESERVE: u64 = 1 << 30;

/// What a worker keeps of a cgroup's limit for itself by default
/// (`--overhead`): a base, and as much again for each slot (a slot
/// process's own runtime beside its job). Measured in a Slurm job's cgroup
/// (cgroup v1, release build): an idle worker is charged 4–7 MiB, one
/// running two jobs in slot processes 12 MiB beyond the jobs' memory.
pub const OVERHEAD_BASE: u64 = 32 << 20;
/// See [`OVERHEAD_BASE`].
pub const OVERHEAD_PER_SLOT: u64 = 4 << 20;

/// The default `--overhead` of a worker of `slots` slots.
pub fn default_overhead(slots: usize) -> u64 {
    OVERHEAD_BASE.saturating_add(OVERHEAD_PER_SLOT.saturating_mul(slots as u64))
}

/// How the ledger is sized. Defaults in `Default`.
#[derive(Clone, Debug)]
pub struct LedgerConfig {
    /// The most jobs may hold (`--memory`); `None`: no limit of our own.
    pub memory: Option<u64>,
    /// Memory always left to the host (`--reserve`). Default:
    /// [`DEFAULT_RESERVE`](crate::worker::DEFAULT_RESERVE).
    pub reserve: u64,
    /// Host memory each running job may take outside its linear memory
    /// (its native stack, its instance), reserved beside its limit.
    /// Default: [`JOB_NATIVE_BYTES`](crate::sandbox::JOB_NATIVE_BYTES).
    pub per_job: u64,
    /// Memory kept out of a cgroup's limit (a Slurm job's `--mem`) for the
    /// worker itself — its process and its slot processes, which the
    /// cgroup charges beside the jobs — so that a job the worker takes
    /// never pushes the cgroup past its limit, where the kernel kills the
    /// largest process in it: the worker (`--overhead`). Not taken from
    /// physical memory (`reserve` leaves the host room). Default:
    /// `default_overhead(1)`, 36 MiB.
    pub overhead: u64,
}

impl Default for LedgerConfig {
    fn default() -> Self {
        LedgerConfig {
            memory: None,
            reserve: DEFAULT_RESERVE,
            per_job: crate::sandbox::JOB_NATIVE_BYTES,
            overhead: default_overhead(1),
        }
    }
}

/// A snapshot of the ledger, for adverts and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LedgerSnapshot {
    pub capacity: u64,
    pub reserved: u64,
    /// Bytes held outside reservations ([`Hold`]s): for jobs' output and
    /// results, requests being read, compiles.
    pub held: u64,
    /// Of `held`, the bytes of each [`HoldKind`] (indexed by it).
    pub held_by: [u64; HoldKind::ALL.len()],
    pub reserved_high_water: u64,
    pub used: u64,
    pub host_available: u64,
    pub offer: u64,
}

impl LedgerSnapshot {
    /// The bytes held of `kind`.
    pub fn held_of(&self, kind: HoldKind) -> u64 {
        self.held_by[kind.index()]
    }
}

/// The ledger; see the module docs.
pub struct Ledger {
    capacity: u64,
    /// `--memory`: what jobs' limits (and holds) may add up to.
    lend: Option<u64>,
    /// What the machine has for jobs (the cgroup's limit less the worker's
    /// overhead, physical memory less `--reserve`): their limits, the
    /// native memory beside each, and holds must fit in it.
    machine: u64,
    /// Reserved beside each job's limit (`LedgerConfig::per_job`).
    per_job: u64,
    sizing: Sizing,
    reserve: u64,
    state: Mutex<State>,
    host: Box<dyn HostMemory>,
    /// The host's ledger shared with the other workers of the machine, once
    /// joined ([`Ledger::join_host`]).
    shared: std::sync::OnceLock<Shared>,
    /// Woken whenever memory is given back (a reservation ends, a hold
    /// shrinks), so that jobs waiting for it start at once rather than at
    /// admission's next periodic re-check.
    freed: tokio::sync::Notify,
    /// What admission holds back from loans for jobs waiting for memory
    /// (`Admission::pick`).
    held_back: Mutex<HeldBack>,
}

/// This worker's part in the host's ledger (`hostledger.rs`).
struct Shared {
    host: super::hostledger::HostLedger,
    /// This worker's address, in its record.
    addr: String,
    /// The most every worker of the domain may take together: the
    /// cgroup's limit, or physical memory less `--reserve`.
    domain_limit: u64,
    /// The others as last read, for offers made without reading the file
    /// (adverts, metrics); a reservation always reads it afresh.
    last: Mutex<Others>,
}

struct State {
    /// Σ reservations, each job's limit and its native memory.
    reserved: u64,
    /// Σ the jobs' limits alone.
    limits: u64,
    /// Σ holds.
    held: u64,
    /// Σ holds of each [`HoldKind`] (indexed by it).
    held_by: [u64; HoldKind::ALL.len()],
    high_water: u64,
    /// Each running job's reservation.
    jobs: Vec<Reserved>,
    next_id: u64,
}

/// What admission holds back from loans (`lend.rs`), set at each dispatch.
#[derive(Clone, Debug, Default)]
pub struct HeldBack {
    /// Each tenant's first job waiting for memory (a held, overdue one
    /// among them): what it asks, lent to no other tenant. Its own
    /// tenant's running jobs may still borrow it: refusing a loan ends a
    /// running job and loses its work, while lending delays the waiting
    /// job by that job's remaining time at most (and a hold lets no new
    /// job start meanwhile, so the memory still gathers).
    pub waiting: Vec<(String, u64)>,
}

impl HeldBack {
    /// What a loan to a job of `tenant` must leave.
    pub(super) fn from(&self, tenant: &str) -> u64 {
        self.waiting
            .iter()
            .filter(|(t, _)| t != tenant)
            .map(|(_, asked)| *asked)
            .max()
            .unwrap_or(0)
    }
}

/// One running job's entry: what it holds, grown by what it is lent.
struct Reserved {
    id: u64,
    /// Its limit's part: what it reserved and was lent since.
    limit: u64,
    /// `limit` and its native memory: what `State::reserved` counts.
    total: u64,
    /// Its actual linear memory, kept by the sandbox.
    used: Arc<AtomicU64>,
}

impl hold::Account for Ledger {
    fn take(&self, kind: HoldKind, bytes: u64, force: bool) -> bool {
        let mut st = self.lock();
        if !force && bytes > self.room(&st, 0) {
            return false;
        }
        st.held += bytes;
        st.held_by[kind.index()] += bytes;
        true
    }

    fn give_back(&self, kind: HoldKind, bytes: u64) {
        {
            let mut st = self.lock();
            st.held -= bytes;
            st.held_by[kind.index()] -= bytes;
        }
        self.gave_back();
    }
}

/// Memory held for one job — its limit (or its reserve, when it runs
/// under one), what it may take beside (`LedgerConfig::per_job`), and
/// what it was lent past its reserve ([`Reservation::lender`]); given
/// back when dropped.
pub struct Reservation {
    ledger: Arc<Ledger>,
    id: u64,
    bytes: u64,
    meter: Arc<AtomicU64>,
}

impl Reservation {
    /// The job's memory meter: the sandbox keeps it at the job's current
    /// linear memory.
    pub fn meter(&self) -> Arc<AtomicU64> {
        self.meter.clone()
    }

    /// The job's memory as reserved when it was admitted (without its
    /// native memory, nor what it was lent since).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        {
            let mut st = self.ledger.lock();
            if let Some(i) = st.jobs.iter().position(|j| j.id == self.id) {
                let job = st.jobs.swap_remove(i);
                st.reserved -= job.total;
                st.limits -= job.limit;
            }
        }
        // The other workers of the host see the memory free at once.
        self.ledger.publish();
        self.ledger.gave_back();
    }
}

impl Ledger {
    /// A ledger sized from `config`, the cgroup this process runs in (a
    /// Slurm job's, say) and the machine's physical memory.
    pub fn new(config: &LedgerConfig) -> anyhow::Result<Arc<Ledger>> {
        Ok(Ledger::with_host(config, Box::new(SystemMemory::new()?)))
    }

    /// A ledger over `host`'s memory (a fake one in tests).
    pub fn with_host(config: &LedgerConfig, host: Box<dyn HostMemory>) -> Arc<Ledger> {
        let sizing = Sizing {
            requested: config.memory,
            cgroup: host.cgroup_limit(),
            overhead: config.overhead,
            physical: host.physical(),
        };
        let machine = sizing.for_jobs(config.reserve);
        let capacity = config.memory.unwrap_or(u64::MAX).min(machine);
        Arc::new(Ledger {
            capacity,
            lend: config.memory,
            machine,
            per_job: config.per_job,
            sizing,
            reserve: config.reserve,
            state: Mutex::new(State {
                reserved: 0,
                limits: 0,
                held: 0,
                held_by: [0; HoldKind::ALL.len()],
                high_water: 0,
                jobs: Vec::new(),
                next_id: 0,
            }),
            host,
            shared: std::sync::OnceLock::new(),
            freed: tokio::sync::Notify::new(),
            held_back: Mutex::new(HeldBack::default()),
        })
    }

    /// Joins the host's ledger, shared with the other workers of this
    /// machine (see `hostledger.rs`): from now on a reservation is decided
    /// with theirs in view. `addr` names this worker in its record.
    pub fn join_host(&self, host: super::hostledger::HostLedger, addr: &str) {
        let domain_limit = self.sizing.for_jobs(self.reserve);
        let shared = Shared {
            host,
            addr: addr.to_string(),
            domain_limit,
            last: Mutex::new(Others::default()),
        };
        if self.shared.set(shared).is_ok() {
            self.publish();
        }
    }

    /// Resolves once memory has been given back since the last call (or
    /// is given back from now on): admission waits on it beside its
    /// periodic re-check.
    pub async fn freed(&self) {
        self.freed.notified().await
    }

    fn gave_back(&self) {
        // One stored permit at most: a burst of frees wakes the waiter once.
        self.freed.notify_one();
    }

    /// The other workers of the host, as last read (none without a host
    /// ledger).
    pub fn others(&self) -> Others {
        self.shared
            .get()
            .map(|s| *s.last.lock())
            .unwrap_or_default()
    }

    /// Writes this worker's figures to the host's ledger and reads the
    /// others'. Called after each reservation ends and periodically (its
    /// jobs touch their memory as they run).
    pub fn publish(&self) {
        let Some(shared) = self.shared.get() else {
            return;
        };
        let done = shared.host.transact(&shared.addr, |others| {
            *shared.last.lock() = others;
            ((), Some(self.published(&self.lock())))
        });
        if let Err(e) = done {
            tracing::warn!(path = %shared.host.path().display(), "cannot update the host's ledger: {e}");
        }
    }

    /// What this worker's record says: taken (reserved and held) and
    /// untouched.
    fn published(&self, st: &State) -> (u64, u64) {
        (st.reserved + st.held, Self::untouched(st))
    }

    fn untouched(st: &State) -> u64 {
        st.jobs
            .iter()
            .map(|j| j.total.saturating_sub(j.used.load(Ordering::Relaxed)))
            .sum()
    }

    /// The most jobs may ever hold here, their native memory included.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The largest job this worker can take: `--memory`, or what the
    /// machine has for jobs less one job's native memory if less — less
    /// the kept results it holds ([`HoldKind::Result`]), which no job's end
    /// gives back.
    pub fn largest_job(&self) -> u64 {
        self.largest_job_locked(&self.lock())
    }

    /// [`largest_job`](Self::largest_job), its state already locked.
    fn largest_job_locked(&self, st: &State) -> u64 {
        self.lend
            .unwrap_or(u64::MAX)
            .min(self.machine.saturating_sub(self.per_job))
            .saturating_sub(st.held_by[HoldKind::Result.index()])
    }

    /// Room now for `native` bytes beside a limit of the result, among
    /// reservations and holds: `--memory` bounds the limits (and holds),
    /// the machine bounds them with their native memory.
    fn room(&self, st: &State, native: u64) -> u64 {
        let by_lend = self.lend.map_or(u64::MAX, |m| {
            m.saturating_sub(st.limits).saturating_sub(st.held)
        });
        let by_machine = self
            .machine
            .saturating_sub(st.reserved)
            .saturating_sub(st.held)
            .saturating_sub(native);
        by_lend.min(by_machine)
    }

    /// What each running job is reserved beside its limit.
    pub fn per_job(&self) -> u64 {
        self.per_job
    }

    /// What the capacity was taken from.
    pub fn sizing(&self) -> Sizing {
        self.sizing
    }

    /// The memory always left to the host.
    pub fn reserve(&self) -> u64 {
        self.reserve
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, State> {
        self.state.lock()
    }

    /// What the host (and the cgroup) have free now, read before any lock
    /// is taken (re-read at most once per [`HOST_REFRESH`]).
    fn host_now(&self) -> HostNow {
        self.host.now()
    }

    /// The offer, with `others` (the host's other workers) in view:
    /// their untouched reservations come out of what the host has
    /// available, and what all workers of this domain take stays within
    /// its limit.
    fn offer_locked(&self, st: &State, host: HostNow, others: Others) -> u64 {
        self.room_beside(st, host, others, self.per_job)
    }

    /// Linear memory that fits now beside `native` bytes of native memory
    /// (a new job's; none for a loan to a running one).
    fn room_beside(&self, st: &State, host: HostNow, others: Others, native: u64) -> u64 {
        let untouched = Self::untouched(st).saturating_add(others.untouched);
        let by_capacity = self.room(st, native);
        let by_host = host
            .available
            .saturating_sub(untouched)
            .saturating_sub(self.reserve)
            .saturating_sub(native);
        let by_domain = match self.shared.get() {
            Some(s) => s
                .domain_limit
                .saturating_sub(st.reserved + st.held)
                .saturating_sub(others.taken_in_domain)
                .saturating_sub(native),
            None => u64::MAX,
        };
        // The cgroup as it is now: what its processes hold beside the jobs'
        // touched memory (this worker's own, a program of the same batch
        // job) is not for jobs, nor is what the domain's jobs may still
        // touch.
        let by_cgroup = match host.cgroup_free {
            Some(free) => free
                .saturating_sub(Self::untouched(st).saturating_add(others.untouched_in_domain))
                .saturating_sub(native),
            None => u64::MAX,
        };
        by_capacity.min(by_host).min(by_domain).min(by_cgroup)
    }

    /// The largest job that would be admitted now (the host's other
    /// workers as last read).
    pub fn offer(&self) -> u64 {
        let available = self.host_now();
        self.offer_locked(&self.lock(), available, self.others())
    }

    /// The largest job this worker could start once every running job has
    /// ended, as the host looks now: capacity, or less when the host's
    /// other users hold memory (`host available + Σ in use − reserve`). A
    /// job larger than this waits in vain until the host frees memory.
    pub fn ceiling(&self) -> u64 {
        let now = self.host_now();
        let st = self.lock();
        let in_use: u64 = st.jobs.iter().map(|j| j.used.load(Ordering::Relaxed)).sum();
        self.largest_job_locked(&st)
            .min(
                now.available
                    .saturating_add(in_use)
                    .saturating_sub(self.reserve)
                    .saturating_sub(self.per_job),
            )
            .min(
                now.cgroup_free
                    .unwrap_or(u64::MAX)
                    .saturating_add(in_use)
                    .saturating_sub(self.per_job),
            )
    }

    /// A hold of nothing yet, for what `kind` says.
    pub fn hold(self: &Arc<Self>, kind: HoldKind) -> Hold {
        Hold::new(self.clone(), kind)
    }

    /// Reserves `bytes` if they fit now.
    pub fn try_reserve(self: &Arc<Self>, bytes: u64) -> Option<Reservation> {
        self.try_reserve_fitting(bytes, bytes, 0)
    }

    fn reserve_locked(
        self: &Arc<Self>,
        st: &mut State,
        bytes: u64,
        keep: u64,
        available: HostNow,
        others: Others,
    ) -> Option<Reservation> {
        if bytes.saturating_add(keep) > self.offer_locked(st, available, others) {
            return None;
        }
        let total = bytes.saturating_add(self.per_job);
        st.reserved += total;
        st.limits += bytes;
        st.high_water = st.high_water.max(st.limits);
        debug_assert!(st.limits <= self.capacity && st.reserved <= self.machine);
        let id = st.next_id;
        st.next_id += 1;
        let meter = Arc::new(AtomicU64::new(0));
        st.jobs.push(Reserved {
            id,
            limit: bytes,
            total,
            used: meter.clone(),
        });
        Some(Reservation {
            ledger: self.clone(),
            id,
            bytes,
            meter,
        })
    }

    /// The figures now.
    pub fn snapshot(&self) -> LedgerSnapshot {
        let available = self.host_now();
        let st = self.lock();
        LedgerSnapshot {
            capacity: self.capacity,
            reserved: st.limits,
            held: st.held,
            held_by: st.held_by,
            reserved_high_water: st.high_water,
            used: st.jobs.iter().map(|j| j.used.load(Ordering::Relaxed)).sum(),
            host_available: available.available,
            offer: self.offer_locked(&st, available, self.others()),
        }
    }
}

#[cfg(test)]
mod tests;
