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

/// `{"n": N}` lines for `primes`, one per `ns`, in `dir/in.jsonl`.
fn primes_inputs(dir: &Path, ns: &[usize]) -> PathBuf {
    let inputs = dir.join("in.jsonl");
    let lines: String = ns.iter().map(|n| format!("{{\"n\": {n}}}\n")).collect();
    std::fs::write(&inputs, lines).unwrap();
    inputs
}

/// A detached `hello kept` of 512 MiB on `peers`, followed to its end: its
/// id (its result, `kept\n`, stays on its worker until discarded).
fn detached_hello(peers: &str) -> String {
    let out = run(&[
        "run",
        "--detach",
        "--peers",
        peers,
        "--mem",
        "512MiB",
        &wasm("hello"),
        "kept",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let job = stdout(&out).trim().to_string();
    let out = run(&["logs", "-f", "--peers", peers, &job]);
    assert_eq!(stdout(&out), "kept\n", "{}", stderr(&out));
    job
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

mod bounds;
mod restarts;

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
