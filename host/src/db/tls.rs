//! TLS to PostgreSQL: the settings libpq reads (`sslmode`, `sslrootcert`,
//! `sslcert`, `sslkey`) and the one connector that opens every connection
//! the gateway makes, with rustls on the `ring` provider.
//!
//! The connector goes through a connection string's hosts one at a time, as
//! libpq does, so that each host gets what libpq gives it: a unix socket
//! never uses TLS, whatever the `sslmode`; a TCP host uses it as the mode
//! says, and under `prefer` falls back to a plain connection when the server
//! refuses TLS or the handshake fails. tokio-postgres itself would send a
//! unix socket the TLS request under `require` (and fail), and gives up on a
//! host whose handshake fails under `prefer`.

mod files;
mod handshake;
mod hosts;
mod verify;

use std::fmt;
use std::hash::{BuildHasher as _, RandomState};
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use futures::future::BoxFuture;
use tokio::task::JoinHandle;
use tokio_postgres::config::LoadBalanceHosts;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{Client, NoTls, Socket};

use super::DbError;
use files::DefaultFiles;
use handshake::Handshake;
use hosts::HostAttempt;

/// libpq's `sslmode`, less `allow`, which the gateway refuses: it would try
/// a plain connection first and use TLS only when the server insists.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SslMode {
    /// Never TLS.
    Disable,
    /// TLS when the server offers it, else a plain connection (libpq's
    /// default). The certificate is verified as under `require`.
    #[default]
    Prefer,
    /// TLS or no connection. The certificate is not verified, unless a root
    /// certificate file is there (`sslrootcert`, or libpq's default
    /// `~/.postgresql/root.crt`): then its chain is, as under `verify-ca`.
    Require,
    /// TLS, and the certificate must chain to a root of `sslrootcert`.
    VerifyCa,
    /// As `verify-ca`, and the certificate must name the host connected to.
    VerifyFull,
}

impl SslMode {
    /// The name libpq gives the mode.
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// Whether the server's certificate must chain to a root, whatever
    /// files are there.
    fn verifies(self) -> bool {
        matches!(self, SslMode::VerifyCa | SslMode::VerifyFull)
    }
}

impl fmt::Display for SslMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SslMode {
    type Err = String;

    /// A mode by libpq's name; the message says what is accepted.
    fn from_str(text: &str) -> Result<SslMode, String> {
        match text {
            "disable" => Ok(SslMode::Disable),
            "prefer" => Ok(SslMode::Prefer),
            "require" => Ok(SslMode::Require),
            "verify-ca" => Ok(SslMode::VerifyCa),
            "verify-full" => Ok(SslMode::VerifyFull),
            "allow" => Err("sslmode=allow is not supported (it tries a plain connection first): \
                 use prefer for TLS when the server offers it, or disable"
                .to_owned()),
            other => Err(format!("sslmode {other:?} is not one of disable, prefer, require, verify-ca, verify-full")),
        }
    }
}

/// Where the certificate authorities that a server's certificate must chain
/// to come from (`sslrootcert`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RootCert {
    /// A PEM file of one or more certificates.
    File(PathBuf),
    /// The platform's trusted roots (`sslrootcert=system`, as in libpq 16):
    /// only with `verify-full`, since any public authority may sign a
    /// certificate for some other name.
    System,
}

impl RootCert {
    /// `system` names the platform's roots; anything else is a file.
    pub fn from_libpq(text: &str) -> RootCert {
        if text == "system" { RootCert::System } else { RootCert::File(PathBuf::from(text)) }
    }

    /// The value as libpq takes it.
    pub fn to_libpq(&self) -> String {
        match self {
            RootCert::File(path) => path.display().to_string(),
            RootCert::System => "system".to_owned(),
        }
    }
}

/// How connections over TCP use TLS: the settings a connection string or
/// the `PGSSL*` variables give, as given. Files left unnamed are libpq's
/// defaults in `~/.postgresql/` (`root.crt`, `postgresql.crt`,
/// `postgresql.key`), used when they are there.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsSettings {
    pub mode: SslMode,
    /// `sslrootcert`.
    pub root_cert: Option<RootCert>,
    /// `sslcert`: the client's certificate (PEM, the chain after it).
    pub client_cert: Option<PathBuf>,
    /// `sslkey`: the client certificate's private key (PEM).
    pub client_key: Option<PathBuf>,
}

