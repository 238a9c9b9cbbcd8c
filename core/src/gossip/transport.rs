//! The shell around the gossip core: a node shared between the request
//! handler and the round loop ([`SharedNode`]), its messages sealed under
//! the cluster key, and rounds carried by a [`GossipTransport`] — HTTP
//! between workers ([`HttpTransport`]: two requests to `POST /v1/gossip`,
//! Syn → SynAck, then Ack, bodies in postcard), memory in tests
//! (`gossip::memory`).

use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;

use rand::SeedableRng;
use rand::rngs::SmallRng;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::Liveness;
use super::auth::{BadEnvelope, ClusterKey};
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

/// What time it is for a node, in milliseconds since it started: the
/// gossip clock (heartbeats, liveness, forgetting the dead).
#[derive(Debug)]
pub enum GossipClock {
    /// Real time since the node started.
    Real(Instant),
    /// Time a test sets ([`GossipClock::advance`]): liveness without waiting.
    Manual(AtomicU64),
}

impl GossipClock {
    /// Milliseconds since the start.
    pub fn now_ms(&self) -> u64 {
        match self {
            GossipClock::Real(started) => started.elapsed().as_millis() as u64,
            GossipClock::Manual(now) => now.load(Ordering::Relaxed),
        }
    }

    /// Moves a manual clock forward by `ms` (a real clock moves by itself).
    pub fn advance(&self, ms: u64) {
        if let GossipClock::Manual(now) = self {
            now.fetch_add(ms, Ordering::Relaxed);
        }
    }
}

/// How one node's gossip reaches another: a request body to the node at
/// an address, its reply body back (empty for an Ack). Bodies are sealed
/// already; a transport only carries them.
pub trait GossipTransport: Send + Sync {
    /// Sends `body` to the node at `addr` and returns its reply, at most
    /// [`MAX_MESSAGE_BYTES`](super::node::MAX_MESSAGE_BYTES) long.
    fn post<'a>(&'a self, addr: &'a str, body: Vec<u8>) -> BoxFuture<'a, Result<Vec<u8>, String>>;
}

/// Gossip between worker processes: `POST /v1/gossip`.
pub struct HttpTransport {
    http: crate::net::HttpClient,
}

impl HttpTransport {
    /// Gossip sent with `http` (its timeouts bound a round's exchanges; its
    /// transport says HTTP or TLS).
    pub fn new(http: crate::net::HttpClient) -> HttpTransport {
        HttpTransport { http }
    }
}

impl GossipTransport for HttpTransport {
    fn post<'a>(&'a self, addr: &'a str, body: Vec<u8>) -> BoxFuture<'a, Result<Vec<u8>, String>> {
        Box::pin(post(
            &self.http,
            self.http.url(addr, crate::proto::routes::GOSSIP),
            body,
        ))
    }
}

/// A node shared between the request handler and the round loop, with the
/// clock it is driven by.
pub struct SharedNode<R> {
    pub node: Mutex<GossipNode<R>>,
    clock: GossipClock,
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
    Unauthenticated(BadEnvelope),
}

impl<R: Clone> SharedNode<R> {
    /// A node whose messages are sealed with `key`, if given.
    pub fn new(node: GossipNode<R>, key: Option<ClusterKey>) -> Arc<SharedNode<R>> {
        SharedNode::with_clock(node, key, GossipClock::Real(Instant::now()))
    }

    /// [`new`](Self::new), driven by `clock`.
    pub fn with_clock(
        node: GossipNode<R>,
        key: Option<ClusterKey>,
        clock: GossipClock,
    ) -> Arc<SharedNode<R>> {
        Arc::new(SharedNode {
            node: Mutex::new(node),
            clock,
            stats: GossipStats::default(),
            key,
        })
    }

