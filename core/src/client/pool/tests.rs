//! The pool's policy without a worker: whom it trusts with the token,
//! how it orders candidates, what a refusal means, and that many jobs
//! finding a module missing share one upload.

use std::sync::atomic::{AtomicU32, Ordering};

use super::*;
use crate::gossip::NodeId;
use crate::proto::Advert;

/// A pool with a token, on plain HTTP that may carry it anywhere
/// (`--insecure-http`: these tests are about the other rules).
fn pool(seeds: &[&str]) -> Pool {
    Pool::new(PoolConfig {
        token: Some("t0k3n".into()),
        transport: Transport::new(None, true).unwrap(),
        ..PoolConfig::new(seeds.iter().map(|s| s.to_string()).collect())
    })
    .unwrap()
}

fn peer(addr: &str, slots: u32) -> PeerView {
    PeerView {
        id: NodeId::new(addr, 1),
        advert: Advert {
            addr: addr.into(),
            slots_total: slots,
            ..Advert::default()
        },
        liveness: Liveness::Alive,
        last_heard_ms: 0,
        vouched: true,
    }
}

#[test]
fn jobs_and_the_token_go_to_named_workers_and_to_vouched_ones_only() {
    let p = pool(&["a:1"]);
    assert!(p.trusts("a:1"));
    assert!(!p.trusts("b:2"), "an address only gossip told us of");
    let planted = PeerView {
        vouched: false,
        ..peer("c:3", 64)
    };
    let named_unvouched = PeerView {
        vouched: false,
        ..peer("a:1", 1)
    };
    let kept = p.placeable(vec![named_unvouched, peer("b:2", 1), planted]);
    let kept: Vec<&str> = kept.iter().map(|v| v.advert.addr.as_str()).collect();
    assert_eq!(
        kept,
        ["a:1", "b:2"],
        "the unvouched advert is no placement target"
    );
    assert!(p.trusts("b:2"), "vouched for by the worker that answered");
    assert!(!p.trusts("c:3"));
}

#[test]
fn over_plain_http_the_token_goes_only_to_loopback() {
    let config = |seeds: &[&str]| PoolConfig {
        token: Some("t0k3n".into()),
        ..PoolConfig::new(seeds.iter().map(|s| s.to_string()).collect())
    };
    let err = Pool::new(config(&["127.0.0.1:7070", "10.0.0.9:7070"]))
        .err()
        .expect("a seed off loopback");
    assert!(
        err.to_string().contains("in clear to 10.0.0.9:7070"),
        "{err}"
    );
    let p = Pool::new(config(&["127.0.0.1:7070"])).unwrap();
    p.placeable(vec![peer("[::1]:7071", 1), peer("10.0.0.9:7070", 1)]);
    assert!(p.trusts("127.0.0.1:7070") && p.trusts("[::1]:7071"));
    assert!(
        !p.trusts("10.0.0.9:7070"),
        "a keyed pool vouches for the worker, not for the network to it"
    );
    // Without a token there is nothing to leak.
    let anon = Pool::new(PoolConfig::new(vec!["10.0.0.9:7070".into()])).unwrap();
    assert!(anon.http.may_send_to("10.0.0.9:7070"));
}

#[test]
fn candidates_holding_a_slots_worth_of_our_jobs_go_last_and_avoided_ones_not_at_all() {
    let p = pool(&["a:1"]);
    let view = [peer("a:1", 2), peer("b:2", 1), peer("c:3", 4)];
    let best_fit = vec!["a:1".to_string(), "b:2".to_string(), "c:3".to_string()];
    // a:1 has both its slots' worth of our jobs; b:2 and c:3 none.
    p.add_load("a:1", 2);
    let order: Vec<String> = p
        .order_by_load(best_fit.clone(), &view)
        .into_iter()
        .map(|(a, _)| a)
        .collect();
    assert_eq!(
        order,
        ["b:2", "c:3", "a:1"],
        "best fit kept among equals, loaded last"
    );
    p.add_load("a:1", -2);
    p.avoid("b:2");
    let order: Vec<(String, u32)> = p.order_by_load(best_fit, &view);
    assert_eq!(
        order,
        [("a:1".to_string(), 2), ("c:3".to_string(), 4)],
        "b:2 refused a connection: skipped"
    );
}

#[test]
fn a_refusal_sends_the_job_on_or_ends_it() {
    let p = pool(&["a:1"]);
    let declined = |e: PeerError| matches!(e, PeerError::Declined(_));
    let fatal = |e: PeerError| matches!(e, PeerError::Fatal(_));
    let too_large = p.read_refusal(
        "a:1",
        StatusCode::UNPROCESSABLE_ENTITY,
        String::new(),
        Some(64 << 20),
    );
    assert!(
        matches!(&too_large, PeerError::Declined(m) if m.contains("64 MiB")),
        "{too_large:?}"
    );
    assert!(declined(p.read_refusal(
        "a:1",
        StatusCode::SERVICE_UNAVAILABLE,
        "busy".into(),
        None
    )));
    assert!(
        fatal(p.read_refusal("a:1", StatusCode::BAD_REQUEST, "bad spec".into(), None)),
        "no worker takes a bad request"
    );
    assert!(
        fatal(p.read_refusal("a:1", StatusCode::UNAUTHORIZED, "bad token".into(), None)),
        "our token, refused by one we named"
    );
    let withheld = p.read_refusal(
        "b:2",
        StatusCode::UNAUTHORIZED,
        "a token, please".into(),
        None,
    );
    assert!(
        matches!(&withheld, PeerError::Declined(m) if m.contains("goes only to workers you name")),
        "{withheld:?}"
    );
}

#[tokio::test]
async fn jobs_that_found_a_module_missing_together_share_one_upload() {
    let p = Arc::new(pool(&["a:1"]));
    let uploads = Arc::new(AtomicU32::new(0));
    let key = ModuleHash([1; 32]);
    let sent = Instant::now();
    let upload = |uploads: Arc<AtomicU32>| async move {
        tokio::time::sleep(Duration::from_millis(20)).await;
        uploads.fetch_add(1, Ordering::SeqCst);
        Ok(())
    };
    // Eight jobs sent at `sent` all find it missing at once.
    let all = (0..8).map(|_| {
        let (p, uploads) = (p.clone(), uploads.clone());
        async move { p.once("a:1", key, sent, upload(uploads)).await.unwrap() }
    });
    futures::future::join_all(all).await;
    assert_eq!(uploads.load(Ordering::SeqCst), 1);
    // A job sent after that upload that still finds it missing (the
    // worker lost it) uploads again; so does another worker.
    p.once("a:1", key, Instant::now(), upload(uploads.clone()))
        .await
        .unwrap();
    p.once("b:2", key, sent, upload(uploads.clone()))
        .await
        .unwrap();
    assert_eq!(uploads.load(Ordering::SeqCst), 3);
}
