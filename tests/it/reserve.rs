//! Jobs under a memory reserve below their limit (`JobSpec::memory_reserve`):
//! a real worker lends one memory nobody was promised, never memory another
//! job holds, and says so when it has none; a map learns the reserves from
//! the sizes of its inputs and runs every input whole.

use std::time::Duration;

use peerwasm::client::estimate::EstimateStore;
use peerwasm::client::{Job, MapConfig, MapItem, Target, map};
use peerwasm::proto::{MemoryRequest, Outcome};
use rand::{Rng, SeedableRng};

use crate::pool::wait_for;
use crate::support::{MIB, WorkerProcess};

/// `hold` holding `mib` MiB for `ms`, limit `limit`, under `reserve`.
fn hold(job: &Job, ms: u64, mib: u64, limit: u64, reserve: Option<u64>) -> peerwasm::JobSpec {
    let mut spec = job.spec(format!("{ms} {mib}\n").into_bytes(), limit);
    spec.memory_reserve = reserve.map(MemoryRequest::from);
    spec
}

#[tokio::test(flavor = "multi_thread")]
async fn a_job_grows_past_its_reserve_on_lent_memory_but_never_on_memory_another_holds() {
    let w = WorkerProcess::start_with("100MiB", 4, None, &["--slot-processes", "never"]);
    let target = Target::pool(vec![w.addr.clone()]).unwrap();
    let job = Job::new(peerwasm_testkit::guest_wasm_bytes("hold"));

    // Alone: reserves 20 MiB, is lent what it grows to past them (40 MiB
    // held, within its limit of 64 MiB).
    let alone = target
        .run(&job, hold(&job, 0, 40, 64 * MIB, Some(20 * MIB)))
        .await
        .unwrap();
    assert_eq!(alone.outcome, Outcome::Exited { code: 0 }, "{alone:?}");
    assert!(alone.peak_memory_bytes > 40 * MIB && alone.peak_memory_bytes <= 64 * MIB);
    assert_eq!(alone.memory_limit_bytes, 64 * MIB);

    // A job admitted where its 64 MiB limit fits (100 free), holding its
    // 20 MiB reserve, that grows only after 3 s. Meanwhile a job of
    // 65 MiB is admitted into the 80 free: when the first grows it finds
    // 15 MiB to borrow where it needs ~21 — refused below its limit, at
    // what it held, never taking memory the other was promised.
    let late = {
        let (target, job) = (target.clone(), job.clone());
        let mut spec = job.spec(b"0 40 +3000\n".to_vec(), 64 * MIB);
        spec.memory_reserve = Some(MemoryRequest::from(20 * MIB));
        tokio::spawn(async move { target.run(&job, spec).await })
    };
    wait_for(&w.addr, Duration::from_secs(20), |v| {
        v.iter().any(|p| p.advert.reserved_bytes >= 20 * MIB)
    })
    .await;
    let big = {
        let (target, job) = (target.clone(), job.clone());
        let spec = hold(&job, 5000, 1, 65 * MIB, None);
        tokio::spawn(async move { target.run(&job, spec).await })
    };
    let squeezed = late.await.unwrap().unwrap();
    let Outcome::MemoryLimitExceeded {
        limit, requested, ..
    } = squeezed.outcome
    else {
        panic!("expected out of lent memory, got {squeezed:?}");
    };
    assert!(squeezed.ran_out_of_lent_memory(), "{squeezed:?}");
    assert!(
        (20 * MIB..=35 * MIB).contains(&limit) && requested > limit && requested < 64 * MIB,
        "held {limit} (reserve 20 MiB, at most the 35 MiB nobody else holds), asked {requested}"
    );
    assert!(squeezed.peak_memory_bytes <= 35 * MIB);
    let big = big.await.unwrap().unwrap();
    assert_eq!(big.outcome, Outcome::Exited { code: 0 }, "{big:?}");

    // With the big job gone, every loan came back: the same job fits again.
    let again = target
        .run(&job, hold(&job, 0, 40, 64 * MIB, Some(20 * MIB)))
        .await
        .unwrap();
    assert_eq!(again.outcome, Outcome::Exited { code: 0 }, "{again:?}");
    wait_for(&w.addr, Duration::from_secs(20), |v| {
        v.iter().all(|p| p.advert.reserved_bytes == 0)
    })
    .await;
}

