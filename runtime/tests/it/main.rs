//! Integration tests of the `peerwasm` crate: one test binary (each links
//! wasmtime), with one module per area.

mod batch;
mod cache;
mod cli;
mod cluster;
mod map;
mod observe;
mod faults;
mod files;
mod hardening;
mod hostile;
mod languages;
mod lifecycle;
mod outcomes;
mod pool;
mod slots;
mod soak;
mod streams;
mod submissions;
mod support;
mod tenants;
mod wire;
