//! The `peerwasm` command from the Python package: the same command line
//! as the binary (`peerwasm::cli`), linked into this extension, so that
//! `pip install` gives a machine the command that workers, `run --python`
//! and `adapt` need, with one copy of wasmtime in the wheel rather than two.

use std::ffi::OsString;
use std::process::ExitCode;

use pyo3::prelude::*;

/// Runs peerwasm's command line with `args` (the first is the command's
/// name) and returns its exit code. `program` is how this command is
/// started again (a slot process, a compile apart, a worker `adapt`
/// submits): `[sys.executable, "-m", "peerwasm"]`. Runs with the GIL
/// released; the caller leaves signals to the command (SIGINT at its
/// default, as for the binary).
#[pyfunction]
pub fn command(py: Python<'_>, program: Vec<OsString>, args: Vec<OsString>) -> u8 {
    let code = py.detach(|| peerwasm_cli::cli::main_as(Ok(program), args));
    exit_status(code)
}

/// The number an `ExitCode` stands for (it keeps it to itself).
fn exit_status(code: ExitCode) -> u8 {
    (0..=u8::MAX)
        .find(|&n| ExitCode::from(n) == code)
        .unwrap_or(1)
}
