//! Workers served in memory: [`MemoryWorker`], a worker built from a
//! [`WorkerConfig`] exactly as [`start`](super::start) builds one — its core,
//! its owner, its real router — but reached through a [`MemoryNetwork`]
//! instead of a socket. Tests drive it with the real typed client
//! ([`WorkerApi`](crate::client::WorkerApi), a [`Target`](crate::Target)
//! over [`MemoryNetwork::transport`]), so the job path, the owner and every
//! endpoint are tested in milliseconds, in one process, without ports.
//!
//! What is not there: the connection layer (`serve`: limits on
//! connections, header timeouts, TLS) — each request arrives as from a
//! fresh loopback connection — and the gossip rounds' timer: a test runs a
//! round when it wants one ([`MemoryWorker::gossip_round`]), so liveness
//! follows the test, not the wall clock. What it kept is put back and its
//! owned submissions resume, as at a real start. Several workers on one
//! network reach each other (gossip, the jobs of maps an owner runs)
//! through it.
//!
//! ```no_run
//! use peerwasm::server::WorkerConfig;
//! use peerwasm::server::memory::{MemoryNetwork, MemoryWorker};
//! use peerwasm::{Job, Pool, PoolConfig, Target};
//!
//! # async fn demo() -> anyhow::Result<()> {
//! let network = MemoryNetwork::new();
//! let worker = MemoryWorker::start(WorkerConfig::new("127.0.0.1:0".parse()?), &network).await?;
//! let pool = Pool::new(PoolConfig {
//!     transport: network.transport(),
//!     ..PoolConfig::new(vec![worker.addr.clone()])
//! })?;
//! let job = Job::from_file("hello.wasm")?;
//! let result = Target::Pool(pool.into()).run(&job, job.spec(b"hi".to_vec(), 64u64 << 20)).await?;
//! assert!(result.outcome.is_success());
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};

use axum::http;
use parking_lot::RwLock;

use super::assemble::{Assembled, assemble};
use super::config::WorkerConfig;
use super::serve::{Remote, Trust};
use super::start::{gossip_transport, refresh_record};
use crate::gossip::transport::HttpTransport;
use crate::net::Transport;
use crate::net::exchange::{Exchange, ExchangeFuture};
use crate::owner::Owner;
use crate::worker::state::Worker;

/// Workers in one process, each under its address: where requests to
/// those addresses go ([`transport`](Self::transport)). Cheap to clone.
#[derive(Clone, Default)]
pub struct MemoryNetwork {
    routers: Arc<RwLock<HashMap<String, axum::Router>>>,
    /// The next port handed out (addresses are `127.0.0.1:port`, bound to
    /// nothing).
    next_port: Arc<AtomicU16>,
}

impl MemoryNetwork {
    /// A network with nobody on it.
    pub fn new() -> MemoryNetwork {
        MemoryNetwork {
            next_port: Arc::new(AtomicU16::new(1)),
            ..MemoryNetwork::default()
        }
    }

    /// A transport whose requests go to this network's workers: give it to
    /// a [`PoolConfig`](crate::PoolConfig), or to
    /// [`HttpClient`](crate::net::HttpClient)s.
    pub fn transport(&self) -> Transport {
        Transport::in_memory(Arc::new(self.clone()))
    }

    /// Takes `addr` off the network: requests to it fail as a refused
    /// connection would (a worker that died).
    pub fn unplug(&self, addr: &str) {
        self.routers.write().remove(addr);
    }

    fn address(&self) -> String {
        let port = self.next_port.fetch_add(1, Ordering::Relaxed).max(1);
        format!("127.0.0.1:{port}")
    }
}

