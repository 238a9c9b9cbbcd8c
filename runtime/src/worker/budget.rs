//! Bytes the worker holds *for requests* — bodies being read and decoded,
//! manifests — charged before they are held, to the one who caused them
//! and to the worker's memory. (A job request's charge ends when its jobs
//! are queued: their specs are then the queue's, bounded per tenant by
//! `--max-queued-bytes`, and a job must never wait for memory its own
//! request holds.)
//!
//! The sandbox charges a job's linear memory to the byte; this module does
//! the same for what surrounds jobs. Every [`Charge`] is counted twice:
//!
//! * against its **payer's budget**: a tenant may have at most
//!   `per_tenant` bytes of requests held at once (`--max-request-bytes`);
//!   a caller who has not authenticated (a gossip peer, a stranger) is
//!   charged to its **address**, at most [`UNAUTHENTICATED_PER_ADDRESS`],
//!   and all such callers together to [`UNAUTHENTICATED_TOTAL`]; a peer
//!   whose gossip proved it knows the pool's key before its body was read
//!   is charged apart ([`PEER_PER_ADDRESS`]), so strangers cannot use up
//!   what the pool's own gossip needs;
//! * against the **worker's memory ledger**, as a [`Hold`] beside jobs'
//!   reservations and output, so request bytes shrink what the worker
//!   offers instead of pushing the host past it. A worker whose memory is
//!   all reserved by running jobs still takes requests (jobs queue while
//!   others run): up to [`OVERDRAFT`] bytes worker-wide may be held past
//!   the ledger's room. That, and the unauthenticated total, are the fixed
//!   overhead above `--memory` that requests can ever cost.
//!
//! A charge that does not fit is refused at once (the caller gets 503 and
//! tries later or elsewhere); nothing waits for room, so a flood cannot
//! queue up memory either.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use parking_lot::Mutex;

use super::ledger::{Hold, Ledger};
use crate::units::Bytes as Size;

/// Bytes of requests one tenant may have held at once unless
/// `--max-request-bytes` says otherwise: one batch request at its largest.
pub const DEFAULT_MAX_REQUEST_BYTES: u64 = 256 << 20;

/// Bytes all unauthenticated callers' bodies (gossip) may hold at once.
pub const UNAUTHENTICATED_TOTAL: u64 = 16 << 20;

/// Bytes the unauthenticated bodies from one address may hold at once.
pub const UNAUTHENTICATED_PER_ADDRESS: u64 = 4 << 20;

/// Bytes the gossip of keyed peers at one address may hold at once (two
/// messages at their largest).
pub const PEER_PER_ADDRESS: u64 = 2 * crate::gossip::MAX_MESSAGE_BYTES as u64;

/// Bytes of requests held past the ledger's room, worker-wide, so that a
/// worker whose memory is all reserved still queues jobs.
pub const OVERDRAFT: u64 = 16 << 20;

/// Who pays for a request's bytes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Payer {
    /// An authenticated tenant (or the one tenant of a worker without
    /// `--tenants`), by name.
    Tenant(String),
    /// A caller not (yet) authenticated, by its address.
    Address(IpAddr),
    /// A peer whose gossip's head proved it knows the pool's key, by its
    /// address: charged apart from strangers, so that strangers filling
    /// their budget do not starve the pool's own gossip.
    Peer(IpAddr),
}

impl std::fmt::Display for Payer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Payer::Tenant(t) => write!(f, "tenant {t}"),
            Payer::Address(a) => write!(f, "address {a}"),
            Payer::Peer(a) => write!(f, "peer {a}"),
        }
    }
}

/// Why a charge was refused: shown to the caller (a 503).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChargeRefused {
    /// The payer's own budget is used up.
    #[error(
        "this worker holds {held} for your requests already (at most {limit} at once): try again when some have been answered"
    )]
    Payer { held: Size, limit: Size },
    /// All unauthenticated callers together are at their budget.
    #[error("this worker holds {0} of unauthenticated requests already: try again later")]
    Strangers(Size),
    /// The worker's memory has no room, and the overdraft is used up.
    #[error("this worker has no memory free to hold the request now: try again later or elsewhere")]
    Memory,
}

