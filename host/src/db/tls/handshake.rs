//! The TLS handshake of one connection: rustls (on the `ring` provider)
//! through tokio-postgres-rustls, which also gives SCRAM its channel
//! binding, with a failed handshake explained: which host, what its
//! certificate was held to, and rustls's reason.

use std::fmt;
use std::sync::Arc;

use futures::future::BoxFuture;
use rustls::ClientConfig;
use tokio_postgres::Socket;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::files::{ClientIdentity, Roots};
use super::verify::ServerCheck;
use super::{SslMode, describe_checks};
use crate::db::DbError;

/// The protocol PostgreSQL 17 asks for in ALPN; servers before it ignore it.
const ALPN_POSTGRESQL: &[u8] = b"postgresql";

type RustlsConnect = <MakeRustlsConnect as MakeTlsConnect<Socket>>::TlsConnect;
type RustlsStream = <MakeRustlsConnect as MakeTlsConnect<Socket>>::Stream;

/// The TLS side of every connection of one [`TlsConnector`](super::TlsConnector).
#[derive(Clone)]
pub(super) struct Handshake {
    rustls: MakeRustlsConnect,
    /// What the server's certificate is held to, for messages.
    checks: Arc<str>,
}

impl fmt::Debug for Handshake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handshake").field("checks", &self.checks).finish_non_exhaustive()
    }
}

impl Handshake {
    /// The client configuration for `mode`: the server's certificate checked
    /// against `roots` (by name too under `verify-full`), `identity`
    /// presented when the server asks for a client certificate.
    pub(super) fn new(mode: SslMode, roots: Option<Roots>, identity: Option<ClientIdentity>) -> Result<Handshake, DbError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let checks = describe_checks(mode, roots.as_ref().map(|roots| roots.source.as_str()));
        let check = ServerCheck::new(
            roots.map(|roots| roots.store),
            mode == SslMode::VerifyFull,
            provider.signature_verification_algorithms,
        );
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| DbError::Config(format!("TLS: {e}")))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(check));
        let mut config = match identity {
            Some(ClientIdentity { chain, key, source }) => builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| DbError::Config(format!("{source}: not a certificate and its key ({e})")))?,
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![ALPN_POSTGRESQL.to_vec()];
        Ok(Handshake { rustls: MakeRustlsConnect::new(config), checks })
    }
}

impl MakeTlsConnect<Socket> for Handshake {
    type Stream = RustlsStream;
    type TlsConnect = HostHandshake;
    type Error = <MakeRustlsConnect as MakeTlsConnect<Socket>>::Error;

    fn make_tls_connect(&mut self, host: &str) -> Result<HostHandshake, Self::Error> {
        let inner = MakeTlsConnect::<Socket>::make_tls_connect(&mut self.rustls, host)?;
        Ok(HostHandshake { inner, host: host.to_owned(), checks: self.checks.clone() })
    }
}

/// The handshake with one host.
pub(super) struct HostHandshake {
    inner: RustlsConnect,
    host: String,
    checks: Arc<str>,
}

impl TlsConnect<Socket> for HostHandshake {
    type Stream = RustlsStream;
    type Error = HandshakeFailed;
    type Future = BoxFuture<'static, Result<RustlsStream, HandshakeFailed>>;

    fn connect(self, stream: Socket) -> Self::Future {
        let HostHandshake { inner, host, checks } = self;
        Box::pin(async move { inner.connect(stream).await.map_err(|cause| HandshakeFailed { host, checks, cause }) })
    }
}

/// A TLS handshake that did not complete. Its message says what went wrong
/// in the gateway's terms; its source is rustls's (or the socket's) error.
#[derive(Debug)]
pub(super) struct HandshakeFailed {
    host: String,
    checks: Arc<str>,
    cause: std::io::Error,
}

impl fmt::Display for HandshakeFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use rustls::CertificateError;
        let host = &self.host;
        let checks = &self.checks;
        let refused = self.cause.get_ref().and_then(|e| e.downcast_ref::<rustls::Error>());
        match refused {
            Some(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => write!(f, "the host name {host:?} does not match the server's certificate ({checks})"),
            Some(rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer)) => {
                write!(f, "the certificate of {host:?} is not signed by a trusted authority ({checks})")
            }
            Some(rustls::Error::InvalidCertificate(_)) => write!(f, "the certificate of {host:?} was refused ({checks})"),
            _ => write!(f, "the TLS handshake with {host:?} failed ({checks})"),
        }
    }
}

impl std::error::Error for HandshakeFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.cause)
    }
}

/// Whether `error` is a TLS handshake that failed after the server had
/// agreed to TLS (and not a server that refused it, nor anything later).
pub(super) fn failed(error: &tokio_postgres::Error) -> bool {
    std::error::Error::source(error).is_some_and(|source| source.is::<HandshakeFailed>())
}
