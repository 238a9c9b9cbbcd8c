//! What a worker costs the machine that lends it: RSS idle, RSS while jobs
//! run (beyond their guests' own memory), and RSS after many jobs (a leak
//! would show as growth).

use std::time::{Duration, Instant};

use crate::Sizes;
use crate::procs::{Worker, peerwasm, timed};
use crate::summary::Summary;

const MIB: f64 = (1 << 20) as f64;

pub fn footprint(sizes: &Sizes, summary: &mut Summary) -> anyhow::Result<()> {
    let slots = 8;
    println!("\n## Footprint: a worker with {slots} slots");
    let dir = tempfile::tempdir()?;
    let worker = Worker::start(slots, &dir.path().join("worker"), None)?;
    std::thread::sleep(Duration::from_millis(500));
    let idle = worker.rss()?;
    let client = dir.path().join("client");
    let map = |guest: &str, inputs: String| -> anyhow::Result<std::process::Child> {
        let file = dir.path().join(format!("{guest}.jsonl"));
        std::fs::write(&file, inputs)?;
        Ok(peerwasm()
            .args([
                "map",
                "--mem",
                "16MiB",
                "--peers",
                &worker.addr,
                "-o",
                "/dev/null",
            ])
            .arg("--cache-dir")
            .arg(&client)
            .arg(peerwasm_testkit::guest_wasm(guest))
            .arg(file)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()?)
    };
    // Warm: compile `sleep` so the compiler's memory is not counted as a
    // job's.
    let mut warm = map("sleep", "1\n".into())?;
    anyhow::ensure!(warm.wait()?.success(), "warm-up failed");
    let after_compile = worker.rss()?;
    // `slots` jobs that sleep, all running at once: sample RSS.
    let mut running = map(
        "sleep",
        format!("{}\n", sizes.footprint_sleep_ms).repeat(slots),
    )?;
    let mut busy = 0;
    let start = Instant::now();
    while running.try_wait()?.is_none() && start.elapsed() < Duration::from_secs(30) {
        busy = busy.max(worker.rss()?);
        std::thread::sleep(Duration::from_millis(20));
    }
    anyhow::ensure!(running.wait()?.success(), "the sleep jobs failed");
    // The guest's own peak linear memory, for one job.
    let mut one = peerwasm();
    one.args(["run", "--json", "--peers", &worker.addr])
        .arg(peerwasm_testkit::guest_wasm("sleep"));
    let guest_peak = {
        let mut child = one
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()?;
        use std::io::Write;
        child.stdin.take().expect("piped").write_all(b"1\n")?;
        let out = child.wait_with_output()?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        v["peak_memory_bytes"]
            .as_u64()
            .ok_or_else(|| anyhow::anyhow!("no peak in {v}"))?
    };
    // What each running job adds, its guest's resident pages included (a
    // guest's linear memory is reserved in full but resident only where
    // touched).
    let per_job = (busy as f64 - after_compile as f64) / slots as f64;

    // Many trivial jobs: RSS before and after.
    let before_many = worker.rss()?;
    let inputs = dir.path().join("many.jsonl");
    std::fs::write(&inputs, "{}\n".repeat(sizes.footprint_jobs))?;
    let mut many = peerwasm();
    many.args(["map", "--peers", &worker.addr, "-o", "/dev/null"])
        .arg("--cache-dir")
        .arg(&client)
        .arg(peerwasm_testkit::guest_wasm("hello"))
        .arg(&inputs);
    timed(&mut many)?;
    let after_many = worker.rss()?;
    timed(&mut many)?;
    let after_twice = worker.rss()?;

    println!("| state | RSS MiB |");
    println!("|---|---|");
    println!("| idle, just started | {:.1} |", idle as f64 / MIB);
    println!(
        "| after compiling one module | {:.1} |",
        after_compile as f64 / MIB
    );
    println!("| {slots} jobs running (max) | {:.1} |", busy as f64 / MIB);
    println!(
        "| before {} trivial jobs | {:.1} |",
        sizes.footprint_jobs,
        before_many as f64 / MIB
    );
    println!("| after them | {:.1} |", after_many as f64 / MIB);
    println!(
        "| after {} more | {:.1} |",
        sizes.footprint_jobs,
        after_twice as f64 / MIB
    );
    println!(
        "RSS added per running job: {:.2} MiB, its guest's resident pages included (linear memory {:.1} MiB)",
        per_job / MIB,
        guest_peak as f64 / MIB
    );
    summary.figure(
        "worker footprint",
        format!(
            "{:.0} MiB idle; +{:.2} MiB per running job (guest included); {:+.1} MiB over {} more jobs",
            idle as f64 / MIB,
            per_job / MIB,
            (after_twice as f64 - after_many as f64) / MIB,
            sizes.footprint_jobs
        ),
        None,
    );
    Ok(())
}