#[derive(Default)]
struct State {
    by_payer: HashMap<Payer, u64>,
    /// Held by all `Payer::Address` payers together.
    strangers: u64,
    /// Held past the ledger's room.
    overdraft: u64,
}

/// The budgets of everyone who sends the worker requests.
pub struct RequestBudgets {
    ledger: Arc<Ledger>,
    per_tenant: u64,
    state: Mutex<State>,
}

impl RequestBudgets {
    /// Budgets charging `ledger`, each tenant at most `per_tenant` bytes.
    pub fn new(ledger: Arc<Ledger>, per_tenant: u64) -> Arc<RequestBudgets> {
        Arc::new(RequestBudgets {
            ledger,
            per_tenant,
            state: Mutex::new(State::default()),
        })
    }

    /// A charge of nothing yet, for `payer`.
    pub fn charge(self: &Arc<Self>, payer: Payer) -> Charge {
        Charge {
            budgets: self.clone(),
            payer,
            bytes: 0,
            overdraft: 0,
            hold: self.ledger.hold(super::ledger::HoldKind::Request),
        }
    }

    /// The most `payer` may hold at once.
    pub fn limit_of(&self, payer: &Payer) -> u64 {
        match payer {
            Payer::Tenant(_) => self.per_tenant,
            Payer::Address(_) => UNAUTHENTICATED_PER_ADDRESS,
            Payer::Peer(_) => PEER_PER_ADDRESS,
        }
    }

    /// Bytes `payer` holds now.
    #[cfg(test)]
    pub fn held_by(&self, payer: &Payer) -> u64 {
        self.state.lock().by_payer.get(payer).copied().unwrap_or(0)
    }

    /// Bytes held for requests now, by everyone.
    #[cfg(test)]
    pub fn held(&self) -> u64 {
        self.state.lock().by_payer.values().sum()
    }
}

/// Bytes held for one request, charged to its payer and to the worker's
/// memory; given back when dropped (or [`shrink_to`](Self::shrink_to)).
pub struct Charge {
    budgets: Arc<RequestBudgets>,
    payer: Payer,
    bytes: u64,
    /// Of `bytes`, those held past the ledger's room.
    overdraft: u64,
    hold: Hold,
}

impl Charge {
    /// Bytes charged now.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Charges `n` more bytes, or refuses them (charging nothing).
    pub fn grow(&mut self, n: u64) -> Result<(), ChargeRefused> {
        if n == 0 {
            return Ok(());
        }
        let b = &*self.budgets;
        let limit = b.limit_of(&self.payer);
        let mut st = b.state.lock();
        let held = st.by_payer.get(&self.payer).copied().unwrap_or(0);
        if held.saturating_add(n) > limit {
            return Err(ChargeRefused::Payer {
                held: Size(held),
                limit: Size(limit),
            });
        }
        let stranger = matches!(self.payer, Payer::Address(_));
        if stranger && st.strangers.saturating_add(n) > UNAUTHENTICATED_TOTAL {
            return Err(ChargeRefused::Strangers(Size(st.strangers)));
        }
        // The ledger first; past its room, the overdraft.
        let over = if self.hold.try_grow(n, false) {
            0
        } else if st.overdraft.saturating_add(n) <= OVERDRAFT {
            n
        } else {
            return Err(ChargeRefused::Memory);
        };
        st.overdraft += over;
        if stranger {
            st.strangers += n;
        }
        *st.by_payer.entry(self.payer.clone()).or_insert(0) += n;
        self.overdraft += over;
        self.bytes += n;
        Ok(())
    }

