//! Accepting connections, within limits a stranger cannot exhaust.
//!
//! `axum::serve` has neither a header timeout nor a connection cap, so a
//! client that opens connections and sends nothing (or headers a byte a
//! minute: slowloris) could hold every descriptor of the worker. Here each
//! connection is served by hyper with a header read timeout, at most
//! `max_connections` are served at once, at most
//! `max_connections_per_address` from one address and at most half of all
//! from one network prefix (a /24, a /64: the addresses one party is likely
//! to have), so neither one client nor a few addresses of one network can
//! take every connection from the others; and on shutdown the listener
//! closes while the connections in flight finish (idle keep-alive ones are
//! closed at once).
//!
//! A cap that is reached does not simply turn the newcomer away — that is
//! what lets whoever holds idle connections lock everyone out. It closes an
//! idle connection of the full group (the address, the prefix, or all)
//! that has not proved it belongs ([`Trust`]: a request with a tenant's
//! token, or gossip sealed with the pool's key) — the oldest of the address
//! that holds the most such — and the newcomer takes its place; only when
//! no connection of the group is idle or all have proved they belong is
//! the newcomer closed (and counted). A party that keeps
//! connections idle thus keeps them only until someone else needs one;
//! and under pressure (three quarters of the connections open) a new
//! connection has [`PRESSED_HEADER_TIMEOUT`] for its headers.
//!
//! With TLS, the handshake happens in the connection's own task, within
//! the header timeout (a client that starts a handshake and stalls holds
//! a connection no longer than one that sends no headers); a failed
//! handshake (a client of another pool, a plain-HTTP client) is logged
//! and closes that connection only.
//!
//! Each request carries its connection's address ([`Remote`]): a caller
//! who has not authenticated is charged by it (`worker::budget`).

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tower_layer::Layer;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Notify;

/// Connections served at once unless `--max-connections` says otherwise.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// The share of `--max-connections` one address may hold unless
/// `--max-connections-per-address` says otherwise: a quarter.
pub const DEFAULT_PER_ADDRESS_SHARE: usize = 4;

/// How long a client has to send a request's headers unless
/// `--header-timeout` says otherwise.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// The header timeout of a connection accepted while three quarters of
/// `max_connections` are open (if shorter than the configured one).
pub const PRESSED_HEADER_TIMEOUT: Duration = Duration::from_secs(2);

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

    /// Connections one network prefix (a /24, a /64) may hold at once:
    /// half of all, and never fewer than one address may.
    pub fn per_prefix(&self) -> usize {
        (self.max_connections / 2).max(self.per_address())
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

/// What the worker knows of one connection (a request extension): whether
/// it has proved it belongs — a request on it carried a tenant's token, or
/// gossip sealed with the pool's key — and how many of its requests are in
/// flight (their answers included). Only a connection that has not proved
/// it belongs, and is idle, is ever closed to make room. It also closes
/// the connection on request ([`close`](Self::close)): an answer its client
/// does not read cannot be dropped otherwise, as the connection is stuck
/// writing it.
#[derive(Clone, Debug, Default)]
pub struct Trust(Arc<ConnState>);

#[derive(Debug, Default)]
struct ConnState {
    trusted: AtomicBool,
    in_flight: AtomicU64,
    close: Notify,
}

impl Trust {
    /// Marks the connection as one that belongs.
    pub fn grant(&self) {
        self.0.trusted.store(true, Ordering::Relaxed);
    }

    /// Closes the connection, whatever it is doing.
    pub fn close(&self) {
        self.0.close.notify_one();
    }

    fn granted(&self) -> bool {
        self.0.trusted.load(Ordering::Relaxed)
    }

    fn idle(&self) -> bool {
        self.0.in_flight.load(Ordering::Relaxed) == 0
    }
}

/// Middleware: counts a connection's requests in flight, from their head
/// until the last byte of their answer is gone (a streamed job's answer
/// lasts as long as the job).
pub async fn in_flight(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use http_body_util::BodyExt;
    let Some(trust) = req.extensions().get::<Trust>().cloned() else {
        return next.run(req).await;
    };
    struct Busy(Trust);
    impl Drop for Busy {
        fn drop(&mut self) {
            self.0.0.in_flight.fetch_sub(1, Ordering::Relaxed);
        }
    }
    trust.0.in_flight.fetch_add(1, Ordering::Relaxed);
    let busy = Busy(trust);
    let resp = next.run(req).await;
    resp.map(|body| {
        axum::body::Body::new(body.map_frame(move |frame| {
            let _busy = &busy;
            frame
        }))
    })
}

/// The network an address is likely one party's share of: its /24 (IPv4)
/// or /64 (IPv6).
fn prefix(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, c, _] = v4.octets();
            IpAddr::V4(std::net::Ipv4Addr::new(a, b, c, 0))
        }
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => prefix(IpAddr::V4(v4)),
            None => IpAddr::V6(std::net::Ipv6Addr::from(
                u128::from(v6) & !((1u128 << 64) - 1),
            )),
        },
    }
}

/// One open connection.
struct Open {
    id: u64,
    ip: IpAddr,
    opened: std::time::Instant,
    trust: Trust,
}

/// The open connections; a slot is given back when its guard drops.
#[derive(Default)]
struct Connections {
    open: Mutex<Vec<Open>>,
    next: AtomicU64,
}

/// A connection's place in [`Connections`].
struct Slot {
    table: Arc<Connections>,
    id: u64,
    /// Its state; notified when it is to be closed.
    trust: Trust,
}

