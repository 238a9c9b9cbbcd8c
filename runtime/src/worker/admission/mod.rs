//! Admission: which queued job starts when a slot frees.
//!
//! A job starts when a slot is free, its memory fits the ledger, and its
//! tenant is below its own slot limit. Otherwise it waits in its tenant's
//! bounded queue; a full queue is refused at once (the client tries another
//! worker), and so is a job that could never fit (naming the largest this
//! worker can take).
//!
//! When a slot frees, the scheduler starts the first fitting job of the
//! tenant with the lowest fair share (see [`super::fairshare`]) — or, with
//! fair share off, the oldest fitting job. Small jobs may pass a waiting
//! large one, but a job that has waited longer than `hold_after` has memory
//! held for it: other jobs start only if they fit beside it, so the memory
//! it needs gathers as running jobs end and large jobs are not starved
//! (sooner for a job that does not fit on a worker of short jobs:
//! `hold.rs`). The
//! hold never wedges the worker: a job is held only if it fits in what the
//! host could ever offer ([`Ledger::ceiling`]) — otherwise it is refused,
//! naming the largest that fits — and only while its tenant is below its
//! slot limit; among overdue jobs, fair share picks which is held. Waiting
//! jobs are also re-checked every [`RECHECK`], because host memory frees up
//! without any job ending.
//!
//! The waiting jobs are kept per tenant (`queue.rs`), so that a deep queue
//! costs nothing per job.

mod hold;
mod queue;
mod view;

pub use view::AdmissionView;

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::oneshot;

use super::fairshare::{FairShare, JobUsage, PoolSize, Usage};
use super::ledger::{HeldBack, Ledger, Reservation};
use super::tenants::Tenant;
use crate::proto::MemoryRequest;
use queue::{Place, Queues, Waiter};

/// How often waiting jobs re-check host memory.
pub const RECHECK: Duration = Duration::from_millis(250);

/// Jobs a tenant may have waiting per slot, by default: deep enough for a
/// client that pipelines short jobs (`map` keeps up to
/// `client::map::MAX_IN_FLIGHT_PER_SLOT` per slot under way), small enough
/// that a flood is refused (503) long before it costs the worker much
/// memory.
pub const QUEUE_PER_SLOT: u32 = 256;

/// Bytes of specs one tenant's waiting jobs may hold by default: a queue of
/// many jobs with large inputs is memory the worker holds for nothing yet.
pub const QUEUE_BYTES_PER_TENANT: u64 = 1 << 30;

/// A job that has waited this long gets memory held for it, by default
/// (`--hold-after`).
pub const DEFAULT_HOLD_AFTER: Duration = Duration::from_secs(30);

/// How admission behaves.
#[derive(Clone, Debug)]
pub struct AdmissionConfig {
    /// Jobs that run at once.
    pub slots: u32,
    /// Jobs one tenant may have waiting. Default: [`QUEUE_PER_SLOT`] × slots.
    pub queue_per_tenant: u32,
    /// Bytes one tenant's waiting jobs may hold (their specs as encoded:
    /// args, env, stdin, tag). Default:
    /// [`QUEUE_BYTES_PER_TENANT`].
    pub queue_bytes_per_tenant: u64,
    /// Rank tenants by fair share (`true`, the default) or serve jobs in
    /// arrival order (`false`).
    pub fair_share: bool,
    /// Usage halves every this long. Default:
    /// [`DEFAULT_HALF_LIFE`](super::fairshare::DEFAULT_HALF_LIFE).
    pub half_life: Duration,
    /// A job waiting longer than this gets memory held for it (sooner if it
    /// does not fit, on a worker of short jobs: `hold.rs`). Default: [`DEFAULT_HOLD_AFTER`].
    pub hold_after: Duration,
    /// The most memory one job may have, whatever the capacity: the
    /// sandbox's ceiling (`SandboxConfig::max_job_memory`), so that a job
    /// the sandbox would reject is refused here, before it waits or
    /// reserves. Default: `u64::MAX` (the capacity alone bounds a job).
    pub max_job_memory: u64,
}

