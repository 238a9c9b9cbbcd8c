//! Stdin and output flowing while a job runs, embedded and on a real
//! remote worker (`POST /v1/jobs/stream`): a job that never reads stdin
//! does not wait for it, an interactive job holds a conversation, output
//! shows as it is written, and a job whose client goes is cancelled.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::support::{MIB, WorkerProcess};

/// `peerwasm run` with stdin and stdout piped to us; `peers`: the remote
/// worker, or none for the embedded one.
pub(crate) fn run(peers: Option<&str>, guest: &str, args: &[&str]) -> Child {
    let mut cmd = Command::new(crate::support::PEERWASM);
    cmd.arg("run");
    if let Some(p) = peers {
        cmd.args(["--peers", p]);
    }
    cmd.arg(peerwasm_testkit::guest_wasm(guest)).args(args);
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Lines of a child's stdout as they come, with when each came.
pub(crate) fn lines(out: ChildStdout) -> mpsc::Receiver<(Instant, String)> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send((Instant::now(), line)).is_err() {
                return;
            }
        }
    });
    rx
}

pub(crate) fn wait_exit(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if start.elapsed() > within {
            let _ = child.kill();
            panic!("peerwasm run did not end within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn worker() -> WorkerProcess {
    WorkerProcess::start("2GiB", 2, None)
}

/// `sleep 5 | peerwasm run hello.wasm x`: the job never reads stdin, so
/// neither it nor `run` waits for the pipe to close.
#[test]
fn a_job_that_never_reads_stdin_does_not_wait_for_it() {
    let w = worker();
    for peers in [None, Some(w.addr.as_str())] {
        // Warm the module cache: the figure is about stdin, not compiling.
        let mut warm = run(peers, "hello", &["warm"]);
        drop(warm.stdin.take());
        assert!(wait_exit(&mut warm, Duration::from_secs(60)).success());

        let started = Instant::now();
        let mut child = run(peers, "hello", &["x"]);
        let _open_stdin: ChildStdin = child.stdin.take().unwrap(); // held open, never written
        let status = wait_exit(&mut child, Duration::from_secs(5));
        let took = started.elapsed();
        let mut out = String::new();
        std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out).unwrap();
        assert!(status.success());
        assert_eq!(out, "x\n");
        println!(
            "stdin held open, {}: run ended in {took:?}",
            peers.unwrap_or("embedded")
        );
        assert!(
            took < Duration::from_millis(800),
            "{}: {took:?}",
            peers.unwrap_or("embedded")
        );
    }
}

/// A line in, its answer out, three times, before stdin ends — as a WASI
/// conformance harness or any interactive tool drives a program.
#[test]
fn an_interactive_job_round_trips_lines_embedded_and_remote() {
    let w = worker();
    for peers in [None, Some(w.addr.as_str())] {
        let mut child = run(peers, "interactive", &[]);
        let mut stdin = child.stdin.take().unwrap();
        let answers = lines(child.stdout.take().unwrap());
        for i in 1..=3 {
            let sent = Instant::now();
            writeln!(stdin, "line {i}").unwrap();
            stdin.flush().unwrap();
            let (at, answer) = answers
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| {
                    panic!("{}: no answer to line {i}", peers.unwrap_or("embedded"))
                });
            assert_eq!(answer, format!("echo: line {i}"));
            println!(
                "{}: line {i} answered in {:?}",
                peers.unwrap_or("embedded"),
                at - sent
            );
        }
        drop(stdin); // the end of input
        let (_, last) = answers.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(last, "3 lines");
        assert!(wait_exit(&mut child, Duration::from_secs(10)).success());
    }
}

/// A remote job that prints, sleeps 2 s and prints again shows its first
/// line long before its second, as the embedded worker does.
#[test]
fn remote_output_shows_as_it_is_written() {
    let w = worker();
    let mut child = run(Some(&w.addr), "ticks", &["2", "2000"]);
    drop(child.stdin.take());
    let out = lines(child.stdout.take().unwrap());
    let (first_at, first) = out.recv_timeout(Duration::from_secs(60)).unwrap();
    let (second_at, second) = out.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!((first.as_str(), second.as_str()), ("tick 1", "tick 2"));
    let gap = second_at - first_at;
    println!("remote ticks 2 s apart arrived {gap:?} apart");
    assert!(
        gap > Duration::from_millis(1500),
        "the first line came only {gap:?} before the second"
    );
    assert!(wait_exit(&mut child, Duration::from_secs(10)).success());
}

