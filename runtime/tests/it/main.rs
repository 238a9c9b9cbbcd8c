//! In-process integration tests of the `peerwasm` crate: jobs run on a
//! `JobRunner` in this process (outcomes, the module cache). One test
//! binary (each links wasmtime), one module per area. The tests across
//! processes and machines — real workers over HTTP, the command line,
//! faults, tenants, clusters — are the workspace's `tests/` crate.

mod cache;
mod entries;
mod outcomes;
mod support;
