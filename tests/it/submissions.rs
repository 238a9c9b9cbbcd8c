//! Durable submissions against real worker processes: a detached map whose
//! owner is killed -9 (twice) and restarted gives every result once and in
//! order; its client exits at once; results from another client; cancel
//! stops its jobs on every worker; an attached map resumes from its results
//! file after its client is killed; a damaged state database is refused,
//! and kept; every worker keeps a history of what it ran.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::support::{WorkerProcess, spawn_worker};

fn peerwasm() -> Command {
    Command::new(crate::support::PEERWASM)
}

fn wasm(name: &str) -> String {
    peerwasm_testkit::guest_wasm(name)
        .to_string_lossy()
        .into_owned()
}

/// A free loopback port (bound, then released for the worker to take).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A worker on a fixed address with its own state dir, so that it can be
/// killed and started again as the same worker.
struct Owner {
    addr: String,
    state: PathBuf,
    cache: PathBuf,
    join: Option<String>,
    /// More flags for `peerwasm worker`.
    extra: Vec<String>,
    child: Option<Child>,
}

impl Owner {
    fn new(root: &Path, join: Option<&str>) -> Owner {
        Owner {
            addr: format!("127.0.0.1:{}", free_port()),
            state: root.join("state"),
            cache: root.join("cache"),
            join: join.map(String::from),
            extra: Vec::new(),
            child: None,
        }
    }

    fn command(&self) -> Command {
        let mut cmd = peerwasm();
        cmd.args([
            "worker",
            "--listen",
            &self.addr,
            "--memory",
            "1GiB",
            "--reserve",
            "0",
            "--slots",
            "2",
        ])
        .args(["--gossip-interval", "100ms", "--drain-grace", "1s"])
        .arg("--state-dir")
        .arg(&self.state)
        .arg("--cache-dir")
        .arg(&self.cache)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
        if let Some(j) = &self.join {
            cmd.args(["--join", j]);
        }
        cmd.args(&self.extra);
        cmd
    }

    fn start(&mut self) {
        let (child, addr) = spawn_worker(&mut self.command());
        assert_eq!(addr, self.addr);
        self.child = Some(child);
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn terminate(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let _ = c.wait();
        }
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.kill();
    }
}

fn run(args: &[&str]) -> Output {
    peerwasm().args(args).output().expect("running peerwasm")
}

/// [`run`], killed (and the test failed) if it takes longer than `limit`.
fn run_within(limit: Duration, args: &[&str]) -> Output {
    crate::support::output_within(peerwasm().args(args), b"", limit)
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `peerwasm map --detach`, which must exit at once and print only the id.
fn detach(peers: &str, module: &str, inputs: &Path, extra: &[&str]) -> String {
    let start = Instant::now();
    let mut args = vec!["map", "--detach", "--peers", peers];
    args.extend(extra);
    args.extend([module, inputs.to_str().unwrap()]);
    let out = run(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "map --detach took {:?}",
        start.elapsed()
    );
    let id = stdout(&out).trim().to_string();
    assert!(
        id.starts_with("s-") && !id.contains('\n'),
        "stdout is only the id: {id:?}"
    );
    id
}

/// How many primes are below each `n` of `ns`, from one sieve.
fn primes_below(ns: &[usize]) -> Vec<u64> {
    let top = ns.iter().copied().max().unwrap_or(2).max(2);
    let mut sieve = vec![true; top];
    sieve[0] = false;
    sieve[1] = false;
    let mut i = 2;
    while i * i < top {
        if sieve[i] {
            (i * i..top).step_by(i).for_each(|j| sieve[j] = false);
        }
        i += 1;
    }
    let mut below = vec![0u64; top + 1];
    for k in 0..top {
        below[k + 1] = below[k] + u64::from(sieve[k]);
    }
    ns.iter().map(|&n| below[n]).collect()
}

/// Checks a results file: exactly `ns.len()` lines, inputs 0.. in order,
/// each with the right count of primes.
fn check_primes_results(text: &str, ns: &[usize]) {
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines.len(), ns.len(), "one result per input");
    for (i, (line, expected)) in lines.iter().zip(primes_below(ns)).enumerate() {
        assert_eq!(line["index"], i as u64, "in input order");
        assert_eq!(
            line["stdout"]["count"], expected,
            "input {i} ({}) has its own answer",
            ns[i]
        );
    }
}

