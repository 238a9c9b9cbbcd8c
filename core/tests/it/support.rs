//! Shared helpers: a runner shared by tests, and job specs for the guests.

use std::sync::OnceLock;

use peerwasm_core::proto::{JobResult, JobSpec};
use peerwasm_core::runner::{JobRunner, RunnerConfig};
use peerwasm_core::sandbox::SandboxConfig;

pub const MIB: u64 = 1 << 20;

/// A runner shared by the tests that do not look at cache counters.
pub fn shared() -> &'static JobRunner {
    static RUNNER: OnceLock<JobRunner> = OnceLock::new();
    RUNNER.get_or_init(|| {
        runner(SandboxConfig {
            slots: 2,
            ..SandboxConfig::default()
        })
    })
}

pub fn runner(sandbox: SandboxConfig) -> JobRunner {
    JobRunner::new(RunnerConfig {
        sandbox,
        ..RunnerConfig::default()
    })
    .expect("creating a runner")
}

/// A spec for guest example `name` with `stdin`, registered with `runner`.
pub fn guest_job(runner: &JobRunner, name: &str, stdin: &str) -> JobSpec {
    let hash = runner.add_module(peerwasm_testkit::guest_wasm_bytes(name));
    let mut spec = JobSpec::new(hash);
    spec.program_name = format!("{name}.wasm");
    spec.stdin = stdin.as_bytes().to_vec();
    spec
}

/// A spec for a module given as WAT text.
pub fn wat_job(runner: &JobRunner, wat: &str) -> JobSpec {
    let bytes = wat::parse_str(wat).expect("test WAT parses");
    JobSpec::new(runner.add_module(bytes))
}

pub fn stdout(r: &JobResult) -> String {
    String::from_utf8_lossy(&r.stdout).into_owned()
}

pub fn stderr(r: &JobResult) -> String {
    String::from_utf8_lossy(&r.stderr).into_owned()
}
