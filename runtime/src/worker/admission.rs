//! Admission: a job starts when a slot is free and its memory fits the
//! ledger; otherwise it waits in a bounded queue, and a full queue is
//! refused at once (the client then tries another peer). A job that could
//! never fit is refused at once with the largest this worker can take.
//!
//! Waiting jobs are woken when a job ends, and re-check at least every
//! [`RECHECK`] because host memory can free up without any job ending.
//! (Fair share between tenants replaces first-come order here later.)

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use super::ledger::{Ledger, Reservation};

/// How often a waiting job re-checks host memory.
pub const RECHECK: Duration = Duration::from_millis(250);

/// Why a job was not admitted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// It asks for more than this worker could ever give.
    NeverFits { requested: u64, largest: u64 },
    /// The queue is full; try elsewhere or later.
    Busy,
}

/// Slots and queue of one worker.
pub struct Admission {
    ledger: Arc<Ledger>,
    slots: u32,
    max_queue: u32,
    state: Mutex<Counts>,
    changed: Notify,
}

#[derive(Default, Clone, Copy)]
struct Counts {
    busy: u32,
    queued: u32,
}

/// A slot and a memory reservation, held while the job runs.
pub struct Ticket {
    admission: Arc<Admission>,
    /// `Some` until drop.
    reservation: Option<Reservation>,
}

impl Ticket {
    /// The job's memory reservation.
    pub fn reservation(&self) -> &Reservation {
        self.reservation.as_ref().expect("held until drop")
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        // Give the memory back before waking waiters, so they find it.
        drop(self.reservation.take());
        self.admission.lock().busy -= 1;
        self.admission.changed.notify_waiters();
    }
}

impl Admission {
    /// `slots` jobs at once, at most `max_queue` waiting.
    pub fn new(ledger: Arc<Ledger>, slots: u32, max_queue: u32) -> Arc<Admission> {
        Arc::new(Admission { ledger, slots, max_queue, state: Mutex::new(Counts::default()), changed: Notify::new() })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The ledger.
    pub fn ledger(&self) -> &Arc<Ledger> {
        &self.ledger
    }

    /// (slots busy, jobs queued) now.
    pub fn counts(&self) -> (u32, u32) {
        let c = *self.lock();
        (c.busy, c.queued)
    }

    /// The slot count.
    pub fn slots(&self) -> u32 {
        self.slots
    }

    /// Waits for a slot and `memreq` bytes, or refuses.
    pub async fn admit(self: &Arc<Self>, memreq: u64) -> Result<Ticket, Refusal> {
        if memreq > self.ledger.capacity() {
            return Err(Refusal::NeverFits { requested: memreq, largest: self.ledger.capacity() });
        }
        let mut queued = false;
        loop {
            let notified = self.changed.notified();
            {
                let mut c = self.lock();
                if c.busy < self.slots
                    && let Some(reservation) = self.ledger.try_reserve(memreq)
                {
                    c.busy += 1;
                    if queued {
                        c.queued -= 1;
                    }
                    return Ok(Ticket { admission: self.clone(), reservation: Some(reservation) });
                }
                if !queued {
                    if c.queued >= self.max_queue {
                        return Err(Refusal::Busy);
                    }
                    c.queued += 1;
                    queued = true;
                }
            }
            // A dropped (cancelled) waiter must leave the queue.
            let guard = QueuedGuard { admission: self };
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep(RECHECK) => {}
            }
            std::mem::forget(guard);
        }
    }
}

/// Takes a cancelled waiter out of the queue count.
struct QueuedGuard<'a> {
    admission: &'a Admission,
}

impl Drop for QueuedGuard<'_> {
    fn drop(&mut self) {
        self.admission.lock().queued -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::super::ledger::LedgerConfig;
    use super::*;

    const MIB: u64 = 1 << 20;

    #[tokio::test]
    async fn slots_memory_queue_and_refusals() {
        let ledger = Ledger::new(&LedgerConfig { memory: Some(100 * MIB), reserve: 0 }).unwrap();
        let adm = Admission::new(ledger, 2, 1);
        assert_eq!(
            adm.admit(200 * MIB).await.err(),
            Some(Refusal::NeverFits { requested: 200 * MIB, largest: 100 * MIB })
        );
        let a = adm.admit(70 * MIB).await.unwrap();
        // 70 + 50 > 100: waits in the queue.
        let adm2 = adm.clone();
        let waiting = tokio::spawn(async move { adm2.admit(50 * MIB).await.map(|_| ()) });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(adm.counts(), (1, 1));
        // A small job passes the waiting one: a slot is free and it fits.
        drop(adm.admit(10 * MIB).await.expect("10 MiB fits beside 70"));
        // One that does not fit finds the queue (1) full.
        assert_eq!(adm.admit(40 * MIB).await.err(), Some(Refusal::Busy));
        drop(a);
        waiting.await.unwrap().unwrap();
        assert_eq!(adm.counts(), (0, 0));
    }
}
