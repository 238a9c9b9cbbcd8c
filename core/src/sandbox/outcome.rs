//! Turning how a job's wasm call ended into an [`Outcome`].
//!
//! The order matters and follows what is most specific: an exit the guest
//! asked for, then a limit our own limiter or output capture recorded, then a
//! wasm trap, then anything else the host raised. Limits are read from the
//! records, never guessed from an error's text.

use wasmtime::{Trap, WasmBacktrace};
use wasmtime_wasi::I32Exit;

use super::code::one_line;
use super::limiter::{LimitExceeded, MemoryLimiter};
use super::stdio::OutputCapture;
use crate::proto::Outcome;

/// How far the job got when the error came.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Creating the instance (memories, tables, the start function).
    Instantiate,
    /// Running `_start`.
    Run,
}

/// Classifies the error that ended a job.
pub fn classify(
    err: &wasmtime::Error,
    phase: Phase,
    limiter: &MemoryLimiter,
    outputs: [&OutputCapture; 2],
) -> Outcome {
    if let Some(exit) = err.downcast_ref::<I32Exit>() {
        return Outcome::Exited { code: exit.0 };
    }
    if let Some(requested) = limiter.refused() {
        return Outcome::MemoryLimitExceeded {
            limit: limiter.refused_at(),
            peak: limiter.peak(),
            requested,
        };
    }
    for capture in outputs {
        if capture.starved() {
            return Outcome::OutputMemoryExhausted {
                stream: capture.stream(),
                held: capture.len(),
            };
        }
        if capture.overflowed() {
            return Outcome::OutputLimitExceeded {
                stream: capture.stream(),
                limit: capture.cap(),
            };
        }
    }
    let backtrace = backtrace(err);
    if let Some(limit @ LimitExceeded::Table { .. }) = err.downcast_ref::<LimitExceeded>() {
        return Outcome::Trapped {
            trap: "table limit exceeded".into(),
            message: limit.to_string(),
            backtrace,
        };
    }
    if let Some(trap) = err.downcast_ref::<Trap>() {
        let mut message = trap.to_string();
        if *trap == Trap::MemoryOutOfBounds
            && let Some(function) = recursing(err)
        {
            message.push_str(&format!(
                "; most likely a stack overflow: the stack in the job's linear memory ran out, \
                 and all of the {BACKTRACE_FRAMES} innermost calls are to {function}"
            ));
        }
        return Outcome::Trapped {
            trap: trap_name(trap),
            message,
            backtrace,
        };
    }
    match phase {
        // Not a trap and not a limit: the module asks for something this
        // sandbox cannot give (more memories or tables than allowed...).
        Phase::Instantiate => Outcome::InvalidModule {
            reason: format!("it cannot be instantiated: {}", one_line(err)),
        },
        // The root cause is what the host said (e.g. "exit with invalid
        // exit status outside of [0..126)"); the context wasmtime wraps it
        // in repeats the backtrace, which is kept separately.
        Phase::Run => Outcome::Trapped {
            trap: "host error".into(),
            message: err.root_cause().to_string().replace('\n', " "),
            backtrace,
        },
    }
}

/// A short, stable name for a trap code.
fn trap_name(trap: &Trap) -> String {
    match trap {
        Trap::StackOverflow => "stack overflow",
        Trap::MemoryOutOfBounds => "out of bounds memory access",
        Trap::HeapMisaligned => "misaligned memory access",
        Trap::TableOutOfBounds => "out of bounds table access",
        Trap::IndirectCallToNull => "indirect call to null",
        Trap::BadSignature => "indirect call type mismatch",
        Trap::IntegerOverflow => "integer overflow",
        Trap::IntegerDivisionByZero => "integer divide by zero",
        Trap::BadConversionToInteger => "invalid conversion to integer",
        Trap::UnreachableCodeReached => "unreachable",
        Trap::Interrupt => "interrupt",
        Trap::OutOfFuel => "out of fuel",
        other => return other.to_string(),
    }
    .into()
}

/// Frames of a trap's backtrace that wasmtime captures (engine.rs).
pub const BACKTRACE_FRAMES: usize = 16;

/// The function a trap's whole backtrace is made of, if it is full: a job
/// that recursed until its stack ran out. Which stack runs out first
/// depends on frame sizes: the engine's (a `stack overflow` trap) or, for
/// a Rust or C guest, the stack the guest keeps in its own linear memory,
/// whose pointer then wraps below address 0 (an out-of-bounds access).
/// Code with no fuel has smaller native frames, so the second is common.
fn recursing(err: &wasmtime::Error) -> Option<String> {
    let frames = err.downcast_ref::<WasmBacktrace>()?.frames();
    let first = frames.first()?;
    if frames.len() < BACKTRACE_FRAMES
        || frames.iter().any(|f| f.func_index() != first.func_index())
    {
        return None;
    }
    Some(match first.func_name() {
        Some(n) => format!("{:#}", rustc_demangle::demangle(n)),
        None => format!("<wasm function {}>", first.func_index()),
    })
}

/// Up to eight frames, innermost first: `name` or `<wasm function N>`.
fn backtrace(err: &wasmtime::Error) -> Vec<String> {
    let Some(bt) = err.downcast_ref::<WasmBacktrace>() else {
        return Vec::new();
    };
    bt.frames()
        .iter()
        .take(8)
        .map(|f| {
            let name = match f.func_name() {
                // `{:#}` drops the hash suffix of Rust symbols.
                Some(n) => format!("{:#}", rustc_demangle::demangle(n)),
                None => format!("<wasm function {}>", f.func_index()),
            };
            match f.module_offset() {
                Some(off) => format!("{name} @ {off:#x}"),
                None => name,
            }
        })
        .collect()
}
