//! Holds: bytes the worker keeps *for* jobs outside their reservations —
//! their output and results, the requests it is reading, the modules it is
//! compiling, the interpreters it keeps warm — charged to the ledger beside the reservations, each under a
//! [`HoldKind`] so that the metrics say which.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// What a `Hold` is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HoldKind {
    /// A job's output while it runs, then its result until it is sent.
    Output,
    /// A finished detached job's result, kept until its owner discards it
    /// or `--keep-results` passes: no job's end gives it back, so it is
    /// taken from the largest job this worker can take
    /// (`Ledger::largest_job`), not only from what is free now — else a
    /// job asking the whole capacity would wait behind a few kept bytes
    /// until they expire.
    Result,
    /// A request's bytes while the worker reads and acts on them (the
    /// request budget's charges).
    Request,
    /// The memory a module's compile takes, from its slot to its start.
    Compile,
    /// What warm starts keep for the next jobs (snapshots, resident
    /// interpreters: `JobRunner::warm_held_bytes`), in this process and
    /// its slot processes — let go when a job waits for the memory
    /// (`worker::warm_charge`), so it is not taken from the largest job.
    Warm,
}

impl HoldKind {
    /// Every kind, in the order of `LedgerSnapshot::held_by`.
    pub const ALL: [HoldKind; 5] = [
        HoldKind::Output,
        HoldKind::Result,
        HoldKind::Request,
        HoldKind::Compile,
        HoldKind::Warm,
    ];

    /// Its name in metrics (`peerwasm_memory_bytes{kind="<label>_held"}`).
    pub fn label(self) -> &'static str {
        match self {
            HoldKind::Output => "output",
            HoldKind::Result => "result",
            HoldKind::Request => "request",
            HoldKind::Compile => "compile",
            HoldKind::Warm => "warm",
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
    /// Whose share it counts against too, if any.
    share: Option<Arc<Share>>,
}

/// What one party (a tenant) may hold at once across its holds of a kind,
/// beside the ledger's room: e.g. the output of its streamed jobs that its
/// clients have not read yet, so that one tenant who stops reading cannot
/// hold the worker's memory that others' jobs need.
#[derive(Debug)]
pub struct Share {
    used: AtomicU64,
    cap: u64,
}

impl Share {
    /// A share of at most `cap` bytes.
    pub fn new(cap: u64) -> Arc<Share> {
        Arc::new(Share {
            used: AtomicU64::new(0),
            cap,
        })
    }

    /// The bytes held against it now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Its cap.
    pub fn cap(&self) -> u64 {
        self.cap
    }

    fn take(&self, bytes: u64, force: bool) -> bool {
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
                (force || now.saturating_add(bytes) <= self.cap)
                    .then_some(now.saturating_add(bytes))
            })
            .is_ok()
    }

    fn give_back(&self, bytes: u64) {
        let _ = self
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
                Some(now.saturating_sub(bytes))
            });
    }
}

/// Each party's [`Share`], made on first use, forgotten once no hold has it.
pub struct Shares {
    cap: u64,
    by: parking_lot::Mutex<std::collections::HashMap<String, std::sync::Weak<Share>>>,
}

impl Shares {
    /// Shares of `cap` bytes each.
    pub fn new(cap: u64) -> Shares {
        Shares {
            cap,
            by: Default::default(),
        }
    }

    /// `party`'s share.
    pub fn of(&self, party: &str) -> Arc<Share> {
        let mut by = self.by.lock();
        by.retain(|_, s| s.strong_count() > 0);
        if let Some(share) = by.get(party).and_then(std::sync::Weak::upgrade) {
            return share;
        }
        let share = Share::new(self.cap);
        by.insert(party.to_string(), Arc::downgrade(&share));
        share
    }
}

impl Hold {
    /// A hold of nothing yet, charged to `account`.
    pub(super) fn new(account: Arc<dyn Account>, kind: HoldKind) -> Hold {
        Hold {
            account,
            kind,
            bytes: AtomicU64::new(0),
            share: None,
        }
    }

    /// This hold, counted against `share` too: past its cap it grows no
    /// further (but with `force`).
    pub fn within(mut self, share: Arc<Share>) -> Hold {
        self.share = Some(share);
        self
    }

    /// Holds `bytes` more if capacity less reservations and holds has room
    /// for them (and its share, if it has one), or regardless with `force`
    /// (a small allowance every job has, so that a worker whose memory is
    /// all reserved still lets its jobs print). Returns whether they are
    /// held.
    pub fn try_grow(&self, bytes: u64, force: bool) -> bool {
        if let Some(share) = &self.share
            && !share.take(bytes, force)
        {
            return false;
        }
        let taken = self.account.take(self.kind, bytes, force);
        if taken {
            self.bytes.fetch_add(bytes, Ordering::Relaxed);
        } else if let Some(share) = &self.share {
            share.give_back(bytes);
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
        let _ = self
            .bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
                given = amount(now).min(now);
                Some(now - given)
            });
        if given > 0 {
            self.account.give_back(self.kind, given);
            if let Some(share) = &self.share {
                share.give_back(given);
            }
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
            if let Some(share) = &self.share {
                share.give_back(bytes);
            }
        }
    }
}
