//! Bad bytes on the wire. Every decoder of a request body, a batch answer
//! and a gossip message is fed random and mutated bytes (proptest, a
//! bounded number of cases, in every test run): it must return an error,
//! never panic. A real worker is then sent such bodies on every endpoint: it
//! must answer each with a 4xx (or a 2xx when the bytes happen to be a
//! valid request), and keep serving. Last, the limits per request kind and
//! the protocol version, each refused with a clear message.

use std::time::Duration;

use peerwasm::client::Job;
use peerwasm::gossip::auth::ClusterKey;
use peerwasm::gossip::transport::{GossipRequest, SharedNode};
use peerwasm::gossip::{GossipConfig, GossipNode, NodeId};
use peerwasm::proto::batch::{BatchAnswer, BatchItem, FrameReader, encode_frame};
use peerwasm::proto::routes::BATCH;
use peerwasm::proto::{Advert, JobResult, JobSpec, MAX_INPUT_BYTES, ModuleHash, PROTOCOL_HEADER};
use peerwasm::worker::Tenants;
use proptest::prelude::*;
use reqwest::StatusCode;

use crate::support::{MIB, WorkerProcess};

fn spec() -> JobSpec {
    let mut s = JobSpec::new(ModuleHash::of(b"module"));
    s.args = vec!["a".into(), "--b".into()];
    s.env = vec![("K".into(), "V".into())];
    s.stdin = b"{\"n\": 5}".to_vec();
    s
}

fn gossip_node(key: Option<ClusterKey>) -> std::sync::Arc<SharedNode<Advert>> {
    let node = GossipNode::new(
        NodeId::new("127.0.0.1:1", 1),
        Advert::default(),
        GossipConfig::default(),
    );
    SharedNode::new(node, key)
}

/// A valid gossip request body: a Syn from another node, as the transport
/// sends it.
fn valid_syn() -> Vec<u8> {
    let other = GossipNode::new(
        NodeId::new("127.0.0.1:2", 1),
        Advert::default(),
        GossipConfig::default(),
    );
    postcard::to_allocvec(&GossipRequest::<Advert>::Syn(other.syn())).unwrap()
}

/// Applies `flips` (position, xor) and a truncation to `bytes`.
fn mutate(mut bytes: Vec<u8>, flips: &[(usize, u8)], cut: Option<usize>) -> Vec<u8> {
    if !bytes.is_empty() {
        for &(at, x) in flips {
            let n = bytes.len();
            bytes[at % n] ^= x | 1;
        }
    }
    if let Some(cut) = cut {
        bytes.truncate(cut % (bytes.len() + 1));
    }
    bytes
}

fn decode_everything(bytes: &[u8]) {
    let _ = postcard::from_bytes::<JobSpec>(bytes);
    let _ = postcard::from_bytes::<Vec<JobSpec>>(bytes);
    let _ = postcard::from_bytes::<JobResult>(bytes);
    let _ = postcard::from_bytes::<Advert>(bytes);
    let mut frames = FrameReader::default();
    frames.push(bytes);
    while let Ok(Some(_)) = frames.next_item() {}
    let _ = gossip_node(None).handle(bytes);
    let key = ClusterKey::new(b"0123456789abcdef-cluster".to_vec()).unwrap();
    let _ = key.open(bytes);
    let _ = gossip_node(Some(key)).handle(bytes);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic_a_decoder(bytes in prop::collection::vec(any::<u8>(), 0..1024)) {
        decode_everything(&bytes);
    }

    #[test]
    fn mutated_valid_messages_never_panic_a_decoder(
        which in 0..4usize,
        flips in prop::collection::vec((any::<usize>(), any::<u8>()), 0..8),
        cut in prop::option::of(any::<usize>()),
    ) {
        let valid = match which {
            0 => postcard::to_allocvec(&spec()).unwrap(),
            1 => postcard::to_allocvec(&vec![spec(), spec()]).unwrap(),
            2 => encode_frame(&BatchItem {
                index: 7,
                answer: BatchAnswer::Refused { status: 503, message: "busy".into(), largest_job: Some(1) },
            })
            .unwrap(),
            _ => valid_syn(),
        };
        decode_everything(&mutate(valid, &flips, cut));
    }

    #[test]
    fn any_tenants_file_parses_or_is_an_error(text in "\\PC{0,300}") {
        let _ = Tenants::parse(&text);
        let _ = Tenants::parse(&format!("[[tenant]]\n{text}"));
    }
}

