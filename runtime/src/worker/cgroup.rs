//! The memory limit of the cgroup this process runs in: under Slurm (or
//! any batch system, or a container), the memory the job was granted. A
//! worker never lends more than that, whatever `--memory` says; and what
//! the cgroup's processes hold now ([`working_set`]), so that memory taken
//! in it beside the jobs — the worker's own, another program of the same
//! batch job — shrinks what the worker offers.
//!
//! Read from `/proc/self/cgroup` and the cgroup filesystem, both layouts:
//! v2 (`0::/path`, file `memory.max`) and v1 (the `memory` controller's
//! line, file `memory.limit_in_bytes`). A limit set on any ancestor applies
//! too, so every level from the process's cgroup up to the root is read and
//! the smallest limit wins. Inside a container the path named in
//! `/proc/self/cgroup` may not exist in the mounted tree (its root is the
//! container's cgroup): levels that do not exist are skipped, and the mount
//! root itself is read last.
//!
//! The root of the filesystem is a parameter so that tests can point it at
//! a fixture tree.

use std::path::{Path, PathBuf};

/// Limits at or above this mean "none" (cgroup v1 writes the largest page
/// multiple below 2^63).
const UNLIMITED: u64 = 1 << 60;

/// The memory limit of this process's cgroup, if any.
pub fn memory_limit() -> Option<u64> {
    binding_limit().map(|(limit, _)| limit)
}

/// The memory limit of this process's cgroup and the cgroup directory it
/// is set on (the memory domain this process shares with every other
/// process under it), if any.
pub fn binding_limit() -> Option<(u64, PathBuf)> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    binding_limit_in(Path::new("/sys/fs/cgroup"), &own)
}

/// The smallest memory limit along the cgroup paths named by `own` (the
/// text of `/proc/self/cgroup`) under the cgroup filesystem mounted at `root`.
#[cfg(test)]
pub fn memory_limit_in(root: &Path, own: &str) -> Option<u64> {
    binding_limit_in(root, own).map(|(limit, _)| limit)
}

/// [`memory_limit_in`], with the directory the smallest limit is set on.
pub fn binding_limit_in(root: &Path, own: &str) -> Option<(u64, PathBuf)> {
    let mut limits = Vec::new();
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            // v2: the unified tree, at the mount root itself or at
            // `unified` in a hybrid layout.
            for base in [root.to_path_buf(), root.join("unified")] {
                limits.extend(along(&base, path, "memory.max"));
            }
        } else if controllers.split(',').any(|c| c == "memory") {
            limits.extend(along(&root.join("memory"), path, "memory.limit_in_bytes"));
        }
    }
    limits.into_iter().min_by_key(|(limit, _)| *limit)
}

/// Limits in `file` at every level of `path` under `base`, the base
/// included, each with its directory.
fn along(base: &Path, path: &str, file: &str) -> Vec<(u64, PathBuf)> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    let mut dir = base.to_path_buf();
    dirs.push(dir.clone());
    for part in path.split('/').filter(|p| !p.is_empty() && *p != "..") {
        dir.push(part);
        dirs.push(dir.clone());
    }
    dirs.into_iter()
        .filter_map(|d| read_limit(&d.join(file)).map(|l| (l, d)))
        .collect()
}

