//! In-process integration tests of `peerwasm-core`'s runner and sandbox:
//! jobs run on a `JobRunner` in this process (outcomes, entry points, the
//! module cache). One test binary (each links wasmtime), one module per
//! area. The worker's own tests are crate `peerwasm`'s (in memory: its
//! `server::contract`); the tests across processes and machines — real
//! workers over HTTP, the command line, faults, tenants, clusters — are
//! the workspace's `tests/` crate.

mod cache;
mod entries;
mod outcomes;
mod support;
mod warm;
