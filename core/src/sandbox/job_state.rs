//! What a job's store holds: its WASI context and its bounds. Its own file
//! so that the linker shadows (`files.rs`), components and the cache can
//! name it without importing the sandbox that uses them.

use wasmtime_wasi::p1::WasiP1Ctx;

use super::disk::FileUse;
use super::limiter::MemoryLimiter;

/// What a job's store holds: its WASI (preview 1 for a core module,
/// [`ComponentWasi`](super::component::ComponentWasi) for a component) and
/// its bounds.
pub struct JobState<W = WasiP1Ctx> {
    pub(super) wasi: W,
    pub(super) limiter: MemoryLimiter,
    pub(super) files: FileUse,
}
