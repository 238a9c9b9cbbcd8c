//! CI's smoke run of the benchmark suite: `peerwasm-benches --quick` must
//! run every benchmark to the end (real workers, real jobs) and print each
//! table and the summary, so the suite cannot rot. It asserts nothing about
//! speed: that is what the full run is for.

use std::process::Command;

#[test]
fn the_quick_suite_runs_every_benchmark_and_prints_the_summary() {
    let out = Command::new(env!("CARGO_BIN_EXE_peerwasm-benches"))
        .arg("--quick")
        .output()
        .expect("running the suite");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the suite failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    for heading in [
        "## Dispatch",
        "## Latency",
        "## Trivial job",
        "## Compute: primes",
        "## Compute: memhog",
        "## Cache",
        "## Gossip",
        "## Footprint",
        "## Fairness",
        "## Files",
        "## Submit",
        "## Summary",
    ] {
        assert!(stdout.contains(heading), "no {heading:?} in:\n{stdout}");
    }
    // Every figure row of the summary has a number in it.
    let summary = stdout.split("## Summary").nth(1).unwrap();
    let rows: Vec<&str> = summary
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| what"))
        .collect();
    assert!(rows.len() >= 10, "too few summary rows:\n{summary}");
    for row in rows {
        assert!(
            row.chars().any(|c| c.is_ascii_digit()),
            "a summary row without a figure: {row}"
        );
    }
}

#[test]
fn an_unknown_benchmark_name_is_a_clear_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_peerwasm-benches"))
        .arg("dispatchh")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no benchmark named \"dispatchh\"") && stderr.contains("dispatch, latency"),
        "{stderr}"
    );
}
