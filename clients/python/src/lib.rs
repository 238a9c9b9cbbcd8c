//! peerwasm from Python: `run` and `map` over peerwasm's own client
//! (`peerwasm::client`), so Python gets placement, learned memory
//! estimates, retries, batching and ordered results from the one
//! implementation — and the embedded worker when no peers are given.
//!
//! Jobs run with the GIL released; Ctrl-C (SIGINT) raises
//! `KeyboardInterrupt` within 100 ms, and dropping the run cancels its jobs
//! (on a pool, their workers cancel them as the connections close). A map
//! is a `MapStream` (`stream.rs`): its results are read as they come.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

mod command;
mod embedded;
mod per_process;
mod stream;

use embedded::{compile_first, dirs_cache, embedded};
use peerwasm::client::{Job, MapConfig, Pool, PoolConfig, Target};
use peerwasm::proto::JobResult;
use per_process::PerProcess;
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyString};
use stream::MapStream;

create_exception!(
    _peerwasm,
    JobError,
    PyException,
    "A job that did not succeed (exit code not 0, a limit hit, cancelled...); its `Result` is `.result`."
);

/// The memory limit of `run` when `mem` is not given (as `peerwasm run`).
const DEFAULT_MEMORY: u64 = peerwasm::proto::DEFAULT_JOB_MEMORY;

/// How a job ended.
#[pyclass(frozen, get_all, module = "peerwasm")]
pub struct Result {
    /// The job's exit code (124 time limit, 137 memory, 134 trap, 130
    /// cancelled, 2 not the job's doing), as `peerwasm run` exits.
    exit_code: i32,
    /// How it ended: `exited`, `memory_limit_exceeded`, `time_limit_exceeded`, ...
    outcome: String,
    /// The outcome in words.
    message: String,
    /// Its standard output.
    stdout: Py<PyBytes>,
    /// Its standard output parsed as JSON, when it parses; else None.
    output: Py<PyAny>,
    /// Its standard error, decoded (invalid UTF-8 replaced).
    stderr: String,
    /// The most linear memory it held, exactly, in bytes.
    peak_memory_bytes: u64,
    /// The memory limit it ran under, in bytes.
    memory_limit_bytes: u64,
    /// Wall time, in seconds.
    wall_s: f64,
    /// CPU time, in seconds.
    cpu_s: f64,
    /// Who ran it: `embedded` or a worker's address.
    peer: String,
    /// How many times it was submitted (map: retries and lost workers).
    attempts: u32,
    /// Its input's position in a map; None for `run`.
    index: Option<usize>,
}

#[pymethods]
impl Result {
    fn __repr__(&self) -> String {
        format!(
            "Result(exit_code={}, outcome={:?}, peak_memory_bytes={}, wall_s={:.4}, peer={:?})",
            self.exit_code, self.outcome, self.peak_memory_bytes, self.wall_s, self.peer
        )
    }

    /// Whether the job exited with code 0.
    #[getter]
    fn ok(&self) -> bool {
        self.outcome == "exited" && self.exit_code == 0
    }
}

fn to_result(
    py: Python<'_>,
    r: JobResult,
    attempts: u32,
    index: Option<usize>,
) -> PyResult<Result> {
    let output = json_output(py, &r.stdout)?;
    Ok(Result {
        exit_code: r.outcome.exit_code(),
        outcome: r.outcome.kind().into(),
        message: r.outcome.to_string(),
        stdout: PyBytes::new(py, &r.stdout).unbind(),
        output,
        stderr: String::from_utf8_lossy(&r.stderr).into_owned(),
        peak_memory_bytes: r.peak_memory_bytes,
        memory_limit_bytes: r.memory_limit_bytes,
        wall_s: r.wall_time_us as f64 / 1e6,
        cpu_s: r.cpu_time_us as f64 / 1e6,
        peer: r.peer,
        attempts,
        index,
    })
}

/// A job's stdout read as JSON (`Result.output`), None when it is not.
///
/// Only what can begin a JSON text is given to `json.loads` (a Python
/// map's replies, which begin `PWV1`, are not: the failed parse cost each
/// item an exception), and only an `Exception` of its (not JSON, nested too
/// deep for the parser) means "not JSON": a `KeyboardInterrupt` is raised —
/// `json.loads` runs Python code, so a Ctrl-C that arrives while it runs is
/// raised there, and was lost with it (the map went on to its end).
fn json_output(py: Python<'_>, stdout: &[u8]) -> PyResult<Py<PyAny>> {
    let Ok(text) = std::str::from_utf8(stdout) else {
        return Ok(py.None());
    };
    let starts_json = |c: char| "{[\"-tfnNI".contains(c) || c.is_ascii_digit();
    if !text.trim_start().starts_with(starts_json) {
        return Ok(py.None());
    }
    match py.import("json")?.call_method1("loads", (text,)) {
        Ok(value) => Ok(value.unbind()),
        Err(e) if e.is_instance_of::<PyException>(py) => Ok(py.None()),
        Err(e) => Err(e),
    }
}

