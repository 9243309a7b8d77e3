//! Certificates for the TLS tests, made with rcgen at run time: a
//! certificate authority of the test's own, server certificates for the
//! names a test gives, client certificates for a database user; and a
//! scratch server that uses them ([`TlsServer`]). Nothing is kept on disk
//! but what a test writes, in the server's directory.

use std::path::PathBuf;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};

use crate::scratch::ScratchServer;

/// A certificate authority.
#[derive(Debug)]
pub struct Authority {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its private key, both PEM.
#[derive(Clone, Debug)]
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

impl Authority {
    /// A new self-signed authority named `name`.
    pub fn new(name: &str) -> Authority {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("no names to refuse");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate().expect("a key pair");
        Authority { issuer: CertifiedIssuer::self_signed(params, key).expect("a self-signed authority") }
    }

    /// The authority's certificate, PEM: what a client's `sslrootcert` and
    /// a server's `ssl_ca_file` name.
    pub fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    /// A server certificate whose subject alternative names are `names`
    /// (host names, or IP addresses).
    pub fn server(&self, names: &[&str]) -> Issued {
        let names: Vec<String> = names.iter().map(|name| (*name).to_owned()).collect();
        let mut params = CertificateParams::new(names.clone()).expect("valid names");
        params.distinguished_name.push(DnType::CommonName, names.first().cloned().unwrap_or_default());
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        self.sign(&params)
    }

    /// A client certificate for the database user `user` (its common name,
    /// which `clientcert=verify-full` holds to the user name).
    pub fn client(&self, user: &str) -> Issued {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("no names to refuse");
        params.distinguished_name.push(DnType::CommonName, user);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        self.sign(&params)
    }

    fn sign(&self, params: &CertificateParams) -> Issued {
        let key = KeyPair::generate().expect("a key pair");
        let cert = params.signed_by(&key, &self.issuer).expect("a signed certificate");
        Issued { cert_pem: cert.pem(), key_pem: key.serialize_pem() }
    }
}

/// A server certificate, its key and its authority's certificate, written
/// as PEM files in a directory of their own, which is removed when dropped:
/// what a gateway's `--tls-cert` and `--tls-key`, and a client's root file,
/// name.
#[derive(Debug)]
pub struct ServerFiles {
    pub issued: Issued,
    pub dir: PathBuf,
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl ServerFiles {
    /// A server certificate for `names` from `authority`, written under a
    /// fresh directory named after `label`.
    pub fn write(authority: &Authority, label: &str, names: &[&str]) -> ServerFiles {
        let issued = authority.server(names);
        let dir = std::env::temp_dir().join(format!("stile-{label}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("make the certificates' directory");
        let (ca, cert, key) = (dir.join("ca.pem"), dir.join("cert.pem"), dir.join("key.pem"));
        for (path, pem) in [(&ca, authority.cert_pem()), (&cert, issued.cert_pem.clone()), (&key, issued.key_pem.clone())] {
            std::fs::write(path, pem).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        }
        ServerFiles { issued, dir, ca, cert, key }
    }

    /// The gateway's flags that serve HTTPS with these files.
    pub fn gateway_args(&self) -> Vec<String> {
        vec!["--tls-cert".into(), self.cert.display().to_string(), "--tls-key".into(), self.key.display().to_string()]
    }
}

impl Drop for ServerFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The database of a [`TlsServer`] whose connections over TLS must present
/// a client certificate for their user.
pub const CERT_DATABASE: &str = "stile_cert";

/// The database of a [`TlsServer`] that takes any connection.
pub const OPEN_DATABASE: &str = "stile_tls";

/// A scratch server with TLS on: its certificate names `localhost` only and
/// is signed by an authority of the test's own, which also signs the client
/// certificates it accepts. Over TLS, [`CERT_DATABASE`] takes only clients
/// whose certificate names their user (`clientcert=verify-full`); any other
/// connection is trusted, with TLS or without.
#[derive(Debug)]
pub struct TlsServer {
    pub server: ScratchServer,
    pub authority: Authority,
    /// The authority's certificate: a client's `sslrootcert`.
    pub ca_file: PathBuf,
}

/// A client certificate and its key, written to files.
#[derive(Clone, Debug)]
pub struct ClientFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TlsServer {
    /// Makes and starts the server, with `settings` beside the TLS ones,
    /// and its two databases.
    pub async fn start(settings: &[String]) -> anyhow::Result<TlsServer> {
        let authority = Authority::new("stile test authority");
        let server = ScratchServer::init("tls").await?;
        let issued = authority.server(&["localhost"]);
        let ca_file = server.write_file("ca.crt", authority.cert_pem().as_bytes())?;
        let cert_file = server.write_file("server.crt", issued.cert_pem.as_bytes())?;
        let key_file = server.write_file("server.key", issued.key_pem.as_bytes())?;
        let hba = format!(
            "local all all trust\n\
             hostssl {CERT_DATABASE} all 127.0.0.1/32 trust clientcert=verify-full\n\
             hostssl all all 127.0.0.1/32 trust\n\
             hostnossl all all 127.0.0.1/32 trust\n"
        );
        let hba_file = server.write_file("pg_hba.conf", hba.as_bytes())?;
        let mut all = vec![
            "ssl=on".to_owned(),
            format!("ssl_cert_file={}", cert_file.display()),
            format!("ssl_key_file={}", key_file.display()),
            format!("ssl_ca_file={}", ca_file.display()),
            format!("hba_file={}", hba_file.display()),
        ];
        all.extend_from_slice(settings);
        server.start(&all).await?;
        server.create_database(OPEN_DATABASE).await?;
        server.create_database(CERT_DATABASE).await?;
        Ok(TlsServer { server, authority, ca_file })
    }

    /// `postgresql://postgres@HOST:PORT/DBNAME?QUERY` for this server.
    pub fn url(&self, host: &str, dbname: &str, query: &str) -> String {
        format!("postgresql://postgres@{host}:{}/{dbname}?{query}", self.server.port())
    }

    /// A client certificate for `user` and its key, written beside the
    /// server's files under names that start with `name`.
    pub fn client_files(&self, name: &str, user: &str) -> anyhow::Result<ClientFiles> {
        let issued = self.authority.client(user);
        Ok(ClientFiles {
            cert: self.server.write_file(&format!("{name}.crt"), issued.cert_pem.as_bytes())?,
            key: self.server.write_file(&format!("{name}.key"), issued.key_pem.as_bytes())?,
        })
    }
}
