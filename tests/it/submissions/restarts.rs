//! Owners and workers killed and started again: a detached map, an
//! attached one resuming from its results file, detached jobs, a tenant's
//! work after a restart, a damaged state database.

use super::*;

/// `ns` as the primes guest's inputs, one JSON line each, in `dir/in.jsonl`.
#[test]
fn a_detached_map_survives_its_owner_killed_twice() {
    let root = tempfile::tempdir().unwrap();
    let helper = WorkerProcess::start("1GiB", 2, None);
    let mut owner = Owner::new(root.path(), Some(&helper.addr));
    owner.start();
    let ns: Vec<usize> = (0..1000).map(|i| 2_000_000 + 7 * i).collect();
    let inputs = primes_inputs(root.path(), &ns);
    let id = detach(&owner.addr, &wasm("primes"), &inputs, &[]);

    // Killed -9 twice at moments that vary from run to run, restarted on
    // the same state dir each time.
    let mut kills = 0;
    for _ in 0..2 {
        let wait = Duration::from_millis(300 + rand::random::<u64>() % 1200);
        std::thread::sleep(wait);
        let before = submission_state(&helper.addr, &id);
        if before["state"] != "running" {
            break; // it finished before we got to it; the rest still holds
        }
        owner.kill();
        kills += 1;
        owner.start();
    }
    let out = run(&["results", "--peers", &helper.addr, &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    check_primes_results(&stdout(&out), &ns);
    let info = submission_state(&owner.addr, &id);
    assert_eq!(info["state"], "done");
    assert_eq!(info["done"], 1000);
    eprintln!("owner killed {kills} times");
    assert!(
        kills >= 1,
        "the map ended before the owner could be killed once: make the jobs longer"
    );
}

#[test]
fn an_attached_map_resumes_from_its_results_file() {
    let root = tempfile::tempdir().unwrap();
    let w = WorkerProcess::start("1GiB", 2, None);
    let ns: Vec<usize> = (0..300).map(|i| 200_000 + 13 * i).collect();
    let inputs = primes_inputs(root.path(), &ns);
    let out_file = root.path().join("out.jsonl");
    let (inputs_s, out_s) = (inputs.to_str().unwrap(), out_file.to_str().unwrap());
    let mut client = peerwasm()
        .args([
            "map",
            "--no-progress",
            "--max-in-flight",
            "2",
            "--peers",
            &w.addr,
            "-o",
            out_s,
            &wasm("primes"),
            inputs_s,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while std::fs::read_to_string(&out_file).map_or(0, |t| t.lines().count()) < 20 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no results written"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    client.kill().unwrap(); // SIGKILL: no chance to tidy up
    client.wait().unwrap();
    let written = std::fs::read_to_string(&out_file).unwrap().lines().count();
    assert!(written < ns.len(), "the map finished before it was killed");

    let out = run(&[
        "map",
        "--resume",
        "--no-progress",
        "--peers",
        &w.addr,
        "-o",
        out_s,
        &wasm("primes"),
        inputs_s,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("resuming at input"),
        "{}",
        stderr(&out)
    );
    check_primes_results(&std::fs::read_to_string(&out_file).unwrap(), &ns);
    // Nothing left to do: it says so and runs nothing.
    let out = run(&[
        "map",
        "--resume",
        "--peers",
        &w.addr,
        "-o",
        out_s,
        &wasm("primes"),
        inputs_s,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("already has all 300 results"),
        "{}",
        stderr(&out)
    );
    // A file that is not this map's results is refused, untouched.
    std::fs::write(&out_file, "{\"index\": 5}\n").unwrap();
    let out = run(&[
        "map",
        "--resume",
        "--peers",
        &w.addr,
        "-o",
        out_s,
        &wasm("primes"),
        inputs_s,
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("not the results of this map in order"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        std::fs::read_to_string(&out_file).unwrap(),
        "{\"index\": 5}\n"
    );
}

#[test]
fn a_damaged_state_database_is_refused_and_kept() {
    let root = tempfile::tempdir().unwrap();
    let mut owner = Owner::new(root.path(), None);
    owner.start();
    let inputs = root.path().join("in.jsonl");
    std::fs::write(
        &inputs,
        (0..200)
            .map(|i| format!("{{\"n\": {}}}\n", 1000 + i))
            .collect::<String>(),
    )
    .unwrap();
    let id = detach(&owner.addr, &wasm("primes"), &inputs, &[]);
    let out = run(&["results", "--peers", &owner.addr, &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    owner.terminate(); // a clean stop: everything is in state.db
    let db = owner.state.join("state.db");
    let size = std::fs::metadata(&db).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&db)
        .unwrap()
        .set_len(size / 2)
        .unwrap();

    let mut again = owner
        .command()
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(status) = again.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(20) {
            let _ = again.kill();
            panic!("a worker on a damaged state dir started");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(2), "refused at start");
    let mut err = String::new();
    std::io::Read::read_to_string(again.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(
        err.contains("state.db") && err.contains("damaged") && err.contains("nothing was deleted"),
        "{err}"
    );
    assert_eq!(
        std::fs::metadata(&db).unwrap().len(),
        size / 2,
        "the file is kept as it was"
    );
}

#[test]
fn detached_jobs_outlive_their_worker() {
    let root = tempfile::tempdir().unwrap();
    let mut owner = Owner::new(root.path(), None);
    owner.start();
    let detach_run = |ms: &str| -> String {
        let mut child = peerwasm()
            .args([
                "run",
                "--detach",
                "--mem",
                "64MiB",
                "--peers",
                &owner.addr,
                &wasm("sleep"),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), ms.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out).trim().to_string()
    };
    let quick = detach_run("1");
    let slow = detach_run("3000");
    let discarded = detach_run("1");
    let out = run(&["logs", "-f", "--peers", &owner.addr, &discarded]); // to its end
    assert!(out.status.success(), "{}", stderr(&out));
    let out = run(&["cancel", "--peers", &owner.addr, &discarded]);
    assert!(stdout(&out).contains("discarded"), "{}", stdout(&out));
    // Killed while the slow one sleeps; started again on the same state.
    let out = run(&["jobs", "--json", "--peers", &owner.addr]);
    let jobs: Vec<serde_json::Value> = serde_json::from_str(&stdout(&out)).unwrap();
    assert!(
        jobs.iter()
            .any(|j| j["id"] == slow.as_str() && j["state"] == "running"),
        "{jobs:?}"
    );
    owner.kill();
    owner.start();
    let out = run(&["logs", "--peers", &owner.addr, &quick]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "slept 1 ms\n",
        "a finished job's result is kept"
    );
    let out = run(&["logs", "-f", "--peers", &owner.addr, &slow]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "the unfinished job runs again, to its end: {}",
        stderr(&out)
    );
    assert_eq!(stdout(&out), "slept 3000 ms\n");
    let out = run(&["logs", "--peers", &owner.addr, &discarded]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a discarded result stays discarded"
    );
}

/// With `--tenants`, who uploaded which module outlives the worker: a
/// tenant's unfinished detached job and detached map run again after the
/// worker restarts (before, the job was rejected: "module unknown").
#[test]
fn a_tenants_detached_job_and_map_go_on_after_a_restart() {
    use crate::tenants::{ALICE, tenants_file};
    let root = tempfile::tempdir().unwrap();
    let tenants = tenants_file(1, 1);
    let mut owner = Owner::new(root.path(), None);
    owner.extra = vec![
        "--tenants".into(),
        tenants.path().to_string_lossy().into_owned(),
    ];
    owner.start();
    let as_alice = |args: &[&str]| -> Output {
        let mut all = args.to_vec();
        all.extend(["--token", ALICE]);
        run_within(Duration::from_secs(60), &all)
    };
    let mut child = peerwasm()
        .args([
            "run",
            "--detach",
            "--mem",
            "64MiB",
            "--token",
            ALICE,
            "--peers",
            &owner.addr,
            &wasm("sleep"),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), b"2000").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let job = stdout(&out).trim().to_string();
    let inputs = root.path().join("in.txt");
    std::fs::write(&inputs, "300\n".repeat(12)).unwrap();
    let map = detach(
        &owner.addr,
        &wasm("sleep"),
        &inputs,
        &["--mem", "16MiB", "--token", ALICE],
    );
    std::thread::sleep(Duration::from_millis(300));
    owner.kill();
    owner.start();
    let out = as_alice(&["logs", "-f", "--peers", &owner.addr, &job]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "alice's job runs again, to its end: {}",
        stderr(&out)
    );
    assert_eq!(stdout(&out), "slept 2000 ms\n");
    let out = as_alice(&["results", "--peers", &owner.addr, &map]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "alice's map goes on: {}",
        stderr(&out)
    );
    assert_eq!(stdout(&out).lines().count(), 12);
}

/// The owner killed and started again, and the pool not yet told: the view
/// the client looks its submission up in still has the owner dead (here it
/// comes back without `--join`, so it gossips to nobody). `results` asks
/// the dead workers' addresses last, finds the owner back there, and gives
/// every result; `logs` finds a detached job there the same way.
#[test]
fn results_find_an_owner_back_before_the_pool_knows() {
    let root = tempfile::tempdir().unwrap();
    // The helper is too small for the detached job below: it runs on the
    // owner.
    let helper = WorkerProcess::start("256MiB", 2, None);
    let mut owner = Owner::new(root.path(), Some(&helper.addr));
    owner.start();
    let ns: Vec<usize> = (0..40).map(|i| 20_000 + 7 * i).collect();
    let inputs = primes_inputs(root.path(), &ns);
    let id = detach(&owner.addr, &wasm("primes"), &inputs, &[]);
    let job = detached_hello(&owner.addr);
    owner.kill();
    let addr = owner.addr.clone();
    let dead = || {
        let out = run(&["peers", "--json", "--peers", &helper.addr]);
        let view: Vec<serde_json::Value> = serde_json::from_str(&stdout(&out)).unwrap_or_default();
        view.iter()
            .any(|p| p["advert"]["addr"] == addr.as_str() && p["liveness"] == "dead")
    };
    let t = Instant::now();
    while !dead() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the helper never saw the owner dead"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    owner.join = None;
    owner.start();
    assert!(
        dead(),
        "the owner came back to the helper's view without gossip"
    );
    let out = run(&["results", "--peers", &helper.addr, &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    check_primes_results(&stdout(&out), &ns);
    // A detached job's output too, from the owner's state database.
    let out = run(&["logs", "--peers", &helper.addr, &job]);
    assert_eq!(stdout(&out), "kept\n", "{}", stderr(&out));
}

/// `logs -f` on a detached job whose worker is killed and started again:
/// the follower waits for it, says so, and follows the run the restarted
/// worker begins from its start, to its end and exit code.
#[test]
fn a_follower_waits_out_its_workers_restart_and_reads_the_new_run_from_its_start() {
    let root = tempfile::tempdir().unwrap();
    let mut owner = Owner::new(root.path(), None);
    owner.start();
    let out = run(&[
        "run",
        "--detach",
        "--mem",
        "64MiB",
        "--peers",
        &owner.addr,
        &wasm("ticks"),
        "4",
        "700",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();
    let mut follower = peerwasm()
        .args(["logs", "-f", "--peers", &owner.addr, &id])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = crate::streams::lines(follower.stdout.take().unwrap());
    let (_, first) = lines.recv_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(first, "tick 1");
    owner.kill();
    std::thread::sleep(Duration::from_millis(1500)); // down a while
    owner.start();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = follower.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = follower.kill();
            panic!("the follower did not end within 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let rest: Vec<String> = lines.iter().map(|(_, l)| l).collect(); // to EOF
    let mut err = String::new();
    std::io::Read::read_to_string(&mut follower.stderr.take().unwrap(), &mut err).unwrap();
    assert!(status.success(), "{err}");
    assert!(
        err.contains("does not answer") && err.contains("answers again"),
        "{err}"
    );
    assert!(err.contains("the job started again"), "{err}");
    assert!(
        rest.ends_with(&["tick 1", "tick 2", "tick 3", "tick 4"].map(String::from)),
        "the new run from its start: {rest:?} ({err})"
    );
}
