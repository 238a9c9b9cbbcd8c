//! Dispatch throughput: trivial jobs through `peerwasm map`, the whole
//! command timed (process start, loading the compiled module, results
//! written), on (a) the embedded worker, (b) one worker over loopback HTTP,
//! and (b′) over TLS, (c) two workers; against (d) the sandbox alone in-process and (e) one
//! native process per input (`xargs -P cores`). Every configuration has as
//! many slots in all as the machine has cores, so they differ only in how
//! jobs reach the slots.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::procs::{Worker, loopback_tls, peerwasm, timed};
use crate::summary::Summary;
use crate::{Sizes, cores, median};

pub fn dispatch(sizes: &Sizes, summary: &mut Summary) -> anyhow::Result<()> {
    let jobs = sizes.dispatch_jobs;
    let cores = cores();
    println!(
        "\n## Dispatch: {jobs} trivial jobs (hello), median of {} runs, {cores} slots in all",
        sizes.reps
    );
    let dir = tempfile::tempdir()?;
    let inputs = dir.path().join("inputs.jsonl");
    std::fs::write(&inputs, "{}\n".repeat(jobs))?;
    let out = dir.path().join("out.jsonl");
    let hello = peerwasm_testkit::guest_wasm("hello");
    let client_cache = dir.path().join("client");

    // A map as a user runs it; fails unless every job succeeded and every
    // result was written.
    let map_over = |peers: Option<&str>, ca: Option<&Path>| -> anyhow::Result<Duration> {
        let mut cmd = peerwasm();
        cmd.arg("map")
            .arg("--cache-dir")
            .arg(&client_cache)
            .arg("-o")
            .arg(&out);
        match peers {
            Some(p) => cmd.args(["--peers", p]),
            None => cmd.args(["--slots", &cores.to_string()]),
        };
        if let Some(ca) = ca {
            cmd.arg("--tls-ca").arg(ca);
        }
        let (_, took) = timed(cmd.arg(&hello).arg(&inputs))?;
        let written = std::fs::read_to_string(&out)?.lines().count();
        anyhow::ensure!(
            written == jobs,
            "map wrote {written} results for {jobs} inputs"
        );
        Ok(took)
    };
    let map = |peers: Option<&str>| map_over(peers, None);
    let rate = |reps: &mut dyn FnMut() -> anyhow::Result<Duration>| -> anyhow::Result<f64> {
        reps()?; // warm: compile into the caches, learn the memory estimate
        let times = (0..sizes.reps)
            .map(|_| reps())
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(jobs as f64 / median(times).as_secs_f64())
    };

    let embedded = rate(&mut || map(None))?;
    let one = {
        let w = Worker::start(cores, &dir.path().join("w1"), None)?;
        rate(&mut || map(Some(&w.addr)))?
    };
    let one_tls = {
        let (flags, ca) = loopback_tls(dir.path())?;
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let w = Worker::start_with("4GiB", cores, &dir.path().join("w1"), None, &flags)?;
        rate(&mut || map_over(Some(&w.addr), Some(&ca)))?
    };
    let two = {
        let slots = (cores / 2).max(1);
        let w1 = Worker::start(slots, &dir.path().join("w1"), None)?;
        let _w2 = Worker::start(slots, &dir.path().join("w2"), Some(&w1.addr))?;
        w1.wait_for_peers(2)?;
        rate(&mut || map(Some(&w1.addr)))?
    };
    let in_process = crate::compute::in_process_rate(jobs)?;
    let native = native_rate(jobs, cores, dir.path())?;

    println!("| how | jobs/s | vs in-process | vs native processes |");
    println!("|---|---|---|---|");
    for (how, r) in [
        ("(a) `map`, embedded worker", embedded),
        ("(b) `map`, one worker over HTTP", one),
        ("(b′) `map`, one worker over HTTPS (TLS)", one_tls),
        ("(c) `map`, two workers over HTTP", two),
        ("(d) sandbox alone, in-process", in_process),
        ("(e) native process per input, `xargs -P`", native),
    ] {
        println!(
            "| {how} | {r:.0} | {:.2}× | {:.1}× |",
            r / in_process,
            r / native
        );
    }
    summary.goal(
        "dispatch over HTTP, one worker",
        format!("{one:.0} jobs/s ({:.1}× native processes)", one / native),
        "≥ 15,000 jobs/s (#17)",
        one >= 15_000.0,
        Some("Ray ~8,000 tasks/s pipelined; Slurm ~500 jobs/s; FieldTrip ~10 jobs/s"),
    );
    summary.figure(
        "dispatch, embedded worker",
        format!("{embedded:.0} jobs/s"),
        None,
    );
    summary.figure(
        "dispatch, one worker over TLS",
        format!("{one_tls:.0} jobs/s ({:.2}× plain HTTP)", one_tls / one),
        None,
    );
    summary.figure("dispatch, two workers", format!("{two:.0} jobs/s"), None);
    Ok(())
}

/// `jobs` runs of the native `hello`, `parallel` at a time, by `xargs -P`.
fn native_rate(jobs: usize, parallel: usize, dir: &Path) -> anyhow::Result<f64> {
    let hello = peerwasm_testkit::guest_native("hello");
    let list = dir.join("numbers");
    std::fs::write(
        &list,
        (0..jobs).map(|i| format!("{i}\n")).collect::<String>(),
    )?;
    let mut xargs = Command::new("xargs");
    xargs
        .arg("-a")
        .arg(&list)
        .args(["-n", "1", "-P", &parallel.to_string()])
        .arg(&hello);
    let (out, _) = timed(&mut xargs)?; // warm the page cache
    anyhow::ensure!(
        out.stdout.iter().filter(|&&b| b == b'\n').count() == jobs,
        "a native run failed"
    );
    let (_, took) = timed(&mut xargs)?;
    Ok(jobs as f64 / took.as_secs_f64())
}
