//! The files TLS settings name, read into what rustls takes: root
//! certificates, and the client's certificate chain and key. A file named
//! but unreadable, or holding nothing of what it should, is an error naming
//! it; libpq's default files are used only where they are there.

use std::path::{Path, PathBuf};

use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::RootCert;
use crate::db::DbError;

/// Where libpq looks for the files a connection string leaves unnamed:
/// `~/.postgresql/`.
#[derive(Clone, Debug)]
pub(super) struct DefaultFiles {
    /// `None` where there is no home directory.
    dir: Option<PathBuf>,
}

impl DefaultFiles {
    /// The roots that a server's certificate must chain to.
    pub(super) const ROOT_CERT: &'static str = "root.crt";
    /// The client's certificate.
    pub(super) const CLIENT_CERT: &'static str = "postgresql.crt";
    /// The client certificate's key.
    pub(super) const CLIENT_KEY: &'static str = "postgresql.key";

    /// `$HOME/.postgresql`, as libpq finds it.
    pub(super) fn of_home() -> DefaultFiles {
        let home = std::env::var_os("HOME").filter(|home| !home.is_empty());
        DefaultFiles { dir: home.map(|home| PathBuf::from(home).join(".postgresql")) }
    }

    /// The defaults in `dir` instead.
    #[cfg(test)]
    pub(super) fn in_dir(dir: PathBuf) -> DefaultFiles {
        DefaultFiles { dir: Some(dir) }
    }

    /// The default file `name`, if it is there.
    fn existing(&self, name: &str) -> Option<PathBuf> {
        self.dir.as_ref().map(|dir| dir.join(name)).filter(|path| path.exists())
    }

    /// Where the default file `name` would be, for messages.
    pub(super) fn describe(&self, name: &str) -> String {
        match &self.dir {
            Some(dir) => dir.join(name).display().to_string(),
            None => format!("~/.postgresql/{name}, without a home directory"),
        }
    }
}

/// Certificate authorities to verify a server's certificate with, and where
/// they came from (for messages).
#[derive(Debug)]
pub(super) struct Roots {
    pub(super) store: RootCertStore,
    pub(super) source: String,
}

/// The roots `given` names, or those of libpq's default file if it is there;
/// `None` when neither names any.
pub(super) fn roots(given: Option<&RootCert>, defaults: &DefaultFiles) -> Result<Option<Roots>, DbError> {
    match given {
        Some(RootCert::System) => system_roots().map(Some),
        Some(RootCert::File(path)) => file_roots(path).map(Some),
        None => defaults.existing(DefaultFiles::ROOT_CERT).map(|path| file_roots(&path)).transpose(),
    }
}

fn file_roots(path: &Path) -> Result<Roots, DbError> {
    let named = format!("sslrootcert {}", path.display());
    let pem = read(&named, path)?;
    let mut store = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| DbError::Config(format!("{named}: not a PEM certificate ({e})")))?;
        store.add(cert).map_err(|e| DbError::Config(format!("{named}: a certificate rustls cannot use ({e})")))?;
    }
    if store.is_empty() {
        return Err(DbError::Config(format!("{named}: holds no PEM certificate")));
    }
    Ok(Roots { store, source: path.display().to_string() })
}

/// The platform's trusted roots (on Linux, OpenSSL's store: `SSL_CERT_FILE`
/// and `SSL_CERT_DIR` if set, else the distribution's bundle).
fn system_roots() -> Result<Roots, DbError> {
    let found = rustls_native_certs::load_native_certs();
    let mut store = RootCertStore::empty();
    let (_added, _unusable) = store.add_parsable_certificates(found.certs);
    if store.is_empty() {
        let errors: Vec<String> = found.errors.iter().map(ToString::to_string).collect();
        return Err(DbError::Config(format!(
            "sslrootcert=system: the platform's store holds no certificate rustls can use{}",
            if errors.is_empty() { String::new() } else { format!(" ({})", errors.join("; ")) }
        )));
    }
    Ok(Roots { store, source: "the platform's store (sslrootcert=system)".to_owned() })
}

/// A client certificate and its key, to present when the server asks.
#[derive(Debug)]
pub(super) struct ClientIdentity {
    /// The client's certificate first, then any intermediates.
    pub(super) chain: Vec<CertificateDer<'static>>,
    pub(super) key: PrivateKeyDer<'static>,
    /// The two files, for messages.
    pub(super) source: String,
}

/// The client certificate `cert` names, or libpq's default if it is there,
/// with its key (`key`, or libpq's default); `None` when there is no
/// certificate. A certificate without a readable key is an error.
pub(super) fn client_identity(
    cert: Option<&Path>,
    key: Option<&Path>,
    defaults: &DefaultFiles,
) -> Result<Option<ClientIdentity>, DbError> {
    let Some(cert_path) = cert.map(Path::to_path_buf).or_else(|| defaults.existing(DefaultFiles::CLIENT_CERT)) else {
        return Ok(None);
    };
    let cert_named = format!("sslcert {}", cert_path.display());
    let pem = read(&cert_named, &cert_path)?;
    let chain = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| DbError::Config(format!("{cert_named}: not a PEM certificate ({e})")))?;
    if chain.is_empty() {
        return Err(DbError::Config(format!("{cert_named}: holds no PEM certificate")));
    }
    let key_path = match key {
        Some(key) => key.to_path_buf(),
        None => defaults.dir.as_ref().map(|dir| dir.join(DefaultFiles::CLIENT_KEY)).ok_or_else(|| {
            DbError::Config(format!(
                "{cert_named} takes its key: name it with sslkey (there is no home directory to find a default in)"
            ))
        })?,
    };
    let key_named = format!("sslkey {}", key_path.display());
    let pem = read(&format!("{key_named} (the key of {cert_named})"), &key_path)?;
    let key = PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|e| DbError::Config(format!("{key_named}: no PEM private key in it ({e})")))?;
    Ok(Some(ClientIdentity { chain, key, source: format!("{cert_named} with {key_named}") }))
}

/// The bytes of a file a setting names.
fn read(named: &str, path: &Path) -> Result<Vec<u8>, DbError> {
    std::fs::read(path).map_err(|e| DbError::Config(format!("{named} cannot be read: {e}")))
}
