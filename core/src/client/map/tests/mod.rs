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
use crate::proto::{JobSpec, Outcome};

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
    /// The connection broke after `after` (or the process running it died).
    Lost { after: Duration },
    /// Its worker shut down under it after `after` (an orderly loss).
    Drained { after: Duration },
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
    asked: u64,
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
    /// Submissions dropped before they answered: (index, attempt, when).
    dropped: Mutex<Vec<(usize, u32, Duration)>>,
}

impl Fake {
    fn new(slots: u32, script: impl Fn(&Call) -> Reply + Send + Sync + 'static) -> Fake {
        Fake(Arc::new(FakeState {
            capacity: Mutex::new(Capacity {
                slots,
                largest_job: 4 << 30,
                largest_beside_warm: 4 << 30,
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
            dropped: Mutex::new(Vec::new()),
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

/// Counts a submission as under way until it is answered or dropped, and
/// records it if it was dropped first.
struct UnderWay<'a> {
    state: &'a FakeState,
    call: Call,
    answered: bool,
}

impl Drop for UnderWay<'_> {
    fn drop(&mut self) {
        self.state.under_way.fetch_sub(1, Ordering::SeqCst);
        if !self.answered {
            let at = self.state.started.elapsed();
            let (index, attempt) = (self.call.index, self.call.attempt);
            self.state
                .dropped
                .lock()
                .unwrap()
                .push((index, attempt, at));
        }
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
            asked: spec.limits.memory.bytes(),
            at: s.started.elapsed(),
            size: spec.stdin.len() as u64,
        };
        s.calls.lock().unwrap().push(call.clone());
        let now = s.under_way.fetch_add(1, Ordering::SeqCst) + 1;
        s.most_under_way.fetch_max(now, Ordering::SeqCst);
        let mut counted = UnderWay {
            state: s,
            call: call.clone(),
            answered: false,
        };
        let reply = (s.script)(&call);
        let (after, worker) = match &reply {
            Reply::Exit { after, worker, .. } => (*after, *worker),
            Reply::OverLimit { after, .. } | Reply::Lost { after } | Reply::Drained { after } => {
                (*after, "w1")
            }
            Reply::Fatal => (Duration::ZERO, "w1"),
        };
        placed.set(Some(worker));
        tokio::time::sleep(after).await;
        counted.answered = true;
        let asked = spec.limits.memory.bytes();
        let (outcome, peak) = match reply {
            Reply::Exit { code, peak, .. } => (Outcome::Exited { code }, peak),
            Reply::OverLimit { peak, .. } => (
                Outcome::MemoryLimitExceeded {
                    limit: asked,
                    peak: asked,
                    requested: asked + 64 * 1024,
                },
                peak,
            ),
            Reply::Lost { .. } | Reply::Drained { .. } => {
                let killed = matches!(reply, Reply::Lost { .. });
                return Err(SubmitError::Lost {
                    peer: worker.into(),
                    reason: if killed {
                        "connection reset"
                    } else {
                        "the worker shut down"
                    }
                    .into(),
                    killed,
                });
            }
            Reply::Fatal => return Err(SubmitError::Fatal("the request is wrong".into())),
        };
        let mut result = JobResult::never_ran(asked, outcome);
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

mod faults;
mod memory;

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

/// Takes nothing it is handed until `reads_at`, then everything.
struct SlowReader {
    reads_at: tokio::time::Instant,
    items: Vec<MapItem>,
}

impl MapObserver for SlowReader {
    fn result(&mut self, item: MapItem) -> anyhow::Result<()> {
        self.items.push(item);
        Ok(())
    }

    fn unread(&self) -> usize {
        match tokio::time::Instant::now() < self.reads_at {
            true => self.items.len(),
            false => 0,
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_reader_slower_than_the_map_holds_it_to_the_window_ordered_or_not() {
    for ordered in [true, false] {
        let fake = Fake::new(8, |_| ok(10));
        let config = MapConfig {
            reorder_window: 4,
            ordered,
            ..MapConfig::default()
        };
        let mut reader = SlowReader {
            reads_at: tokio::time::Instant::now() + Duration::from_secs(10),
            items: Vec::new(),
        };
        map(&fake, &job(), inputs(12), &config, &mut reader)
            .await
            .unwrap();
        let mut done: Vec<usize> = reader.items.iter().map(|i| i.index).collect();
        done.sort();
        assert_eq!(
            done,
            (0..12).collect::<Vec<_>>(),
            "every input, once the reader reads"
        );
        let early = fake
            .calls()
            .iter()
            .filter(|c| c.at < Duration::from_secs(10))
            .count();
        assert_eq!(
            early, 4,
            "ordered {ordered}: nothing launched past 4 results the reader has not taken"
        );
    }
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
            largest_beside_warm: 4 << 30,
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
            largest_beside_warm: 4 << 30,
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