fn http() -> reqwest::Client {
    crate::support::http()
}

/// Deterministic pseudo-random bytes.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e3779b97f4a7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_answers_bad_bytes_on_every_endpoint_with_a_4xx_and_keeps_serving() {
    let mut w = WorkerProcess::start("1GiB", 1, None);
    let base = format!("http://{}", w.addr);
    let valid = [
        ("/v1/jobs", postcard::to_allocvec(&spec()).unwrap()),
        (BATCH, postcard::to_allocvec(&vec![spec(), spec()]).unwrap()),
        ("/v1/gossip", valid_syn()),
    ];
    let mut statuses = std::collections::BTreeMap::<(String, u16), u32>::new();
    for seed in 0..150u64 {
        for (path, good) in &valid {
            let bodies = [
                noise(seed, (seed as usize * 37) % 700),
                mutate(
                    good.clone(),
                    &[(seed as usize, seed as u8), (seed as usize * 7, 0x80)],
                    None,
                ),
                mutate(good.clone(), &[], Some(seed as usize)),
            ];
            for body in bodies {
                let resp = http()
                    .post(format!("{base}{path}"))
                    .body(body)
                    .send()
                    .await
                    .unwrap();
                let status = resp.status();
                *statuses
                    .entry((path.to_string(), status.as_u16()))
                    .or_default() += 1;
                assert!(
                    status.is_client_error() || status.is_success(),
                    "{path}: {status}"
                );
                if status.is_success() && *path == BATCH {
                    // Decoded as a batch after all: every frame reads back.
                    let bytes = resp.bytes().await.unwrap();
                    let mut frames = FrameReader::default();
                    frames.push(&bytes);
                    while frames.next_item().unwrap().is_some() {}
                    assert_eq!(frames.pending(), 0);
                }
            }
        }
        // Module uploads: random bytes under their own hash are stored
        // (validated when a job runs); under another hash, refused.
        let body = noise(seed + 1000, 64);
        let url = format!("{base}/v1/modules/{}", ModuleHash::of(&body).to_hex());
        assert_eq!(
            http()
                .put(&url)
                .body(body.clone())
                .send()
                .await
                .unwrap()
                .status(),
            StatusCode::CREATED
        );
        let wrong = format!("{base}/v1/modules/{}", ModuleHash::of(b"other").to_hex());
        assert_eq!(
            http().put(&wrong).body(body).send().await.unwrap().status(),
            StatusCode::BAD_REQUEST
        );
    }
    println!("statuses by endpoint: {statuses:?}");
    assert!(w.child.try_wait().unwrap().is_none(), "the worker died");
    let hello = Job::new(peerwasm_testkit::guest_wasm_bytes("hello"));
    let target = peerwasm::client::Target::pool(vec![w.addr.clone()]).unwrap();
    let r = target
        .run(&hello, hello.spec(Vec::new(), 16 * MIB))
        .await
        .unwrap();
    assert!(r.outcome.is_success(), "{}", r.outcome);
}

