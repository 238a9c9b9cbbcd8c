//! What gossip and uploads make a worker hold or say: unauthenticated
//! bodies on a small fixed budget, replies capped before their MAC is
//! checked, nothing of other tenants in uploads or keyless gossip.

use super::*;

#[tokio::test(flavor = "multi_thread")]
async fn unauthenticated_gossip_bodies_hold_a_small_fixed_budget() {
    let (w, _t, base) = warm_worker("256MiB", 2, &[]).await;
    // 100 strangers each declare a gossip message of 3 MiB (the largest a
    // message can be), send all but a byte, and stall.
    let mut held = Vec::new();
    for i in 0..100u8 {
        let from = IpAddr::V4(Ipv4Addr::new(127, 0, 1, 1 + i % 50));
        if let Ok(mut tcp) =
            connect_from(from, &w.addr, &post_head("/v1/gossip", None, 3 * MIB)).await
        {
            send_zeros(&mut tcp, 3 * MIB as usize - 1).await;
            held.push(tcp);
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let grew = within(&w, base, 0, "100 stalled gossip bodies");
    let (view, job) = serves_others(&w).await;
    println!(
        "100 stalled 3 MiB gossip bodies: worker grew {} MiB; /v1/peers {view:?}; bob's job {job:?}",
        grew / MIB
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn gossip_replies_are_capped_before_their_mac_is_checked() {
    use peerwasm::gossip::transport::GossipRequest;
    use peerwasm::gossip::{Ack, NodeId, NodeState};
    use peerwasm::proto::Advert;
    // Keyless (`--insecure-gossip`): a planted advert is taken into the
    // view, though vouched for to no client.
    let (w, _t, base) = warm_worker("256MiB", 2, &["--insecure-gossip"]).await;
    // A "peer" that answers every gossip request with an endless body.
    let liar = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let liar_addr = liar.local_addr().unwrap().to_string();
    let served = tokio::spawn(async move {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(8) {
            let Ok(Ok((mut tcp, _))) =
                tokio::time::timeout(Duration::from_secs(1), liar.accept()).await
            else {
                continue;
            };
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = tcp.read(&mut buf).await;
                let _ = tcp
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/postcard\r\n\r\n")
                    .await;
                let chunk = vec![7u8; 1 << 20];
                let t = Instant::now();
                while t.elapsed() < Duration::from_secs(6) && tcp.write_all(&chunk).await.is_ok() {}
            });
        }
    });
    // Planted: an advert naming it, posted to the keyless worker.
    let record = Advert {
        addr: liar_addr.clone(),
        capacity_bytes: 1 << 30,
        slots_total: 1,
        ..Advert::default()
    };
    let delta = vec![(
        NodeId::new(liar_addr, 1),
        NodeState {
            record,
            version: 1,
            heartbeat: 1,
        },
    )];
    let body = postcard::to_allocvec(&GossipRequest::Ack(Ack { delta })).unwrap();
    let r = http()
        .post(format!("http://{}/v1/gossip", w.addr))
        .body(body)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    tokio::time::sleep(Duration::from_secs(4)).await;
    let grew = within(&w, base, 0, "a peer answering gossip with an endless body");
    let (view, job) = serves_others(&w).await;
    println!(
        "a planted peer answering with endless bodies for 4 s: worker grew {} MiB; /v1/peers {view:?}; bob's job {job:?}",
        grew / MIB
    );
    served.abort();
}

#[tokio::test(flavor = "multi_thread")]
async fn uploads_and_keyless_gossip_say_nothing_of_other_tenants() {
    use peerwasm::gossip::transport::GossipRequest;
    use peerwasm::gossip::{Syn, SynAck};
    use peerwasm::proto::Advert;
    let (w, _t, _) = warm_worker("256MiB", 2, &["--insecure-gossip"]).await;
    let job = crate::tenants::sleep_job();
    // Alice uploads first; bob's upload of the same bytes is bob's first.
    assert_eq!(
        upload(&w.addr, &job, Some(ALICE)).await,
        StatusCode::CREATED
    );
    assert_eq!(
        upload(&w.addr, &job, Some(BOB)).await,
        StatusCode::CREATED,
        "bob learnt that someone has the module"
    );
    assert_eq!(upload(&w.addr, &job, Some(BOB)).await, StatusCode::OK);
    // Alice's usage is in the worker's advert; a keyless Syn does not name her.
    let r = crate::tenants::post(
        &w.addr,
        &job.spec(b"10".to_vec(), 16 * MIB),
        Some(ALICE),
        false,
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        me(&w.addr)
            .await
            .tenants
            .iter()
            .any(|t| t.tenant == "alice"),
        "the operator sees alice"
    );
    let syn = postcard::to_allocvec(&GossipRequest::<Advert>::Syn(Syn {
        digest: Default::default(),
    }))
    .unwrap();
    let reply = http()
        .post(format!("http://{}/v1/gossip", w.addr))
        .body(syn)
        .send()
        .await
        .unwrap();
    let ack: SynAck<Advert> = postcard::from_bytes(&reply.bytes().await.unwrap()).unwrap();
    let named: Vec<String> = ack
        .delta
        .iter()
        .flat_map(|(_, s)| s.record.tenants.iter().map(|t| t.tenant.clone()))
        .collect();
    assert!(
        !named.is_empty(),
        "the worker gossips its tenants' usage (by pseudonym)"
    );
    for name in ["alice", "bob", "carol"] {
        assert!(
            !named.iter().any(|t| t == name),
            "a keyless Syn named {name}: {named:?}"
        );
    }
}