/// Opens the gateway's connections to PostgreSQL: the pools' (through
/// deadpool's [`Connect`](deadpool_postgres::Connect)) and any other, with
/// TLS as its [`TlsSettings`] say. Its files are read once, when it is made.
/// Cheap to clone.
#[derive(Clone)]
pub struct TlsConnector {
    mode: SslMode,
    /// `None` under `disable`.
    handshake: Option<Handshake>,
}

impl fmt::Debug for TlsConnector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConnector").field("mode", &self.mode).field("handshake", &self.handshake).finish()
    }
}

/// A connection just opened: its client, and the task that drives its I/O
/// (aborting the task closes the connection).
#[derive(Debug)]
pub struct Connected {
    pub client: Client,
    pub driver: JoinHandle<()>,
}

impl TlsConnector {
    /// Reads the files `settings` name (or libpq's defaults) and makes the
    /// TLS configuration every connection will use. Fails, naming the file
    /// or setting, when a file cannot be read or does not hold what it
    /// should, and when `verify-ca` or `verify-full` has no root to verify
    /// against.
    pub fn new(settings: &TlsSettings) -> Result<TlsConnector, DbError> {
        TlsConnector::with_defaults(settings, &DefaultFiles::of_home())
    }

    /// Like [`TlsConnector::new`], with libpq's default files looked for
    /// where `defaults` says.
    fn with_defaults(settings: &TlsSettings, defaults: &DefaultFiles) -> Result<TlsConnector, DbError> {
        if settings.mode == SslMode::Disable {
            return Ok(TlsConnector { mode: SslMode::Disable, handshake: None });
        }
        let roots = files::roots(settings.root_cert.as_ref(), defaults)?;
        if roots.is_none() && settings.mode.verifies() {
            return Err(DbError::Config(format!(
                "sslmode={} verifies the server's certificate, which takes certificate authorities to verify it with: \
                 name a PEM file of them with sslrootcert (libpq's default, {}, is not there), \
                 or use sslrootcert=system for the platform's",
                settings.mode,
                defaults.describe(DefaultFiles::ROOT_CERT),
            )));
        }
        let identity = files::client_identity(settings.client_cert.as_deref(), settings.client_key.as_deref(), defaults)?;
        let handshake = Handshake::new(settings.mode, roots, identity)?;
        Ok(TlsConnector { mode: settings.mode, handshake: Some(handshake) })
    }

    /// Opens one connection as `pg` says, trying its hosts in order (in a
    /// random order under `load_balance_hosts=random`) until one accepts,
    /// with TLS as libpq would use it on each (see the module's comment).
    /// The connection's I/O runs on a task spawned on the current runtime.
    pub async fn open(&self, pg: &tokio_postgres::Config) -> Result<Connected, tokio_postgres::Error> {
        let Some(mut attempts) = hosts::attempts(pg) else {
            // A configuration tokio-postgres refuses before any I/O (no host,
            // lists of hosts and addresses that do not line up): it says why.
            let mut refused = pg.clone();
            refused.ssl_mode(tokio_postgres::config::SslMode::Disable);
            return spawn_driver(&refused, NoTls).await;
        };
        if pg.get_load_balance_hosts() == LoadBalanceHosts::Random {
            let order = RandomState::new();
            attempts.sort_by_cached_key(|attempt| order.hash_one(attempt.index));
        }
        let mut last_error = None;
        for attempt in attempts {
            match self.open_on(attempt).await {
                Ok(connected) => return Ok(connected),
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.expect("hosts::attempts answers at least one host"))
    }

    /// One host: plain over a unix socket or under `disable`; else TLS as
    /// the mode says, and under `prefer` plain again when the handshake
    /// failed.
    async fn open_on(&self, attempt: HostAttempt) -> Result<Connected, tokio_postgres::Error> {
        use tokio_postgres::config::SslMode as Negotiation;
        let HostAttempt { mut config, over_tcp, .. } = attempt;
        let Some(handshake) = self.handshake.as_ref().filter(|_| over_tcp) else {
            config.ssl_mode(Negotiation::Disable);
            return spawn_driver(&config, NoTls).await;
        };
        // tokio-postgres knows disable, prefer and require; the verifying
        // modes are require to it, and the handshake does the verifying.
        config.ssl_mode(if self.mode == SslMode::Prefer { Negotiation::Prefer } else { Negotiation::Require });
        match spawn_driver(&config, handshake.clone()).await {
            Err(error) if self.mode == SslMode::Prefer && handshake::failed(&error) => {
                config.ssl_mode(Negotiation::Disable);
                spawn_driver(&config, NoTls).await
            }
            outcome => outcome,
        }
    }
}

impl deadpool_postgres::Connect for TlsConnector {
    fn connect(&self, pg: &tokio_postgres::Config) -> BoxFuture<'_, Result<(Client, JoinHandle<()>), tokio_postgres::Error>> {
        let pg = pg.clone();
        Box::pin(async move {
            let Connected { client, driver } = self.open(&pg).await?;
            Ok((client, driver))
        })
    }
}

