//! Files to and from remote jobs by content hash (`--dir` with `--peers`,
//! `map --dir`, `--out-dir`), against real worker processes: the same
//! answers as the embedded worker, a shared directory sent once per worker,
//! files coming back, and trees that try to leave their root refused.

use std::path::Path;
use std::process::{Command, Output};

use peerwasm::proto::tree::{EntryKind, FileHash, Manifest, TreeEntry, TreeGrant};
use peerwasm::proto::{JobSpec, ModuleHash, Outcome};

use crate::support::WorkerProcess;

fn peerwasm(args: &[&str], cache: &Path) -> Output {
    Command::new(crate::support::PEERWASM)
        .args(args)
        .arg("--cache-dir")
        .arg(cache)
        .output()
        .unwrap()
}

/// `peerwasm run [--peers P] ARGS... MODULE JOB_ARGS...`.
fn run(
    peers: Option<&str>,
    flags: &[String],
    module: &Path,
    job_args: &[&str],
    cache: &Path,
) -> Output {
    let mut cmd = Command::new(crate::support::PEERWASM);
    cmd.arg("run").arg("--cache-dir").arg(cache);
    if let Some(p) = peers {
        cmd.args(["--peers", p]);
    }
    cmd.args(flags).arg(module).args(job_args).output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Bytes of files a worker has received (`/metrics`).
fn received_bytes(addr: &str) -> u64 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(received_bytes_async(&crate::support::http(), addr))
}

mod escapes;

/// A remote job reads a shipped directory and writes into another; the
/// files it wrote come back into the host directory, as the embedded
/// worker's job writes them in place.
#[test]
fn a_remote_job_reads_a_shipped_dir_and_its_files_come_back_as_embedded() {
    let w = WorkerProcess::start("1GiB", 1, None);
    // And one whose jobs run in slot processes.
    let ws = WorkerProcess::start_with("1GiB", 1, None, &["--slot-processes", "always"]);
    let cache = tempfile::tempdir().unwrap();
    let input = tempfile::tempdir().unwrap();
    std::fs::write(input.path().join("a.txt"), "alpha\n").unwrap();
    std::fs::write(input.path().join("b.txt"), "beta\n").unwrap();
    let module = peerwasm_testkit::guest_wasm("files");
    let mut outs = Vec::new();
    for peers in [None, Some(w.addr.as_str()), Some(ws.addr.as_str())] {
        let out_dir = tempfile::tempdir().unwrap();
        std::fs::write(out_dir.path().join("untouched"), "kept").unwrap();
        let flags = [
            "--dir".to_string(),
            format!("{}::/in:ro", input.path().display()),
            "--dir".to_string(),
            format!("{}::/out", out_dir.path().display()),
        ];
        let out = run(peers, &flags, &module, &[], cache.path());
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert_eq!(text(&out.stdout), "copied 2 files\n");
        assert_eq!(
            std::fs::read_to_string(out_dir.path().join("a.txt")).unwrap(),
            "ALPHA\n"
        );
        assert_eq!(
            std::fs::read_to_string(out_dir.path().join("b.txt")).unwrap(),
            "BETA\n"
        );
        assert_eq!(
            std::fs::read_to_string(out_dir.path().join("untouched")).unwrap(),
            "kept"
        );
        outs.push(out_dir);
    }
    for addr in [&w.addr, &ws.addr] {
        assert_eq!(
            received_bytes(addr),
            6 + 5 + 4,
            "a.txt, b.txt and `untouched` were sent"
        );
    }
}

/// ripgrep, built for wasm32-wasip1 from its crates.io release, searches
/// a shipped directory on a remote worker and finds what it finds
/// embedded; a second run sends nothing.
#[test]
fn ripgrep_over_a_shipped_dir_gives_the_embedded_answer() {
    let rg = peerwasm_testkit::ripgrep_wasm();
    let w = WorkerProcess::start("2GiB", 1, None);
    let cache = tempfile::tempdir().unwrap();
    let docs = peerwasm_testkit::workspace_root().join("docs");
    let flags = ["--dir".to_string(), format!("{}::/docs:ro", docs.display())];
    let args = ["--sort", "path", "-c", "memory", "/docs"];
    let embedded = run(None, &flags, &rg, &args, cache.path());
    assert_eq!(
        embedded.status.code(),
        Some(0),
        "{}",
        text(&embedded.stderr)
    );
    assert!(
        text(&embedded.stdout).lines().count() >= 3,
        "{}",
        text(&embedded.stdout)
    );
    let remote = run(Some(&w.addr), &flags, &rg, &args, cache.path());
    assert_eq!(remote.status.code(), Some(0), "{}", text(&remote.stderr));
    assert_eq!(text(&remote.stdout), text(&embedded.stdout));
    let sent = received_bytes(&w.addr);
    assert!(sent > 0);
    let again = run(Some(&w.addr), &flags, &rg, &args, cache.path());
    assert_eq!(text(&again.stdout), text(&embedded.stdout));
    assert_eq!(
        received_bytes(&w.addr),
        sent,
        "the second run sent files again"
    );
}