/// A `JobError` carrying `result`; a map's item says which it is.
fn job_error(py: Python<'_>, result: Result) -> PyResult<PyErr> {
    let item = result
        .index
        .map_or(String::new(), |i| format!("item {i} of the map: "));
    let message = format!("{item}{}{}", result.message, stderr_tail(&result.stderr));
    let err = JobError::new_err(message);
    err.value(py).setattr("result", Py::new(py, result)?)?;
    Ok(err)
}

fn stderr_tail(stderr: &str) -> String {
    match stderr.trim().lines().last() {
        Some(line) => format!(": {line}"),
        None => String::new(),
    }
}

/// The runtime every call runs on, and the embedded worker (one per
/// process, so compiled modules and threads are reused between calls).
fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: PerProcess<tokio::runtime::Runtime> = PerProcess::new();
    RT.get_or_try_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
    })
    .expect("a tokio runtime")
}

fn target(peers: Option<Vec<String>>, token: Option<String>) -> PyResult<Target> {
    let peers = peers.or_else(|| {
        std::env::var("PEERWASM_PEERS").ok().map(|p| {
            p.split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        })
    });
    match peers {
        Some(p) if !p.is_empty() => {
            let token = token.or_else(|| std::env::var("PEERWASM_TOKEN").ok());
            // TLS as the command line has it: PEERWASM_TLS_CA names the
            // pool's CA; PEERWASM_INSECURE_HTTP=1 lets a token go in clear.
            let transport = peerwasm::net::Transport::from_env()
                .map_err(|e| PyValueError::new_err(format!("{e:#}")))?;
            let pool = Pool::new(PoolConfig {
                token,
                hash_cache: dirs_cache(),
                transport,
                ..PoolConfig::new(p)
            })
            .map_err(|e| PyValueError::new_err(format!("{e:#}")))?;
            Ok(Target::Pool(Arc::new(pool)))
        }
        _ => embedded(),
    }
}

/// Bytes as they are; a str as UTF-8.
fn to_bytes(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    if obj.cast::<PyString>().is_ok() {
        return Ok(obj.extract::<String>()?.into_bytes());
    }
    Err(PyValueError::new_err("stdin must be bytes or str"))
}

