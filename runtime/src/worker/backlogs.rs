//! [`Backlogs`]: the maps that report their backlog to this worker
//! (`POST /v1/backlog`), which it gossips in its advert so that the pool
//! view shows demand, not only what is in flight (`proto::backlog`).
//!
//! What a worker holds for others is bounded: a report is a few dozen
//! bytes, one tenant keeps at most [`PER_TENANT`] maps here and all
//! tenants together [`MAX_BACKLOGS`]; a report counts for
//! [`BACKLOG_TTL_MS`] unless renewed, so a client that dies stops counting
//! within a few gossip rounds. A tenant's reports replace only its own
//! (entries are keyed by tenant and map id).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::proto::backlog::{BACKLOG_TTL_MS, Backlog, MAX_BACKLOGS};

/// The most maps one tenant may report to one worker at once.
pub const PER_TENANT: usize = 16;

/// Why a report was not kept.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// The report is not one a client could have sent.
    Invalid(String),
    /// The tenant, or the worker, holds as many as it may.
    Full(String),
}

/// The reports this worker holds, each until it expires.
#[derive(Default)]
pub struct Backlogs {
    entries: Mutex<HashMap<(String, String), (Backlog, Instant)>>,
}

impl Backlogs {
    /// Keeps `tenant`'s report (replacing its earlier one of the same map);
    /// an empty report ends the map's entry.
    pub fn report(&self, tenant: &str, backlog: Backlog) -> Result<(), Refused> {
        backlog.check().map_err(Refused::Invalid)?;
        let now = Instant::now();
        let mut entries = self.entries.lock();
        expire(&mut entries, now);
        let key = (tenant.to_string(), backlog.id.clone());
        if backlog.is_empty() {
            entries.remove(&key);
            return Ok(());
        }
        if !entries.contains_key(&key) {
            if entries.keys().filter(|(t, _)| t == tenant).count() >= PER_TENANT {
                return Err(Refused::Full(format!(
                    "a tenant may report at most {PER_TENANT} maps to one worker"
                )));
            }
            if entries.len() >= MAX_BACKLOGS {
                return Err(Refused::Full(format!(
                    "this worker holds {MAX_BACKLOGS} maps' backlogs: report to another"
                )));
            }
        }
        entries.insert(key, (backlog, now + Duration::from_millis(BACKLOG_TTL_MS)));
        Ok(())
    }

    /// The reports that still count, as the advert carries them.
    pub fn current(&self) -> Vec<Backlog> {
        let mut entries = self.entries.lock();
        expire(&mut entries, Instant::now());
        let mut out: Vec<Backlog> = entries.values().map(|(b, _)| b.clone()).collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }
}

fn expire(entries: &mut HashMap<(String, String), (Backlog, Instant)>, now: Instant) {
    entries.retain(|_, (_, until)| *until > now);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(id: &str, waiting: u64) -> Backlog {
        Backlog {
            id: id.into(),
            waiting,
            running: 1,
            memory_bytes: 1 << 20,
            largest_bytes: 1 << 20,
            job_ms: 500,
        }
    }

    #[test]
    fn a_report_replaces_the_maps_last_and_an_empty_one_ends_it() {
        let backlogs = Backlogs::default();
        backlogs.report("alice", b("m1", 10)).unwrap();
        backlogs.report("alice", b("m1", 7)).unwrap();
        backlogs.report("bob", b("m1", 3)).unwrap();
        let waiting: Vec<u64> = backlogs.current().iter().map(|b| b.waiting).collect();
        assert_eq!(waiting.len(), 2, "bob's m1 is not alice's: {waiting:?}");
        assert!(waiting.contains(&7) && waiting.contains(&3));
        backlogs
            .report(
                "alice",
                Backlog {
                    waiting: 0,
                    running: 0,
                    ..b("m1", 0)
                },
            )
            .unwrap();
        assert_eq!(backlogs.current().len(), 1);
    }

    #[test]
    fn a_tenant_holds_a_bounded_number_and_forgeries_none() {
        let backlogs = Backlogs::default();
        for i in 0..PER_TENANT {
            backlogs.report("alice", b(&format!("m{i}"), 1)).unwrap();
        }
        assert!(matches!(
            backlogs.report("alice", b("one-more", 1)),
            Err(Refused::Full(_))
        ));
        backlogs
            .report("alice", b("m0", 2))
            .expect("renewing one it has is fine");
        backlogs
            .report("bob", b("m0", 1))
            .expect("another tenant has its own share");
        assert!(matches!(
            backlogs.report("bob", b("", 1)),
            Err(Refused::Invalid(_))
        ));
    }

    #[test]
    fn a_report_not_renewed_stops_counting() {
        let backlogs = Backlogs::default();
        backlogs.report("alice", b("m1", 10)).unwrap();
        // Age it past its time, as a dead client's would.
        for (_, until) in backlogs.entries.lock().values_mut() {
            *until = Instant::now() - Duration::from_millis(1);
        }
        assert!(backlogs.current().is_empty());
    }
}
