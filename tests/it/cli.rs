//! `peerwasm run` as a user runs it: the real binary, real files, real exit
//! codes.

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use peerwasm_testkit::guest_wasm;

/// A cache dir shared by these tests, so the module compiles once across them.
fn cache_dir() -> &'static std::path::Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| tempfile::tempdir().unwrap()).path()
}

fn peerwasm(args: &[&str], stdin: &[u8]) -> Output {
    peerwasm_with_tmp(args, stdin, &std::env::temp_dir())
}

/// [`peerwasm`] with `TMPDIR` set to `tmp`.
fn peerwasm_with_tmp(args: &[&str], stdin: &[u8], tmp: &std::path::Path) -> Output {
    let mut child = Command::new(crate::support::PEERWASM)
        .args(args)
        .env("TMPDIR", tmp)
        .env("PEERWASM_CACHE_DIR", cache_dir())
        .env("GREETING", "from the host") // must not reach the job
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting peerwasm");
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

fn run_guest(flags: &[&str], guest: &str, job_args: &[&str], stdin: &str) -> Output {
    let wasm = guest_wasm(guest);
    let mut args = vec!["run"];
    args.extend_from_slice(flags);
    args.push(wasm.to_str().unwrap());
    args.extend_from_slice(job_args);
    peerwasm(&args, stdin.as_bytes())
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn args_after_the_module_go_to_the_job_verbatim() {
    let out = run_guest(
        &["--env", "GREETING=hello"],
        "hello",
        &["--json", "-x", "--", "--stats"],
        "",
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "--json\n-x\n--\n--stats\nhello\n");
    assert_eq!(text(&out.stderr), "");
}

#[test]
fn stdin_reaches_the_job() {
    let out = run_guest(&[], "primes", &[], r#"{"n": 100}"#);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "{\"count\":25}\n");
}

#[test]
fn exit_codes_follow_the_conventions() {
    let exit = run_guest(&[], "hostile-exit", &[], "");
    assert_eq!(exit.status.code(), Some(3));
    assert_eq!(
        text(&exit.stderr),
        "",
        "the job's own exit needs no message"
    );

    let mem = run_guest(&["--mem", "16MiB"], "memhog", &[], "64");
    assert_eq!(mem.status.code(), Some(137));
    let line = text(&mem.stderr);
    assert!(
        line.contains("job exceeded its memory limit of 16 MiB (peak "),
        "{line}"
    );

    let time = run_guest(&["--timeout", "1s"], "hostile-loop", &[], "");
    assert_eq!(time.status.code(), Some(124));
    assert!(
        text(&time.stderr).contains("time limit of 1s"),
        "{}",
        text(&time.stderr)
    );

    let sleep = run_guest(&["--timeout", "1s"], "sleep", &[], "600000");
    assert_eq!(sleep.status.code(), Some(124));

    let trap = run_guest(&[], "hostile-recurse", &[], "");
    assert_eq!(trap.status.code(), Some(134));
    assert!(
        text(&trap.stderr).contains("job trapped"),
        "{}",
        text(&trap.stderr)
    );
}

/// The embedded `run` owns its process, so a job's code runs there without
/// time-limit checks: a job computing past its deadline ends with the
/// process, reported as the sandbox reports one (124, the limit, its peak
/// and CPU time), and its scratch directory goes with it.
#[test]
fn a_computing_job_past_its_deadline_ends_with_the_process() {
    let tmp = tempfile::tempdir().unwrap();
    let wasm = guest_wasm("hostile-loop");
    let started = std::time::Instant::now();
    let out = peerwasm_with_tmp(
        &[
            "run",
            "--json",
            "--timeout",
            "500ms",
            wasm.to_str().unwrap(),
        ],
        b"",
        tmp.path(),
    );
    let took = started.elapsed();
    assert_eq!(out.status.code(), Some(124), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["outcome"]["time_limit_exceeded"]["limit_ms"], 500, "{v}");
    assert!(v["peak_memory_bytes"].as_u64().unwrap() > 1 << 20, "{v}");
    assert!(v["wall_time_us"].as_u64().unwrap() >= 500_000, "{v}");
    // Measured, not left at 0; how much depends on what else the machine
    // runs (other tests share its cores).
    assert!(
        v["cpu_time_us"].as_u64().unwrap() >= 10_000,
        "the loop computed: {v}"
    );
    assert!(
        took < std::time::Duration::from_secs(5),
        "ended {took:?} after starting"
    );
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        left.is_empty(),
        "the command's scratch is removed: {left:?}"
    );
}

/// A module can come through a pipe (`peerwasm run <(curl ...)`): read to
/// its end, and never taken for what came through the same path before.
#[test]
fn a_module_through_a_pipe_runs_and_is_not_remembered_by_path() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("job.wasm");
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    for (guest, stdin, expected) in [
        ("hello", "", "hi\nhello\n"),
        ("primes", r#"{"n": 100}"#, "{\"count\":25}\n"),
    ] {
        let bytes = std::fs::read(guest_wasm(guest)).unwrap();
        let writer = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::write(fifo, bytes).unwrap())
        };
        let out = peerwasm(
            &[
                "run",
                "--env",
                "GREETING=hello",
                fifo.to_str().unwrap(),
                "hi",
            ],
            stdin.as_bytes(),
        );
        writer.join().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert_eq!(text(&out.stdout), expected);
    }
}

