//! The module cache: compiled once per machine, by the compile counter; disk
//! artifacts survive a restart; corrupt, planted or swapped artifacts are
//! never loaded; the disk cache keeps to its budget and drops other
//! engines' unused directories; a large compile holds up no other module.

use std::path::{Path, PathBuf};

use peerwasm_core::proto::{CacheSource, JobSpec, Outcome};
use peerwasm_core::runner::JobRunner;
use peerwasm_core::sandbox::SandboxConfig;

use crate::support::*;

fn with_disk(dir: &Path) -> JobRunner {
    runner(SandboxConfig {
        slots: 2,
        cache_dir: Some(dir.into()),
        ..SandboxConfig::default()
    })
}

fn artifacts(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for engine_dir in std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
    {
        // The artifacts themselves (each has a `.mac` beside it).
        for f in std::fs::read_dir(engine_dir).unwrap() {
            let path = f.unwrap().path();
            if path.extension().is_some_and(|x| x == "cwasm") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// The artifact file of guest `name` under `dir`.
fn artifact_of(dir: &Path, name: &str) -> PathBuf {
    let hash =
        peerwasm_core::proto::ModuleHash::of(&peerwasm_testkit::guest_wasm_bytes(name)).to_hex();
    artifacts(dir)
        .into_iter()
        .find(|p| p.to_string_lossy().contains(&hash))
        .expect("an artifact of it")
}

#[tokio::test]
async fn a_second_run_does_not_compile_again() {
    let r = runner(SandboxConfig {
        slots: 2,
        ..SandboxConfig::default()
    });
    let first = r.run(guest_job(&r, "primes", r#"{"n": 100}"#), None).await;
    assert_eq!(first.outcome, Outcome::Exited { code: 0 });
    assert_eq!(first.cache, CacheSource::Compiled);
    assert_eq!(r.sandbox().cache_stats().compiles, 1);
    for _ in 0..5 {
        let again = r.run(guest_job(&r, "primes", r#"{"n": 100}"#), None).await;
        assert_eq!(again.outcome, Outcome::Exited { code: 0 });
        assert_eq!(again.cache, CacheSource::Memory);
    }
    assert_eq!(r.sandbox().cache_stats().compiles, 1);
}

#[tokio::test]
async fn concurrent_first_runs_compile_once() {
    let r = runner(SandboxConfig {
        slots: 4,
        ..SandboxConfig::default()
    });
    let jobs = (0..8).map(|_| r.run(guest_job(&r, "hello", ""), None));
    let results = futures::future::join_all(jobs).await;
    assert!(
        results
            .iter()
            .all(|res| res.outcome == Outcome::Exited { code: 0 })
    );
    assert_eq!(r.sandbox().cache_stats().compiles, 1);
}

#[tokio::test]
async fn a_restarted_runner_loads_from_disk() {
    let dir = tempfile::tempdir().unwrap();
    {
        let r = with_disk(dir.path());
        let res = r.run(guest_job(&r, "primes", r#"{"n": 100}"#), None).await;
        assert_eq!(res.cache, CacheSource::Compiled);
        assert_eq!(artifacts(dir.path()).len(), 1);
    }
    let r = with_disk(dir.path());
    let res = r.run(guest_job(&r, "primes", r#"{"n": 100}"#), None).await;
    assert_eq!(res.outcome, Outcome::Exited { code: 0 });
    assert_eq!(res.cache, CacheSource::Disk);
    let stats = r.sandbox().cache_stats();
    assert_eq!((stats.compiles, stats.disk_hits), (0, 1));
}

/// Artifacts are mapped after a quick check of the file's identity; a
/// cache dir copied elsewhere (new inodes: a backup restored) still loads,
/// after one full check of each file's contents, which stamps it anew.
#[tokio::test]
async fn a_copied_cache_dir_loads_after_a_full_check_and_is_stamped_anew() {
    let dir = tempfile::tempdir().unwrap();
    {
        let r = with_disk(dir.path());
        r.run(guest_job(&r, "primes", r#"{"n": 100}"#), None).await;
    }
    let copy = tempfile::tempdir().unwrap();
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", dir.path().display()))
        .arg(copy.path())
        .status()
        .unwrap();
    assert!(status.success());
    let [artifact] = artifacts(copy.path()).try_into().unwrap();
    let mac = artifact.with_extension("mac");
    let stamp_before = std::fs::read(&mac).unwrap();
    let r = with_disk(copy.path());
    let res = r.run(guest_job(&r, "primes", r#"{"n": 100}"#), None).await;
    assert_eq!(
        (res.outcome.clone(), res.cache),
        (Outcome::Exited { code: 0 }, CacheSource::Disk)
    );
    assert_eq!(stdout(&res), "{\"count\":25}\n");
    assert_ne!(
        std::fs::read(&mac).unwrap(),
        stamp_before,
        "the copy's identity was stamped"
    );
    assert_eq!(r.sandbox().cache_stats().disk_rejects, 0);
    // An artifact without its tags is not one.
    std::fs::remove_file(&mac).unwrap();
    let r = with_disk(copy.path());
    assert_eq!(
        r.run(guest_job(&r, "primes", r#"{"n": 100}"#), None)
            .await
            .cache,
        CacheSource::Compiled
    );
    assert_eq!(r.sandbox().cache_stats().disk_rejects, 1);
}

#[tokio::test]
async fn a_corrupt_artifact_is_recompiled() {
    let dir = tempfile::tempdir().unwrap();
    {
        let r = with_disk(dir.path());
        r.run(guest_job(&r, "hello", ""), None).await;
    }
    let [artifact] = artifacts(dir.path()).try_into().unwrap();
    let mut bytes = std::fs::read(&artifact).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&artifact, &bytes).unwrap();

    let r = with_disk(dir.path());
    let res = r.run(guest_job(&r, "hello", ""), None).await;
    assert_eq!(res.outcome, Outcome::Exited { code: 0 });
    assert_eq!(res.cache, CacheSource::Compiled);
    let stats = r.sandbox().cache_stats();
    assert_eq!((stats.compiles, stats.disk_rejects), (1, 1));

    // The recompiled artifact replaced the corrupt one and is good again.
    let r = with_disk(dir.path());
    assert_eq!(
        r.run(guest_job(&r, "hello", ""), None).await.cache,
        CacheSource::Disk
    );
}

#[tokio::test]
async fn a_foreign_artifact_is_recompiled() {
    let dir = tempfile::tempdir().unwrap();
    {
        let r = with_disk(dir.path());
        r.run(guest_job(&r, "hello", ""), None).await;
    }
    // A file planted by someone who can write the directory but does not
    // have the cache's secret: a plausible header, a checksum, anything.
    let [artifact] = artifacts(dir.path()).try_into().unwrap();
    let mut fake = b"\x7fELF\x02\x01\x01".to_vec();
    let payload = b"not a wasmtime artifact at all".to_vec();
    use sha2::Digest;
    fake.extend_from_slice(&sha2::Sha256::digest(&payload));
    fake.extend_from_slice(&payload);
    std::fs::write(&artifact, &fake).unwrap();

    let r = with_disk(dir.path());
    // Not counted as having the module: a worker asks the client for it
    // (404, upload) instead of failing the job when the file is refused.
    let hash = peerwasm_core::proto::ModuleHash::of(&peerwasm_testkit::guest_wasm_bytes("hello"));
    assert!(
        !r.has_module(&hash),
        "a planted artifact passed for the module"
    );
    let res = r.run(guest_job(&r, "hello", ""), None).await;
    assert_eq!(res.outcome, Outcome::Exited { code: 0 });
    assert_eq!(res.cache, CacheSource::Compiled);
    assert_eq!(r.sandbox().cache_stats().disk_rejects, 1);
    assert!(r.has_module(&hash));
}

#[tokio::test]
async fn another_modules_artifact_under_this_modules_name_is_never_loaded() {
    let dir = tempfile::tempdir().unwrap();
    {
        let r = with_disk(dir.path());
        r.run(guest_job(&r, "hello", ""), None).await;
        r.run(guest_job(&r, "primes", r#"{"n": 10}"#), None).await;
    }
    // A genuine artifact, of primes, renamed to hello's: loading it would
    // run primes' code for every hello job.
    std::fs::copy(
        artifact_of(dir.path(), "primes"),
        artifact_of(dir.path(), "hello"),
    )
    .unwrap();
    let r = with_disk(dir.path());
    let mut spec = guest_job(&r, "hello", "");
    spec.args = vec!["still hello".into()];
    let res = r.run(spec, None).await;
    assert_eq!(stdout(&res), "still hello\n");
    assert_eq!(res.cache, CacheSource::Compiled);
    assert_eq!(r.sandbox().cache_stats().disk_rejects, 1);
    let secret = dir.path().join("secret.key");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&secret).unwrap().permissions().mode() & 0o777,
        0o600
    );
}

#[tokio::test]
async fn the_disk_cache_keeps_to_its_budget_dropping_the_least_recently_used() {
    let guests = ["hello", "primes", "memhog", "spin"];
    // Their artifact sizes, from an unbounded cache.
    let sizes_dir = tempfile::tempdir().unwrap();
    let r = with_disk(sizes_dir.path());
    for g in guests {
        r.run(guest_job(&r, g, "1"), None).await;
    }
    let mut sizes: Vec<u64> = artifacts(sizes_dir.path())
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .collect();
    sizes.sort();
    let budget = sizes[2] + sizes[3]; // room for about two
    let dir = tempfile::tempdir().unwrap();
    let r = runner(SandboxConfig {
        slots: 2,
        cache_dir: Some(dir.path().into()),
        cache_max_bytes: budget,
        ..SandboxConfig::default()
    });
    for g in guests {
        r.run(guest_job(&r, g, "1"), None).await;
        tokio::time::sleep(std::time::Duration::from_millis(20)).await; // distinct mtimes
    }
    let kept: u64 = artifacts(dir.path())
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    assert!(kept <= budget, "{kept} bytes kept, budget {budget}");
    assert!(r.sandbox().cache_stats().disk_evictions >= 2);
    assert!(
        std::fs::metadata(artifact_of(dir.path(), "spin")).is_ok(),
        "the newest is kept"
    );
    assert!(
        artifacts(dir.path())
            .iter()
            .all(|p| !p.to_string_lossy().contains(
                &peerwasm_core::proto::ModuleHash::of(&peerwasm_testkit::guest_wasm_bytes("hello"))
                    .to_hex()
            )),
        "the oldest went first"
    );
}

/// Sets `path`'s modification time `days` ago.
fn age(path: &Path, days: u64) {
    let then = std::time::SystemTime::now() - std::time::Duration::from_secs(days * 24 * 3600);
    std::fs::File::open(path)
        .unwrap()
        .set_modified(then)
        .unwrap();
}

#[tokio::test]
async fn another_engines_artifacts_unused_for_two_weeks_go_at_the_next_compile_and_no_others() {
    let dir = tempfile::tempdir().unwrap();
    // An older build's engine: its newest use a month ago.
    let old = dir.path().join("engine-00000000000000a1");
    std::fs::create_dir(&old).unwrap();
    for (name, days) in [
        ("a.cwasm", 40),
        ("a.mac", 40),
        ("b.cwasm", 30),
        ("b.mac", 30),
    ] {
        std::fs::write(old.join(name), vec![0u8; 4096]).unwrap();
        age(&old.join(name), days);
    }
    // Another engine, one of whose artifacts was loaded three days ago.
    let recent = dir.path().join("engine-00000000000000b2");
    std::fs::create_dir(&recent).unwrap();
    for (name, days) in [
        ("a.cwasm", 60),
        ("a.mac", 60),
        ("b.cwasm", 60),
        ("b.mac", 3),
    ] {
        std::fs::write(recent.join(name), b"x").unwrap();
        age(&recent.join(name), days);
    }
    // An old engine's empty directory, and something of the user's.
    let empty = dir.path().join("engine-00000000000000c3");
    std::fs::create_dir(&empty).unwrap();
    age(&empty, 20);
    let theirs = dir.path().join("notes");
    std::fs::create_dir(&theirs).unwrap();
    age(&theirs, 400);

    let r = with_disk(dir.path());
    let res = r.run(guest_job(&r, "hello", "x"), None).await;
    assert_eq!(
        (res.outcome, res.cache),
        (Outcome::Exited { code: 0 }, CacheSource::Compiled)
    );
    assert!(!old.exists(), "unused for a month: removed");
    assert!(!empty.exists(), "empty and untouched for 20 days: removed");
    assert!(recent.exists(), "used three days ago: kept");
    assert!(theirs.exists(), "not an engine's: never touched");
    assert_eq!(
        artifacts(dir.path())
            .iter()
            .filter(|p| p.starts_with(&recent))
            .count(),
        2
    );

    // Loading from the disk cache removes nothing (no compile).
    age(&recent.join("b.mac"), 30);
    let r = with_disk(dir.path());
    assert_eq!(
        r.run(guest_job(&r, "hello", "x"), None).await.cache,
        CacheSource::Disk
    );
    assert!(
        recent.exists(),
        "only a compile prunes: a cached start stays free of it"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_large_compile_holds_up_no_other_module() {
    let r = std::sync::Arc::new(runner(SandboxConfig {
        slots: 2,
        ..SandboxConfig::default()
    }));
    let big = JobSpec::new(r.add_module(peerwasm_testkit::big_module(20_000)));
    let started = std::time::Instant::now();
    let big_run = tokio::spawn({
        let r = r.clone();
        async move { r.run(big, None).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let small = r.run(guest_job(&r, "hello", ""), None).await;
    let small_done = started.elapsed();
    assert_eq!(small.cache, CacheSource::Compiled);
    assert!(
        !big_run.is_finished(),
        "the large module compiled too fast to tell ({small_done:?})"
    );
    let big = big_run.await.unwrap();
    let big_done = started.elapsed();
    println!(
        "a small module compiled and ran at {small_done:?}, while a 20,000-function module took {big_done:?}"
    );
    // Behind one global queue, the small one finished just before the large.
    assert!(
        small_done < big_done / 3,
        "the small module waited {small_done:?} of the large one's {big_done:?}"
    );
    assert_eq!(big.outcome, Outcome::Exited { code: 0 });
}
