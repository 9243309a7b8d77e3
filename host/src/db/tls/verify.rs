//! What a server's certificate is held to, by `sslmode` and the roots there
//! are: nothing (`prefer` and `require` without a root file), its chain
//! (`verify-ca`, and `prefer` and `require` with one, as libpq does), or its
//! chain and the host's name (`verify-full`). The handshake's own signatures
//! are verified in every case: a certificate taken unverified still proves
//! that the server holds its key.

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{verify_server_cert_signed_by_trust_anchor, verify_server_name};
use rustls::crypto::{WebPkiSupportedAlgorithms, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};

/// A verifier of servers' certificates for one [`TlsSettings`](super::TlsSettings).
#[derive(Debug)]
pub(super) struct ServerCheck {
    /// What the chain must lead to; `None`: the certificate is taken as it
    /// comes.
    roots: Option<RootCertStore>,
    /// Whether the certificate must name the host connected to.
    names: bool,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCheck {
    /// A check against `roots`, and of the host's name when `names` is set
    /// (which takes roots: a name on an unverified certificate proves
    /// nothing).
    pub(super) fn new(roots: Option<RootCertStore>, names: bool, algorithms: WebPkiSupportedAlgorithms) -> ServerCheck {
        debug_assert!(roots.is_some() || !names, "a host name is checked only on a verified chain");
        ServerCheck { roots, names, algorithms }
    }
}

impl ServerCertVerifier for ServerCheck {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if let Some(roots) = &self.roots {
            let cert = ParsedCertificate::try_from(end_entity)?;
            verify_server_cert_signed_by_trust_anchor(&cert, roots, intermediates, now, self.algorithms.all)?;
            if self.names {
                verify_server_name(&cert, server_name)?;
            }
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}
