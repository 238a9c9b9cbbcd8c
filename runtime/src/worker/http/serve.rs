//! Accepting connections, within limits a stranger cannot exhaust.
//!
//! `axum::serve` has neither a header timeout nor a connection cap, so a
//! client that opens connections and sends nothing (or headers a byte a
//! minute: slowloris) could hold every descriptor of the worker. Here each
//! connection is served by hyper with a header read timeout, at most
//! `max_connections` are served at once (more are closed as they arrive,
//! and counted), and on shutdown the listener closes while the connections
//! in flight finish (idle keep-alive ones are closed at once).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Connections served at once unless `--max-connections` says otherwise.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// How long a client has to send a request's headers unless
/// `--header-timeout` says otherwise.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// The limits of the accept loop.
#[derive(Clone, Debug)]
pub struct ServeLimits {
    /// Connections served at once. Default: [`DEFAULT_MAX_CONNECTIONS`].
    pub max_connections: usize,
    /// Time to send a request's headers. Default: [`DEFAULT_HEADER_TIMEOUT`].
    pub header_timeout: Duration,
}

impl Default for ServeLimits {
    fn default() -> Self {
        ServeLimits { max_connections: DEFAULT_MAX_CONNECTIONS, header_timeout: DEFAULT_HEADER_TIMEOUT }
    }
}

/// Serves `app` on `listener` until `shutdown` resolves, then finishes the
/// requests in flight. `refused` counts connections closed at the cap.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ServeLimits,
    refused: Arc<AtomicU64>,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let graceful = GracefulShutdown::new();
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let tcp = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
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
        // TCP_NODELAY: a response goes out in several writes (head, then
        // body frames); with Nagle's algorithm each small write after the
        // first waits for the client's delayed ACK, 40 ms on Linux.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("cannot set TCP_NODELAY: {e}");
        }
        let mut http1 = hyper::server::conn::http1::Builder::new();
        http1.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout);
        let conn = http1.serve_connection(TokioIo::new(tcp), TowerToHyperService::new(app.clone()));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!("connection ended: {e}");
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}
