//! Compiling a module apart from the worker: in a child process
//! (`peerwasm compile-child`) that can be stopped, limited in CPU time and
//! measured, rather than on a thread of the worker's own.
//!
//! wasmtime cannot stop a compile. On a thread, a compile past its limit —
//! or whose job was cancelled, whose client went away — runs on to its end
//! on every core, after its job was refused and its slot and memory charge
//! given back; one byte changed in a module starts another. In a child,
//! the same compile is *ended*: by the kernel when it has used its CPU
//! time (`RLIMIT_CPU`, so a loaded machine does not refuse an honest
//! module that merely waited for the cores, and a compile bomb is refused
//! whatever the load), and by its parent when the job that asked for it is
//! cancelled or the worker goes. Its peak memory and CPU time come back
//! with it ([`CompileUsage`]).
//!
//! The child builds the same engines from the same [`SandboxConfig`], so
//! its artifact is the one an in-process compile would have made; the
//! parent maps or deserializes it as it would a cached one (wasmtime checks
//! the engine configuration recorded in it). The parent trusts the child as
//! it trusts itself: the child is this executable, fed only the module.
//!
//! Wire: the parent writes the request (postcard: the config and the
//! module's bytes) to the child's stdin; the child writes `K`, the kind
//! (`m` module, `c` component) and the artifact, or `E` and a message, to
//! its stdout, and exits.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::code::Code;
use super::config::{CompileProgram, SandboxConfig};

/// What the child is asked: the config (its engines) and the module's
/// bytes — borrowed going out (a module may be 128 MiB: not copied
/// before it is encoded), owned coming in.
#[derive(Serialize)]
struct Request<'a> {
    /// Seconds of CPU the compile may take (its RLIMIT_CPU; the hard limit
    /// 2 s above it).
    cpu_secs: u64,
    config: &'a SandboxConfig,
    #[serde(with = "serde_bytes")]
    bytes: &'a [u8],
}

/// [`Request`], as the child reads it.
#[derive(Deserialize)]
struct Received {
    cpu_secs: u64,
    config: SandboxConfig,
    #[serde(with = "serde_bytes")]
    bytes: Vec<u8>,
}

/// What a compile in a child used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompileUsage {
    /// CPU time, all its threads.
    pub cpu: Duration,
    /// Its peak resident memory, in bytes, as read while it ran (`VmHWM`
    /// of its own address space: not `ru_maxrss`, which also counts the
    /// worker's pages the child had between fork and exec).
    pub peak_bytes: u64,
}

/// How a compile in a child ended.
pub enum ChildCompile {
    /// Compiled.
    Code(Code, CompileUsage),
    /// wasmtime refused the module (its message).
    Invalid(String),
    /// It used its CPU time (or, a net under it, ten times that in wall
    /// time) and was ended.
    TooSlow(CompileUsage),
    /// The caller no longer wanted it: ended.
    Cancelled,
    /// The child could not be started or died otherwise (said).
    Failed(String),
}

/// How often the parent looks at the child (and at `wanted`).
const POLL: Duration = Duration::from_millis(10);

