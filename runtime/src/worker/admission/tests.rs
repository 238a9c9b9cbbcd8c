use super::super::ledger::{FakeMemory, LedgerConfig};
use super::*;

const MIB: u64 = 1 << 20;

/// A ledger of 100 MiB on a host with plenty free: memory is the
/// ledger's, never the machine's.
fn ledger() -> Arc<Ledger> {
    Ledger::with_host(
        &LedgerConfig {
            memory: Some(100 * MIB),
            reserve: 0,
            per_job: 0,
            overhead: 0,
        },
        Box::new(FakeMemory::new(8 << 30, 8 << 30)),
    )
}

fn admission(slots: u32, queue: u32) -> Arc<Admission> {
    let ledger = ledger();
    Admission::new(
        ledger,
        AdmissionConfig {
            queue_per_tenant: queue,
            ..AdmissionConfig::new(slots)
        },
    )
}

#[tokio::test(start_paused = true)]
async fn a_job_over_the_most_one_job_may_have_is_refused_before_it_waits() {
    let adm = Admission::new(
        ledger(),
        AdmissionConfig {
            max_job_memory: 40 * MIB,
            ..AdmissionConfig::new(1)
        },
    );
    let t = Arc::new(Tenant::new("t"));
    assert_eq!(adm.largest_job(), 40 * MIB);
    assert_eq!(adm.largest_for(&t), 40 * MIB);
    assert_eq!(
        adm.admit(&t, 50 * MIB).await.err(),
        Some(NotAdmitted::NeverFits {
            requested: 50 * MIB,
            largest: 40 * MIB
        })
    );
    assert_eq!(adm.counts(), (0, 0), "it neither waits nor runs");
    assert!(adm.admit(&t, 40 * MIB).await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn slots_memory_queue_and_refusals() {
    let adm = admission(2, 1);
    let t = Arc::new(Tenant::new("t"));
    assert_eq!(
        adm.admit(&t, 200 * MIB).await.err(),
        Some(NotAdmitted::NeverFits {
            requested: 200 * MIB,
            largest: 100 * MIB
        })
    );
    let a = adm.admit(&t, 70 * MIB).await.unwrap();
    // 70 + 50 > 100: waits in the queue.
    let (adm2, t2) = (adm.clone(), t.clone());
    let waiting = tokio::spawn(async move { adm2.admit(&t2, 50 * MIB).await.map(|_| ()) });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(adm.counts(), (1, 1));
    // A small job passes the waiting one: a slot is free and it fits.
    drop(
        adm.admit(&t, 10 * MIB)
            .await
            .expect("10 MiB fits beside 70"),
    );
    // Both slots taken, and the tenant's queue (1) is full.
    let b = adm.admit(&t, 10 * MIB).await.unwrap();
    assert_eq!(adm.admit(&t, 10 * MIB).await.err(), Some(NotAdmitted::Busy));
    // Another tenant has a queue of its own.
    let other = Arc::new(Tenant::new("other"));
    let (adm3, o) = (adm.clone(), other.clone());
    let other_waiting = tokio::spawn(async move { adm3.admit(&o, 10 * MIB).await.map(|_| ()) });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(adm.counts(), (2, 2));
    drop(a);
    drop(b);
    waiting.await.unwrap().unwrap();
    other_waiting.await.unwrap().unwrap();
    assert_eq!(adm.counts(), (0, 0));
}

/// A job's output is held a little longer than its slot (until its
/// answer is sent): the job waiting for that memory starts when the
/// hold is given back, not at the next periodic re-check. (It waited
/// the full [`RECHECK`] once: a map whose first requests each took a
/// whole worker ran them four a second.)
#[tokio::test(start_paused = true)]
async fn memory_given_back_outside_a_ticket_starts_a_waiting_job_at_once() {
    let adm = admission(2, 4);
    let t = Arc::new(Tenant::new("t"));
    let running = adm.admit(&t, 100 * MIB).await.unwrap();
    let output = adm.ledger().hold(crate::worker::HoldKind::Output);
    assert!(output.try_grow(MIB, false) || output.try_grow(MIB, true));
    let (adm2, t2) = (adm.clone(), t.clone());
    let waiting =
        tokio::spawn(async move { adm2.admit(&t2, 100 * MIB).await.map(|_| Instant::now()) });
    tokio::time::sleep(Duration::from_millis(10)).await;
    drop(running);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(
        !waiting.is_finished(),
        "1 MiB of output is still held: 100 MiB does not fit"
    );
    let given_back = Instant::now();
    drop(output);
    let started = waiting.await.unwrap().unwrap();
    assert!(
        started.duration_since(given_back) < RECHECK / 10,
        "started {:?} after the memory was given back",
        started.duration_since(given_back)
    );
}

#[tokio::test(start_paused = true)]
async fn a_large_job_that_waited_too_long_has_memory_held_for_it() {
    let ledger = ledger();
    let config = AdmissionConfig {
        hold_after: Duration::from_millis(100),
        ..AdmissionConfig::new(3)
    };
    let adm = Admission::new(ledger, config);
    let t = Arc::new(Tenant::new("t"));
    // Before the bound, a small job passes the waiting large one; after
    // it, small jobs wait until the large one has run.
    passes_then_waits(&adm, &t, 20, 150).await;
}

#[tokio::test(start_paused = true)]
async fn on_a_worker_of_short_jobs_a_passed_over_job_is_held_after_a_few_of_their_times() {
    // The configured bound is the default 30 s; the jobs take 300 ms.
    let adm = Admission::new(ledger(), AdmissionConfig::new(3));
    let t = Arc::new(Tenant::new("t"));
    for _ in 0..20 {
        let job = adm.admit(&t, 10 * MIB).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        drop(job);
    }
    // Within three job times a small job still passes the large one; past
    // them (0.9 s, not 30 s), small jobs wait for it.
    passes_then_waits(&adm, &t, 500, 600).await;
}

/// With 60 of the 100 MiB running, an 80 MiB job waits: a 10 MiB job sent
/// `pass_ms` later passes it, one sent `wait_ms` after that waits behind
/// the memory held for it; then all three run.
async fn passes_then_waits(adm: &Arc<Admission>, t: &Arc<Tenant>, pass_ms: u64, wait_ms: u64) {
    let running = adm.admit(t, 60 * MIB).await.unwrap();
    let (adm2, t2) = (adm.clone(), t.clone());
    let large = tokio::spawn(async move { adm2.admit(&t2, 80 * MIB).await.map(|_| ()) });
    tokio::time::sleep(Duration::from_millis(pass_ms)).await;
    drop(adm.admit(t, 10 * MIB).await.unwrap());
    tokio::time::sleep(Duration::from_millis(wait_ms)).await;
    let (adm3, t3) = (adm.clone(), t.clone());
    let small = tokio::spawn(async move { adm3.admit(&t3, 10 * MIB).await.map(|_| ()) });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !small.is_finished(),
        "the small job must wait behind the memory held for the large one"
    );
    assert_eq!(adm.counts(), (1, 2));
    drop(running);
    large.await.unwrap().unwrap();
    small.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn queue_limits_hold_when_memory_is_the_bottleneck_and_count_bytes() {
    let ledger = ledger();
    let config = AdmissionConfig {
        queue_per_tenant: 2,
        queue_bytes_per_tenant: 10 * MIB,
        ..AdmissionConfig::new(8)
    };
    let adm = Admission::new(ledger, config);
    let t = Arc::new(Tenant::new("t"));
    let big = adm.admit(&t, 90 * MIB).await.unwrap();
    // Seven slots free, but no memory: the queue limit of 2 holds.
    let q1 = adm.enqueue(&t, 50 * MIB, 0).unwrap();
    let q2 = adm.enqueue(&t, 50 * MIB, 0).unwrap();
    assert_eq!(adm.enqueue(&t, 50 * MIB, 0).err(), Some(NotAdmitted::Busy));
    drop((q1, q2));
    // Bytes: 6 + 6 MiB of inputs is over 10 MiB.
    let q = adm.enqueue(&t, 50 * MIB, 6 * MIB).unwrap();
    assert_eq!(
        adm.enqueue(&t, 50 * MIB, 6 * MIB).err(),
        Some(NotAdmitted::Busy)
    );
    drop((q, big));
    // A job that starts at once needs no room in the queue.
    let _a = adm.enqueue(&t, 10 * MIB, 20 * MIB).expect("starts at once");
}

#[tokio::test(start_paused = true)]
async fn a_hold_respects_slot_limits_and_lets_jobs_fit_beside_it() {
    let ledger = ledger();
    let config = AdmissionConfig {
        hold_after: Duration::from_millis(50),
        ..AdmissionConfig::new(4)
    };
    let adm = Admission::new(ledger, config);
    let capped = Arc::new(Tenant {
        max_slots: Some(1),
        ..Tenant::new("capped")
    });
    let other = Arc::new(Tenant::new("other"));
    // Capped runs 50 and waits past the bound with 60 more: it may not
    // start (its slot limit), so no memory is held for it...
    let running = adm.admit(&capped, 50 * MIB).await.unwrap();
    let waiting = adm.enqueue(&capped, 60 * MIB, 0).unwrap();
    tokio::time::sleep(Duration::from_millis(80)).await;
    let a = tokio::time::timeout(Duration::from_secs(1), adm.admit(&other, 40 * MIB)).await;
    let a = a
        .expect("a job of another tenant waited behind a hold its own tenant's limit forbids")
        .unwrap();
    drop(a);
    // ...until it may: then it is held, and others start only beside it.
    drop(running);
    let held = tokio::time::timeout(Duration::from_secs(1), waiting.ticket())
        .await
        .unwrap()
        .unwrap();
    let beside = adm.admit(&other, 40 * MIB).await.expect("60 + 40 fit");
    drop((held, beside));
    let big = adm.admit(&other, 90 * MIB).await.unwrap();
    let overdue = adm.enqueue(&capped, 30 * MIB, 0).unwrap();
    tokio::time::sleep(Duration::from_millis(80)).await;
    let (adm2, o) = (adm.clone(), other.clone());
    let small = tokio::spawn(async move { adm2.admit(&o, 10 * MIB).await.map(drop) });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !small.is_finished(),
        "10 fits now, but not beside the 30 held for the overdue job"
    );
    drop(big);
    overdue.ticket().await.unwrap();
    small.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_overdue_job_the_host_can_never_hold_is_refused() {
    // An 8 GiB host with 2 GiB free: capacity is 8 GiB, but no job
    // over 2 GiB can start until the host's other users free memory.
    let host = FakeMemory::new(8 << 30, 2 << 30);
    let ledger = Ledger::with_host(
        &LedgerConfig {
            memory: None,
            reserve: 0,
            per_job: 0,
            overhead: 0,
        },
        Box::new(host),
    );
    let (capacity, ceiling) = (ledger.capacity(), ledger.ceiling());
    assert_eq!((capacity, ceiling), (8 << 30, 2 << 30));
    let config = AdmissionConfig {
        hold_after: Duration::from_millis(50),
        ..AdmissionConfig::new(2)
    };
    let adm = Admission::new(ledger, config);
    let t = Arc::new(Tenant::new("t"));
    let hopeless = adm
        .enqueue(&t, capacity, 0)
        .expect("no larger than the capacity: queued");
    let refused = tokio::time::timeout(Duration::from_secs(2), hopeless.ticket())
        .await
        .unwrap();
    match refused {
        Err(NotAdmitted::NeverFits { largest, .. }) => assert_eq!(largest, ceiling),
        Err(e) => panic!("refused for the wrong reason: {e:?}"),
        Ok(_) => panic!("admitted a job larger than the host"),
    }
    drop(adm.admit(&t, 10 * MIB).await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn the_tenant_with_less_usage_goes_first_and_limits_hold() {
    let adm = admission(1, 4);
    let heavy = Arc::new(Tenant::new("heavy"));
    let light = Arc::new(Tenant {
        max_slots: Some(1),
        ..Tenant::new("light")
    });
    // Heavy has used the slot for a while.
    let first = adm.admit(&heavy, 10 * MIB).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for t in [&heavy, &light, &heavy, &light] {
        let (adm, t, order) = (adm.clone(), t.clone(), order.clone());
        waiters.push(tokio::spawn(async move {
            let ticket = adm.admit(&t, 10 * MIB).await.unwrap();
            order.lock().push(t.name.clone());
            tokio::time::sleep(Duration::from_millis(20)).await;
            drop(ticket);
        }));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    drop(first);
    for w in waiters {
        w.await.unwrap();
    }
    // Light (no usage) runs both its jobs before heavy's queued ones.
    assert_eq!(*order.lock(), ["light", "light", "heavy", "heavy"]);
    let report = adm.tenant_report();
    assert_eq!(
        report.iter().map(|r| r.tenant.as_str()).collect::<Vec<_>>(),
        ["heavy", "light"]
    );
    assert!(report[0].slot_seconds > report[1].slot_seconds);
}

/// A tenant whose job runs under a tiny reserve cannot borrow its way past
/// another tenant's job waiting for memory; its own waiting jobs do not
/// stop it, and once the other's job starts the memory left is lent again.
#[tokio::test(start_paused = true)]
async fn a_loan_never_takes_memory_another_tenants_waiting_job_needs() {
    let adm = admission(4, 4);
    let (alice, bob) = (Arc::new(Tenant::new("alice")), Arc::new(Tenant::new("bob")));
    let small = adm.admit(&alice, MIB).await.unwrap();
    let big = adm.admit(&alice, 60 * MIB).await.unwrap();
    let lender = small.reservation().lender(&alice.name);
    // Alice's own job waiting for 50 MiB (39 free) does not stop her loans.
    let (adm2, a2) = (adm.clone(), alice.clone());
    let hers = tokio::spawn(async move { adm2.admit(&a2, 50 * MIB).await.map(|_| ()) });
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(lender.lend(4 * MIB), "35 MiB left");
    // Bob's job waits for 38 MiB of the 35: none is lent to Alice now.
    let (adm2, b2) = (adm.clone(), bob.clone());
    let his = tokio::spawn(async move { adm2.admit(&b2, 38 * MIB).await.map(drop) });
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(adm.counts(), (2, 2));
    assert!(!lender.lend(MIB), "Bob's waiting job keeps what is free");
    // Alice's big job ends: both waiting jobs start (50 + 38 of 95), and
    // the 7 MiB left may be lent again.
    drop(big);
    his.await.unwrap().expect("Bob's job starts");
    hers.await.unwrap().expect("and Alice's");
    assert!(lender.lend(5 * MIB), "nothing of another tenant waits now");
}

/// A job under a reserve starts only where its limit fits, and then holds
/// its reserve: the rest is left for its loan and for other jobs.
#[tokio::test(start_paused = true)]
async fn a_job_under_a_reserve_starts_where_its_limit_fits_and_holds_its_reserve() {
    let adm = admission(4, 4);
    let t = Arc::new(Tenant::new("t"));
    let (reserve, limit) = (MemoryRequest::from(10 * MIB), MemoryRequest::from(50 * MIB));
    let first = adm.admit(&t, 60 * MIB).await.unwrap();
    let (adm2, t2) = (adm.clone(), t.clone());
    let under = tokio::spawn(async move {
        adm2.enqueue_reserving(&t2, reserve, limit, 0)
            .unwrap()
            .ticket()
            .await
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(
        adm.counts(),
        (1, 1),
        "40 MiB free: its 50 MiB limit does not fit"
    );
    drop(first);
    let ticket = under.await.unwrap().unwrap();
    assert_eq!(ticket.reservation().bytes(), 10 * MIB);
    assert_eq!(adm.ledger().offer(), 90 * MIB, "it holds its reserve only");
    assert_eq!(
        adm.enqueue_reserving(&t, reserve, MemoryRequest::from(200 * MIB), 0)
            .err(),
        Some(NotAdmitted::NeverFits {
            requested: 200 * MIB,
            largest: 100 * MIB
        }),
        "a limit no worker's bound allows is refused, whatever its reserve"
    );
}

#[tokio::test(start_paused = true)]
async fn a_job_waits_for_memory_alone_only_when_its_tenant_may_start_it() {
    let adm = admission(4, 8);
    let capped = Arc::new(Tenant {
        max_slots: Some(1),
        ..Tenant::new("capped")
    });
    let other = Arc::new(Tenant::new("other"));
    // Its tenant's slot limit holds it back, three slots free: memory
    // would not start it (warm state is kept).
    let running = adm.admit(&capped, 10 * MIB).await.unwrap();
    let limited = adm.enqueue(&capped, 10 * MIB, 0).unwrap();
    let view = adm.view();
    assert_eq!((view.queued, view.waits_for_memory), (1, false));
    // A job of another tenant that does not fit beside 10 MiB: memory alone.
    let large = adm.enqueue(&other, 95 * MIB, 0).unwrap();
    assert!(adm.view().waits_for_memory);
    drop(large);
    drop(running);
    let started = limited.ticket().await.unwrap();
    assert!(!adm.view().waits_for_memory, "nothing waits");
    drop(started);
}