/// Killing `run` (a closed laptop) while its remote job waits on stdin:
/// the worker sees the client go, cancels the job and frees its slot.
#[tokio::test(flavor = "multi_thread")]
async fn a_streamed_job_whose_client_goes_is_cancelled() {
    let w = worker();
    // Waiting on stdin, and idle after its input has ended.
    for (guest, args, keep_stdin) in [
        ("interactive", &[][..], true),
        ("ticks", &["2", "60000"][..], false),
    ] {
        let mut child = run(Some(&w.addr), guest, args);
        let stdin = child.stdin.take().unwrap();
        if !keep_stdin {
            drop(stdin);
        } else {
            std::mem::forget(stdin); // closed when the child is killed
        }
        let start = Instant::now();
        while crate::tenants::me(&w.addr).await.slots_busy == 0 {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the job never started"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        child.kill().unwrap();
        let _ = child.wait();
        let killed = Instant::now();
        while crate::tenants::me(&w.addr).await.slots_busy > 0 {
            assert!(
                killed.elapsed() < Duration::from_secs(5),
                "{guest}: the job outlived its client"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        println!(
            "streamed {guest} job cancelled {:?} after its client was killed",
            killed.elapsed()
        );
    }
    let m = crate::observe::scrape(&w.addr).await;
    assert_eq!(
        crate::observe::get(
            &m,
            "peerwasm_jobs_total{outcome=\"cancelled\",tenant=\"default\"}"
        ),
        2.0
    );
}

/// The library call: stdin given up front and streamed, output heard as it
/// comes and also in the result; refusals go to the next worker before any
/// stdin is spent (here: the module is uploaded on the worker's 404).
#[tokio::test(flavor = "multi_thread")]
async fn the_pool_streams_stdin_and_output_for_library_callers() {
    use peerwasm::client::{Job, Pool, PoolConfig};
    use peerwasm::sandbox::StdinFeed;
    let w = worker();
    let pool = Pool::new(PoolConfig::new(vec![w.addr.clone()])).unwrap();
    let job = Job::new(peerwasm_testkit::guest_wasm_bytes("interactive"));
    let (tx, feed) = StdinFeed::channel();
    let feeder = tokio::spawn(async move {
        for i in 2..=3 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            tx.send(Ok(format!("b{i}\n").into())).await.unwrap();
        }
    });
    let mut heard = Vec::new();
    let mut on_output =
        |_: peerwasm::proto::StdStream, bytes: &[u8]| heard.extend_from_slice(bytes);
    let spec = job.spec(b"a1\n".to_vec(), 16 * MIB);
    let r = pool
        .run_streaming(&job, spec, Some(feed), &mut on_output)
        .await
        .unwrap();
    feeder.await.unwrap();
    assert!(r.outcome.is_success(), "{}", r.outcome);
    let expected = "echo: a1\necho: b2\necho: b3\n3 lines\n";
    assert_eq!(String::from_utf8_lossy(&r.stdout), expected);
    assert_eq!(String::from_utf8_lossy(&heard), expected);
}

/// `run --detach` returns at once with an id; `logs -f ID` from anywhere
/// shows the output as the job writes it and exits with its code; the
/// result stays until discarded, so `logs ID` later shows all of it.
#[test]
fn a_detached_jobs_output_can_be_followed_and_read_again() {
    let w = worker();
    let bin = crate::support::PEERWASM;
    let ticks = peerwasm_testkit::guest_wasm("ticks");
    let started = Instant::now();
    let out = Command::new(bin)
        .args(["run", "--peers", &w.addr, "--detach"])
        .arg(&ticks)
        .args(["3", "700"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let id = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert_eq!(id.len(), 32, "{id}");
    assert!(started.elapsed() < Duration::from_secs(30));
    let mut follow = Command::new(bin)
        .args(["logs", "-f", "--peers", &w.addr, &id])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let ticks_seen = lines(follow.stdout.take().unwrap());
    let seen: Vec<(Instant, String)> = (0..3)
        .map(|_| ticks_seen.recv_timeout(Duration::from_secs(30)).unwrap())
        .collect();
    let texts: Vec<&str> = seen.iter().map(|(_, l)| l.as_str()).collect();
    assert_eq!(texts, ["tick 1", "tick 2", "tick 3"]);
    let gap = seen[2].0 - seen[1].0;
    println!("logs -f: ticks written 700 ms apart arrived {gap:?} apart");
    assert!(
        gap > Duration::from_millis(400),
        "the output came all at once ({gap:?} apart)"
    );
    assert!(wait_exit(&mut follow, Duration::from_secs(10)).success());
    // Read again after it ended: the same bytes, kept until discarded.
    let again = Command::new(bin)
        .args(["logs", "--peers", &w.addr, &id])
        .output()
        .unwrap();
    assert!(again.status.success());
    assert_eq!(
        String::from_utf8_lossy(&again.stdout),
        "tick 1\ntick 2\ntick 3\n"
    );
    let discard = Command::new(bin)
        .args(["cancel", "--peers", &w.addr, &id])
        .output()
        .unwrap();
    assert!(discard.status.success(), "{discard:?}");
    let gone = Command::new(bin)
        .args(["logs", "--peers", &w.addr, &id])
        .output()
        .unwrap();
    assert_eq!(gone.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&gone.stderr).contains("no such detached job"),
        "{gone:?}"
    );
}