#[tokio::test(flavor = "multi_thread")]
async fn each_request_kind_has_its_own_limit_and_says_so() {
    let w = WorkerProcess::start_with("1GiB", 1, None, &["--max-queued", "3"]);
    let base = format!("http://{}", w.addr);
    let text = |r: reqwest::Response| async move { (r.status(), r.text().await.unwrap()) };

    // A job request body over its limit is refused before it is decoded.
    let huge = vec![0u8; MAX_INPUT_BYTES as usize + (1 << 20) + 1];
    let (status, msg) = text(
        http()
            .post(format!("{base}/v1/jobs"))
            .body(huge)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(msg.contains("a job request may be at most 65 MiB"), "{msg}");

    // An input over its limit, in a body under it.
    let hello = Job::new(peerwasm_testkit::guest_wasm_bytes("hello"));
    let mut big_input = hello.spec(vec![b'x'; MAX_INPUT_BYTES as usize + 1], 16 * MIB);
    big_input.program_name = "hello.wasm".into();
    let body = postcard::to_allocvec(&big_input).unwrap();
    let (status, msg) = text(
        http()
            .post(format!("{base}/v1/jobs"))
            .body(body)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(msg.contains("inputs may be at most 64 MiB"), "{msg}");

    // A gossip message is small; 3 MiB + 1 is not one.
    let (status, msg) = text(
        http()
            .post(format!("{base}/v1/gossip"))
            .body(vec![0u8; (3 << 20) + 1])
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(
        msg.contains("a gossip message may be at most 3 MiB"),
        "{msg}"
    );

    // Another protocol version is refused, naming both.
    let (status, msg) = text(
        http()
            .post(format!("{base}/v1/jobs"))
            .header(PROTOCOL_HEADER, "0")
            .body(Vec::new())
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let expected = format!(
        "speaks peerwasm protocol {}, the request protocol 0",
        peerwasm::proto::PROTOCOL_VERSION
    );
    assert!(msg.contains(&expected), "{msg}");

    // Jobs queued per tenant: one slot, --max-queued 3, ten jobs at once.
    let sleep = Job::new(peerwasm_testkit::guest_wasm_bytes("sleep"));
    let url = format!("{base}/v1/modules/{}", sleep.hash().to_hex());
    assert!(
        http()
            .put(url)
            .body(sleep.bytes().to_vec())
            .send()
            .await
            .unwrap()
            .status()
            .is_success()
    );
    let specs: Vec<JobSpec> = (0..10)
        .map(|_| sleep.spec(b"300\n".to_vec(), 16 * MIB))
        .collect();
    let mut resp = http()
        .post(format!("{base}{BATCH}"))
        .body(postcard::to_allocvec(&specs).unwrap())
        .send()
        .await
        .unwrap();
    let mut frames = FrameReader::default();
    let mut answers = Vec::new();
    while let Some(chunk) = resp.chunk().await.unwrap() {
        frames.push(&chunk);
        while let Some(item) = frames.next_item().unwrap() {
            answers.push(item.answer);
        }
    }
    let ran = answers
        .iter()
        .filter(|a| matches!(a, BatchAnswer::Done(r) if r.outcome.is_success()))
        .count();
    let full: Vec<_> = answers
        .iter()
        .filter_map(|a| match a {
            BatchAnswer::Refused {
                status: 503,
                message,
                ..
            } => Some(message.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        (ran, full.len()),
        (4, 6),
        "one running and three queued; the rest refused: {answers:?}"
    );
    assert!(
        full[0].contains("queue for your jobs is full"),
        "{}",
        full[0]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn module_bytes_are_held_within_a_budget() {
    // A budget smaller than one module: each upload drops the one before.
    let w = WorkerProcess::start_with("1GiB", 1, None, &["--module-memory", "1KiB"]);
    let target = peerwasm::client::Target::pool(vec![w.addr.clone()]).unwrap();
    let hello = Job::new(peerwasm_testkit::guest_wasm_bytes("hello"));
    let sleep = Job::new(peerwasm_testkit::guest_wasm_bytes("sleep"));
    for job in [&hello, &sleep, &hello] {
        let r = target
            .run(job, job.spec(b"1\n".to_vec(), 16 * MIB))
            .await
            .unwrap();
        assert!(r.outcome.is_success(), "{}", r.outcome);
    }
    // Only the last module's bytes are held; hello's were dropped, and its
    // compiled form ran it the second time, so it was not uploaded again.
    let m = crate::observe::scrape(&w.addr).await;
    let held = crate::observe::get(&m, "peerwasm_memory_bytes{kind=\"module_bytes\"}") as usize;
    assert_eq!(held, sleep.bytes().len(), "bytes held");
    let view = crate::pool::wait_for(&w.addr, Duration::from_secs(5), |v| {
        v[0].advert.jobs_run == 3
    })
    .await;
    assert_eq!(view[0].advert.modules_received, 2);
}
