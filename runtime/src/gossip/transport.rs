//! The HTTP shell around the gossip core: one round is two requests to
//! `POST /v1/gossip` (Syn → SynAck, then Ack), bodies in postcard.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use parking_lot::Mutex;
use std::time::{Duration, Instant};

use rand::SeedableRng;
use rand::rngs::SmallRng;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::auth::{ClusterKey, Refused};
use super::messages::{Ack, Syn, SynAck};
use super::node::GossipNode;
use crate::proto::POSTCARD;

/// The body of `POST /v1/gossip`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum GossipRequest<R> {
    /// Opens a round; answered with a `SynAck`.
    Syn(Syn),
    /// Closes a round; answered with an empty body.
    Ack(Ack<R>),
}

/// Counters of the gossip traffic of one node, for `/metrics`.
#[derive(Debug, Default)]
pub struct GossipStats {
    /// Rounds started.
    pub rounds: AtomicU64,
    /// Exchanges with a peer that completed, and that failed.
    pub exchanges_ok: AtomicU64,
    pub exchanges_failed: AtomicU64,
    /// Bytes of gossip bodies sent and received (both directions of both
    /// roles).
    pub bytes_sent: AtomicU64,
    pub bytes_received: AtomicU64,
    /// Messages received that could not be decoded, and were dropped.
    pub rejected: AtomicU64,
    /// Messages received with a bad MAC, stale or replayed (with a cluster
    /// key), and dropped.
    pub forged: AtomicU64,
}

impl GossipStats {
    fn add(counter: &AtomicU64, n: usize) {
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// A node shared between the HTTP handler and the round loop, with the
/// clock it is driven by.
pub struct SharedNode<R> {
    pub node: Mutex<GossipNode<R>>,
    started: Instant,
    /// Traffic counters.
    pub stats: GossipStats,
    /// The cluster key every message is sealed with, if any.
    key: Option<ClusterKey>,
}

/// Why a gossip request was not handled.
#[derive(Debug, thiserror::Error)]
pub enum GossipError {
    /// The bytes are not a gossip message.
    #[error("bad gossip message: {0}")]
    Malformed(String),
    /// Forged, stale or replayed (under a cluster key).
    #[error("{0}")]
    Unauthenticated(Refused),
}

impl<R: Clone> SharedNode<R> {
    /// A node whose messages are sealed with `key`, if given.
    pub fn new(node: GossipNode<R>, key: Option<ClusterKey>) -> Arc<SharedNode<R>> {
        Arc::new(SharedNode { node: Mutex::new(node), started: Instant::now(), stats: GossipStats::default(), key })
    }

    /// Seals an outgoing body (as is without a key).
    fn seal(&self, body: Vec<u8>) -> Vec<u8> {
        let out = match &self.key {
            Some(key) => key.seal(&body),
            None => body,
        };
        GossipStats::add(&self.stats.bytes_sent, out.len());
        out
    }

    /// Opens an incoming body; forged, stale and replayed ones are counted.
    fn open<'a>(&self, wire: &'a [u8]) -> Result<&'a [u8], GossipError> {
        GossipStats::add(&self.stats.bytes_received, wire.len());
        match &self.key {
            None => Ok(wire),
            Some(key) => key.open(wire).map_err(|e| {
                GossipStats::add(&self.stats.forged, 1);
                GossipError::Unauthenticated(e)
            }),
        }
    }

    /// Whether messages are sealed with a cluster key.
    pub fn is_keyed(&self) -> bool {
        self.key.is_some()
    }