/// A size: an int of bytes, or a string such as "64MiB".
fn to_size(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<u64>> {
    let Some(obj) = obj else { return Ok(None) };
    if let Ok(n) = obj.extract::<u64>() {
        return Ok(Some(n));
    }
    let s: String = obj.extract().map_err(|_| {
        PyValueError::new_err("mem must be a number of bytes or a size such as \"64MiB\"")
    })?;
    peerwasm::units::parse_size(&s)
        .map(Some)
        .map_err(PyValueError::new_err)
}

/// A duration: seconds (int or float), or a string such as "30s".
fn to_timeout(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<u64>> {
    let Some(obj) = obj else { return Ok(None) };
    if let Ok(secs) = obj.extract::<f64>() {
        if !(secs > 0.0 && secs.is_finite()) {
            return Err(PyValueError::new_err("timeout must be above 0 seconds"));
        }
        return Ok(Some((secs * 1e3).ceil() as u64));
    }
    let s: String = obj.extract().map_err(|_| {
        PyValueError::new_err("timeout must be seconds or a duration such as \"30s\"")
    })?;
    let d = peerwasm::units::parse_duration(&s).map_err(PyValueError::new_err)?;
    Ok(Some(d.as_millis().max(1) as u64))
}

fn job(
    module: PathBuf,
    args: Vec<String>,
    env: Option<&Bound<'_, PyDict>>,
    timeout_ms: Option<u64>,
) -> PyResult<Job> {
    let mut job = Job::from_file(&module).map_err(|e| PyValueError::new_err(format!("{e:#}")))?;
    job.args = args;
    if let Some(env) = env {
        for (k, v) in env.iter() {
            job.env.push((k.extract()?, v.extract()?));
        }
    }
    job.limits.timeout_ms = timeout_ms;
    Ok(job)
}

/// Runs `fut` on the runtime with the GIL released; checks for Ctrl-C
/// every 100 ms, and on one drops `fut` (cancelling what it runs) and
/// raises `KeyboardInterrupt`.
fn block_on<T: Send>(
    py: Python<'_>,
    fut: impl std::future::Future<Output = T> + Send,
) -> PyResult<T> {
    py.detach(|| {
        runtime().block_on(async {
            tokio::pin!(fut);
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            loop {
                tokio::select! {
                    out = &mut fut => return Ok(out),
                    _ = tick.tick() => Python::attach(|py| py.check_signals())?,
                }
            }
        })
    })
}

/// Runs one job and returns its Result; raises JobError if it did not
/// succeed.
///
/// `module`: the .wasm file. `stdin`: bytes or str. `args`: the job's
/// arguments. `env`: its whole environment (a dict). `mem`: its memory
/// limit, bytes or "64MiB" (default 1 GiB). `timeout`: seconds or "30s".
/// `peers`: workers of a pool (default `$PEERWASM_PEERS`, else the
/// embedded worker in this process). `token`: the tenant token (default
/// `$PEERWASM_TOKEN`).
#[pyfunction]
#[pyo3(signature = (module, stdin=None, args=Vec::new(), env=None, mem=None, timeout=None, peers=None, token=None))]
#[allow(clippy::too_many_arguments)]
fn run(
    py: Python<'_>,
    module: PathBuf,
    stdin: Option<&Bound<'_, PyAny>>,
    args: Vec<String>,
    env: Option<&Bound<'_, PyDict>>,
    mem: Option<&Bound<'_, PyAny>>,
    timeout: Option<&Bound<'_, PyAny>>,
    peers: Option<Vec<String>>,
    token: Option<String>,
) -> PyResult<Result> {
    let stdin = stdin.map(to_bytes).transpose()?.unwrap_or_default();
    let job = job(module, args, env, to_timeout(timeout)?)?;
    run_job(py, &job, stdin, to_size(mem)?, target(peers, token)?)
}

/// Runs `job` once with `stdin`; the Result, or JobError.
fn run_job(
    py: Python<'_>,
    job: &Job,
    stdin: Vec<u8>,
    mem: Option<u64>,
    target: Target,
) -> PyResult<Result> {
    let spec = job.spec(stdin, mem.unwrap_or(DEFAULT_MEMORY));
    let mut result = block_on(py, async { target.run(job, spec).await })?
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
    // What it wrote into its writable directories, from a pool (the
    // embedded worker's jobs write in place).
    peerwasm::client::tree::write_back(&job.dirs, &mut result.files, None).map_err(|e| {
        PyRuntimeError::new_err(format!("cannot write the files the job made: {e:#}"))
    })?;
    let result = to_result(py, result, 1, None)?;
    if result.ok() {
        Ok(result)
    } else {
        Err(job_error(py, result)?)
    }
}

/// Starts `module` once per input; a `MapStream` of the Results, in
/// input order unless `ordered` is false (then as they arrive). A failed
/// job raises `JobError` when the stream reaches it (ending it), unless
/// `keep_going`.
///
/// Each input is the job's stdin: bytes as they are, anything else as its
/// JSON and a newline (what `peerwasm map` gives each line). Without `mem`,
/// memory is learned from the jobs' exact peaks (smartmem). `retries`:
/// runs of a failed job.
#[pyfunction]
#[pyo3(signature = (module, inputs, mem=None, timeout=None, peers=None, token=None, keep_going=false, retries=0, ordered=true, max_lost=peerwasm::client::DEFAULT_MAX_LOST as i64))]
#[allow(clippy::too_many_arguments)]
fn map_stream(
    py: Python<'_>,
    module: PathBuf,
    inputs: &Bound<'_, PyAny>,
    mem: Option<&Bound<'_, PyAny>>,
    timeout: Option<&Bound<'_, PyAny>>,
    peers: Option<Vec<String>>,
    token: Option<String>,
    keep_going: bool,
    retries: u32,
    ordered: bool,
    max_lost: i64,
) -> PyResult<MapStream> {
    let json = py.import("json")?;
    let mut stdins = Vec::new();
    for input in inputs.try_iter()? {
        let input = input?;
        if let Ok(b) = input.cast::<PyBytes>() {
            stdins.push(b.as_bytes().to_vec());
        } else {
            let text: String = json.call_method1("dumps", (&input,))?.extract()?;
            stdins.push(format!("{text}\n").into_bytes());
        }
    }
    let job = job(module, Vec::new(), None, to_timeout(timeout)?)?;
    let config = map_config(mem, stdins.len(), keep_going, retries, ordered, max_lost)?;
    Ok(MapStream::start(
        job,
        stdins,
        config,
        target(peers, token)?,
        None,
    ))
}

/// A map's settings from the Python keywords. `mem`: one size for every
/// job, or a sequence of one per input (what the caller knows of each:
/// nothing is learned then); `max_lost`: how often an input may be lost
/// with the process running it before it is given up.
fn map_config(
    mem: Option<&Bound<'_, PyAny>>,
    inputs: usize,
    keep_going: bool,
    retries: u32,
    ordered: bool,
    max_lost: i64,
) -> PyResult<MapConfig> {
    let max_lost = u32::try_from(max_lost)
        .ok()
        .filter(|&n| n >= 1)
        .ok_or_else(|| {
            PyValueError::new_err(format!("max_lost must be at least 1, not {max_lost}"))
        })?;
    let per_input = match mem {
        Some(m) if !m.is_instance_of::<pyo3::types::PyString>() && m.extract::<u64>().is_err() => {
            Some(per_input_sizes(m, inputs)?)
        }
        _ => None,
    };
    Ok(MapConfig {
        mem: if per_input.is_some() {
            None
        } else {
            to_size(mem)?.map(Into::into)
        },
        mem_per_input: per_input,
        keep_going,
        retries,
        ordered,
        max_lost,
        ..MapConfig::default()
    })
}

/// `mem` given per input: one size each, as many as there are inputs.
fn per_input_sizes(
    mem: &Bound<'_, PyAny>,
    inputs: usize,
) -> PyResult<std::sync::Arc<[peerwasm::proto::MemoryRequest]>> {
    let iter = mem.try_iter().map_err(|_| {
        PyValueError::new_err(
            "mem must be a number of bytes, a size such as \"64MiB\", or one of those per input",
        )
    })?;
    let mut sizes = Vec::with_capacity(inputs);
    for (i, m) in iter.enumerate() {
        let size = to_size(Some(&m?))
            .map_err(|e| PyValueError::new_err(format!("mem[{i}]: {e}")))?
            .unwrap_or(0);
        sizes.push(peerwasm::proto::MemoryRequest::from(size));
    }
    if sizes.len() != inputs {
        return Err(PyValueError::new_err(format!(
            "mem gives {} sizes for {inputs} inputs: give one per input, or one size for all",
            sizes.len()
        )));
    }
    Ok(sizes.into())
}

/// What the last map in this process learned of its jobs' memory.
static LEARNED: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// What the last `map` learned of its jobs' memory, in words (`peak ≈ 8.1 ×
/// input bytes + 3.0 MiB ...`, or that it does not follow input size);
/// None before a map has results enough (a dozen), or with `mem` given.
#[pyfunction]
fn learned_memory() -> Option<String> {
    LEARNED.lock().map(|l| l.clone()).unwrap_or_default()
}

/// Records what a map that ended learned (`learned_memory`).
fn set_learned(words: Option<String>) {
    if let Ok(mut slot) = LEARNED.lock() {
        *slot = words;
    }
}

/// What a Python program's job is given besides its source (the Python
/// client's keywords): directories (host, guest, read-only: `files=`,
/// `packages=`, `outputs=`), the most it may reply (`max_output`), and
/// whether code it imports plots (its `packages=` name matplotlib).
struct Given<'py> {
    dirs: Vec<(PathBuf, String, bool)>,
    max_output: Option<&'py Bound<'py, PyAny>>,
    plots: bool,
}

/// A job that runs the Python program `source` on the CPython for WASI in
/// `runtime` (a directory holding `python.wasm` and `python-stdlib.zip`),
/// with what it is `given`, and the directory that holds its copy of the
/// program while it runs.
fn python_job(
    runtime: PathBuf,
    source: &str,
    timeout_ms: Option<u64>,
    given: Given<'_>,
) -> PyResult<peerwasm::client::python::PythonJob> {
    let err = |e: anyhow::Error| PyValueError::new_err(format!("{e:#}"));
    let rt = peerwasm::client::python::PythonRuntime::in_dir(&runtime).map_err(err)?;
    let cache = dirs_cache().unwrap_or_else(|| std::env::temp_dir().join("peerwasm-cache"));
    let mut pj = peerwasm::client::python::python_source_job(
        &rt,
        "job.py",
        source.as_bytes(),
        &cache,
        given.plots,
    )
    .map_err(err)?;
    pj.job.limits.timeout_ms = timeout_ms;
    if let Some(bytes) = to_size(given.max_output)? {
        // A pool's workers keep at most their `--max-output` (64 MiB
        // unless set) whatever a job asks.
        pj.job.limits.stdout_bytes = bytes;
    }
    let dirs = given.dirs;
    pj.job
        .dirs
        .extend(
            dirs.into_iter()
                .map(|(host, guest, read_only)| peerwasm::proto::DirGrant {
                    host,
                    guest,
                    read_only,
                }),
        );
    Ok(pj)
}

/// `run` of a Python program: the driver `peerwasm.run(fn, ...)` writes.
#[pyfunction]
#[pyo3(signature = (runtime, source, stdin, mem=None, timeout=None, peers=None, token=None, dirs=Vec::new(), max_output=None, plots=false))]
#[allow(clippy::too_many_arguments)]
fn _run_python(
    py: Python<'_>,
    runtime: PathBuf,
    source: &str,
    stdin: Vec<u8>,
    mem: Option<&Bound<'_, PyAny>>,
    timeout: Option<&Bound<'_, PyAny>>,
    peers: Option<Vec<String>>,
    token: Option<String>,
    dirs: Vec<(PathBuf, String, bool)>,
    max_output: Option<&Bound<'_, PyAny>>,
    plots: bool,
) -> PyResult<Result> {
    let given = Given {
        dirs,
        max_output,
        plots,
    };
    let pj = python_job(runtime, source, to_timeout(timeout)?, given)?;
    let target = target(peers, token)?;
    compile_first(py, &target, &pj.job)?;
    run_job(py, &pj.job, stdin, to_size(mem)?, target)
}

/// `map` of a Python program over pickled inputs: the driver
/// `peerwasm.map(fn, ...)` writes. A `MapStream`, as `map_stream`.
#[pyfunction]
#[pyo3(signature = (runtime, source, inputs, mem=None, timeout=None, peers=None, token=None, keep_going=false, retries=0, warm=None, ordered=true, dirs=Vec::new(), max_output=None, plots=false, max_lost=peerwasm::client::DEFAULT_MAX_LOST as i64))]
#[allow(clippy::too_many_arguments)]
fn _map_python(
    py: Python<'_>,
    runtime: PathBuf,
    source: &str,
    inputs: Vec<Vec<u8>>,
    mem: Option<&Bound<'_, PyAny>>,
    timeout: Option<&Bound<'_, PyAny>>,
    peers: Option<Vec<String>>,
    token: Option<String>,
    keep_going: bool,
    retries: u32,
    warm: Option<(String, String)>,
    ordered: bool,
    dirs: Vec<(PathBuf, String, bool)>,
    max_output: Option<&Bound<'_, PyAny>>,
    plots: bool,
    max_lost: i64,
) -> PyResult<MapStream> {
    let given = Given {
        dirs,
        max_output,
        plots,
    };
    let mut pj = python_job(runtime, source, to_timeout(timeout)?, given)?;
    // Each item from a snapshot of the interpreter the prelude readied.
    pj.job.warm = warm.map(|(prelude, turn)| peerwasm::proto::WarmStart { prelude, turn });
    let config = map_config(mem, inputs.len(), keep_going, retries, ordered, max_lost)?;
    let target = target(peers, token)?;
    compile_first(py, &target, &pj.job)?;
    // The program's directory lives as long as the map's jobs may start.
    let holds = pj
        .script_dir
        .map(|d| Box::new(d) as Box<dyn std::any::Any + Send + Sync>);
    Ok(MapStream::start(pj.job, inputs, config, target, holds))
}

/// The directory the client keeps what it made for later runs in
/// (compiled modules, programs, staged packages): `PEERWASM_CACHE_DIR`,
/// else the user's cache directory; `None` without one.
#[pyfunction]
fn _cache_dir() -> Option<PathBuf> {
    dirs_cache()
}

#[pymodule]
fn _peerwasm(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(run, m)?)?;
    m.add_function(wrap_pyfunction!(map_stream, m)?)?;
    m.add_function(wrap_pyfunction!(learned_memory, m)?)?;
    m.add_function(wrap_pyfunction!(_run_python, m)?)?;
    m.add_function(wrap_pyfunction!(_map_python, m)?)?;
    m.add_function(wrap_pyfunction!(command::command, m)?)?;
    m.add_function(wrap_pyfunction!(_cache_dir, m)?)?;
    m.add_class::<Result>()?;
    m.add_class::<MapStream>()?;
    m.add("JobError", m.py().get_type::<JobError>())?;
    // The most a job's input (its stdin) may be, embedded as on a pool.
    m.add("MAX_INPUT_BYTES", peerwasm::proto::MAX_INPUT_BYTES)?;
    m.add("TURN_ONLY_DIR", peerwasm::proto::TURN_ONLY_DIR)?;
    Ok(())
}
