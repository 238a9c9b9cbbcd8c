use super::*;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// A ledger of `memory` (and `reserve`) on a host of `physical` bytes
/// with `available` free.
fn ledger(
    memory: Option<u64>,
    reserve: u64,
    physical: u64,
    available: u64,
) -> (Arc<Ledger>, Arc<FakeMemory>) {
    let host = FakeMemory::new(physical, available);
    (
        Ledger::with_host(
            &LedgerConfig {
                memory,
                reserve,
                per_job: 0,
                overhead: 0,
            },
            Box::new(host.clone()),
        ),
        host,
    )
}

/// Each job's native memory (12 MiB here) is reserved beside its limit:
/// `--memory` bounds the limits, the machine bounds limits and native
/// memory together.
#[test]
fn native_memory_is_reserved_beside_each_job_within_the_machine() {
    let native = 12 * MIB;
    let with = |memory: Option<u64>, physical: u64| {
        Ledger::with_host(
            &LedgerConfig {
                memory,
                reserve: 0,
                per_job: native,
                overhead: 0,
            },
            Box::new(FakeMemory::new(physical, physical)),
        )
    };
    // --memory 1 GiB on a large host: a 1 GiB job fits, as asked.
    let lent = with(Some(GIB), 8 * GIB);
    assert_eq!((lent.largest_job(), lent.offer()), (GIB, GIB));
    let whole = lent.try_reserve(GIB).expect("--memory is the jobs' limits");
    assert_eq!(whole.bytes(), GIB);
    assert_eq!(lent.snapshot().reserved, GIB, "adverts show the limits");
    drop(whole);
    // A machine of 300 MiB (a cgroup): jobs of up to 288 MiB, and two
    // of 100 MiB leave 300 − 2 × 112 − 12 for a third.
    let machine = with(None, 300 * MIB);
    assert_eq!(machine.largest_job(), 288 * MIB);
    assert_eq!(machine.ceiling(), 288 * MIB);
    assert!(machine.try_reserve(289 * MIB).is_none());
    let a = machine.try_reserve(100 * MIB).unwrap();
    let b = machine.try_reserve(100 * MIB).unwrap();
    assert_eq!(machine.offer(), 64 * MIB);
    assert!(machine.try_reserve(65 * MIB).is_none());
    // A hold takes what is left beside the reservations and their
    // native memory.
    let hold = machine.hold(HoldKind::Output);
    assert!(!hold.try_grow(77 * MIB, false));
    assert!(hold.try_grow(76 * MIB, false));
    assert_eq!(machine.offer(), 0);
    drop((a, b, hold));
    assert_eq!(machine.offer(), 288 * MIB, "all given back");
    // --memory above what the machine has: the machine bounds.
    let over = with(Some(GIB), 300 * MIB);
    assert_eq!(over.largest_job(), 288 * MIB);
}

/// Two workers of one host, each lending 2900 MiB of a 3 GiB host:
/// with the host's ledger shared, the second cannot take a 2 GiB job
/// while the first holds one, sees the memory again the moment it is
/// given back, and says so in its offer meanwhile.
#[test]
fn workers_sharing_the_host_ledger_never_over_commit_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger");
    let worker = |name: &str| {
        let (l, _) = ledger(Some(2900 * MIB), 0, 3 * GIB, 3 * GIB);
        l.join_host(
            crate::worker::hostledger::HostLedger::open(&path, "host".into(), u64::MAX).unwrap(),
            name,
        );
        l
    };
    let (a, b) = (worker("a"), worker("b"));
    let first = a.try_reserve(2 * GIB).expect("the host is free");
    assert!(
        b.try_reserve(2 * GIB).is_none(),
        "2 + 2 GiB on a 3 GiB host"
    );
    b.publish();
    assert_eq!(b.offer(), GIB, "b offers what the host has left");
    let small = b.try_reserve(GIB).expect("1 GiB fits beside");
    drop(small);
    drop(first);
    assert!(b.try_reserve(2 * GIB).is_some(), "given back, seen at once");
    // Decided alone (no shared ledger), both would have taken 2 GiB.
    let (c, _) = ledger(Some(2900 * MIB), 0, 3 * GIB, 3 * GIB);
    let (d, _) = ledger(Some(2900 * MIB), 0, 3 * GIB, 3 * GIB);
    assert!(c.try_reserve(2 * GIB).is_some() && d.try_reserve(2 * GIB).is_some());
}

