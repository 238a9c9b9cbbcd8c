//! Shared helpers: a runner shared by tests, and job specs for the guests.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;

use peerwasm::proto::{JobResult, JobSpec};
use peerwasm::sandbox::SandboxConfig;
use peerwasm::runner::{JobRunner, RunnerConfig};

pub const MIB: u64 = 1 << 20;

/// A runner shared by the tests that do not look at cache counters.
pub fn shared() -> &'static JobRunner {
    static RUNNER: OnceLock<JobRunner> = OnceLock::new();
    RUNNER.get_or_init(|| runner(SandboxConfig { slots: 2, ..SandboxConfig::default() }))
}

pub fn runner(sandbox: SandboxConfig) -> JobRunner {
    JobRunner::new(RunnerConfig { sandbox, ..RunnerConfig::default() }).expect("creating a runner")
}

/// A spec for guest example `name` with `stdin`, registered with `runner`.
pub fn guest_job(runner: &JobRunner, name: &str, stdin: &str) -> JobSpec {
    let hash = runner.add_module(peerwasm_testkit::guest_wasm_bytes(name));
    let mut spec = JobSpec::new(hash);
    spec.program_name = format!("{name}.wasm");
    spec.stdin = stdin.as_bytes().to_vec();
    spec
}

/// A spec for a module given as WAT text.
pub fn wat_job(runner: &JobRunner, wat: &str) -> JobSpec {
    let bytes = wat::parse_str(wat).expect("test WAT parses");
    JobSpec::new(runner.add_module(bytes))
}

pub fn stdout(r: &JobResult) -> String {
    String::from_utf8_lossy(&r.stdout).into_owned()
}

pub fn stderr(r: &JobResult) -> String {
    String::from_utf8_lossy(&r.stderr).into_owned()
}

/// Spawns `cmd` (a `peerwasm worker` with its stdout piped) and reads the
/// address it prints.
pub fn spawn_worker(cmd: &mut Command) -> (Child, String) {
    let mut child = cmd.spawn().expect("starting a worker");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout piped")).read_line(&mut line).unwrap();
    let addr = line.trim().strip_prefix("peerwasm worker listening on ").expect("the address line").to_string();
    (child, addr)
}

/// A `peerwasm worker` process; killed when dropped.
pub struct WorkerProcess {
    pub child: Child,
    pub addr: String,
    _cache: tempfile::TempDir,
}

impl WorkerProcess {
    /// Starts `peerwasm worker` on a free loopback port, with its own cache.
    pub fn start(memory: &str, slots: u32, join: Option<&str>) -> WorkerProcess {
        WorkerProcess::start_with(memory, slots, join, &[])
    }

    /// [`start`](Self::start) with more worker flags.
    pub fn start_with(memory: &str, slots: u32, join: Option<&str>, extra: &[&str]) -> WorkerProcess {
        let cache = tempfile::tempdir().unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_peerwasm"));
        cmd.args(["worker", "--listen", "127.0.0.1:0", "--memory", memory]);
        if !extra.contains(&"--reserve") {
            cmd.args(["--reserve", "0"]);
        }
        cmd
            .args(["--slots", &slots.to_string(), "--gossip-interval", "100ms"])
            .arg("--cache-dir")
            .arg(cache.path())
            .stdout(Stdio::piped())
            .args(extra)
            .stderr(Stdio::null());
        if let Some(seed) = join {
            cmd.args(["--join", seed]);
        }
        let (child, addr) = spawn_worker(&mut cmd);
        WorkerProcess { child, addr, _cache: cache }
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

