//! What `peerwasm worker` learns of the batch job it runs in: on Slurm
//! (`--slurm`), its job id (`SLURM_JOB_ID`) and the time it has left
//! (`squeue -o %L`: relative, so no time zone is read wrong).

use std::time::{Duration, SystemTime};

use crate::worker::lifetime::Lifetime;

/// The lifetime of this worker inside the Slurm job it runs in: its id and
/// when it ends, drained `drain_before` that.
pub fn slurm_lifetime(drain_before: Duration) -> anyhow::Result<Lifetime> {
    let Ok(job) = std::env::var("SLURM_JOB_ID") else {
        anyhow::bail!(
            "--slurm: SLURM_JOB_ID is not set; is this worker running inside a Slurm job (sbatch, srun)?"
        )
    };
    let out = std::process::Command::new("squeue")
        .args(["-h", "-j", &job, "-o", "%L"])
        .output()
        .map_err(|e| {
            anyhow::anyhow!("--slurm: cannot run squeue to learn the job's time left: {e}")
        })?;
    if !out.status.success() {
        anyhow::bail!(
            "--slurm: squeue failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let left = String::from_utf8_lossy(&out.stdout).trim().to_string();
    Ok(Lifetime {
        batch_job: Some(job),
        ends_at: parse_time_left(&left)?.map(|d| SystemTime::now() + d),
        drain_before,
    })
}

/// Slurm's time left (`%L`): `[days-]hours:minutes:seconds`,
/// `minutes:seconds`, or `UNLIMITED` / `NOT_SET` (no end: `None`).
pub fn parse_time_left(s: &str) -> anyhow::Result<Option<Duration>> {
    if matches!(s, "UNLIMITED" | "NOT_SET" | "INVALID" | "") {
        return Ok(None);
    }
    let bad = || anyhow::anyhow!("--slurm: cannot read squeue's time left {s:?}");
    let (days, rest) = match s.split_once('-') {
        Some((d, rest)) => (d.parse::<u64>().map_err(|_| bad())?, rest),
        None => (0, s),
    };
    let parts: Vec<u64> = rest
        .split(':')
        .map(|p| p.parse::<u64>().map_err(|_| bad()))
        .collect::<Result<_, _>>()?;
    let secs = match parts.as_slice() {
        [h, m, s] => h * 3600 + m * 60 + s,
        [m, s] => m * 60 + s,
        [s] => *s,
        _ => return Err(bad()),
    };
    Ok(Some(Duration::from_secs(days * 86_400 + secs)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurms_time_left_reads_in_every_form_it_prints() {
        let secs = |s| parse_time_left(s).unwrap().map(|d| d.as_secs());
        assert_eq!(secs("1-02:03:04"), Some(86_400 + 2 * 3600 + 3 * 60 + 4));
        assert_eq!(secs("02:03:04"), Some(2 * 3600 + 3 * 60 + 4));
        assert_eq!(secs("3:04"), Some(184));
        assert_eq!(secs("UNLIMITED"), None);
        assert_eq!(secs("NOT_SET"), None);
        assert!(parse_time_left("soon").is_err());
        assert!(parse_time_left("1:2:3:4").is_err());
    }
}
