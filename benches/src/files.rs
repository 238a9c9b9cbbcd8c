//! Data for a map: one shared directory shipped by content hash (`map
//! --dir DATA::/data:ro`) against the same data inlined in every input's
//! stdin, on two workers over loopback. Every job reads all of the data
//! (guest `bytes`) in both; what differs is how often it crosses the
//! network — once per worker, or once per input.

use std::time::Duration;

use crate::procs::{Worker, peerwasm, timed};
use crate::summary::Summary;
use crate::{Sizes, cores, median};

pub fn files(sizes: &Sizes, summary: &mut Summary) -> anyhow::Result<()> {
    let (mib, inputs) = (sizes.files_data_mib, sizes.files_inputs);
    println!(
        "\n## Files: a map of {inputs} inputs over {mib} MiB of data, two workers, median of {} runs",
        sizes.reps
    );
    let dir = tempfile::tempdir()?;
    let data_dir = dir.path().join("data");
    std::fs::create_dir(&data_dir)?;
    // Text without newlines, so that inlined it is one input line.
    let data: String = (0..mib << 20)
        .map(|i: usize| (b'a' + (i.wrapping_mul(2654435761) >> 13) as u8 % 26) as char)
        .collect();
    std::fs::write(data_dir.join("blob.txt"), &data)?;
    let shipped_inputs = dir.path().join("shipped.jsonl");
    std::fs::write(&shipped_inputs, "/data/blob.txt\n".repeat(inputs))?;
    let inline_inputs = dir.path().join("inline.jsonl");
    {
        use std::io::Write;
        let mut f = std::io::BufWriter::new(std::fs::File::create(&inline_inputs)?);
        for _ in 0..inputs {
            f.write_all(data.as_bytes())?;
            f.write_all(b"\n")?;
        }
    }
    let out = dir.path().join("out.jsonl");
    let bytes = peerwasm_testkit::guest_wasm("bytes");
    let slots = (cores() / 2).max(1);
    let w1 = Worker::start(slots, &dir.path().join("w1"), None)?;
    let w2 = Worker::start(slots, &dir.path().join("w2"), Some(&w1.addr))?;
    w1.wait_for_peers(2)?;
    let peers = format!("{},{}", w1.addr, w2.addr);
    let dir_arg = format!("{}::/data:ro", data_dir.display());
    let client_cache = dir.path().join("client");
    let map = |inputs_file: &std::path::Path, with_dir: bool| -> anyhow::Result<Duration> {
        let mut cmd = peerwasm();
        cmd.args(["map", "--no-progress", "--mem", "256MiB", "--peers", &peers])
            .arg("--cache-dir")
            .arg(&client_cache);
        if with_dir {
            cmd.args(["--dir", &dir_arg]);
        }
        let (_, took) = timed(cmd.arg("-o").arg(&out).arg(&bytes).arg(inputs_file))?;
        let results = std::fs::read_to_string(&out)?;
        let want = format!("\"bytes\":{}", mib << 20);
        anyhow::ensure!(
            results.lines().filter(|l| l.contains(&want)).count() == inputs,
            "a job did not read all the data"
        );
        Ok(took)
    };
    let received = || -> anyhow::Result<u64> {
        let mut total = 0;
        for w in [&w1, &w2] {
            total += metric(&w.addr)?;
        }
        Ok(total)
    };
    // The first shipped map sends the data; the later ones find it there.
    let first = map(&shipped_inputs, true)?;
    let sent_once = received()?;
    let shipped = median(
        (0..sizes.reps)
            .map(|_| map(&shipped_inputs, true))
            .collect::<anyhow::Result<Vec<_>>>()?,
    );
    let sent_after = received()?;
    map(&inline_inputs, false)?; // warm the module cache the same way
    let inline = median(
        (0..sizes.reps)
            .map(|_| map(&inline_inputs, false))
            .collect::<anyhow::Result<Vec<_>>>()?,
    );

    println!("| how | map time | data sent to workers |");
    println!("|---|---|---|");
    println!(
        "| `--dir`, first map (data sent) | {:.2} s | {:.0} MiB |",
        first.as_secs_f64(),
        sent_once as f64 / (1 << 20) as f64
    );
    println!(
        "| `--dir`, later maps (data there) | {:.2} s | {:.0} MiB more |",
        shipped.as_secs_f64(),
        (sent_after - sent_once) as f64 / (1 << 20) as f64
    );
    println!(
        "| data inlined in each input's stdin | {:.2} s | {} MiB |",
        inline.as_secs_f64(),
        mib * inputs
    );
    println!(
        "(inlined time ÷ `--dir` time: {:.1}× for the first map, {:.1}× for later maps)",
        inline.as_secs_f64() / first.as_secs_f64(),
        inline.as_secs_f64() / shipped.as_secs_f64()
    );
    summary.figure(
        "map over shared data: --dir vs inlined",
        format!(
            "inlined ÷ --dir time {:.1}× first map, {:.1}× later ({:.0} MiB sent vs {} MiB)",
            inline.as_secs_f64() / first.as_secs_f64(),
            inline.as_secs_f64() / shipped.as_secs_f64(),
            sent_once as f64 / (1 << 20) as f64,
            mib * inputs
        ),
        None,
    );
    Ok(())
}

/// Bytes of files a worker has received, from its `/metrics`.
fn metric(addr: &str) -> anyhow::Result<u64> {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(addr)?;
    conn.write_all(
        format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )?;
    let mut text = String::new();
    conn.read_to_string(&mut text)?;
    Ok(text
        .lines()
        .find(|l| l.starts_with("peerwasm_files_received_total{unit=\"bytes\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0) as u64)
}