/// A 100 MB directory shared by a 200-input map on two workers crosses
/// the network once per worker, not once per input.
#[test]
fn a_shared_dir_is_sent_once_per_worker_for_a_whole_map() {
    let a = WorkerProcess::start("2GiB", 1, None);
    let b = WorkerProcess::start("2GiB", 1, Some(&a.addr));
    let cache = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let mut total = 0u64;
    for i in 0..4u64 {
        // Distinct contents, so no two files share a hash.
        let bytes: Vec<u8> = (0..25_000_000u64)
            .map(|j| (j.wrapping_mul(2654435761).wrapping_add(i) >> 7) as u8)
            .collect();
        total += bytes.len() as u64;
        std::fs::write(data.path().join(format!("part-{i}.bin")), bytes).unwrap();
    }
    let inputs = data.path().join("../inputs-shared.jsonl");
    std::fs::write(&inputs, "/data\n".repeat(200)).unwrap();
    // Both workers must be in the client's view before the map places.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let dir = format!("{}::/data:ro", data.path().display());
    let ls = peerwasm_testkit::guest_wasm("ls");
    let peers = format!("{},{}", a.addr, b.addr);
    let args = [
        "map",
        "--peers",
        &peers,
        "--no-progress",
        "--mem",
        "64MiB",
        "--dir",
        &dir,
        ls.to_str().unwrap(),
        inputs.to_str().unwrap(),
    ];
    let out = peerwasm(&args, cache.path());
    let _ = std::fs::remove_file(&inputs);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let lines: Vec<serde_json::Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 200);
    let expected = "/data/part-0.bin 25000000\n/data/part-1.bin 25000000\n/data/part-2.bin 25000000\n/data/part-3.bin 25000000\n";
    let mut per_peer = std::collections::HashMap::new();
    for l in &lines {
        assert_eq!(l["stdout"].as_str(), Some(expected), "{l}");
        *per_peer
            .entry(l["peer"].as_str().unwrap().to_string())
            .or_insert(0) += 1;
    }
    println!("jobs per worker: {per_peer:?}");
    for w in [&a, &b] {
        let got = received_bytes(&w.addr);
        match per_peer.get(&w.addr) {
            Some(_) => assert_eq!(got, total, "{} received {got} bytes for its jobs", w.addr),
            None => assert_eq!(got, 0),
        }
    }
    assert_eq!(
        per_peer.len(),
        2,
        "the map used one worker only: {per_peer:?}"
    );
}

/// `map --out-dir`: each input's files land in OUT_DIR/<index>/, and the
/// granted directory itself is left as it was.
#[test]
fn map_out_dir_gets_each_inputs_files() {
    let w = WorkerProcess::start("1GiB", 2, None);
    let cache = tempfile::tempdir().unwrap();
    let input = tempfile::tempdir().unwrap();
    std::fs::write(input.path().join("x.txt"), "ex\n").unwrap();
    let work = tempfile::tempdir().unwrap();
    let out_dir = tempfile::tempdir().unwrap();
    let inputs = out_dir.path().join("inputs.jsonl");
    std::fs::write(&inputs, "{}\n{}\n{}\n").unwrap();
    let (din, dout) = (
        format!("{}::/in:ro", input.path().display()),
        format!("{}::/out", work.path().display()),
    );
    let results = out_dir.path().join("results");
    let files = peerwasm_testkit::guest_wasm("files");
    let args = [
        "map",
        "--peers",
        &w.addr,
        "--no-progress",
        "--mem",
        "64MiB",
        "--dir",
        &din,
        "--dir",
        &dout,
        "--out-dir",
        results.to_str().unwrap(),
        files.to_str().unwrap(),
        inputs.to_str().unwrap(),
    ];
    let out = peerwasm(&args, cache.path());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    for i in 0..3 {
        assert_eq!(
            std::fs::read_to_string(results.join(i.to_string()).join("x.txt")).unwrap(),
            "EX\n"
        );
    }
    assert_eq!(
        std::fs::read_dir(work.path()).unwrap().count(),
        0,
        "the --dir itself was written to"
    );
    let first: serde_json::Value =
        serde_json::from_str(text(&out.stdout).lines().next().unwrap()).unwrap();
    assert_eq!(first["files"], serde_json::json!(["x.txt"]));

    // The embedded worker's jobs write in place: --out-dir is refused there.
    let args = [
        "map",
        "--no-progress",
        "--dir",
        &dout,
        "--out-dir",
        "/tmp/x",
        files.to_str().unwrap(),
        inputs.to_str().unwrap(),
    ];
    let out = peerwasm(&args, cache.path());
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--out-dir needs a pool"),
        "{}",
        text(&out.stderr)
    );
}

