//! Best-fit placement: among live peers whose largest-fitting job is at
//! least the request, the one with the least memory to spare (HTCondor's
//! default rank, and FieldTrip's peerfeval); ties go to the shorter queue.
//! Adverts are hints — a worker may still refuse, and the client then tries
//! the next candidate.

use crate::gossip::Liveness;
use crate::gossip::PeerView;
use crate::proto::MemoryRequest;
use crate::units::Bytes;

/// Why no peer can take a job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NoPlace {
    /// No live, non-draining peer is in the view (perhaps only for now).
    NoLivePeer,
    /// The job is larger than any live peer could ever hold; says so, with
    /// the largest the pool can take.
    NeverFits(String),
}

impl std::fmt::Display for NoPlace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NoPlace::NoLivePeer => f.write_str("no live peer in the pool"),
            NoPlace::NeverFits(why) => f.write_str(why),
        }
    }
}

/// The largest job any live peer of the view could ever hold (its
/// capacity, or the most one job may have there if less:
/// [`Advert::largest_job`](crate::proto::Advert::largest_job)).
pub fn largest_job(peers: &[PeerView]) -> u64 {
    live(peers)
        .map(|p| p.advert.largest_job())
        .max()
        .unwrap_or(0)
}

fn live(peers: &[PeerView]) -> impl Iterator<Item = &PeerView> {
    peers
        .iter()
        .filter(|p| p.liveness == Liveness::Alive && !p.advert.draining)
}

/// The peers that allow a job asking for a time limit of `timeout_ms`
/// (each worker's `--max-job-time`); every peer allows a job that asks for
/// none (it runs under the worker's limit). When no live peer allows it,
/// says so, naming the longest any allows.
///
/// A peer whose batch job ends before such a job could finish
/// ([`Advert::ends_at_ms`](crate::proto::Advert::ends_at_ms), from `now_ms`)
/// is left out too, but that is no error: another worker may join.
pub fn allowing_time(
    peers: Vec<PeerView>,
    timeout_ms: Option<u64>,
    now_ms: u64,
) -> Result<Vec<PeerView>, NoPlace> {
    let Some(asked) = timeout_ms else {
        return Ok(peers);
    };
    let allows = |p: &PeerView| p.advert.max_job_time_ms.is_none_or(|max| asked <= max);
    let lasts = |p: &PeerView| {
        p.advert
            .ends_at_ms
            .is_none_or(|end| now_ms.saturating_add(asked) <= end)
    };
    if live(&peers).next().is_none() || live(&peers).any(allows) {
        return Ok(peers
            .into_iter()
            .filter(|p| allows(p) && lasts(p))
            .collect());
    }
    let longest = live(&peers)
        .filter_map(|p| p.advert.max_job_time_ms)
        .max()
        .unwrap_or(0);
    let fmt =
        |ms: u64| humantime::format_duration(std::time::Duration::from_millis(ms)).to_string();
    Err(NoPlace::NeverFits(format!(
        "no worker runs jobs for {}: the longest any allows is {} (their --max-job-time)",
        fmt(asked),
        fmt(longest)
    )))
}

