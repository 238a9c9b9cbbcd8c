//! `map`'s rules against a scripted [`Submitter`], on Tokio's paused clock:
//! ordering, in-flight limits, memory retries, `--retries`, lost jobs (a
//! broken connection, a dead worker, no answer in time), late answers,
//! the reorder window and Ctrl-C. Each test runs in milliseconds however
//! many simulated seconds it spans; real workers are exercised by the
//! cross-process tests in `tests/`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::client::estimate::SavedEstimate;
use crate::client::submitter::{Capacity, Placed, Submitter};
use crate::proto::JobSpec;

const MIB: u64 = 1 << 20;

/// How the fake answers one submission.
#[derive(Clone, Debug)]
enum Reply {
    /// Exits with `code` after `after`, on `worker`, having peaked at `peak`.
    Exit {
        code: i32,
        after: Duration,
        worker: &'static str,
        peak: u64,
    },
    /// Refused at its limit (what a worker answers to a job over its limit).
    OverLimit { after: Duration, peak: u64 },
    /// The connection broke after `after`.
    Lost { after: Duration },
    /// No worker will take it.
    Fatal,
}

fn ok(after_ms: u64) -> Reply {
    Reply::Exit {
        code: 0,
        after: Duration::from_millis(after_ms),
        worker: "w1",
        peak: 10 * MIB,
    }
}

/// One submission as the fake saw it.
#[derive(Clone, Debug)]
struct Call {
    index: usize,
    attempt: u32,
    memreq: u64,
    at: Duration,
    /// Its input's bytes.
    size: u64,
}

type Script = dyn Fn(&Call) -> Reply + Send + Sync;

/// A target that answers as its script says and records every submission.
#[derive(Clone)]
struct Fake(Arc<FakeState>);

struct FakeState {
    /// What it can take; a test changes it as a pool grows or shrinks.
    capacity: Mutex<Capacity>,
    /// Every backlog report the map made.
    backlogs: Mutex<Vec<Backlog>>,
    in_process: bool,
    script: Box<Script>,
    started: Instant,
    calls: Mutex<Vec<Call>>,
    /// Workers called dead from a point in (simulated) time on.
    dead: Mutex<Vec<(&'static str, Duration)>>,
    under_way: AtomicUsize,
    most_under_way: AtomicUsize,
}

impl Fake {
    fn new(slots: u32, script: impl Fn(&Call) -> Reply + Send + Sync + 'static) -> Fake {
        Fake(Arc::new(FakeState {
            capacity: Mutex::new(Capacity {
                slots,
                largest_job: 4 << 30,
                typical_job: 4 << 30,
                workers: 1,
            }),
            backlogs: Mutex::new(Vec::new()),
            in_process: false,
            script: Box::new(script),
            started: Instant::now(),
            calls: Mutex::new(Vec::new()),
            dead: Mutex::new(Vec::new()),
            under_way: AtomicUsize::new(0),
            most_under_way: AtomicUsize::new(0),
        }))
    }

    fn calls(&self) -> Vec<Call> {
        self.0.calls.lock().unwrap().clone()
    }

    fn attempts_of(&self, index: usize) -> Vec<Call> {
        self.calls()
            .into_iter()
            .filter(|c| c.index == index)
            .collect()
    }

    fn most_under_way(&self) -> usize {
        self.0.most_under_way.load(Ordering::SeqCst)
    }
}

/// Counts a submission as under way until it is answered or dropped.
struct UnderWay<'a>(&'a AtomicUsize);

impl Drop for UnderWay<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Submitter for Fake {
    fn in_process(&self) -> bool {
        self.0.in_process
    }

    async fn capacity(&self) -> anyhow::Result<Capacity> {
        Ok(*self.0.capacity.lock().unwrap())
    }

    async fn report_backlog(&self, backlog: Backlog) {
        self.0.backlogs.lock().unwrap().push(backlog);
    }

