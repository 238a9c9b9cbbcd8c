//! Memory lent to a running job past its reserve.
//!
//! A job may run under a reserve smaller than its limit (the spec's
//! `memory_reserve`, as a Kubernetes pod's request beside its limit):
//! admission reserves the reserve, and when the job's memory grows past
//! it the sandbox's limiter asks its [`Lender`] for the difference. The
//! ledger lends only what it would offer a new job now — memory promised to
//! no running job, within `--memory`, the host's free memory and the host's
//! shared ledger — less what admission holds back ([`HeldBack`]), and the
//! loan joins the job's reservation until it ends, so Σ reservations still
//! never exceeds capacity and no job can take memory another was promised.
//!
//! Held back: the memory a job that has waited too long needs (from
//! everyone), and that of each other tenant's first job waiting for memory
//! (from this tenant): a tenant whose jobs ask for tiny reserves is
//! admitted sooner, but cannot then borrow its way past another tenant's
//! job that waits in fair-share order. Its job runs out of lent memory
//! instead and queues again, its whole request reserved.
//!
//! Why lend at all: a submitter that knows a job's peak only to within a
//! noise (smartmem's fit, ±10 %) must otherwise reserve the noise's top
//! for every job. With a reserve near the middle, each job holds what it
//! uses — those under their reserve keep it, those over borrow — and the
//! jobs' noises, pooled, cost a few percent instead of the top of each.

use std::sync::Arc;

use super::{HeldBack, Ledger, Others, Reservation, State};
use crate::sandbox::MemoryLender;

/// Lends one job's reservation more ([`Reservation::lender`]).
pub struct Lender {
    ledger: Arc<Ledger>,
    id: u64,
    /// The job's tenant: another tenant's waiting job is not overtaken.
    tenant: String,
}

impl Reservation {
    /// What the job's limiter asks for memory past its reserve; the job is
    /// `tenant`'s.
    pub fn lender(&self, tenant: &str) -> Arc<dyn MemoryLender> {
        Arc::new(Lender {
            ledger: self.ledger.clone(),
            id: self.id,
            tenant: tenant.to_string(),
        })
    }

    /// What the job holds now: what it reserved and what it was lent.
    pub fn with_loans(&self) -> u64 {
        let st = self.ledger.lock();
        st.jobs
            .iter()
            .find(|j| j.id == self.id)
            .map_or(self.bytes, |j| j.limit)
    }
}

impl MemoryLender for Lender {
    fn lend(&self, bytes: u64) -> bool {
        let ledger = &self.ledger;
        // A refusal on a stale reading of the cgroup is decided again on a
        // fresh one (`fresh.rs`).
        self.lend_with(bytes, ledger.host_now())
            || ledger
                .read_again()
                .is_some_and(|fresh| self.lend_with(bytes, fresh))
    }
}

impl Lender {
    fn lend_with(&self, bytes: u64, available: super::host::HostNow) -> bool {
        let ledger = &self.ledger;
        let lent = match ledger.shared.get() {
            None => ledger.lend_locked(
                &mut ledger.lock(),
                self,
                bytes,
                available,
                Others::default(),
            ),
            Some(shared) => {
                // As a reservation is decided: under the host ledger's
                // lock, the others read afresh, this worker's record
                // written in the same breath.
                let decided = shared.host.transact(&shared.addr, |others| {
                    *shared.last.lock() = others;
                    let mut st = ledger.lock();
                    let lent = ledger.lend_locked(&mut st, self, bytes, available, others);
                    (lent, lent.then(|| ledger.published(&st)))
                });
                // The host's ledger cannot be read: lend nothing rather
                // than decide alone for memory others may hold.
                decided.unwrap_or(false)
            }
        };
        if lent {
            tracing::trace!(job = self.id, bytes, "lent past the reserve");
        }
        lent
    }
}

impl Ledger {
    /// Lends `to`'s job `bytes` more if a new job of that size would be
    /// offered them now, less what is held back from its tenant: the loan
    /// needs no native memory of its own, the job has it already.
    fn lend_locked(
        &self,
        st: &mut State,
        to: &Lender,
        bytes: u64,
        available: super::host::HostNow,
        others: Others,
    ) -> bool {
        let room = self
            .room_beside(st, available, others, 0)
            .saturating_sub(self.held_back.lock().from(&to.tenant));
        if bytes > room {
            return false;
        }
        let Some(job) = st.jobs.iter_mut().find(|j| j.id == to.id) else {
            return false; // ended: nothing to lend to
        };
        job.limit += bytes;
        job.total += bytes;
        st.reserved += bytes;
        st.limits += bytes;
        st.high_water = st.high_water.max(st.limits);
        debug_assert!(st.limits <= self.capacity && st.reserved <= self.machine);
        true
    }

    /// Holds memory back from loans: admission's view of the jobs waiting
    /// for it (replaced at each dispatch).
    pub fn hold_back_from_loans(&self, held: HeldBack) {
        *self.held_back.lock() = held;
    }
}