impl AdmissionConfig {
    /// Defaults for `slots` slots.
    pub fn new(slots: u32) -> AdmissionConfig {
        AdmissionConfig {
            slots,
            queue_per_tenant: QUEUE_PER_SLOT * slots,
            queue_bytes_per_tenant: QUEUE_BYTES_PER_TENANT,
            fair_share: true,
            half_life: super::fairshare::DEFAULT_HALF_LIFE,
            hold_after: DEFAULT_HOLD_AFTER,
            max_job_memory: u64::MAX,
        }
    }
}

/// Why a job was not admitted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotAdmitted {
    /// It asks for more than this worker could ever give this tenant.
    NeverFits { requested: u64, largest: u64 },
    /// The tenant's queue is full; try elsewhere or later.
    Busy,
}

/// What a waiting job is answered with.
type Answer = Result<Ticket, NotAdmitted>;

/// Slots, queues and fair share of one worker.
pub struct Admission {
    ledger: Arc<Ledger>,
    config: AdmissionConfig,
    state: Mutex<State>,
}

struct State {
    busy: u32,
    /// When a job last started or ended (or the worker started): with
    /// nothing running or waiting, it has been idle since then.
    last_activity: Instant,
    /// Waiting jobs, per tenant.
    queue: Queues<Answer>,
    running: HashMap<u64, Running>,
    fair: FairShare,
    /// Recent jobs' times: how soon a passed-over job is held.
    times: hold::JobTimes,
    next_id: u64,
}

/// What the scheduler does next.
enum Step {
    /// Start the waiter at this place with this reservation.
    Start(Place, Reservation),
    /// Nothing can start now.
    Wait,
}

struct Running {
    tenant: Arc<Tenant>,
    reserved: u64,
    started: Instant,
}

impl State {
    /// What each tenant's running jobs have accrued so far.
    fn running_usage(&self, now: Instant) -> HashMap<String, Usage> {
        let mut out: HashMap<String, Usage> = HashMap::new();
        for r in self.running.values() {
            let u = Usage::of_job(now.saturating_duration_since(r.started), r.reserved);
            let e = out.entry(r.tenant.name.clone()).or_default();
            e.slot_seconds += u.slot_seconds;
            e.gib_seconds += u.gib_seconds;
        }
        out
    }

    fn running_of(&self, tenant: &str) -> u32 {
        self.running
            .values()
            .filter(|r| r.tenant.name == tenant)
            .count() as u32
    }

    /// Whether `tenant` may start another job (below its slot limit).
    fn may_start(&self, tenant: &Tenant) -> bool {
        tenant
            .max_slots
            .is_none_or(|max| self.running_of(&tenant.name) < max)
    }
}

/// A slot and a memory reservation, held while the job runs.
pub struct Ticket {
    admission: Arc<Admission>,
    id: u64,
    tenant: Arc<Tenant>,
    /// `Some` until drop.
    reservation: Option<Reservation>,
}

impl Ticket {
    /// The job's memory reservation.
    pub fn reservation(&self) -> &Reservation {
        self.reservation.as_ref().expect("held until drop")
    }

    /// The job's tenant.
    pub fn tenant(&self) -> &Arc<Tenant> {
        &self.tenant
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let now = Instant::now();
        {
            let mut st = self.admission.lock();
            if let Some(r) = st.running.remove(&self.id) {
                let took = now.saturating_duration_since(r.started);
                st.times.record(took);
                let usage = Usage::of_job(took, r.reserved);
                st.fair.record(&r.tenant.name, usage, now);
            }
            st.busy -= 1;
            st.last_activity = now;
            // Give the memory back before dispatching, so waiters find it.
            drop(self.reservation.take());
        }
        self.admission.dispatch();
    }
}

impl Admission {
    /// Admission over `ledger`; starts the periodic re-check when called
    /// inside a Tokio runtime.
    pub fn new(ledger: Arc<Ledger>, config: AdmissionConfig) -> Arc<Admission> {
        let pool = PoolSize {
            slots: config.slots as f64,
            capacity_gib: ledger.capacity() as f64 / (1u64 << 30) as f64,
        };
        let fair = FairShare::new(config.half_life, pool);
        let admission = Arc::new(Admission {
            ledger,
            config,
            state: Mutex::new(State {
                busy: 0,
                last_activity: Instant::now(),
                queue: Queues::default(),
                running: HashMap::new(),
                fair,
                times: hold::JobTimes::default(),
                next_id: 0,
            }),
        });
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let weak: Weak<Admission> = Arc::downgrade(&admission);
            let ledger = admission.ledger.clone();
            rt.spawn(async move {
                loop {
                    // Memory given back (a job ended, its output was sent)
                    // starts a waiting job at once; the timer covers what
                    // changes outside this worker (the host, other workers).
                    tokio::select! {
                        () = tokio::time::sleep(RECHECK) => {}
                        () = ledger.freed() => {}
                    }
                    let Some(a) = weak.upgrade() else { return };
                    if !a.lock().queue.is_empty() {
                        a.dispatch();
                    }
                }
            });
        }
        admission
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, State> {
        self.state.lock()
    }

