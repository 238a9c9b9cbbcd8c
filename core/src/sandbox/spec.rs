//! [`RunSpec`]: a job as this machine runs it — the wire
//! [`JobSpec`] resolved. What the sandbox, the runner, a slot process and
//! its wire take, and nothing else.
//!
//! Why a type of its own: a request is what a client sent; what runs is
//! that request resolved here. A worker lays the job's shipped trees out as
//! host directories and gives it the memory limit admission reserved for
//! it, and builds a `RunSpec` from the request instead of editing the
//! request in flight; a spec with trees still unlaid cannot reach the
//! sandbox at all. On the embedded worker a job is resolved as it is sent
//! ([`RunSpec::local`]): it has nothing to lay trees out with.

use serde::{Deserialize, Serialize};

use crate::proto::{DirGrant, JobLimits, JobSpec, ModuleHash, WarmStart};

/// A job resolved to run on this machine.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunSpec {
    /// The module to run, by content hash.
    pub module: ModuleHash,
    /// `argv[0]` as the guest sees it.
    pub program_name: String,
    /// The job's arguments, without `argv[0]`.
    pub args: Vec<String>,
    /// The job's whole environment.
    pub env: Vec<(String, String)>,
    /// The job's standard input (more may stream in: `RunHooks::stdin`).
    #[serde(with = "serde_bytes")]
    pub stdin: Vec<u8>,
    /// Host directories the job sees: granted on the embedded worker, or a
    /// worker's layout of the trees it was shipped.
    pub dirs: Vec<DirGrant>,
    /// What the job may use; on a worker, its memory limit is the
    /// reservation admission made for it.
    pub limits: JobLimits,
    /// The export to call instead of `_start` (`--invoke`).
    pub invoke: Option<String>,
    /// Start from a snapshot of the prelude's state (see [`WarmStart`]).
    pub warm: Option<WarmStart>,
    /// Who may start from the snapshots this job's prelude makes: jobs of
    /// the same scope only (a worker's tenant; empty on the embedded
    /// worker, whose jobs are all its user's). A snapshot holds whatever
    /// the prelude computed or read — another tenant's identical prelude
    /// must not start from it.
    pub warm_scope: String,
}

impl RunSpec {
    /// `spec` as the embedded worker runs it; `Err` (why it is rejected) if
    /// it names shipped trees, which only a remote worker lays out.
    pub fn local(spec: JobSpec) -> Result<RunSpec, String> {
        if !spec.trees.is_empty() {
            return Err("the job names shipped trees, which only a remote worker lays out: grant host directories (`dirs`) here".into());
        }
        let memory = spec.limits.memory_bytes;
        Ok(RunSpec::resolved(spec, Vec::new(), memory))
    }

    /// `spec` as a worker runs it: its trees laid out as `mounted` (host
    /// directories, after any it was granted), its memory limit
    /// `memory_bytes` (the reservation).
    pub fn resolved(spec: JobSpec, mounted: Vec<DirGrant>, memory_bytes: u64) -> RunSpec {
        let JobSpec {
            module,
            program_name,
            args,
            env,
            stdin,
            mut dirs,
            trees: _,
            mut limits,
            tag: _,
            invoke,
            warm,
        } = spec;
        dirs.extend(mounted);
        limits.memory_bytes = memory_bytes;
        RunSpec {
            module,
            program_name,
            args,
            env,
            stdin,
            dirs,
            limits,
            invoke,
            warm,
            warm_scope: String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::tree::TreeGrant;

    #[test]
    fn trees_are_laid_out_or_refused_and_the_limit_is_the_reservation() {
        let mut spec = JobSpec::new(ModuleHash::of(b"m"));
        spec.limits.memory_bytes = 64 << 20;
        spec.args = vec!["a".into()];
        let local = RunSpec::local(spec.clone()).unwrap();
        assert_eq!(
            (local.args.clone(), local.limits.memory_bytes),
            (vec!["a".to_string()], 64 << 20)
        );

        spec.trees.push(TreeGrant {
            manifest: ModuleHash::of(b"t"),
            guest: "/data".into(),
            read_only: true,
        });
        assert!(
            RunSpec::local(spec.clone())
                .unwrap_err()
                .contains("shipped trees")
        );
        let grant = DirGrant {
            host: "/tmp/laid-out".into(),
            guest: "/data".into(),
            read_only: true,
        };
        let resolved = RunSpec::resolved(spec, vec![grant.clone()], 48 << 20);
        assert_eq!(resolved.dirs, vec![grant]);
        assert_eq!(
            resolved.limits.memory_bytes,
            48 << 20,
            "the reservation, not the request"
        );
    }
}
