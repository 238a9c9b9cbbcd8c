//! Jobs in other languages: the C guest (`guest-examples/c/primes.c`, with
//! the C SDK `sdk/c/peerwasm.h`) gives the Rust guest's answers, errors and
//! exit codes, and runs under the same exact memory limit.

use peerwasm::client::{Job, MapConfig, MapItem, Target, map};
use peerwasm::proto::Outcome;

fn primes_job(path: std::path::PathBuf) -> Job {
    Job::from_file(path).unwrap()
}

async fn answers(target: &Target, job: &Job, inputs: &[&str]) -> Vec<(i32, String, String)> {
    let mut items: Vec<MapItem> = Vec::new();
    let config = MapConfig { keep_going: true, mem: Some(256 << 20), ..MapConfig::default() };
    map(target, job, inputs.iter().map(|i| i.as_bytes().to_vec()), &config, &mut items).await.unwrap();
    items
        .into_iter()
        .map(|i| {
            let r = i.result;
            (r.outcome.exit_code(), String::from_utf8_lossy(&r.stdout).into_owned(), String::from_utf8_lossy(&r.stderr).into_owned())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_c_guest_gives_the_rust_guests_answers() {
    let c = primes_job(peerwasm_testkit::guest_c_wasm("primes"));
    let rust = primes_job(peerwasm_testkit::guest_wasm("primes"));
    let target = Target::embedded(2).unwrap();
    let inputs = [
        r#"{"n": 0}"#,
        r#"{"n": 2}"#,
        r#"{"n": 10}"#,
        r#"{"n": 100}"#,
        "{\"n\": 1000003}\n",
        r#"{"n": 20000000}"#,
        r#"{"n": 5000000000}"#,
    ];
    let (from_c, from_rust) = (answers(&target, &c, &inputs).await, answers(&target, &rust, &inputs).await);
    for (i, ((c_code, c_out, c_err), (r_code, r_out, r_err))) in from_c.iter().zip(&from_rust).enumerate() {
        assert_eq!((c_code, c_out), (r_code, r_out), "input {}: {c_err} / {r_err}", inputs[i]);
        assert_eq!(c_err, r_err, "the same error for input {}", inputs[i]);
    }
    assert_eq!(from_c[3].1, "{\"count\":25}\n");
    assert_eq!(from_c[6].0, 1, "too large: the job's own failure");
    // Bad input is exit 2 in both, each naming what is wrong its own way.
    let bad = ["not json", r#"{"m": 3}"#];
    for (c, r) in answers(&target, &c, &bad).await.iter().zip(answers(&target, &rust, &bad).await) {
        assert_eq!((c.0, r.0), (2, 2));
        assert!(c.2.starts_with("error: input is not valid for this job: "), "{}", c.2);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_c_guest_runs_under_an_exact_memory_limit() {
    let c = primes_job(peerwasm_testkit::guest_c_wasm("primes"));
    let target = Target::embedded(1).unwrap();
    // The sieve holds n/2 bytes: 50,000,000 for n = 10^8.
    let ok = target.run(&c, c.spec(br#"{"n": 100000000}"#.to_vec(), 256 << 20)).await.unwrap();
    assert_eq!(ok.stdout, b"{\"count\":5761455}\n");
    assert!(
        ok.peak_memory_bytes >= 50_000_000 && ok.peak_memory_bytes < 50_000_000 + (2 << 20),
        "peak {} is the sieve and little else",
        ok.peak_memory_bytes
    );
    let oom = target.run(&c, c.spec(br#"{"n": 100000000}"#.to_vec(), 32 << 20)).await.unwrap();
    match oom.outcome {
        Outcome::MemoryLimitExceeded { limit, peak, requested } => {
            assert_eq!(limit, 32 << 20);
            assert!(peak <= limit && requested > limit, "{peak} {requested}");
        }
        other => panic!("expected the memory limit, got {other}"),
    }
    assert_eq!(oom.outcome.exit_code(), 137);
}
