//! `peerwasm adapt` on the real Slurm: growth and shrinkage for a map,
//! memory-shaped workers, a worker job killed mid-map, and one that Slurm
//! will never start.

use std::time::{Duration, Instant};

use super::{Cluster, Elastic, check_results, cluster, finished, pool_view, serial, until};

#[tokio::test(flavor = "multi_thread")]
async fn adapt_grows_the_pool_for_a_map_and_shrinks_it_back_to_min() {
    let Some(cluster) = cluster() else { return };
    let _serial = serial().await;
    let mut pool = Elastic::start(
        cluster,
        "grow",
        &["--min", "1", "--max", "8", "--metrics", "127.0.0.1:0"],
    );
    until(
        Duration::from_secs(20),
        "the pool starts at --min 1",
        || pool.members() == 1,
        || pool.log(),
    )
    .await;
    let out = pool.dir.path().join("out.jsonl");
    let map = pool.map(&vec!["500".to_string(); 200], "64MiB", &out);
    let started = Instant::now();
    let mut most = 0;
    let grown = until(
        Duration::from_secs(15),
        "≥ 4 workers",
        || {
            most = most.max(pool.members());
            most >= 4
        },
        || pool.log(),
    )
    .await;
    eprintln!("slurm: grew to {most} workers {grown:?} after the map started");
    // What it does shows beside the pool, and as metrics.
    let status = cluster
        .cmd(crate::support::PEERWASM)
        .args(["status", "--pool-dir"])
        .arg(pool.pool())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&status.stdout);
    assert!(
        said.contains(&format!("grown by peerwasm adapt {}", pool.name))
            && said.contains("ago: growing by"),
        "{said}{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let log = pool.log();
    let url = log
        .split("metrics on ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no metrics address said: {log}"))
        .to_string();
    let metrics = crate::support::http()
        .get(&url)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let submitted: u64 = metrics
        .lines()
        .find(|l| l.starts_with("peerwasm_adapt_submitted_total"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no submitted_total: {metrics}"));
    assert!(submitted >= 4, "{metrics}");
    finished(map, Duration::from_secs(120));
    let took = started.elapsed();
    check_results(&out, 200);
    // 200 × 0.5 s is 100 slot-s: one worker alone would take 100 s.
    assert!(
        took < Duration::from_secs(60),
        "the map took {took:?}: the pool did not grow enough"
    );
    let idle = Instant::now();
    until(
        Duration::from_secs(25),
        "back to --min 1 worker",
        || cluster.running(&pool.name) == 1 && pool.members() == 1,
        || pool.log(),
    )
    .await;
    eprintln!(
        "slurm: back to 1 worker {:?} after the map ended; the map took {took:?}",
        idle.elapsed()
    );
    let log = pool.stop();
    assert!(
        log.contains("growing by") && log.contains("shrinking by"),
        "{log}"
    );
    assert!(
        log.contains("(0 without having run a job)"),
        "no worker job was cancelled unused: {log}"
    );
    until(
        Duration::from_secs(20),
        "stopping cancels its last job",
        || cluster.jobs(&pool.name).is_empty(),
        || pool.log(),
    )
    .await;
}

/// Every worker of `pool` (once one is in its view) lends its batch job's
/// `--mem` less the controller's `--overhead`, which adapt passes on to it:
/// the jobs it was sized for, and none of what its own processes take.
async fn lend_their_mem_less(cluster: &Cluster, pool: &Elastic<'_>, overhead_mib: u64) {
    let view = || pool_view(&pool.pool());
    until(
        Duration::from_secs(20),
        "a worker in the pool's view",
        || !view().is_empty(),
        || pool.log(),
    )
    .await;
    let jobs = cluster.jobs(&pool.name);
    for p in view() {
        let advert = &p["advert"];
        let job = advert["batch_job"].as_str().unwrap_or_default();
        let Some((_, _, mib)) = jobs.iter().find(|(id, _, _)| id == job) else {
            panic!("a worker of no job of the controller's: {advert}\n{jobs:?}");
        };
        assert_eq!(
            advert["capacity_bytes"].as_u64(),
            Some((mib - overhead_mib) << 20),
            "{advert}"
        );
    }
}

/// Waits until `pool`'s controller has asked Slurm for a worker.
async fn workers_asked(cluster: &Cluster, pool: &Elastic<'_>) {
    until(
        Duration::from_secs(20),
        "workers asked for",
        || !cluster.jobs(&pool.name).is_empty(),
        || pool.log(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn adapt_shapes_workers_for_the_memory_of_the_jobs_that_wait() {
    let Some(cluster) = cluster() else { return };
    let _serial = serial().await;
    // Both pools: from zero workers, up to two, each asked with 128 MiB
    // beside its jobs and at least 256 MiB.
    let start = |name: &str| {
        Elastic::start(
            cluster,
            name,
            &[
                "--min",
                "0",
                "--max",
                "2",
                "--overhead",
                "128MiB",
                "--min-mem",
                "256MiB",
            ],
        )
    };
    // Large jobs: workers sized for them.
    let pool = start("large");
    let out = pool.dir.path().join("large.jsonl");
    let map = pool.map(&vec!["500".to_string(); 6], "1GiB", &out);
    workers_asked(cluster, &pool).await;
    for (_, _, mib) in cluster.jobs(&pool.name) {
        assert!(
            (1024 + 128..=1024 + 128 + 64).contains(&mib),
            "a worker job for 1 GiB jobs asks for {mib} MiB: {}",
            pool.log()
        );
    }
    lend_their_mem_less(cluster, &pool, 128).await;
    finished(map, Duration::from_secs(90));
    check_results(&out, 6);
    drop(pool);
    // Small jobs: small workers, not large ones.
    let pool = start("small");
    let out = pool.dir.path().join("small.jsonl");
    let map = pool.map(&vec!["300".to_string(); 20], "64MiB", &out);
    workers_asked(cluster, &pool).await;
    for (_, _, mib) in cluster.jobs(&pool.name) {
        assert_eq!(
            mib,
            256,
            "a worker job for 64 MiB jobs asks for the least (--min-mem): {}",
            pool.log()
        );
    }
    finished(map, Duration::from_secs(90));
    check_results(&out, 20);
    // A job larger than any worker the controller may ask for fails at once.
    let err = pool
        .map(
            &["100".to_string()],
            "80GiB",
            &pool.dir.path().join("huge.jsonl"),
        )
        .wait_with_output()
        .unwrap();
    assert!(!err.status.success());
    let said = String::from_utf8_lossy(&err.stderr);
    assert!(said.contains("no peer can hold a job of 80 GiB"), "{said}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_job_killed_by_slurm_mid_map_has_its_jobs_run_again() {
    let Some(cluster) = cluster() else { return };
    let _serial = serial().await;
    let pool = Elastic::start(cluster, "killed", &["--min", "3", "--max", "3"]);
    until(
        Duration::from_secs(20),
        "3 workers",
        || pool.members() == 3,
        || pool.log(),
    )
    .await;
    let out = pool.dir.path().join("out.jsonl");
    let map = pool.map(&vec!["500".to_string(); 60], "64MiB", &out);
    let lines = || std::fs::read_to_string(&out).map_or(0, |t| t.lines().count());
    until(
        Duration::from_secs(30),
        "10 results in",
        || lines() >= 10,
        || pool.log(),
    )
    .await;
    // Slurm kills one worker's job outright (as an OOM kill or preemption
    // would): no drain, its running jobs are lost with it.
    let (victim, _, _) = cluster
        .jobs(&pool.name)
        .into_iter()
        .find(|(_, s, _)| s == "RUNNING")
        .unwrap();
    cluster.run("scancel", &["--full", "--signal=KILL", &victim]);
    let said = finished(map, Duration::from_secs(120));
    check_results(&out, 60);
    assert!(
        said.contains("lost"),
        "the map says it lost jobs with the worker: {said}"
    );
    // The controller says so and brings the pool back to --min.
    until(
        Duration::from_secs(30),
        "a replacement worker",
        || {
            let jobs = cluster.jobs(&pool.name);
            jobs.len() == 3 && !jobs.iter().any(|(id, _, _)| *id == victim)
        },
        || pool.log(),
    )
    .await;
    let log = pool.log();
    assert!(log.contains("ended by itself"), "{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_job_slurm_will_never_start_is_cancelled_said_and_asked_again_ever_more_slowly() {
    let Some(cluster) = cluster() else { return };
    let _serial = serial().await;
    // A job that failed, and worker jobs that may start only after it
    // succeeded: accepted, then pending forever (DependencyNeverSatisfied) —
    // capacity that never comes.
    let failed = cluster
        .run(
            "sbatch",
            &["--parsable", "--output=/dev/null", "--wrap", "exit 1"],
        )
        .trim()
        .to_string();
    until(
        Duration::from_secs(20),
        "the job meant to fail ended",
        || {
            cluster
                .run("squeue", &["-h", "-j", &failed, "-o", "%i"])
                .trim()
                .is_empty()
        },
        String::new,
    )
    .await;
    let dependency = format!("--sbatch=--dependency=afterok:{failed}");
    let mut pool = Elastic::start(cluster, "never", &["--min", "1", "--max", "2", &dependency]);
    until(
        Duration::from_secs(20),
        "two worker jobs found never to start",
        || pool.log().matches("will never start").count() >= 2,
        || pool.log(),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let log = pool.stop();
    assert!(
        log.contains("DependencyNeverSatisfied")
            && log.contains(dependency.trim_start_matches("--sbatch=")),
        "says why, naming the option: {log}"
    );
    // Asked again, but backing off (1 s, 2 s, 4 s, ...): no
    // submit-and-cancel loop every poll.
    let submitted = log.matches("submitted a worker job").count();
    assert!(
        (2..=6).contains(&submitted),
        "{submitted} submissions in ~10 s of polls every 500 ms: {log}"
    );
    assert!(
        log.contains(" refused by Slurm") && !log.contains(" 0 refused by Slurm"),
        "{log}"
    );
    until(
        Duration::from_secs(10),
        "none of its jobs left in the queue",
        || cluster.jobs(&pool.name).is_empty(),
        || pool.log(),
    )
    .await;
}