/// Connects with `tls` and spawns the connection's driver, which logs how
/// the connection ended if it failed.
async fn spawn_driver<T>(config: &tokio_postgres::Config, tls: T) -> Result<Connected, tokio_postgres::Error>
where
    T: MakeTlsConnect<Socket> + Send,
    T::Stream: Send + 'static,
    T::TlsConnect: Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    let (client, connection) = config.connect(tls).await?;
    let driver = tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::warn!("connection error: {error}");
        }
    });
    Ok(Connected { client, driver })
}

/// Shared by the handshake's messages: what the server's certificate is
/// held to.
fn describe_checks(mode: SslMode, roots: Option<&str>) -> Arc<str> {
    let text = match (mode, roots) {
        (SslMode::VerifyFull, Some(roots)) => {
            format!("sslmode=verify-full: the certificate must chain to a root of {roots} and name the host")
        }
        (mode, Some(roots)) => format!("sslmode={mode}: the certificate must chain to a root of {roots}"),
        (mode, None) => format!("sslmode={mode}: the certificate is not verified"),
    };
    Arc::from(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_by_libpq_names() {
        for mode in [SslMode::Disable, SslMode::Prefer, SslMode::Require, SslMode::VerifyCa, SslMode::VerifyFull] {
            assert_eq!(mode.as_str().parse::<SslMode>(), Ok(mode));
        }
        assert!("allow".parse::<SslMode>().unwrap_err().contains("not supported"));
        assert!("bogus".parse::<SslMode>().unwrap_err().contains("\"bogus\""));
        assert_eq!(SslMode::default(), SslMode::Prefer);
    }

    #[test]
    fn verifying_modes_need_roots() {
        // A home without ~/.postgresql/root.crt: nothing to verify with.
        let nowhere = DefaultFiles::in_dir(std::env::temp_dir().join("stile-no-such-dir"));
        let settings = TlsSettings { mode: SslMode::VerifyCa, ..TlsSettings::default() };
        let error = TlsConnector::with_defaults(&settings, &nowhere).unwrap_err().to_string();
        assert!(error.contains("sslmode=verify-ca") && error.contains("sslrootcert"), "{error}");
        let settings = TlsSettings { mode: SslMode::Require, ..TlsSettings::default() };
        assert!(TlsConnector::with_defaults(&settings, &nowhere).is_ok());
    }

    #[test]
    fn a_missing_file_is_named() {
        let missing = std::env::temp_dir().join("stile-no-such-dir").join("ca.pem");
        let settings =
            TlsSettings { mode: SslMode::Require, root_cert: Some(RootCert::File(missing.clone())), ..TlsSettings::default() };
        let error = TlsConnector::new(&settings).unwrap_err().to_string();
        assert!(error.contains("sslrootcert") && error.contains(&missing.display().to_string()), "{error}");
        let settings = TlsSettings { mode: SslMode::Require, client_cert: Some(missing.clone()), ..TlsSettings::default() };
        let error = TlsConnector::new(&settings).unwrap_err().to_string();
        assert!(error.contains("sslcert") && error.contains(&missing.display().to_string()), "{error}");
    }
}
