//! Warm starts on a reactor of our own (the shape CPython for WASI has:
//! `memory`, `host_alloc`, `turn`): each job starts from its snapshot, in a
//! fresh instance or in the one the job before it left, and never sees
//! what another job wrote, grew or broke.

use peerwasm_core::proto::{JobSpec, MemoryRequest, Outcome, WarmStart};
use peerwasm_core::runner::JobRunner;
use peerwasm_core::sandbox::{SandboxConfig, WarmStats};

use super::support::{runner, wat_job};

/// A reactor whose turn is one letter: `p` (the prelude) marks bytes at
/// 100 and 70000; `r` returns 0 when the memory reads as the prelude left
/// it (marks, a byte the prelude left zero, two pages, the stack pointer)
/// and which check failed if not; `w` writes over all three; `x` writes and
/// returns 3; `g` grows the memory and writes; `t` writes, moves the stack
/// pointer and traps.
const REACTOR: &str = r#"
(module
  (memory (export "memory") 2)
  (global $sp (mut i32) (i32.const 65536))
  (func (export "host_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "turn") (param $p i32) (param $n i32) (result i32)
    (local $op i32)
    (local.set $op (i32.load8_u (local.get $p)))
    (if (i32.eq (local.get $op) (i32.const 112)) (then
      (i32.store8 (i32.const 100) (i32.const 7))
      (i32.store8 (i32.const 70000) (i32.const 9))
      (return (i32.const 0))))
    (if (i32.eq (local.get $op) (i32.const 114)) (then
      (if (i32.ne (i32.load8_u (i32.const 100)) (i32.const 7)) (then (return (i32.const 11))))
      (if (i32.ne (i32.load8_u (i32.const 70000)) (i32.const 9)) (then (return (i32.const 12))))
      (if (i32.ne (i32.load8_u (i32.const 120000)) (i32.const 0)) (then (return (i32.const 13))))
      (if (i32.ne (memory.size) (i32.const 2)) (then (return (i32.const 14))))
      (if (i32.ne (global.get $sp) (i32.const 65536)) (then (return (i32.const 15))))
      (return (i32.const 0))))
    (if (i32.eq (local.get $op) (i32.const 119)) (then
      (i32.store8 (i32.const 100) (i32.const 99))
      (i32.store8 (i32.const 70000) (i32.const 98))
      (i32.store8 (i32.const 120000) (i32.const 97))
      (return (i32.const 0))))
    (if (i32.eq (local.get $op) (i32.const 120)) (then
      (i32.store8 (i32.const 100) (i32.const 77))
      (return (i32.const 3))))
    (if (i32.eq (local.get $op) (i32.const 103)) (then
      (drop (memory.grow (i32.const 16)))
      (i32.store8 (i32.const 200000) (i32.const 5))
      (i32.store8 (i32.const 100) (i32.const 55))
      (return (i32.const 0))))
    (if (i32.eq (local.get $op) (i32.const 116)) (then
      (i32.store8 (i32.const 100) (i32.const 66))
      (global.set $sp (i32.const 0))
      unreachable))
    (i32.const 2)))
"#;

const PAGE: u64 = 64 << 10;

fn job(runner: &JobRunner, prelude: &str, turn: &str) -> JobSpec {
    let mut spec = wat_job(runner, REACTOR);
    spec.warm = Some(WarmStart {
        prelude: prelude.into(),
        turn: turn.into(),
    });
    spec
}

/// Runs `turn` after the prelude `p`: its outcome, its peak, and the warm
/// counters after it.
fn run(runner: &JobRunner, turn: &str) -> (Outcome, u64, WarmStats) {
    let r = runner.run_blocking(job(runner, "p", turn));
    (
        r.outcome,
        r.peak_memory_bytes,
        runner.sandbox().warm_stats(),
    )
}

fn exited(code: i32) -> Outcome {
    Outcome::Exited { code }
}

#[test]
fn each_job_starts_from_the_snapshot_in_the_instance_the_last_one_left_or_a_fresh_one() {
    let runner = runner(SandboxConfig::default());
    // The first runs the prelude and makes the snapshot; the next starts
    // from it, and writes over it.
    assert_eq!(run(&runner, "r").0, exited(0));
    let (outcome, _, stats) = run(&runner, "w");
    assert_eq!(outcome, exited(0));
    assert_eq!(
        (stats.snapshots, stats.warm_starts, stats.resident_starts),
        (1, 1, 0)
    );

    // The next runs in the instance `w` left, which reads as the snapshot
    // again, at the snapshot's size and peak.
    let (outcome, peak, stats) = run(&runner, "r");
    assert_eq!(outcome, exited(0), "what `w` wrote was put back");
    assert_eq!(peak, 2 * PAGE);
    assert_eq!(stats.resident_starts, 1);

    // A turn that returns a failure still returns: its instance is kept,
    // and what it wrote is gone for the next.
    let (outcome, _, stats) = run(&runner, "x");
    assert_eq!((outcome, stats.resident_starts), (exited(3), 2));
    let (outcome, _, stats) = run(&runner, "r");
    assert_eq!((outcome, stats.resident_starts), (exited(0), 3));

    // One that grows its memory is not kept: the next starts afresh, at
    // the snapshot's size and peak, not the grown one's.
    let (outcome, peak, stats) = run(&runner, "g");
    assert_eq!((outcome, peak), (exited(0), 18 * PAGE));
    assert_eq!(stats.resident_starts, 4);
    let (outcome, peak, stats) = run(&runner, "r");
    assert_eq!(
        (outcome, peak, stats.resident_starts),
        (exited(0), 2 * PAGE, 4)
    );

    // One that traps after moving its stack pointer is not kept either.
    let (outcome, _, stats) = run(&runner, "t");
    assert!(matches!(outcome, Outcome::Trapped { .. }), "{outcome:?}");
    assert_eq!(stats.resident_starts, 5);
    let (outcome, _, stats) = run(&runner, "r");
    assert_eq!(
        (outcome, stats.resident_starts),
        (exited(0), 5),
        "a fresh instance"
    );
    assert_eq!(run(&runner, "r").2.resident_starts, 6);
}

#[test]
fn a_resident_instance_serves_only_its_own_snapshot_and_within_the_job_s_limit() {
    let runner = runner(SandboxConfig::default());
    // Cold, from the snapshot (then kept), in the kept instance.
    for _ in 0..3 {
        assert_eq!(run(&runner, "w").0, exited(0));
    }
    let before = runner.sandbox().warm_stats();
    assert_eq!(before.resident_starts, 1);

    // Another prelude is another snapshot: it starts cold, not in the
    // instance left by the first.
    let other = runner.run_blocking(job(&runner, "p ", "r"));
    assert_eq!(other.outcome, exited(0));
    let stats = runner.sandbox().warm_stats();
    assert_eq!(
        (stats.snapshots, stats.resident_starts),
        (before.snapshots + 1, 1)
    );

    // A limit below the snapshot's size ends the job as it would in a
    // fresh instance; the instance is not kept for a job that did not run.
    let mut small = job(&runner, "p", "r");
    small.limits.memory = MemoryRequest::from(PAGE);
    let r = runner.run_blocking(small);
    assert!(
        matches!(r.outcome, Outcome::MemoryLimitExceeded { limit, .. } if limit == PAGE),
        "{:?}",
        r.outcome
    );
    assert_eq!(runner.sandbox().warm_stats().resident_starts, 2);
    let (outcome, _, stats) = run(&runner, "r");
    assert_eq!((outcome, stats.resident_starts), (exited(0), 2));
}

#[test]
fn an_instance_is_not_kept_past_its_snapshot() {
    let runner = runner(SandboxConfig::default());
    // Cold, from the snapshot (then kept), in the kept instance.
    for _ in 0..3 {
        assert_eq!(run(&runner, "r").0, exited(0));
    }
    assert_eq!(runner.sandbox().warm_stats().resident_starts, 1);
    // Four other preludes: the first snapshot leaves the cache (it keeps
    // four), and with it the instance its jobs left.
    for other in ["p1", "p2", "p3", "p4"] {
        assert_eq!(
            runner.run_blocking(job(&runner, other, "r")).outcome,
            exited(0)
        );
    }
    let (outcome, _, stats) = run(&runner, "r");
    assert_eq!(outcome, exited(0));
    assert_eq!(
        (stats.snapshots, stats.resident_starts),
        (6, 1),
        "the first prelude ran again, in a fresh instance"
    );
}

#[test]
fn what_warm_starts_hold_between_jobs_is_counted_and_goes_with_its_snapshot() {
    let runner = runner(SandboxConfig::default());
    assert_eq!(runner.warm_held_bytes(), 0);
    // The snapshot: the prelude's two marked pages (its zero pages are
    // holes in its file and take nothing).
    assert_eq!(run(&runner, "r").0, exited(0));
    let image = runner.warm_held_bytes();
    assert!((2 * 4096..=2 * PAGE).contains(&image), "{image}");
    assert_eq!(runner.sandbox().warm_stats().held_bytes, image);
    // A job that writes three pages leaves its instance, those pages put
    // back and now its own: they are counted too (where the kernel can
    // list them; else its memory is mapped afresh and holds nothing).
    assert_eq!(run(&runner, "w").0, exited(0));
    let resident = runner.warm_held_bytes() - image;
    assert!(resident == 3 * 4096 || resident == 0, "{resident}");
    // Four other preludes push the snapshot out, and with it its instance:
    // what is held is theirs alone, each the size of the first's.
    for other in ["p1", "p2", "p3", "p4"] {
        assert_eq!(
            runner.run_blocking(job(&runner, other, "r")).outcome,
            exited(0)
        );
    }
    assert_eq!(runner.warm_held_bytes(), 4 * image);
}