impl Exchange for MemoryNetwork {
    fn exchange(&self, request: http::Request<reqwest::Body>) -> ExchangeFuture {
        let addr = request
            .uri()
            .authority()
            .map(|a| a.as_str().to_string())
            .unwrap_or_default();
        let router = self.routers.read().get(&addr).cloned();
        Box::pin(async move {
            let Some(mut router) = router else {
                return Err(format!("nothing listens at {addr} (in memory)"));
            };
            let (parts, body) = request.into_parts();
            let mut request = http::Request::from_parts(parts, axum::body::Body::new(body));
            // What `serve` gives every request of a connection.
            request
                .extensions_mut()
                .insert(Remote(IpAddr::V4(Ipv4Addr::LOCALHOST)));
            request.extensions_mut().insert(Trust::default());
            let response = match tower_service::Service::call(&mut router, request).await {
                Ok(response) => response,
                Err(never) => match never {},
            };
            let (parts, body) = response.into_parts();
            let body = reqwest::Body::wrap_stream(body.into_data_stream());
            Ok(http::Response::from_parts(parts, body))
        })
    }
}

/// A worker served on a [`MemoryNetwork`]: built as `peerwasm worker`
/// builds one, with no socket and no gossip timer.
pub struct MemoryWorker {
    /// Its address on the network.
    pub addr: String,
    worker: Arc<Worker>,
    owner: Arc<Owner>,
    gossip: Arc<HttpTransport>,
    network: MemoryNetwork,
    /// Resumes its owned submissions, then forgets what expires.
    keeping: tokio::task::JoinHandle<()>,
}

impl MemoryWorker {
    /// Builds the worker `config` describes (its `listen` and `tls` are
    /// ignored: it is reached through `network`, in clear), puts back what
    /// its state directory kept, and puts it on `network` under a fresh
    /// address.
    pub async fn start(
        config: WorkerConfig,
        network: &MemoryNetwork,
    ) -> anyhow::Result<MemoryWorker> {
        Self::start_at(config, network, network.address()).await
    }

    /// A worker that died ([`stop`](Self::stop)) started again from
    /// `config` — its state directory — at the same address, as a restarted
    /// process would be. Waits (up to 10 s) for what the old one was doing
    /// to let go of its state directory's lock.
    pub async fn restart(self, config: WorkerConfig) -> anyhow::Result<MemoryWorker> {
        let (addr, network) = (self.addr.clone(), self.network.clone());
        drop(self);
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match Self::start_at(config.clone(), &network, addr.clone()).await {
                Err(e)
                    if tokio::time::Instant::now() < deadline
                        && format!("{e:#}").contains("in use by another") =>
                {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await
                }
                other => return other,
            }
        }
    }

    async fn start_at(
        config: WorkerConfig,
        network: &MemoryNetwork,
        addr: String,
    ) -> anyhow::Result<MemoryWorker> {
        let Assembled { worker, owner, app } = assemble(&config, &addr, Some(network.transport()))?;
        super::kept::restore_state(&owner, config.keep_results).await;
        let gossip = gossip_transport(&worker)?;
        network.routers.write().insert(addr.clone(), app);
        let keeping = tokio::spawn(super::kept::keep_state(owner.clone(), config.keep_results));
        Ok(MemoryWorker {
            addr,
            worker,
            owner,
            gossip,
            network: network.clone(),
            keeping,
        })
    }

    /// One gossip round, as the worker's timer would run it: its record
    /// refreshed, a digest sent to peers it knows (over the network).
    pub async fn gossip_round(&self) {
        let mut rng: rand::rngs::SmallRng =
            rand::SeedableRng::seed_from_u64(self.addr.len() as u64);
        let owner = Arc::downgrade(&self.owner);
        crate::gossip::transport::round(
            &self.worker.node.gossip,
            self.gossip.as_ref(),
            &mut rng,
            &mut |node| refresh_record(&self.worker, &owner, node),
        )
        .await;
    }

    /// The worker's core, for tests that look inside.
    #[cfg(test)]
    pub(crate) fn worker(&self) -> &Arc<Worker> {
        &self.worker
    }

    /// Takes it off the network (requests to it fail), cancels what it
    /// runs and closes its state database: a worker that died.
    pub fn stop(&self) {
        self.network.unplug(&self.addr);
        self.keeping.abort();
        self.owner.submissions.stop_all();
        self.worker
            .jobs
            .table
            .cancel_all(crate::proto::CancelCause::Shutdown, false);
        self.worker.jobs.kept.db.close();
    }
}

impl Drop for MemoryWorker {
    fn drop(&mut self) {
        self.stop();
    }
}
