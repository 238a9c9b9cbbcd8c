//! A map's faults: failing jobs and retries, fatal answers, lost jobs
//! and dead workers, silence, interrupts, and what no input can get past.

use super::*;

#[tokio::test(start_paused = true)]
async fn a_failing_job_is_retried_up_to_retries_then_stops_the_map_after_the_inputs_before_it() {
    let script = |c: &Call| {
        let code = if c.index == 3 { 1 } else { 0 };
        Reply::Exit {
            code,
            after: Duration::from_millis(10),
            worker: "w1",
            peak: MIB,
        }
    };
    let fake = Fake::new(2, script);
    let config = MapConfig {
        retries: 2,
        ..MapConfig::default()
    };
    let (summary, items) = run(&fake, 10, &config).await;
    let summary = summary.unwrap();
    assert_eq!(
        fake.attempts_of(3).len(),
        3,
        "the first try and two retries"
    );
    assert_eq!(summary.failure_retries, 2);
    let stopped = summary.stopped.expect("the map stopped");
    assert_eq!(stopped.index, 3);
    assert!(
        stopped.message.starts_with("input 3 (line 4) failed"),
        "{}",
        stopped.message
    );
    assert_eq!(
        indexes(&items),
        [0, 1, 2, 3],
        "nothing after the failing input is handed over"
    );
    assert!(!items[3].succeeded() && items[3].attempts == 3);

    // With keep_going every input gets its result.
    let fake = Fake::new(2, script);
    let config = MapConfig {
        keep_going: true,
        ..MapConfig::default()
    };
    let (summary, items) = run(&fake, 10, &config).await;
    let summary = summary.unwrap();
    assert_eq!(indexes(&items), (0..10).collect::<Vec<_>>());
    assert_eq!((summary.failed, summary.failure_retries), (1, 0));
    assert!(summary.stopped.is_none());
}

#[tokio::test(start_paused = true)]
async fn a_fatal_answer_ends_the_map_with_an_error() {
    let fake = Fake::new(2, |c| if c.index == 1 { Reply::Fatal } else { ok(10) });
    let (summary, _) = run(&fake, 4, &MapConfig::default()).await;
    assert_eq!(summary.unwrap_err().to_string(), "the request is wrong");
}

#[tokio::test(start_paused = true)]
async fn a_job_lost_with_its_worker_goes_again_without_using_a_retry() {
    let fake = Fake::new(2, |c| {
        if c.index == 2 && c.attempt == 1 {
            Reply::Lost {
                after: Duration::from_millis(30),
            }
        } else {
            ok(10)
        }
    });
    let (summary, items) = run(&fake, 5, &MapConfig::default()).await;
    let summary = summary.unwrap();
    assert_eq!(indexes(&items), (0..5).collect::<Vec<_>>());
    assert_eq!(
        (summary.lost, summary.failure_retries, summary.failed),
        (1, 0, 0)
    );
    assert_eq!(items[2].attempts, 2);
}

