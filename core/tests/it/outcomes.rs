//! Every way a job can end, through the embedded worker's `JobRunner`.

use std::time::{Duration, Instant};

use peerwasm_core::proto::{DirGrant, Outcome, StdStream};
use peerwasm_core::sandbox::SandboxConfig;

use crate::support::*;

#[tokio::test]
async fn hello_gets_exactly_its_args_and_env() {
    let r = shared();
    let mut spec = guest_job(r, "hello", "");
    spec.args = vec!["-x".into(), "--y".into(), "two words".into()];
    spec.env = vec![("GREETING".into(), "hi there".into())];
    let res = r.run(spec, None).await;
    assert_eq!(res.outcome, Outcome::Exited { code: 0 }, "{}", stderr(&res));
    assert_eq!(stdout(&res), "-x\n--y\ntwo words\nhi there\n");
}

#[tokio::test]
async fn the_host_environment_does_not_leak_in() {
    // SAFETY: set before any job reads env; the guest must not see it anyway.
    unsafe { std::env::set_var("GREETING", "from the host") };
    let r = shared();
    let res = r.run(guest_job(r, "hello", ""), None).await;
    assert_eq!(res.outcome, Outcome::Exited { code: 0 });
    assert_eq!(stdout(&res), "");
}

#[tokio::test]
async fn primes_through_the_sdk() {
    let r = shared();
    let res = r
        .run(guest_job(r, "primes", r#"{"n": 1000000}"#), None)
        .await;
    assert_eq!(res.outcome, Outcome::Exited { code: 0 }, "{}", stderr(&res));
    assert_eq!(stdout(&res).trim(), r#"{"count":78498}"#);
    assert!(res.cpu_time_us > 0, "cpu time is measured");
    assert!(res.wall_time_us > 0);
}

#[tokio::test]
async fn sdk_bad_input_and_job_error_exit_non_zero() {
    let r = shared();
    let res = r.run(guest_job(r, "primes", "not json"), None).await;
    assert_eq!(res.outcome, Outcome::Exited { code: 2 });
    assert!(
        stderr(&res).contains("input is not valid"),
        "{}",
        stderr(&res)
    );
    let res = r
        .run(guest_job(r, "primes", r#"{"n": 99999999999}"#), None)
        .await;
    assert_eq!(res.outcome, Outcome::Exited { code: 1 });
    assert!(stderr(&res).contains("too large"), "{}", stderr(&res));
}

#[tokio::test]
async fn memhog_peak_is_exact() {
    let r = shared();
    for n in [1u64, 20, 40] {
        let res = r.run(guest_job(r, "memhog", &n.to_string()), None).await;
        assert_eq!(res.outcome, Outcome::Exited { code: 0 }, "{}", stderr(&res));
        assert_eq!(stdout(&res).trim(), n.to_string());
        let peak = res.peak_memory_bytes;
        assert!(peak >= n * MIB, "peak {peak} below {n} MiB");
        assert!(
            peak < (n + 2) * MIB,
            "peak {peak} not below {n} MiB + 2 MiB"
        );
        assert_eq!(peak % 65536, 0, "linear memory grows in whole pages");
    }
}

#[tokio::test]
async fn over_its_memory_limit_a_job_ends_and_the_runner_goes_on() {
    let r = shared();
    let mut spec = guest_job(r, "memhog", "64");
    spec.limits.memory = peerwasm_core::proto::MemoryRequest::from(32 * MIB);
    let res = r.run(spec, None).await;
    match res.outcome {
        Outcome::MemoryLimitExceeded {
            limit,
            peak,
            requested,
        } => {
            assert_eq!(limit, 32 * MIB);
            assert!(peak <= limit && peak == res.peak_memory_bytes);
            assert!(requested > limit);
        }
        other => panic!("expected memory limit exceeded, got {other:?}"),
    }
    assert_eq!(res.outcome.exit_code(), 137);
    assert!(
        res.outcome.to_string().contains("memory limit of 32 MiB"),
        "{}",
        res.outcome
    );

    // The same runner keeps running jobs.
    let res = r.run(guest_job(r, "memhog", "8"), None).await;
    assert_eq!(res.outcome, Outcome::Exited { code: 0 });
}

#[tokio::test]
async fn unbounded_growth_hits_the_limit() {
    let r = shared();
    let mut spec = guest_job(r, "hostile-grow", "");
    spec.limits.memory = peerwasm_core::proto::MemoryRequest::from(64 * MIB);
    let res = r.run(spec, None).await;
    assert!(
        matches!(res.outcome, Outcome::MemoryLimitExceeded { limit, .. } if limit == 64 * MIB),
        "{:?}",
        res.outcome
    );
}

#[tokio::test]
async fn a_computing_job_is_stopped_at_its_time_limit() {
    let r = shared();
    let mut spec = guest_job(r, "hostile-loop", "");
    spec.limits.timeout_ms = Some(1000);
    let t = Instant::now();
    let res = r.run(spec, None).await;
    assert_eq!(
        res.outcome,
        Outcome::TimeLimitExceeded {
            limit_ms: 1000,
            worker_limit: false
        }
    );
    assert_eq!(res.outcome.exit_code(), 124);
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(1000) && took < Duration::from_secs(3),
        "{took:?}"
    );
    // Tests run in parallel on 2 cores, so the job may get well under all
    // of a core; a sleeper would get almost nothing.
    assert!(
        res.cpu_time_us > 200_000,
        "it was computing: {} µs of CPU",
        res.cpu_time_us
    );
}

#[tokio::test]
async fn a_sleeping_job_is_stopped_at_its_time_limit() {
    let r = shared();
    let mut spec = guest_job(r, "sleep", "600000"); // ten minutes
    spec.limits.timeout_ms = Some(1000);
    let t = Instant::now();
    let res = r.run(spec, None).await;
    assert_eq!(
        res.outcome,
        Outcome::TimeLimitExceeded {
            limit_ms: 1000,
            worker_limit: false
        }
    );
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    assert!(
        res.cpu_time_us < 500_000,
        "a sleeper burns little CPU: {} µs",
        res.cpu_time_us
    );
}

#[tokio::test]
async fn sleep_is_wall_time_and_spin_is_cpu_time() {
    let r = shared();
    let res = r.run(guest_job(r, "sleep", "200"), None).await;
    assert_eq!(res.outcome, Outcome::Exited { code: 0 });
    assert!(res.wall_time_us >= 200_000);
    assert!(res.cpu_time_us < 40_000, "{}", res.cpu_time_us);
    let res = r.run(guest_job(r, "spin", "200"), None).await;
    assert_eq!(res.outcome, Outcome::Exited { code: 0 });
    assert!(res.wall_time_us >= 200_000);
    // `spin` burns 200 ms of wall time; on a loaded 2-core machine (tests
    // run in parallel) it gets a share of a core, never nothing.
    assert!(res.cpu_time_us >= 60_000, "{}", res.cpu_time_us);
}

#[tokio::test]
async fn unbounded_recursion_traps() {
    let r = shared();
    let res = r.run(guest_job(r, "hostile-recurse", ""), None).await;
    match &res.outcome {
        Outcome::Trapped { trap, .. } => {
            assert!(
                trap == "stack overflow" || trap == "out of bounds memory access",
                "{trap}"
            )
        }
        other => panic!("expected a trap, got {other:?}"),
    }
    assert_eq!(res.outcome.exit_code(), 134);
}

#[tokio::test]
async fn proc_exit_code_comes_back() {
    let r = shared();
    let res = r.run(guest_job(r, "hostile-exit", ""), None).await;
    assert_eq!(res.outcome, Outcome::Exited { code: 3 });
    assert_eq!(stdout(&res), "exiting with 3\n");
}

#[tokio::test]
async fn an_output_flood_ends_at_the_cap() {
    let r = shared();
    let mut spec = guest_job(r, "hostile-flood", "");
    spec.limits.stdout_bytes = MIB;
    let res = r.run(spec, None).await;
    assert_eq!(
        res.outcome,
        Outcome::OutputLimitExceeded {
            stream: StdStream::Stdout,
            limit: MIB
        }
    );
    assert_eq!(res.stdout.len() as u64, MIB, "exactly the cap is kept");
}

#[tokio::test]
async fn output_is_streamed_as_written() {
    let r = shared();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut spec = guest_job(r, "hello", "");
    spec.args = vec!["streamed".into()];
    let res = r.run(spec, Some(tx)).await;
    let mut seen = Vec::new();
    while let Ok((stream, chunk)) = rx.try_recv() {
        assert_eq!(stream, StdStream::Stdout);
        seen.extend_from_slice(&chunk);
    }
    assert_eq!(seen, res.stdout);
    assert_eq!(seen, b"streamed\n");
}

#[tokio::test]
async fn a_wasm_trap_has_its_kind_and_a_backtrace() {
    let r = shared();
    let spec = wat_job(
        r,
        r#"(module
             (func $divide (param i32) (result i32) (i32.div_u (i32.const 1) (local.get 0)))
             (func (export "_start") (drop (call $divide (i32.const 0)))))"#,
    );
    let res = r.run(spec, None).await;
    match &res.outcome {
        Outcome::Trapped {
            trap, backtrace, ..
        } => {
            assert_eq!(trap, "integer divide by zero");
            assert!(
                backtrace.first().is_some_and(|f| f.contains("divide")),
                "{backtrace:?}"
            );
        }
        other => panic!("expected a trap, got {other:?}"),
    }
}

#[tokio::test]
async fn initial_memory_over_the_limit_is_a_memory_limit() {
    let r = shared();
    // 4 GiB initial memory: 65536 pages.
    let mut spec = wat_job(r, r#"(module (memory 65536) (func (export "_start")))"#);
    spec.limits.memory = peerwasm_core::proto::MemoryRequest::from(16 * MIB);
    let res = r.run(spec, None).await;
    assert!(
        matches!(res.outcome, Outcome::MemoryLimitExceeded { peak: 0, requested, .. } if requested == 4 << 30),
        "{:?}",
        res.outcome
    );
}

#[tokio::test]
async fn a_bare_module_peaks_at_its_initial_memory() {
    let r = shared();
    let res = r
        .run(
            wat_job(r, r#"(module (memory 3) (func (export "_start")))"#),
            None,
        )
        .await;
    assert_eq!(res.outcome, Outcome::Exited { code: 0 });
    assert_eq!(res.peak_memory_bytes, 3 * 65536);
}

fn invalid_reason(res: &peerwasm_core::proto::JobResult) -> &str {
    match &res.outcome {
        Outcome::InvalidModule { reason } => reason,
        other => panic!("expected an invalid module, got {other:?}"),
    }
}

#[tokio::test]
async fn invalid_modules_are_named() {
    let r = shared();
    let run_bytes = |bytes: Vec<u8>| {
        let spec = peerwasm_core::proto::JobSpec::new(r.add_module(bytes));
        r.run(spec, None)
    };
    let text = run_bytes(b"this is a text file, not a module\n".to_vec()).await;
    assert!(invalid_reason(&text).contains("not a WebAssembly module"));
    assert_eq!(text.outcome.exit_code(), 2);

    let component = run_bytes(b"\0asm\x0d\0\x01\0".to_vec()).await;
    assert!(invalid_reason(&component).contains("component"));

    let mut truncated = peerwasm_testkit::guest_wasm_bytes("hello");
    truncated.truncate(truncated.len() / 2);
    let truncated = run_bytes(truncated).await;
    assert!(invalid_reason(&truncated).contains("does not compile"));

    let mut random = b"\0asm\x01\0\0\0".to_vec();
    random.extend((0..4096u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8));
    let random = run_bytes(random).await;
    assert!(invalid_reason(&random).contains("does not compile"));

    let import = r
        .run(
            wat_job(
                r,
                r#"(module (import "env" "steal" (func)) (func (export "_start")))"#,
            ),
            None,
        )
        .await;
    assert!(
        invalid_reason(&import).contains("env::steal"),
        "{}",
        invalid_reason(&import)
    );

    let reactor = r
        .run(wat_job(r, r#"(module (func (export "run")))"#), None)
        .await;
    assert!(invalid_reason(&reactor).contains("_start"));
}

#[tokio::test]
async fn too_large_is_rejected() {
    let r = runner(SandboxConfig {
        slots: 1,
        max_module_bytes: 1024,
        ..SandboxConfig::default()
    });
    let res = r.run(guest_job(&r, "hello", ""), None).await;
    assert!(
        matches!(&res.outcome, Outcome::Rejected { reason } if reason.contains("larger than")),
        "{:?}",
        res.outcome
    );
    assert_eq!(r.sandbox().cache_stats().compiles, 0);

    let r = shared();
    let mut spec = guest_job(r, "hello", "");
    spec.limits.memory = peerwasm_core::proto::MemoryRequest::from(64 << 30);
    let res = r.run(spec, None).await;
    assert!(
        matches!(&res.outcome, Outcome::Rejected { reason } if reason.contains("64 GiB")),
        "{:?}",
        res.outcome
    );
}

#[tokio::test]
async fn files_sees_only_its_granted_directories() {
    let r = shared();
    let input = tempfile::tempdir().unwrap();
    let output = tempfile::tempdir().unwrap();
    std::fs::write(input.path().join("a.txt"), "hello wasm").unwrap();
    std::fs::write(input.path().join("b.txt"), "größe").unwrap();
    let mut spec = guest_job(r, "files", "");
    spec.dirs = vec![
        DirGrant {
            host: input.path().into(),
            guest: "/in".into(),
            read_only: true,
        },
        DirGrant {
            host: output.path().into(),
            guest: "/out".into(),
            read_only: false,
        },
    ];
    let res = r.run(spec, None).await;
    assert_eq!(res.outcome, Outcome::Exited { code: 0 }, "{}", stderr(&res));
    assert_eq!(
        std::fs::read_to_string(output.path().join("a.txt")).unwrap(),
        "HELLO WASM"
    );
    assert_eq!(
        std::fs::read_to_string(output.path().join("b.txt")).unwrap(),
        "GRÖSSE"
    );

    // Without the grants the job cannot reach them.
    let res = r.run(guest_job(r, "files", ""), None).await;
    assert_eq!(res.outcome, Outcome::Exited { code: 1 });
    assert!(stderr(&res).contains("cannot read /in"), "{}", stderr(&res));
}

#[tokio::test]
async fn a_scratch_directory_holding_anything_goes_with_its_job_and_the_next_sees_none_of_it() {
    let root = tempfile::tempdir().unwrap();
    let r = runner(SandboxConfig {
        slots: 1,
        scratch_root: Some(root.path().into()),
        claim_jobs_dir: true,
        max_scratch_bytes: Some(4 << 20),
        ..SandboxConfig::default()
    });
    // The jobs' scratch is made inside the sandbox's own directory for its
    // jobs (claimed while it lives: what a killed worker left is swept).
    let jobs_dir = || {
        let dirs: Vec<_> = std::fs::read_dir(root.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(dirs.len(), 1, "{dirs:?}");
        let name = dirs[0].file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with("peerwasm-jobs-"), "{name}");
        dirs[0].clone()
    };
    let scratches = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir(jobs_dir())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.file_name().unwrap() != peerwasm_core::leftovers::CLAIM_FILE)
            .collect()
    };
    // A job that fills its scratch (64 directories deep, then a file to
    // its 4 MiB bound): all of it goes with the job.
    let res = r.run(guest_job(&r, "hostile-disk", ""), None).await;
    assert_eq!(res.outcome, Outcome::Exited { code: 0 });
    assert!(stdout(&res).contains("wrote 3 MiB"), "{}", stdout(&res));
    assert!(scratches().is_empty(), "{:?}", scratches());
    // One that leaves it empty (`ls` only reads /tmp): kept for the next.
    let listed = |res: &peerwasm_core::proto::JobResult| {
        assert_eq!(res.outcome, Outcome::Exited { code: 0 }, "{}", stderr(res));
        stdout(res)
    };
    let res = r.run(guest_job(&r, "ls", "/tmp"), None).await;
    assert_eq!(listed(&res).trim(), "", "a fresh scratch is empty");
    let kept = scratches();
    assert_eq!(kept.len(), 1, "left empty: kept");
    assert_eq!(std::fs::read_dir(&kept[0]).unwrap().count(), 0);
    // The next job that fills it has that one, and it goes with the job;
    // the job after it sees none of what was written.
    let res = r.run(guest_job(&r, "hostile-disk", ""), None).await;
    assert!(stdout(&res).contains("wrote 3 MiB"), "{}", stdout(&res));
    assert!(!kept[0].exists(), "held the job's files: removed");
    assert!(scratches().is_empty(), "{:?}", scratches());
    let res = r.run(guest_job(&r, "ls", "/tmp"), None).await;
    assert_eq!(listed(&res).trim(), "", "nothing of the job before");
    drop(r);
    assert_eq!(
        std::fs::read_dir(root.path()).unwrap().count(),
        0,
        "the jobs' directory goes with the sandbox"
    );
}

#[tokio::test]
async fn a_peak_close_to_the_limit_warns() {
    let r = shared();
    let mut spec = guest_job(r, "memhog", "20");
    spec.limits.memory = peerwasm_core::proto::MemoryRequest::from(22 * MIB);
    let res = r.run(spec, None).await;
    assert_eq!(res.outcome, Outcome::Exited { code: 0 });
    assert!(
        res.warnings.iter().any(|w| w.contains("over 90%")),
        "{:?}",
        res.warnings
    );
    let res = r.run(guest_job(r, "memhog", "1"), None).await;
    assert!(res.warnings.is_empty(), "{:?}", res.warnings);
}
