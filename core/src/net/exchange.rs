//! [`Exchange`]: where an [`HttpClient`](super::HttpClient)'s requests go
//! when they do not go to the network — a worker's router served in the same
//! process, for tests that drive the real API through the typed client
//! without sockets (`server::memory` in crate `peerwasm`).
//!
//! Why a seam at the level of HTTP requests rather than of worker methods:
//! what the in-memory worker runs is the real router — its extractors,
//! middleware, refusals and body limits — and what the client runs is the
//! real [`WorkerApi`](crate::client::WorkerApi): only the bytes between
//! them skip the kernel. A contract suite runs over both this and real HTTP
//! (chitchat's habit with its transports), so the two cannot drift.
//!
//! The request keeps its body as it was built (streamed bodies stream);
//! the answer's body streams too, so a batch's frames and a streamed job's
//! output come as they are written.

use std::future::Future;
use std::pin::Pin;

/// One request, its answer: what an in-process server does with what
/// [`HttpClient`](super::HttpClient) would have sent on a connection.
pub trait Exchange: Send + Sync + 'static {
    /// Answers `request` (its URL's host is the address the client asked
    /// for; the token, if any, is in its `Authorization` header). `Err`
    /// says why there was no answer, as a broken connection would.
    fn exchange(&self, request: http::Request<reqwest::Body>) -> ExchangeFuture;
}

/// What [`Exchange::exchange`] gives back.
pub type ExchangeFuture =
    Pin<Box<dyn Future<Output = Result<http::Response<reqwest::Body>, String>> + Send>>;

/// Why a request got no answer: the connection failed (`connect`: before
/// anything was sent) or broke, in words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendError {
    /// Whether nothing was sent (the connection was never made).
    pub connect: bool,
    /// What happened, said for a person (`net::describe`).
    pub why: String,
}

impl SendError {
    pub(crate) fn from_reqwest(e: &reqwest::Error) -> SendError {
        SendError {
            connect: e.is_connect(),
            why: super::describe(e),
        }
    }
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.why)
    }
}

impl std::error::Error for SendError {}