    /// The ledger.
    pub fn ledger(&self) -> &Arc<Ledger> {
        &self.ledger
    }

    /// (slots busy, jobs queued) now (tests; adverts read [`view`](Self::view)).
    #[cfg(test)]
    pub fn counts(&self) -> (u32, u32) {
        let st = self.lock();
        (st.busy, st.queue.len() as u32)
    }

    /// How long nothing has run or waited here; `None` while something
    /// does. What a controller lets idle workers go by (`Advert::idle_ms`).
    fn idle(st: &State) -> Option<std::time::Duration> {
        (st.busy == 0 && st.queue.is_empty()).then(|| st.last_activity.elapsed())
    }

    /// What an advert says of admission, read at one instant (one lock):
    /// slots busy, jobs queued, whether one waits only for memory, how long
    /// it has been idle, and each tenant's usage — so that an advert never
    /// says, say, idle with a job queued.
    pub fn view(&self) -> AdmissionView {
        let now = Instant::now();
        let st = self.lock();
        AdmissionView {
            busy: st.busy,
            queued: st.queue.len() as u32,
            waits_for_memory: st.busy < self.config.slots
                && st.queue.oldest().any(|w| st.may_start(&w.tenant)),
            idle_for: Self::idle(&st),
            tenants: st.fair.report(&st.running_usage(now), now),
        }
    }

    /// Jobs waiting, per tenant (tenants with none left out).
    pub fn queued_by_tenant(&self) -> Vec<(String, u32)> {
        self.lock().queue.by_tenant()
    }

    /// The slot count.
    pub fn slots(&self) -> u32 {
        self.config.slots
    }

    /// Per tenant: usage here (running jobs included) and account (tests;
    /// adverts read [`view`](Self::view)).
    #[cfg(test)]
    pub fn tenant_report(&self) -> Vec<crate::proto::TenantUsage> {
        let now = Instant::now();
        let st = self.lock();
        st.fair.report(&st.running_usage(now), now)
    }

    /// The rest of the pool's usage per tenant and the pool's size, from
    /// gossip.
    pub fn set_pool_usage(&self, remote: HashMap<String, Usage>, pool: PoolSize) {
        self.lock().fair.set_remote(remote, pool);
    }

    /// Adds a finished job to its tenant's account.
    pub fn account(&self, tenant: &str, job: &JobUsage) {
        self.lock().fair.account(tenant, job);
    }

    /// The largest job this worker could ever run: its capacity, or the
    /// most one job may have if less (what it advertises as
    /// `Advert::largest_job`).
    pub fn largest_job(&self) -> u64 {
        self.ledger.largest_job().min(self.config.max_job_memory)
    }

    /// The largest job `tenant` may ever run here: [`largest_job`]
    /// (Self::largest_job), or the tenant's `max_job_memory` if less.
    pub fn largest_for(&self, tenant: &Tenant) -> u64 {
        self.largest_job()
            .min(tenant.max_job_memory.unwrap_or(u64::MAX))
    }

    /// Waits for a slot and the memory `request` asks for `tenant`, or refuses. A
    /// cancelled wait leaves the queue. (The worker enqueues with what the
    /// job holds while it waits; the tests use this.)
    #[cfg(test)]
    pub async fn admit(
        self: &Arc<Self>,
        tenant: &Arc<Tenant>,
        request: impl Into<MemoryRequest>,
    ) -> Result<Ticket, NotAdmitted> {
        self.enqueue(tenant, request, 0)?.ticket().await
    }

