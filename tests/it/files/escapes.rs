//! Trees that try to leave their root, or their limits, are refused.

use super::*;

/// What a hostile client could send is refused with a clear 4xx, and the
/// client refuses to ship a link that points out of the directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trees_that_leave_their_root_or_their_limits_are_refused() {
    let w = WorkerProcess::start_with("1GiB", 1, None, &["--file-store", "1MiB"]);
    let http = crate::support::http();
    let put_tree = |m: &Manifest| {
        let (hash, body) = (m.hash(), m.encode());
        http.put(format!("http://{}/v1/trees/{}", w.addr, hash.to_hex()))
            .body(body)
            .send()
    };
    let file = |path: &str, size: u64| TreeEntry {
        path: path.into(),
        kind: EntryKind::File {
            hash: FileHash::of(path.as_bytes()),
            size,
        },
    };
    for (entries, why) in [
        (
            vec![file("../../etc/cron.d/x", 1)],
            "nothing may leave the tree",
        ),
        (vec![file("/etc/passwd", 1)], "is absolute"),
        (vec![file("a/./b", 1)], "nothing may leave the tree"),
        (vec![file("b", 1), file("a", 1)], "not sorted"),
    ] {
        let resp = put_tree(&Manifest { entries }).await.unwrap();
        assert_eq!(resp.status(), 400);
        let body = resp.text().await.unwrap();
        assert!(body.contains(why), "{body}");
    }
    let resp = put_tree(&Manifest {
        entries: vec![file("big", 2 << 20)],
    })
    .await
    .unwrap();
    assert_eq!(resp.status(), 413);
    assert!(
        resp.text()
            .await
            .unwrap()
            .contains("accepts trees of at most 1 MiB")
    );
    // A manifest under another's name; a file whose bytes are not its name.
    let m = Manifest {
        entries: vec![file("a", 1)],
    };
    let resp = http
        .put(format!(
            "http://{}/v1/trees/{}",
            w.addr,
            ModuleHash::of(b"x").to_hex()
        ))
        .body(m.encode())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let resp = http
        .put(format!(
            "http://{}/v1/files/{}",
            w.addr,
            FileHash::of(b"promised").to_hex()
        ))
        .body("other")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    assert_eq!(received_bytes_async(&http, &w.addr).await, 0);

    // A job naming a tree the worker lacks: 424, send it first.
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
    spec.trees = vec![TreeGrant {
        manifest: m.hash(),
        guest: "/d".into(),
        read_only: true,
    }];
    let resp = http
        .post(format!("http://{}/v1/jobs", w.addr))
        .body(postcard::to_allocvec(&spec).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 424);
    // Host paths are never taken from a remote client: a spec naming one
    // arrives without it (it is not on the wire), and its job sees nothing
    // of the worker's host.
    spec.trees.clear();
    spec.dirs = vec![peerwasm::proto::DirGrant {
        host: "/".into(),
        guest: "/".into(),
        read_only: true,
    }];
    spec.stdin = b"/etc\n".to_vec();
    let resp = http
        .post(format!("http://{}/v1/jobs", w.addr))
        .body(postcard::to_allocvec(&spec).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let res: peerwasm::proto::JobResult =
        postcard::from_bytes(&resp.bytes().await.unwrap()).unwrap();
    assert_eq!(
        res.outcome,
        Outcome::Exited { code: 1 },
        "{}",
        String::from_utf8_lossy(&res.stdout)
    );
    assert!(String::from_utf8_lossy(&res.stderr).contains("cannot list /etc"));
    // Still serving.
    spec.dirs.clear();
    spec.stdin = b"/tmp\n".to_vec(); // its scratch directory
    let resp = http
        .post(format!("http://{}/v1/jobs", w.addr))
        .body(postcard::to_allocvec(&spec).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let res: peerwasm::proto::JobResult =
        postcard::from_bytes(&resp.bytes().await.unwrap()).unwrap();
    assert_eq!(res.outcome, Outcome::Exited { code: 0 });

    // The client: a link out of the directory is not followed.
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "key").unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret"), dir.path().join("leak")).unwrap();
    let cache = tempfile::tempdir().unwrap();
    let flags = [
        "--dir".to_string(),
        format!("{}::/d:ro", dir.path().display()),
    ];
    let out = run(
        Some(&w.addr),
        &flags,
        &peerwasm_testkit::guest_wasm("ls"),
        &["/d"],
        cache.path(),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("leak is a symbolic link to"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(received_bytes_async(&http, &w.addr).await, 0);
}