    /// Gives back all but `keep` bytes.
    pub fn shrink_to(&mut self, keep: u64) {
        let n = self.bytes.saturating_sub(keep);
        if n == 0 {
            return;
        }
        let mut st = self.budgets.state.lock();
        // The overdraft goes back first: it is the scarcer.
        let over = n.min(self.overdraft);
        st.overdraft -= over;
        self.overdraft -= over;
        self.hold
            .shrink_to(self.hold.bytes().saturating_sub(n - over));
        if matches!(self.payer, Payer::Address(_)) {
            st.strangers -= n;
        }
        if let Some(held) = st.by_payer.get_mut(&self.payer) {
            *held -= n;
            if *held == 0 {
                st.by_payer.remove(&self.payer);
            }
        }
        self.bytes -= n;
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.shrink_to(0);
        // `hold` gives its bytes back to the ledger as it drops.
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::ledger::{FakeMemory, LedgerConfig};

    const MIB: u64 = 1 << 20;

    fn budgets(capacity: u64, per_tenant: u64) -> Arc<RequestBudgets> {
        let config = LedgerConfig {
            memory: Some(capacity),
            reserve: 0,
            ..LedgerConfig::default()
        };
        let ledger = Ledger::with_host(&config, Box::new(FakeMemory::new(64 << 30, 64 << 30)));
        RequestBudgets::new(ledger, per_tenant)
    }

    #[test]
    fn a_tenant_is_held_to_its_budget_and_gets_it_back() {
        let b = budgets(1 << 30, 10 * MIB);
        let alice = Payer::Tenant("alice".into());
        let mut one = b.charge(alice.clone());
        one.grow(6 * MIB).unwrap();
        let mut two = b.charge(alice.clone());
        assert!(matches!(
            two.grow(6 * MIB),
            Err(ChargeRefused::Payer { .. })
        ));
        assert_eq!(b.held_by(&alice), 6 * MIB, "a refused charge holds nothing");
        // Another tenant is not charged for alice.
        b.charge(Payer::Tenant("bob".into()))
            .grow(10 * MIB)
            .unwrap();
        drop(one);
        assert_eq!(b.held_by(&alice), 0);
        two.grow(10 * MIB).unwrap();
        two.shrink_to(MIB);
        assert_eq!(b.held_by(&alice), MIB);
        assert_eq!(b.ledger.snapshot().held, MIB);
    }

    #[test]
    fn strangers_share_a_small_budget_per_address_and_in_all() {
        let b = budgets(1 << 30, 1 << 30);
        let addr = |i: u8| Payer::Address(IpAddr::from([127, 0, 0, i]));
        let mut held = Vec::new();
        for i in 1..=4 {
            let mut c = b.charge(addr(i));
            c.grow(UNAUTHENTICATED_PER_ADDRESS).unwrap();
            assert!(matches!(c.grow(1), Err(ChargeRefused::Payer { .. })));
            held.push(c);
        }
        assert_eq!(
            held.len() as u64 * UNAUTHENTICATED_PER_ADDRESS,
            UNAUTHENTICATED_TOTAL
        );
        assert!(matches!(
            b.charge(addr(5)).grow(1),
            Err(ChargeRefused::Strangers(_))
        ));
        held.pop();
        b.charge(addr(5)).grow(1).unwrap();
    }

    #[test]
    fn past_the_ledger_only_the_overdraft_is_taken() {
        let b = budgets(64 * MIB, 1 << 30);
        let alice = Payer::Tenant("alice".into());
        let mut a = b.charge(alice.clone());
        a.grow(64 * MIB).unwrap();
        assert_eq!(
            b.ledger.offer(),
            0,
            "request bytes come out of what the worker offers"
        );
        let mut over = b.charge(alice.clone());
        over.grow(OVERDRAFT).unwrap();
        assert_eq!(over.grow(1), Err(ChargeRefused::Memory));
        drop(a);
        // The overdraft is given back first; the ledger takes the rest.
        over.grow(MIB).unwrap();
        over.shrink_to(MIB);
        assert_eq!(b.held(), MIB);
        drop(over);
        assert_eq!(b.ledger.snapshot().held, 0);
        assert_eq!(b.state.lock().overdraft, 0);
    }
}
