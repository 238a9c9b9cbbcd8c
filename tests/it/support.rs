//! Shared helpers: `peerwasm` worker processes on free ports.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

pub const MIB: u64 = 1 << 20;

/// The `peerwasm` command under test (this package's copy of it).
pub const PEERWASM: &str = env!("CARGO_BIN_EXE_peerwasm-under-test");

/// A plain HTTP client for poking at a worker directly. peerwasm's reqwest
/// is built without a TLS crypto provider of its own (peerwasm passes
/// rustls's `ring` one explicitly), so it is installed first.
pub fn http() -> reqwest::Client {
    peerwasm::net::tls::install_provider();
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// Spawns `cmd` (a `peerwasm worker` with its stdout piped) and reads the
/// address it prints.
pub fn spawn_worker(cmd: &mut Command) -> (Child, String) {
    let mut child = cmd.spawn().expect("starting a worker");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout piped"))
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("peerwasm worker listening on ")
        .expect("the address line")
        .to_string();
    (child, addr)
}

/// A `peerwasm worker` process; killed when dropped.
pub struct WorkerProcess {
    pub child: Child,
    pub addr: String,
    _cache: tempfile::TempDir,
}

impl WorkerProcess {
    /// Starts `peerwasm worker` on a free loopback port, with its own cache
    /// (unless `extra` names one).
    pub fn start(memory: &str, slots: u32, join: Option<&str>) -> WorkerProcess {
        WorkerProcess::start_with(memory, slots, join, &[])
    }

    /// [`start`](Self::start) with more worker flags.
    pub fn start_with(
        memory: &str,
        slots: u32,
        join: Option<&str>,
        extra: &[&str],
    ) -> WorkerProcess {
        let cache = tempfile::tempdir().unwrap();
        let mut cmd = Command::new(PEERWASM);
        cmd.args(["worker", "--listen", "127.0.0.1:0", "--memory", memory]);
        if !extra.contains(&"--reserve") {
            cmd.args(["--reserve", "0"]);
        }
        // Each test's worker is a host of its own unless the test shares a
        // host ledger on purpose: tests running at once must not see each
        // other's reservations.
        if !extra.contains(&"--host-ledger") {
            cmd.arg("--host-ledger")
                .arg(cache.path().join("host-ledger"));
        }
        if !extra.contains(&"--cache-dir") {
            cmd.arg("--cache-dir").arg(cache.path());
        }
        cmd.args(["--slots", &slots.to_string(), "--gossip-interval", "100ms"])
            .stdout(Stdio::piped())
            .args(extra)
            .stderr(Stdio::null());
        if let Some(seed) = join {
            cmd.args(["--join", seed]);
        }
        let (child, addr) = spawn_worker(&mut cmd);
        WorkerProcess {
            child,
            addr,
            _cache: cache,
        }
    }

    /// SIGTERM: drain and leave.
    pub fn terminate(&mut self) {
        self.signal(libc::SIGTERM);
    }

    /// Sends `signal` (SIGSTOP freezes it: connections stay open, nothing
    /// answers; SIGCONT thaws it).
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, signal) };
    }

    /// SIGKILL, and reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill(); // SIGKILL
        let _ = self.child.wait();
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Whether the tests run as root: what makes network namespaces, memory
/// cgroups and small filesystems possible (CI runs as root; tests that need
/// them say they were skipped otherwise).
pub fn is_root() -> bool {
    // SAFETY: geteuid(2) cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Runs `cmd` with `stdin` fed and its output collected; kills it and fails
/// the test if it is still running after `limit` (a hang fails the test
/// rather than timing out the whole suite).
pub fn output_within(cmd: &mut Command, stdin: &[u8], limit: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the command");
    let pid = child.id() as i32;
    let mut input = child.stdin.take().expect("stdin piped");
    let stdin = stdin.to_vec();
    // Fed from a thread: a command that does not read its stdin must not
    // block us.
    std::thread::spawn(move || std::io::Write::write_all(&mut input, &stdin));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.expect("waiting for the command"),
        Err(_) => {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("{cmd:?} took more than {limit:?}");
        }
    }
}
