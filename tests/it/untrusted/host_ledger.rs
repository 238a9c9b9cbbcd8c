//! Another user of the same machine cannot take over the host's memory
//! ledger (a shared file believed as the host's own).

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn another_user_cannot_take_over_the_host_ledger() {
    if !is_root() {
        println!("skipped: acting as another user (nobody) needs root");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    // A directory anyone may write to, as /tmp or /dev/shm.
    let shared = tempfile::tempdir().unwrap();
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let precious_dir = tempfile::tempdir().unwrap();
    let precious = precious_dir.path().join("precious");
    std::fs::write(&precious, b"root's own file").unwrap();
    std::fs::set_permissions(precious_dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (planted, link) = (shared.path().join("ledger"), shared.path().join("linked"));
    let out = as_nobody(&format!(
        "printf 'pwledg01 a huge reservation' > {p} && ln -s {t} {l}",
        p = planted.display(),
        t = precious.display(),
        l = link.display()
    ));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for path in [&planted, &link] {
        let w =
            WorkerProcess::start_with("1GiB", 1, None, &["--host-ledger", path.to_str().unwrap()]);
        let r = bob_runs(&w).await;
        assert!(
            r.is_success(),
            "a worker given another user's ledger did not run a job: {r}"
        );
    }
    assert_eq!(
        std::fs::read(&planted).unwrap(),
        b"pwledg01 a huge reservation",
        "the planted file was written"
    );
    assert_eq!(
        std::fs::read(&precious).unwrap(),
        b"root's own file",
        "a worker wrote through the planted link"
    );

    // Two workers sharing this user's own ledger: a lock held elsewhere
    // does not stop them, and a file emptied under them is whole again.
    let private = tempfile::tempdir().unwrap();
    let ledger = private.path().join("ledger");
    let arg = ["--host-ledger", ledger.to_str().unwrap()];
    let (a, b) = (
        WorkerProcess::start_with("1GiB", 1, None, &arg),
        WorkerProcess::start_with("1GiB", 1, None, &arg),
    );
    assert!(bob_runs(&a).await.is_success() && bob_runs(&b).await.is_success());
    // `-o`: the lock is flock's own, gone when it is killed.
    let mut locker = Command::new("flock")
        .arg("-o")
        .arg(&ledger)
        .args(["sleep", "30"])
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = Instant::now();
    tokio::time::timeout(
        Duration::from_secs(5),
        crate::pool::wait_for(&a.addr, Duration::from_secs(5), |_| true),
    )
    .await
    .expect("the worker stopped answering while its ledger was locked");
    assert!(
        bob_runs(&a).await.is_success(),
        "no job ran while the ledger was locked elsewhere"
    );
    let locked_for = t.elapsed();
    let _ = locker.kill();
    let _ = locker.wait();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&ledger)
        .unwrap()
        .set_len(0)
        .unwrap();
    assert!(bob_runs(&a).await.is_success() && bob_runs(&b).await.is_success());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let len = std::fs::metadata(&ledger).unwrap().len();
    assert!(
        len > 8 + 20,
        "the emptied ledger was not written again ({len} bytes)"
    );
    println!(
        "host ledger: planted file and link refused (worker ran alone), a foreign lock cost a job {locked_for:?}, emptied file rewritten ({len} bytes)"
    );
}

/// A hello job on `w`, without a token (a worker without `--tenants`).
async fn bob_runs(w: &WorkerProcess) -> peerwasm::proto::Outcome {
    let target = Target::pool(vec![w.addr.clone()]).unwrap();
    let hello = Job::new(peerwasm_testkit::guest_wasm_bytes("hello"));
    tokio::time::timeout(
        Duration::from_secs(30),
        target.run(&hello, hello.spec(Vec::new(), 16 * MIB)),
    )
    .await
    .expect("the job did not end")
    .unwrap()
    .outcome
}