#[test]
fn reservations_never_exceed_capacity_and_are_given_back() {
    let (ledger, _) = ledger(Some(100 * MIB), 0, 8 * GIB, 8 * GIB);
    assert_eq!(ledger.capacity(), 100 * MIB);
    let a = ledger.try_reserve(60 * MIB).expect("fits");
    assert!(ledger.try_reserve(50 * MIB).is_none(), "60 + 50 > 100");
    let b = ledger.try_reserve(40 * MIB).expect("fits exactly");
    assert_eq!(ledger.snapshot().reserved, 100 * MIB);
    assert_eq!(ledger.offer(), 0);
    drop(a);
    assert_eq!(ledger.snapshot().reserved, 40 * MIB);
    assert_eq!(ledger.snapshot().reserved_high_water, 100 * MIB);
    drop(b);
    assert_eq!(ledger.offer(), 100 * MIB);
}

#[test]
fn untouched_reservations_count_against_host_memory() {
    // Capacity above what the host has free: the host term decides.
    let (ledger, host) = ledger(None, 0, 8 * GIB, 4 * GIB);
    assert_eq!(ledger.capacity(), 8 * GIB);
    assert_eq!(ledger.offer(), 4 * GIB);
    let r = ledger
        .try_reserve(2 * GIB)
        .expect("half the free memory fits");
    // The job has touched nothing yet: the whole reservation is taken.
    assert_eq!(ledger.offer(), 2 * GIB);
    // Once it holds its memory, the OS's own figure shows it; the
    // ledger does not count it twice.
    r.meter().store(2 * GIB, Ordering::Relaxed);
    host.available.store(2 * GIB, Ordering::Relaxed);
    assert_eq!(ledger.offer(), 2 * GIB);
    assert_eq!(ledger.snapshot().used, 2 * GIB);
    // The host's other users take memory: the offer shrinks with it,
    // and so does the largest job that could ever start.
    host.available.store(GIB, Ordering::Relaxed);
    assert_eq!(ledger.offer(), GIB);
    assert_eq!(ledger.ceiling(), 3 * GIB, "free + what our job holds");
    assert!(ledger.try_reserve(GIB + MIB).is_none());
}

#[test]
fn the_reserve_is_always_left_to_the_host() {
    let (ledger, _) = ledger(None, GIB, 8 * GIB, 3 * GIB);
    assert_eq!(ledger.capacity(), 7 * GIB, "physical less the reserve");
    assert_eq!(ledger.offer(), 2 * GIB, "free less the reserve");
    assert_eq!(ledger.ceiling(), 2 * GIB);
    assert_eq!(
        in_a_cgroup().capacity(),
        3 * GIB,
        "the cgroup's limit is below --memory and physical"
    );
}

/// A ledger (`--memory 10G --reserve 1G`, no overhead) in a cgroup of
/// 3 GiB on a 64 GiB machine.
fn in_a_cgroup() -> Arc<Ledger> {
    Ledger::with_host(
        &LedgerConfig {
            memory: Some(10 * GIB),
            reserve: GIB,
            per_job: 0,
            overhead: 0,
        },
        Box::new(FakeMemory::in_cgroup(64 * GIB, 32 * GIB, 3 * GIB)),
    )
}

/// In a cgroup (a Slurm job's `--mem`) the worker's own process counts
/// beside its jobs: it keeps its overhead out of the limit, so a job of
/// the largest size it offers cannot push the cgroup past its limit (where
/// the kernel kills the worker). Physical memory is left `reserve`, not
/// the overhead.
#[test]
fn in_a_cgroup_the_worker_keeps_its_overhead_out_of_what_it_lends() {
    let native = 12 * MIB;
    let with = |memory: Option<u64>, host: Arc<FakeMemory>| {
        Ledger::with_host(
            &LedgerConfig {
                memory,
                reserve: GIB,
                per_job: native,
                overhead: 40 * MIB,
            },
            Box::new(host),
        )
    };
    // --mem=160M: jobs of up to 160 − 40 − 12 = 108 MiB.
    let slurm = with(None, FakeMemory::in_cgroup(24 * GIB, 20 * GIB, 160 * MIB));
    assert_eq!(slurm.capacity(), 120 * MIB);
    assert_eq!(slurm.largest_job(), 108 * MIB);
    assert_eq!(slurm.offer(), 108 * MIB);
    assert!(slurm.try_reserve(109 * MIB).is_none());
    let job = slurm
        .try_reserve(108 * MIB)
        .expect("the largest job it offers");
    assert_eq!(slurm.offer(), 0);
    drop(job);
    // --memory below the cgroup less the overhead still binds.
    assert_eq!(
        with(
            Some(64 * MIB),
            FakeMemory::in_cgroup(24 * GIB, 20 * GIB, 160 * MIB)
        )
        .largest_job(),
        64 * MIB
    );
    // No cgroup: physical less the reserve, the overhead not taken.
    let host = with(None, FakeMemory::new(8 * GIB, 8 * GIB));
    assert_eq!(host.capacity(), 7 * GIB);
}

