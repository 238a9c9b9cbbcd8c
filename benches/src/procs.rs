//! Real `peerwasm` processes for the benchmarks: workers and commands.
//!
//! The benchmark binary embeds the whole `peerwasm` command line
//! (`peerwasm-benches peerwasm ARGS...` is `peerwasm ARGS...`), so the
//! workers and `map`/`run` commands it measures are separate processes
//! running the same code as the `peerwasm` binary, without depending on a
//! second build of it.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// `peerwasm` as a command: this executable with the `peerwasm` verb.
pub fn peerwasm() -> Command {
    let mut cmd = Command::new(std::env::current_exe().expect("the benchmark's own path"));
    cmd.arg("peerwasm");
    cmd
}

/// Runs `cmd` to the end; its output, and how long it took. Fails when it
/// exits non-zero.
pub fn timed(cmd: &mut Command) -> anyhow::Result<(Output, Duration)> {
    let start = Instant::now();
    let out = cmd.stdin(Stdio::null()).output()?;
    let took = start.elapsed();
    anyhow::ensure!(
        out.status.success(),
        "{cmd:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok((out, took))
}

/// A `peerwasm worker` process on a free loopback port; killed when dropped.
pub struct Worker {
    child: Child,
    /// Its `host:port`.
    pub addr: String,
}

impl Worker {
    /// Starts a worker with `slots` slots and 4 GiB, its module cache under
    /// `cache`, joining `join` if given.
    pub fn start(slots: usize, cache: &Path, join: Option<&str>) -> anyhow::Result<Worker> {
        Worker::start_with("4GiB", slots, cache, join, &[])
    }

    /// [`start`](Self::start) lending `memory`, with more worker flags.
    pub fn start_with(
        memory: &str,
        slots: usize,
        cache: &Path,
        join: Option<&str>,
        extra: &[&str],
    ) -> anyhow::Result<Worker> {
        let mut cmd = peerwasm();
        cmd.args([
            "worker",
            "--listen",
            "127.0.0.1:0",
            "--memory",
            memory,
            "--reserve",
            "0",
        ])
        .args(extra)
        .args(["--slots", &slots.to_string(), "--gossip-interval", "200ms"])
        .arg("--cache-dir")
        .arg(cache)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
        if let Some(seed) = join {
            cmd.args(["--join", seed]);
        }
        let mut child = cmd.spawn()?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line)?;
        let addr = line
            .trim()
            .strip_prefix("peerwasm worker listening on ")
            .ok_or_else(|| anyhow::anyhow!("the worker did not start: {line:?}"))?
            .to_string();
        Ok(Worker { child, addr })
    }

    /// The worker's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its resident set size now, in bytes.
    pub fn rss(&self) -> anyhow::Result<u64> {
        rss_of(self.pid())
    }

    /// Waits until `n` workers show as alive in this worker's view.
    pub fn wait_for_peers(&self, n: usize) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let out = peerwasm()
                .args(["peers", "--json", "--peers", &self.addr])
                .output()?;
            let text = String::from_utf8_lossy(&out.stdout);
            if text.matches("\"alive\"").count() >= n {
                return Ok(());
            }
            anyhow::ensure!(Instant::now() < deadline, "the pool did not form: {text}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// VmRSS of process `pid`, from /proc, in bytes.
pub fn rss_of(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no VmRSS for {pid}"))?;
    Ok(kib * 1024)
}

/// A pool CA and a certificate for 127.0.0.1 under `dir`, for the TLS rows:
/// the worker's flags, and the CA's certificate for clients (`--tls-ca`).
pub fn loopback_tls(dir: &Path) -> anyhow::Result<(Vec<String>, std::path::PathBuf)> {
    let tls = dir.join("tls");
    let ca = peerwasm::net::certs::init(&tls)?;
    let now = std::time::SystemTime::now();
    let issued = peerwasm::net::certs::issue(
        &tls,
        &["127.0.0.1".into()],
        None,
        now,
        now + peerwasm::net::certs::DEFAULT_VALIDITY,
    )?;
    let path = |p: &Path| p.to_string_lossy().into_owned();
    let flags = [
        "--tls-cert".into(),
        path(&issued.cert),
        "--tls-key".into(),
        path(&issued.key),
        "--tls-ca".into(),
        path(&ca),
    ];
    Ok((flags.to_vec(), ca))
}
