//! [`Code`]: what a module's bytes compile to — a core module or a
//! component — compiled, serialized and loaded the same way by the cache
//! ([`super::cache`]) and the artifact store ([`super::artifacts`]).

use wasmtime::component::Component;
use wasmtime::{Engine, Module};

/// What a module's bytes compile to. Both kinds are cached, serialized to
/// disk and run under the same limits; they differ in how WASI is linked.
pub enum Code {
    /// A core wasm module: a WASI preview 1 command (`wasm32-wasip1`).
    Module(Module),
    /// A component: a `wasi:cli/command` (`wasm32-wasip2`).
    Component(Component),
}

impl Code {
    /// Compiles `bytes`, as a component (on `engines.1`) if they are one.
    pub(crate) fn compile(engines: &(Engine, Engine), bytes: &[u8]) -> wasmtime::Result<Code> {
        if wasmparser::Parser::is_component(bytes) {
            Component::new(&engines.1, bytes).map(Code::Component)
        } else {
            Module::new(&engines.0, bytes).map(Code::Module)
        }
    }

    /// The artifact to keep on disk.
    pub(crate) fn serialize(&self) -> wasmtime::Result<Vec<u8>> {
        match self {
            Code::Module(m) => m.serialize(),
            Code::Component(c) => c.serialize(),
        }
    }

    /// Maps an artifact written by [`Code::serialize`] from `file`: a
    /// component's if `component`, else a module's. The pages are the
    /// file's until a job touches them (nothing is read or copied up front).
    ///
    /// # Safety
    ///
    /// As `Module::deserialize_open_file`: `file` must hold what `serialize`
    /// wrote with a compatible engine (the artifact store authenticates it)
    /// and must not change while the code is in use.
    pub(crate) unsafe fn map(
        engines: &(Engine, Engine),
        file: std::fs::File,
        component: bool,
    ) -> wasmtime::Result<Code> {
        // SAFETY: passed on to the caller (see above).
        unsafe {
            if !component {
                return Module::deserialize_open_file(&engines.0, file).map(Code::Module);
            }
            // No `deserialize_open_file` for components: the path of the
            // open descriptor names the same file.
            use std::os::fd::AsRawFd;
            let fd = format!("/proc/self/fd/{}", file.as_raw_fd());
            Component::deserialize_file(&engines.1, &fd).map(Code::Component)
        }
    }

    /// "module" or "component", for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Code::Module(_) => "module",
            Code::Component(_) => "component",
        }
    }
}

/// The error and its causes on one line.
pub(crate) fn one_line(e: &wasmtime::Error) -> String {
    let mut s = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !s.contains(&c) {
            s.push_str(": ");
            s.push_str(&c);
        }
    }
    s.replace('\n', " ")
}
