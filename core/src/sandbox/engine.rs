//! The one wasmtime `Engine` a process shares among all jobs, configured for
//! our limits: the instance allocator and the time-limit mechanism.

use std::time::Duration;

use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::config::{SandboxConfig, TimeLimitMechanism};

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

/// The most native stack a job's wasm may use: 8 MiB, as a native
/// program's main thread gets on Linux. (wasmtime's default, 512 KiB,
/// traps CPython's `repr` of a list nested 500 deep, where 8 MiB raises a
/// clean `RecursionError`.) Touched only as deep as the job recurses.
pub const MAX_WASM_STACK: usize = 8 << 20;

/// Each job's fiber stack: its wasm stack and 2 MiB for the host calls
/// made from it (wasmtime needs the difference, and its default is 2 MiB).
pub const ASYNC_STACK: usize = MAX_WASM_STACK + (2 << 20);

/// Host memory a running job may take outside its linear memory: its
/// fiber stack (`ASYNC_STACK`: its wasm stack and the host calls made
/// from it) and its instance's own state (`MAX_CORE_INSTANCE_SIZE`).
/// Both are touched only as far as the job goes (wasmtime does not say how
/// far that was), but a job may go all the way — recurse 8 MiB deep — so a
/// worker reserves this beside each running job's memory limit, and a
/// worker of many slots never promises others what its jobs' stacks may
/// take.
pub const JOB_NATIVE_BYTES: u64 = (ASYNC_STACK + MAX_CORE_INSTANCE_SIZE) as u64;

/// Elements a pooled table may hold: CPython's function table has 47,157.
pub const TABLE_ELEMENTS: usize = 1 << 16;

/// Bytes of a pooled instance's own state (its VM context): CPython's is
/// 1.5 MiB (the default of 1 MiB refuses it).
pub const MAX_CORE_INSTANCE_SIZE: usize = 2 << 20;

/// Builds the engine for `config`: the one core modules run on.
pub fn build(config: &SandboxConfig) -> anyhow::Result<Engine> {
    let mut c = Config::new();
    c.wasm_backtrace_max_frames(std::num::NonZeroUsize::new(
        super::outcome::BACKTRACE_FRAMES,
    ));
    c.wasm_exceptions(true);
    c.max_wasm_stack(MAX_WASM_STACK);
    c.async_stack_size(ASYNC_STACK);
    // No `.eh_frame` for the system's unwinder. Wasmtime walks wasm frames
    // itself (backtraces, traps, wasm exceptions) and catches a host
    // function's panic before it could unwind through them, so nothing of
    // ours reads it; registering it with libgcc walks every function's
    // entry each time a module is loaded and again when it is dropped:
    // CPython's 47,000 functions cost ~4% of a cached `run --python`.
    c.native_unwind_info(false);
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
        let slots = u32::try_from(config.slots.max(1) + 2).unwrap_or(u32::MAX);
        let mut pool = PoolingAllocationConfig::default();
        pool.total_core_instances(slots);
        // A job that uses exceptions (or GC types) has a GC heap beside its
        // linear memory, and the pool keeps that heap in a memory slot.
        pool.total_memories(slots.saturating_mul(2));
        pool.total_gc_heaps(slots);
        pool.total_tables(slots);
        pool.total_stacks(slots);
        pool.table_elements(TABLE_ELEMENTS);
        pool.max_core_instance_size(MAX_CORE_INSTANCE_SIZE);
        // Components run on their own engine ([`build_for_components`]).
        pool.total_component_instances(0);
        pool.linear_memory_keep_resident(MEMORY_KEEP_RESIDENT);
        pool.table_keep_resident(TABLE_KEEP_RESIDENT);
        pool.max_memory_size(usize::try_from(config.max_job_memory).unwrap_or(usize::MAX));
        c.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    }
    Engine::new(&c).map_err(|e| anyhow::anyhow!("cannot create the wasm engine: {e}"))
}

/// Builds the engine components run on: `config`'s, with on-demand
/// allocation. A component is several core instances (a Rust wasip2
/// command: its program, the preview 1 adapter, two small shims), each with
/// its own memories and tables; sizing the shared pool for that made every
/// core module's job ~12% slower (more pooled slots: 0.50 → 0.58 s for
/// 10,000 trivial jobs), while on-demand costs a component a few mmaps.
pub fn build_for_components(config: &SandboxConfig) -> anyhow::Result<Engine> {
    build(&SandboxConfig {
        pooling: false,
        ..config.clone()
    })
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

/// What the disk cache files code compiled for `config`'s engine under
/// (wasmtime's compatibility hash): equal keys share one artifact.
#[cfg(test)]
pub(crate) fn code_key(config: &SandboxConfig) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    build(config)
        .expect("engine")
        .precompile_compatibility_hash()
        .hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(time_limit: TimeLimitMechanism, pooling: bool, slots: usize) -> SandboxConfig {
        SandboxConfig {
            time_limit,
            pooling,
            slots,
            ..SandboxConfig::default()
        }
    }

    #[test]
    fn the_instance_pool_does_not_change_what_code_is_code_key() {
        use TimeLimitMechanism::*;
        for mechanism in [Off, Epoch, Fuel] {
            assert_eq!(
                code_key(&with(mechanism, false, 1)),
                code_key(&with(mechanism, true, 8)),
                "{mechanism:?}"
            );
        }
    }

    #[test]
    fn each_time_limit_mechanism_compiles_code_of_its_own() {
        use TimeLimitMechanism::*;
        let [off, epoch, fuel] = [Off, Epoch, Fuel].map(|m| code_key(&with(m, true, 2)));
        assert!(off != epoch && epoch != fuel && off != fuel);
    }
}