    async fn submit(
        &self,
        _job: &Job,
        spec: JobSpec,
        placed: &Placed,
    ) -> Result<JobResult, SubmitError> {
        let s = &self.0;
        let tag = spec.tag.clone().expect("map tags every job");
        let call = Call {
            index: tag.index as usize,
            attempt: tag.attempt,
            memreq: spec.limits.memory_bytes,
            at: s.started.elapsed(),
            size: spec.stdin.len() as u64,
        };
        s.calls.lock().unwrap().push(call.clone());
        let now = s.under_way.fetch_add(1, Ordering::SeqCst) + 1;
        s.most_under_way.fetch_max(now, Ordering::SeqCst);
        let _counted = UnderWay(&s.under_way);
        let reply = (s.script)(&call);
        let (after, worker) = match &reply {
            Reply::Exit { after, worker, .. } => (*after, *worker),
            Reply::OverLimit { after, .. } | Reply::Lost { after } => (*after, "w1"),
            Reply::Fatal => (Duration::ZERO, "w1"),
        };
        placed.set(Some(worker));
        tokio::time::sleep(after).await;
        let memreq = spec.limits.memory_bytes;
        let (outcome, peak) = match reply {
            Reply::Exit { code, peak, .. } => (Outcome::Exited { code }, peak),
            Reply::OverLimit { peak, .. } => (
                Outcome::MemoryLimitExceeded {
                    limit: memreq,
                    peak: memreq,
                    requested: memreq + 64 * 1024,
                },
                peak,
            ),
            Reply::Lost { .. } => {
                return Err(SubmitError::Lost {
                    peer: worker.into(),
                    reason: "connection reset".into(),
                });
            }
            Reply::Fatal => return Err(SubmitError::Fatal("the request is wrong".into())),
        };
        let mut result = JobResult::never_ran(memreq, outcome);
        result.stdout = spec.stdin;
        result.peak_memory_bytes = peak;
        result.wall_time_us = after.as_micros() as u64;
        result.peer = worker.into();
        Ok(result)
    }

    async fn dead_workers(&self) -> Vec<String> {
        let now = self.0.started.elapsed();
        self.0
            .dead
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, from)| now >= *from)
            .map(|(w, _)| w.to_string())
            .collect()
    }
}

fn job() -> Job {
    Job::new(b"\0asm\x01\0\0\0".to_vec())
}

fn inputs(n: usize) -> impl Iterator<Item = Vec<u8>> {
    (0..n).map(|i| format!("input {i}").into_bytes())
}

async fn run(
    fake: &Fake,
    n: usize,
    config: &MapConfig,
) -> (anyhow::Result<MapSummary>, Vec<MapItem>) {
    let mut items = Vec::new();
    let summary = map(fake, &job(), inputs(n), config, &mut items).await;
    (summary, items)
}

fn indexes(items: &[MapItem]) -> Vec<usize> {
    items.iter().map(|i| i.index).collect()
}

#[tokio::test(start_paused = true)]
async fn results_come_in_input_order_whatever_order_answers_come_in() {
    // Later inputs answer first.
    let fake = Fake::new(4, |c| ok(1000 - 40 * c.index as u64));
    let (summary, items) = run(&fake, 20, &MapConfig::default()).await;
    let summary = summary.unwrap();
    assert_eq!(indexes(&items), (0..20).collect::<Vec<_>>());
    for item in &items {
        assert_eq!(
            item.result.stdout,
            format!("input {}", item.index).into_bytes(),
            "each input's own result"
        );
        assert_eq!(item.attempts, 1);
    }
    assert_eq!(
        (
            summary.jobs,
            summary.failed,
            summary.retries(),
            summary.late_answers
        ),
        (20, 0, 0, 0)
    );
    assert!(summary.stopped.is_none() && !summary.interrupted);
}

#[tokio::test(start_paused = true)]
async fn two_submissions_per_slot_are_under_way_until_job_times_are_known() {
    // Every job takes 1 s: PIPELINE_DEPTH (20 ms) of work per slot is
    // less than two jobs, so the limit stays at two per slot.
    let fake = Fake::new(3, |_| ok(1000));
    let (summary, items) = run(&fake, 30, &MapConfig::default()).await;
    summary.unwrap();
    assert_eq!(items.len(), 30);
    assert_eq!(fake.most_under_way(), 6, "2 per slot × 3 slots");

    let fake = Fake::new(3, |_| ok(1000));
    let config = MapConfig {
        max_in_flight: Some(1),
        ..MapConfig::default()
    };
    run(&fake, 5, &config).await.0.unwrap();
    assert_eq!(fake.most_under_way(), 1, "--max-in-flight holds");
}

