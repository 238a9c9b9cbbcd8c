//! Cross-process integration tests: real `peerwasm worker` processes (and
//! in-process workers over real HTTP), the `peerwasm` command line,
//! pools, batches, maps over a pool, tenants, files and streams, the life
//! of a job, durable submissions, hostile guests and requests, faults,
//! soak, clusters, what a worker shows, the budgets of what requests
//! make it hold, TLS on every hop, and what comes out of a sandbox or off
//! the network, not believed; a pool that follows the work. One test binary (each links
//! wasmtime), one module per area.

mod batch;
mod budgets;
mod cli;
mod cluster;
mod compile;
mod elastic;
mod faults;
mod files;
mod hardening;
mod hostile;
mod languages;
mod lifecycle;
mod map;
mod observe;
mod pool;
mod python;
mod reserve;
mod slots;
mod slurm;
mod soak;
mod streams;
mod submissions;
mod support;
mod tenants;
mod tls;
mod untrusted;
mod wire;
