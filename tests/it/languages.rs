//! Jobs in other languages and forms: the C guest (`guest-examples/c/primes.c`,
//! with the C SDK `sdk/c/peerwasm.h`) gives the Rust guest's answers, errors
//! and exit codes, and runs under the same exact memory limit; so do the
//! guests built for wasm32-wasip2 (WASI preview 2 components), embedded and
//! on a pool of real worker processes.

use std::collections::BTreeSet;

use peerwasm::client::{Job, MapConfig, MapItem, Target, map};
use peerwasm::proto::{CacheSource, Outcome};

use crate::support::{MIB, WorkerProcess};

fn primes_job(path: std::path::PathBuf) -> Job {
    Job::from_file(path).unwrap()
}

async fn answers(target: &Target, job: &Job, inputs: &[&str]) -> Vec<(i32, String, String)> {
    let mut items: Vec<MapItem> = Vec::new();
    let config = MapConfig {
        keep_going: true,
        mem: Some((256 << 20).into()),
        ..MapConfig::default()
    };
    map(
        target,
        job,
        inputs.iter().map(|i| i.as_bytes().to_vec()),
        &config,
        &mut items,
    )
    .await
    .unwrap();
    items
        .into_iter()
        .map(|i| {
            let r = i.result;
            (
                r.outcome.exit_code(),
                String::from_utf8_lossy(&r.stdout).into_owned(),
                String::from_utf8_lossy(&r.stderr).into_owned(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_c_guest_gives_the_rust_guests_answers() {
    let c = primes_job(peerwasm_testkit::guest_c_wasm("primes"));
    let rust = primes_job(peerwasm_testkit::guest_wasm("primes"));
    let target = Target::embedded(2).unwrap();
    let inputs = [
        r#"{"n": 0}"#,
        r#"{"n": 2}"#,
        r#"{"n": 10}"#,
        r#"{"n": 100}"#,
        "{\"n\": 1000003}\n",
        r#"{"n": 20000000}"#,
        r#"{"n": 5000000000}"#,
    ];
    let (from_c, from_rust) = (
        answers(&target, &c, &inputs).await,
        answers(&target, &rust, &inputs).await,
    );
    for (i, ((c_code, c_out, c_err), (r_code, r_out, r_err))) in
        from_c.iter().zip(&from_rust).enumerate()
    {
        assert_eq!(
            (c_code, c_out),
            (r_code, r_out),
            "input {}: {c_err} / {r_err}",
            inputs[i]
        );
        assert_eq!(c_err, r_err, "the same error for input {}", inputs[i]);
    }
    assert_eq!(from_c[3].1, "{\"count\":25}\n");
    assert_eq!(from_c[6].0, 1, "too large: the job's own failure");
    // Bad input is exit 2 in both, each naming what is wrong its own way.
    let bad = ["not json", r#"{"m": 3}"#];
    for (c, r) in answers(&target, &c, &bad)
        .await
        .iter()
        .zip(answers(&target, &rust, &bad).await)
    {
        assert_eq!((c.0, r.0), (2, 2));
        assert!(
            c.2.starts_with("error: input is not valid for this job: "),
            "{}",
            c.2
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_c_guest_runs_under_an_exact_memory_limit() {
    let c = primes_job(peerwasm_testkit::guest_c_wasm("primes"));
    let target = Target::embedded(1).unwrap();
    // The sieve holds n/2 bytes: 50,000,000 for n = 10^8.
    let ok = target
        .run(&c, c.spec(br#"{"n": 100000000}"#.to_vec(), 256 << 20))
        .await
        .unwrap();
    assert_eq!(ok.stdout, b"{\"count\":5761455}\n");
    assert!(
        ok.peak_memory_bytes >= 50_000_000 && ok.peak_memory_bytes < 50_000_000 + (2 << 20),
        "peak {} is the sieve and little else",
        ok.peak_memory_bytes
    );
    let oom = target
        .run(&c, c.spec(br#"{"n": 100000000}"#.to_vec(), 32 << 20))
        .await
        .unwrap();
    match oom.outcome {
        Outcome::MemoryLimitExceeded {
            limit,
            peak,
            requested,
        } => {
            assert_eq!(limit, 32 << 20);
            assert!(peak <= limit && requested > limit, "{peak} {requested}");
        }
        other => panic!("expected the memory limit, got {other}"),
    }
    assert_eq!(oom.outcome.exit_code(), 137);
}

/// The primes inputs both kinds of guest are compared on.
const PRIMES_INPUTS: [&str; 9] = [
    r#"{"n": 0}"#,
    r#"{"n": 10}"#,
    r#"{"n": 100}"#,
    "{\"n\": 1000003}\n",
    r#"{"n": 20000000}"#,
    r#"{"n": 5000000000}"#,
    "not json",
    r#"{"m": 3}"#,
    "",
];

#[tokio::test(flavor = "multi_thread")]
async fn a_wasip2_component_gives_the_core_modules_answers() {
    let component = primes_job(peerwasm_testkit::guest_component_wasm("primes"));
    let module = primes_job(peerwasm_testkit::guest_wasm("primes"));
    assert!(
        component.bytes().starts_with(b"\0asm\x0d\0\x01\0"),
        "built as a component"
    );
    let target = Target::embedded(2).unwrap();
    let from_component = answers(&target, &component, &PRIMES_INPUTS).await;
    let from_module = answers(&target, &module, &PRIMES_INPUTS).await;
    for (i, ((c_code, c_out, c_err), (m_code, m_out, m_err))) in
        from_component.iter().zip(&from_module).enumerate()
    {
        assert_eq!(
            (c_out, c_err),
            (m_out, m_err),
            "the same output for input {:?}",
            PRIMES_INPUTS[i]
        );
        // wasi:cli/exit 0.2 carries success or failure only: a failing
        // component exits 1 whatever code its `main` gave.
        assert_eq!(
            *c_code,
            (*m_code != 0) as i32,
            "input {:?}: {c_err}",
            PRIMES_INPUTS[i]
        );
    }
    assert_eq!(
        from_component[2],
        (0, "{\"count\":25}\n".to_string(), String::new())
    );
    assert_eq!(
        from_module[6].0, 2,
        "bad input: exit 2 from the core module"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_component_runs_under_an_exact_memory_limit_with_its_peak_reported() {
    let component = primes_job(peerwasm_testkit::guest_component_wasm("primes"));
    let module = primes_job(peerwasm_testkit::guest_wasm("primes"));
    let target = Target::embedded(1).unwrap();
    let input = br#"{"n": 100000000}"#.to_vec();
    let c = target
        .run(&component, component.spec(input.clone(), 256 << 20))
        .await
        .unwrap();
    let m = target
        .run(&module, module.spec(input.clone(), 256 << 20))
        .await
        .unwrap();
    assert_eq!(c.stdout, b"{\"count\":5761455}\n");
    assert_eq!(c.stdout, m.stdout);
    // The same program and allocator: the component's peak (all its
    // memories summed) is the module's, give or take its adapter's pages.
    assert!(
        c.peak_memory_bytes.abs_diff(m.peak_memory_bytes) <= MIB && c.peak_memory_bytes > 40 * MIB,
        "component peak {} vs module peak {}",
        c.peak_memory_bytes,
        m.peak_memory_bytes
    );
    let oom = target
        .run(&component, component.spec(input, 32 << 20))
        .await
        .unwrap();
    match oom.outcome {
        Outcome::MemoryLimitExceeded {
            limit,
            peak,
            requested,
        } => {
            assert_eq!(limit, 32 << 20);
            assert!(peak <= limit && requested > limit, "{peak} {requested}");
        }
        other => panic!("expected the memory limit, got {other}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_component_reads_granted_directories_and_is_refused_writable_ones() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    std::fs::write(dir.path().join("sub/a.txt"), b"12345").unwrap();
    let target = Target::embedded(1).unwrap();
    let mut ls = Job::from_file(peerwasm_testkit::guest_component_wasm("ls")).unwrap();
    ls.dirs.push(peerwasm::proto::DirGrant {
        host: dir.path().into(),
        guest: "/data".into(),
        read_only: true,
    });
    let listed = target
        .run(&ls, ls.spec(b"/data\n".to_vec(), 64 << 20))
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&listed.stdout),
        "/data/sub/a.txt 5\n",
        "{}",
        listed.outcome
    );
    // Writable directories (and scratch) are not given to components yet:
    // refused, saying so, rather than run with writes nothing bounds.
    ls.dirs[0].read_only = false;
    let refused = target
        .run(&ls, ls.spec(b"/data\n".to_vec(), 64 << 20))
        .await
        .unwrap();
    assert!(
        matches!(&refused.outcome, Outcome::Rejected { reason } if reason.contains("read-only") && reason.contains("/data")),
        "{}",
        refused.outcome
    );
}

/// A component's open descriptors are bounded by the worker's
/// `--max-open-files` (plus a few handles for its streams), as a module's
/// are. (Before: up to 1,024 each, whatever the flag said.)
#[tokio::test(flavor = "multi_thread")]
async fn a_component_holds_no_more_descriptors_than_max_open_files() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), b"x").unwrap();
    let w = WorkerProcess::start_with("1GiB", 1, None, &["--max-open-files", "64"]);
    let target = Target::pool(vec![w.addr.clone()]).unwrap();
    let mut bomb = Job::from_file(peerwasm_testkit::guest_component_wasm("hostile-files")).unwrap();
    bomb.dirs.push(peerwasm::proto::DirGrant {
        host: dir.path().into(),
        guest: "/data".into(),
        read_only: true,
    });
    let mut spec = bomb.spec(Vec::new(), 64 << 20);
    spec.args = vec!["/data/a.txt".into()];
    let r = target.run(&bomb, spec).await.unwrap();
    // At the bound its handle table is full: the job ends (a trap naming
    // the table), having counted on stderr how many it held.
    let counted = String::from_utf8_lossy(&r.stderr).into_owned();
    let opened: u32 = counted
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .max()
        .unwrap_or(0);
    assert!(
        (32..=64 + peerwasm::sandbox::component::HANDLE_SLACK).contains(&opened),
        "{opened} opened under --max-open-files 64: {}",
        r.outcome
    );
    assert!(
        r.outcome.to_string().contains("resource table"),
        "{}",
        r.outcome
    );
    // The worker goes on.
    let hello = Job::new(peerwasm_testkit::guest_wasm_bytes("hello"));
    assert!(
        target
            .run(&hello, hello.spec(Vec::new(), 16 << 20))
            .await
            .unwrap()
            .outcome
            .is_success()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn components_run_on_a_pool_with_limits_cache_and_learned_estimates() {
    // In-process slots only: a job that computes 20 ms or more would send
    // the module's next job to a slot process, which compiles its own
    // (fuel-free) artifact — a second, correct compile this count would
    // see on a slow machine (slots.rs tests those).
    let never = ["--slot-processes", "never"];
    let a = WorkerProcess::start_with("2GiB", 2, None, &never);
    let b = WorkerProcess::start_with("2GiB", 2, Some(&a.addr), &never);
    let target = Target::pool(vec![a.addr.clone(), b.addr.clone()]).unwrap();
    // memhog N touches N MiB: peaks of 5-24 MiB, reported by the workers.
    let memhog = Job::from_file(peerwasm_testkit::guest_component_wasm("memhog")).unwrap();
    let mibs: Vec<u64> = (0..40u64).map(|i| 5 + (i * 7) % 20).collect();
    let mut items: Vec<MapItem> = Vec::new();
    let config = MapConfig {
        max_in_flight: Some(4),
        ..MapConfig::default()
    };
    map(
        &target,
        &memhog,
        mibs.iter().map(|m| format!("{m}\n").into_bytes()),
        &config,
        &mut items,
    )
    .await
    .unwrap();
    assert_eq!(items.len(), mibs.len());
    let mut peers = BTreeSet::new();
    let mut compiled = 0;
    for (item, mib) in items.iter().zip(&mibs) {
        let r = &item.result;
        assert_eq!(
            r.stdout,
            format!("{mib}\n").into_bytes(),
            "input {}: {}",
            item.index,
            r.outcome
        );
        assert!(
            r.peak_memory_bytes >= mib * MIB && r.peak_memory_bytes <= (mib + 3) * MIB,
            "input {}: {mib} MiB touched, peak {}",
            item.index,
            r.peak_memory_bytes
        );
        peers.insert(r.peer.clone());
        compiled += (r.cache == CacheSource::Compiled) as u32;
    }
    assert!(
        peers.iter().all(|p| *p == a.addr || *p == b.addr),
        "{peers:?}"
    );
    assert!(
        compiled <= 2,
        "compiled once per worker, then cached: {compiled}"
    );
    // The later jobs asked for what the peaks taught, not the 1 GiB default.
    let last = &items.last().unwrap().result;
    assert!(
        last.memory_limit_bytes < 64 * MIB,
        "learned: {}",
        last.memory_limit_bytes
    );

    // Limits hold remotely too: compute and sleep are timed out, memory is capped.
    let run = |name: &str, stdin: &str, mem: u64, timeout_ms: Option<u64>| {
        let mut job = Job::from_file(peerwasm_testkit::guest_component_wasm(name)).unwrap();
        job.limits.timeout_ms = timeout_ms;
        let spec = job.spec(stdin.as_bytes().to_vec(), mem);
        let target = &target;
        async move { target.run(&job, spec).await.unwrap() }
    };
    for name in ["spin", "sleep"] {
        let r = run(name, "60000", 64 * MIB, Some(500)).await;
        assert!(
            matches!(r.outcome, Outcome::TimeLimitExceeded { limit_ms: 500, .. }),
            "{name}: {}",
            r.outcome
        );
        assert!(r.wall_time_us < 5_000_000, "{name}: {} us", r.wall_time_us);
    }
    let r = run("memhog", "100", 32 * MIB, None).await;
    assert!(
        matches!(r.outcome, Outcome::MemoryLimitExceeded { limit, .. } if limit == 32 * MIB),
        "{}",
        r.outcome
    );
}
