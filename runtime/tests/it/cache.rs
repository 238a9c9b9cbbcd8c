//! The module cache: compiled once per machine, by the compile counter; disk
//! artifacts survive a restart; corrupt or foreign artifacts are recompiled.

use std::path::{Path, PathBuf};

use peerwasm::proto::{CacheSource, Outcome};
use peerwasm::sandbox::SandboxConfig;
use peerwasm::worker::JobRunner;

use crate::support::*;

fn with_disk(dir: &Path) -> JobRunner {
    runner(SandboxConfig { slots: 2, cache_dir: Some(dir.into()), ..SandboxConfig::default() })
}

fn artifacts(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for engine_dir in std::fs::read_dir(dir).unwrap() {
        for f in std::fs::read_dir(engine_dir.unwrap().path()).unwrap() {
            found.push(f.unwrap().path());
        }
    }
    found
}

#[tokio::test]
async fn a_second_run_does_not_compile_again() {
    let r = runner(SandboxConfig { slots: 2, ..SandboxConfig::default() });
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
    let r = runner(SandboxConfig { slots: 4, ..SandboxConfig::default() });
    let jobs = (0..8).map(|_| r.run(guest_job(&r, "hello", ""), None));
    let results = futures::future::join_all(jobs).await;
    assert!(results.iter().all(|res| res.outcome == Outcome::Exited { code: 0 }));
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
    assert_eq!(r.run(guest_job(&r, "hello", ""), None).await.cache, CacheSource::Disk);
}

#[tokio::test]
async fn a_foreign_artifact_is_recompiled() {
    let dir = tempfile::tempdir().unwrap();
    {
        let r = with_disk(dir.path());
        r.run(guest_job(&r, "hello", ""), None).await;
    }
    // An artifact that passes our checksum but that wasmtime does not accept
    // (as one from another engine build would not be) is recompiled.
    let [artifact] = artifacts(dir.path()).try_into().unwrap();
    let mut fake = b"PWASMA1\n".to_vec();
    let payload = b"not a wasmtime artifact at all".to_vec();
    use sha2::Digest;
    fake.extend_from_slice(&sha2::Sha256::digest(&payload));
    fake.extend_from_slice(&payload);
    std::fs::write(&artifact, &fake).unwrap();

    let r = with_disk(dir.path());
    let res = r.run(guest_job(&r, "hello", ""), None).await;
    assert_eq!(res.outcome, Outcome::Exited { code: 0 });
    assert_eq!(res.cache, CacheSource::Compiled);
    assert_eq!(r.sandbox().cache_stats().disk_rejects, 1);
}
