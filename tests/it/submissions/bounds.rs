//! What a tenant keeps in a worker's state database, bounded and
//! expired; a full state disk that pauses a map and loses nothing; listing
//! commands whose reader goes away; a kept result that leaves no job
//! waiting in vain.

use super::*;

#[test]
fn a_kept_result_leaves_no_job_waiting_for_the_whole_worker() {
    // A detached job's result stays on its worker (5 bytes here) until it
    // is discarded. A map that knows nothing yet asks the pool's largest
    // job for its first jobs: before, that was the whole 1 GiB, which could
    // never start beside those 5 bytes, and the map waited for ever.
    let root = tempfile::tempdir().unwrap();
    let w = WorkerProcess::start("1GiB", 2, None);
    let job = detached_hello(&w.addr);
    let ns = [1000, 2000, 3000];
    let inputs = primes_inputs(root.path(), &ns);
    // A client with nothing learned of `primes` (a cache of its own).
    let mut map = peerwasm();
    map.env("PEERWASM_CACHE_DIR", root.path().join("client-cache"))
        .args(["map", "--peers", &w.addr, &wasm("primes")])
        .arg(&inputs);
    let out = crate::support::output_within(&mut map, b"", Duration::from_secs(60));
    assert!(out.status.success(), "{}", stderr(&out));
    check_primes_results(&stdout(&out), &ns);
    let whole = || {
        let args = [
            "run",
            "--peers",
            &w.addr,
            "--mem",
            "1GiB",
            &wasm("hello"),
            "whole",
        ];
        run_within(Duration::from_secs(60), &args)
    };
    // Asked for by name, the whole worker is refused at once, saying why.
    let out = whole();
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("results it keeps"),
        "{}",
        stderr(&out)
    );
    // Discarded, the result gives the worker back whole.
    let out = run(&["cancel", "--peers", &w.addr, &job]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&whole()), "whole\n");
}

#[test]
fn what_a_tenant_keeps_in_the_state_database_is_bounded() {
    let root = tempfile::tempdir().unwrap();
    let w = WorkerProcess::start_with("1GiB", 2, None, &["--max-stored", "48KiB"]);
    let inputs = root.path().join("in.jsonl");
    std::fs::write(
        &inputs,
        (0..100)
            .map(|i| format!("{{\"n\": {}}}\n", 100 + i))
            .collect::<String>(),
    )
    .unwrap();
    let first = detach(&w.addr, &wasm("primes"), &inputs, &[]);
    let out = run(&["results", "--peers", &w.addr, &first]);
    assert!(out.status.success(), "{}", stderr(&out));
    // Its inputs are gone once it ended, but 100 results are kept (each
    // row also counted 256 bytes): another 100 inputs would go past 48 KiB.
    let args = [
        "map",
        "--detach",
        "--peers",
        &w.addr,
        &wasm("primes"),
        inputs.to_str().unwrap(),
    ];
    let out = run(&args);
    assert_eq!(out.status.code(), Some(2), "refused: {}", stdout(&out));
    assert!(
        stderr(&out).contains("--max-stored") && stderr(&out).contains("peerwasm cancel"),
        "{}",
        stderr(&out)
    );
    // Discarding the finished one makes room.
    run(&["cancel", "--peers", &w.addr, &first]);
    let out = run(&args);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn listing_commands_end_quietly_when_their_reader_goes_away() {
    let w = WorkerProcess::start("1GiB", 1, None);
    for args in [
        ["peers", "--peers"],
        ["history", "--peers"],
        ["submissions", "--peers"],
        ["jobs", "--peers"],
    ] {
        let mut child = peerwasm()
            .args(args)
            .arg(&w.addr)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take()); // `| head -0`: the reader is gone before anything is written
        let out = child.wait_with_output().unwrap();
        assert!(
            !stderr(&out).contains("panicked"),
            "{args:?}: {}",
            stderr(&out)
        );
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
    }
}

