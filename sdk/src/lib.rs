//! Write a peerwasm job as a plain function; the SDK supplies `main`.
//!
//! A job reads one input and writes one output. With this crate the input is
//! JSON on stdin, deserialized into your input type; your function's `Ok`
//! value is written to stdout as JSON; an `Err` is printed on stderr and the
//! job exits with code 1. The same crate builds for `wasm32-wasip1` (a core
//! module), `wasm32-wasip2` (a component; peerwasm runs either) and
//! natively, so a job can be tested like any Rust code. As a component, any
//! non-zero exit is reported as 1: WASI preview 2's exit carries only
//! success or failure.
//!
//! # Example
//!
//! ```
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Deserialize)]
//! struct Input { a: i64, b: i64 }
//!
//! #[derive(Serialize)]
//! struct Output { sum: i64 }
//!
//! fn add(input: Input) -> Result<Output, String> {
//!     input.a.checked_add(input.b).map(|sum| Output { sum }).ok_or_else(|| "overflow".into())
//! }
//!
//! // In the job's `src/main.rs` this line is all of `main`:
//! // peerwasm_sdk::main!(add);
//!
//! // The same function, called as the SDK's main would call it:
//! let out = peerwasm_sdk::call(add, br#"{"a": 2, "b": 3}"#).unwrap();
//! assert_eq!(out, br#"{"sum":5}"#);
//! assert!(peerwasm_sdk::call(add, br#"{"a": 9223372036854775807, "b": 1}"#).is_err());
//! ```
//!
//! # Building
//!
//! `cargo build --release --target wasm32-wasip1` (or `wasm32-wasip2`) with
//! the default target features is what we recommend. We measured guests
//! built with `RUSTFLAGS="-C target-feature=+simd128"` against the defaults
//! (`peerwasm run`, 7 interleaved rounds, 2026-11-23): the sieve (`primes`
//! below 10^8) 1.04×, summing 64 MB of bytes 1.07×, touching 256 MiB
//! 1.00× the default build's time: no gain on these (the sieve's strided
//! stores and a byte sum bound by reading do not vectorize to anything
//! faster). Code written with explicit
//! `core::arch::wasm32` SIMD intrinsics needs the feature, and peerwasm
//! runs it (wasmtime enables SIMD by default).

use std::fmt::Display;
use std::io::{Read, Write};

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Exit code when the job's function returns `Err`.
pub const EXIT_JOB_ERROR: i32 = 1;
/// Exit code when the input cannot be read or parsed.
pub const EXIT_BAD_INPUT: i32 = 2;

/// Why [`call`] produced no output.
#[derive(Debug)]
pub enum JobError {
    /// The input was not valid JSON for the function's input type.
    BadInput(String),
    /// The function returned `Err` with this message.
    Failed(String),
}

impl Display for JobError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JobError::BadInput(e) => write!(f, "input is not valid for this job: {e}"),
            JobError::Failed(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for JobError {}

/// Runs `job` on `input` (JSON bytes) and returns its output as JSON bytes.
/// This is what the generated `main` does between stdin and stdout.
pub fn call<I, O, E, F>(job: F, input: &[u8]) -> Result<Vec<u8>, JobError>
where
    I: DeserializeOwned,
    O: Serialize,
    E: Display,
    F: FnOnce(I) -> Result<O, E>,
{
    let input: I = serde_json::from_slice(input).map_err(|e| JobError::BadInput(e.to_string()))?;
    let output = job(input).map_err(|e| JobError::Failed(e.to_string()))?;
    serde_json::to_vec(&output)
        .map_err(|e| JobError::Failed(format!("cannot encode the output: {e}")))
}

/// The body of a job's `main`: stdin → `job` → stdout, and the exit code.
/// Usually reached through [`main!`].
pub fn run<I, O, E, F>(job: F) -> !
where
    I: DeserializeOwned,
    O: Serialize,
    E: Display,
    F: FnOnce(I) -> Result<O, E>,
{
    let mut input = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut input) {
        eprintln!("error: cannot read stdin: {e}");
        std::process::exit(EXIT_BAD_INPUT);
    }
    match call(job, &input) {
        Ok(output) => {
            let mut out = std::io::stdout().lock();
            let written = out
                .write_all(&output)
                .and_then(|_| out.write_all(b"\n"))
                .and_then(|_| out.flush());
            if let Err(e) = written {
                eprintln!("error: cannot write stdout: {e}");
                std::process::exit(EXIT_JOB_ERROR);
            }
            std::process::exit(0);
        }
        Err(e @ JobError::BadInput(_)) => {
            eprintln!("error: {e}");
            std::process::exit(EXIT_BAD_INPUT);
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(EXIT_JOB_ERROR);
        }
    }
}

/// Defines `fn main` for a job function `fn(Input) -> Result<Output, E>`.
///
/// ```ignore
/// peerwasm_sdk::main!(count_primes);
/// ```
#[macro_export]
macro_rules! main {
    ($job:path) => {
        fn main() {
            $crate::run($job)
        }
    };
}