    /// Queues a job that asks `request` for `tenant`, holding `held` bytes
    /// (its spec) while it waits — or refuses it at once when it could
    /// never fit, or it cannot start now and its tenant's queue is full (in
    /// jobs or in bytes). The job's place is given up when the returned
    /// [`Queued`] is dropped.
    #[cfg(test)]
    pub fn enqueue(
        self: &Arc<Self>,
        tenant: &Arc<Tenant>,
        request: impl Into<MemoryRequest>,
        held: u64,
    ) -> Result<Queued, NotAdmitted> {
        let request = request.into();
        self.enqueue_reserving(tenant, request, request, held)
    }

    /// [`enqueue`](Self::enqueue) for a job whose `limit` must fit for it to
    /// start, but which reserves only `reserve` (at most `limit`): past it,
    /// its worker lends it what it grows to. Starting only where the limit
    /// fits leaves room for the loan, and a tiny reserve jumps no queue.
    pub fn enqueue_reserving(
        self: &Arc<Self>,
        tenant: &Arc<Tenant>,
        reserve: MemoryRequest,
        limit: MemoryRequest,
        held: u64,
    ) -> Result<Queued, NotAdmitted> {
        let (asked, starts_at) = (reserve.min(limit).bytes(), limit.bytes());
        let largest = self.largest_for(tenant);
        if starts_at > largest {
            return Err(NotAdmitted::NeverFits {
                requested: starts_at,
                largest,
            });
        }
        let (tx, rx) = oneshot::channel();
        let id = {
            let mut st = self.lock();
            let (waiting, waiting_bytes) = st.queue.of_tenant(&tenant.name);
            let full = waiting >= self.config.queue_per_tenant
                || waiting_bytes.saturating_add(held) > self.config.queue_bytes_per_tenant;
            // A job that can start at once needs no room in the queue; one
            // that must wait (for a slot, or for memory) does.
            // (The ledger's offer reads host memory: only asked when full.)
            if full && !(st.busy < self.config.slots && starts_at <= self.ledger.offer()) {
                return Err(NotAdmitted::Busy);
            }
            st.next_id += 1;
            let id = st.next_id;
            st.queue.push(Waiter {
                id,
                tenant: tenant.clone(),
                asked,
                starts_at,
                held,
                since: Instant::now(),
                tx,
            });
            tracing::trace!(tenant = %tenant.name, queued = st.queue.len(), "job queued");
            id
        };
        self.dispatch();
        Ok(Queued {
            admission: self.clone(),
            id,
            rx,
            queued: true,
        })
    }

    /// Starts as many waiting jobs as slots and memory allow, in fair-share
    /// (or arrival) order; refuses overdue jobs that can never fit.
    fn dispatch(self: &Arc<Self>) {
        let mut unwanted = Vec::new();
        {
            let now = Instant::now();
            let mut st = self.lock();
            self.refuse_hopeless(&mut st, now);
            // `pick` holds memory back from loans for the jobs that wait.
            self.ledger.hold_back_from_loans(HeldBack::default());
            while st.busy < self.config.slots && !st.queue.is_empty() {
                let Step::Start(pos, reservation) = self.pick(&st, now) else {
                    break;
                };
                let w = st.queue.take(pos);
                tracing::debug!(tenant = %w.tenant.name, queued = st.queue.len(), "starting a job");
                st.busy += 1;
                st.last_activity = Instant::now();
                st.next_id += 1;
                let id = st.next_id;
                st.running.insert(
                    id,
                    Running {
                        tenant: w.tenant.clone(),
                        reserved: w.asked,
                        started: now,
                    },
                );
                let ticket = Ticket {
                    admission: self.clone(),
                    id,
                    tenant: w.tenant,
                    reservation: Some(reservation),
                };
                if let Err(Ok(ticket)) = w.tx.send(Ok(ticket)) {
                    unwanted.push(ticket); // its waiter went away
                }
            }
        }
        // Dropped outside the lock: a ticket's drop takes it.
        drop(unwanted);
    }

