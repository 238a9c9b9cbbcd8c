//! The house's guard rails, checked on both crates' sources (this one's and
//! `peerwasm-core`'s):
//! * it is layered: a module uses only the modules below it, and no two
//!   files of a room import each other;
//! * what the docs name exists: a module path in backticks
//!   (`worker::admission`), a source file (`owner/run.rs`), a route
//!   (`/v1/jobs/{id}`) — `cargo doc` checks intra-doc links, this the rest;
//! * no source file grows past 600 lines without a reason at its top;
//! * the job's path and the owner take the handle they need
//!   (`worker::job_path`), never the whole worker (`worker::state`).

/// Bottom up: each may use only those before it. The first nine are
/// `peerwasm-core`'s.
const LAYERS: [&str; 15] = [
    "units",
    "private_path",
    "child",
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
                        || text
                            .match_indices("super::{")
                            .any(|(i, _)| imported_after(&text[i + 7..]).contains(&to.to_string()))
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

/// Every file of the repository whose name ends in `.{ext}` (not under
/// `target/` or a hidden directory), with its text.
fn files(ext: &str) -> Vec<(std::path::PathBuf, String)> {
    walkdir::WalkDir::new(repo())
        .into_iter()
        .filter_entry(|e| {
            let name = e.file_name().to_string_lossy();
            e.depth() == 0 || !(name == "target" || name.starts_with('.'))
        })
        .map(|e| e.expect("reading the repository").into_path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p, text)
        })
        .collect()
}

/// The repository's root (this crate is `runtime/`).
fn repo() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The module file and the directory of `seg` inside `dir`, if it is a
/// module there.
fn module_in(dir: &std::path::Path, seg: &str) -> Option<(std::path::PathBuf, std::path::PathBuf)> {
    let file = dir.join(format!("{seg}.rs"));
    let nested = dir.join(seg).join("mod.rs");
    [file, nested]
        .into_iter()
        .find(|f| f.exists())
        .map(|f| (f, dir.join(seg)))
}

