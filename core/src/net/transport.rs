//! [`Transport`]: how this process reaches workers — plain HTTP or TLS
//! with a pool CA — and whether a token may go in clear; [`HttpClient`]: a
//! reqwest client bound to a transport, which builds each URL with its
//! scheme.

use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The environment variable naming the pool CA's certificate file
/// (`--tls-ca`'s default).
pub const TLS_CA_ENV: &str = "PEERWASM_TLS_CA";

/// The environment variable that allows a token in clear to a worker
/// off loopback (`--insecure-http`'s), when set to `1`.
pub const INSECURE_HTTP_ENV: &str = "PEERWASM_INSECURE_HTTP";

/// How this process reaches workers. Cheap to clone.
///
/// ```
/// use peerwasm_core::net::Transport;
/// let plain = Transport::plain();
/// assert_eq!(plain.url("10.0.0.7:7070", "/v1/peers"), "http://10.0.0.7:7070/v1/peers");
/// assert!(plain.may_carry_token_to("127.0.0.1:7070"));
/// assert!(!plain.may_carry_token_to("10.0.0.7:7070"), "a token in clear off loopback");
/// ```
#[derive(Clone, Default)]
pub struct Transport {
    /// TLS trusting this CA, or plain HTTP.
    tls: Option<(Arc<rustls::ClientConfig>, PathBuf)>,
    /// A token may go in clear off loopback.
    insecure_http: bool,
    /// Requests go to this in-process server instead of the network
    /// ([`Transport::in_memory`]).
    exchange: Option<Arc<dyn super::exchange::Exchange>>,
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.tls {
            _ if self.exchange.is_some() => write!(f, "Transport(in memory)"),
            Some((_, ca)) => write!(f, "Transport(tls, ca {})", ca.display()),
            None => write!(f, "Transport(http, insecure_http: {})", self.insecure_http),
        }
    }
}

impl Transport {
    /// Plain HTTP; a token only to loopback addresses.
    pub fn plain() -> Transport {
        Transport::default()
    }

    /// TLS, trusting the CA certificates in the PEM file `ca`.
    pub fn tls(ca: &Path) -> anyhow::Result<Transport> {
        let config = super::tls::client_config(ca)?;
        Ok(Transport {
            tls: Some((config, ca.to_path_buf())),
            insecure_http: false,
            exchange: None,
        })
    }

    /// Plain HTTP whose requests never leave the process: each goes to
    /// `exchange` (a worker's router served in memory, for tests), whatever
    /// its address. Addresses keep their meaning for everything else (which
    /// worker, whether a token may go there).
    pub fn in_memory(exchange: Arc<dyn super::exchange::Exchange>) -> Transport {
        Transport {
            exchange: Some(exchange),
            ..Transport::default()
        }
    }

    /// TLS if `ca` is given, else plain HTTP, which may carry a token off
    /// loopback if `insecure_http`.
    pub fn new(ca: Option<&Path>, insecure_http: bool) -> anyhow::Result<Transport> {
        let transport = match ca {
            Some(ca) => Transport::tls(ca)?,
            None => Transport::plain(),
        };
        Ok(Transport {
            insecure_http,
            ..transport
        })
    }

    /// As [`new`](Self::new), from `PEERWASM_TLS_CA` and
    /// `PEERWASM_INSECURE_HTTP=1` (for callers without a command line: the
    /// Python client).
    pub fn from_env() -> anyhow::Result<Transport> {
        let ca = std::env::var_os(TLS_CA_ENV)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from);
        let insecure = std::env::var(INSECURE_HTTP_ENV)
            .is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
        Transport::new(ca.as_deref(), insecure)
    }

    /// Whether connections are TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// `https` or `http`.
    pub fn scheme(&self) -> &'static str {
        if self.is_tls() { "https" } else { "http" }
    }

    /// The URL of `path` (a route, filled in, with any query) on the worker
    /// at `addr` (`host:port`).
    pub fn url(&self, addr: &str, path: &str) -> String {
        format!("{}://{addr}{path}", self.scheme())
    }

    /// Whether a tenant's token may be sent to `addr`: over TLS, to a
    /// loopback address, or when told so (`--insecure-http`).
    pub fn may_carry_token_to(&self, addr: &str) -> bool {
        self.is_tls() || self.insecure_http || super::addr::is_loopback(addr)
    }

    /// `Err` naming the first of `addrs` a token may not be sent to, and
    /// what to do about it.
    pub fn check_token_hops<'a>(
        &self,
        addrs: impl IntoIterator<Item = &'a String>,
    ) -> anyhow::Result<()> {
        match addrs.into_iter().find(|a| !self.may_carry_token_to(a)) {
            None => Ok(()),
            Some(addr) => anyhow::bail!(
                "refusing to send your token in clear to {addr}: anyone on the network between could read it and run \
                 jobs as you. Give the pool's CA (--tls-ca FILE or {TLS_CA_ENV}) for workers started with --tls-cert, \
                 or --insecure-http ({INSECURE_HTTP_ENV}=1) to send it in clear anyway"
            ),
        }
    }

    /// A client on this transport, from `builder` (timeouts), sending
    /// `headers` and `token` (if any, as `Authorization: Bearer`) on every
    /// request: callers check [`HttpClient::may_send_to`] first.
    pub fn client(
        &self,
        builder: reqwest::ClientBuilder,
        mut headers: reqwest::header::HeaderMap,
        token: Option<&str>,
    ) -> anyhow::Result<HttpClient> {
        super::tls::install_provider();
        let builder = match &self.tls {
            // Only https: a plain URL would be a bug, never a fallback.
            Some((config, _)) => builder
                .tls_backend_preconfigured((**config).clone())
                .https_only(true),
            None => builder.tls_backend_preconfigured((*super::tls::trusting_nothing()).clone()),
        };
        if let Some(token) = token {
            let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| anyhow::anyhow!("the token must be printable ASCII"))?;
            value.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        Ok(HttpClient {
            inner: builder.default_headers(headers.clone()).build()?,
            transport: self.clone(),
            headers,
        })
    }
}

