//! What CPython for WASI needs of the sandbox, each on a small module:
//! reactor entries (`--invoke`), the exception-handling proposal, the
//! `host::call` import and an 8 MiB wasm stack. (`tests/it/python.rs` runs
//! the real `python.wasm` across processes.)

use peerwasm_core::proto::Outcome;

use crate::support::{runner, shared, wat_job};

fn invalid_reason(res: &peerwasm_core::proto::JobResult) -> String {
    match &res.outcome {
        Outcome::InvalidModule { reason } => reason.clone(),
        other => panic!("expected an invalid module, got {other:?}"),
    }
}

/// `_initialize` sets a global that `run` returns: the code says both ran,
/// in that order, and the returned i32 is the exit code.
const REACTOR: &str = r#"(module
    (global $g (mut i32) (i32.const 0))
    (func (export "_initialize") (global.set $g (i32.const 5)))
    (func (export "run") (result i32) (global.get $g))
    (func (export "zero") (result i32) (i32.const 0))
    (func (export "nothing"))
    (func (export "takes") (param i32) (result i32) (local.get 0)))"#;

#[tokio::test]
async fn a_reactor_runs_its_initializer_then_the_invoked_export_whose_i32_is_the_exit_code() {
    let r = shared();
    let invoke = |name: Option<&str>| {
        let mut spec = wat_job(r, REACTOR);
        spec.invoke = name.map(str::to_string);
        r.run(spec, None)
    };
    assert_eq!(
        invoke(Some("run")).await.outcome,
        Outcome::Exited { code: 5 }
    );
    assert_eq!(
        invoke(Some("zero")).await.outcome,
        Outcome::Exited { code: 0 }
    );
    assert_eq!(
        invoke(Some("nothing")).await.outcome,
        Outcome::Exited { code: 0 }
    );

    let none = invalid_reason(&invoke(None).await);
    assert!(
        none.contains("reactor") && none.contains("--invoke") && none.contains("run"),
        "{none}"
    );
    let missing = invalid_reason(&invoke(Some("main")).await);
    assert!(
        missing.contains("no function `main`") && missing.contains("_initialize, run"),
        "{missing}"
    );
    let takes = invalid_reason(&invoke(Some("takes")).await);
    assert!(takes.contains("takes 1 parameters"), "{takes}");
    // A command module may be invoked at another export too.
    let mut spec = wat_job(
        r,
        r#"(module (func (export "_start") unreachable) (func (export "other") (result i32) (i32.const 9)))"#,
    );
    spec.invoke = Some("other".into());
    assert_eq!(r.run(spec, None).await.outcome, Outcome::Exited { code: 9 });
}

#[tokio::test]
async fn exceptions_are_thrown_and_caught_and_an_uncaught_one_traps() {
    let r = shared();
    let caught = r#"(module
        (tag $e (param i32))
        (func $throws (param i32) (throw $e (local.get 0)))
        (func (export "run") (result i32)
            (block $h (result i32)
                (try_table (catch $e $h) (call $throws (i32.const 7)))
                (i32.const 1))))"#;
    let mut spec = wat_job(r, caught);
    spec.invoke = Some("run".into());
    let res = r.run(spec, None).await;
    assert_eq!(
        res.outcome,
        Outcome::Exited { code: 7 },
        "the thrown 7 is caught and returned"
    );

    let uncaught = r#"(module (tag $e) (func (export "_start") (throw $e)))"#;
    let res = r.run(wat_job(r, uncaught), None).await;
    assert!(
        matches!(res.outcome, Outcome::Trapped { .. }),
        "{:?}",
        res.outcome
    );
    assert_eq!(res.outcome.exit_code(), 134);
}

