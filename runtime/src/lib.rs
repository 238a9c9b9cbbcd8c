//! peerwasm runs other people's jobs, compiled to WebAssembly
//! (wasm32-wasip1), with exactly enforced memory limits and exactly measured
//! peak memory — in-process (the embedded worker) or on a pool of peers.
//!
//! # Layout
//!
//! The modules follow a job's path from the command line to the sandbox,
//! and are layered: each uses only the ones listed after it. The floors a
//! client needs are crate `peerwasm-core` (re-exported here, so
//! `peerwasm::client` is `peerwasm_core::client`): Cargo holds that line —
//! nothing in it can reach the worker — and the `layering` tests hold the
//! rest.
//!
//! * [`cli`] — the `peerwasm` command line (`run`, `map`, `worker`, `peers`,
//!   `tls`, `adapt`, …): thin shells over the client and the server;
//! * [`adapt`] — the controller that sizes a pool to its backlog by
//!   submitting and cancelling one-worker batch jobs (Slurm); a client of
//!   the pool, beside the server;
//! * [`server`] — `peerwasm worker` assembled and served: its configuration
//!   and defaults, `start`, the HTTP router and one file per endpoint group;
//! * `owner` — maps a worker owns for clients that went away (`map
//!   --detach`): stored, run with the client's own `map`, resumed after a
//!   restart; the one room that uses both the worker and the client;
//! * [`worker`] — the worker's core: the host memory ledger, admission,
//!   fair share, tenants, a job's life, the state database;
//!
//! and from `peerwasm-core`:
//!
//! * [`client`] — the submitting side: the embedded worker or a pool as one
//!   [`Target`], best-fit placement, learned memory
//!   estimates, and [`map`](map()) with retries and ordered results;
//! * [`slot`] — a process that is one job's slot (`peerwasm run`, a slot
//!   process's child side): a job computing past its deadline ends with it;
//! * [`runner`] — [`JobRunner`]: N slots running jobs on
//!   this machine, in-process or in slot processes; the embedded worker is
//!   one inside the client's process, and every worker runs its jobs on one;
//! * [`sandbox`] — wasmtime: the engine, module cache, memory limiter,
//!   captured stdio and outcome classification;
//! * [`gossip`] — membership and capacity adverts: a pure state machine,
//!   its thin HTTP transport, and the pool as a worker sees it
//!   ([`PeerView`](gossip::PeerView));
//! * [`proto`] — wire types: [`JobSpec`] in,
//!   [`JobResult`] and [`Outcome`] out;
//! * [`net`] — how processes reach each other: plain HTTP or TLS with the
//!   pool's CA ([`Transport`]), certificates made
//!   (`peerwasm tls`), and connection failures said in words;
//! * [`units`] — sizes, durations and tables as people write and read them.
//!
//! # Example
//!
//! ```no_run
//! use peerwasm::proto::JobSpec;
//! use peerwasm::runner::{JobRunner, RunnerConfig};
//!
//! let runner = JobRunner::new(RunnerConfig::default())?;
//! let hash = runner.add_module(std::fs::read("hello.wasm")?);
//! let mut spec = JobSpec::new(hash);
//! spec.args = vec!["world".into()];
//! let result = runner.run_blocking(spec);
//! println!("{} (peak {} bytes)", result.outcome, result.peak_memory_bytes);
//! # Ok::<(), anyhow::Error>(())
//! ```

pub use peerwasm_core::{client, gossip, net, private_path, proto, runner, sandbox, slot, units};
// The facade: `peerwasm-core`'s root, and a worker started from a program.
pub use peerwasm_core::{
    Job, JobLimits, JobResult, JobRunner, JobSpec, MapConfig, MapItem, MapSummary, Outcome, Pool,
    PoolConfig, RunSpec, RunnerConfig, SandboxConfig, SubmitError, Target, Transport, WorkerApi,
    map,
};
pub use server::{RunningWorker, WorkerConfig, start};

pub mod adapt;
pub mod cli;
mod owner;
pub mod server;
pub mod worker;

#[cfg(test)]
mod layering {
    //! The house is layered: a module uses only the modules below it. Both
    //! crates' sources are read: `peerwasm-core`'s floors (where Cargo
    //! already forbids a use of this crate's) and this one's.

    /// Bottom up: each may use only those before it. The first nine are
    /// `peerwasm-core`'s.
    const LAYERS: [&str; 14] = [
        "units",
        "private_path",
        "net",
        "proto",
        "gossip",
        "sandbox",
        "runner",
        "slot",
        "client",
        "worker",
        "owner",
        "server",
        "adapt",
        "cli",
    ];

    /// Layers that must not use one below them though the order would let
    /// them: the worker's core serves jobs and never submits any (its
    /// module docs promise it imports neither the client nor the owner).
    const NEVER: [(&str, &str); 1] = [("worker", "client")];

    /// Where `layer`'s source is: this crate's `src/`, or `peerwasm-core`'s.
    fn src_of(layer: &str) -> std::path::PathBuf {
        let here = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let own = here.join("src");
        if own.join(layer).exists() || own.join(format!("{layer}.rs")).exists() {
            own
        } else {
            here.join("../core/src")
        }
    }