/// A tmpfs of `size` mounted at `dir` (a test runs as root, as CI does),
/// unmounted when dropped: a disk that can be filled and freed.
struct SmallDisk(PathBuf);

impl SmallDisk {
    fn mount(dir: &Path, size: &str) -> SmallDisk {
        std::fs::create_dir_all(dir).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "cannot mount a small tmpfs as root: {}",
            stderr(&out)
        );
        SmallDisk(dir.to_path_buf())
    }

    /// Writes a file until the disk is full; its path.
    fn fill(&self) -> PathBuf {
        let path = self.0.join("filler");
        let mut f = std::fs::File::create(&path).unwrap();
        let chunk = vec![7u8; 64 << 10];
        while std::io::Write::write_all(&mut f, &chunk).is_ok() {}
        let _ = f.sync_all();
        path
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// The owner's state dir fills up for a few seconds while a detached map
/// runs: results are never said to be there when they are not, the map
/// pauses and goes on when the disk has room, and in the end every input
/// has exactly one result, in order. (Before, the submission ended `done`
/// with a hole in its results, and `results` exited 0 without them.)
#[test]
fn a_full_state_disk_pauses_a_detached_map_and_loses_no_result() {
    if !crate::support::is_root() {
        return eprintln!(
            "skipped: this test mounts a small tmpfs, which needs root (CI runs as root)"
        );
    }
    let root = tempfile::tempdir().unwrap();
    let disk = SmallDisk::mount(&root.path().join("disk"), "8m");
    let mut owner = Owner::new(&root.path().join("disk"), None);
    owner.cache = root.path().join("cache");
    let log = root.path().join("worker.log");
    let (child, _) = spawn_worker(owner.command().stderr(std::fs::File::create(&log).unwrap()));
    owner.child = Some(child);
    let n = 60;
    let inputs = root.path().join("in.txt");
    std::fs::write(&inputs, "120\n".repeat(n)).unwrap();
    let id = detach(&owner.addr, &wasm("sleep"), &inputs, &["--mem", "16MiB"]);
    let results_now = || -> (Option<i32>, Vec<u64>) {
        let out = run_within(
            Duration::from_secs(20),
            &["results", "--no-wait", "--peers", &owner.addr, &id],
        );
        let indices = stdout(&out)
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["index"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        (out.status.code(), indices)
    };
    let start = Instant::now();
    while results_now().1.len() < 6 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the map did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let filler = disk.fill();
    let full = Instant::now();
    let mut seen_while_full = Vec::new();
    while full.elapsed() < Duration::from_secs(4) {
        // An honest state at every moment: still running, and the results
        // there are a prefix of the inputs, each once.
        let (code, indices) = results_now();
        assert_eq!(
            code,
            Some(75),
            "while the disk is full the map still runs (75), it is not over: {indices:?}"
        );
        assert_eq!(
            indices,
            (0..indices.len() as u64).collect::<Vec<_>>(),
            "results are a prefix, each once"
        );
        seen_while_full.push(indices.len());
        std::thread::sleep(Duration::from_millis(200));
    }
    std::fs::remove_file(&filler).unwrap();
    let out = run_within(
        Duration::from_secs(60),
        &["results", "--peers", &owner.addr, &id],
    );
    let said = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    let indices: Vec<u64> = stdout(&out)
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["index"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(
        indices,
        (0..n as u64).collect::<Vec<_>>(),
        "every input's result once, in order"
    );
    assert!(said.contains(&format!("{n} results, 0 failed")), "{said}");
    // The disk really was full under the map: it said so, and waited.
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("could not be stored") && logged.contains("the map goes on"),
        "{logged}"
    );
    assert!(
        seen_while_full.last() < Some(&n),
        "the map waited while the disk was full: {seen_while_full:?}"
    );
}

/// What detached jobs put in the state database is bounded per tenant and
/// expires: a tag is a submission id or refused; detached jobs count
/// against `--max-stored` (their specs, input and all, while they wait);
/// once run, only the spec without its input is kept; results go after
/// `--keep-results`; and the worker itself refuses detached jobs with
/// writable trees. (Before: 50 MiB tags were stored, detached jobs were
/// not counted, kept their input and stayed forever.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detached_jobs_are_bounded_in_the_state_database_and_expire() {
    use crate::tenants::{post, upload};
    use peerwasm::client::Job;
    use peerwasm::proto::submission::JobTag;
    use peerwasm::proto::tree::TreeGrant;
    let root = tempfile::tempdir().unwrap();
    let state = root.path().join("state");
    let w = WorkerProcess::start_with(
        "1GiB",
        1,
        None,
        &[
            "--max-stored",
            "64KiB",
            "--keep-results",
            "3s",
            "--state-dir",
            state.to_str().unwrap(),
        ],
    );
    let (sleep, hello) = (
        Job::new(peerwasm_testkit::guest_wasm_bytes("sleep")),
        Job::new(peerwasm_testkit::guest_wasm_bytes("hello")),
    );
    upload(&w.addr, &sleep, None).await;
    upload(&w.addr, &hello, None).await;
    // A tag is an id, not a store.
    let mut tagged = hello.spec(Vec::new(), 16 << 20);
    tagged.tag = Some(JobTag {
        submission: "x".repeat(1 << 20),
        index: 0,
        attempt: 1,
    });
    let resp = post(&w.addr, &tagged, None, false).await;
    assert_eq!(resp.status(), 400);
    assert!(resp.text().await.unwrap().contains("tag"));
    // A writable tree on a detached job: refused by the worker itself.
    let mut writable = hello.spec(Vec::new(), 16 << 20);
    writable.trees = vec![TreeGrant {
        manifest: hello.hash(),
        guest: "/out".into(),
        read_only: false,
    }];
    let resp = post(&w.addr, &writable, None, true).await;
    assert_eq!(resp.status(), 400);
    assert!(resp.text().await.unwrap().contains("read-only"));
    // The one slot is taken; detached jobs with 16 KiB inputs wait, and
    // count: the fourth goes past 64 KiB.
    let resp = post(&w.addr, &sleep.spec(b"1500".to_vec(), 16 << 20), None, true).await;
    assert_eq!(resp.status(), 202);
    let mut ids = Vec::new();
    let refused = loop {
        let resp = post(
            &w.addr,
            &hello.spec(vec![b'x'; 16 << 10], 16 << 20),
            None,
            true,
        )
        .await;
        if resp.status() != 202 {
            break resp;
        }
        ids.push(resp.text().await.unwrap());
        assert!(
            ids.len() < 4,
            "64 KiB of --max-stored took {} jobs of 16 KiB",
            ids.len()
        );
    };
    assert_eq!(refused.status(), 503);
    assert!(refused.text().await.unwrap().contains("--max-stored"));
    assert_eq!(ids.len(), 3);
    // Once they have run, their inputs are no longer kept...
    let db = rusqlite::Connection::open_with_flags(
        state.join("state.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let kept = |sql: &str| -> i64 { db.query_row(sql, [], |r| r.get(0)).unwrap() };
    let start = Instant::now();
    while kept("SELECT count(*) FROM detached WHERE result IS NOT NULL") < 4 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the detached jobs did not end"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        kept("SELECT max(length(spec)) FROM detached") < 1024,
        "a run job's input is not kept"
    );
    let resp = post(
        &w.addr,
        &hello.spec(vec![b'x'; 16 << 10], 16 << 20),
        None,
        true,
    )
    .await;
    assert_eq!(resp.status(), 202, "room again");
    // ...and after --keep-results, neither are they.
    let start = Instant::now();
    while kept("SELECT count(*) FROM detached") > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "finished detached jobs did not expire"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let out = run_within(
        Duration::from_secs(20),
        &["logs", "--peers", &w.addr, &ids[0]],
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "an expired result is gone: {}",
        stderr(&out)
    );
}
