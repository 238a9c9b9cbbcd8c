//! Accepting connections, within limits a stranger cannot exhaust.
//!
//! `axum::serve` has neither a header timeout nor a connection cap, so a
//! client that opens connections and sends nothing (or headers a byte a
//! minute: slowloris) could hold every descriptor of the worker. Here each
//! connection is served by hyper with a header read timeout, at most
//! `max_connections` are served at once and at most
//! `max_connections_per_address` from one address (more are closed as they
//! arrive, and counted), so one client cannot take every connection from
//! the others; and on shutdown the listener closes while the connections
//! in flight finish (idle keep-alive ones are closed at once).
//!
//! With TLS, the handshake happens in the connection's own task, within
//! the header timeout (a client that starts a handshake and stalls holds
//! a connection no longer than one that sends no headers); a failed
//! handshake (a client of another pool, a plain-HTTP client) is logged
//! and closes that connection only.
//!
//! Each request carries its connection's address ([`Remote`]): a caller
//! who has not authenticated is charged by it (`worker::budget`).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tower_layer::Layer;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Connections served at once unless `--max-connections` says otherwise.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// The share of `--max-connections` one address may hold unless
/// `--max-connections-per-address` says otherwise: a quarter.
pub const DEFAULT_PER_ADDRESS_SHARE: usize = 4;

/// How long a client has to send a request's headers unless
/// `--header-timeout` says otherwise.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// The limits of the accept loop.
#[derive(Clone, Debug)]
pub struct ServeLimits {
    /// Connections served at once. Default: [`DEFAULT_MAX_CONNECTIONS`].
    pub max_connections: usize,
    /// Connections served at once from one address. Default:
    /// `max_connections` / [`DEFAULT_PER_ADDRESS_SHARE`] (see
    /// [`per_address`](Self::per_address)).
    pub max_connections_per_address: Option<usize>,
    /// Time to send a request's headers. Default: [`DEFAULT_HEADER_TIMEOUT`].
    pub header_timeout: Duration,
}

impl ServeLimits {
    /// Connections one address may hold at once.
    pub fn per_address(&self) -> usize {
        self.max_connections_per_address
            .unwrap_or(self.max_connections / DEFAULT_PER_ADDRESS_SHARE)
            .clamp(1, self.max_connections.max(1))
    }
}

impl Default for ServeLimits {
    fn default() -> Self {
        ServeLimits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_address: None,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
        }
    }
}

/// The address a request's connection comes from (a request extension).
#[derive(Clone, Copy, Debug)]
pub struct Remote(pub IpAddr);

/// Connections open per address; a slot is given back when its guard drops.
#[derive(Default)]
struct PerAddress(Mutex<HashMap<IpAddr, usize>>);

struct AddressSlot {
    table: Arc<PerAddress>,
    ip: IpAddr,
}

impl PerAddress {
    fn take(self: &Arc<Self>, ip: IpAddr, max: usize) -> Option<AddressSlot> {
        let mut open = self.0.lock();
        let n = open.entry(ip).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(AddressSlot { table: self.clone(), ip })
    }
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut open = self.table.0.lock();
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// Serves `app` on `listener` (over TLS with `tls`) until `shutdown`
/// resolves, then finishes the requests in flight. `refused` counts
/// connections closed at the cap.
pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    app: Router,
    limits: ServeLimits,
    refused: Arc<AtomicU64>,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let graceful = GracefulShutdown::new();
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let per_address = Arc::new(PerAddress::default());
    let address_max = limits.per_address();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors, say: wait rather than spin.
                    tracing::warn!("cannot accept a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            refused.fetch_add(1, Ordering::Relaxed);
            tracing::debug!("connection refused: {} connections already", limits.max_connections);
            continue; // dropping it closes it
        };
        let Some(slot) = per_address.take(peer.ip(), address_max) else {
            refused.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(peer = %peer.ip(), "connection refused: {address_max} connections from this address already");
            continue;
        };
        // TCP_NODELAY: a response goes out in several writes (head, then
        // body frames); with Nagle's algorithm each small write after the
        // first waits for the client's delayed ACK, 40 ms on Linux.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("cannot set TCP_NODELAY: {e}");
        }
        let mut http1 = hyper::server::conn::http1::Builder::new();
        http1.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout);
        let service = TowerToHyperService::new(axum::Extension(Remote(peer.ip())).layer(app.clone()));
        let watcher = graceful.watcher();
        let (acceptor, handshake_timeout) = (tls.clone().map(tokio_rustls::TlsAcceptor::from), limits.header_timeout);
        tokio::spawn(async move {
            let ended = match acceptor {
                None => watcher.watch(http1.serve_connection(TokioIo::new(tcp), service)).await,
                Some(acceptor) => match tokio::time::timeout(handshake_timeout, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => watcher.watch(http1.serve_connection(TokioIo::new(stream), service)).await,
                    Ok(Err(e)) => {
                        tracing::debug!(peer = %peer.ip(), "TLS handshake failed: {e}");
                        Ok(())
                    }
                    Err(_) => {
                        tracing::debug!(peer = %peer.ip(), "TLS handshake not done within the header timeout");
                        Ok(())
                    }
                },
            };
            if let Err(e) = ended {
                tracing::debug!("connection ended: {e}");
            }
            drop((permit, slot));
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}
