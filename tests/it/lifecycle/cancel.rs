//! An owner cancels its jobs: one computing, one asleep in a host call,
//! one still queued.

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn cancel_ends_a_computing_a_sleeping_and_a_queued_job() {
    let tenants = tenants_file(1, 1);
    let w = worker(2, &tenants, None, &[]);
    let looping = peerwasm::client::Job::new(peerwasm_testkit::guest_wasm_bytes("hostile-loop"));
    let sleep = sleep_job();
    for job in [&looping, &sleep] {
        assert!(upload(&w.addr, job, Some(ALICE)).await.is_success());
    }
    let detach = |spec: JobSpec| {
        let addr = w.addr.clone();
        async move {
            let r = post(&addr, &spec, Some(ALICE), true).await;
            assert_eq!(r.status(), StatusCode::ACCEPTED);
            r.text().await.unwrap()
        }
    };
    let computing = detach(looping.spec(Vec::new(), 32 * MIB)).await;
    let sleeping = detach(sleep.spec(b"600000".to_vec(), 32 * MIB)).await;
    busy(&w.addr, 2).await;
    let queued = detach(sleep.spec(b"600000".to_vec(), 32 * MIB)).await;
    assert_eq!(me(&w.addr).await.queue_len, 1);

    // Another tenant's id is not found, exactly as a made-up one.
    let by_bob = crate::tenants::http()
        .delete(format!("http://{}/v1/jobs/{computing}", w.addr))
        .bearer_auth(BOB)
        .send()
        .await
        .unwrap();
    assert_eq!(by_bob.status(), StatusCode::NOT_FOUND);

    // `peerwasm jobs` lists them where they are; bob sees none.
    let listed = peerwasm()
        .args(["jobs", "--json", "--peers", &w.addr, "--token", ALICE])
        .output()
        .unwrap();
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    let state = |id: &str| {
        let job = listed
            .as_array()
            .unwrap()
            .iter()
            .find(|j| j["id"] == id)
            .unwrap_or_else(|| panic!("{id} not listed"));
        assert_eq!(job["worker"], w.addr.as_str());
        job["state"].as_str().unwrap().to_string()
    };
    assert_eq!(
        [state(&computing), state(&sleeping), state(&queued)],
        ["running", "running", "queued"]
    );
    let bobs = peerwasm()
        .args(["jobs", "--json", "--peers", &w.addr, "--token", BOB])
        .output()
        .unwrap();
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&bobs.stdout).unwrap(),
        serde_json::json!([])
    );

    let start = Instant::now();
    let out = peerwasm()
        // The queued one first: cancelling a running one frees its slot,
        // and the queued one would start in it.
        .args([
            "cancel", "--peers", &w.addr, "--token", ALICE, &queued, &computing, &sleeping,
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!(
            "{computing}: cancelled on {} (it was running)",
            w.addr
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "{queued}: cancelled on {} (it was queued)",
            w.addr
        )),
        "{stdout}"
    );
    let took = idle_within(&w.addr, Duration::from_secs(1)).await;
    println!(
        "cancel of 3 jobs: command {:?}, worker idle {took:?} after it",
        start.elapsed() - took
    );

    // A made-up id: exit 1.
    let none = peerwasm()
        .args([
            "cancel",
            "--peers",
            &w.addr,
            "--token",
            ALICE,
            &"0".repeat(32),
        ])
        .output()
        .unwrap();
    assert_eq!(none.status.code(), Some(1));

    // Each result says so; the two that held a slot were charged for it.
    for id in [&computing, &sleeping, &queued] {
        let r = crate::tenants::http()
            .get(format!("http://{}/v1/jobs/{id}", w.addr))
            .bearer_auth(ALICE)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        let result: JobResult = postcard::from_bytes(&r.bytes().await.unwrap()).unwrap();
        assert_eq!(
            result.outcome,
            Outcome::Cancelled {
                cause: CancelCause::Owner
            }
        );
        assert_eq!(result.outcome.exit_code(), 130);
    }
    // Cancelling an ended job discards its result.
    let again = peerwasm()
        .args(["cancel", "--peers", &w.addr, "--token", ALICE, &computing])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&again.stdout).contains("had ended on"),
        "{again:?}"
    );
    let gone = crate::tenants::http()
        .get(format!("http://{}/v1/jobs/{computing}", w.addr))
        .bearer_auth(ALICE)
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status(), StatusCode::NOT_FOUND);
    let alice = me(&w.addr)
        .await
        .tenants
        .into_iter()
        .find(|t| t.tenant == "alice")
        .unwrap();
    assert_eq!(alice.account.jobs, 2, "the two that ran are accounted");
    assert!(
        alice.account.slot_seconds > 0.0 && alice.slot_seconds > 0.0,
        "and charged: {alice:?}"
    );
    let m = scrape(&w.addr).await;
    assert_eq!(
        get(
            &m,
            "peerwasm_jobs_total{outcome=\"cancelled\",tenant=\"alice\"}"
        ),
        3.0
    );
}
