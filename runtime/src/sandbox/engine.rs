//! The one wasmtime `Engine` a process shares among all jobs, configured for
//! our limits: the instance allocator and the time-limit mechanism.

use std::time::Duration;

use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::SandboxConfig;

/// How a job that computes without end is made to give the thread back, so
/// its wall-time limit can end it. A job blocked in a host call (sleeping)
/// is ended by the async timeout in either case.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TimeLimitMechanism {
    /// Epoch interruption: a ticker thread bumps the engine's epoch every
    /// [`EPOCH_TICK`]; compiled code checks it at loop heads and calls.
    Epoch,
    /// Fuel metering: compiled code counts instructions and yields every
    /// [`FUEL_YIELD_INTERVAL`] units. The default: it measured as cheap as
    /// or cheaper than epochs on our guests (docs/time-limits.md), and the
    /// count is deterministic.
    #[default]
    Fuel,
    /// Neither: a computing job cannot be interrupted. Only for measuring
    /// what the mechanism costs; `timeout_ms` is not enforced on compute.
    Off,
}

/// How often the epoch ticker bumps the epoch: the granularity of time
/// limits under [`TimeLimitMechanism::Epoch`].
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Fuel units between yields under [`TimeLimitMechanism::Fuel`]: about
/// 5–10 ms of compute.
pub const FUEL_YIELD_INTERVAL: u64 = 10_000_000;

/// Bytes of each pooled linear memory kept resident between jobs (reset
/// with memset rather than given back with madvise). None: a Rust guest's
/// first MiB is its stack, of which a short job touches a few pages, so
/// zeroing the whole MiB (~25 µs) costs more than giving back and faulting
/// in the pages it used. Measured with `peerwasm-benches trivial dispatch`:
/// 47 µs per trivial job with 0, 51 µs with 64 KiB, 68 µs with 1 MiB.
pub const MEMORY_KEEP_RESIDENT: usize = 0;

/// Bytes of each pooled table kept resident between jobs: tables are small
/// and wholly used, so memset wins.
pub const TABLE_KEEP_RESIDENT: usize = 1 << 20;

/// Core instances one component may hold under the pooling allocator.
pub const COMPONENT_CORE_INSTANCES: u32 = 16;

/// Linear memories one component may hold under the pooling allocator
/// (each pooled memory is an address-space reservation, not memory).
pub const COMPONENT_MEMORIES: u32 = 4;

/// Tables one component may hold under the pooling allocator.
pub const COMPONENT_TABLES: u32 = 8;

/// Builds the engine for `config`.
pub fn build(config: &SandboxConfig) -> anyhow::Result<Engine> {
    let mut c = Config::new();
    c.wasm_backtrace_max_frames(std::num::NonZeroUsize::new(16));
    match config.time_limit {
        TimeLimitMechanism::Epoch => {
            c.epoch_interruption(true);
        }
        TimeLimitMechanism::Fuel => {
            c.consume_fuel(true);
        }
        TimeLimitMechanism::Off => {}
    }
    if config.pooling {
        // Size the pool to the worker's concurrency: the default of 1000
        // slots reserves terabytes of address space (wasmCloud and Lunatic
        // hit this on small hosts). A few spare slots cover stores that are
        // still being torn down while the next job starts.
        //
        // A component is several core instances (a Rust wasip2 command: its
        // program, the preview 1 adapter and two small shims), so each slot
        // gets room for one component's worth of them.
        let slots = u32::try_from(config.slots.max(1) + 2).unwrap_or(u32::MAX);
        let per_slot = |n: u32| slots.saturating_mul(n);
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(slots);
        pool.max_core_instances_per_component(COMPONENT_CORE_INSTANCES);
        pool.max_memories_per_component(COMPONENT_MEMORIES);
        pool.max_tables_per_component(COMPONENT_TABLES);
        pool.total_core_instances(per_slot(COMPONENT_CORE_INSTANCES));
        pool.total_memories(per_slot(COMPONENT_MEMORIES));
        pool.total_tables(per_slot(COMPONENT_TABLES));
        pool.total_stacks(slots);
        pool.linear_memory_keep_resident(MEMORY_KEEP_RESIDENT);
        pool.table_keep_resident(TABLE_KEEP_RESIDENT);
        pool.max_memory_size(usize::try_from(config.max_job_memory).unwrap_or(usize::MAX));
        c.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    }
    Engine::new(&c).map_err(|e| anyhow::anyhow!("cannot create the wasm engine: {e}"))
}

/// Bumps an engine's epoch every [`EPOCH_TICK`] until the engine is dropped.
/// Holds only a weak handle, so it never keeps the engine alive.
pub fn start_epoch_ticker(engine: &Engine) {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("peerwasm-epoch".into())
        .spawn(move || {
            while let Some(engine) = weak.upgrade() {
                engine.increment_epoch();
                drop(engine);
                std::thread::sleep(EPOCH_TICK);
            }
        })
        .expect("spawning the epoch ticker thread");
}