#[test]
fn bad_input_gets_one_clear_line_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let text_file = dir.path().join("notes.txt");
    std::fs::write(&text_file, "just some text\n").unwrap();
    let out = peerwasm(&["run", text_file.to_str().unwrap()], b"");
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr).lines().count(),
        1,
        "{}",
        text(&out.stderr)
    );
    assert!(text(&out.stderr).contains("invalid module: not a WebAssembly module"));
    // The common mistakes say what to do: a Python script, a native build.
    let script = dir.path().join("analysis.py");
    std::fs::write(&script, "import numpy as np\nprint(np.pi)\n").unwrap();
    let out = peerwasm(&["run", script.to_str().unwrap()], b"");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("peerwasm run --python"),
        "{}",
        text(&out.stderr)
    );
    let native = dir.path().join("job");
    std::fs::write(&native, b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0").unwrap();
    let out = peerwasm(&["run", native.to_str().unwrap()], b"");
    assert!(
        text(&out.stderr).contains("--target wasm32-wasip1"),
        "{}",
        text(&out.stderr)
    );

    let out = peerwasm(&["run", "/nonexistent/job.wasm"], b"");
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("cannot read /nonexistent/job.wasm"));

    let out = run_guest(&["--mem", "lots"], "hello", &[], "");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("not a size"),
        "{}",
        text(&out.stderr)
    );

    let out = run_guest(&["--dir", "/nonexistent-dir::/in"], "hello", &[], "");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("is not a directory"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn json_prints_one_result_object() {
    let out = run_guest(&["--json"], "memhog", &[], "10");
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["outcome"]["exited"]["code"], 0);
    assert_eq!(v["stdout"], "10\n");
    assert_eq!(v["peer"], "embedded");
    let peak = v["peak_memory_bytes"].as_u64().unwrap();
    assert!((10 << 20..12 << 20).contains(&peak), "{peak}");

    let out = run_guest(&["--json", "--mem", "8MiB"], "memhog", &[], "64");
    assert_eq!(out.status.code(), Some(137));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["outcome"]["memory_limit_exceeded"]["limit"], 8 << 20);
}

#[test]
fn stats_go_to_stderr() {
    let out = run_guest(&["--stats"], "memhog", &[], "5");
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(text(&out.stdout), "5\n");
    let err = text(&out.stderr);
    assert!(
        err.contains("peak memory 6.") && err.contains("of 1 GiB") && err.contains("cpu"),
        "{err}"
    );
}

#[test]
fn dirs_map_like_wasmtime() {
    let input = tempfile::tempdir().unwrap();
    let output = tempfile::tempdir().unwrap();
    std::fs::write(input.path().join("x.txt"), "peer to peer").unwrap();
    let in_arg = format!("{}::/in", input.path().display());
    let out_arg = format!("{}::/out", output.path().display());
    let out = run_guest(&["--dir", &in_arg, "--dir", &out_arg], "files", &[], "");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "copied 1 files\n");
    assert_eq!(
        std::fs::read_to_string(output.path().join("x.txt")).unwrap(),
        "PEER TO PEER"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_whose_stdout_is_closed_keeps_serving() {
    // A batch system may close stdout; the address line must not kill it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let cache = tempfile::tempdir().unwrap();
    let mut worker = Command::new(crate::support::PEERWASM)
        .args([
            "worker",
            "--listen",
            &addr,
            "--memory",
            "1GiB",
            "--reserve",
            "0",
            "--slots",
            "1",
        ])
        .arg("--cache-dir")
        .arg(cache.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    drop(worker.stdout.take()); // closed before the worker writes to it
    let hello = peerwasm::client::Job::new(peerwasm_testkit::guest_wasm_bytes("hello"));
    let target = peerwasm::client::Target::pool(vec![addr.clone()]).unwrap();
    let start = std::time::Instant::now();
    let result = loop {
        match target.run(&hello, hello.spec(Vec::new(), 16 << 20)).await {
            Ok(r) => break r,
            Err(e) => {
                assert!(
                    start.elapsed() < std::time::Duration::from_secs(20),
                    "never served: {e}"
                );
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    };
    assert!(result.outcome.is_success());
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(
        worker.try_wait().unwrap().is_none(),
        "the worker died with its stdout closed"
    );
    let _ = worker.kill();
    let _ = worker.wait();
}