/// Files back beyond the worker's cap end the job naming the cap, and
/// nothing half-written lands in the directory.
#[test]
fn files_back_over_the_cap_are_named_and_none_are_written() {
    let w = WorkerProcess::start_with("1GiB", 1, None, &["--max-files-back", "1KiB"]);
    let cache = tempfile::tempdir().unwrap();
    let input = tempfile::tempdir().unwrap();
    std::fs::write(input.path().join("big.txt"), "z".repeat(2000)).unwrap();
    let out_dir = tempfile::tempdir().unwrap();
    let flags = [
        "--dir".to_string(),
        format!("{}::/in:ro", input.path().display()),
        "--dir".to_string(),
        format!("{}::/out", out_dir.path().display()),
    ];
    let out = run(
        Some(&w.addr),
        &flags,
        &peerwasm_testkit::guest_wasm("files"),
        &[],
        cache.path(),
    );
    assert_eq!(out.status.code(), Some(134), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains("come to 2.0 KiB, more than the 1 KiB") && err.contains("--max-files-back"),
        "{err}"
    );
    assert_eq!(std::fs::read_dir(out_dir.path()).unwrap().count(), 0);
}

/// A read-only tree is the worker's shared copy: a job cannot write to
/// it, and the next job sees it unchanged.
#[test]
fn a_read_only_tree_cannot_be_changed_by_its_job() {
    let w = WorkerProcess::start("1GiB", 1, None);
    let cache = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "alpha\n").unwrap();
    // `files` reads /in and writes /out: here both are the same read-only tree.
    let ro = format!("{}::/in:ro", dir.path().display());
    let ro_out = format!("{}::/out:ro", dir.path().display());
    let out = run(
        Some(&w.addr),
        &["--dir".into(), ro.clone(), "--dir".into(), ro_out],
        &peerwasm_testkit::guest_wasm("files"),
        &[],
        cache.path(),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("cannot write /out/a.txt"),
        "{}",
        text(&out.stderr)
    );
    let listed = run(
        Some(&w.addr),
        &["--dir".into(), ro],
        &peerwasm_testkit::guest_wasm("ls"),
        &["/in"],
        cache.path(),
    );
    assert_eq!(text(&listed.stdout), "/in/a.txt 6\n");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("a.txt")).unwrap(),
        "alpha\n"
    );
}

/// A writable tree is copied for its job and charged by what the copies
/// take — the stored files' real sizes, which must be what the manifest
/// says. (Before: one stored 4 MiB file listed under 64 names, each
/// declared 0 bytes, was copied 64 times, uncharged.)
#[tokio::test(flavor = "multi_thread")]
async fn a_writable_tree_is_charged_by_its_files_real_size_not_by_its_manifests_word() {
    let scratch = tempfile::tempdir().unwrap();
    let w = WorkerProcess::start_with(
        "1GiB",
        1,
        None,
        &[
            "--scratch-total",
            "64MiB",
            "--scratch-dir",
            scratch.path().to_str().unwrap(),
        ],
    );
    let http = crate::support::http();
    let data = vec![9u8; 4 << 20];
    let hash = FileHash::of(&data);
    let lying = Manifest {
        entries: (0..64)
            .map(|i| TreeEntry {
                path: format!("f{i:02}"),
                kind: EntryKind::File { hash, size: 0 },
            })
            .collect(),
    };
    let put = http
        .put(format!(
            "http://{}/v1/trees/{}",
            w.addr,
            lying.hash().to_hex()
        ))
        .body(lying.encode())
        .send()
        .await
        .unwrap();
    assert!(put.status().is_success(), "{}", put.status());
    let put = http
        .put(format!("http://{}/v1/files/{}", w.addr, hash.to_hex()))
        .body(data)
        .send()
        .await
        .unwrap();
    assert!(put.status().is_success(), "{}", put.status());
    let bytes = peerwasm_testkit::guest_wasm_bytes("ls");
    let mut spec = JobSpec::new(ModuleHash::of(&bytes));
    http.put(format!(
        "http://{}/v1/modules/{}",
        w.addr,
        spec.module.to_hex()
    ))
    .body(bytes)
    .send()
    .await
    .unwrap();
    spec.limits.memory = peerwasm::proto::MemoryRequest::from(64 << 20);
    spec.stdin = b"/d\n".to_vec();
    spec.trees = vec![TreeGrant {
        manifest: lying.hash(),
        guest: "/d".into(),
        read_only: false,
    }];
    let resp = http
        .post(format!("http://{}/v1/jobs", w.addr))
        .body(postcard::to_allocvec(&spec).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let res: peerwasm::proto::JobResult =
        postcard::from_bytes(&resp.bytes().await.unwrap()).unwrap();
    let why = res.outcome.to_string();
    assert!(
        why.contains("says \"f00\" has 0 bytes, but the file it names has 4194304"),
        "{why}"
    );
    // Nothing of it is left on the disk.
    let copies: u64 = walk_bytes(scratch.path());
    assert!(
        copies <= 5 << 20,
        "{copies} bytes under the scratch dir: only the stored file should be"
    );
}

/// Bytes of the regular files under `dir`.
fn walk_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| match e.file_type().unwrap() {
            t if t.is_dir() => walk_bytes(&e.path()),
            t if t.is_file() => e.metadata().unwrap().len(),
            _ => 0,
        })
        .sum()
}

async fn received_bytes_async(http: &reqwest::Client, addr: &str) -> u64 {
    let body = http
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    body.lines()
        .find(|l| l.starts_with("peerwasm_files_received_total{unit=\"bytes\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .map_or(0, |v| v.parse::<f64>().unwrap() as u64)
}
