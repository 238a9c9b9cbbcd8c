//! Re-reading the cgroup when a reading refused: what a cgroup has free is
//! read at most once a second ([`HOST_REFRESH`](super::host::HOST_REFRESH)),
//! and a reading taken while a job still held its memory counts that
//! memory as taken after the job has ended and given its reservation back
//! — so the next job of a worker sized for one job at a time would wait up
//! to a second for it. A reservation or a loan that such a reading refuses
//! is decided again on a fresh one (taken at most every
//! [`FRESH_AFTER`]); admission asks again when memory is given back and
//! periodically, so a refusal never stands on a stale reading.

use std::sync::Arc;
use std::time::Duration;

use super::host::HostNow;
use super::{Ledger, Others, Reservation};

/// The youngest a cgroup reading is read again after a refusal.
pub(super) const FRESH_AFTER: Duration = Duration::from_millis(10);

impl Ledger {
    /// A fresh reading, when this worker is in a cgroup and its reading is
    /// older than [`FRESH_AFTER`].
    pub(super) fn read_again(&self) -> Option<HostNow> {
        (self.host.cgroup_free().is_some() && self.host.refresh(FRESH_AFTER))
            .then(|| self.host_now())
    }

    /// Reserves `bytes` if `fits` (at least `bytes`: a job's limit, when it
    /// reserves less) fit now with `keep` bytes still free beside them
    /// (memory held for a job that has waited too long).
    pub fn try_reserve_fitting(
        self: &Arc<Self>,
        bytes: u64,
        fits: u64,
        keep: u64,
    ) -> Option<Reservation> {
        let keep = keep.saturating_add(fits.saturating_sub(bytes));
        let now = self.host_now();
        self.reserve_with(bytes, keep, now).or_else(|| {
            let fresh = self.read_again()?;
            self.reserve_with(bytes, keep, fresh)
        })
    }

    fn reserve_with(
        self: &Arc<Self>,
        bytes: u64,
        keep: u64,
        available: HostNow,
    ) -> Option<Reservation> {
        let Some(shared) = self.shared.get() else {
            return self.reserve_locked(
                &mut self.lock(),
                bytes,
                keep,
                available,
                Others::default(),
            );
        };
        // Decided under the host ledger's lock, the others read afresh,
        // and this worker's record written in the same breath: two
        // workers cannot both take the last of the host.
        let decided = shared.host.transact(&shared.addr, |others| {
            *shared.last.lock() = others;
            let mut st = self.lock();
            let r = self.reserve_locked(&mut st, bytes, keep, available, others);
            let update = r.as_ref().map(|_| self.published(&st));
            (r, update)
        });
        match decided {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(path = %shared.host.path().display(), "cannot read the host's ledger ({e}): deciding alone");
                self.reserve_locked(&mut self.lock(), bytes, keep, available, self.others())
            }
        }
    }
}
