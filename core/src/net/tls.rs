//! PEM files into rustls configurations: the pool CA a client (or a worker
//! talking to its peers) trusts, and the certificate and key a worker
//! serves. Key files are held to the state dir's rule: this user's alone.
//!
//! The cryptography is rustls's `ring` provider, chosen here and passed to
//! every configuration explicitly, so nothing depends on a process-wide
//! default; it is also installed as that default once
//! ([`install_provider`]), for the reqwest clients that speak plain HTTP.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Once};

use anyhow::{Context, bail};
use rustls::client::danger::ServerCertVerifier;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

/// A worker's TLS files (`--tls-cert`, `--tls-key`, `--tls-ca`).
#[derive(Clone, Debug)]
pub struct WorkerTls {
    /// The certificate (chain) it serves, PEM.
    pub cert: PathBuf,
    /// Its private key, PEM; must be this user's alone ([`check_key_file`]).
    pub key: PathBuf,
    /// The pool CA it trusts when it is the client: gossip to its peers,
    /// the jobs of the maps it owns.
    pub ca: PathBuf,
}

impl WorkerTls {
    /// What the worker serves with.
    pub fn server_config(&self) -> anyhow::Result<Arc<ServerConfig>> {
        server_config(&self.cert, &self.key)
    }

    /// How the worker reaches its peers.
    pub fn transport(&self) -> anyhow::Result<super::Transport> {
        super::Transport::tls(&self.ca)
    }
}

/// The one crypto provider of this crate's TLS.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Makes [`provider`] the process's default, once (a no-op if some other
/// library of the process installed one first). peerwasm's reqwest has no
/// provider of its own: a program that builds a reqwest client itself,
/// beside peerwasm's, calls this first.
pub fn install_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// The certificates in the PEM file at `path`, at least one.
pub fn read_certs(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("cannot read certificates from {}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("{} is not a PEM certificate file", path.display()))?;
    if certs.is_empty() {
        bail!(
            "{} holds no certificate (a PEM file with `-----BEGIN CERTIFICATE-----`)",
            path.display()
        );
    }
    Ok(certs)
}

/// The CA certificates of `ca` as a root store.
fn roots(ca: &Path) -> anyhow::Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for cert in read_certs(ca)? {
        roots
            .add(cert)
            .with_context(|| format!("{} holds a certificate that cannot be a CA", ca.display()))?;
    }
    Ok(roots)
}

/// A client's TLS: trusts the CA certificates in `ca` and nothing else
/// (not the system's roots: a pool's workers carry the pool's own
/// certificates).
pub fn client_config(ca: &Path) -> anyhow::Result<Arc<ClientConfig>> {
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots(ca)?)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// A configuration that trusts nothing, for the clients that speak plain
/// HTTP: reqwest would otherwise build its default one, loading the
/// system's root certificates — ~6 ms of every `peerwasm run` — for URLs
/// it never sees (a plain transport builds only `http://` ones).
pub fn trusting_nothing() -> Arc<ClientConfig> {
    static CONFIG: std::sync::OnceLock<Arc<ClientConfig>> = std::sync::OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let config = ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .expect("ring supports the default protocol versions")
                .with_root_certificates(RootCertStore::empty())
                .with_no_client_auth();
            Arc::new(config)
        })
        .clone()
}

/// A worker's TLS: serves the certificate chain in `cert` with the key in
/// `key` (whose permissions are checked first: [`check_key_file`]), read
/// again when the files change, so that a renewed certificate is served
/// from the next connection on without a restart (see [`RELOAD_CHECK_EVERY`]).
pub fn server_config(cert: &Path, key: &Path) -> anyhow::Result<Arc<ServerConfig>> {
    let served = certified_key(cert, key)?;
    let stamp = files_stamp(cert, key);
    let resolver = ReloadingCert {
        cert: cert.to_path_buf(),
        key: key.to_path_buf(),
        state: parking_lot::Mutex::new(Served {
            key: Arc::new(served),
            stamp,
            tried: stamp,
            checked: std::time::Instant::now(),
        }),
    };
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(resolver));
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// How often a serving worker looks whether its certificate or key file
/// changed (two `stat`s, at most once per period, on a handshake).
pub const RELOAD_CHECK_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// The chain in `cert` with the key in `key`, checked to go together.
fn certified_key(cert: &Path, key: &Path) -> anyhow::Result<CertifiedKey> {
    check_key_file(key)?;
    let chain = read_certs(cert)?;
    let private = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("cannot read a private key (PEM) from {}", key.display()))?;
    CertifiedKey::from_der(chain, private, &provider()).with_context(|| {
        format!(
            "the key in {} does not go with the certificate in {}",
            key.display(),
            cert.display()
        )
    })
}

/// What says the certificate and key files changed: each one's change
/// time, inode and size (`None`: unreadable).
type FilesStamp = [Option<(std::time::SystemTime, u64, u64)>; 2];

fn files_stamp(cert: &Path, key: &Path) -> FilesStamp {
    use std::os::unix::fs::MetadataExt;
    [cert, key].map(|p| {
        std::fs::metadata(p).ok().map(|m| {
            (
                m.modified().unwrap_or(std::time::UNIX_EPOCH),
                m.ino(),
                m.len(),
            )
        })
    })
}

/// A worker's certificate, re-read when its files change. A pair that does
/// not load (half written, or a key that does not go with the certificate)
/// is said once in the log, and the one loaded before is served meanwhile.
#[derive(Debug)]
struct ReloadingCert {
    cert: PathBuf,
    key: PathBuf,
    state: parking_lot::Mutex<Served>,
}

#[derive(Debug)]
struct Served {
    key: Arc<CertifiedKey>,
    /// The files' stamp when `key` was read.
    stamp: FilesStamp,
    /// The stamp last tried (read, or failed to read).
    tried: FilesStamp,
    checked: std::time::Instant,
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let mut st = self.state.lock();
        if st.checked.elapsed() >= RELOAD_CHECK_EVERY {
            st.checked = std::time::Instant::now();
            let now = files_stamp(&self.cert, &self.key);
            if now != st.stamp && now != st.tried {
                st.tried = now;
                match certified_key(&self.cert, &self.key) {
                    Ok(key) => {
                        st.key = Arc::new(key);
                        st.stamp = now;
                        tracing::info!(cert = %self.cert.display(), "the certificate file changed: serving it from now on");
                    }
                    Err(e) => {
                        tracing::warn!(cert = %self.cert.display(), "the certificate files changed but do not load ({e:#}): still serving the certificate read before")
                    }
                }
            }
        }
        Some(st.key.clone())
    }
}

/// A private key file must be this user's alone, like the state dir: one
/// of another user's is refused; one open to the group or others is made
/// `0600` (and said so).
pub fn check_key_file(path: &Path) -> anyhow::Result<()> {
    crate::private_path::make_private(
        path,
        "the key file",
        0o600,
        "a private key must be this user's alone",
    )
}

/// Why a client trusting `ca` would refuse the certificate in `cert` when
/// reaching it at `host` (`None`: it would not). A worker checks this as
/// it starts, so that an expired or misnamed certificate is said in its
/// log, not only by every client that fails.
pub fn would_refuse(cert: &Path, ca: &Path, host: &str) -> anyhow::Result<Option<rustls::Error>> {
    let chain = read_certs(cert)?;
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots(ca)?),
        provider(),
    )
    .build()?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let name = ServerName::try_from(host.to_string())
        .map_err(|_| anyhow::anyhow!("{host:?} is not a host name or address"))?;
    Ok(verifier
        .verify_server_cert(&chain[0], &chain[1..], &name, &[], UnixTime::now())
        .err())
}