#[tokio::test(start_paused = true)]
async fn a_job_on_a_worker_declared_dead_goes_again_and_its_first_submission_is_dropped() {
    // Input 0's first try sits on w-dead, which would answer only after
    // 5 s; the pool calls w-dead dead at 1 s. Input 1 keeps the map going
    // past 5 s, so a late answer would arrive — but the first submission
    // is dropped as soon as the second answers.
    let fake = Fake::new(2, |c| match (c.index, c.attempt) {
        (0, 1) => Reply::Exit {
            code: 0,
            after: Duration::from_secs(5),
            worker: "w-dead",
            peak: MIB,
        },
        (1, _) => ok(8000),
        _ => ok(10),
    });
    fake.0
        .dead
        .lock()
        .unwrap()
        .push(("w-dead", Duration::from_secs(1)));
    let (summary, items) = run(&fake, 2, &MapConfig::default()).await;
    let summary = summary.unwrap();
    assert_eq!(indexes(&items), [0, 1], "one result per input");
    assert_eq!(items[0].result.peer, "w1", "the resubmission's answer");
    assert_eq!(items[0].attempts, 2);
    let again = &fake.attempts_of(0)[1];
    assert!(
        again.at >= Duration::from_secs(1) && again.at < Duration::from_millis(1300),
        "{:?}",
        again.at
    );
    assert_eq!((summary.lost, summary.late_answers), (1, 0));
    let dropped = fake.0.dropped.lock().unwrap().clone();
    assert!(
        dropped
            .iter()
            .any(|&(i, attempt, at)| (i, attempt) == (0, 1) && at < Duration::from_millis(1400)),
        "{dropped:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn no_answer_in_three_round_trips_plus_slack_counts_as_lost() {
    // Round trips of 100 ms and 1 s of slack: a job unanswered after
    // 1.3 s is given up on and submitted again.
    let fake = Fake::new(1, |c| match (c.index, c.attempt) {
        (1, 1) => ok(3_600_000),
        _ => ok(100),
    });
    let config = MapConfig {
        lost_slack: Duration::from_secs(1),
        max_in_flight: Some(1),
        ..MapConfig::default()
    };
    let (summary, items) = run(&fake, 3, &config).await;
    let summary = summary.unwrap();
    assert_eq!(indexes(&items), [0, 1, 2]);
    let tries = fake.attempts_of(1);
    assert_eq!(tries.len(), 2);
    let waited = tries[1].at - tries[0].at;
    assert!(
        waited > Duration::from_millis(1300) && waited < Duration::from_millis(1600),
        "{waited:?}"
    );
    assert_eq!(summary.lost, 1);
}

#[tokio::test(start_paused = true)]
async fn an_interrupt_hands_over_what_is_in_and_drops_what_is_under_way() {
    // Even inputs answer at once, odd ones after an hour.
    let fake = Fake::new(4, |c| {
        if c.index % 2 == 0 {
            ok(100)
        } else {
            ok(3_600_000)
        }
    });
    let interrupt = CancellationToken::new();
    let config = MapConfig {
        interrupt: Some(interrupt.clone()),
        ..MapConfig::default()
    };
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        interrupt.cancel();
    });
    let (summary, items) = run(&fake, 4, &config).await;
    let summary = summary.unwrap();
    assert!(summary.interrupted);
    assert_eq!(
        indexes(&items),
        [0, 2],
        "input 2 is handed over past the gap at 1"
    );
    tokio::task::yield_now().await;
    assert_eq!(
        fake.0.under_way.load(Ordering::SeqCst),
        0,
        "the submissions under way were dropped"
    );
}

#[tokio::test(start_paused = true)]
async fn what_no_input_can_get_past_is_an_error_up_front() {
    let fake = Fake::new(2, |_| ok(1));
    let config = MapConfig {
        mem: Some((8 << 30).into()),
        ..MapConfig::default()
    };
    let e = run(&fake, 1, &config).await.0.unwrap_err().to_string();
    assert_eq!(
        e,
        "no peer can hold a job of 8 GiB: the largest the pool can take is 4 GiB"
    );

    let none = Fake(Arc::new(FakeState {
        capacity: Mutex::new(Capacity {
            slots: 0,
            largest_job: 0,
            largest_beside_warm: 0,
            typical_job: 0,
            workers: 0,
        }),
        ..Arc::into_inner(Fake::new(1, |_| ok(1)).0).unwrap()
    }));
    assert_eq!(
        run(&none, 1, &MapConfig::default())
            .await
            .0
            .unwrap_err()
            .to_string(),
        "no live worker in the pool"
    );

    let embedded = Fake(Arc::new(FakeState {
        in_process: true,
        ..Arc::into_inner(Fake::new(1, |_| ok(1)).0).unwrap()
    }));
    let config = MapConfig {
        out_dir: Some("out".into()),
        ..MapConfig::default()
    };
    let e = run(&embedded, 1, &config).await.0.unwrap_err().to_string();
    assert!(e.starts_with("--out-dir needs a pool"), "{e}");
    assert!(
        embedded.calls().is_empty() && none.calls().is_empty(),
        "nothing was submitted"
    );
}

