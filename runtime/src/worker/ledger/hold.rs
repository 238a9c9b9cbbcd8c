//! Holds: bytes the worker keeps *for* jobs outside their reservations —
//! their output and results, the requests it is reading, the modules it is
//! compiling — charged to the ledger beside the reservations, each under a
//! [`HoldKind`] so that the metrics say which.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{Ledger, State};

/// What a [`Hold`] is for.
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
    /// Every kind, in the order of [`LedgerSnapshot::held_by`](super::LedgerSnapshot::held_by).
    pub const ALL: [HoldKind; 3] = [HoldKind::Output, HoldKind::Request, HoldKind::Compile];

    /// Its name in metrics (`peerwasm_memory_bytes{kind="<label>_held"}`).
    pub fn label(self) -> &'static str {
        match self {
            HoldKind::Output => "output",
            HoldKind::Request => "request",
            HoldKind::Compile => "compile",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl State {
    fn add_held(&mut self, kind: HoldKind, bytes: u64) {
        self.held += bytes;
        self.held_by[kind.index()] += bytes;
    }

    fn remove_held(&mut self, kind: HoldKind, bytes: u64) {
        self.held -= bytes;
        self.held_by[kind.index()] -= bytes;
    }
}

/// Bytes held for one purpose (a job's output and then its result, a
/// request, a compile), outside any reservation; see the ledger's docs.
/// Given back when dropped.
pub struct Hold {
    pub(super) ledger: Arc<Ledger>,
    pub(super) kind: HoldKind,
    pub(super) bytes: AtomicU64,
}

impl Hold {
    /// Holds `bytes` more if capacity less reservations and holds has room
    /// for them, or regardless with `force` (a small allowance every job
    /// has, so that a worker whose memory is all reserved still lets its
    /// jobs print). Returns whether they are held.
    pub fn try_grow(&self, bytes: u64, force: bool) -> bool {
        let mut st = self.ledger.lock();
        let free = self.ledger.capacity.saturating_sub(st.reserved).saturating_sub(st.held);
        if !force && bytes > free {
            return false;
        }
        st.add_held(self.kind, bytes);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        true
    }

    /// Gives back all but `bytes` (what the result actually keeps).
    pub fn shrink_to(&self, bytes: u64) {
        let now = self.bytes.load(Ordering::Relaxed);
        self.release(now.saturating_sub(bytes));
    }

    /// Gives back `bytes` of what is held (at most all of it): the part
    /// of a streamed job's output that has been sent.
    pub fn release(&self, bytes: u64) {
        let mut st = self.ledger.lock();
        let now = self.bytes.load(Ordering::Relaxed);
        let n = bytes.min(now);
        st.remove_held(self.kind, n);
        self.bytes.store(now - n, Ordering::Relaxed);
        drop(st);
        if n > 0 {
            self.ledger.gave_back();
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
            self.ledger.lock().remove_held(self.kind, bytes);
            self.ledger.gave_back();
        }
    }
}
