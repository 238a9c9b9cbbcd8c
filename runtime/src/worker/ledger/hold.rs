//! Holds: bytes the worker keeps *for* jobs outside their reservations —
//! their output and results, the requests it is reading, the modules it is
//! compiling — charged to the ledger beside the reservations, each under a
//! [`HoldKind`] so that the metrics say which.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// What a `Hold` is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HoldKind {
    /// A job's output while it runs, then its result until it is fetched
    /// or discarded.
    Output,
    /// A request's bytes while the worker reads and acts on them (the
    /// request budget's charges).
    Request,
    /// The memory a module's compile takes, from its slot to its start.
    Compile,
}

impl HoldKind {
    /// Every kind, in the order of `LedgerSnapshot::held_by`.
    pub const ALL: [HoldKind; 3] = [HoldKind::Output, HoldKind::Request, HoldKind::Compile];

    /// Its name in metrics (`peerwasm_memory_bytes{kind="<label>_held"}`).
    pub fn label(self) -> &'static str {
        match self {
            HoldKind::Output => "output",
            HoldKind::Request => "request",
            HoldKind::Compile => "compile",
        }
    }

    /// Its place in [`HoldKind::ALL`].
    pub(super) fn index(self) -> usize {
        self as usize
    }
}

/// What a hold is charged to: the ledger, as a hold sees it (the ledger's
/// arithmetic stays the ledger's).
pub(super) trait Account: Send + Sync {
    /// Takes `bytes` of `kind` if there is room for them beside the
    /// reservations and the other holds, or regardless with `force`;
    /// whether they were taken.
    fn take(&self, kind: HoldKind, bytes: u64, force: bool) -> bool;
    /// Gives back `bytes` of `kind`.
    fn give_back(&self, kind: HoldKind, bytes: u64);
}

/// Bytes held for one purpose (a job's output and then its result, a
/// request, a compile), outside any reservation; see the ledger's docs.
/// Given back when dropped.
pub struct Hold {
    account: Arc<dyn Account>,
    kind: HoldKind,
    bytes: AtomicU64,
}

impl Hold {
    /// A hold of nothing yet, charged to `account`.
    pub(super) fn new(account: Arc<dyn Account>, kind: HoldKind) -> Hold {
        Hold { account, kind, bytes: AtomicU64::new(0) }
    }

    /// Holds `bytes` more if capacity less reservations and holds has room
    /// for them, or regardless with `force` (a small allowance every job
    /// has, so that a worker whose memory is all reserved still lets its
    /// jobs print). Returns whether they are held.
    pub fn try_grow(&self, bytes: u64, force: bool) -> bool {
        let taken = self.account.take(self.kind, bytes, force);
        if taken {
            self.bytes.fetch_add(bytes, Ordering::Relaxed);
        }
        taken
    }

    /// Gives back all but `bytes` (what the result actually keeps).
    pub fn shrink_to(&self, bytes: u64) {
        self.give_back(|now| now.saturating_sub(bytes));
    }

    /// Gives back `bytes` of what is held (at most all of it): the part
    /// of a streamed job's output that has been sent.
    pub fn release(&self, bytes: u64) {
        self.give_back(|now| bytes.min(now));
    }

    /// Gives back `amount(held now)` (at most all of it).
    fn give_back(&self, amount: impl Fn(u64) -> u64) {
        let mut given = 0;
        let _ = self.bytes.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
            given = amount(now).min(now);
            Some(now - given)
        });
        if given > 0 {
            self.account.give_back(self.kind, given);
        }
    }

    /// The bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
}

impl crate::sandbox::OutputBudget for Hold {
    fn try_take(&self, bytes: u64, force: bool) -> bool {
        self.try_grow(bytes, force)
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let bytes = *self.bytes.get_mut();
        if bytes > 0 {
            self.account.give_back(self.kind, bytes);
        }
    }
}