/// The addresses to try for a job that asks `request`, best first; or why
/// no peer can take it.
pub fn candidates(
    peers: &[PeerView],
    request: impl Into<MemoryRequest>,
) -> Result<Vec<String>, NoPlace> {
    let asked = request.into().bytes();
    let live: Vec<&PeerView> = live(peers).collect();
    if live.is_empty() {
        return Err(NoPlace::NoLivePeer);
    }
    let largest_ever = largest_job(peers);
    if asked > largest_ever {
        // Say so when the largest is less than that worker's memory (what
        // it keeps beside each job, or its most per job): else 288 MiB
        // from a worker of 300 MiB reads as a mistake.
        let beside = live
            .iter()
            .find(|p| {
                p.advert.largest_job() == largest_ever && largest_ever < p.advert.capacity_bytes
            })
            .map(|p| {
                format!(
                    " (a worker of {} takes jobs of up to {}: its memory less what it keeps \
                     beside each job, its most per job, or the detached jobs' results it keeps)",
                    Bytes(p.advert.capacity_bytes),
                    Bytes(largest_ever)
                )
            })
            .unwrap_or_default();
        return Err(NoPlace::NeverFits(format!(
            "no peer can hold a job of {}: the largest the pool can take is {}{beside}",
            Bytes(asked),
            Bytes(largest_ever)
        )));
    }
    let mut fitting: Vec<&PeerView> = live
        .iter()
        .copied()
        .filter(|p| p.advert.fits_now(asked))
        .collect();
    fitting.sort_by_key(|p| {
        (
            p.advert.largest_fit_bytes - asked,
            p.advert.queue_len,
            p.advert.addr.clone(),
        )
    });
    // Peers that could hold it but are full now come last, emptiest
    // queue first: they may have room by the time the request arrives.
    let mut busy: Vec<&PeerView> = live
        .iter()
        .copied()
        .filter(|p| !p.advert.fits_now(asked) && p.advert.could_ever_fit(asked))
        .collect();
    busy.sort_by_key(|p| (p.advert.queue_len, p.advert.capacity_bytes - asked));
    Ok(fitting
        .into_iter()
        .chain(busy)
        .map(|p| p.advert.addr.clone())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gossip::NodeId;
    use crate::proto::Advert;

    const GIB: u64 = 1 << 30;

    fn peer(addr: &str, capacity: u64, fit: u64, queue: u32, liveness: Liveness) -> PeerView {
        PeerView {
            id: NodeId::new(addr, 1),
            advert: Advert {
                addr: addr.into(),
                capacity_bytes: capacity,
                largest_fit_bytes: fit,
                queue_len: queue,
                ..Advert::default()
            },
            liveness,
            last_heard_ms: 0,
            vouched: true,
        }
    }

    #[test]
    fn best_fit_then_queue_then_busy() {
        let peers = [
            peer("big", 8 * GIB, 8 * GIB, 0, Liveness::Alive),
            peer("small", 2 * GIB, 2 * GIB, 0, Liveness::Alive),
            peer("mid", 4 * GIB, 4 * GIB, 3, Liveness::Alive),
            peer("mid2", 4 * GIB, 4 * GIB, 1, Liveness::Alive),
            peer("full", 16 * GIB, 0, 0, Liveness::Alive),
            peer("dead", 64 * GIB, 64 * GIB, 0, Liveness::Dead),
            PeerView {
                advert: Advert {
                    draining: true,
                    ..peer("leaving", 64 * GIB, 64 * GIB, 0, Liveness::Alive).advert
                },
                ..peer("leaving", 64 * GIB, 64 * GIB, 0, Liveness::Alive)
            },
        ];
        assert_eq!(
            candidates(&peers, GIB).unwrap(),
            ["small", "mid2", "mid", "big", "full"]
        );
        assert_eq!(candidates(&peers, 6 * GIB).unwrap(), ["big", "full"]);
        let err = candidates(&peers, 32 * GIB).unwrap_err().to_string();
        assert!(err.contains("largest the pool can take is 16 GiB"), "{err}");
        assert_eq!(
            candidates(&peers[5..], GIB).unwrap_err(),
            NoPlace::NoLivePeer
        );
        assert_eq!(largest_job(&peers), 16 * GIB);
    }

    #[test]
    fn the_most_one_job_may_have_bounds_placement_as_the_capacity_does() {
        // 22 GiB lent, but a wasm32 job addresses at most 4 GiB there.
        let ceiling = |addr: &str, capacity: u64, fit: u64| PeerView {
            advert: Advert {
                max_job_bytes: Some(4 * GIB),
                ..peer(addr, capacity, fit, 0, Liveness::Alive).advert
            },
            ..peer(addr, capacity, fit, 0, Liveness::Alive)
        };
        let peers = [
            ceiling("wide", 22 * GIB, 4 * GIB),
            ceiling("busy", 22 * GIB, 0),
        ];
        let err = candidates(&peers, 8 * GIB).unwrap_err();
        assert_eq!(
            err,
            NoPlace::NeverFits(
                "no peer can hold a job of 8 GiB: the largest the pool can take is 4 GiB \
                 (a worker of 22 GiB takes jobs of up to 4 GiB: its memory less what it keeps \
                 beside each job, its most per job, or the detached jobs' results it keeps)"
                    .into()
            ),
            "never placed where it would be rejected"
        );
        assert_eq!(candidates(&peers, 3 * GIB).unwrap(), ["wide", "busy"]);
        assert_eq!(largest_job(&peers), 4 * GIB);
        assert!(peers[0].advert.check().is_ok());
        let overoffered = Advert {
            largest_fit_bytes: 5 * GIB,
            ..peers[0].advert.clone()
        };
        assert!(
            overoffered.check().is_err(),
            "offers more than a job may have"
        );
    }

    #[test]
    fn what_warm_starts_keep_does_not_shrink_the_largest_job() {
        // 97 MiB of snapshots on a 1 GiB worker: a job of the whole GiB is
        // still placed there (the worker lets the snapshots go for it),
        // after the peers it fits beside theirs.
        const MIB: u64 = 1 << 20;
        let warm = |addr: &str, capacity: u64, warm: u64| PeerView {
            advert: Advert {
                warm_bytes: warm,
                ..peer(addr, capacity, capacity - warm, 0, Liveness::Alive).advert
            },
            ..peer(addr, capacity, capacity - warm, 0, Liveness::Alive)
        };
        let peers = [warm("warm", GIB, 97 * MIB), warm("cold", 960 * MIB, 0)];
        assert_eq!(largest_job(&peers), GIB);
        assert_eq!(peers[0].advert.largest_beside_warm(), GIB - 97 * MIB);
        assert_eq!(candidates(&peers, GIB).unwrap(), ["warm"]);
        assert_eq!(candidates(&peers, 950 * MIB).unwrap(), ["cold", "warm"]);
        assert!(peers[0].advert.check().is_ok());
        let overheld = Advert {
            warm_bytes: 2 * GIB,
            ..peers[0].advert.clone()
        };
        assert!(overheld.check().is_err(), "holds more than it has");
    }

    #[test]
    fn a_time_limit_goes_only_where_it_is_allowed() {
        let limited = |addr: &str, max: Option<u64>| PeerView {
            advert: Advert {
                max_job_time_ms: max,
                ..peer(addr, GIB, GIB, 0, Liveness::Alive).advert
            },
            ..peer(addr, GIB, GIB, 0, Liveness::Alive)
        };
        let peers = vec![
            limited("short", Some(60_000)),
            limited("long", Some(3_600_000)),
            limited("free", None),
        ];
        let addrs = |v: Vec<PeerView>| v.into_iter().map(|p| p.advert.addr).collect::<Vec<_>>();
        assert_eq!(
            addrs(allowing_time(peers.clone(), None, 0).unwrap()),
            ["short", "long", "free"]
        );
        assert_eq!(
            addrs(allowing_time(peers.clone(), Some(600_000), 0).unwrap()),
            ["long", "free"]
        );
        let capped = peers[..2].to_vec();
        let err = allowing_time(capped, Some(7_200_000), 0)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no worker runs jobs for 2h") && err.contains("longest any allows is 1h"),
            "{err}"
        );
    }

    #[test]
    fn a_worker_whose_batch_job_ends_first_gets_no_job_that_would_outlast_it() {
        let ending = |addr: &str, ends_at_ms: Option<u64>| PeerView {
            advert: Advert {
                ends_at_ms,
                ..peer(addr, GIB, GIB, 0, Liveness::Alive).advert
            },
            ..peer(addr, GIB, GIB, 0, Liveness::Alive)
        };
        let now = 1_000_000;
        let peers = vec![
            ending("soon", Some(now + 60_000)),
            ending("later", Some(now + 3_600_000)),
            ending("never", None),
        ];
        let addrs = |v: Vec<PeerView>| v.into_iter().map(|p| p.advert.addr).collect::<Vec<_>>();
        assert_eq!(
            addrs(allowing_time(peers.clone(), Some(600_000), now).unwrap()),
            ["later", "never"]
        );
        assert_eq!(
            addrs(allowing_time(peers.clone(), None, now).unwrap()),
            ["soon", "later", "never"],
            "no limit stated"
        );
        // Only ending workers: none now, but that is a wait, not an error.
        assert!(
            allowing_time(peers[..1].to_vec(), Some(600_000), now)
                .unwrap()
                .is_empty()
        );
    }
}
