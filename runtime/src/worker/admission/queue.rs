//! The jobs waiting for a slot on one worker: a first-in, first-out queue
//! per tenant, with each tenant's count and held bytes kept as jobs come
//! and go.
//!
//! Why not one list of all waiting jobs: a worker that `map` pipelines
//! holds hundreds of waiting jobs per slot, and with one list every job
//! queued, started or abandoned scanned (and shifted) all of them under
//! the admission lock, several times. Here queueing, starting the oldest
//! job of a tenant and checking a tenant's limits cost the same however
//! many jobs wait; what is scanned is the tenants, not their jobs (only
//! when memory is short does [`Queues::waiting`] look past a tenant's
//! oldest job for one that fits).

use std::collections::VecDeque;
use std::sync::Arc;
use tokio::time::Instant;

use tokio::sync::oneshot;

use crate::worker::tenants::Tenant;

/// A job waiting for its ticket; `A` is what it is answered with (its
/// ticket or why it has none: the queue has no say in that).
pub(super) struct Waiter<A> {
    /// Its id: ids grow with time, so each tenant's queue is sorted by id.
    pub id: u64,
    pub tenant: Arc<Tenant>,
    /// The memory it asks for: reserved when it starts.
    pub asked: u64,
    /// The memory that must fit for it to start: its limit, which may be
    /// more than `asked` (a job under a reserve is lent the rest).
    pub starts_at: u64,
    /// Bytes it holds while it waits (its input).
    pub held: u64,
    /// When it was queued.
    pub since: Instant,
    /// Where its ticket (or refusal) goes.
    pub tx: oneshot::Sender<A>,
}

/// One tenant's waiting jobs, oldest first.
struct TenantQueue<A> {
    tenant: Arc<Tenant>,
    jobs: VecDeque<Waiter<A>>,
    /// The sum of `jobs`' `held`.
    held: u64,
}

/// Where a waiting job is: its tenant's queue and its place in it. Valid
/// until the queues next change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Place {
    tenant: usize,
    pos: usize,
}

/// Every tenant's queue; see the module docs.
pub(super) struct Queues<A> {
    /// Only tenants with waiting jobs, in no particular order.
    tenants: Vec<TenantQueue<A>>,
    len: usize,
}

impl<A> Default for Queues<A> {
    fn default() -> Self {
        Queues {
            tenants: Vec::new(),
            len: 0,
        }
    }
}

impl<A> Queues<A> {
    /// Jobs waiting, all tenants together.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// (jobs, bytes held) waiting for the tenant called `name`.
    pub fn of_tenant(&self, name: &str) -> (u32, u64) {
        self.find(name)
            .map_or((0, 0), |q| (q.jobs.len() as u32, q.held))
    }

    /// Jobs waiting per tenant, in order of each tenant's oldest job.
    pub fn by_tenant(&self) -> Vec<(String, u32)> {
        self.tenants()
            .map(|(i, t)| (t.name.clone(), self.tenants[i].jobs.len() as u32))
            .collect()
    }

    /// Queues `w` behind its tenant's other jobs (its id must be larger
    /// than theirs).
    pub fn push(&mut self, w: Waiter<A>) {
        let at = match self
            .tenants
            .iter()
            .position(|q| q.tenant.name == w.tenant.name)
        {
            Some(at) => at,
            None => {
                self.tenants.push(TenantQueue {
                    tenant: w.tenant.clone(),
                    jobs: VecDeque::new(),
                    held: 0,
                });
                self.tenants.len() - 1
            }
        };
        let q = &mut self.tenants[at];
        debug_assert!(q.jobs.back().is_none_or(|last| last.id < w.id), "ids grow");
        q.held += w.held;
        q.jobs.push_back(w);
        self.len += 1;
    }

    /// The tenants with waiting jobs (an index for [`waiting`](Self::waiting)
    /// and the tenant), in order of their oldest job.
    pub fn tenants(&self) -> impl Iterator<Item = (usize, &Arc<Tenant>)> {
        let mut order: Vec<usize> = (0..self.tenants.len()).collect();
        order.sort_unstable_by_key(|&i| self.tenants[i].jobs.front().map_or(u64::MAX, |w| w.id));
        order.into_iter().map(|i| (i, &self.tenants[i].tenant))
    }

    /// Each tenant's oldest waiting job, in no particular order.
    pub fn oldest(&self) -> impl Iterator<Item = &Waiter<A>> {
        self.tenants.iter().filter_map(|q| q.jobs.front())
    }

    /// A tenant's waiting jobs, oldest first, with their places.
    pub fn waiting(&self, tenant: usize) -> impl Iterator<Item = (Place, &Waiter<A>)> {
        self.tenants[tenant]
            .jobs
            .iter()
            .enumerate()
            .map(move |(pos, w)| (Place { tenant, pos }, w))
    }

