//! What the worker's in-memory tests share: small WAT guests that compile
//! in milliseconds, and the configuration of a small worker whose state
//! lives in a test's temporary directory.

use crate::client::Job;

use super::WorkerConfig;

pub const MIB: u64 = 1 << 20;

/// Reads up to 1 KiB of stdin, writes it to stdout.
pub const ECHO: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_read" (func $read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 64))
    (i32.store (i32.const 4) (i32.const 1024))
    (drop (call $read (i32.const 0) (i32.const 0) (i32.const 1) (i32.const 8)))
    (i32.store (i32.const 4) (i32.load (i32.const 8)))
    (drop (call $write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))"#;

/// Never ends (until cancelled or out of time).
pub const SPIN: &str =
    r#"(module (memory (export "memory") 1) (func (export "_start") (loop (br 0))))"#;

pub fn job(wat: &str) -> Job {
    Job::new(wat::parse_str(wat).expect("the test's WAT parses"))
}

/// The tenants file of the multi-tenant worker: `alice` and `bob`, whose
/// tokens are their names.
pub fn tenants() -> crate::worker::tenants::Tenants {
    let entry = |name: &str| {
        let hash = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(name.as_bytes()));
        format!("[[tenant]]\nname = \"{name}\"\ntoken_sha256 = \"{hash}\"\n")
    };
    crate::worker::tenants::Tenants::parse(&(entry("alice") + &entry("bob"))).unwrap()
}

/// A worker of 2 slots and 64 MiB, its state in `dir` (see [`second`]);
/// multi-tenant if `multi`.
pub fn config(dir: &std::path::Path, multi: bool) -> WorkerConfig {
    let mut config = WorkerConfig::new("127.0.0.1:0".parse().unwrap());
    config.runner.sandbox.slots = 2;
    config.ledger.memory = Some(64 * MIB);
    config.ledger.reserve = 0;
    config.state_dir = Some(dir.join("state"));
    std::fs::create_dir_all(dir.join("scratch")).unwrap();
    config.runner.sandbox.scratch_root = Some(dir.join("scratch"));
    // The pool's key: the workers made from one directory share it (its
    // `cluster.key`, made once), so what they gossip is vouched for and
    // their clients trust each other's peers.
    let key = dir.join("cluster.key");
    if !key.exists() {
        std::fs::write(&key, hex::encode(rand::random::<[u8; 32]>())).unwrap();
    }
    config.cluster_key = Some(key);
    // Alone: not sharing this machine's ledger with other tests' workers.
    config.host_ledger = None;
    if multi {
        config.tenants = tenants();
    }
    config
}

/// Counts down from 2^26 before it writes its stdin back: a job of some
/// tens of milliseconds.
pub const BUSY_ECHO: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_read" (func $read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "_start") (local $n i32)
    (local.set $n (i32.const 67108864))
    (loop $l (local.set $n (i32.sub (local.get $n) (i32.const 1))) (br_if $l (local.get $n)))
    (i32.store (i32.const 0) (i32.const 64))
    (i32.store (i32.const 4) (i32.const 1024))
    (drop (call $read (i32.const 0) (i32.const 0) (i32.const 1) (i32.const 8)))
    (i32.store (i32.const 4) (i32.load (i32.const 8)))
    (drop (call $write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))"#;

/// `config` for another worker of the same pool: its own state and scratch
/// under `dir`, named `name`.
pub fn second(mut config: WorkerConfig, dir: &std::path::Path, name: &str) -> WorkerConfig {
    config.state_dir = Some(dir.join(format!("state-{name}")));
    let scratch = dir.join(format!("scratch-{name}"));
    std::fs::create_dir_all(&scratch).unwrap();
    config.runner.sandbox.scratch_root = Some(scratch);
    config
}

/// Waits until `done` says so, asking every 10 ms; fails the test naming
/// `what` if it has not within 30 s.
pub async fn until(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    while !done().await {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}
