use super::*;
use crate::proto::backlog::Backlog;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn backlog(reports: &[(u64, u64, u64, u64)]) -> PoolBacklog {
    let reports: Vec<Backlog> = reports
        .iter()
        .enumerate()
        .map(|(i, &(waiting, running, mem, job_ms))| Backlog {
            id: format!("m{i}"),
            waiting,
            running,
            memory_bytes: mem,
            largest_bytes: mem,
            job_ms,
        })
        .collect();
    PoolBacklog::sum(&reports)
}

fn worker(addr: &str, busy: bool, largest: u64) -> PoolWorker {
    PoolWorker {
        addr: addr.into(),
        batch_job: format!("job-{addr}"),
        busy,
        largest_job: largest,
        idle_ms: 0,
    }
}

#[test]
fn the_target_is_the_work_over_the_target_duration_within_bounds() {
    let p = Policy {
        max: 8,
        ..Policy::default()
    };
    // 200 × 0.5 s = 100 slot-s over 5 s: 20 workers, capped at 8.
    assert_eq!(p.target(&backlog(&[(200, 0, 64 * MIB, 500)])), 8);
    // 10 × 0.5 s = 5 s: one worker.
    assert_eq!(p.target(&backlog(&[(10, 0, 64 * MIB, 500)])), 1);
    // Three long jobs: three workers, not more than there are jobs.
    assert_eq!(p.target(&backlog(&[(2, 1, 64 * MIB, 60_000)])), 3);
    // Nothing to do: --min.
    assert_eq!(
        Policy {
            min: 2,
            ..p.clone()
        }
        .target(&PoolBacklog::default()),
        2
    );
    // Job time unknown yet: a second each.
    assert_eq!(p.target(&backlog(&[(20, 0, 64 * MIB, 0)])), 4);
}

#[test]
fn pending_jobs_count_as_capacity_coming_so_a_slow_queue_never_resubmits() {
    let p = Policy::default();
    let b = backlog(&[(200, 0, 64 * MIB, 500)]);
    let mut m = Memory::default();
    let d = p.decide(&b, &[], &[], 0, &mut m, 0);
    assert_eq!(d.submit.len(), 8, "{d:?}");
    assert!(d.why.starts_with("growing by 8"), "{}", d.why);
    // Nothing has started a second later: nothing more is asked for.
    let pending: Vec<String> = (0..8).map(|i| format!("j{i}")).collect();
    for t in [1_000, 5_000, 60_000] {
        let d = p.decide(&b, &[], &pending, 0, &mut m, t);
        assert!(d.submit.is_empty() && d.cancel.is_empty(), "{d:?}");
    }
}

#[test]
fn it_shrinks_only_after_the_idle_period_never_a_busy_worker_nor_below_min() {
    let p = Policy {
        min: 1,
        idle_for: Duration::from_secs(10),
        ..Policy::default()
    };
    let none = PoolBacklog::default();
    let workers = vec![
        worker("a", false, GIB),
        worker("b", true, GIB),
        worker("c", false, GIB),
    ];
    let mut m = Memory::default();
    assert_eq!(
        p.decide(&none, &workers, &[], 0, &mut m, 0),
        Decision {
            target: 1,
            ..Decision::default()
        }
    );
    assert!(
        p.decide(&none, &workers, &[], 0, &mut m, 9_000)
            .cancel
            .is_empty(),
        "not idle long enough"
    );
    let d = p.decide(&none, &workers, &[], 0, &mut m, 10_000);
    // Target 1 (--min), capacity 3: two could go, but b is busy.
    assert_eq!(d.cancel, ["job-a", "job-c"], "{d:?}");
    assert!(
        d.why.starts_with(
            "shrinking by 2: no job waits: the pool wants 1 worker (at least --min 1)"
        ),
        "{}",
        d.why
    );
    // With b idle too, still one is kept.
    let all_idle = vec![
        worker("a", false, GIB),
        worker("b", false, GIB),
        worker("c", false, GIB),
    ];
    let mut m = Memory::default();
    p.decide(&none, &all_idle, &[], 0, &mut m, 0);
    assert_eq!(
        p.decide(&none, &all_idle, &[], 0, &mut m, 20_000)
            .cancel
            .len(),
        2
    );
}