    /// Milliseconds since this node started: the gossip clock.
    pub fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    pub fn lock(&self) -> parking_lot::MutexGuard<'_, GossipNode<R>> {
        self.node.lock()
    }

    /// Handles a request body; returns the response body (empty for an Ack).
    pub fn handle(&self, body: &[u8]) -> Result<Vec<u8>, GossipError>
    where
        R: Serialize + DeserializeOwned,
    {
        let body = self.open(body)?;
        let request: GossipRequest<R> = postcard::from_bytes(body).map_err(|e| {
            GossipStats::add(&self.stats.rejected, 1);
            GossipError::Malformed(e.to_string())
        })?;
        let now = self.now_ms();
        match request {
            GossipRequest::Syn(syn) => {
                let ack = self.lock().handle_syn(syn);
                let reply = postcard::to_allocvec(&ack).map_err(|e| GossipError::Malformed(e.to_string()))?;
                Ok(self.seal(reply))
            }
            GossipRequest::Ack(ack) => {
                self.lock().handle_ack(ack, now);
                Ok(Vec::new())
            }
        }
    }
}

/// Runs gossip rounds every `interval` until the task is dropped; before
/// each round `refresh` may publish a new record.
pub async fn run_rounds<R>(
    shared: Arc<SharedNode<R>>,
    http: reqwest::Client,
    interval: Duration,
    mut refresh: impl FnMut(&mut GossipNode<R>) + Send,
) where
    R: Clone + Serialize + DeserializeOwned + Send + 'static,
{
    let mut rng = SmallRng::from_rng(&mut rand::rng());
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        GossipStats::add(&shared.stats.rounds, 1);
        let (targets, syn) = {
            let mut node = shared.lock();
            refresh(&mut node);
            node.tick();
            node.forget_dead(shared.now_ms());
            (node.choose_peers(&mut rng, shared.now_ms()), node.syn())
        };
        // Exchanges with the round's peers run concurrently; a slow or
        // dead peer costs at most the request timeout.
        let exchanges = targets.into_iter().map(|addr| exchange(&shared, &http, addr, syn.clone()));
        futures::future::join_all(exchanges).await;
    }
}

async fn exchange<R>(shared: &SharedNode<R>, http: &reqwest::Client, addr: String, syn: Syn)
where
    R: Clone + Serialize + DeserializeOwned,
{
    let url = format!("http://{addr}/v1/gossip");
    let result: Result<(), String> = async {
        let body = postcard::to_allocvec(&GossipRequest::<R>::Syn(syn)).map_err(|e| e.to_string())?;
        let reply = post(http, &url, shared.seal(body)).await?;
        let reply = shared.open(&reply).map_err(|e| e.to_string())?;
        let syn_ack: SynAck<R> = postcard::from_bytes(reply).map_err(|e| {
            GossipStats::add(&shared.stats.rejected, 1);
            format!("bad SynAck: {e}")
        })?;
        let ack = shared.lock().handle_syn_ack(syn_ack, shared.now_ms());
        let body = postcard::to_allocvec(&GossipRequest::Ack(ack)).map_err(|e| e.to_string())?;
        post(http, &url, shared.seal(body)).await?;
        Ok(())
    }
    .await;
    match result {
        Ok(()) => GossipStats::add(&shared.stats.exchanges_ok, 1),
        Err(e) => {
            GossipStats::add(&shared.stats.exchanges_failed, 1);
            tracing::debug!(peer = %addr, "gossip exchange failed: {e}");
        }
    }
}

async fn post(http: &reqwest::Client, url: &str, body: Vec<u8>) -> Result<Vec<u8>, String> {
    let resp = http
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, POSTCARD)
        .body(body)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        return Err(format!("{}", resp.status()));
    }
    read_capped(resp, super::node::MAX_MESSAGE_BYTES).await
}

/// A reply's body, read no further than `cap` bytes: a reply is read
/// before its MAC is checked, so a peer (or whoever answers at its
/// address) must not make this node hold more than a message can be.
async fn read_capped(mut resp: reqwest::Response, cap: usize) -> Result<Vec<u8>, String> {
    let too_large = || format!("the reply is larger than a gossip message can be ({cap} bytes)");
    if resp.content_length().is_some_and(|n| n > cap as u64) {
        return Err(too_large());
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| e.to_string())? {
        if body.len() + chunk.len() > cap {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}
