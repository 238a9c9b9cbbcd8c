//! The batch-system seam ([`BatchSystem`]) and its Slurm implementation:
//! `sbatch` one worker per job, `scancel`, `squeue`. Another engine
//! (HTCondor, PBS, a Kubernetes Deployment's replicas) is another
//! implementation of the trait, not a change to the controller.

use std::process::Command;

use super::policy::Shape;

/// A batch job the controller submitted, as the batch system reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchJob {
    pub id: String,
    /// `PENDING`, `RUNNING`, `COMPLETING`...
    pub state: String,
    /// Why it waits, if it does (`Resources`, `PartitionConfig`...).
    pub reason: String,
}

/// What the controller needs of a batch system.
pub trait BatchSystem: Send + Sync {
    /// Asks for one worker of `shape`; the job's id.
    fn submit(&self, shape: &Shape) -> anyhow::Result<String>;
    /// Ends a job (its worker drains).
    fn cancel(&self, id: &str) -> anyhow::Result<()>;
    /// The jobs this controller submitted that the system still knows.
    fn jobs(&self) -> anyhow::Result<Vec<BatchJob>>;
    /// Why `job`, waiting, will never start as it was asked (a limit or a
    /// dependency it can never meet), in words; `None` if it may yet. Such
    /// a job is cancelled and counted as refused, not as capacity coming.
    fn never_starts(&self, job: &BatchJob) -> Option<String> {
        let _ = job;
        None
    }
}

/// Slurm, through its commands.
#[derive(Clone, Debug)]
pub struct Slurm {
    /// The job name every worker job of this controller gets: how its jobs
    /// are found again (`squeue --name`).
    pub name: String,
    /// Site options passed to `sbatch` as they are (`--partition=...`,
    /// `--account=...`, `--qos=...`, `--time=...`, `--constraint=...`).
    pub sbatch_args: Vec<String>,
    /// The command each job runs: `peerwasm worker ...` (slots and memory
    /// follow the shape; the job's `--mem` is what the worker lends).
    pub worker_command: String,
}

