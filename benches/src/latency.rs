//! Latency of one job as a user sees it: the whole `peerwasm run` command
//! for a trivial job whose compiled module is already cached, embedded and
//! on a remote worker (plain HTTP and TLS), against starting the native
//! program.

use std::process::Command;
use std::time::Duration;

use crate::procs::{Worker, loopback_tls, peerwasm, timed};
use crate::summary::Summary;
use crate::{Sizes, cores, ms, quantile};

pub fn latency(sizes: &Sizes, summary: &mut Summary) -> anyhow::Result<()> {
    let runs = sizes.latency_runs;
    println!("\n## Latency: `peerwasm run hello.wasm hi` (cached), whole command, {runs} runs");
    let dir = tempfile::tempdir()?;
    let hello = peerwasm_testkit::guest_wasm("hello");
    let cache = dir.path().join("client");
    let worker = Worker::start(cores(), &dir.path().join("worker"), None)?;
    let (tls_flags, ca) = loopback_tls(dir.path())?;
    let tls_flags: Vec<&str> = tls_flags.iter().map(String::as_str).collect();
    let tls_worker = Worker::start_with(
        "4GiB",
        cores(),
        &dir.path().join("tls-worker"),
        None,
        &tls_flags,
    )?;

    let sample = |cmd: &mut dyn FnMut() -> Command| -> anyhow::Result<Vec<Duration>> {
        timed(&mut cmd())?; // warm
        (0..runs)
            .map(|_| {
                let (out, took) = timed(&mut cmd())?;
                anyhow::ensure!(
                    out.stdout == b"hi\n",
                    "unexpected output {:?}",
                    String::from_utf8_lossy(&out.stdout)
                );
                Ok(took)
            })
            .collect()
    };
    let run_over = |peers: Option<&str>, ca: Option<&std::path::Path>| {
        let mut cmd = peerwasm();
        cmd.arg("run").arg("--cache-dir").arg(&cache);
        if let Some(p) = peers {
            cmd.args(["--peers", p]);
        }
        if let Some(ca) = ca {
            cmd.arg("--tls-ca").arg(ca);
        }
        cmd.arg(&hello).arg("hi");
        cmd
    };
    let run = |peers: Option<&str>| run_over(peers, None);
    let embedded = sample(&mut || run(None))?;
    let remote = sample(&mut || run(Some(&worker.addr)))?;
    let remote_tls = sample(&mut || run_over(Some(&tls_worker.addr), Some(&ca)))?;
    let native = sample(&mut || {
        let mut cmd = Command::new(peerwasm_testkit::guest_native("hello"));
        cmd.arg("hi");
        cmd
    })?;

    println!("| how | p50 ms | p99 ms |");
    println!("|---|---|---|");
    let mut p50s = Vec::new();
    for (how, t) in [
        ("embedded worker", embedded),
        ("remote worker (loopback)", remote),
        ("remote worker (loopback, TLS)", remote_tls),
        ("native program", native),
    ] {
        let (p50, p99) = (quantile(t.clone(), 0.5), quantile(t, 0.99));
        println!("| {how} | {:.1} | {:.1} |", ms(p50), ms(p99));
        p50s.push(p50);
    }
    summary.figure(
        "`peerwasm run`, cached trivial job, p50",
        format!(
            "{:.1} ms embedded, {:.1} ms remote, {:.1} ms remote over TLS (native program {:.1} ms)",
            ms(p50s[0]),
            ms(p50s[1]),
            ms(p50s[2]),
            ms(p50s[3])
        ),
        Some("Dask ~1 ms/task (in a running client); FieldTrip ~100 ms/job"),
    );
    Ok(())
}
