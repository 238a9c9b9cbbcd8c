//! Why a connection to a worker failed, in words a person can act on.
//!
//! reqwest's own message for a failed request is "error sending request
//! for url (…)"; the reason — an expired certificate, another pool's CA, a
//! worker that does not speak TLS — is three sources down, and a TLS
//! error there is wrapped in an `io::Error` whose `source()` skips it.
//! [`describe`] walks the chain and says the reason.

use rustls::CertificateError;

/// `err` with its sources, and what a TLS failure among them means.
pub fn describe(err: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![err.to_string()];
    let mut reason = None;
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(tls) = as_tls(e) {
            reason = Some(tls_reason(tls));
        }
        let text = e.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = e.source();
    }
    let mut out = parts.join(": ");
    if let Some(reason) = reason {
        out = format!("{reason} ({out})");
    } else if out.contains("invalid HTTP version")
        || out.contains("connection closed before message completed")
    {
        out.push_str(" — does this worker serve TLS? then give its pool's CA (--tls-ca FILE or PEERWASM_TLS_CA)");
    }
    out
}

/// The rustls error inside `e`, directly or wrapped in `io::Error`s (the
/// connector wraps tokio-rustls's, which wraps rustls's).
fn as_tls<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut e = e;
    for _ in 0..4 {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        e = e.downcast_ref::<std::io::Error>()?.get_ref()?;
    }
    None
}

/// What `err` means for the person who gets it.
pub fn tls_reason(err: &rustls::Error) -> String {
    use rustls::Error as E;
    match err {
        E::InvalidCertificate(cert) => match cert {
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                "the worker's TLS certificate has expired: issue it a new one (`peerwasm tls issue`)".into()
            }
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                "the worker's TLS certificate is not valid yet (is this machine's clock right?)".into()
            }
            CertificateError::UnknownIssuer | CertificateError::BadSignature => {
                "the worker's TLS certificate is not signed by the CA this side trusts (--tls-ca): another pool's CA?"
                    .into()
            }
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                "the worker's TLS certificate is not for the address it was reached at: issue it for that host \
                 (`peerwasm tls issue DIR HOST...`)"
                    .into()
            }
            other => format!("the worker's TLS certificate was refused: {other:?}"),
        },
        E::InvalidMessage(_) | E::InappropriateMessage { .. } | E::InappropriateHandshakeMessage { .. } => {
            "the worker does not speak TLS (a plain-HTTP worker? then drop --tls-ca)".into()
        }
        E::AlertReceived(alert) => format!("the worker refused the TLS handshake ({alert:?}): does it trust this side's CA?"),
        other => format!("TLS failed: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tls_error_inside_an_io_error_is_found_and_said() {
        let inner = rustls::Error::InvalidCertificate(CertificateError::Expired);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, inner);
        let text = describe(&io);
        assert!(
            text.starts_with("the worker's TLS certificate has expired"),
            "{text}"
        );
        let inner = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer),
        );
        let io = std::io::Error::other(inner);
        assert!(
            describe(&io).contains("not signed by the CA"),
            "{}",
            describe(&io)
        );
        let plain = std::io::Error::other("connection refused");
        assert_eq!(describe(&plain), "connection refused");
    }
}