impl Slurm {
    /// Checks that Slurm's commands are here and answer: a clear error at
    /// start, not a hang at the first decision.
    pub fn check(&self) -> anyhow::Result<()> {
        for cmd in ["sbatch", "squeue", "scancel"] {
            let out = Command::new(cmd).arg("--version").output().map_err(|e| {
                anyhow::anyhow!(
                    "`{cmd}` cannot be run ({e}): peerwasm adapt needs Slurm's commands on PATH"
                )
            })?;
            if !out.status.success() {
                anyhow::bail!(
                    "`{cmd} --version` failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
        }
        let out = Command::new("squeue")
            .args(["-h", "-o", "%i", "--name", &self.name])
            .output()?;
        if !out.status.success() {
            anyhow::bail!(
                "Slurm does not answer (`squeue` failed): {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }

    /// The `sbatch` arguments for one worker of `shape`.
    pub fn sbatch_args(&self, shape: &Shape) -> Vec<String> {
        let mut args = vec![
            "--parsable".to_string(),
            format!("--job-name={}", self.name),
            "--nodes=1".into(),
            "--ntasks=1".into(),
            format!("--cpus-per-task={}", shape.slots),
            format!("--mem={}M", shape.memory_bytes.div_ceil(1 << 20)),
            // SIGTERM 60 s before the walltime: the worker drains.
            "--signal=TERM@60".into(),
        ];
        args.extend(self.sbatch_args.iter().cloned());
        args.push(format!(
            "--wrap=exec {} --slots {}",
            self.worker_command, shape.slots
        ));
        args
    }
}

impl BatchSystem for Slurm {
    fn submit(&self, shape: &Shape) -> anyhow::Result<String> {
        let out = Command::new("sbatch")
            .args(self.sbatch_args(shape))
            .output()
            .map_err(|e| anyhow::anyhow!("cannot run sbatch: {e}"))?;
        if !out.status.success() {
            anyhow::bail!(
                "sbatch refused the worker job: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let id = String::from_utf8_lossy(&out.stdout)
            .trim()
            .split(';')
            .next()
            .unwrap_or_default()
            .to_string();
        if id.is_empty() || !id.chars().all(|c| c.is_ascii_digit() || c == '_') {
            anyhow::bail!(
                "sbatch answered no job id: {:?}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        Ok(id)
    }

    fn cancel(&self, id: &str) -> anyhow::Result<()> {
        // A job still waiting is simply removed. A running one gets SIGTERM
        // (its worker drains, then leaves). Each call filtered by state:
        // `scancel --signal` on a pending job does not fail, it retries
        // for about 95 s ("Job can not be altered now").
        let pending = Command::new("scancel")
            .args(["--state=PENDING", id])
            .output()?;
        let running = Command::new("scancel")
            .args(["--state=RUNNING", "--full", "--signal=TERM", id])
            .output()?;
        if !pending.status.success() && !running.status.success() {
            anyhow::bail!(
                "scancel {id} failed: {}",
                String::from_utf8_lossy(&running.stderr).trim()
            );
        }
        Ok(())
    }

    fn jobs(&self) -> anyhow::Result<Vec<BatchJob>> {
        let out = Command::new("squeue")
            .args(["-h", "--name", &self.name, "-o", "%i|%T|%r"])
            .output()?;
        if !out.status.success() {
            anyhow::bail!(
                "squeue failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(parse_squeue(&String::from_utf8_lossy(&out.stdout)))
    }

    fn never_starts(&self, job: &BatchJob) -> Option<String> {
        if job.state != "PENDING" {
            return None;
        }
        NEVER_STARTS
            .iter()
            .find(|(reason, _)| job.reason == *reason)
            .map(|(reason, why)| {
                format!(
                    "Slurm will never start it ({reason}: {why}); check the --sbatch options ({})",
                    if self.sbatch_args.is_empty() {
                        "none given".to_string()
                    } else {
                        self.sbatch_args.join(" ")
                    }
                )
            })
    }
}

/// Slurm's pending reasons that mean a job never starts as it was asked,
/// with what each means (squeue(1), JOB REASON CODES). Those that can pass
/// by themselves (`Resources`, `Priority`, limits of the jobs running now,
/// nodes down, a hold someone may release) are not here.
const NEVER_STARTS: &[(&str, &str)] = &[
    (
        "PartitionConfig",
        "it asks for more than its partition's nodes can give (nodes, cores or memory)",
    ),
    (
        "PartitionNodeLimit",
        "it asks for more nodes than its partition allows",
    ),
    (
        "PartitionTimeLimit",
        "its --time is over its partition's time limit",
    ),
    ("BadConstraints", "its constraints cannot be met"),
    (
        "DependencyNeverSatisfied",
        "a job it depends on ended in a way that never satisfies the dependency",
    ),
    ("InvalidAccount", "its account is not valid"),
    ("InvalidQOS", "its QOS is not valid"),
];

/// `squeue -o "%i|%T|%r"` lines as jobs.
pub fn parse_squeue(text: &str) -> Vec<BatchJob> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.trim().splitn(3, '|');
            let (id, state, reason) = (f.next()?, f.next()?, f.next().unwrap_or(""));
            (!id.is_empty()).then(|| BatchJob {
                id: id.into(),
                state: state.into(),
                reason: reason.trim().into(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_job_asks_for_its_shape_and_passes_the_sites_options() {
        let slurm = Slurm {
            name: "peerwasm-adapt-x".into(),
            sbatch_args: vec!["--partition=debug".into(), "--time=01:00:00".into()],
            worker_command: "peerwasm worker --pool-dir /p".into(),
        };
        let args = slurm.sbatch_args(&Shape {
            slots: 2,
            memory_bytes: 1536 << 20,
        });
        for a in [
            "--job-name=peerwasm-adapt-x",
            "--cpus-per-task=2",
            "--mem=1536M",
            "--partition=debug",
            "--time=01:00:00",
        ] {
            assert!(args.iter().any(|x| x == a), "{a} missing from {args:?}");
        }
        assert_eq!(
            args.last().unwrap(),
            "--wrap=exec peerwasm worker --pool-dir /p --slots 2"
        );
    }

    #[test]
    fn squeue_lines_read_as_jobs() {
        let jobs = parse_squeue("12|PENDING|Resources\n13|RUNNING|None\n\n");
        assert_eq!(jobs.len(), 2);
        assert_eq!(
            jobs[0],
            BatchJob {
                id: "12".into(),
                state: "PENDING".into(),
                reason: "Resources".into()
            }
        );
        assert_eq!(jobs[1].state, "RUNNING");
    }

    #[test]
    fn a_job_pending_for_a_reason_that_never_passes_is_told_apart() {
        let slurm = Slurm {
            name: "x".into(),
            sbatch_args: vec!["--nodes=9".into()],
            worker_command: "w".into(),
        };
        let job = |state: &str, reason: &str| BatchJob {
            id: "1".into(),
            state: state.into(),
            reason: reason.into(),
        };
        let why = slurm
            .never_starts(&job("PENDING", "PartitionConfig"))
            .unwrap();
        assert!(
            why.contains("PartitionConfig") && why.contains("--nodes=9"),
            "{why}"
        );
        assert!(
            slurm
                .never_starts(&job("PENDING", "DependencyNeverSatisfied"))
                .is_some()
        );
        for (state, reason) in [
            ("PENDING", "Resources"),
            ("PENDING", "Priority"),
            ("PENDING", "JobHeldUser"),
            ("RUNNING", "None"),
        ] {
            assert_eq!(slurm.never_starts(&job(state, reason)), None, "{reason}");
        }
    }
}
