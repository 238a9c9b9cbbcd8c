//! The embedded worker: the runner in this process that jobs run on when
//! no peers are given, with slot processes of its own for CPython (as a
//! pool's worker has), the cache it shares with the `peerwasm` command,
//! and CPython compiled once before its first job.

use std::path::PathBuf;
use std::sync::Arc;

use peerwasm::client::{Job, Target};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use crate::block_on;
use crate::per_process::PerProcess;

pub fn embedded() -> PyResult<Target> {
    // Per process: a forked child's slot processes would be its parent's.
    static EMBEDDED: PerProcess<Target> = PerProcess::new();
    EMBEDDED.get_or_try_init(start).cloned()
}

/// The embedded worker started: its runner, with slot processes of its own.
fn start() -> PyResult<Target> {
    let mut sandbox = peerwasm::sandbox::SandboxConfig::default();
    sandbox.cache_dir = dirs_cache().map(|d| d.join("modules"));
    // This user's own machine: the next process starts warm (its slot
    // processes inherit the setting).
    sandbox.keep_snapshots_on_disk = true;
    // Jobs in this process give their thread back with epochs, not fuel:
    // a job here must still end at its time limit and on Ctrl-C (this
    // process is the caller's, it cannot be the job's slot as in `peerwasm
    // run`), and counting fuel in every block of CPython's interpreter
    // loop cost far more than a check at loop heads.
    sandbox.time_limit = peerwasm::sandbox::TimeLimitMechanism::Epoch;
    let runner = peerwasm::runner::JobRunner::new(peerwasm::runner::RunnerConfig {
        sandbox,
        slot_processes: slot_processes(),
    })
    .map_err(|e| PyRuntimeError::new_err(format!("cannot start the embedded worker: {e:#}")))?;
    Ok(Target::Embedded(Arc::new(runner)))
}

/// Slot processes for the embedded worker, as a pool's worker has them:
/// this environment's Python running the package's command (`python -m
/// peerwasm slot`). Large modules — CPython for WASI — and jobs learned
/// to compute long run there with no time-limit instrumentation at all
/// (epochs cost a pure-Python loop 37% and numpy's matrix product 2.2×,
/// measured here), and are still stopped at their limit and on Ctrl-C:
/// the child ends itself, or is killed. Their code is compiled for the
/// engine `peerwasm run` and a worker's slot processes use, so CPython is
/// compiled once per machine whichever of them runs it first. None when
/// this Python has no executable to start (an embedding application).
fn slot_processes() -> Option<peerwasm::runner::slotproc::SlotProcessConfig> {
    let exe = Python::attach(|py| {
        py.import("sys")
            .and_then(|sys| sys.getattr("executable"))
            .and_then(|exe| exe.extract::<Option<PathBuf>>())
            .ok()
            .flatten()
    })
    .filter(|exe| !exe.as_os_str().is_empty())?;
    Some(peerwasm::runner::slotproc::SlotProcessConfig {
        program: peerwasm::runner::slotproc::SlotProgram {
            exe,
            args: vec!["-m".into(), "peerwasm".into(), "slot".into()],
        },
        policy: peerwasm::runner::slotproc::SlotPolicy::Auto,
    })
}

/// `$PEERWASM_CACHE_DIR`, else `$XDG_CACHE_HOME/peerwasm` or `~/.cache/peerwasm`.
pub fn dirs_cache() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("PEERWASM_CACHE_DIR") {
        return Some(d.into());
    }
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .map(|d| d.join("peerwasm"))
}

/// Compiles CPython for WASI before its first job on the embedded worker
/// (a minute or two, once per machine: the result is kept on disk),
/// saying so on stderr so that the wait is not silent. Here, once: left to
/// the slot processes, each of a map's would compile it at the same time
/// (~2.5 GB each). Ctrl-C ends the wait; the compile finishes on its own
/// and is kept.
pub fn compile_first(py: Python<'_>, target: &Target, job: &Job) -> PyResult<()> {
    let Target::Embedded(runner) = target else {
        return Ok(());
    };
    if runner.is_compiled(&job.hash()) {
        return Ok(());
    }
    let kept = dirs_cache().map_or(String::from("in memory"), |d| {
        format!("in {}", d.join("modules").display())
    });
    eprintln!(
        "peerwasm: compiling CPython for WASI for this machine, once \
         (about 1–2 minutes; then kept {kept})"
    );
    let (runner, bytes) = (runner.clone(), job.bytes().clone());
    let compiled = block_on(py, async move {
        tokio::task::spawn_blocking(move || runner.precompile(bytes)).await
    })?;
    match compiled {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(why)) => Err(PyRuntimeError::new_err(format!(
            "cannot compile CPython for WASI: {why}"
        ))),
        Err(e) => Err(PyRuntimeError::new_err(format!(
            "the compile of CPython for WASI failed: {e}"
        ))),
    }
}