/// A worker (12 MiB beside each job, 40 MiB overhead) in a Slurm job of
/// 1 GiB on a 24 GiB node.
fn in_a_slurm_job() -> (Arc<Ledger>, Arc<FakeMemory>) {
    let host = FakeMemory::in_cgroup(24 * GIB, 20 * GIB, GIB);
    let config = LedgerConfig {
        memory: None,
        reserve: GIB,
        per_job: 12 * MIB,
        overhead: 40 * MIB,
    };
    (Ledger::with_host(&config, Box::new(host.clone())), host)
}

/// What a cgroup holds now beside the jobs' touched memory — the worker's
/// processes past its overhead, a program of the same batch job — shrinks
/// the offer: the cgroup's free memory less what the jobs may still touch.
#[test]
fn in_a_cgroup_memory_taken_beside_the_jobs_shrinks_the_offer() {
    let (ledger, host) = in_a_slurm_job();
    let free = |mib: u64| host.cgroup_free.store(mib * MIB, Ordering::Relaxed);
    // The worker holds 20 MiB of its 40 MiB overhead: capacity rules.
    free(1004);
    assert_eq!(ledger.offer(), 972 * MIB, "1024 − 40 − 12");
    // Another program of the batch job takes 500 MiB.
    free(504);
    assert_eq!(ledger.offer(), 492 * MIB);
    assert_eq!(ledger.ceiling(), 492 * MIB);
    // A job of 200 MiB, untouched yet: what it may touch (with its 12 MiB
    // of native memory) is taken too.
    let job = ledger.try_reserve(200 * MIB).unwrap();
    assert_eq!(ledger.offer(), 280 * MIB, "504 − 212 − 12");
    assert!(ledger.try_reserve(281 * MIB).is_none());
    // It touches 150 MiB: the cgroup has that much less free, and the job
    // that much less to touch — the offer stays.
    job.meter().store(150 * MIB, Ordering::Relaxed);
    free(354);
    assert_eq!(ledger.offer(), 280 * MIB);
    assert_eq!(ledger.ceiling(), 492 * MIB, "once the job ends");
    drop(job);
    free(504);
    assert_eq!(ledger.offer(), 492 * MIB);
}

/// A cgroup reading taken while a job held its memory still counts it
/// after the job has ended: a reservation it refuses is decided again on a
/// fresh reading, not a second later.
#[test]
fn a_reservation_a_stale_cgroup_reading_refuses_is_decided_on_a_fresh_one() {
    let (ledger, host) = in_a_slurm_job();
    // Read while the last job's 800 MiB were still touched.
    host.cgroup_free.store(180 * MIB, Ordering::Relaxed);
    host.cgroup_free_fresh.store(1000 * MIB, Ordering::Relaxed);
    let job = ledger
        .try_reserve(800 * MIB)
        .expect("decided on a fresh reading");
    assert_eq!(host.cgroup_free.load(Ordering::Relaxed), 1000 * MIB);
    drop(job);
    // Nothing fresher: a refusal stands.
    host.cgroup_free.store(180 * MIB, Ordering::Relaxed);
    assert!(ledger.try_reserve(800 * MIB).is_none());
}

#[test]
fn holds_come_out_of_capacity_beside_reservations() {
    let (ledger, _) = ledger(Some(100 * MIB), 0, 8 * GIB, 8 * GIB);
    let r = ledger.try_reserve(60 * MIB).unwrap();
    let hold = ledger.hold(HoldKind::Output);
    assert!(hold.try_grow(30 * MIB, false));
    assert_eq!(ledger.offer(), 10 * MIB, "100 - 60 reserved - 30 held");
    assert!(!hold.try_grow(20 * MIB, false), "only 10 MiB are free");
    assert!(
        hold.try_grow(20 * MIB, true),
        "the allowance is taken regardless"
    );
    assert_eq!(ledger.snapshot().held, 50 * MIB);
    assert_eq!(ledger.offer(), 0);
    hold.shrink_to(5 * MIB);
    assert_eq!(ledger.snapshot().held, 5 * MIB);
    drop(r);
    assert_eq!(ledger.offer(), 95 * MIB);
    drop(hold);
    assert_eq!(ledger.snapshot().held, 0);
    assert_eq!(ledger.offer(), 100 * MIB);
}

