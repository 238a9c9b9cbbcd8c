//! A pool's certificates, made here (`peerwasm tls init DIR`, `peerwasm
//! tls issue DIR HOST...`): a CA of the pool's own, and for each worker a
//! certificate naming the addresses it is reached at, signed by that CA.
//! Clients and workers trust the CA's certificate (`--tls-ca
//! DIR/ca.crt`); each worker serves its own (`--tls-cert DIR/HOST.crt
//! --tls-key DIR/HOST.key`).
//!
//! Keys are ECDSA P-256 (rcgen's default), written `0600` in a directory
//! made `0700`. An existing CA is never overwritten: a new one would make
//! every certificate issued so far worthless.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{Context, bail};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};

/// The CA's certificate file in a pool's TLS directory.
pub const CA_CERT: &str = "ca.crt";
/// The CA's private key file in a pool's TLS directory.
pub const CA_KEY: &str = "ca.key";

/// How long a CA made by [`init`] is valid: ten years.
pub const CA_VALIDITY: Duration = Duration::from_secs(3650 * 86_400);
/// How long a worker certificate is valid unless `--days` says otherwise:
/// a year.
pub const DEFAULT_VALIDITY: Duration = Duration::from_secs(365 * 86_400);

/// The files [`issue`] wrote.
#[derive(Clone, Debug)]
pub struct Issued {
    /// The certificate (PEM), for `--tls-cert`.
    pub cert: PathBuf,
    /// Its private key (PEM, `0600`), for `--tls-key`.
    pub key: PathBuf,
}

/// Makes a pool CA in `dir` (created `0700` if missing): `ca.crt` and
/// `ca.key`. Refuses if `dir` has a CA already.
pub fn init(dir: &Path) -> anyhow::Result<PathBuf> {
    private_dir(dir)?;
    let (cert_path, key_path) = (dir.join(CA_CERT), dir.join(CA_KEY));
    if key_path.exists() || cert_path.exists() {
        bail!(
            "{} has a CA already ({CA_CERT}, {CA_KEY}): a new one would invalidate every certificate it issued. \
             Issue from it (`peerwasm tls issue {} HOST...`), or give another directory",
            dir.display(),
            dir.display()
        );
    }
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::new())?;
    params.distinguished_name = name(&format!(
        "peerwasm pool CA {}",
        hex::encode(rand::random::<[u8; 4]>())
    ));
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let now = SystemTime::now();
    params.not_before = (now - Duration::from_secs(3600)).into();
    params.not_after = (now + CA_VALIDITY).into();
    let cert = params.self_signed(&key)?;
    write_file(&key_path, &key.serialize_pem(), 0o600)?;
    write_file(&cert_path, &cert.pem(), 0o644)?;
    Ok(cert_path)
}

/// Issues a worker certificate from the CA in `dir` for `hosts` (names or
/// IP addresses, as clients write them in `host:port`), valid from `from`
/// until `until`; written as `NAME.crt` and `NAME.key` in `dir`, where
/// NAME is `name` or else the first host.
pub fn issue(
    dir: &Path,
    hosts: &[String],
    name: Option<&str>,
    from: SystemTime,
    until: SystemTime,
) -> anyhow::Result<Issued> {
    let Some(first) = hosts.first() else {
        bail!("name at least one host (or IP address) the worker is reached at")
    };
    let ca_key_path = dir.join(CA_KEY);
    super::tls::check_key_file(&ca_key_path).with_context(|| {
        format!(
            "no CA in {} (make one with `peerwasm tls init {}`)",
            dir.display(),
            dir.display()
        )
    })?;
    let ca_key = KeyPair::from_pem(&read(&ca_key_path)?)
        .with_context(|| format!("{} is not a private key", ca_key_path.display()))?;
    let ca_cert_path = dir.join(CA_CERT);
    let ca = Issuer::from_ca_cert_pem(&read(&ca_cert_path)?, ca_key)
        .with_context(|| format!("{} is not a CA certificate", ca_cert_path.display()))?;

    let hosts: Vec<String> = hosts
        .iter()
        .map(|h| h.trim_start_matches('[').trim_end_matches(']').to_string())
        .collect();
    let mut params = CertificateParams::new(hosts.clone())
        .context("a host is neither a DNS name nor an IP address")?;
    params.distinguished_name = name_of(first);
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    // Workers are servers to clients and to each other.
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    params.not_before = from.into();
    params.not_after = until.into();
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &ca)?;

    let stem = name.map(str::to_string).unwrap_or_else(|| file_stem(first));
    let issued = Issued {
        cert: dir.join(format!("{stem}.crt")),
        key: dir.join(format!("{stem}.key")),
    };
    write_file(&issued.key, &key.serialize_pem(), 0o600)?;
    write_file(&issued.cert, &cert.pem(), 0o644)?;
    Ok(issued)
}

