//! [`Cancel`]: how anyone who holds a job ends it — its owner (`DELETE
//! /v1/jobs/{id}`), the connection of the client waiting for it, a worker
//! shutting down, or Ctrl-C on `peerwasm run`.
//!
//! One mechanism for every state a job can be in. A job runs as an async
//! wasmtime call that gives its thread back at every fuel (or epoch) yield
//! and whenever it waits in a host call (a sleep), so the sandbox races that
//! call against [`Cancel::cancelled`]: a computing job ends at its next
//! yield (a few milliseconds), a sleeping one at once, and a queued one
//! leaves its queue at once. Nothing is checked per loop iteration beyond
//! what the time limit already costs.
//!
//! The first cause given wins, so a job cancelled by its owner and then
//! abandoned by its client still reports that its owner cancelled it.

use std::sync::{Arc, OnceLock};

use tokio_util::sync::CancellationToken;

use crate::proto::CancelCause;

/// A cancellation handle for one job; cheap to clone, all clones alike.
#[derive(Clone, Debug, Default)]
pub struct Cancel {
    token: CancellationToken,
    cause: Arc<OnceLock<CancelCause>>,
}

impl Cancel {
    /// A handle nobody has cancelled yet.
    pub fn new() -> Cancel {
        Cancel::default()
    }

    /// Cancels the job for `cause` (ignored if it was cancelled already).
    pub fn cancel(&self, cause: CancelCause) {
        let _ = self.cause.set(cause);
        self.token.cancel();
    }

    /// Whether the job was cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Why it was cancelled, once it was.
    pub fn cause(&self) -> Option<CancelCause> {
        self.cause.get().copied()
    }

    /// Resolves when the job is cancelled; returns the cause.
    pub async fn cancelled(&self) -> CancelCause {
        self.token.cancelled().await;
        self.cause().unwrap_or(CancelCause::ClientGone)
    }

    /// A guard that cancels the job for `cause` when dropped, unless
    /// [`disarm`](CancelOnDrop::disarm)ed first: how a job learns that the
    /// future (or HTTP request) that was waiting for it went away.
    pub fn on_drop(&self, cause: CancelCause) -> CancelOnDrop {
        CancelOnDrop {
            cancel: Some(self.clone()),
            cause,
        }
    }
}

/// Cancels a job when dropped; see [`Cancel::on_drop`].
#[must_use = "the job is cancelled as soon as the guard is dropped"]
pub struct CancelOnDrop {
    cancel: Option<Cancel>,
    cause: CancelCause,
}

impl CancelOnDrop {
    /// The waiter got its answer: dropping the guard now cancels nothing.
    pub fn disarm(mut self) {
        self.cancel = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(c) = self.cancel.take() {
            c.cancel(self.cause);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_first_cause_wins_and_guards_cancel_unless_disarmed() {
        let c = Cancel::new();
        assert!(!c.is_cancelled());
        c.on_drop(CancelCause::ClientGone).disarm();
        assert!(!c.is_cancelled(), "a disarmed guard cancels nothing");
        c.cancel(CancelCause::Owner);
        drop(c.on_drop(CancelCause::ClientGone));
        assert_eq!(c.cancelled().await, CancelCause::Owner);
        let d = Cancel::new();
        drop(d.clone().on_drop(CancelCause::Shutdown));
        assert_eq!(d.cause(), Some(CancelCause::Shutdown));
    }
}