#[test]
fn a_worker_that_just_became_idle_waits_its_turn_and_work_resets_the_clock() {
    let p = Policy {
        idle_for: Duration::from_secs(10),
        ..Policy::default()
    };
    let none = PoolBacklog::default();
    let mut m = Memory::default();
    p.decide(&none, &[worker("a", true, GIB)], &[], 0, &mut m, 0);
    // Idle from 8 s on: at 12 s it has been idle only 4 s.
    p.decide(&none, &[worker("a", false, GIB)], &[], 0, &mut m, 8_000);
    assert!(
        p.decide(&none, &[worker("a", false, GIB)], &[], 0, &mut m, 12_000)
            .cancel
            .is_empty()
    );
    assert_eq!(
        p.decide(&none, &[worker("a", false, GIB)], &[], 0, &mut m, 18_000)
            .cancel,
        ["job-a"]
    );
    // Its advert says it has been idle 9 s already (it reached the
    // controller late): 1 s more is enough.
    let mut m = Memory::default();
    let seen_late = PoolWorker {
        idle_ms: 9_000,
        ..worker("a", false, GIB)
    };
    p.decide(
        &none,
        std::slice::from_ref(&seen_late),
        &[],
        0,
        &mut m,
        30_000,
    );
    assert!(
        p.decide(
            &none,
            std::slice::from_ref(&seen_late),
            &[],
            0,
            &mut m,
            30_500
        )
        .cancel
        .is_empty()
    );
    assert_eq!(
        p.decide(&none, &[seen_late], &[], 0, &mut m, 31_000).cancel,
        ["job-a"]
    );
    // A backlog arriving while it waited keeps it.
    let mut m = Memory::default();
    let some = backlog(&[(1, 0, MIB, 100)]);
    p.decide(&none, &[worker("a", false, GIB)], &[], 0, &mut m, 0);
    assert!(
        p.decide(&some, &[worker("a", false, GIB)], &[], 0, &mut m, 20_000)
            .cancel
            .is_empty()
    );
}

#[test]
fn a_heavy_tail_gets_one_large_worker_not_a_pool_of_them() {
    let p = Policy {
        max: 8,
        overhead_bytes: 64 * MIB,
        min_worker_bytes: 64 * MIB,
        ..Policy::default()
    };
    // One map: typical jobs of 80 MiB, a few waiting of 960 MiB.
    let mix = PoolBacklog::sum(&[Backlog {
        id: "m".into(),
        waiting: 48,
        running: 0,
        memory_bytes: 80 * MIB,
        largest_bytes: 960 * MIB,
        job_ms: 2000,
    }]);
    let d = p.decide(&mix, &[], &[], 0, &mut Memory::default(), 0);
    assert_eq!(d.submit.len(), 8, "{d:?}");
    assert_eq!(p.largest_job_of(&d.submit[0]), 960 * MIB, "{d:?}");
    for s in &d.submit[1..] {
        assert_eq!(p.largest_job_of(s), 80 * MIB, "{d:?}");
    }
    assert!(d.why.contains("one asked with"), "{}", d.why);
    // A large one already coming (or in the pool): no second one.
    let d = p.decide(&mix, &[], &[], 960 * MIB, &mut Memory::default(), 0);
    assert!(
        d.submit.iter().all(|s| p.largest_job_of(s) == 80 * MIB),
        "{d:?}"
    );
    let big = worker("a", true, GIB);
    let d = p.decide(&mix, &[big], &[], 0, &mut Memory::default(), 0);
    assert_eq!(d.submit.len(), 7);
    assert!(
        d.submit.iter().all(|s| p.largest_job_of(s) == 80 * MIB),
        "{d:?}"
    );
    assert!(d.why.contains("each asked with"), "{}", d.why);
}

#[test]
fn workers_are_shaped_by_the_jobs_that_wait() {
    use crate::sandbox::JOB_NATIVE_BYTES as NATIVE;
    let p = Policy {
        slots: 2,
        overhead_bytes: 256 * MIB,
        ..Policy::default()
    };
    // Large jobs no worker can hold: workers for two of them.
    let large = backlog(&[(20, 0, 6 * GIB, 1000)]);
    assert_eq!(
        p.shape(&large, GIB),
        Shape {
            slots: 2,
            memory_bytes: 12 * GIB + 256 * MIB + 2 * NATIVE
        }
    );
    // Small jobs get small workers, not the node's size.
    let small = backlog(&[(500, 0, 48 * MIB, 1000)]);
    assert_eq!(
        p.shape(&small, 0),
        Shape {
            slots: 2,
            memory_bytes: 352 * MIB + 2 * NATIVE
        }
    );
    // A mix: the large ones nobody holds come first; once the pool
    // holds them, the map with the most work sets the shape.
    let mix = backlog(&[(400, 0, 32 * MIB, 500), (4, 0, 4 * GIB, 500)]);
    assert_eq!(
        p.shape(&mix, GIB).memory_bytes,
        8 * GIB + 256 * MIB + 2 * NATIVE
    );
    assert_eq!(p.shape(&mix, 8 * GIB).memory_bytes, 320 * MIB + 2 * NATIVE);
    // Never past a node's size.
    let huge = backlog(&[(1, 0, 100 * GIB, 500)]);
    assert_eq!(p.shape(&huge, 0).memory_bytes, 64 * GIB);
}