/// Whether `text` defines or re-exports `name`.
fn defines(text: &str, name: &str) -> bool {
    let word = |t: &str, at: usize| {
        !t[at + name.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
    };
    ["fn ", "struct ", "enum ", "const ", "type ", "trait ", "mod ", "static ", "macro_rules! "]
        .iter()
        .any(|kw| {
            let pat = format!("{kw}{name}");
            text.match_indices(&pat).any(|(i, _)| word(text, i + kw.len()))
        })
        || text.lines().any(|l| {
            let l = l.trim_start();
            (l.starts_with("pub use ") || l.starts_with("pub(crate) use "))
                && l.match_indices(name).any(|(i, _)| word(l, i))
        })
        // A variant or field of an enum or struct defined here.
        || text.lines().any(|l| {
            let l = l.trim_start();
            l.starts_with(name) && word(l, 0) && !l.starts_with("//")
        })
}

/// Whether the backticked module path `path` (`worker::admission::Admission`,
/// `crate::client::map`) names something that exists; paths not rooted in
/// one of the layers are not ours to check.
fn resolves(path: &str, everything: &str) -> bool {
    let mut segs: Vec<&str> = path.split("::").collect();
    while segs
        .first()
        .is_some_and(|s| ["crate", "peerwasm", "peerwasm_core"].contains(s))
    {
        segs.remove(0);
    }
    let Some(first) = segs.first().filter(|s| LAYERS.contains(s)) else {
        return true;
    };
    let Some((file, mut dir)) = module_in(&src_of(first), first) else {
        return false;
    };
    let mut text = std::fs::read_to_string(file).unwrap();
    for (k, seg) in segs.iter().enumerate().skip(1) {
        if let Some((file, sub)) = module_in(&dir, seg) {
            text = std::fs::read_to_string(file).unwrap();
            dir = sub;
            continue;
        }
        // An item here (or re-exported here from elsewhere in the crates);
        // what follows it (a method, a variant) must exist somewhere.
        let here = defines(&text, seg) || (text.contains(seg) && defines(everything, seg));
        return here && segs[k + 1..].iter().all(|rest| defines(everything, rest));
    }
    true
}

/// The routes a backticked route names, its query dropped: each `[`
/// opens an optional tail, so they are the prefixes ending before each `[`
/// and the whole without brackets (`/v1/jobs[/{id}[/output]]` is three).
fn routes_named(span: &str) -> Vec<String> {
    let at = span.find("/v1/").unwrap_or(0);
    let route = span[at..].split([' ', '?']).next().unwrap_or_default();
    let mut named = Vec::new();
    let mut seen = String::new();
    for c in route.chars() {
        match c {
            '[' => named.push(seen.clone()),
            ']' => {}
            c => seen.push(c),
        }
    }
    named.push(seen);
    named
}

#[test]
fn what_the_docs_name_exists() {
    let sources = files("rs");
    let everything: String = sources
        .iter()
        .map(|(_, t)| t.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    let docs: Vec<_> = sources.iter().cloned().chain(files("md")).collect();
    let file_exists = |p: &str, from: &std::path::Path| {
        let here = from.parent().unwrap();
        [
            repo(),
            repo().join("runtime/src"),
            repo().join("core/src"),
            here.to_path_buf(),
        ]
        .iter()
        .any(|root| root.join(p).exists())
            || sources.iter().any(|(f, _)| f.ends_with(p))
    };
    let mut missing = Vec::new();
    for (path, text) in &docs {
        let is_rs = path.extension().is_some_and(|e| e == "rs");
        for (n, line) in text.lines().enumerate() {
            if is_rs && !line.trim_start().starts_with("//") {
                continue;
            }
            for span in line.split('`').skip(1).step_by(2) {
                let span = span.trim_end_matches("()");
                let ident =
                    |s: &str| !s.is_empty() && s.chars().all(|c| c.is_alphanumeric() || c == '_');
                let bad = if span.contains("/v1/") {
                    routes_named(span).iter().any(|r| {
                        !crate::proto::routes::TABLE
                            .iter()
                            .any(|row| crate::proto::routes::matches(row.path, r))
                    })
                } else if span.contains("::") && span.split("::").all(ident) {
                    !resolves(span, &everything)
                } else if span.ends_with(".rs")
                    && span.contains('/')
                    && span
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || "_/.".contains(c))
                {
                    !file_exists(span, path)
                } else {
                    false
                };
                if bad {
                    missing.push(format!("{}:{}: `{span}`", path.display(), n + 1));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "the docs name what does not exist:\n{}",
        missing.join("\n")
    );
}

/// The most lines a source file has without saying why at its top.
/// The files that may hold the whole worker (`worker::state::Worker`):
/// the file that defines it; above them, `server/` (the HTTP edge serves
/// it whole, as its router's state).
const HOLD_THE_WHOLE_WORKER: [&str; 1] = ["worker/state.rs"];

/// The job's path (`worker/`) and the owner (`owner/`) take
/// `worker::job_path::JobPath` — or less — so that what each can touch is
/// what its signature names, and a test builds them without a server.
#[test]
fn the_job_path_and_the_owner_never_take_the_whole_worker() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut whole = Vec::new();
    for room in ["worker", "owner"] {
        for entry in walkdir::WalkDir::new(src.join(room)) {
            let path = entry.expect("reading src").into_path();
            let relative = path
                .strip_prefix(&src)
                .unwrap()
                .to_string_lossy()
                .to_string();
            if path.extension().is_none_or(|e| e != "rs")
                || HOLD_THE_WHOLE_WORKER.contains(&relative.as_str())
            {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for (n, line) in text.lines().enumerate() {
                let code = line.split("//").next().unwrap_or_default();
                if code.contains("state::Worker")
                    || code.contains("Arc<Worker>")
                    || code.contains("&Worker")
                {
                    whole.push(format!("{relative}:{}: {}", n + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        whole.is_empty(),
        "the whole worker taken where its job path is enough:\n{}",
        whole.join("\n")
    );
}

const LONGEST: usize = 600;

#[test]
fn no_file_is_long_without_a_reason_at_its_top() {
    let mut long = Vec::new();
    for (path, text) in files("rs") {
        let lines = text.lines().count();
        let head: String = text.lines().take(40).collect::<Vec<_>>().join("\n");
        if lines > LONGEST && !head.contains("Past 600 lines because") {
            long.push(format!("{} ({lines} lines)", path.display()));
        }
    }
    assert!(
        long.is_empty(),
        "past {LONGEST} lines with no \"Past 600 lines because …\" in its top 40 lines (split it, or say why not):\n{}",
        long.join("\n")
    );
}
