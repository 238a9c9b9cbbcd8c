//! Smartmem in a map: a job over a limit we estimated goes again with
//! more, requests follow input size once it predicts memory, a fixed limit
//! is never raised, nor is each input's own given request.

use super::*;

#[tokio::test(start_paused = true)]
async fn a_job_over_an_estimated_limit_goes_again_with_double_without_using_a_retry() {
    // Starts from a saved 100 MiB; the job needs 300 MiB.
    let fake = Fake::new(2, |c| {
        if c.asked < 300 * MIB {
            Reply::OverLimit {
                after: Duration::from_millis(5),
                peak: c.asked,
            }
        } else {
            Reply::Exit {
                code: 0,
                after: Duration::from_millis(5),
                worker: "w1",
                peak: 280 * MIB,
            }
        }
    });
    let start = SavedEstimate {
        peak_bytes: 80 * MIB,
        memreq_bytes: 100 * MIB,
        jobs: 1,
        model: None,
    };
    let config = MapConfig {
        start_estimate: Some(start),
        ..MapConfig::default()
    };
    let (summary, items) = run(&fake, 1, &config).await;
    let summary = summary.unwrap();
    let asked: Vec<u64> = fake.attempts_of(0).iter().map(|c| c.asked / MIB).collect();
    assert_eq!(
        asked,
        [100, 200, 400],
        "doubled each time (at least what it asked for)"
    );
    assert_eq!(
        (
            summary.memory_retries,
            summary.failure_retries,
            summary.failed
        ),
        (2, 0, 0)
    );
    assert!(items[0].succeeded());
    assert_eq!(items[0].attempts, 3);
    assert_eq!(
        summary.learned_request,
        Some(MemoryRequest::from(350 * MIB)),
        "280 MiB × 1.25"
    );
}

#[tokio::test(start_paused = true)]
async fn requests_follow_the_input_size_once_it_predicts_memory() {
    use crate::client::estimate::Model;
    // A job whose peak is 8 × its input's bytes + 1 MiB.
    let peak_of = |size: u64| 8 * size + MIB;
    let fake = Fake::new(4, move |c| {
        let peak = peak_of(c.size);
        if c.asked < peak {
            Reply::OverLimit {
                after: Duration::from_millis(5),
                peak: c.asked,
            }
        } else {
            Reply::Exit {
                code: 0,
                after: Duration::from_millis(5),
                worker: "w1",
                peak,
            }
        }
    });
    let inputs: Vec<Vec<u8>> = (0..200)
        .map(|i| vec![b'x'; (64 << 10) * (1 + i % 16)])
        .collect();
    let mut items = Vec::new();
    let summary = map(&fake, &job(), inputs, &MapConfig::default(), &mut items)
        .await
        .unwrap();
    assert_eq!(summary.failed, 0);
    let model = summary
        .learned_model
        .expect("a model once results enough came in");
    assert!(matches!(model, Model::BySize { .. }), "{model:?}");
    assert!(
        model
            .describe()
            .starts_with("peak ≈ 8.00 × input bytes + 1.0 MiB"),
        "{}",
        model.describe()
    );
    // Once learned, each input asks in proportion to its own size.
    let late: Vec<Call> = fake
        .calls()
        .into_iter()
        .filter(|c| c.index >= 100 && c.attempt == 1)
        .collect();
    assert!(late.len() >= 90);
    for c in &late {
        let peak = peak_of(c.size);
        assert!(
            c.asked >= peak && c.asked <= peak + 128 * 1024,
            "input {} of {} B asked {} for a peak of {peak}",
            c.index,
            c.size,
            c.asked
        );
    }
    // A small input asks for less than a large one.
    let asks = |size: u64| {
        late.iter()
            .find(|c| c.size == size)
            .map(|c| c.asked)
            .unwrap()
    };
    assert!(asks(64 << 10) * 4 < asks(1 << 20));
}

#[tokio::test(start_paused = true)]
async fn a_fixed_memory_limit_is_never_raised() {
    let fake = Fake::new(2, |_| Reply::OverLimit {
        after: Duration::from_millis(5),
        peak: 100 * MIB,
    });
    let config = MapConfig {
        mem: Some((100 * MIB).into()),
        ..MapConfig::default()
    };
    let (summary, items) = run(&fake, 3, &config).await;
    let summary = summary.unwrap();
    assert_eq!(summary.memory_retries, 0);
    assert_eq!(fake.attempts_of(0).len(), 1);
    assert_eq!(
        summary.stopped.as_ref().map(|s| s.index),
        Some(0),
        "the first failure stops the map"
    );
    assert_eq!(indexes(&items), [0]);
}

#[tokio::test(start_paused = true)]
async fn each_input_asks_for_the_memory_its_submitter_gave_it_largest_first_and_never_more() {
    // Input 2 peaks over what it was given: it fails, as under `mem`.
    let fake = Fake::new(1, |c| {
        if c.index == 2 {
            Reply::OverLimit {
                after: Duration::from_millis(5),
                peak: c.asked,
            }
        } else {
            ok(5)
        }
    });
    let given: Vec<MemoryRequest> = [3, 9, 1, 7, 5, 2]
        .into_iter()
        .map(|mib| (mib * MIB).into())
        .collect();
    let config = MapConfig {
        mem_per_input: Some(given.into()),
        keep_going: true,
        ..MapConfig::default()
    };
    let (summary, items) = run(&fake, 6, &config).await;
    let summary = summary.unwrap();
    let asked: Vec<(usize, u64)> = fake
        .calls()
        .iter()
        .map(|c| (c.index, c.asked / MIB))
        .collect();
    // Two under way on one slot: the largest of those read goes first.
    assert_eq!(&asked[..2], [(1, 9), (3, 7)], "{asked:?}");
    let mut each: Vec<(usize, u64)> = asked.clone();
    each.sort();
    assert_eq!(each, [(0, 3), (1, 9), (2, 1), (3, 7), (4, 5), (5, 2)]);
    assert_eq!(summary.memory_retries, 0, "a given request is never raised");
    assert_eq!(summary.failed, 1);
    assert_eq!(indexes(&items), [0, 1, 2, 3, 4, 5]);
    assert!(summary.learned_request.is_none(), "nothing is learned");

    // One input no worker can hold is an error before anything runs.
    let too_big = MapConfig {
        mem_per_input: Some(vec![MIB.into(), (8u64 << 30).into()].into()),
        ..MapConfig::default()
    };
    let fake = Fake::new(1, |_| ok(1));
    let e = run(&fake, 2, &too_big).await.0.unwrap_err().to_string();
    assert!(e.starts_with("no peer can hold a job of 8 GiB"), "{e}");
    assert!(fake.calls().is_empty());
}