#[test]
fn a_worker_of_several_slots_holds_one_large_job_beside_its_other_slots_small_ones() {
    use crate::sandbox::JOB_NATIVE_BYTES as NATIVE;
    let p = Policy {
        slots: 4,
        overhead_bytes: 64 * MIB,
        min_worker_bytes: 64 * MIB,
        ..Policy::default()
    };
    // A heavy tail: typical 80 MiB, the largest 960 MiB, nobody holds it.
    let tail = |waiting| {
        PoolBacklog::sum(&[Backlog {
            id: "m".into(),
            waiting,
            running: 0,
            memory_bytes: 80 * MIB,
            largest_bytes: 960 * MIB,
            job_ms: 2000,
        }])
    };
    // The large job and three small ones beside it: not 4 × 960 MiB.
    let first = p.shape(&tail(48), 0);
    assert_eq!(
        first,
        Shape {
            slots: 4,
            memory_bytes: 960 * MIB + 3 * 80 * MIB + 4 * NATIVE + 64 * MIB
        }
    );
    assert_eq!(
        p.largest_job_of(&first),
        960 * MIB + 3 * (80 * MIB + NATIVE)
    );
    // Once a worker holds it, the others are sized by their slots of
    // small jobs, and hold a job of up to their whole memory alone.
    let other = p.shape(&tail(48), 960 * MIB);
    assert_eq!(other.memory_bytes, 4 * (80 * MIB + NATIVE) + 64 * MIB);
    assert_eq!(p.largest_job_of(&other), 4 * 80 * MIB + 3 * NATIVE);
    // No more slots than jobs wait.
    assert_eq!(
        p.shape(&backlog(&[(3, 5, 80 * MIB, 2000)]), 0),
        Shape {
            slots: 3,
            memory_bytes: 3 * (80 * MIB + NATIVE) + 64 * MIB
        }
    );
    // Growing to --min with nothing to run: the configured slots.
    assert_eq!(p.shape(&backlog(&[]), 0).slots, 4);
}

#[test]
fn pending_jobs_are_let_go_only_when_nothing_is_left_to_do() {
    let p = Policy {
        idle_for: Duration::from_secs(5),
        ..Policy::default()
    };
    let mut m = Memory::default();
    let pending = vec!["j1".to_string(), "j2".to_string()];
    let some = backlog(&[(1, 0, MIB, 100)]);
    p.decide(&some, &[], &pending, 0, &mut m, 0);
    assert!(
        p.decide(&some, &[], &pending, 0, &mut m, 30_000)
            .cancel
            .is_empty(),
        "one job still wants a worker: kept"
    );
    let mut m = Memory::default();
    let none = PoolBacklog::default();
    p.decide(&none, &[], &pending, 0, &mut m, 0);
    assert_eq!(
        p.decide(&none, &[], &pending, 0, &mut m, 5_000).cancel,
        ["j1", "j2"]
    );
}

#[test]
fn a_job_nobody_holds_gets_a_worker_even_when_the_target_is_met() {
    let p = Policy {
        max: 3,
        slots: 2,
        idle_for: std::time::Duration::from_secs(3),
        overhead_bytes: 40 * MIB,
        min_worker_bytes: 64 * MIB,
        max_worker_bytes: GIB,
        ..Policy::default()
    };
    // Read after the pool grew: two jobs of 280 MiB wait, the workers
    // hold jobs of up to 175 MiB; two jobs want one worker of two slots.
    let late = PoolBacklog::sum(&[Backlog {
        id: "m".into(),
        waiting: 2,
        running: 0,
        memory_bytes: 40 * MIB,
        largest_bytes: 280 * MIB,
        job_ms: 2000,
    }]);
    let small = [worker("a", false, 175 * MIB), worker("b", false, 175 * MIB)];
    let mut memory = Memory::default();
    let d = p.decide(&late, &small, &[], 0, &mut memory, 0);
    assert_eq!((d.submit.len(), d.cancel.len()), (1, 0), "{d:?}");
    assert!(p.largest_job_of(&d.submit[0]) >= 280 * MIB, "{d:?}");
    assert!(d.why.contains("no worker holds"), "{}", d.why);
    // Coming: asked once, not again.
    let coming = p.largest_job_of(&d.submit[0]);
    let d = p.decide(&late, &small, &["j".into()], coming, &mut memory, 500);
    assert!(d.submit.is_empty(), "{d:?}");
    // At --max: only in place of a worker idle for --idle, and then at once.
    let at_max = Policy {
        max: 2,
        ..p.clone()
    };
    let mut memory = Memory::default();
    let d = at_max.decide(&late, &small, &[], 0, &mut memory, 0);
    assert!(d.submit.is_empty() && d.cancel.is_empty(), "{d:?}");
    let d = at_max.decide(&late, &small, &[], 0, &mut memory, 3_000);
    assert_eq!(d.cancel, vec!["job-a".to_string()], "{d:?}");
    assert_eq!(d.submit.len(), 1, "{d:?}");
    assert!(d.why.contains("replacing an idle worker"), "{}", d.why);
    // Never a worker that could not hold it either (past --max-mem).
    let huge = PoolBacklog::sum(&[Backlog {
        largest_bytes: 2 * GIB,
        ..late.reports[0].clone()
    }]);
    let d = p.decide(&huge, &small, &[], 0, &mut Memory::default(), 0);
    assert!(d.submit.is_empty(), "{d:?}");
}
