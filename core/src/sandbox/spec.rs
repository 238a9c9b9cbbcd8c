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
    /// reservation admission made for it, unless it runs under a reserve.
    pub limits: JobLimits,
    /// What the job may hold without asking, when less than its limit: it
    /// asks its [`RunHooks::memory_lender`](super::RunHooks) for more
    /// (see [`JobSpec::memory_reserve`]). None: its whole limit.
    #[serde(default)]
    pub memory_reserve: Option<u64>,
    /// The export to call instead of `_start` (`--invoke`).
    pub invoke: Option<String>,
    /// Start from a snapshot of the prelude's state (see [`WarmStart`]).
    pub warm: Option<WarmStart>,
    /// Which jobs may start from the snapshots this job's prelude makes:
    /// those of the same scope only. Made from what the job's directories
    /// hold ([`RunSpec::resolved`]: the trees' content hashes, the granted
    /// directories' host paths — a job's trees are laid out afresh for
    /// each job, so their paths say nothing), and on a worker prefixed with
    /// the tenant: a snapshot holds whatever the prelude computed or read,
    /// and another tenant's identical prelude must not start from it.
    pub warm_scope: String,
}

impl RunSpec {
    /// `spec` as the embedded worker runs it; `Err` (why it is rejected) if
    /// it names shipped trees, which only a remote worker lays out.
    pub fn local(spec: JobSpec) -> Result<RunSpec, String> {
        if !spec.trees.is_empty() {
            return Err("the job names shipped trees, which only a remote worker lays out: grant host directories (`dirs`) here".into());
        }
        // Nothing else shares the embedded worker's memory: no reserve.
        let memory = spec.limits.memory.bytes();
        let spec = JobSpec {
            memory_reserve: None,
            ..spec
        };
        Ok(RunSpec::resolved(spec, Vec::new(), memory))
    }

    /// `spec` as a worker runs it: its trees laid out as `mounted` (host
    /// directories, after any it was granted), `memory_bytes` reserved for
    /// it — its limit, or its reserve when it asked for one below its
    /// limit (the limit is then the spec's).
    pub fn resolved(spec: JobSpec, mounted: Vec<DirGrant>, memory_bytes: u64) -> RunSpec {
        let under_reserve = spec.memory_reserve.is_some() && spec.reserved() < spec.limits.memory;
        let JobSpec {
            module,
            program_name,
            args,
            env,
            stdin,
            mut dirs,
            trees,
            mut limits,
            tag: _,
            invoke,
            warm,
            memory_reserve: _,
        } = spec;
        let warm_scope = content_scope(&trees, &dirs);
        dirs.extend(mounted);
        let memory_reserve = if under_reserve {
            Some(memory_bytes.min(limits.memory.bytes()))
        } else {
            limits.memory = crate::proto::MemoryRequest::from(memory_bytes);
            None
        };
        RunSpec {
            module,
            program_name,
            args,
            env,
            stdin,
            dirs,
            limits,
            memory_reserve,
            invoke,
            warm,
            warm_scope,
        }
    }
}

/// What a job's directories hold, as a short key: its shipped trees by
/// content hash (and where they are mounted), its granted directories by
/// host path — but not those only its turn reads
/// ([`TURN_ONLY_DIR`](crate::proto::TURN_ONLY_DIR)).
fn content_scope(trees: &[crate::proto::tree::TreeGrant], dirs: &[DirGrant]) -> String {
    use sha2::{Digest, Sha256};
    let turn_only = |guest: &str, read_only: bool| {
        let only = crate::proto::TURN_ONLY_DIR;
        read_only && (guest == only || guest.strip_prefix(only).is_some_and(|r| r.starts_with('/')))
    };
    let trees: Vec<_> = trees
        .iter()
        .filter(|t| !turn_only(&t.guest, t.read_only))
        .collect();
    let dirs: Vec<_> = dirs
        .iter()
        .filter(|d| !turn_only(&d.guest, d.read_only))
        .collect();
    let bytes = postcard::to_allocvec(&(trees, dirs)).expect("encoding to memory cannot fail");
    hex::encode(&Sha256::digest(bytes)[..16])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::tree::TreeGrant;

    #[test]
    fn trees_are_laid_out_or_refused_and_the_limit_is_the_reservation() {
        let mut spec = JobSpec::new(ModuleHash::of(b"m"));
        spec.limits.memory = crate::proto::MemoryRequest::from(64 << 20);
        spec.args = vec!["a".into()];
        let local = RunSpec::local(spec.clone()).unwrap();
        assert_eq!(
            (local.args.clone(), local.limits.memory.bytes()),
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
            resolved.limits.memory.bytes(),
            48 << 20,
            "the reservation, not the request"
        );
    }

    #[test]
    fn what_only_the_turn_reads_is_not_part_of_the_warm_scope() {
        let scope = |host: &str, guest: &str, read_only: bool| {
            let mut spec = JobSpec::new(ModuleHash::of(b"m"));
            spec.dirs = vec![
                DirGrant {
                    host: "/home/me/data".into(),
                    guest: "/data".into(),
                    read_only: true,
                },
                DirGrant {
                    host: host.into(),
                    guest: guest.into(),
                    read_only,
                },
            ];
            RunSpec::local(spec).unwrap().warm_scope
        };
        let only = crate::proto::TURN_ONLY_DIR;
        // New arguments moved as files: the same snapshot.
        assert_eq!(
            scope("/c/arrays/1", only, true),
            scope("/c/arrays/2", only, true)
        );
        // Anything else a prelude may read: its own.
        assert_ne!(scope("/c/a", "/other", true), scope("/c/b", "/other", true));
        assert_ne!(
            scope("/c/arrays/1", &format!("{only}x"), true),
            scope("/c/arrays/2", &format!("{only}x"), true)
        );
        assert_ne!(
            scope("/c/arrays/1", only, false),
            scope("/c/arrays/2", only, false)
        );
    }
}