/// Compiles `bytes` for `config`'s engines (`engines`) in a child started
/// from `program`, ending it once it has used `cpu_limit` of CPU time or
/// `wanted()` turns false; `resident` is kept at the child's resident
/// memory while it runs. Blocks: call it from a blocking thread.
pub fn compile_in_child(
    program: &CompileProgram,
    config: &SandboxConfig,
    engines: &(wasmtime::Engine, wasmtime::Engine),
    bytes: &[u8],
    cpu_limit: Duration,
    wanted: &dyn Fn() -> bool,
    resident: &AtomicU64,
) -> ChildCompile {
    let secs = cpu_limit.as_secs().max(1);
    // Started without `pre_exec` (`crate::child`): the child ties itself
    // to this process, and takes its CPU limit from the request.
    let mut cmd = crate::child::command(&program.exe, &program.args);
    cmd.stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit());
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            return ChildCompile::Failed(format!(
                "cannot start a compile process ({}): {e}",
                program.exe.display()
            ));
        }
    };
    let pid = child.id() as libc::pid_t;
    let request = match postcard::to_allocvec(&Request {
        cpu_secs: secs,
        config,
        bytes,
    }) {
        Ok(r) => r,
        Err(e) => return ChildCompile::Failed(format!("cannot encode the compile request: {e}")),
    };
    let mut stdin = child.stdin.take().expect("stdin piped");
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&request);
    });
    let mut stdout = child.stdout.take().expect("stdout piped");
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        let _ = stdout.read_to_end(&mut out);
        out
    });
    let started = Instant::now();
    let wall_net = cpu_limit.saturating_mul(10).max(Duration::from_secs(60));
    let mut peak = 0;
    let (status, usage) = loop {
        if let Some((rss, hwm)) = super::compile_memory::resident_of(pid) {
            resident.store(rss, Ordering::Relaxed);
            peak = peak.max(hwm);
        }
        if let Some((status, usage)) = reap(pid, false) {
            break (
                status,
                CompileUsage {
                    peak_bytes: peak,
                    ..usage
                },
            );
        }
        let cancelled = !wanted();
        if cancelled || started.elapsed() > wall_net {
            // SAFETY: kill(2) of our own child, not yet reaped.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let (_, usage) = reap(pid, true).unwrap_or_default();
            let usage = CompileUsage {
                peak_bytes: peak,
                ..usage
            };
            let _ = (writer.join(), reader.join());
            return if cancelled {
                ChildCompile::Cancelled
            } else {
                ChildCompile::TooSlow(usage)
            };
        }
        std::thread::sleep(POLL);
    };
    let _ = writer.join();
    let out = reader.join().unwrap_or_default();
    if libc::WIFSIGNALED(status) {
        let signal = libc::WTERMSIG(status);
        if signal == libc::SIGXCPU
            || (signal == libc::SIGKILL && usage.cpu + Duration::from_secs(1) >= cpu_limit)
        {
            return ChildCompile::TooSlow(usage);
        }
        return ChildCompile::Failed(format!("the compile process died of signal {signal}"));
    }
    match out.split_first() {
        Some((b'K', rest)) if !rest.is_empty() => {
            let (kind, artifact) = (rest[0], &rest[1..]);
            // SAFETY: the artifact is what this executable's `serve` wrote
            // with `Code::serialize`, for engines built from the same
            // config; wasmtime checks the engine settings recorded in it.
            let code = unsafe {
                match kind {
                    b'c' => wasmtime::component::Component::deserialize(&engines.1, artifact)
                        .map(Code::Component),
                    _ => wasmtime::Module::deserialize(&engines.0, artifact).map(Code::Module),
                }
            };
            match code {
                Ok(code) => ChildCompile::Code(code, usage),
                Err(e) => ChildCompile::Failed(format!(
                    "the compile process's artifact does not load: {}",
                    super::code::one_line(&e)
                )),
            }
        }
        Some((b'E', message)) => {
            ChildCompile::Invalid(String::from_utf8_lossy(message).into_owned())
        }
        _ => ChildCompile::Failed(format!(
            "the compile process ended ({status:#x}) without an answer"
        )),
    }
}

/// Waits for child `pid` (`block`ing, or not): its wait status and what it
/// used, once it has ended.
fn reap(pid: libc::pid_t, block: bool) -> Option<(i32, CompileUsage)> {
    let mut status = 0;
    // SAFETY: rusage is plain data, filled in by wait4(2).
    let mut rusage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4(2) on our own child, with valid pointers.
    let got = unsafe {
        libc::wait4(
            pid,
            &mut status,
            if block { 0 } else { libc::WNOHANG },
            &mut rusage,
        )
    };
    if got != pid {
        return None;
    }
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    let usage = CompileUsage {
        cpu: time(rusage.ru_utime) + time(rusage.ru_stime),
        peak_bytes: 0, // read while it ran: see `CompileUsage::peak_bytes`
    };
    Some((status, usage))
}

/// The child's side (`peerwasm compile-child`): reads one request on
/// stdin, compiles it, writes the answer on stdout. Never gets a job to
/// run: it builds no store and no instance, only code.
pub fn serve() -> anyhow::Result<()> {
    crate::child::start()?;
    let mut input = Vec::new();
    std::io::stdin().read_to_end(&mut input)?;
    let request: Received =
        postcard::from_bytes(&input).map_err(|e| anyhow::anyhow!("bad compile request: {e}"))?;
    drop(input);
    let limit = libc::rlimit {
        rlim_cur: request.cpu_secs,
        rlim_max: request.cpu_secs + 2,
    };
    // SAFETY: setrlimit reads the struct it is given, nothing else.
    if unsafe { libc::setrlimit(libc::RLIMIT_CPU, &limit) } != 0 {
        anyhow::bail!(
            "cannot limit the compile's CPU: {}",
            std::io::Error::last_os_error()
        );
    }
    let engines = (
        super::engine::build(&request.config)?,
        super::engine::build_for_components(&request.config)?,
    );
    let answer = match Code::compile(&engines, &request.bytes)
        .and_then(|code| Ok((code.kind(), code.serialize()?)))
    {
        Ok((kind, artifact)) => {
            let mut out = Vec::with_capacity(artifact.len() + 2);
            out.push(b'K');
            out.push(if kind == "component" { b'c' } else { b'm' });
            out.extend_from_slice(&artifact);
            out
        }
        Err(e) => [b"E".as_slice(), super::code::one_line(&e).as_bytes()].concat(),
    };
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(&answer)?;
    stdout.flush()?;
    Ok(())
}