#[test]
fn holds_are_counted_by_kind_and_all_of_them_come_out_of_capacity() {
    let (ledger, _) = ledger(Some(100 * MIB), 0, 8 * GIB, 8 * GIB);
    let (output, request, compile) = (
        ledger.hold(HoldKind::Output),
        ledger.hold(HoldKind::Request),
        ledger.hold(HoldKind::Compile),
    );
    assert!(
        output.try_grow(10 * MIB, false)
            && request.try_grow(20 * MIB, false)
            && compile.try_grow(30 * MIB, false)
    );
    let s = ledger.snapshot();
    assert_eq!(
        (s.held, s.held_by),
        (60 * MIB, [10 * MIB, 0, 20 * MIB, 30 * MIB, 0])
    );
    assert_eq!(ledger.offer(), 40 * MIB);
    request.release(5 * MIB);
    output.shrink_to(MIB);
    drop(compile);
    let s = ledger.snapshot();
    assert_eq!((s.held, s.held_by), (16 * MIB, [MIB, 0, 15 * MIB, 0, 0]));
    drop((output, request));
    assert_eq!(ledger.snapshot().held_by, [0; 5]);
}

#[test]
fn kept_results_come_out_of_the_largest_job_and_other_holds_do_not() {
    // A detached job's kept result stays until it is discarded or expires:
    // a job asking the whole capacity could never start beside it, so the
    // worker must not take such a job (nor advertise that it could).
    let (ledger, _) = ledger(Some(GIB), 0, 8 * GIB, 8 * GIB);
    let output = ledger.hold(HoldKind::Output);
    assert!(output.try_grow(MIB, false));
    assert_eq!(ledger.largest_job(), GIB, "output is sent, then given back");
    let kept = ledger.hold(HoldKind::Result);
    assert!(kept.try_grow(5, true));
    assert_eq!(ledger.largest_job(), GIB - 5);
    assert_eq!(ledger.ceiling(), GIB - 5);
    drop(kept);
    assert_eq!((ledger.largest_job(), ledger.ceiling()), (GIB, GIB));
}

#[test]
fn on_this_machine_capacity_is_capped_by_physical_memory_less_the_reserve() {
    let ledger = Ledger::new(&LedgerConfig {
        memory: None,
        reserve: DEFAULT_RESERVE,
        per_job: 0,
        overhead: 0,
    })
    .unwrap();
    let mut s = sysinfo::System::new().unwrap();
    s.refresh_memory();
    assert!(ledger.capacity() <= s.total_memory() - (1 << 30));
    assert!(
        ledger.snapshot().host_available > 0,
        "the machine's free memory is read"
    );
}

/// A job under a reserve is lent only memory promised to no one: what a
/// new job would be offered (no native memory of its own), less what is
/// held back for other tenants' waiting jobs; the loan joins its reservation until it
/// ends, so the ledger never promises more than its capacity.
#[test]
fn a_loan_past_the_reserve_takes_only_unpromised_memory_and_ends_with_the_job() {
    let native = 12 * MIB;
    let ledger = Ledger::with_host(
        &LedgerConfig {
            memory: Some(100 * MIB),
            reserve: 0,
            per_job: native,
            overhead: 0,
        },
        Box::new(FakeMemory::new(8 * GIB, 8 * GIB)),
    );
    let a = ledger.try_reserve(40 * MIB).unwrap();
    let b = ledger.try_reserve(40 * MIB).unwrap();
    assert_eq!(ledger.offer(), 20 * MIB);
    let lend_a = a.lender("alice");
    assert!(lend_a.lend(15 * MIB), "15 of the 20 MiB nobody holds");
    assert_eq!((a.bytes(), a.with_loans()), (40 * MIB, 55 * MIB));
    assert_eq!(ledger.snapshot().reserved, 95 * MIB);
    assert_eq!(ledger.offer(), 5 * MIB);
    assert!(!b.lender("bob").lend(6 * MIB), "6 MiB are not there");
    assert!(b.lender("bob").lend(5 * MIB), "the last 5 are");
    assert!(!lend_a.lend(1), "nothing left: --memory is never passed");
    drop(b);
    // b's reservation and its loan are free again; a's loan is still held.
    assert_eq!(ledger.snapshot().reserved, 55 * MIB);
    // Memory held back for another tenant's first waiting job (held or
    // not) is lent to no one of another tenant.
    ledger.hold_back_from_loans(HeldBack {
        waiting: vec![("bob".into(), 42 * MIB), ("alice".into(), 90 * MIB)],
    });
    assert!(
        !lend_a.lend(4 * MIB),
        "bob's job waits for 42 of the 44 MiB"
    );
    assert!(
        lend_a.lend(2 * MIB),
        "alice's own waiting job does not stop her"
    );
    ledger.hold_back_from_loans(HeldBack::default());
    assert!(lend_a.lend(2 * MIB));
    drop(a);
    assert_eq!(ledger.snapshot().reserved, 0);
    assert!(!lend_a.lend(MIB), "a job that ended is lent nothing");
    assert_eq!(ledger.snapshot().reserved, 0);
}
