//! How a peerwasm process reaches another over the network, and is
//! reached: plain HTTP, or TLS (rustls) with a pool's own CA.
//!
//! A pool is TLS throughout or not at all: a worker with a certificate
//! serves only TLS and speaks TLS to its peers (gossip, detached maps'
//! jobs); a client that trusts a CA (`--tls-ca`, `PEERWASM_TLS_CA`)
//! speaks only TLS. Addresses stay `host:port`; the scheme follows the
//! configuration ([`Transport`]).
//!
//! Without TLS a tenant's token crosses the network in clear, so it is sent
//! in clear only to a loopback address, or when the user said so
//! (`--insecure-http`): [`Transport::may_carry_token_to`].
//!
//! * `addr` — whether an address is this machine's loopback;
//! * [`transport`] — [`Transport`] (scheme, trusted CA, the clear-text
//!   rule) and [`HttpClient`], a reqwest client bound to one;
//! * [`tls`] — PEM files into rustls configurations, a key file's
//!   permissions, and a worker's check of its own certificate;
//! * [`certs`] — `peerwasm tls init` and `issue`: a pool CA and worker
//!   certificates (rcgen);
//! * [`exchange`] — where a client's requests go instead of the network:
//!   a worker's router in the same process, for tests;
//! * [`errors`] — why a connection failed, in words (an expired
//!   certificate, another CA, a worker that does not speak TLS).

pub(crate) mod addr;
pub mod certs;
pub mod errors;
pub mod exchange;
pub mod tls;
pub mod transport;

pub use addr::is_loopback;
pub use errors::describe;
pub use transport::{HttpClient, Transport};