#[tokio::test(start_paused = true)]
async fn an_input_lost_with_whatever_runs_it_is_given_up_after_max_lost() {
    // Input 2 is lost every time (its worker dies under it, say).
    let script = |c: &Call| {
        if c.index == 2 {
            Reply::Lost {
                after: Duration::from_millis(30),
            }
        } else {
            ok(10)
        }
    };
    let fake = Fake::new(2, script);
    let (summary, items) = run(&fake, 6, &MapConfig::default()).await;
    let summary = summary.unwrap();
    assert_eq!(
        fake.attempts_of(2).len(),
        DEFAULT_MAX_LOST as usize,
        "run again until it was lost max_lost times, then not again"
    );
    assert_eq!(indexes(&items), [0, 1, 2], "it stops the map as a failure");
    match &items[2].result.outcome {
        Outcome::Lost { reason } => assert!(
            reason.starts_with("lost 3 times with the process running it, the last: lost with worker w1: connection reset"),
            "{reason}"
        ),
        other => panic!("expected lost, got {other:?}"),
    }
    assert_eq!(items[2].attempts, 3);
    let stopped = summary.stopped.expect("stopped");
    assert!(
        stopped.message.contains("job lost: lost 3 times"),
        "{}",
        stopped.message
    );

    // With keep_going the others all get theirs; max_lost is a knob.
    let fake = Fake::new(2, script);
    let config = MapConfig {
        keep_going: true,
        max_lost: 1,
        ..MapConfig::default()
    };
    let (summary, items) = run(&fake, 6, &config).await;
    let summary = summary.unwrap();
    assert_eq!(indexes(&items), (0..6).collect::<Vec<_>>());
    assert_eq!(fake.attempts_of(2).len(), 1);
    assert_eq!((summary.failed, summary.lost), (1, 1));
}

#[tokio::test(start_paused = true)]
async fn a_worker_shutting_down_under_a_job_does_not_count_against_max_lost() {
    // Input 1's first five workers drain under it; the sixth runs it.
    let fake = Fake::new(2, |c| match (c.index, c.attempt) {
        (1, 1..=5) => Reply::Drained {
            after: Duration::from_millis(30),
        },
        _ => ok(10),
    });
    let (summary, items) = run(&fake, 3, &MapConfig::default()).await;
    let summary = summary.unwrap();
    assert_eq!(indexes(&items), [0, 1, 2]);
    assert!(items[1].succeeded(), "{:?}", items[1].result.outcome);
    assert_eq!(items[1].attempts, 6);
    assert_eq!((summary.lost, summary.failed), (5, 0));
}

#[tokio::test(start_paused = true)]
async fn a_long_job_gets_one_copy_not_one_every_few_seconds_and_the_copy_ends_with_it() {
    // Input 5 computes a minute, amid jobs of a second: with 10 s of slack
    // it is slow after 13 s. Input 7 keeps the map going for two minutes.
    let fake = Fake::new(2, |c| match c.index {
        5 => ok(60_000),
        7 => ok(120_000),
        _ => ok(1000),
    });
    let (summary, items) = run(&fake, 8, &MapConfig::default()).await;
    let summary = summary.unwrap();
    assert_eq!(indexes(&items), (0..8).collect::<Vec<_>>());
    assert!(items.iter().all(MapItem::succeeded));
    let tries = fake.attempts_of(5);
    assert_eq!(tries.len(), 2, "one copy, not one every 13 s: {tries:?}");
    assert!(
        tries[1].at > Duration::from_secs(13) && tries[1].at < Duration::from_secs(20),
        "{:?}",
        tries[1].at
    );
    // The first answered at ~61 s; the copy was cancelled then, not left
    // computing until the map's end at ~121 s.
    let dropped = fake.0.dropped.lock().unwrap().clone();
    let copy = dropped
        .iter()
        .find(|(i, attempt, _)| (*i, *attempt) == (5, 2))
        .expect("the copy was cancelled");
    assert!(
        copy.2 > Duration::from_secs(60) && copy.2 < Duration::from_secs(63),
        "{dropped:?}"
    );
    // Input 7, slow too, got its one copy.
    assert_eq!(fake.attempts_of(7).len(), 2);
    assert_eq!(summary.lost, 2);
}