/// A reqwest client bound to a [`Transport`]: [`url`](Self::url) builds
/// each address with its scheme. Derefs to `reqwest::Client`. Cheap to
/// clone.
#[derive(Clone, Debug)]
pub struct HttpClient {
    inner: reqwest::Client,
    transport: Transport,
    /// The headers every request carries — the token's `Authorization`,
    /// if any — which reqwest adds on the network and
    /// [`send`](Self::send) adds on an in-memory exchange.
    headers: reqwest::header::HeaderMap,
}

impl HttpClient {
    /// The URL of `path` on the worker at `addr`, with this client's scheme.
    pub fn url(&self, addr: &str, path: &str) -> String {
        self.transport.url(addr, path)
    }

    /// Whether this client may send to `addr`: it carries no token, or
    /// its transport may carry one there.
    pub fn may_send_to(&self, addr: &str) -> bool {
        !self.carries_token() || self.transport.may_carry_token_to(addr)
    }

    /// Whether every request carries a token.
    pub fn carries_token(&self) -> bool {
        self.headers.contains_key(reqwest::header::AUTHORIZATION)
    }

    /// Sends `request` (built on this client) and waits for its answer's
    /// head: over the network, or to the transport's in-memory exchange
    /// (with the request's timeout, as reqwest would apply it).
    pub async fn send(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, super::exchange::SendError> {
        use super::exchange::SendError;
        let Some(exchange) = &self.transport.exchange else {
            return request
                .send()
                .await
                .map_err(|e| SendError::from_reqwest(&e));
        };
        let built = request.build().map_err(|e| SendError::from_reqwest(&e))?;
        let timeout = built.timeout().copied();
        let mut request: http::Request<reqwest::Body> =
            built.try_into().map_err(|e| SendError::from_reqwest(&e))?;
        for (name, value) in &self.headers {
            if !request.headers().contains_key(name) {
                request.headers_mut().insert(name, value.clone());
            }
        }
        let answer = exchange.exchange(request);
        let answer = match timeout {
            Some(t) => tokio::time::timeout(t, answer).await.unwrap_or_else(|_| {
                Err(format!(
                    "no answer within {}",
                    humantime::format_duration(t)
                ))
            }),
            None => answer.await,
        };
        answer
            .map(reqwest::Response::from)
            .map_err(|why| SendError {
                connect: false,
                why,
            })
    }

    /// The transport this client was built on.
    pub fn transport(&self) -> &Transport {
        &self.transport
    }
}

impl Deref for HttpClient {
    type Target = reqwest::Client;
    fn deref(&self) -> &reqwest::Client {
        &self.inner
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_goes_in_clear_only_to_loopback_unless_told() {
        let plain = Transport::plain();
        let seeds = ["127.0.0.1:1".to_string(), "10.1.2.3:7070".to_string()];
        let err = plain.check_token_hops(&seeds).unwrap_err().to_string();
        assert!(
            err.contains("10.1.2.3:7070") && err.contains("--tls-ca"),
            "{err}"
        );
        assert!(plain.check_token_hops(&seeds[..1]).is_ok());
        let told = Transport::new(None, true).unwrap();
        assert!(told.check_token_hops(&seeds).is_ok());
        assert_eq!(told.scheme(), "http");
    }

    #[test]
    fn a_ca_file_that_is_not_one_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.crt");
        std::fs::write(&path, "not a certificate\n").unwrap();
        let err = format!("{:#}", Transport::tls(&path).unwrap_err());
        assert!(
            err.contains("ca.crt") && err.contains("no certificate"),
            "{err}"
        );
        let err = format!(
            "{:#}",
            Transport::tls(&dir.path().join("missing.crt")).unwrap_err()
        );
        assert!(err.contains("missing.crt"), "{err}");
    }
}