fn submission_state(peers: &str, id: &str) -> serde_json::Value {
    let out = run(&["submissions", "--json", "--peers", peers]);
    assert!(out.status.success(), "{}", stderr(&out));
    let list: Vec<serde_json::Value> = serde_json::from_str(&stdout(&out)).unwrap();
    list.into_iter()
        .find(|s| s["id"] == id)
        .unwrap_or_else(|| panic!("{id} not listed"))
}

#[test]
fn a_detached_map_survives_its_owner_killed_twice() {
    let root = tempfile::tempdir().unwrap();
    let helper = WorkerProcess::start("1GiB", 2, None);
    let mut owner = Owner::new(root.path(), Some(&helper.addr));
    owner.start();
    let ns: Vec<usize> = (0..1000).map(|i| 2_000_000 + 7 * i).collect();
    let inputs = root.path().join("in.jsonl");
    std::fs::write(
        &inputs,
        ns.iter()
            .map(|n| format!("{{\"n\": {n}}}\n"))
            .collect::<String>(),
    )
    .unwrap();
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

#[tokio::test(flavor = "multi_thread")]
async fn results_from_another_client_and_cancel_stops_jobs_everywhere() {
    use crate::pool::{alive, wait_for};
    let root = tempfile::tempdir().unwrap();
    let a = WorkerProcess::start("1GiB", 2, None);
    let b = WorkerProcess::start("1GiB", 2, Some(&a.addr));
    wait_for(&a.addr, Duration::from_secs(10), |v| alive(v) == 2).await;
    // Two quick jobs, then long sleepers: more than the pool's four slots.
    let inputs = root.path().join("in.jsonl");
    let lines: Vec<&str> = ["1", "1"]
        .into_iter()
        .chain(std::iter::repeat_n("30000", 10))
        .collect();
    std::fs::write(&inputs, lines.join("\n") + "\n").unwrap();
    // As many under way as there are slots: the quick ones never queue.
    let id = detach(
        &a.addr,
        &wasm("sleep"),
        &inputs,
        &["--mem", "64MiB", "--max-in-flight", "4"],
    );

    // Another client (another process, through the other worker) gets the
    // results that are in while the map runs.
    let start = Instant::now();
    let got = loop {
        let out = run(&["results", "--no-wait", "--peers", &b.addr, &id]);
        assert_eq!(
            out.status.code(),
            Some(75),
            "still running: {}",
            stderr(&out)
        );
        let got: Vec<serde_json::Value> = stdout(&out)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        if got.len() == 2 {
            break got;
        }
        assert!(
            got.len() < 2 && start.elapsed() < Duration::from_secs(20),
            "{got:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for (i, line) in got.iter().enumerate() {
        assert_eq!(line["index"], i);
        assert_eq!(line["stdout"], "slept 1 ms\n");
    }
    let both_busy = |v: &[peerwasm::gossip::PeerView]| v.iter().all(|p| p.advert.slots_busy > 0);
    wait_for(&a.addr, Duration::from_secs(20), |v| {
        v.len() == 2 && both_busy(v)
    })
    .await;

    let out = run(&["cancel", "--peers", &b.addr, &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("cancelled"), "{}", stdout(&out));
    // Its jobs stop on both workers: every slot is free again.
    for w in [&a, &b] {
        wait_for(&w.addr, Duration::from_secs(10), |v| {
            v.iter()
                .find(|p| p.advert.addr == w.addr)
                .is_some_and(|p| p.advert.slots_busy == 0)
        })
        .await;
    }
    assert_eq!(submission_state(&b.addr, &id)["state"], "cancelled");
    let out = run(&["results", "--peers", &a.addr, &id]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a cancelled map's results end early: {}",
        stderr(&out)
    );
    assert!(stderr(&out).contains("cancelled"), "{}", stderr(&out));
    assert_eq!(stdout(&out).lines().count(), 2);

    // Every job the pool ran is in its worker's history, with its input.
    let start = Instant::now();
    loop {
        let out = run(&["history", "--json", "--peers", &a.addr]);
        assert!(out.status.success(), "{}", stderr(&out));
        let rows: Vec<serde_json::Value> = serde_json::from_str(&stdout(&out)).unwrap();
        let ours: Vec<_> = rows
            .iter()
            .filter(|r| r["submission"] == id.as_str())
            .collect();
        let exited = |i: u64| {
            ours.iter()
                .any(|r| r["outcome"] == "exited" && r["index"] == i && r["attempt"] == 1)
        };
        let cancelled: std::collections::HashSet<_> = ours
            .iter()
            .filter(|r| r["outcome"] == "cancelled")
            .map(|r| r["peer"].as_str().unwrap())
            .collect();
        if exited(0) && exited(1) && cancelled.len() == 2 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "history lacks the map's jobs: {ours:#?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A second cancel discards it.
    let out = run(&["cancel", "--peers", &a.addr, &id]);
    assert!(stdout(&out).contains("discarded"), "{}", stdout(&out));
    let out = run(&["results", "--peers", &a.addr, &id]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("no such submission"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn an_attached_map_resumes_from_its_results_file() {
    let root = tempfile::tempdir().unwrap();
    let w = WorkerProcess::start("1GiB", 2, None);
    let ns: Vec<usize> = (0..300).map(|i| 200_000 + 13 * i).collect();
    let inputs = root.path().join("in.jsonl");
    std::fs::write(
        &inputs,
        ns.iter()
            .map(|n| format!("{{\"n\": {n}}}\n"))
            .collect::<String>(),
    )
    .unwrap();
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

#[test]
fn a_submission_is_its_tenants_alone() {
    use crate::tenants::{ALICE, BOB, CAROL, tenants_file};
    let root = tempfile::tempdir().unwrap();
    let tenants = tenants_file(1, 1);
    let w = crate::tenants::worker(2, &tenants, None, &[]);
    let inputs = root.path().join("in.jsonl");
    std::fs::write(
        &inputs,
        (0..20)
            .map(|i| format!("{{\"n\": {}}}\n", 100 + i))
            .collect::<String>(),
    )
    .unwrap();
    let as_ = |token: &str, args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--peers", &w.addr, "--token", token]);
        run(&all)
    };
    let out = as_(
        ALICE,
        &["map", "--detach", &wasm("primes"), inputs.to_str().unwrap()],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();

    // Bob cannot read, list or cancel it: to him it does not exist.
    let out = as_(BOB, &["results", &id]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("no such submission"),
        "{}",
        stderr(&out)
    );
    let out = as_(BOB, &["cancel", &id]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let out = as_(BOB, &["submissions", "--json"]);
    assert_eq!(stdout(&out).trim(), "[]");
    let out = as_(ALICE, &["results", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).lines().count(), 20);

    // The jobs ran as alice (her token went with them), and the history
    // shows each tenant its own jobs; an operator sees anyone's.
    let history = |token: &str, extra: &[&str]| -> Output {
        let mut args = vec!["history", "--json"];
        args.extend(extra);
        as_(token, &args)
    };
    let rows: Vec<serde_json::Value> = serde_json::from_str(&stdout(&history(ALICE, &[]))).unwrap();
    assert_eq!(
        rows.iter()
            .filter(|r| r["submission"] == id.as_str())
            .count(),
        20,
        "{rows:?}"
    );
    assert!(rows.iter().all(|r| r["tenant"] == "alice"));
    assert_eq!(stdout(&history(BOB, &[])).trim(), "[]");
    let out = history(BOB, &["--tenant", "alice"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("operator"), "{}", stderr(&out));
    let rows: Vec<serde_json::Value> =
        serde_json::from_str(&stdout(&history(CAROL, &["--tenant", "alice"]))).unwrap();
    assert_eq!(rows.len(), 20);
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

/// `results` checks that every input from 0 to N-1 has its result: a
/// finished submission whose stored results have a hole (made here by
/// hand in its state database) is named, with the gap, and exits 1.
#[test]
fn results_names_inputs_without_a_result_and_fails() {
    let root = tempfile::tempdir().unwrap();
    let mut owner = Owner::new(root.path(), None);
    owner.start();
    let inputs = root.path().join("in.jsonl");
    std::fs::write(
        &inputs,
        (0..40)
            .map(|i| format!("{{\"n\": {}}}\n", 100 + i))
            .collect::<String>(),
    )
    .unwrap();
    let id = detach(&owner.addr, &wasm("primes"), &inputs, &["--mem", "16MiB"]);
    let out = run_within(
        Duration::from_secs(60),
        &["results", "--peers", &owner.addr, &id],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    owner.terminate();
    let db = rusqlite::Connection::open(owner.state.join("state.db")).unwrap();
    let gone = db
        .execute(
            "DELETE FROM results WHERE idx IN (5, 6, 7, 39) AND submission = ?1",
            [&id],
        )
        .unwrap();
    assert_eq!(gone, 4);
    drop(db);
    owner.start();
    let out = run_within(
        Duration::from_secs(60),
        &["results", "--peers", &owner.addr, &id],
    );
    let said = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("no result for inputs 5\u{2013}7, 39"),
        "{said}"
    );
    assert_eq!(
        stdout(&out).lines().count(),
        36,
        "the results there are still written"
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
