//! What a stranger on the network can do to a worker, and what one
//! tenant sees of another: forged adverts, a pool reachable from other
//! machines, slow and idle connections, bodies without a token, tokens
//! sent only where they belong, usage and modules kept apart.

use super::*;

/// Without any key (`--insecure-gossip`), anyone who reaches the port can
/// post gossip: the records must still be ones a worker could have sent,
/// or they never enter the view that placement and fair share read.
#[tokio::test(flavor = "multi_thread")]
async fn forged_adverts_are_dropped_and_counted() {
    use peerwasm::gossip::transport::GossipRequest;
    use peerwasm::gossip::{Ack, NodeId, NodeState};
    use peerwasm::proto::{Advert, TenantUsage};
    let w = WorkerProcess::start_with("1GiB", 1, None, &["--insecure-gossip"]);
    let forged = |addr: &str, tenant: &str, usage: f64| {
        let record = Advert {
            addr: addr.into(),
            capacity_bytes: 1 << 30,
            slots_total: 1,
            tenants: vec![TenantUsage {
                tenant: tenant.into(),
                slot_seconds: usage,
                ..TenantUsage::default()
            }],
            ..Advert::default()
        };
        (
            NodeId::new(addr, 1),
            NodeState {
                record,
                version: 1,
                heartbeat: 1,
            },
        )
    };
    let delta = vec![
        forged("127.0.0.1:1", "bob", -1e12), // would favour bob everywhere
        forged("127.0.0.1:2", "alice", f64::INFINITY), // would starve alice
        forged("127.0.0.1:3", "carol", f64::NAN),
        forged("127.0.0.1:4", "dave", 12.5), // a record a worker could send
    ];
    let body = postcard::to_allocvec(&GossipRequest::Ack(Ack { delta })).unwrap();
    let r = crate::support::http()
        .post(format!("http://{}/v1/gossip", w.addr))
        .body(body)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let view = crate::pool::wait_for(&w.addr, Duration::from_secs(5), |_| true).await;
    let addrs: Vec<&str> = view.iter().map(|p| p.advert.addr.as_str()).collect();
    assert!(addrs.contains(&"127.0.0.1:4"), "{addrs:?}");
    assert!(
        !addrs
            .iter()
            .any(|a| ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"].contains(a)),
        "{addrs:?}"
    );
    let m = crate::observe::scrape(&w.addr).await;
    assert_eq!(
        crate::observe::get(&m, "peerwasm_gossip_events_total{event=\"rejected\"}"),
        3.0
    );
    let probe = serves_others(&w, None).await;
    println!(
        "forged adverts: 3 dropped; the worker answered /v1/peers in {:?} at worst and ran a job in {:?}",
        probe.slowest_view, probe.other_job
    );
}

#[test]
fn a_worker_reachable_from_other_machines_needs_a_cluster_key() {
    use std::process::{Command, Stdio};
    let peerwasm = crate::support::PEERWASM;
    let out = Command::new(peerwasm)
        .args(["worker", "--listen", "0.0.0.0:0", "--reserve", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("give every worker of the pool --cluster-key FILE")
            && stderr.contains("--insecure-gossip"),
        "{stderr}"
    );
    // Those who want the old way say so.
    let mut cmd = Command::new(peerwasm);
    cmd.args([
        "worker",
        "--listen",
        "0.0.0.0:0",
        "--reserve",
        "0",
        "--insecure-gossip",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::null());
    let (mut child, addr) = crate::support::spawn_worker(&mut cmd);
    assert!(addr.starts_with("0.0.0.0:"), "{addr}");
    let _ = child.kill();
    let _ = child.wait();
}

/// Strangers need no token to open connections: those that send headers a
/// byte at a time, or nothing, are closed after the header timeout, and
/// past the connection cap new ones are closed at once — while the worker
/// answers the pool.
#[tokio::test(flavor = "multi_thread")]
async fn slow_and_idle_connections_cannot_hold_the_worker() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    // All from one address: the total cap is tested here, the share per
    // address in budgets.rs.
    let w = WorkerProcess::start_with(
        "1GiB",
        1,
        None,
        &[
            "--max-connections",
            "16",
            "--max-connections-per-address",
            "16",
            "--header-timeout",
            "1s",
        ],
    );
    let closed_within = |mut s: TcpStream, limit: Duration| async move {
        let mut buf = [0u8; 256];
        match tokio::time::timeout(limit, s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => true,
            Ok(Ok(_)) => true, // an answer (408), then the close
            Err(_) => false,
        }
    };
    let closed_within_ref = |s: &TcpStream, limit: Duration| {
        let fd = std::os::fd::AsRawFd::as_raw_fd(s);
        async move {
            // Closed by the worker: readable with nothing (EOF) or an answer.
            let deadline = Instant::now() + limit;
            loop {
                let mut b = [0u8; 1];
                // SAFETY: recv(2) with MSG_PEEK | MSG_DONTWAIT on an open socket.
                let n = unsafe {
                    libc::recv(
                        fd,
                        b.as_mut_ptr().cast(),
                        1,
                        libc::MSG_PEEK | libc::MSG_DONTWAIT,
                    )
                };
                if n >= 0 {
                    return true;
                }
                if Instant::now() > deadline {
                    return false;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    // Twelve slowloris connections: a request begun and never finished.
    let mut slow = Vec::new();
    for _ in 0..12 {
        let mut s = TcpStream::connect(&w.addr).await.unwrap();
        s.write_all(b"GET /v1/peers HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        slow.push(s);
    }
    let t = Instant::now();
    me(&w.addr).await;
    let answered = t.elapsed();
    assert!(
        answered < Duration::from_secs(1),
        "/v1/peers took {answered:?} beside 12 slow connections"
    );
    // Eight more that send nothing: past the cap of 16, as many idle ones
    // as the cap needs are closed at once (the oldest that never proved
    // they belong: slow ones, here) to make room for the newcomers.
    let mut idle = Vec::new();
    for _ in 0..8 {
        idle.push(TcpStream::connect(&w.addr).await.unwrap());
    }
    let all: Vec<TcpStream> = slow.into_iter().chain(idle).collect();
    let closed = futures::future::join_all(all.into_iter().map(|s| async move {
        let closed = closed_within_ref(&s, Duration::from_millis(300)).await;
        (closed, s)
    }))
    .await;
    let closed_at_once = closed.iter().filter(|(c, _)| *c).count();
    assert!(
        closed_at_once >= 4,
        "only {closed_at_once} of 20 connections were closed at the cap of 16"
    );
    // The rest are closed by the header timeout.
    let start = Instant::now();
    for (_, s) in closed.into_iter().filter(|(c, _)| !c) {
        assert!(
            closed_within(s, Duration::from_secs(3)).await,
            "a slow connection outlived the header timeout"
        );
    }
    println!(
        "slowloris: /v1/peers answered in {answered:?}; {closed_at_once} of 20 closed at the cap; the others closed {:?} after",
        start.elapsed()
    );
    // And it serves again.
    me(&w.addr).await;
    let m = crate::observe::scrape(&w.addr).await;
    assert!(crate::observe::get(&m, "peerwasm_connections_refused_total") >= 4.0);
}

/// With tenants, who used what is private: `/v1/peers` shows a tenant its
/// own usage, an operator everyone's, a stranger no one's; `/metrics` is an
/// operator's.
#[tokio::test(flavor = "multi_thread")]
async fn tenants_see_only_their_own_usage_and_operators_see_all() {
    use crate::tenants::CAROL;
    let tenants = tenants_file(1, 1);
    let w = worker(2, &tenants, None, &[]);
    let hello = Job::new(peerwasm_testkit::guest_wasm_bytes("hello"));
    for token in [ALICE, BOB] {
        let t = Target::pool_as(vec![w.addr.clone()], Some(token.into())).unwrap();
        assert!(
            t.run(&hello, hello.spec(Vec::new(), 16 * MIB))
                .await
                .unwrap()
                .outcome
                .is_success()
        );
    }
    let names_seen_by = |token: Option<&'static str>| {
        let addr = w.addr.clone();
        async move {
            let http =
                peerwasm::client::http_client(token, &peerwasm::net::Transport::plain()).unwrap();
            let view = peerwasm::client::fetch_peers(&http, &[addr]).await.unwrap();
            view[0]
                .advert
                .tenants
                .iter()
                .map(|t| t.tenant.clone())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        names_seen_by(None).await,
        Vec::<String>::new(),
        "a stranger sees no tenant"
    );
    assert_eq!(names_seen_by(Some(ALICE)).await, ["alice"]);
    assert_eq!(names_seen_by(Some(BOB)).await, ["bob"]);
    assert_eq!(
        names_seen_by(Some(CAROL)).await,
        ["alice", "bob"],
        "the operator sees all"
    );
    let bad =
        peerwasm::client::http_client(Some("guess"), &peerwasm::net::Transport::plain()).unwrap();
    assert!(
        peerwasm::client::fetch_peers(&bad, std::slice::from_ref(&w.addr))
            .await
            .is_err(),
        "a wrong token is refused"
    );
    // The text page and `peerwasm peers` still work for anyone.
    let page = crate::support::http()
        .get(format!("http://{}/", w.addr))
        .send()
        .await
        .unwrap();
    assert!(page.status().is_success());
    let metrics = |token: Option<&'static str>| {
        let addr = w.addr.clone();
        async move {
            let http =
                peerwasm::client::http_client(token, &peerwasm::net::Transport::plain()).unwrap();
            http.get(format!("http://{addr}/metrics"))
                .send()
                .await
                .unwrap()
        }
    };
    assert_eq!(
        metrics(None).await.status(),
        reqwest::StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        metrics(Some(ALICE)).await.status(),
        reqwest::StatusCode::UNAUTHORIZED
    );
    let text = metrics(Some(CAROL)).await.text().await.unwrap();
    assert!(text.contains("tenant=\"alice\"") && text.contains("tenant=\"bob\""));
}

/// A module's hash is no key to it: with tenants, only a tenant that showed
/// the bytes (uploaded them) runs a module; another who only knows the
/// hash is asked for them (404).
#[tokio::test(flavor = "multi_thread")]
async fn only_tenants_that_showed_a_modules_bytes_may_run_it() {
    use crate::tenants::{post, upload};
    use reqwest::StatusCode;
    let tenants = tenants_file(1, 1);
    let w = worker(1, &tenants, None, &[]);
    let private = Job::new(peerwasm_testkit::guest_wasm_bytes("hello"));
    assert!(upload(&w.addr, &private, Some(ALICE)).await.is_success());
    let spec = private.spec(Vec::new(), 16 * MIB);
    assert_eq!(
        post(&w.addr, &spec, Some(ALICE), false).await.status(),
        StatusCode::OK
    );
    // Bob knows the hash, not the bytes.
    let r = post(&w.addr, &spec, Some(BOB), false).await;
    assert_eq!(
        r.status(),
        StatusCode::NOT_FOUND,
        "{}",
        r.text().await.unwrap()
    );
    // Wrong bytes under the hash prove nothing.
    let wrong = crate::tenants::http()
        .put(format!(
            "http://{}/v1/modules/{}",
            w.addr,
            private.hash().to_hex()
        ))
        .bearer_auth(BOB)
        .body(b"\0asm\x01\0\0\0".to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        post(&w.addr, &spec, Some(BOB), false).await.status(),
        StatusCode::NOT_FOUND
    );
    // With the bytes (the client uploads on a 404), bob runs it.
    let bob = Target::pool_as(vec![w.addr.clone()], Some(BOB.into())).unwrap();
    assert!(
        bob.run(&private, spec.clone())
            .await
            .unwrap()
            .outcome
            .is_success()
    );
    assert_eq!(
        post(&w.addr, &spec, Some(BOB), false).await.status(),
        StatusCode::OK
    );
}

/// A stranger's huge body is refused before it is read into memory: the
/// tenant is checked from the headers, the body dropped unread.
#[tokio::test(flavor = "multi_thread")]
async fn an_oversized_body_without_a_token_is_refused_unread() {
    let tenants = tenants_file(1, 1);
    let w = worker(1, &tenants, None, &[]);
    let rss = |pid: u32| {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let line = status
            .lines()
            .find(|l| l.starts_with("VmHWM:"))
            .unwrap()
            .to_string();
        line.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<u64>()
            .unwrap()
            * 1024
    };
    let before = rss(w.child.id());
    let huge = vec![0u8; 60 << 20]; // under the module limit, so only the token refuses it
    let url = format!("http://{}/v1/modules/{}", w.addr, "ab".repeat(32));
    let answer = crate::support::http().put(url).body(huge).send().await;
    match answer {
        Ok(r) => assert_eq!(r.status(), reqwest::StatusCode::UNAUTHORIZED),
        Err(e) => println!("oversized body without a token: connection closed ({e})"),
    }
    // Read before the probe: running a job (compiling its module) raises
    // the peak by itself.
    let grew = rss(w.child.id()).saturating_sub(before);
    let probe = serves_others(&w, Some(BOB)).await;
    println!(
        "oversized body without a token: peak RSS grew {} KiB; the worker answered /v1/peers in {:?} and ran bob's job in {:?}",
        grew >> 10,
        probe.slowest_view,
        probe.other_job
    );
    assert!(
        grew < 16 << 20,
        "the worker buffered the body: peak RSS grew {} MiB",
        grew >> 20
    );
}

/// Without any key (`--insecure-gossip`), anyone who reaches a worker can
/// plant an advert: a client places jobs (and sends its token) only on
/// workers it named, unless the worker that answered vouches for the
/// others — their adverts came sealed with the pool's key: an explicit
/// `--cluster-key`, or on loopback this user's own.
#[tokio::test(flavor = "multi_thread")]
async fn a_token_goes_only_to_named_workers_unless_the_pool_is_keyed() {
    use peerwasm::client::{MapConfig, MapItem, map};
    let tenants = tenants_file(1, 1);
    let key = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(key.path(), b"a shared secret for the token test").unwrap();
    let key = key.path().to_str().unwrap().to_string();
    for (how, extra) in [
        ("no key", vec!["--insecure-gossip"]),
        ("this user's key", vec![]),
        ("a cluster key", vec!["--cluster-key", &key]),
    ] {
        let keyed = extra.first() != Some(&"--insecure-gossip");
        let w1 = worker(1, &tenants, None, &extra);
        let w2 = worker(1, &tenants, Some(&w1.addr), &extra);
        crate::pool::wait_for(&w1.addr, Duration::from_secs(10), |v| {
            crate::pool::alive(v) == 2
        })
        .await;
        // Named: w1 only.
        let target = Target::pool_as(vec![w1.addr.clone()], Some(ALICE.into())).unwrap();
        let job = crate::tenants::sleep_job();
        let config = MapConfig {
            mem: Some((16 * MIB).into()),
            ..MapConfig::default()
        };
        let mut items: Vec<MapItem> = Vec::new();
        let summary = map(&target, &job, vec![b"100".to_vec(); 8], &config, &mut items)
            .await
            .unwrap();
        assert!(items.iter().all(MapItem::succeeded));
        let on_w2 = summary.per_peer.get(&w2.addr).copied().unwrap_or(0);
        println!("{how}: jobs per peer {:?}", summary.per_peer);
        if keyed {
            assert!(
                on_w2 > 0,
                "a keyed pool vouches for w2: it should have run some jobs"
            );
        } else {
            assert_eq!(
                on_w2, 0,
                "w2 was not named and nothing vouches for it: no job"
            );
            let m = crate::observe::scrape(&w2.addr).await;
            assert_eq!(
                crate::observe::get(&m, "peerwasm_refused_jobs_total{reason=\"unauthorized\"}"),
                0.0,
                "w2 was sent jobs"
            );
        }
    }
}