#[tokio::test(start_paused = true)]
async fn on_the_embedded_worker_one_submission_per_slot_is_under_way_in_input_order() {
    let embedded = Fake(Arc::new(FakeState {
        in_process: true,
        ..Arc::into_inner(Fake::new(3, |c| ok(if c.index % 2 == 0 { 5 } else { 50 })).0).unwrap()
    }));
    let (summary, items) = run(&embedded, 30, &MapConfig::default()).await;
    summary.unwrap();
    assert_eq!(indexes(&items), (0..30).collect::<Vec<_>>());
    assert_eq!(embedded.most_under_way(), 3, "no more under way than slots");
    let launched: Vec<usize> = embedded.calls().iter().map(|c| c.index).collect();
    assert_eq!(
        launched,
        (0..30).collect::<Vec<_>>(),
        "launched in input order"
    );
}

#[tokio::test(start_paused = true)]
async fn short_jobs_get_more_submissions_under_way_per_slot() {
    // 1 ms jobs: 20 ms of work per slot is 20 jobs, once measured.
    let fake = Fake::new(2, |_| ok(1));
    run(&fake, 400, &MapConfig::default()).await.0.unwrap();
    let most = fake.most_under_way();
    assert!(most > 4, "the limit grew past 2 per slot: {most}");
    assert!(most <= 2 * MAX_IN_FLIGHT_PER_SLOT, "{most}");
}

