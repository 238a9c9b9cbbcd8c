//! Durable submissions: the same map run attached (`map -o`) and detached
//! (`map --detach`, then `results` until the last one), on two workers,
//! and what the state database costs per result — committed in groups as
//! the owner does, and one commit (one `fsync`) per result for contrast.

use std::time::{Duration, Instant};

use peerwasm::proto::submission::SubmittedResult;
use peerwasm::proto::{JobResult, Outcome};
use peerwasm::worker::StateDb;

use crate::procs::{Worker, peerwasm, timed};
use crate::summary::Summary;
use crate::{Sizes, cores, median};

pub fn submit(sizes: &Sizes, summary: &mut Summary) -> anyhow::Result<()> {
    let n = sizes.submit_inputs;
    println!(
        "\n## Submit: a map of {n} short jobs, attached vs detached, two workers, median of {} runs",
        sizes.reps
    );
    let dir = tempfile::tempdir()?;
    let inputs = dir.path().join("in.jsonl");
    std::fs::write(
        &inputs,
        (0..n)
            .map(|i| format!("{{\"n\": {}}}\n", 1000 + i % 100))
            .collect::<String>(),
    )?;
    let out = dir.path().join("out.jsonl");
    let primes = peerwasm_testkit::guest_wasm("primes");
    let slots = (cores() / 2).max(1);
    let w1 = Worker::start(slots, &dir.path().join("w1"), None)?;
    let w2 = Worker::start(slots, &dir.path().join("w2"), Some(&w1.addr))?;
    w1.wait_for_peers(2)?;
    let peers = format!("{},{}", w1.addr, w2.addr);
    let check = |text: &str| -> anyhow::Result<()> {
        let lines = text.lines().count();
        anyhow::ensure!(lines == n, "{lines} results for {n} inputs");
        anyhow::ensure!(
            text.lines().all(|l| l.contains("\"count\":")),
            "a job failed"
        );
        Ok(())
    };
    let attached = || -> anyhow::Result<Duration> {
        let mut cmd = peerwasm();
        cmd.args([
            "map",
            "--no-progress",
            "--mem",
            "64MiB",
            "--peers",
            &peers,
            "-o",
        ])
        .arg(&out)
        .arg(&primes)
        .arg(&inputs);
        let (_, took) = timed(&mut cmd)?;
        check(&std::fs::read_to_string(&out)?)?;
        Ok(took)
    };
    let detached = || -> anyhow::Result<Duration> {
        let start = Instant::now();
        let (submitted, _) = timed(
            peerwasm()
                .args(["map", "--detach", "--mem", "64MiB", "--peers", &w1.addr])
                .arg(&primes)
                .arg(&inputs),
        )?;
        let id = String::from_utf8_lossy(&submitted.stdout)
            .trim()
            .to_string();
        let (results, _) = timed(peerwasm().args(["results", "--peers", &w1.addr, &id]))?;
        let took = start.elapsed();
        check(&String::from_utf8_lossy(&results.stdout))?;
        timed(peerwasm().args(["cancel", "--peers", &w1.addr, &id]))?; // discard it
        Ok(took)
    };
    attached()?; // warm both workers' module caches
    let mut a = Vec::new();
    let mut d = Vec::new();
    for _ in 0..sizes.reps {
        a.push(attached()?);
        d.push(detached()?);
    }
    let (a, d) = (median(a), median(d));
    let rate = |t: Duration| n as f64 / t.as_secs_f64();
    println!("| how | time to the last result | jobs/s |");
    println!("|---|---|---|");
    println!(
        "| attached: `map -o OUT` | {:.2} s | {:.0} |",
        a.as_secs_f64(),
        rate(a)
    );
    println!(
        "| detached: `map --detach`, then `results ID` | {:.2} s | {:.0} |",
        d.as_secs_f64(),
        rate(d)
    );
    let ratio = rate(d) / rate(a);
    println!("(detached ÷ attached throughput: {ratio:.2}×)");
    summary.goal(
        "detached map vs attached, same inputs",
        format!("{ratio:.2}× ({:.0} vs {:.0} jobs/s)", rate(d), rate(a)),
        "≥ 0.8×",
        ratio >= 0.8,
        None,
    );

    // The database alone: results as the owner stores them.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (grouped, each) = runtime.block_on(commit_costs(dir.path(), sizes.submit_commits))?;
    println!(
        "\n| state database, {} results of a short job | per result |",
        sizes.submit_commits
    );
    println!("|---|---|");
    println!(
        "| queued, committed in groups (what the owner does) | {:.1} µs |",
        grouped.as_secs_f64() * 1e6
    );
    println!(
        "| one commit (fsync) per result | {:.1} µs |",
        each.as_secs_f64() * 1e6
    );
    summary.figure(
        "state database: commit cost per result",
        format!(
            "{:.1} µs grouped, {:.0} µs alone",
            grouped.as_secs_f64() * 1e6,
            each.as_secs_f64() * 1e6
        ),
        None,
    );
    Ok(())
}

/// Time per result stored grouped (queued, then one sync) and one commit
/// each, in a fresh state database under `dir`.
async fn commit_costs(dir: &std::path::Path, n: usize) -> anyhow::Result<(Duration, Duration)> {
    let db = StateDb::open(&dir.join("bench-state"))?;
    let mut result = JobResult::never_ran(64 << 20, Outcome::Exited { code: 0 });
    result.stdout = br#"{"count":168}"#.to_vec();
    result.peer = "127.0.0.1:7070".into();
    let blob = postcard_blob(&result)?;
    let insert = |sub: &'static str, i: usize, blob: Vec<u8>| {
        move |c: &rusqlite::Connection| {
            c.execute(
                "INSERT INTO results (submission, idx, ok, peak, item) VALUES (?1, ?2, 1, 0, ?3)",
                (sub, i as i64, blob),
            )
            .map(drop)
        }
    };
    let start = Instant::now();
    for i in 0..n {
        db.write_later(insert("grouped", i, blob.clone()));
    }
    db.sync().await?;
    let grouped = start.elapsed() / n as u32;
    let alone_n = (n / 10).max(10);
    let start = Instant::now();
    for i in 0..alone_n {
        db.write(insert("alone", i, blob.clone())).await?;
    }
    let each = start.elapsed() / alone_n as u32;
    Ok((grouped, each))
}

fn postcard_blob(result: &JobResult) -> anyhow::Result<Vec<u8>> {
    let item = SubmittedResult {
        index: 0,
        attempts: 1,
        result: result.clone(),
    };
    Ok(postcard::to_allocvec(&item)?)
}
