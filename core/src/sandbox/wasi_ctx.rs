//! The WASI context of one job, built from its spec: its args, env, stdio,
//! scratch directory and granted directories — and nothing else (no host
//! environment, no network). Shared by core modules, components and warm
//! starts.

use wasmtime_wasi::p2::pipe::MemoryInputPipe;
use wasmtime_wasi::{FsPerms, WasiCtxBuilder};

use super::{JobIo, RunSpec, SCRATCH_GUEST_PATH};

impl super::Sandbox {
    /// The WASI context of one job: its args, env, stdio, scratch directory and
    /// granted directories, and nothing else (no host env, no network).
    pub(super) fn build_wasi(
        &self,
        spec: &RunSpec,
        io: JobIo<'_>,
        scratch: Option<&std::path::Path>,
    ) -> Result<WasiCtxBuilder, String> {
        let mut b = WasiCtxBuilder::new();
        // No network: a component's `wasi:sockets` calls are refused before a
        // host socket is made (preview 1 has no way to make one).
        b.allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false);
        b.allow_blocking_current_thread(self.config.file_io_on_job_thread);
        b.arg(&spec.program_name);
        b.args(&spec.args);
        b.envs(&spec.env);
        match io.stdin.and_then(|feed| feed.reader(spec.stdin.clone())) {
            Some(reader) => b.stdin(wasmtime_wasi::cli::AsyncStdinStream::new(reader)),
            None => b.stdin(MemoryInputPipe::new(spec.stdin.clone())),
        };
        b.stdout(io.stdout.clone());
        b.stderr(io.stderr.clone());
        if let Some(scratch) = scratch
            && !spec.dirs.iter().any(|d| d.guest == SCRATCH_GUEST_PATH)
        {
            b.preopened_dir(scratch, SCRATCH_GUEST_PATH, FsPerms::ReadWrite)
                .map_err(|e| format!("cannot open the scratch directory: {e}"))?;
        }
        for d in &spec.dirs {
            let perms = if d.read_only {
                FsPerms::ReadOnly
            } else {
                FsPerms::ReadWrite
            };
            b.preopened_dir(&d.host, &d.guest, perms).map_err(|e| {
                format!(
                    "cannot open directory {} for the job: {e}",
                    d.host.display()
                )
            })?;
        }
        Ok(b)
    }
}
