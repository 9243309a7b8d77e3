//! HTTPS on the listener: the certificate and key the gateway presents, read
//! from PEM files at start, and the handshake every connection makes before
//! its first request.
//!
//! ALPN offers HTTP/2 first and HTTP/1.1 second; the connection then speaks
//! what the client chose (hyper's automatic builder reads the preface). A
//! handshake must end within the header time limit from the connection's
//! start, as a request's header must: a client that opens a connection and
//! stalls its handshake holds a socket and a task for no longer than one
//! that stalls its header. The key is read once, kept only in rustls's
//! configuration, and never printed: errors name the file, not its content.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::http::socket::SharedSocket;

/// Where the listener's certificate chain and key are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListenerTls {
    /// PEM certificates: the gateway's first, then any intermediates.
    pub cert: PathBuf,
    /// The PEM private key (PKCS#8, PKCS#1 or SEC1) of the first certificate.
    pub key: PathBuf,
}

/// The protocols offered by ALPN, in the order preferred.
const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// Accepts TLS connections with one certificate.
#[derive(Clone)]
pub struct Acceptor {
    inner: TlsAcceptor,
}

impl std::fmt::Debug for Acceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Acceptor")
    }
}

impl Acceptor {
    /// Reads `tls`'s files and checks that the key is the certificate's.
    pub fn from_files(tls: &ListenerTls) -> anyhow::Result<Acceptor> {
        let chain = certificates(&tls.cert)?;
        let key = private_key(&tls.key)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("the TLS protocol versions")?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .with_context(|| {
                format!("--tls-key {} does not match --tls-cert {}, or is not usable", tls.key.display(), tls.cert.display())
            })?;
        config.alpn_protocols = ALPN.iter().map(|protocol| protocol.to_vec()).collect();
        Ok(Acceptor { inner: TlsAcceptor::from(Arc::new(config)) })
    }

    /// Makes the handshake on `stream`, which must end within `limit`.
    pub async fn accept(&self, stream: SharedSocket, limit: Duration) -> io::Result<TlsStream<SharedSocket>> {
        match tokio::time::timeout(limit, self.inner.accept(stream)).await {
            Ok(accepted) => accepted,
            Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "the TLS handshake did not end within the header time limit")),
        }
    }
}

fn certificates(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let pem = std::fs::read(path).with_context(|| format!("read --tls-cert {}", path.display()))?;
    let chain = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("--tls-cert {}: not PEM certificates", path.display()))?;
    if chain.is_empty() {
        bail!("--tls-cert {}: holds no PEM certificate", path.display());
    }
    Ok(chain)
}

fn private_key(path: &Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    let pem = std::fs::read(path).with_context(|| format!("read --tls-key {}", path.display()))?;
    // The parser's error may quote what it read; only its kind is named.
    PrivateKeyDer::from_pem_slice(&pem).map_err(|error| {
        let kind = match error {
            rustls::pki_types::pem::Error::NoItemsFound => "holds no PEM private key",
            _ => "not a PEM private key",
        };
        anyhow::anyhow!("--tls-key {}: {kind}", path.display())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(dir: &Path, name: &str, content: &[u8]) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, content).unwrap();
        path
    }

    fn scratch_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("stile-listener-tls-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_missing_or_empty_file_is_named_and_a_key_is_never_quoted() {
        let dir = scratch_dir("errors");
        let secret = b"-----BEGIN PRIVATE KEY-----\nc2VjcmV0LWtleS1ieXRlcw-not-base64!!\n-----END PRIVATE KEY-----\n";
        let tls = ListenerTls { cert: dir.join("absent.pem"), key: written(&dir, "key.pem", secret) };
        let error = format!("{:#}", Acceptor::from_files(&tls).unwrap_err());
        assert!(error.contains("--tls-cert") && error.contains("absent.pem"), "{error}");
        let empty = written(&dir, "empty.pem", b"");
        assert!(format!("{:#}", certificates(&empty).unwrap_err()).contains("holds no PEM certificate"));
        let error = format!("{:#}", private_key(&tls.key).unwrap_err());
        assert!(error.contains("--tls-key") && !error.contains("c2VjcmV0"), "{error}");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