    /// Refuses the overdue jobs that the host could not hold even with
    /// nothing else running: holding memory for them would stop every other
    /// job for nothing.
    fn refuse_hopeless(&self, st: &mut State, now: Instant) {
        let overdue = |w: &Waiter<Answer>| hold::overdue(w.since, now, self.config.hold_after);
        // Each tenant's oldest job is its longest waiting: the usual case
        // (none overdue) looks at one job per tenant and reads no host memory.
        if !st.queue.oldest().any(overdue) {
            return;
        }
        let ceiling = self.ledger.ceiling();
        for w in st.queue.take_hopeless(overdue, |w| w.starts_at > ceiling) {
            tracing::info!(tenant = %w.tenant.name, asked = w.starts_at, ceiling, "refusing a job the host cannot hold");
            let _ = w.tx.send(Err(NotAdmitted::NeverFits {
                requested: w.starts_at,
                largest: ceiling,
            }));
        }
    }

    /// Tenants with waiting jobs that may start one now (below their slot
    /// limit), lowest fair share first (or by their oldest job).
    /// Each comes with its index in the queues.
    fn ranked_tenants<'s>(&self, st: &'s State, now: Instant) -> Vec<(usize, &'s Arc<Tenant>)> {
        let mut tenants: Vec<(usize, &Arc<Tenant>)> = st.queue.tenants().collect();
        tenants.retain(|(_, t)| st.may_start(t));
        if self.config.fair_share && tenants.len() > 1 {
            let running = st.running_usage(now);
            let share = |t: &Tenant| {
                st.fair.share(
                    &t.name,
                    t.weight,
                    running.get(&t.name).copied().unwrap_or_default(),
                    now,
                )
            };
            tenants.sort_by(|(_, a), (_, b)| share(a).total_cmp(&share(b)));
            tracing::trace!(shares = ?tenants.iter().map(|(_, t)| (t.name.as_str(), share(t))).collect::<Vec<_>>(), "ranked");
        }
        tenants
    }

    /// The job to start now, with its reservation.
    fn pick(&self, st: &State, now: Instant) -> Step {
        let tenants = self.ranked_tenants(st, now);
        // The first job past `--hold-after`, in fair-share order (a tenant's
        // oldest is its first to be), starts if it fits; else has memory held.
        let held = tenants.iter().find_map(|&(t, _)| {
            st.queue
                .waiting(t)
                .next()
                .filter(|(_, w)| hold::overdue(w.since, now, self.config.hold_after))
        });
        let keep = match held {
            Some((i, w)) => match self.ledger.try_reserve_fitting(w.asked, w.starts_at, 0) {
                Some(r) => return Step::Start(i, r),
                None => w.starts_at,
            },
            None => hold::gathering(
                tenants
                    .iter()
                    .filter_map(|&(t, _)| st.queue.waiting(t).next())
                    .map(|(_, w)| (w.since, w.starts_at)),
                now,
                st.times.hold_after(self.config.hold_after),
                || (self.ledger.offer(), self.ledger.ceiling()),
            ),
        };
        for &(t, _) in &tenants {
            for (place, w) in st.queue.waiting(t) {
                if let Some(r) = self.ledger.try_reserve_fitting(w.asked, w.starts_at, keep) {
                    return Step::Start(place, r);
                }
            }
        }
        // What waits for memory is not lent meanwhile to other tenants'
        // running jobs: each tenant's first (the held one among them).
        self.ledger.hold_back_from_loans(HeldBack {
            waiting: tenants
                .iter()
                .filter_map(|&(t, tenant)| {
                    let (_, w) = st.queue.waiting(t).next()?;
                    Some((tenant.name.clone(), w.starts_at))
                })
                .collect(),
        });
        Step::Wait
    }
}

/// A job's place in its worker's queue; see [`Admission::enqueue`].
pub struct Queued {
    admission: Arc<Admission>,
    id: u64,
    rx: oneshot::Receiver<Result<Ticket, NotAdmitted>>,
    /// Whether it may still be in the queue (no answer taken yet).
    queued: bool,
}

impl Queued {
    /// Waits until the job may start (or is refused after all: it waited
    /// past the hold bound and the host can never hold it).
    pub async fn ticket(mut self) -> Result<Ticket, NotAdmitted> {
        // The sender lives in the queue until it is used, so this is an
        // answer unless the admission itself went away.
        let answer = (&mut self.rx).await.unwrap_or(Err(NotAdmitted::Busy));
        // Whoever answered took it out of the queue.
        self.queued = false;
        answer
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        if self.queued {
            self.admission.lock().queue.remove(self.id);
        }
    }
}

#[cfg(test)]
mod tests;