/// A map whose peaks follow its inputs' sizes with noise learns a reserve
/// near the line and a limit over its noise: later inputs run under a
/// reserve, those over it on lent memory, and every input succeeds; one
/// that finds nothing to lend runs again with its whole request reserved.
#[tokio::test(flavor = "multi_thread")]
async fn a_map_learns_reserves_and_its_inputs_over_them_run_on_lent_memory() {
    let w = WorkerProcess::start_with("512MiB", 4, None, &["--slot-processes", "never"]);
    let target = Target::pool(vec![w.addr.clone()]).unwrap();
    let job = Job::new(peerwasm_testkit::guest_wasm_bytes("hold"));
    let mut rng = rand::rngs::StdRng::seed_from_u64(46);
    let inputs: Vec<Vec<u8>> = (0..60)
        .map(|_| {
            let kib = rng.random_range(256..1024usize);
            let factor = 12.0 * (0.9 + 0.2 * rng.random::<f64>());
            let mut input = format!("0 x{factor:.3}\n").into_bytes();
            input.resize(input.len() + (kib << 10), b'a');
            input
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let config = MapConfig {
        estimates: Some(EstimateStore::new(dir.path())),
        ..MapConfig::default()
    };
    let mut items: Vec<MapItem> = Vec::new();
    let summary = map(&target, &job, inputs, &config, &mut items)
        .await
        .unwrap();
    assert!(items.iter().all(MapItem::succeeded), "{summary}");
    let under: Vec<&MapItem> = items.iter().filter(|i| i.reserve.is_some()).collect();
    assert!(
        under.len() >= 20,
        "{} of 60 ran under a reserve: {summary}",
        under.len()
    );
    for i in &under {
        let r = i.reserve.unwrap().bytes();
        assert!(
            r < i.result.memory_limit_bytes,
            "a reserve is below its limit"
        );
    }
    let lent = under
        .iter()
        .filter(|i| i.result.peak_memory_bytes > i.reserve.unwrap().bytes())
        .count();
    assert!(
        lent >= 3,
        "about half of those under a reserve peak over it and ran on lent memory: {lent} of {}",
        under.len()
    );
    let text = summary.to_string();
    assert!(
        text.contains("reserve ×"),
        "the summary says what is reserved: {text}"
    );
}

/// A reactor (as CPython for WASI is one: `memory`, `host_alloc`, `turn`)
/// whose prelude `p` grows its memory by 40 MiB and fills it: its
/// snapshot holds 40 MiB of pages.
const FILLING_REACTOR: &str = r#"
(module
  (memory (export "memory") 1)
  (func (export "host_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "turn") (param $p i32) (param $n i32) (result i32)
    (if (i32.eq (i32.load8_u (local.get $p)) (i32.const 112)) (then
      (drop (memory.grow (i32.const 640)))
      (memory.fill (i32.const 65536) (i32.const 1) (i32.const 41943040))))
    (i32.const 0)))
"#;

#[tokio::test(flavor = "multi_thread")]
async fn what_warm_starts_keep_is_charged_and_let_go_for_a_job_that_needs_the_memory() {
    let reactor = Job::new(wat::parse_str(FILLING_REACTOR).unwrap());
    let hello = Job::new(peerwasm_testkit::guest_wasm_bytes("hello"));
    for mode in ["never", "always"] {
        let w = WorkerProcess::start_with("80MiB", 1, None, &["--slot-processes", mode]);
        let target = Target::pool(vec![w.addr.clone()]).unwrap();
        // A warm job: its snapshot (40 MiB of pages) outlives it, charged.
        let mut spec = reactor.spec(Vec::new(), 48 * MIB);
        spec.warm = Some(peerwasm::proto::WarmStart {
            prelude: "p".into(),
            turn: "t".into(),
        });
        let warm = target.run(&reactor, spec).await.unwrap();
        assert_eq!(
            warm.outcome,
            Outcome::Exited { code: 0 },
            "{mode}: {warm:?}"
        );
        let held = |m: &std::collections::HashMap<String, f64>| {
            crate::observe::get(m, "peerwasm_memory_bytes{kind=\"warm_held\"}") as u64
        };
        let kept = held(&crate::observe::scrape(&w.addr).await);
        assert!((40 * MIB..48 * MIB).contains(&kept), "{mode}: {kept}");

        // The advert says what warm starts keep: a learning map's first
        // jobs ask the largest job beside it (and start warm)...
        let advert = crate::tenants::me(&w.addr).await;
        assert_eq!(advert.warm_bytes, kept, "{mode}");
        assert!(
            advert.largest_beside_warm() <= 80 * MIB - kept,
            "{mode}: {advert:?}"
        );
        // ...while the largest job stays the worker's: a job of 64 MiB,
        // which fits this worker but not beside the snapshot, is sent here
        // by the client (not refused as too large for the pool), waits a
        // moment, the snapshot is let go, it runs.
        assert!(advert.largest_job() >= 64 * MIB, "{mode}: {advert:?}");
        let started = std::time::Instant::now();
        let big = tokio::time::timeout(
            Duration::from_secs(20),
            // A fresh client: its first view of the pool has the snapshot.
            Target::pool(vec![w.addr.clone()])
                .unwrap()
                .run(&hello, hello.spec(b"big".to_vec(), 64 * MIB)),
        )
        .await
        .expect("the job waits for ever behind what warm starts keep")
        .unwrap();
        assert_eq!(big.outcome, Outcome::Exited { code: 0 }, "{mode}: {big:?}");
        println!(
            "{mode}: a 64 MiB job beside a 40 MiB snapshot ran after {:?}",
            started.elapsed()
        );
        let freed = held(&crate::observe::scrape(&w.addr).await);
        assert!(
            freed < 40 * MIB,
            "{mode}: the snapshot stays charged: {freed}"
        );
    }
}