#[tokio::test]
async fn host_call_answers_no_host_and_other_host_imports_are_refused() {
    let r = shared();
    let calls = r#"(module
        (import "host" "call" (func $call (param i32 i32 i32 i32) (result i32)))
        (func (export "run") (result i32)
            (i32.sub (i32.const 0) (call $call (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 0)))))"#;
    let mut spec = wat_job(r, calls);
    spec.invoke = Some("run".into());
    assert_eq!(
        r.run(spec, None).await.outcome,
        Outcome::Exited { code: 1 },
        "host::call answered -1"
    );

    let other = r#"(module (import "host" "exec" (func)) (func (export "_start")))"#;
    let reason = invalid_reason(&r.run(wat_job(r, other), None).await);
    assert!(reason.contains("host::exec"), "{reason}");
    let wrong_type =
        r#"(module (import "host" "call" (func (param i32))) (func (export "_start")))"#;
    let reason = invalid_reason(&r.run(wat_job(r, wrong_type), None).await);
    assert!(
        reason.contains("host") && reason.contains("call"),
        "{reason}"
    );
}

/// Recursion `depth` deep, each frame with a few live locals.
fn recursion(depth: u32) -> String {
    format!(
        r#"(module
        (func $down (param i32) (result i64)
            (local i64 i64 i64 i64)
            (local.set 1 (i64.extend_i32_u (local.get 0)))
            (local.set 2 (i64.mul (local.get 1) (i64.const 3)))
            (if (result i64) (i32.eqz (local.get 0))
                (then (i64.const 0))
                (else (i64.add (i64.add (local.get 1) (local.get 2))
                               (call $down (i32.sub (local.get 0) (i32.const 1)))))))
        (func (export "_start") (drop (call $down (i32.const {depth})))))"#
    )
}

#[tokio::test]
async fn the_wasm_stack_is_8_mib_deep_and_overflowing_it_still_traps() {
    // 60,000 frames: several MiB of stack, past wasmtime's default of
    // 512 KiB (which traps it), within 8 MiB.
    let r = shared();
    let deep = r.run(wat_job(r, &recursion(60_000)), None).await;
    assert_eq!(
        deep.outcome,
        Outcome::Exited { code: 0 },
        "{:?}",
        deep.outcome
    );
    let too_deep = r.run(wat_job(r, &recursion(5_000_000)), None).await;
    match &too_deep.outcome {
        Outcome::Trapped { trap, .. } => assert_eq!(trap, "stack overflow"),
        other => panic!("expected a stack overflow, got {other:?}"),
    }
    // The same on a sandbox without fuel or pooling (the embedded `run`).
    let plain = runner(peerwasm_core::sandbox::SandboxConfig {
        slots: 1,
        pooling: false,
        time_limit: peerwasm_core::sandbox::TimeLimitMechanism::Off,
        ..Default::default()
    });
    assert_eq!(
        plain
            .run(wat_job(&plain, &recursion(60_000)), None)
            .await
            .outcome,
        Outcome::Exited { code: 0 }
    );
}

/// A GC heap (what exceptions, and GC types, allocate in) grows through
/// the same limiter as linear memory: an array of 400 MB under a 64 MiB
/// limit ends the job at its memory limit, and a small one runs, its heap
/// counted in the job's peak.
#[tokio::test]
async fn a_gc_heap_counts_against_the_memory_limit() {
    let r = shared();
    let array = |len: u32| {
        format!(
            r#"(module
            (type $a (array (mut i32)))
            (global $keep (mut (ref null $a)) (ref.null $a))
            (func (export "_start") (global.set $keep (array.new $a (i32.const 7) (i32.const {len})))))"#
        )
    };
    let mut big = wat_job(r, &array(100_000_000));
    big.limits.memory = peerwasm_core::proto::MemoryRequest::from(64 << 20);
    let res = r.run(big, None).await;
    assert!(
        matches!(res.outcome, Outcome::MemoryLimitExceeded { .. }),
        "{:?}",
        res.outcome
    );
    assert_eq!(res.outcome.exit_code(), 137);
    let mut small = wat_job(r, &array(1_000_000));
    small.limits.memory = peerwasm_core::proto::MemoryRequest::from(64 << 20);
    let res = r.run(small, None).await;
    assert_eq!(
        res.outcome,
        Outcome::Exited { code: 0 },
        "{:?}",
        res.outcome
    );
    assert!(
        res.peak_memory_bytes >= 4_000_000,
        "the 4 MB array is in the peak: {}",
        res.peak_memory_bytes
    );
}
