//! `python-map`: a Python function mapped over its inputs by serial
//! Python, `multiprocessing.Pool`, joblib, Dask, Ray and peerwasm (embedded
//! and a two-worker pool), each a fresh Python process running a script,
//! whole process timed, interleaved; the time to the first result; and
//! peerwasm's map against the ideal from the sandbox's own speed. The
//! harness is `benches/python_map.py` (it times processes, so it is
//! Python); this sets up its venv — `target/benchvenv-pymap`: the anchors,
//! numpy and scikit-learn from PyPI, and this tree's Python client built
//! by pip with cargo's dev profile (as `clients/python/run-tests` builds
//! it) — and runs it. Skipped by `--quick`: the first runs compile CPython
//! for two engines (minutes).

use std::process::Command;

use crate::Sizes;
use crate::summary::Summary;

/// Interleaved rounds per runner and workload.
const ROUNDS: usize = 3;

pub fn python_map(sizes: &Sizes, _summary: &mut Summary) -> anyhow::Result<()> {
    if sizes.quick {
        println!("\n## python-map: skipped with --quick (it compiles CPython, minutes)");
        return Ok(());
    }
    println!("\n## python-map: one Python function over its inputs, as a user runs it");
    let root = peerwasm_testkit::workspace_root();
    let venv = root.join("target").join("benchvenv-pymap");
    if !venv.join("bin").join("python").exists() {
        let ok = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()?
            .success();
        anyhow::ensure!(ok, "python3 -m venv {} failed", venv.display());
    }
    let pip = Command::new(venv.join("bin").join("pip"))
        .args([
            "install",
            "--quiet",
            "ray",
            "dask[distributed]",
            "joblib",
            "numpy",
            "pandas",
            "scikit-learn",
        ])
        .arg(root.join("clients").join("python"))
        .env("MATURIN_PEP517_ARGS", "--profile dev")
        .output()?;
    anyhow::ensure!(
        pip.status.success(),
        "pip install failed: {}",
        String::from_utf8_lossy(&pip.stderr).trim()
    );
    let cache = root.join("target").join("tools").join("python-cache");
    std::fs::create_dir_all(&cache)?;
    let status = Command::new(venv.join("bin").join("python"))
        .arg(root.join("benches").join("python_map.py"))
        .arg(std::env::current_exe()?)
        .arg(ROUNDS.to_string())
        .arg("peerwasm")
        .env("PEERWASM_PYTHON", peerwasm_testkit::python_runtime())
        .env("PEERWASM_CACHE_DIR", &cache)
        .status()?;
    anyhow::ensure!(status.success(), "the python-map harness failed");
    Ok(())
}