fn name(common: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::OrganizationName, "peerwasm");
    name.push(DnType::CommonName, common);
    name
}

fn name_of(host: &str) -> DistinguishedName {
    name(&format!("peerwasm worker {host}"))
}

/// A host (or `host:port`) as a file name: `::1` → `__1`.
pub fn file_stem(host: &str) -> String {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn read(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

/// `dir`, created `0700` if missing; an existing one is left as it is
/// (the key files themselves are `0600`).
fn private_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("cannot create {}", dir.display()))?;
    }
    Ok(())
}

/// Writes `text` to `path` with `mode`, whole and in one step (replacing a
/// file that was there: a worker's certificate is issued anew when it
/// expires): a worker starting or a client reading `ca.crt` meanwhile
/// never sees it empty or half written.
fn write_file(path: &Path, text: &str, mode: u32) -> anyhow::Result<()> {
    crate::private_path::replace(path, text.as_bytes(), mode)
        .with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_is_made_once_and_its_certificates_verify_for_their_hosts_only() {
        let dir = tempfile::tempdir().unwrap();
        let tls = dir.path().join("tls");
        let ca = init(&tls).unwrap();
        let err = init(&tls).unwrap_err().to_string();
        assert!(err.contains("has a CA already"), "{err}");
        let mode = |p: &Path| {
            std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(p).unwrap().permissions())
                & 0o777
        };
        assert_eq!(mode(&tls), 0o700);
        assert_eq!(mode(&tls.join(CA_KEY)), 0o600);

        let now = SystemTime::now();
        let hosts = vec!["127.0.0.1".to_string(), "node7".to_string()];
        let issued = issue(&tls, &hosts, None, now, now + DEFAULT_VALIDITY).unwrap();
        assert!(
            issued.cert.ends_with("127.0.0.1.crt"),
            "{}",
            issued.cert.display()
        );
        assert_eq!(mode(&issued.key), 0o600);
        for host in ["127.0.0.1", "node7"] {
            assert!(
                super::super::tls::would_refuse(&issued.cert, &ca, host)
                    .unwrap()
                    .is_none(),
                "{host}"
            );
        }
        let other = super::super::tls::would_refuse(&issued.cert, &ca, "node8").unwrap();
        assert!(
            matches!(other, Some(rustls::Error::InvalidCertificate(_))),
            "{other:?}"
        );

        let expired = issue(
            &tls,
            &hosts,
            Some("old"),
            now - 2 * DEFAULT_VALIDITY,
            now - DEFAULT_VALIDITY,
        )
        .unwrap();
        let why = super::super::tls::would_refuse(&expired.cert, &ca, "127.0.0.1").unwrap();
        assert!(super::super::errors::tls_reason(&why.unwrap()).contains("has expired"));

        // Another pool's CA vouches for none of this one's workers.
        let other_ca = init(&dir.path().join("other")).unwrap();
        let why = super::super::tls::would_refuse(&issued.cert, &other_ca, "127.0.0.1").unwrap();
        assert!(super::super::errors::tls_reason(&why.unwrap()).contains("not signed by the CA"));
        // The server side takes the pair as issued.
        assert!(super::super::tls::server_config(&issued.cert, &issued.key).is_ok());
        let mismatched = super::super::tls::server_config(&issued.cert, &expired.key);
        assert!(mismatched.is_err(), "a key of another certificate");
    }
}
