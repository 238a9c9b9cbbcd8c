//! What is refused before anything is sent: a token in clear off
//! loopback (by the worker at start and by the client), a key file others
//! can read (made private), a CA file that is missing (named).

use super::*;

#[test]
fn tokens_in_clear_off_loopback_are_refused_by_the_worker_and_by_the_client() {
    let tenants = tenants_file(1, 1);
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("pool.key");
    std::fs::write(&key, [7u8; 32]).unwrap();
    let worker = |extra: &[&str]| {
        let mut cmd = Command::new(PEERWASM);
        cmd.args([
            "worker",
            "--listen",
            "0.0.0.0:0",
            "--tenants",
            tenants.path().to_str().unwrap(),
        ])
        .args([
            "--cluster-key",
            key.to_str().unwrap(),
            "--cache-dir",
            dir.path().to_str().unwrap(),
        ])
        .args(["--state-dir", dir.path().join("state").to_str().unwrap()])
        .args(extra);
        cmd
    };
    let out = crate::support::output_within(&mut worker(&[]), b"", Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("--insecure-http") && text(&out).contains("tls init"),
        "{}",
        text(&out)
    );
    // Told to, it starts.
    let (child, addr) = spawn_worker(
        worker(&["--insecure-http"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null()),
    );
    let _w = KillOnDrop(child);
    assert!(addr.starts_with("0.0.0.0:"), "{addr}");

    // A client refuses before it sends anything (`.invalid` never resolves:
    // nothing leaves this machine either way).
    let guest = peerwasm_testkit::guest_wasm("hello");
    for args in [
        vec![
            "run",
            "--peers",
            "pool-node.invalid:7070",
            "--token",
            ALICE,
            guest.to_str().unwrap(),
        ],
        vec![
            "jobs",
            "--peers",
            "pool-node.invalid:7070",
            "--token",
            ALICE,
        ],
        vec![
            "peers",
            "--peers",
            "pool-node.invalid:7070",
            "--token",
            ALICE,
        ],
    ] {
        let out = peerwasm(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(
            text(&out).contains("refusing to send your token in clear to pool-node.invalid:7070"),
            "{}",
            text(&out)
        );
    }
    // Told to, it tries (and finds no such host).
    let out = peerwasm(&[
        "peers",
        "--peers",
        "pool-node.invalid:7070",
        "--token",
        ALICE,
        "--insecure-http",
    ]);
    assert!(!text(&out).contains("refusing"), "{}", text(&out));
}

#[test]
fn a_key_file_open_to_others_is_made_private_and_a_missing_ca_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let tls: PathBuf = dir.path().join("tls");
    pool_tls(dir.path());
    let key = tls.join("127.0.0.1.key");
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let w = tls_worker(&tls, "127.0.0.1");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&key).unwrap().permissions())
            & 0o777;
    assert_eq!(mode, 0o600);
    drop(w);

    let out = peerwasm(&[
        "tls",
        "issue",
        dir.path().join("nothing").to_str().unwrap(),
        "h",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("tls init"), "{}", text(&out));
    let guest = peerwasm_testkit::guest_wasm("hello");
    let out = peerwasm(&[
        "run",
        "--peers",
        "127.0.0.1:1",
        "--tls-ca",
        "/nonexistent/ca.crt",
        guest.to_str().unwrap(),
    ]);
    assert!(text(&out).contains("/nonexistent/ca.crt"), "{}", text(&out));
}
