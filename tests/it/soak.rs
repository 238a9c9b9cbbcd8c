//! The host's memory under load: 8 submitters at once send `memhog` jobs
//! with random sizes and random memory requests (some too small) to two
//! workers of 256 MiB, then tens of thousands of trivial jobs. Every job is
//! accounted for, no worker ever reserved more than its capacity, no
//! worker's resident memory ever went far beyond it, and RSS does not grow
//! with the number of jobs.
//!
//! Sizes are bounded for CI; `PEERWASM_SOAK=N` multiplies them (e.g. 10 for
//! a ten times longer soak).

use std::time::Duration;

use peerwasm::client::{Job, MapConfig, MapItem, Target, map};
use peerwasm::proto::Outcome;
use rand::{Rng, SeedableRng};

use crate::pool::{alive, wait_for};
use crate::support::{MIB, WorkerProcess};

fn scale() -> usize {
    std::env::var("PEERWASM_SOAK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .max(1)
}

/// A line of /proc/PID/status, in bytes.
fn proc_status_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"));
    kib * 1024
}

#[tokio::test(flavor = "multi_thread")]
async fn eight_submitters_never_overcommit_a_worker_and_rss_does_not_grow_with_jobs() {
    let capacity = 256 * MIB;
    let a = WorkerProcess::start("256MiB", 2, None);
    let b = WorkerProcess::start("256MiB", 2, Some(&a.addr));
    wait_for(&a.addr, Duration::from_secs(10), |v| alive(v) == 2).await;
    let memhog = Job::new(peerwasm_testkit::guest_wasm_bytes("memhog"));

    // Phase 1: 8 submitters, each its own client, memhog of 1..=48 MiB with
    // requests of 8..=96 MiB: some jobs fit, some exceed their request.
    let per_submitter = 40 * scale();
    let mut tasks = Vec::new();
    for s in 0..8u64 {
        let (seeds, job) = (vec![a.addr.clone(), b.addr.clone()], memhog.clone());
        tasks.push(tokio::spawn(async move {
            let target = Target::pool(seeds).unwrap();
            let mut rng = rand::rngs::SmallRng::seed_from_u64(s);
            let mut outcomes = Vec::new();
            for _ in 0..per_submitter {
                let (mib, asked) = (
                    rng.random_range(1..=48u64),
                    rng.random_range(8..=96u64) * MIB,
                );
                let r = target
                    .run(&job, job.spec(mib.to_string().into_bytes(), asked))
                    .await
                    .unwrap();
                outcomes.push((mib, asked, r));
            }
            outcomes
        }));
    }
    let (mut ok, mut over) = (0, 0);
    for t in tasks {
        for (mib, asked, r) in t.await.unwrap() {
            match &r.outcome {
                Outcome::Exited { code: 0 } => {
                    ok += 1;
                    assert!(
                        r.peak_memory_bytes <= asked,
                        "a job peaked above its limit: {r:?}"
                    );
                    assert!(mib * MIB <= asked, "{mib} MiB cannot fit in {asked}");
                }
                Outcome::MemoryLimitExceeded {
                    limit, requested, ..
                } => {
                    over += 1;
                    assert_eq!(*limit, asked);
                    assert!(requested > limit);
                    // A job well within its request must not fail.
                    assert!(
                        (mib + 8) * MIB > asked,
                        "memhog {mib} MiB failed in {asked}: {}",
                        r.outcome
                    );
                }
                other => panic!("memhog {mib} MiB in {asked}: {other}"),
            }
        }
    }
    let total = 8 * per_submitter;
    assert_eq!(ok + over, total);
    assert!(
        ok > 0 && over > 0,
        "the mix should have both outcomes: {ok} ok, {over} over"
    );

    // Every job accounted for, nothing ever overcommitted, host memory
    // bounded by the ledger (the peak RSS of each worker process).
    // (Adverts are refreshed every gossip round: wait for the last one.)
    let views = wait_for(&a.addr, Duration::from_secs(5), |v| {
        v.iter().map(|p| p.advert.jobs_run).sum::<u64>() == total as u64
    })
    .await;
    for p in &views {
        assert!(
            p.advert.reserved_high_water_bytes <= p.advert.capacity_bytes,
            "{p:?}"
        );
        assert_eq!(
            p.advert.reserved_bytes, 0,
            "reservations left behind: {p:?}"
        );
    }
    for w in [&a, &b] {
        let peak_rss = proc_status_bytes(w.child.id(), "VmHWM:");
        assert!(
            peak_rss <= capacity + 96 * MIB,
            "worker {} peaked at {} MiB resident",
            w.addr,
            peak_rss / MIB
        );
    }

    // Phase 2: RSS across trivial jobs: 10,000 to warm up, then two
    // batches of 10,000 more, one of which must not grow it beyond a small
    // bound. A leak grows both (1 KiB per job would add 10 MiB to each);
    // a busy machine's noise (allocator arenas, a stack touched deeper)
    // does not repeat, so one quiet batch of two is asked, not every one.
    let hello = Job::new(peerwasm_testkit::guest_wasm_bytes("hello"));
    let target = Target::pool(vec![a.addr.clone()]).unwrap();
    let config = MapConfig {
        mem: Some((16 * MIB).into()),
        ..MapConfig::default()
    };
    let addrs = [a.addr.clone(), b.addr.clone()];
    let run_many = |n: usize| {
        let (target, hello, config, addrs) = (&target, &hello, &config, &addrs);
        async move {
            let mut items: Vec<MapItem> = Vec::new();
            let s = map(
                target,
                hello,
                (0..n).map(|_| Vec::new()),
                config,
                &mut items,
            )
            .await
            .unwrap();
            assert_eq!((s.jobs, s.failed), (n as u64, 0));
            assert!(items.iter().all(|i| addrs.contains(&i.result.peer)));
        }
    };
    let jobs = 10_000 * scale();
    let rss =
        || proc_status_bytes(a.child.id(), "VmRSS:") + proc_status_bytes(b.child.id(), "VmRSS:");
    run_many(jobs).await;
    let before = rss();
    run_many(jobs).await;
    let middle = rss();
    run_many(jobs).await;
    let after = rss();
    let mib = |b: u64| b as f64 / MIB as f64;
    println!(
        "RSS of both workers: {:.1} MiB, then {:.1} MiB and {:.1} MiB after two batches of {jobs} trivial jobs",
        mib(before),
        mib(middle),
        mib(after)
    );
    let quietest = middle
        .saturating_sub(before)
        .min(after.saturating_sub(middle));
    assert!(
        quietest < 4 * MIB,
        "RSS grew in both batches of {jobs} jobs: {:.1} MiB → {:.1} MiB → {:.1} MiB",
        mib(before),
        mib(middle),
        mib(after)
    );
}
