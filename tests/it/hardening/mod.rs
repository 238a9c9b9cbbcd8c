//! A worker no tenant can wedge: while one tenant's job attacks what the
//! worker holds for it (descriptors, buffered output), the worker must
//! answer `/v1/peers` in under a second and run another tenant's job —
//! against real worker processes.

use std::time::{Duration, Instant};

use peerwasm::client::{Job, Target};
use peerwasm::proto::{JobResult, Outcome, StdStream};

use crate::support::{MIB, WorkerProcess};
use crate::tenants::{ALICE, BOB, me, tenants_file, worker};

/// What the worker did for others while an attack ran.
struct Probe {
    /// The slowest `/v1/peers` answer.
    slowest_view: Duration,
    /// How long the other tenant's job took, end to end.
    other_job: Duration,
}

/// Runs `attack` as alice; once it holds its slot, checks the worker
/// answers and runs a job of bob's. Returns the attack's result.
async fn probe_during(w: &WorkerProcess, attack: Job, stdin: &str, mem: u64) -> (JobResult, Probe) {
    let alice = Target::pool_as(vec![w.addr.clone()], Some(ALICE.into())).unwrap();
    let spec = attack.spec(stdin.as_bytes().to_vec(), mem);
    let running = tokio::spawn(async move { alice.run(&attack, spec).await });
    let start = Instant::now();
    while me(&w.addr).await.slots_busy == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the attack never started"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await; // let it do its worst
    let probe = serves_others(w, Some(BOB)).await;
    assert!(
        !running.is_finished(),
        "the attack ended before the probe: make it hold longer"
    );
    (running.await.unwrap().unwrap(), probe)
}

/// Checks the worker answers `/v1/peers` within a second (five times) and
/// runs a job of `token`'s tenant; says how long each took.
async fn serves_others(w: &WorkerProcess, token: Option<&str>) -> Probe {
    let mut slowest_view = Duration::ZERO;
    for _ in 0..5 {
        let t = Instant::now();
        me(&w.addr).await;
        slowest_view = slowest_view.max(t.elapsed());
    }
    let other = Target::pool_as(vec![w.addr.clone()], token.map(String::from)).unwrap();
    let hello = Job::new(peerwasm_testkit::guest_wasm_bytes("hello"));
    let t = Instant::now();
    let r = other
        .run(&hello, hello.spec(Vec::new(), 16 * MIB))
        .await
        .unwrap();
    let other_job = t.elapsed();
    assert!(
        r.outcome.is_success(),
        "the other job during the attack: {}",
        r.outcome
    );
    assert!(
        slowest_view < Duration::from_secs(1),
        "/v1/peers took {slowest_view:?} during the attack"
    );
    Probe {
        slowest_view,
        other_job,
    }
}

mod holdings;
mod strangers;

#[tokio::test(flavor = "multi_thread")]
async fn a_descriptor_bomb_gets_emfile_at_the_bound_and_the_worker_serves_others() {
    let tenants = tenants_file(1, 1);
    let w = worker(2, &tenants, None, &["--max-open-files", "64"]);
    let bomb = Job::new(peerwasm_testkit::guest_wasm_bytes("hostile-files"));
    // Opens until refused, then holds its files for 2 s.
    let (result, probe) = probe_during(&w, bomb, "2000", 32 * MIB).await;
    let stdout = String::from_utf8_lossy(&result.stdout);
    assert!(result.outcome.is_success(), "{}", result.outcome);
    assert!(stdout.starts_with("opened 64 files, then: "), "{stdout}");
    println!(
        "descriptor bomb: {} worker answered /v1/peers in {:?} at worst; another tenant's job took {:?}",
        stdout.trim(),
        probe.slowest_view,
        probe.other_job
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_worker_caps_buffered_output_whatever_the_job_asks() {
    let tenants = tenants_file(1, 1);
    let w = worker(2, &tenants, None, &["--max-output", "1MiB"]);
    // hostile-flood writes 1 GiB to stdout; the job asks to keep 64 MiB.
    let mut flood = Job::new(peerwasm_testkit::guest_wasm_bytes("hostile-flood"));
    flood.limits.stdout_bytes = 64 * MIB;
    let alice = Target::pool_as(vec![w.addr.clone()], Some(ALICE.into())).unwrap();
    let r = alice
        .run(&flood, flood.spec(Vec::new(), 32 * MIB))
        .await
        .unwrap();
    assert_eq!(
        r.outcome,
        Outcome::OutputLimitExceeded {
            stream: StdStream::Stdout,
            limit: MIB
        }
    );
    assert!(
        r.stdout.len() as u64 <= MIB,
        "{} bytes came back",
        r.stdout.len()
    );
    // A job asking for less than the worker's cap keeps its own.
    flood.limits.stdout_bytes = 64 << 10;
    let r = alice
        .run(&flood, flood.spec(Vec::new(), 32 * MIB))
        .await
        .unwrap();
    assert_eq!(
        r.outcome,
        Outcome::OutputLimitExceeded {
            stream: StdStream::Stdout,
            limit: 64 << 10
        }
    );
}
