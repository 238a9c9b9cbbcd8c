//! WASI preview 2 components: a `wasi:cli/command` (what Rust's
//! `wasm32-wasip2` target builds) runs as a job beside core modules.
//!
//! Everything that bounds a job lives at the store and so holds for a
//! component as it is: the memory limiter sums *all* of a component's
//! memories (its inner core modules each may have one), fuel or epochs make
//! it yield, the async timeout and cancel end it, and its stdio goes through
//! the same capped [`OutputCapture`](super::OutputCapture). What differs is
//! WASI, which is linked as preview 2 interfaces here rather than preview 1
//! functions:
//!
//! * **Granted**: `wasi:cli` (args, env, exit, stdio, terminals),
//!   `wasi:clocks`, `wasi:random`, `wasi:io` and `wasi:filesystem`.
//! * **Linked, denying everything**: `wasi:sockets`. A job has no network
//!   (as under preview 1), but toolchains import the interface whether a
//!   program uses it or not (componentize-py's CPython does): such a
//!   component runs, and a socket it tries to make, or a name it tries to
//!   look up, is refused with `access-denied` before any host socket exists.
//! * **Refused at load**, naming the import: anything else we do not
//!   implement (`wasi:http`, a custom interface).
//! * **Files**: a component gets only *read-only* directories and no
//!   scratch `/tmp`. The descriptor and disk bounds of [`super::files`]
//!   shadow preview 1 entry points; preview 2's filesystem is a set of
//!   resource methods that this first version does not shadow, so nothing
//!   a component could write to is given to it. Open descriptors are
//!   bounded by the handle table: the job's `--max-open-files` plus
//!   [`HANDLE_SLACK`] for its streams and pollables, so a component holds
//!   no more host descriptors than a module (and the worker's start-up
//!   check of its descriptor limit counts the slack).
//! * **Exit codes**: `wasi:cli/exit` 0.2 carries only success or failure,
//!   so a component that exits with any non-zero code ends with exit 1
//!   (unless it uses `exit-with-code`, which is linked).

use wasmtime::Engine;
use wasmtime::component::{Component, Linker, ResourceTable};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::code::one_line;
use super::job_state::JobState;

/// A component's prepared instance: imports resolved, `wasi:cli/run` found.
pub(crate) type CommandPre = wasmtime_wasi::p2::bindings::CommandPre<ComponentState>;

/// What a component job's store holds.
pub(crate) type ComponentState = JobState<ComponentWasi>;

/// Handles (streams, pollables, preopens...) a component may hold beyond
/// its open descriptors' bound. wasmtime-wasi's own default for the whole
/// table is a million, each a host allocation (and an open descriptor a
/// host file descriptor): a component that subscribes or opens in a loop
/// would hold the host's memory or descriptors. A Rust command holds a
/// handful.
pub const HANDLE_SLACK: u32 = 32;

/// The most core instances a component may hold (a Rust command has four).
pub const MAX_CORE_INSTANCES: usize = 16;

/// A component's WASI: the context and the table of its handles.
pub struct ComponentWasi {
    ctx: WasiCtx,
    table: ResourceTable,
}

impl ComponentWasi {
    /// WASI for one job, its handles bounded by `max_open_files` plus
    /// [`HANDLE_SLACK`].
    pub(crate) fn new(ctx: WasiCtx, max_open_files: u32) -> ComponentWasi {
        let mut table = ResourceTable::new();
        table.set_max_capacity(max_open_files.saturating_add(HANDLE_SLACK) as usize);
        ComponentWasi { ctx, table }
    }
}

impl WasiView for ComponentState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi.ctx,
            table: &mut self.wasi.table,
        }
    }
}

/// The linker every component job is resolved against: wasmtime-wasi's
/// preview 2 interfaces, async (so sleeping jobs can be timed out).
pub(crate) fn linker(engine: &Engine) -> anyhow::Result<Linker<ComponentState>> {
    let mut linker = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_async(&mut linker)
        .map_err(|e| anyhow::anyhow!("cannot link WASI preview 2: {e}"))?;
    Ok(linker)
}

/// Resolves `component`'s imports and finds its `wasi:cli/run` export, or
/// says what is wrong, naming the import or export.
pub(crate) fn prepare(
    engine: &Engine,
    linker: &Linker<ComponentState>,
    component: &Component,
) -> Result<CommandPre, String> {
    let ty = component.component_type();
    for (name, _) in ty.imports(engine) {
        if !name.starts_with("wasi:") {
            return Err(format!(
                "it imports `{name}`, which peerwasm does not provide (only WASI)"
            ));
        }
    }
    // A WASI interface we do not implement (`wasi:http`...): the linker's
    // message names it.
    let pre = linker
        .instantiate_pre(component)
        .map_err(|e| format!("its imports cannot be satisfied: {}", one_line(&e)))?;
    CommandPre::new(pre).map_err(|e| {
        format!(
            "it is not a `wasi:cli/command` component (a Rust `fn main` built with --target wasm32-wasip2): {}",
            one_line(&e)
        )
    })
}