/// How a connection was let in.
struct Admitted {
    slot: Slot,
    /// Connections open, this one included.
    open: usize,
    /// Connections closed to make room for it.
    evicted: u64,
}

impl Connections {
    /// A place for a connection from `ip` within `limits`, closing the
    /// oldest untrusted connection of each full group to make it (see the
    /// module docs); `None` if a full group has none to close.
    fn admit(self: &Arc<Self>, ip: IpAddr, limits: &ServeLimits) -> Option<Admitted> {
        let mut open = self.open.lock();
        let net = prefix(ip);
        let mut evicted = 0;
        type Group<'a> = (usize, &'a dyn Fn(&Open) -> bool);
        let groups: [Group<'_>; 3] = [
            (limits.per_address(), &|c: &Open| c.ip == ip),
            (limits.per_prefix(), &|c: &Open| prefix(c.ip) == net),
            (limits.max_connections.max(1), &|_: &Open| true),
        ];
        for (max, in_group) in groups {
            if open.iter().filter(|c| in_group(c)).count() < max {
                continue;
            }
            // From the address that holds the most of them, its oldest:
            // whoever hoards idle connections loses them first, and a
            // newcomer's one connection is not taken before it has
            // sent its request.
            let evictable = |c: &&Open| in_group(c) && !c.trust.granted() && c.trust.idle();
            let mut held: Vec<(IpAddr, usize)> = Vec::new();
            for c in open.iter().filter(evictable) {
                match held.iter_mut().find(|(ip, _)| *ip == c.ip) {
                    Some((_, n)) => *n += 1,
                    None => held.push((c.ip, 1)),
                }
            }
            let (hoarder, _) = held.into_iter().max_by_key(|(_, n)| *n)?;
            let oldest = open
                .iter()
                .enumerate()
                .filter(|(_, c)| evictable(c) && c.ip == hoarder)
                .min_by_key(|(_, c)| c.opened)
                .map(|(i, _)| i)?;
            let closed = open.swap_remove(oldest);
            tracing::debug!(peer = %closed.ip, "closed an idle unauthenticated connection to make room");
            closed.trust.close();
            evicted += 1;
        }
        let (id, trust) = (self.next.fetch_add(1, Ordering::Relaxed), Trust::default());
        open.push(Open {
            id,
            ip,
            opened: std::time::Instant::now(),
            trust: trust.clone(),
        });
        Some(Admitted {
            slot: Slot {
                table: self.clone(),
                id,
                trust,
            },
            open: open.len(),
            evicted,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.table.open.lock().retain(|c| c.id != self.id);
    }
}

/// Serves `app` on `listener` (over TLS with `tls`) until `shutdown`
/// resolves, then finishes the requests in flight. `refused` counts
/// connections closed at a cap: turned away, or closed to make room.
pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    app: Router,
    limits: ServeLimits,
    refused: Arc<AtomicU64>,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let graceful = GracefulShutdown::new();
    let connections = Arc::new(Connections::default());
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
        let Some(Admitted {
            slot,
            open,
            evicted,
        }) = connections.admit(peer.ip(), &limits)
        else {
            refused.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(peer = %peer.ip(), "connection refused: every connection of its group is busy or belongs to a tenant or peer");
            continue; // dropping it closes it
        };
        refused.fetch_add(evicted, Ordering::Relaxed);
        let header_timeout = match open * 4 >= limits.max_connections * 3 {
            true => limits.header_timeout.min(PRESSED_HEADER_TIMEOUT),
            false => limits.header_timeout,
        };
        // TCP_NODELAY: a response goes out in several writes (head, then
        // body frames); with Nagle's algorithm each small write after the
        // first waits for the client's delayed ACK, 40 ms on Linux.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("cannot set TCP_NODELAY: {e}");
        }
        let mut http1 = hyper::server::conn::http1::Builder::new();
        http1
            .timer(TokioTimer::new())
            .header_read_timeout(header_timeout);
        let extensions = (
            axum::Extension(Remote(peer.ip())),
            axum::Extension(slot.trust.clone()),
        );
        let service = TowerToHyperService::new(extensions.layer(app.clone()));
        let watcher = graceful.watcher();
        let (acceptor, handshake_timeout) = (
            tls.clone().map(tokio_rustls::TlsAcceptor::from),
            header_timeout,
        );
        tokio::spawn(async move {
            let state = slot.trust.0.clone();
            let served = async {
                match acceptor {
                    None => {
                        watcher
                            .watch(http1.serve_connection(TokioIo::new(tcp), service))
                            .await
                    }
                    Some(acceptor) => {
                        match tokio::time::timeout(handshake_timeout, acceptor.accept(tcp)).await {
                            Ok(Ok(stream)) => {
                                watcher
                                    .watch(http1.serve_connection(TokioIo::new(stream), service))
                                    .await
                            }
                            Ok(Err(e)) => {
                                tracing::debug!(peer = %peer.ip(), "TLS handshake failed: {e}");
                                Ok(())
                            }
                            Err(_) => {
                                tracing::debug!(peer = %peer.ip(), "TLS handshake not done within the header timeout");
                                Ok(())
                            }
                        }
                    }
                }
            };
            // Closed to make room (it had not proved it belongs), or by its
            // handler (an answer nobody reads): dropped, whatever it was doing.
            let ended = tokio::select! {
                ended = served => ended,
                () = state.close.notified() => Ok(()),
            };
            if let Err(e) = ended {
                tracing::debug!("connection ended: {e}");
            }
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}
