//! What a tenant's jobs and requests make the worker hold — compiles,
//! queued jobs, disk, kept results, buffered output — bounded, charged,
//! and given back.

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn a_compile_past_the_limit_is_refused_naming_it_and_others_run_meanwhile() {
    let tenants = tenants_file(1, 1);
    let w = worker(2, &tenants, None, &["--max-compile-time", "1s"]);
    let alice = Target::pool_as(vec![w.addr.clone()], Some(ALICE.into())).unwrap();
    // About 2.5 s to compile here: within the size cap, past the limit.
    let bomb = Job::new(peerwasm_testkit::big_module(20_000));
    let started = Instant::now();
    let compiling = tokio::spawn({
        let (alice, bomb) = (alice.clone(), bomb.clone());
        async move {
            alice
                .run(&bomb, bomb.spec(Vec::new(), 32 * MIB))
                .await
                .unwrap()
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let bob = Target::pool_as(vec![w.addr.clone()], Some(BOB.into())).unwrap();
    let hello = Job::new(peerwasm_testkit::guest_wasm_bytes("hello"));
    let t = Instant::now();
    assert!(
        bob.run(&hello, hello.spec(Vec::new(), 16 * MIB))
            .await
            .unwrap()
            .outcome
            .is_success()
    );
    let other = t.elapsed();
    let r = compiling.await.unwrap();
    let refused_after = started.elapsed();
    let expected = "job rejected: compiling it takes more than 1s of CPU time (this worker's --max-compile-time)";
    assert_eq!(r.outcome.to_string(), expected);
    assert!(
        refused_after < Duration::from_millis(2500),
        "refused after {refused_after:?}"
    );
    // Once known, the module is refused at once.
    let t = Instant::now();
    let again = alice
        .run(&bomb, bomb.spec(Vec::new(), 32 * MIB))
        .await
        .unwrap();
    assert_eq!(again.outcome.to_string(), expected);
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "the second refusal took {:?}",
        t.elapsed()
    );
    println!(
        "compile bomb: refused after {refused_after:?}, again in {:?}; another tenant's job took {other:?} meanwhile",
        t.elapsed()
    );
    assert!(
        other < Duration::from_secs(1),
        "another tenant's job took {other:?} during the compile"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn queued_jobs_keep_their_module_and_queues_hold_bounded_bytes() {
    use crate::tenants::{post, upload};
    use reqwest::StatusCode;
    let tenants = tenants_file(1, 1);
    // Room for one module's bytes at a time; 1 MiB of queued input each.
    let w = worker(
        1,
        &tenants,
        None,
        &["--module-memory", "1", "--max-queued-bytes", "1MiB"],
    );
    let sleep = crate::tenants::sleep_job();
    let primes = Job::new(peerwasm_testkit::guest_wasm_bytes("primes"));
    // Alice: one job runs (its module compiled, so its bytes are no longer
    // needed); one of primes, uploaded now and not compiled yet, waits.
    assert!(upload(&w.addr, &sleep, Some(ALICE)).await.is_success());
    let running = tokio::spawn({
        let (addr, spec) = (w.addr.clone(), sleep.spec(b"1500".to_vec(), 16 * MIB));
        async move { post(&addr, &spec, Some(ALICE), false).await.status() }
    });
    crate::pool::wait_for(&w.addr, Duration::from_secs(10), |v| {
        v[0].advert.slots_busy == 1
    })
    .await;
    assert!(upload(&w.addr, &primes, Some(ALICE)).await.is_success());
    let queued = tokio::spawn({
        let (addr, spec) = (
            w.addr.clone(),
            primes.spec(br#"{"n": 100}"#.to_vec(), 16 * MIB),
        );
        async move { post(&addr, &spec, Some(ALICE), false).await }
    });
    crate::pool::wait_for(&w.addr, Duration::from_secs(5), |v| {
        v[0].advert.queue_len == 1
    })
    .await;
    // Bob uploads other modules: each pushes out what it can.
    for name in ["hello", "memhog", "spin"] {
        assert!(
            upload(
                &w.addr,
                &Job::new(peerwasm_testkit::guest_wasm_bytes(name)),
                Some(BOB)
            )
            .await
            .is_success()
        );
    }
    // Queued input is bounded in bytes: 700 KB waits, 2 × 700 KB does not.
    let big_input = |addr: String| {
        let spec = sleep.spec(vec![b'1'; 700_000], 16 * MIB);
        async move { post(&addr, &spec, Some(ALICE), false).await.status() }
    };
    let first = tokio::spawn(big_input(w.addr.clone()));
    crate::pool::wait_for(&w.addr, Duration::from_secs(5), |v| {
        v[0].advert.queue_len == 2
    })
    .await;
    assert_eq!(
        big_input(w.addr.clone()).await,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(running.await.unwrap(), StatusCode::OK);
    let r = queued.await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let result: JobResult = postcard::from_bytes(&r.bytes().await.unwrap()).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&result.stdout).trim(),
        r#"{"count":25}"#,
        "{}",
        result.outcome
    );
    let _ = first.await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_disk_filler_gets_enospc_at_its_bound_and_leaves_nothing_behind() {
    let tenants = tenants_file(1, 1);
    let scratch = tempfile::tempdir().unwrap();
    let w = worker(
        2,
        &tenants,
        None,
        &[
            "--scratch",
            "32MiB",
            "--scratch-dir",
            scratch.path().to_str().unwrap(),
        ],
    );
    let filler = Job::new(peerwasm_testkit::guest_wasm_bytes("hostile-disk"));
    // Fills, then holds its files for 2 s while the worker is probed.
    let (r, probe) = probe_during(&w, filler, "2000", 32 * MIB).await;
    println!(
        "disk filler: worker answered /v1/peers in {:?} at worst; another tenant's job took {:?}",
        probe.slowest_view, probe.other_job
    );
    let stdout = String::from_utf8_lossy(&r.stdout);
    assert!(r.outcome.is_success(), "{}", r.outcome);
    // 64 directories (256 KiB counted) and the file (4 KiB): 31 MiB fit.
    assert!(
        stdout.starts_with("wrote 31 MiB, then: No space left on device"),
        "{stdout}"
    );
    // Only the worker's own file store and its jobs' directory (made at
    // its start) may be there, and that directory holds its claim alone.
    let mut left = Vec::new();
    for entry in std::fs::read_dir(scratch.path()).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("peerwasm-jobs-") {
            left.extend(
                std::fs::read_dir(entry.path())
                    .unwrap()
                    .map(|e| e.unwrap().file_name())
                    .filter(|n| n != peerwasm::leftovers::CLAIM_FILE)
                    .map(|n| format!("{name}/{}", n.to_string_lossy())),
            );
        } else if !name.starts_with("peerwasm-files-") {
            left.push(name);
        }
    }
    assert!(left.is_empty(), "scratch left behind: {left:?}");
    // Another tenant's job writes its own files as usual.
    let bob = Target::pool_as(vec![w.addr.clone()], Some(BOB.into())).unwrap();
    let files = Job::new(peerwasm_testkit::guest_wasm_bytes("hostile-escape"));
    assert!(
        bob.run(&files, files.spec(Vec::new(), 32 * MIB))
            .await
            .unwrap()
            .outcome
            .is_success()
    );
}

/// Disk is charged by what a call makes the disk hold, whatever the
/// descriptor's number: a scratch file renumbered onto stdout is still a
/// file; symlinks and hard links are names that take disk. In-process and
/// in slot processes alike. (Before: 512 MiB written to descriptor 1 under
/// `--scratch 16MiB`, and 20,000 symlinks with 4000-byte targets, 78 MiB,
/// under `--scratch 1MiB`.)
#[tokio::test(flavor = "multi_thread")]
async fn side_doors_to_the_disk_are_charged_by_what_they_make_it_hold() {
    let names = Job::new(peerwasm_testkit::guest_wasm_bytes("hostile-names"));
    for isolation in ["never", "always"] {
        let scratch = tempfile::tempdir().unwrap();
        let w = WorkerProcess::start_with(
            "1GiB",
            2,
            None,
            &[
                "--scratch",
                "16MiB",
                "--scratch-dir",
                scratch.path().to_str().unwrap(),
                "--slot-processes",
                isolation,
            ],
        );
        let target = Target::pool(vec![w.addr.clone()]).unwrap();
        let run = |mode: &str| {
            let mut spec = names.spec(Vec::new(), 32 * MIB);
            spec.args = vec![mode.to_string()];
            let (target, names) = (target.clone(), names.clone());
            async move { target.run(&names, spec).await.unwrap() }
        };
        let r = run("renumber").await;
        let said = String::from_utf8_lossy(&r.stderr).into_owned();
        assert!(
            said.contains("No space left on device"),
            "{isolation}: {said}"
        );
        let mib: u64 = said
            .strip_prefix("wrote ")
            .and_then(|s| s.split(' ').next())
            .unwrap()
            .parse()
            .unwrap();
        assert!(mib <= 16, "{isolation}: {said}");
        assert!(r.stdout.is_empty(), "what went to the file is not output");
        for mode in ["symlinks", "links"] {
            let r = run(mode).await;
            let said = String::from_utf8_lossy(&r.stderr).into_owned();
            // 16 MiB of a block and an inode per symlink (a block per hard
            // link) is under 4,000 names: refused with ENOSPC (51).
            assert!(said.ends_with("then: errno 51\n"), "{isolation}: {said}");
            let made: u64 = said.split(' ').nth(1).unwrap().parse().unwrap();
            assert!(made < 4200, "{isolation}: {said}");
        }
    }
}

/// Finished detached jobs' output is memory the worker holds for their
/// owner until it discards it: bounded per tenant.
#[tokio::test(flavor = "multi_thread")]
async fn detached_results_held_are_bounded_per_tenant_until_discarded() {
    use crate::tenants::{http, post, upload};
    use reqwest::StatusCode;
    let tenants = tenants_file(1, 1);
    let w = worker(2, &tenants, None, &["--max-results", "4KiB"]);
    let hello = Job::new(peerwasm_testkit::guest_wasm_bytes("hello"));
    for t in [ALICE, BOB] {
        assert!(upload(&w.addr, &hello, Some(t)).await.is_success());
    }
    let mut loud = hello.spec(Vec::new(), 16 * MIB);
    loud.args = vec!["x".repeat(5000)]; // 5 KB of output
    let detach = |token: &'static str| {
        let (addr, spec) = (w.addr.clone(), loud.clone());
        async move { post(&addr, &spec, Some(token), true).await }
    };
    let r = detach(ALICE).await;
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let id = r.text().await.unwrap();
    let done = |id: String| {
        let addr = w.addr.clone();
        async move {
            for _ in 0..200 {
                let r = http()
                    .get(format!("http://{addr}/v1/jobs/{id}"))
                    .bearer_auth(ALICE)
                    .send()
                    .await
                    .unwrap();
                if r.status() == StatusCode::OK {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            panic!("never done");
        }
    };
    done(id.clone()).await;
    // Alice holds 5 KB > 4 KiB: her next detached job is refused, saying why...
    let r = detach(ALICE).await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        r.text()
            .await
            .unwrap()
            .contains("of your finished jobs' results")
    );
    // ...bob's is not, and attached jobs still run.
    assert_eq!(detach(BOB).await.status(), StatusCode::ACCEPTED);
    assert_eq!(
        post(&w.addr, &loud, Some(ALICE), false).await.status(),
        StatusCode::OK
    );
    // Discarding frees her room.
    let out = std::process::Command::new(crate::support::PEERWASM)
        .args(["cancel", "--peers", &w.addr, "--token", ALICE, &id])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("its result was discarded"),
        "{out:?}"
    );
    assert_eq!(detach(ALICE).await.status(), StatusCode::ACCEPTED);
}

/// Jobs' writes together stay within the worker's scratch total, each job
/// within its own bound too.
#[tokio::test(flavor = "multi_thread")]
async fn running_jobs_together_keep_within_the_scratch_total() {
    let tenants = tenants_file(1, 1);
    let w = worker(
        2,
        &tenants,
        None,
        &["--scratch", "32MiB", "--scratch-total", "40MiB"],
    );
    let filler = Job::new(peerwasm_testkit::guest_wasm_bytes("hostile-disk"));
    // Each fills, then holds its files for a second: the two overlap.
    let run = |token: &'static str| {
        let (addr, filler) = (w.addr.clone(), filler.clone());
        async move {
            let t = Target::pool_as(vec![addr], Some(token.into())).unwrap();
            let r = t
                .run(&filler, filler.spec(b"1000".to_vec(), 32 * MIB))
                .await
                .unwrap();
            let out = String::from_utf8_lossy(&r.stdout).into_owned();
            let mib: u64 = out
                .strip_prefix("wrote ")
                .and_then(|s| s.split(' ').next()?.parse().ok())
                .unwrap_or_else(|| panic!("{out}"));
            assert!(out.contains("No space left on device"), "{out}");
            mib
        }
    };
    let (a, b) = tokio::join!(run(ALICE), run(BOB));
    println!("scratch total 40 MiB: two fillers wrote {a} + {b} MiB");
    assert!(a + b <= 40, "together {a} + {b} MiB, over the 40 MiB total");
    assert!(a <= 31 && b <= 31, "each within its own 32 MiB");
    // Their shares came back when they ended: a third runs to its own bound.
    assert_eq!(run(ALICE).await, 31);
}

/// Output a worker buffers, and detached results it keeps, are memory the
/// host holds: they shrink what the worker offers beside the reservations,
/// and a job whose output no longer fits ends saying so, within its cap.
#[tokio::test(flavor = "multi_thread")]
async fn buffered_output_and_held_results_count_against_the_workers_memory() {
    use crate::tenants::{http, post, upload};
    use reqwest::StatusCode;
    let tenants = tenants_file(1, 1);
    let w = WorkerProcess::start_with(
        "256MiB",
        2,
        None,
        &[
            "--tenants",
            tenants.path().to_str().unwrap(),
            "--max-output",
            "1GiB",
        ],
    );
    let mut flood = Job::new(peerwasm_testkit::guest_wasm_bytes("hostile-flood"));
    assert!(upload(&w.addr, &flood, Some(ALICE)).await.is_success());
    // Alice parks 100 MiB of output in a detached result.
    flood.limits.stdout_bytes = 100 * MIB;
    let r = post(
        &w.addr,
        &flood.spec(Vec::new(), 32 * MIB),
        Some(ALICE),
        true,
    )
    .await;
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let id = r.text().await.unwrap();
    let start = Instant::now();
    // The result as kept: its encoding, which the worker holds.
    let kept = loop {
        let r = http()
            .get(format!("http://{}/v1/jobs/{id}", w.addr))
            .bearer_auth(ALICE)
            .send()
            .await
            .unwrap();
        if r.status() == StatusCode::OK {
            let encoded = r.bytes().await.unwrap();
            let result: JobResult = postcard::from_bytes(&encoded).unwrap();
            assert_eq!(
                result.outcome,
                Outcome::OutputLimitExceeded {
                    stream: StdStream::Stdout,
                    limit: 100 * MIB
                }
            );
            break encoded.len() as u64;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the flood never ended"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!((100 * MIB..100 * MIB + 4096).contains(&kept), "{kept}");
    let offer = me(&w.addr).await.largest_fit_bytes;
    println!(
        "with 100 MiB of results held, a 256 MiB worker offers {} MiB",
        offer / MIB
    );
    assert_eq!(
        offer,
        256 * MIB - kept,
        "the held result must come out of the offer"
    );
    let m = crate::observe::scrape(&w.addr).await;
    assert_eq!(
        crate::observe::get(&m, "peerwasm_memory_bytes{kind=\"result_held\"}"),
        kept as f64
    );
    let probe = serves_others(&w, Some(BOB)).await;
    println!(
        "with alice's 100 MiB held, the worker answered /v1/peers in {:?} and ran bob's job in {:?}",
        probe.slowest_view, probe.other_job
    );
    // Bob asks to keep 1 GiB; only what is free beside his 32 MiB
    // reservation and alice's result can be held for him.
    flood.limits.stdout_bytes = 1 << 30;
    let bob = Target::pool_as(vec![w.addr.clone()], Some(BOB.into())).unwrap();
    let r = bob
        .run(&flood, flood.spec(Vec::new(), 32 * MIB))
        .await
        .unwrap();
    let Outcome::OutputMemoryExhausted {
        stream: StdStream::Stdout,
        held,
    } = r.outcome
    else {
        panic!("{}", r.outcome)
    };
    println!("bob's flood: {}", r.outcome);
    assert_eq!(r.stdout.len() as u64, held);
    assert!(
        (123 * MIB..=125 * MIB).contains(&held),
        "held {} MiB",
        held / MIB
    );
    assert_eq!(r.outcome.exit_code(), 137);
    assert_eq!(
        me(&w.addr).await.largest_fit_bytes,
        256 * MIB - kept,
        "bob's output was given back"
    );
    // Discarding alice's result gives its memory back.
    let out = std::process::Command::new(crate::support::PEERWASM)
        .args(["cancel", "--peers", &w.addr, "--token", ALICE, &id])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(me(&w.addr).await.largest_fit_bytes, 256 * MIB);
}

/// A worker killed with SIGKILL (the OOM killer, `scancel` past its grace)
/// cannot remove what it made for itself under its scratch dir — its file
/// store, its slot processes' scratch; the next worker started there does,
/// and leaves a live worker's alone (each holds a lock on its own while it
/// lives: `peerwasm::leftovers`). Before, every killed worker left them
/// for good.
#[tokio::test(flavor = "multi_thread")]
async fn what_a_killed_worker_left_is_removed_by_the_next_and_a_live_ones_kept() {
    let scratch = tempfile::tempdir().unwrap();
    let flags = [
        "--scratch-dir",
        scratch.path().to_str().unwrap(),
        "--slot-processes",
        "always",
    ];
    let names = || -> std::collections::BTreeSet<String> {
        std::fs::read_dir(scratch.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    };
    let mut killed = WorkerProcess::start_with("2GiB", 1, None, &flags);
    let hello = Job::new(peerwasm_testkit::guest_wasm_bytes("hello"));
    let pool = Target::pool_as(vec![killed.addr.clone()], None).unwrap();
    let r = pool
        .run(&hello, hello.spec(Vec::new(), 32 * MIB))
        .await
        .unwrap();
    assert!(r.outcome.is_success(), "{}", r.outcome);
    let its = names();
    assert!(
        its.iter().any(|n| n.starts_with("peerwasm-files-"))
            && its.iter().any(|n| n.starts_with("peerwasm-slot-"))
            && its.iter().any(|n| n.starts_with("peerwasm-jobs-")),
        "{its:?}"
    );
    let live = WorkerProcess::start_with("2GiB", 1, None, &flags);
    let lives: Vec<String> = names().difference(&its).cloned().collect();
    assert!(!lives.is_empty());
    killed.kill();
    // Time passes: every lock file older than the grace period.
    let long_ago = std::time::SystemTime::now() - Duration::from_secs(120);
    for name in names() {
        let claim = scratch
            .path()
            .join(&name)
            .join(peerwasm::leftovers::CLAIM_FILE);
        if let Ok(f) = std::fs::File::options().write(true).open(&claim) {
            f.set_modified(long_ago).unwrap();
        }
    }
    assert!(its.is_subset(&names()), "nothing goes by itself");
    let _next = WorkerProcess::start_with("2GiB", 1, None, &flags);
    let after = names();
    for name in &its {
        assert!(
            !after.contains(name),
            "{name}, the killed worker's, is still there: {after:?}"
        );
    }
    for name in &lives {
        assert!(after.contains(name), "{name}, a live worker's, was removed");
    }
    drop(live);
}
