//! The module cache with a multi-MB module: the first job compiles it, a
//! repeated job finds it in memory, a new worker on the same cache
//! directory loads the artifact from disk. Measured in-process (the job's
//! own wall time around it) and as whole `peerwasm run` commands against a
//! worker that is restarted.

use std::time::Instant;

use peerwasm::proto::{CacheSource, JobSpec};
use peerwasm::runner::{JobRunner, RunnerConfig};
use peerwasm::sandbox::SandboxConfig;

use crate::procs::{Worker, peerwasm, timed};
use crate::summary::Summary;
use crate::{Sizes, cores, ms};

/// A valid WASI command of `functions` functions of arithmetic, called in
/// a chain from `_start`: a module of several MB that takes seconds to
/// compile and microseconds to run.
pub fn big_module(functions: usize) -> anyhow::Result<Vec<u8>> {
    let mut wat = String::from("(module\n");
    for i in 0..functions {
        let next = if i + 1 < functions {
            format!("local.get 0 call $f{}", i + 1)
        } else {
            "local.get 0".into()
        };
        let mut body = String::new();
        for k in 0..24 {
            body.push_str(&format!(
                " local.get 0 i32.const {} i32.mul i32.const {k} i32.xor local.set 0",
                i * 31 + k
            ));
        }
        // Only every 64th function calls on, so the chain stays shallow.
        let call = if i % 64 == 0 {
            next
        } else {
            "local.get 0".into()
        };
        wat.push_str(&format!(
            "(func $f{i} (param i32) (result i32){body} {call})\n"
        ));
    }
    wat.push_str("(func (export \"_start\") i32.const 7 call $f0 drop))\n");
    Ok(wat::parse_str(&wat)?)
}

pub fn cache(sizes: &Sizes, summary: &mut Summary) -> anyhow::Result<()> {
    let bytes = big_module(sizes.big_module_functions)?;
    let mb = bytes.len() as f64 / 1e6;
    println!(
        "\n## Cache: a {mb:.1} MB module ({} functions)",
        sizes.big_module_functions
    );
    let dir = tempfile::tempdir()?;

    // In-process: the job's wall time, which includes getting the module.
    let config = || RunnerConfig {
        sandbox: SandboxConfig {
            slots: cores(),
            cache_dir: Some(dir.path().join("inproc")),
            ..SandboxConfig::default()
        },
        ..RunnerConfig::default()
    };
    let timed_job = |runner: &JobRunner, expect: CacheSource| -> anyhow::Result<f64> {
        let hash = runner.add_module(bytes.clone());
        let start = Instant::now();
        let res = runner.run_blocking(JobSpec::new(hash));
        let took = ms(start.elapsed());
        anyhow::ensure!(
            res.outcome.is_success(),
            "the big module failed: {}",
            res.outcome
        );
        anyhow::ensure!(
            res.cache == expect,
            "expected a {expect:?}, got {:?}",
            res.cache
        );
        Ok(took)
    };
    let first = JobRunner::new(config())?;
    let compile = timed_job(&first, CacheSource::Compiled)?;
    let memory = timed_job(&first, CacheSource::Memory)?;
    drop(first);
    let disk = timed_job(&JobRunner::new(config())?, CacheSource::Disk)?;

    // Whole commands against a worker process that is restarted.
    let big = dir.path().join("big.wasm");
    std::fs::write(&big, &bytes)?;
    let worker_cache = dir.path().join("worker");
    let run = |addr: &str| -> anyhow::Result<f64> {
        let mut cmd = peerwasm();
        cmd.args(["run", "--peers", addr]).arg(&big);
        Ok(ms(timed(&mut cmd)?.1))
    };
    let (cold, warm) = {
        let w = Worker::start(cores(), &worker_cache, None)?;
        (run(&w.addr)?, run(&w.addr)?)
    };
    let restarted = {
        let w = Worker::start(cores(), &worker_cache, None)?;
        run(&w.addr)?
    };

    println!("| job | in-process ms | `peerwasm run --peers` ms |");
    println!("|---|---|---|");
    println!("| first: compile | {compile:.1} | {cold:.1} (upload + compile) |");
    println!("| repeated: from memory | {memory:.2} | {warm:.1} |");
    println!(
        "| new worker: artifact from disk | {disk:.1} | {restarted:.1} (no upload: the artifact is enough) |"
    );
    println!(
        "compile / memory hit: {:.0}×; compile / disk hit: {:.0}×",
        compile / memory,
        compile / disk
    );
    summary.goal(
        format!("{mb:.1} MB module: repeated job / restarted worker"),
        format!("{memory:.2} ms / {disk:.1} ms (compile {compile:.0} ms)"),
        "never recompiles; disk load in ms",
        disk < compile / 5.0,
        None,
    );
    Ok(())
}
