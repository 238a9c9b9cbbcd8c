//! What a worker lends of its Slurm allocation: the job's `--mem` less
//! what its own processes take in the job's cgroup (`--overhead`), and
//! less again when something else in the allocation takes more (the
//! cgroup's working set) — so that no job it takes can push the cgroup past
//! its limit, where the kernel kills the largest process: the worker.

use std::process::{Command, Stdio};
use std::time::Duration;

use super::{cluster, guest, job_log, members_in, pool_view, serial, until, write_stdin};
use crate::support::PEERWASM;

/// A worker lends its Slurm job's `--mem` less its own overhead: its
/// process is in the job's cgroup beside the jobs, so a job as large as the
/// worker offers, run inside the worker's own process, ends well rather
/// than pushing the cgroup past its limit (where the kernel kills the
/// worker, as it did when the whole limit was lent); a job larger than
/// that is refused in words before it is sent.
#[tokio::test(flavor = "multi_thread")]
async fn a_worker_lends_its_allocation_less_its_own_memory_and_survives_its_largest_job() {
    let Some(cluster) = cluster() else { return };
    let _serial = serial().await;
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("pool");
    let name = format!("pwtest-overhead-{}", std::process::id());
    // Beside the worker, a program of the same batch job that takes 60 MiB
    // when told to (`go`).
    let go = dir.path().join("go");
    let wrap = format!(
        "--wrap=(while [ ! -e {go} ]; do sleep 0.1; done; exec python3 -c 'import time; b = bytearray(60 << 20); time.sleep(300)') & \
         exec {PEERWASM} worker --listen 0.0.0.0:0 --advertise \"$SLURMD_NODENAME\" --pool-dir {} --slurm --slots 1 --slot-processes never",
        pool.display(),
        go = go.display()
    );
    let id = cluster.sbatch_wrap(&name, &["--mem=160M"], dir.path(), &wrap);
    let log = || job_log(dir.path(), &id);
    until(
        Duration::from_secs(20),
        "the worker joins",
        || members_in(&pool) == 1,
        log,
    )
    .await;
    let read_advert = || {
        pool_view(&pool)
            .first()
            .map(|p| p["advert"].clone())
            .unwrap_or_default()
    };
    let advert = read_advert();
    // 160 MiB less the default overhead of one slot (36 MiB) and one job's
    // native memory (12 MiB).
    const MIB: u64 = 1 << 20;
    assert_eq!(
        advert["capacity_bytes"].as_u64(),
        Some(124 * MIB),
        "{advert}"
    );
    let largest = advert["largest_fit_bytes"].as_u64().unwrap();
    assert_eq!(largest, 112 * MIB, "{advert}");
    let run = |mem: u64, hold: u64| {
        let child = Command::new(PEERWASM)
            .args(["run", "--pool-dir"])
            .arg(&pool)
            .args(["--mem", &format!("{}MiB", mem / MIB)])
            .arg(guest("hold"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        write_stdin(child, format!("500 {}", hold / MIB).as_bytes()).unwrap()
    };
    // The largest job it offers, touching all of it (the guest's own
    // memory is the rest of its limit).
    let o = run(largest, largest - 2 * MIB);
    assert!(
        o.status.success(),
        "the largest job offered runs: {}\n{}",
        String::from_utf8_lossy(&o.stderr),
        log()
    );
    // One the whole allocation would have held is refused in words.
    let o = run(148 * MIB, 146 * MIB);
    let said = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && said.contains("no peer can hold a job of 148 MiB"),
        "{said}"
    );
    // The worker is still there, and was never near its limit.
    assert_eq!(members_in(&pool), 1, "{}", log());
    assert!(!log().contains("oom-kill"), "{}", log());
    // The other program takes 60 MiB of the allocation: the worker offers
    // no more than what is left beside it and the worker's own processes
    // (the cgroup's free memory, read every second) — was 112 MiB.
    std::fs::write(&go, "").unwrap();
    let mut fits = 0;
    until(
        Duration::from_secs(15),
        "the offer shrinks to what the other program left",
        || {
            fits = read_advert()["largest_fit_bytes"]
                .as_u64()
                .unwrap_or(u64::MAX);
            fits < (160 - 60 - 12) * MIB
        },
        log,
    )
    .await;
    eprintln!(
        "slurm: the worker offers {} MiB beside a 60 MiB program",
        fits / MIB
    );
    let o = run(32 * MIB, 30 * MIB);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(cluster.running(&name), 1);
    cluster.run("scancel", &[&id]);
    until(
        Duration::from_secs(20),
        "scancel ends the worker",
        || cluster.jobs(&name).is_empty(),
        log,
    )
    .await;
}