    /// Takes the job at `place` out of its queue.
    pub fn take(&mut self, place: Place) -> Waiter<A> {
        let q = &mut self.tenants[place.tenant];
        let w = q.jobs.remove(place.pos).expect("a place from waiting()");
        q.held -= w.held;
        if q.jobs.is_empty() {
            self.tenants.swap_remove(place.tenant);
        }
        self.len -= 1;
        w
    }

    /// Takes the job with this id out of its queue, if it is still there.
    pub fn remove(&mut self, id: u64) -> Option<Waiter<A>> {
        let place = self.tenants.iter().enumerate().find_map(|(tenant, q)| {
            let pos = q.jobs.binary_search_by_key(&id, |w| w.id).ok()?;
            Some(Place { tenant, pos })
        })?;
        Some(self.take(place))
    }

    /// Takes out the jobs among each tenant's oldest, `overdue` ones for
    /// which `hopeless` holds. `overdue` must hold for a prefix of each
    /// tenant's queue (it is a bound on the time waited).
    pub fn take_hopeless(
        &mut self,
        overdue: impl Fn(&Waiter<A>) -> bool,
        hopeless: impl Fn(&Waiter<A>) -> bool,
    ) -> Vec<Waiter<A>> {
        let mut out = Vec::new();
        let mut tenant = self.tenants.len();
        while tenant > 0 {
            tenant -= 1;
            let mut pos = 0;
            while pos < self.tenants[tenant].jobs.len() {
                let w = &self.tenants[tenant].jobs[pos];
                if !overdue(w) {
                    break;
                }
                if !hopeless(w) {
                    pos += 1;
                    continue;
                }
                let tenants = self.tenants.len();
                out.push(self.take(Place { tenant, pos }));
                // Its last job taken, the tenant's queue is gone (swapped
                // with the last one, which was visited already).
                if self.tenants.len() < tenants {
                    break;
                }
            }
        }
        out
    }

    fn find(&self, name: &str) -> Option<&TenantQueue<A>> {
        self.tenants.iter().find(|q| q.tenant.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter(id: u64, tenant: &Arc<Tenant>, held: u64) -> Waiter<()> {
        let (tx, _) = oneshot::channel();
        Waiter {
            id,
            tenant: tenant.clone(),
            asked: id,
            starts_at: id,
            held,
            since: Instant::now(),
            tx,
        }
    }

    #[test]
    fn tenants_keep_their_order_counts_and_bytes() {
        let (a, b) = (Arc::new(Tenant::new("a")), Arc::new(Tenant::new("b")));
        let mut q = Queues::default();
        for (id, t) in [(1, &a), (2, &b), (3, &a), (4, &b), (5, &a)] {
            q.push(waiter(id, t, 10 * id));
        }
        assert_eq!(
            (
                q.len(),
                q.of_tenant("a"),
                q.of_tenant("b"),
                q.of_tenant("c")
            ),
            (5, (3, 90), (2, 60), (0, 0))
        );
        assert_eq!(q.by_tenant(), [("a".to_string(), 3), ("b".to_string(), 2)]);
        // Taking a's oldest makes b's job 2 the oldest of all.
        let (ta, _) = q.tenants().next().unwrap();
        let (place, _) = q.waiting(ta).next().unwrap();
        assert_eq!(q.take(place).id, 1);
        assert_eq!(
            q.tenants()
                .map(|(_, t)| t.name.as_str())
                .collect::<Vec<_>>(),
            ["b", "a"]
        );
        // Abandoned jobs leave by id; unknown ids change nothing.
        assert_eq!(q.remove(4).map(|w| w.id), Some(4));
        assert!(q.remove(4).is_none());
        assert_eq!(q.remove(2).map(|w| w.id), Some(2));
        assert_eq!((q.len(), q.by_tenant()), (2, vec![("a".to_string(), 2)]));
        let ids: Vec<u64> = q.waiting(0).map(|(_, w)| w.id).collect();
        assert_eq!(ids, [3, 5]);
        assert_eq!(q.of_tenant("a"), (2, 80));
    }

    #[test]
    fn hopeless_jobs_are_taken_from_the_overdue_prefix_only() {
        let (a, b, c) = (
            Arc::new(Tenant::new("a")),
            Arc::new(Tenant::new("b")),
            Arc::new(Tenant::new("c")),
        );
        let mut q = Queues::default();
        for (id, t) in [
            (0, &c),
            (1, &a),
            (2, &b),
            (3, &a),
            (4, &a),
            (5, &b),
            (6, &a),
        ] {
            q.push(waiter(id, t, 0));
        }
        // Overdue: ids up to 4. Hopeless: even ids (asked is the id here).
        // c loses its only job, and with it its queue.
        let taken = q.take_hopeless(|w| w.id <= 4, |w| w.asked % 2 == 0);
        let mut ids: Vec<u64> = taken.iter().map(|w| w.id).collect();
        ids.sort();
        assert_eq!(ids, [0, 2, 4]);
        assert_eq!(q.by_tenant(), [("a".to_string(), 3), ("b".to_string(), 1)]);
        assert_eq!(q.len(), 4);
    }
}