    /// Both crates' source roots.
    fn roots() -> [std::path::PathBuf; 2] {
        let here = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        [here.join("src"), here.join("../core/src")]
    }

    #[test]
    fn each_module_uses_only_the_layers_below_it() {
        let mut upward = Vec::new();
        for (level, layer) in LAYERS.iter().enumerate() {
            let src = src_of(layer);
            let file = src.join(format!("{layer}.rs"));
            let files: Vec<std::path::PathBuf> = if file.exists() {
                vec![file]
            } else {
                walkdir::WalkDir::new(src.join(layer))
                    .into_iter()
                    .map(|e| e.expect("reading src").into_path())
                    .filter(|p| p.extension().is_some_and(|e| e == "rs"))
                    // A room's own tests (`tests.rs`) may drive it through
                    // the layers above — an owner's through a worker served
                    // in memory (`server::memory`) — its code may not.
                    .filter(|p| !p.ends_with("tests.rs"))
                    .collect()
            };
            assert!(!files.is_empty(), "no source for layer {layer}");
            for path in files {
                let text = std::fs::read_to_string(&path).unwrap();
                // Code only: doc links may point anywhere.
                for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
                    let never = NEVER.iter().filter(|(l, _)| l == layer).map(|(_, n)| n);
                    for name in LAYERS[level + 1..].iter().chain(never) {
                        if line.contains(&format!("crate::{name}::"))
                            || line.contains(&format!("crate::{name}{{"))
                        {
                            upward.push(format!(
                                "{} ({layer}) uses {name}: {}",
                                path.display(),
                                line.trim()
                            ));
                        }
                    }
                }
            }
        }
        assert!(
            upward.is_empty(),
            "imports against the layering:\n{}",
            upward.join("\n")
        );
    }

    /// The first names of what `after_super` (the text after a `super::`)
    /// imports: `NAME` of `super::NAME…`, each `NAME` of `super::{NAME…,
    /// NAME…}`.
    fn imported_after(after_super: &str) -> Vec<String> {
        let word = |s: &str| -> String {
            s.trim_start()
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect()
        };
        match after_super.strip_prefix('{') {
            Some(group) => group
                .split('}')
                .next()
                .unwrap_or_default()
                .split(',')
                .map(word)
                .filter(|w| !w.is_empty())
                .collect(),
            None => vec![word(after_super)]
                .into_iter()
                .filter(|w| !w.is_empty())
                .collect(),
        }
    }

    /// Inside a room (a directory with a `mod.rs`), no two files import
    /// each other: a file's `super::NAME` is the sibling file `NAME`, or
    /// else the room's `mod.rs`; `mod.rs` imports a sibling by naming it
    /// (`NAME::…`). Comments and unit tests do not count.
    #[test]
    fn no_two_files_of_a_room_import_each_other() {
        let mut both_ways = Vec::new();
        let rooms = roots().into_iter().flat_map(|src| {
            walkdir::WalkDir::new(src)
                .into_iter()
                .map(|e| e.expect("reading src").into_path())
        });
        for room in rooms {
            if !room.join("mod.rs").exists() {
                continue;
            }
            let siblings: Vec<String> = std::fs::read_dir(&room)
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter_map(|p| match p.extension() {
                    Some(e) if e == "rs" => p.file_stem().map(|s| s.to_string_lossy().into_owned()),
                    None if p.join("mod.rs").exists() => {
                        p.file_name().map(|s| s.to_string_lossy().into_owned())
                    }
                    _ => None,
                })
                .collect();
            let code = |name: &str| -> String {
                let file = if siblings.contains(&name.to_string()) && room.join(name).is_dir() {
                    room.join(name).join("mod.rs")
                } else {
                    room.join(format!("{name}.rs"))
                };
                let text = std::fs::read_to_string(file).unwrap_or_default();
                let text = text
                    .split("#[cfg(test)]\nmod tests")
                    .next()
                    .unwrap_or_default()
                    .to_string();
                text.lines()
                    .filter(|l| !l.trim_start().starts_with("//"))
                    .collect::<Vec<_>>()
                    .join("\n")
            };
            let uses = |from: &str, to: &str| -> bool {
                let text = code(from);
                match (from, to) {
                    ("mod", _) => {
                        text.contains(&format!(" {to}::")) || text.contains(&format!("({to}::"))
                    }
                    (_, "mod") => text.match_indices("super::").any(|(i, _)| {
                        imported_after(&text[i + 7..])
                            .iter()
                            .any(|name| !siblings.contains(name) && name != "super")
                    }),
                    _ => {
                        text.contains(&format!("super::{to}::"))
                            || text.contains(&format!("super::{to}}}"))
                            || text.match_indices("super::{").any(|(i, _)| {
                                imported_after(&text[i + 7..]).contains(&to.to_string())
                            })
                    }
                }
            };
            for (i, a) in siblings.iter().enumerate() {
                for b in &siblings[i + 1..] {
                    if uses(a, b) && uses(b, a) {
                        both_ways.push(format!("{}: {a} <-> {b}", room.display()));
                    }
                }
            }
        }
        assert!(
            both_ways.is_empty(),
            "files importing each other:\n{}",
            both_ways.join("\n")
        );
    }
}