#[tokio::test(start_paused = true)]
async fn a_job_over_an_estimated_limit_goes_again_with_double_without_using_a_retry() {
    // Starts from a saved 100 MiB; the job needs 300 MiB.
    let fake = Fake::new(2, |c| {
        if c.memreq < 300 * MIB {
            Reply::OverLimit {
                after: Duration::from_millis(5),
                peak: c.memreq,
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
    let asked: Vec<u64> = fake.attempts_of(0).iter().map(|c| c.memreq / MIB).collect();
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
    assert_eq!(summary.learned_memreq, Some(350 * MIB), "280 MiB × 1.25");
}

#[tokio::test(start_paused = true)]
async fn requests_follow_the_input_size_once_it_predicts_memory() {
    use crate::client::estimate::Model;
    // A job whose peak is 8 × its input's bytes + 1 MiB.
    let peak_of = |size: u64| 8 * size + MIB;
    let fake = Fake::new(4, move |c| {
        let peak = peak_of(c.size);
        if c.memreq < peak {
            Reply::OverLimit {
                after: Duration::from_millis(5),
                peak: c.memreq,
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
            c.memreq >= peak && c.memreq <= peak + 128 * 1024,
            "input {} of {} B asked {} for a peak of {peak}",
            c.index,
            c.size,
            c.memreq
        );
    }
    // A small input asks for less than a large one.
    let asks = |size: u64| {
        late.iter()
            .find(|c| c.size == size)
            .map(|c| c.memreq)
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
        mem: Some(100 * MIB),
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
async fn a_job_on_a_worker_declared_dead_goes_again_and_its_late_answer_is_dropped() {
    // Input 0's first try sits on w-dead, which answers only after 5 s;
    // the pool calls w-dead dead at 1 s. Input 1 keeps the map going
    // past 5 s, so the late answer does arrive.
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
    assert_eq!((summary.lost, summary.late_answers), (1, 1));
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
async fn the_map_runs_at_most_the_reorder_window_ahead_of_its_next_result() {
    let fake = Fake::new(8, |c| if c.index == 0 { ok(10_000) } else { ok(10) });
    let config = MapConfig {
        reorder_window: 4,
        ..MapConfig::default()
    };
    let (summary, items) = run(&fake, 12, &config).await;
    summary.unwrap();
    assert_eq!(items.len(), 12);
    let early: Vec<usize> = fake
        .calls()
        .iter()
        .filter(|c| c.at < Duration::from_secs(10))
        .map(|c| c.index)
        .collect();
    assert_eq!(
        early,
        [0, 1, 2, 3],
        "nothing past the window while input 0 is out"
    );
}

#[tokio::test(start_paused = true)]
async fn an_unordered_map_hands_results_over_as_they_arrive_and_a_slow_input_holds_back_nothing() {
    // Input 0 takes 10 s; the rest 10 ms, later ones faster still.
    let fake = Fake::new(2, |c| {
        if c.index == 0 {
            ok(10_000)
        } else {
            ok(100 - 5 * c.index as u64)
        }
    });
    let config = MapConfig {
        ordered: false,
        reorder_window: 4,
        ..MapConfig::default()
    };
    let (summary, items) = run(&fake, 12, &config).await;
    summary.unwrap();
    let mut got = indexes(&items);
    assert_eq!(got.last(), Some(&0), "the slow input last: {got:?}");
    got.sort();
    assert_eq!(got, (0..12).collect::<Vec<_>>(), "each input once");
    for item in &items {
        assert_eq!(
            item.result.stdout,
            format!("input {}", item.index).into_bytes()
        );
    }
    let early = fake
        .calls()
        .iter()
        .filter(|c| c.at < Duration::from_secs(10))
        .count();
    assert_eq!(
        early, 12,
        "the window counts what is not done, not what is not handed over"
    );
}

#[tokio::test(start_paused = true)]
async fn an_unordered_map_stops_at_a_failure_and_hands_it_over() {
    let fake = Fake::new(1, |c| {
        if c.index == 3 {
            Reply::Exit {
                code: 1,
                after: Duration::from_millis(10),
                worker: "w1",
                peak: MIB,
            }
        } else {
            ok(10)
        }
    });
    let config = MapConfig {
        ordered: false,
        max_in_flight: Some(1),
        ..MapConfig::default()
    };
    let (summary, items) = run(&fake, 10, &config).await;
    let summary = summary.unwrap();
    assert_eq!(summary.stopped.map(|s| s.index), Some(3));
    assert_eq!(indexes(&items), [0, 1, 2, 3], "nothing after the failure");
    assert!(!items[3].succeeded());
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
        mem: Some(8 << 30),
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
async fn a_worker_that_joins_mid_map_gets_work_and_the_backlog_is_reported() {
    // One slot at first; 100 jobs of a second each.
    let fake = Fake::new(1, |_| ok(1000));
    let grower = fake.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(5)).await;
        // Three more workers of one slot join.
        *grower.0.capacity.lock().unwrap() = Capacity {
            slots: 4,
            largest_job: 4 << 30,
            typical_job: 4 << 30,
            workers: 4,
        };
    });
    let (summary, items) = run(&fake, 100, &MapConfig::default()).await;
    let summary = summary.unwrap();
    assert_eq!(items.len(), 100);
    assert!(
        fake.most_under_way() >= 8,
        "the window followed the pool to 2 per slot × 4: {}",
        fake.most_under_way()
    );
    // About 5 s on one slot, then ~95 jobs on four: well under the 100 s on one.
    assert!(
        summary.elapsed < Duration::from_secs(45),
        "{:?}",
        summary.elapsed
    );
    let reports = fake.0.backlogs.lock().unwrap().clone();
    assert!(reports.len() >= 5, "a report a second: {}", reports.len());
    let first = &reports[0];
    assert_eq!(
        first.waiting + first.running,
        100,
        "nothing done at the first report: {first:?}"
    );
    assert!(first.waiting > 90 && first.running >= 1, "{first:?}");
    assert!(
        reports.iter().skip(1).any(|r| r.job_ms == 1000),
        "the mean job time is learned"
    );
    assert!(
        reports.windows(2).all(|w| w[0].id == w[1].id),
        "one id for the map"
    );
    let last = reports.last().unwrap();
    assert!(
        last.is_empty(),
        "the map's end clears its backlog: {last:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_shrinking_pool_narrows_the_window() {
    let fake = Fake::new(8, |_| ok(1000));
    let shrinker = fake.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        *shrinker.0.capacity.lock().unwrap() = Capacity {
            slots: 1,
            largest_job: 4 << 30,
            typical_job: 4 << 30,
            workers: 1,
        };
    });
    let calls_before = |fake: &Fake, t: Duration| fake.calls().iter().filter(|c| c.at < t).count();
    let (summary, _) = run(&fake, 60, &MapConfig::default()).await;
    summary.unwrap();
    // 16 under way at first; once the pool has shrunk to one slot, two
    // (jobs of a second: two a second, where 16 would be 128 in 8 s).
    let early = calls_before(&fake, Duration::from_millis(1200));
    let later =
        calls_before(&fake, Duration::from_secs(12)) - calls_before(&fake, Duration::from_secs(4));
    assert!(early >= 16, "{early}");
    assert!(later <= 20, "two under way on the one slot left: {later}");
}