/// What the processes of the cgroup at `dir` hold now that the kernel
/// could not simply drop: its usage less its inactive file pages (as
/// Kubernetes' "working set"). Anonymous memory, shared memory (memfds)
/// and recently used file pages count; v1 (`memory.usage_in_bytes`,
/// `total_inactive_file`) or v2 (`memory.current`, `inactive_file`).
pub fn working_set(dir: &Path) -> Option<u64> {
    let number = |file: &str| -> Option<u64> {
        std::fs::read_to_string(dir.join(file))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    let (usage, key) = match number("memory.current") {
        Some(current) => (current, "inactive_file"),
        None => (number("memory.usage_in_bytes")?, "total_inactive_file"),
    };
    let stat = std::fs::read_to_string(dir.join("memory.stat")).unwrap_or_default();
    let inactive = stat
        .lines()
        .find_map(|l| {
            l.strip_prefix(key)?
                .strip_prefix(' ')?
                .trim()
                .parse::<u64>()
                .ok()
        })
        .unwrap_or(0);
    Some(usage.saturating_sub(inactive))
}

/// One limit file: a number of bytes, or `max` / a huge number for none.
fn read_limit(file: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(file).ok()?;
    let value: u64 = text.trim().parse().ok()?; // "max" does not parse: no limit
    (value < UNLIMITED).then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn write(root: &Path, rel: &str, text: &str) {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    /// Slurm's cgroup v2 layout (cgroup/v2 plugin): the job's limit sits on
    /// the job level, the step and task below it have none.
    #[test]
    fn slurm_v2_job_limit_applies_to_its_task() {
        let root = tempfile::tempdir().unwrap();
        let job = "system.slice/slurmstepd.scope/job_42";
        write(root.path(), "memory.max", "max\n");
        write(
            root.path(),
            &format!("{job}/memory.max"),
            &format!("{}\n", 4 * GIB),
        );
        write(root.path(), &format!("{job}/step_0/memory.max"), "max\n");
        write(
            root.path(),
            &format!("{job}/step_0/user/task_0/memory.max"),
            "max\n",
        );
        let own = format!("0::/{job}/step_0/user/task_0\n");
        assert_eq!(memory_limit_in(root.path(), &own), Some(4 * GIB));
    }

    /// Slurm's cgroup v1 layout (task/cgroup): memory/slurm/uid_U/job_J/step_S.
    #[test]
    fn slurm_v1_step_limit_and_the_smallest_ancestor_wins() {
        let root = tempfile::tempdir().unwrap();
        let step = "slurm/uid_1000/job_7/step_batch";
        write(
            root.path(),
            "memory/memory.limit_in_bytes",
            "9223372036854771712\n",
        );
        write(
            root.path(),
            "memory/slurm/uid_1000/job_7/memory.limit_in_bytes",
            &format!("{}\n", 3 * GIB),
        );
        write(
            root.path(),
            &format!("memory/{step}/memory.limit_in_bytes"),
            &format!("{}\n", 2 * GIB),
        );
        let own = format!("12:pids:/{step}\n4:memory:/{step}\n1:name=systemd:/init.scope\n");
        assert_eq!(memory_limit_in(root.path(), &own), Some(2 * GIB));
    }

    /// The working set: usage less inactive file pages, v1 and v2 (each
    /// names its own keys; `inactive_file` in v1 is the cgroup's alone).
    #[test]
    fn working_set_is_usage_less_inactive_file_pages() {
        let v1 = tempfile::tempdir().unwrap();
        write(
            v1.path(),
            "memory.usage_in_bytes",
            &format!("{}\n", 300 << 20),
        );
        write(
            v1.path(),
            "memory.stat",
            &format!(
                "cache 1\ninactive_file 7\ntotal_rss 5\ntotal_inactive_file {}\n",
                100 << 20
            ),
        );
        assert_eq!(working_set(v1.path()), Some(200 << 20));
        let v2 = tempfile::tempdir().unwrap();
        write(v2.path(), "memory.current", &format!("{}\n", 300 << 20));
        write(
            v2.path(),
            "memory.stat",
            &format!("anon 5\nactive_file 9\ninactive_file {}\n", 50 << 20),
        );
        assert_eq!(working_set(v2.path()), Some(250 << 20));
        assert_eq!(working_set(&v2.path().join("gone")), None);
    }

    #[test]
    fn hybrid_layouts_containers_and_no_limit() {
        // Hybrid: v2 mounted at unified/, no memory controller there.
        let root = tempfile::tempdir().unwrap();
        write(root.path(), "unified/cgroup.controllers", "");
        write(
            root.path(),
            "memory/memory.limit_in_bytes",
            &format!("{}\n", GIB),
        );
        let own = "4:memory:/docker/abc\n0::/docker/abc\n";
        // The container's own path does not exist in its mounted tree: the
        // mount root's limit is the container's.
        assert_eq!(memory_limit_in(root.path(), own), Some(GIB));
        // No limit anywhere.
        let none = tempfile::tempdir().unwrap();
        write(none.path(), "memory.max", "max\n");
        assert_eq!(memory_limit_in(none.path(), "0::/user.slice\n"), None);
        assert_eq!(memory_limit_in(none.path(), "garbage\n\n::\n"), None);
    }
}