    /// The clock the node is driven by.
    pub fn clock(&self) -> &GossipClock {
        &self.clock
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

    /// Checks the first [`HEADER`](super::auth::HEADER) bytes of a request
    /// before its payload is read: `Ok(Some(len))`, the payload's length, if
    /// they are a sender's who knows the key (see `auth`); `Ok(None)`
    /// without a key (nothing to check); forged, stale and replayed heads
    /// are counted.
    pub fn precheck(&self, head: &[u8]) -> Result<Option<u64>, GossipError> {
        match &self.key {
            None => Ok(None),
            Some(key) => key.precheck(head).map(Some).map_err(|e| {
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
        self.clock.now_ms()
    }

    /// The node itself, locked.
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
                let reply = postcard::to_allocvec(&ack)
                    .map_err(|e| GossipError::Malformed(e.to_string()))?;
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
    transport: Arc<dyn GossipTransport>,
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
        round(&shared, transport.as_ref(), &mut rng, &mut refresh).await;
    }
}

/// One gossip round: `refresh` the record, beat the heartbeat, forget the
/// long dead, then exchange with the peers chosen (concurrently: a slow or
/// dead peer costs at most the transport's timeout).
pub async fn round<R>(
    shared: &SharedNode<R>,
    transport: &dyn GossipTransport,
    rng: &mut SmallRng,
    refresh: &mut (impl FnMut(&mut GossipNode<R>) + Send),
) where
    R: Clone + Serialize + DeserializeOwned,
{
    GossipStats::add(&shared.stats.rounds, 1);
    let (targets, syn) = {
        let mut node = shared.lock();
        refresh(&mut node);
        node.tick();
        node.forget_dead(shared.now_ms());
        let mut targets = node.choose_peers(rng, shared.now_ms());
        for addr in node.take_introductions() {
            if !targets.contains(&addr) {
                targets.push(addr);
            }
        }
        (targets, node.syn())
    };
    let exchanges = targets
        .into_iter()
        .map(|addr| exchange(shared, transport, addr, syn.clone()));
    futures::future::join_all(exchanges).await;
}

/// One round with every peer not known dead, rather than a random few:
/// a leaving worker's last record (`draining`) reaches the whole pool at
/// once, so that it disappears from every view within one round. The
/// addresses of those it did not reach.
pub async fn farewell<R>(
    shared: &SharedNode<R>,
    transport: &dyn GossipTransport,
    refresh: &mut (impl FnMut(&mut GossipNode<R>) + Send),
) -> Vec<String>
where
    R: Clone + Serialize + DeserializeOwned,
{
    let (targets, syn) = {
        let mut node = shared.lock();
        refresh(&mut node);
        node.tick();
        let now = shared.now_ms();
        let targets: Vec<String> = node
            .peers(now)
            .filter(|(_, _, l)| *l != Liveness::Dead)
            .map(|(id, _, _)| id.addr.clone())
            .collect();
        (targets, node.syn())
    };
    let exchanges = targets
        .iter()
        .map(|addr| exchange(shared, transport, addr.clone(), syn.clone()));
    let reached = futures::future::join_all(exchanges).await;
    targets
        .into_iter()
        .zip(reached)
        .filter(|(_, ok)| !ok)
        .map(|(addr, _)| addr)
        .collect()
}

/// One exchange with `addr`; whether it went through.
async fn exchange<R>(
    shared: &SharedNode<R>,
    transport: &dyn GossipTransport,
    addr: String,
    syn: Syn,
) -> bool
where
    R: Clone + Serialize + DeserializeOwned,
{
    let result: Result<(), String> = async {
        let body =
            postcard::to_allocvec(&GossipRequest::<R>::Syn(syn)).map_err(|e| e.to_string())?;
        let reply = transport.post(&addr, shared.seal(body)).await?;
        let reply = shared.open(&reply).map_err(|e| e.to_string())?;
        let syn_ack: SynAck<R> = postcard::from_bytes(reply).map_err(|e| {
            GossipStats::add(&shared.stats.rejected, 1);
            format!("bad SynAck: {e}")
        })?;
        let ack = shared.lock().handle_syn_ack(syn_ack, shared.now_ms());
        let body = postcard::to_allocvec(&GossipRequest::Ack(ack)).map_err(|e| e.to_string())?;
        transport.post(&addr, shared.seal(body)).await?;
        Ok(())
    }
    .await;
    match result {
        Ok(()) => {
            GossipStats::add(&shared.stats.exchanges_ok, 1);
            true
        }
        Err(e) => {
            GossipStats::add(&shared.stats.exchanges_failed, 1);
            tracing::debug!(peer = %addr, "gossip exchange failed: {e}");
            false
        }
    }
}

async fn post(
    http: &crate::net::HttpClient,
    url: String,
    body: Vec<u8>,
) -> Result<Vec<u8>, String> {
    let request = http
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, POSTCARD)
        .body(body);
    let resp = http.send(request).await.map_err(|e| e.why)?;
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
