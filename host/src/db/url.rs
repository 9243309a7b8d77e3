//! Connection strings: libpq keyword/value or URI form, with libpq's
//! environment defaults filled in (tokio_postgres reads no environment), and
//! the TLS settings tokio_postgres does not keep (`sslrootcert`, `sslcert`,
//! `sslkey`, and the verifying `sslmode`s) taken out of them first.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio_postgres::config::Host;

use super::DbError;
use super::tls::{RootCert, SslMode, TlsConnector, TlsSettings};

/// The unix socket directory preferred when neither the string nor `PGHOST`
/// names a host.
const SOCKET_DIR: &str = "/var/run/postgresql";

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Where the gateway's connections go, and how: one place for everything a
/// connection string, the `PG*` variables and libpq's defaults say.
#[derive(Clone, Debug)]
pub struct DbConfig {
    /// Everything but TLS, as tokio_postgres takes it. Its `ssl_mode` is not
    /// read: [`DbConfig::tls`] decides, host by host, as each connection is
    /// opened.
    pub pg: tokio_postgres::Config,
    /// How connections over TCP use TLS.
    pub tls: TlsSettings,
}

impl From<tokio_postgres::Config> for DbConfig {
    /// A tokio_postgres configuration as it stands, with the TLS its
    /// `ssl_mode` asks for and libpq's default files.
    fn from(pg: tokio_postgres::Config) -> DbConfig {
        use tokio_postgres::config::SslMode as Negotiation;
        let mode = match pg.get_ssl_mode() {
            Negotiation::Disable => SslMode::Disable,
            Negotiation::Prefer => SslMode::Prefer,
            _ => SslMode::Require,
        };
        DbConfig { pg, tls: TlsSettings { mode, ..TlsSettings::default() } }
    }
}

impl DbConfig {
    /// Parses a connection string (`host=… dbname=…` or `postgresql://…`;
    /// empty for all defaults) and fills in what it leaves out the way libpq
    /// would: host from `PGHOST`, else the unix socket directory
    /// `/var/run/postgresql` if it exists, else `127.0.0.1`; port from
    /// `PGPORT`, else 5432; user from `PGUSER`, else `$USER`, else `root`;
    /// database from `PGDATABASE`, else the user; password from
    /// `PGPASSWORD`; `sslmode`, `sslrootcert`, `sslcert` and `sslkey` from
    /// `PGSSLMODE`, `PGSSLROOTCERT`, `PGSSLCERT` and `PGSSLKEY`, the mode
    /// else `verify-full` with `sslrootcert=system` and `prefer` otherwise.
    /// Also sets `application_name=stile` and a 5 s connect timeout unless
    /// given.
    ///
    /// Refuses `sslmode=allow`, and a mode weaker than `verify-full` with
    /// `sslrootcert=system` (as libpq 16 does: any public authority could
    /// have signed the certificate for another name). Reads no file: the
    /// [`TlsConnector`] made from it does.
    pub fn parse(url: &str) -> Result<DbConfig, DbError> {
        // The string is not shown: where it fails to parse, no rule can say
        // which part of it is a password.
        let unparsable = |why: String| {
            DbError::Config(format!("the connection string does not parse ({why}); it is not shown, as it may hold a password"))
        };
        let split = split_tls(url).map_err(unparsable)?;
        let mut cfg = if split.rest.trim().is_empty() {
            tokio_postgres::Config::new()
        } else {
            split.rest.parse::<tokio_postgres::Config>().map_err(|e| unparsable(e.to_string()))?
        };
        fill_in(&mut cfg)?;
        let tls = tls_settings(split.tls, env).map_err(|why| match why {
            TlsRefusal::Unparsable(why) => unparsable(why),
            TlsRefusal::Invalid(why) => DbError::Config(why),
        })?;
        Ok(DbConfig { pg: cfg, tls })
    }

    /// Renders the configuration as a libpq keyword/value string, the
    /// password shown only when `with_password` is set (else
    /// `password=********` marks that there is one).
    pub fn to_url(&self, with_password: bool) -> String {
        let mut parts = vec![config_to_url(&self.pg, with_password)];
        parts.push(format!("sslmode={}", self.tls.mode));
        if let Some(root) = &self.tls.root_cert {
            parts.push(format!("sslrootcert={}", quote(&root.to_libpq())));
        }
        if let Some(cert) = &self.tls.client_cert {
            parts.push(format!("sslcert={}", quote_path(cert)));
        }
        if let Some(key) = &self.tls.client_key {
            parts.push(format!("sslkey={}", quote_path(key)));
        }
        parts.retain(|part| !part.is_empty());
        parts.join(" ")
    }

    /// Opens one connection of its own, outside any pool, through the same
    /// connector as the pools' (its files read anew). Its I/O runs on a
    /// task spawned on the current runtime.
    pub async fn connect(&self) -> Result<tokio_postgres::Client, DbError> {
        let connector = TlsConnector::new(&self.tls)?;
        Ok(connector.open(&self.pg).await?.client)
    }
}

/// Fills in what a parsed string left out from the `PG*` variables and
/// libpq's defaults (see [`DbConfig::parse`]).
fn fill_in(cfg: &mut tokio_postgres::Config) -> Result<(), DbError> {
    if cfg.get_hosts().is_empty() && cfg.get_hostaddrs().is_empty() {
        match env("PGHOST") {
            Some(hosts) => {
                for h in hosts.split(',') {
                    cfg.host(h);
                }
            }
            None if Path::new(SOCKET_DIR).is_dir() => {
                cfg.host_path(SOCKET_DIR);
            }
            None => {
                cfg.host("127.0.0.1");
            }
        }
    }
    if cfg.get_ports().is_empty() {
        let port = match env("PGPORT") {
            Some(p) => p.parse::<u16>().map_err(|_| DbError::Config(format!("PGPORT is not a port: {p:?}")))?,
            None => 5432,
        };
        cfg.port(port);
    }
    if cfg.get_user().is_none() {
        let user = env("PGUSER").or_else(|| env("USER")).unwrap_or_else(|| "root".to_string());
        cfg.user(&user);
    }
    if cfg.get_dbname().is_none() {
        let db = env("PGDATABASE").unwrap_or_else(|| cfg.get_user().unwrap_or("root").to_string());
        cfg.dbname(&db);
    }
    if cfg.get_password().is_none()
        && let Some(pw) = env("PGPASSWORD")
    {
        cfg.password(pw);
    }
    if cfg.get_application_name().is_none() {
        cfg.application_name("stile");
    }
    if cfg.get_connect_timeout().is_none() {
        cfg.connect_timeout(Duration::from_secs(5));
    }
    Ok(())
}

/// The TLS parameters a connection string names, as given (values
/// decoded): tokio_postgres refuses all but `sslmode`, and takes only three
/// of its values.
#[derive(Debug, Default, PartialEq, Eq)]
struct GivenTls {
    mode: Option<String>,
    root_cert: Option<String>,
    client_cert: Option<String>,
    client_key: Option<String>,
}

impl GivenTls {
    /// Takes `keyword = value` if it is one of the TLS parameters (a later
    /// one of the same name wins, as in libpq); answers whether it was.
    fn take(&mut self, keyword: &str, value: String) -> bool {
        let slot = match keyword {
            "sslmode" => &mut self.mode,
            "sslrootcert" => &mut self.root_cert,
            "sslcert" => &mut self.client_cert,
            "sslkey" => &mut self.client_key,
            _ => return false,
        };
        *slot = Some(value).filter(|value| !value.is_empty());
        true
    }
}

/// A connection string split in two: the TLS parameters, and the rest, for
/// tokio_postgres to parse.
#[derive(Debug)]
struct Split {
    rest: String,
    tls: GivenTls,
}

/// Takes the TLS parameters out of a connection string of either form,
/// reading it as tokio_postgres does, so that what is left parses as the
/// whole string would have.
fn split_tls(url: &str) -> Result<Split, String> {
    match ["postgresql://", "postgres://"].iter().find_map(|prefix| url.strip_prefix(prefix)) {
        Some(body) => split_uri(url, url.len() - body.len()),
        None => split_keyword_value(url),
    }
}

/// The URI form: its query, which starts at the first `?` after the
/// credentials (everything up to the first `@`), holds `key=value` pairs
/// separated by `&`, percent-encoded.
fn split_uri(url: &str, body_start: usize) -> Result<Split, String> {
    let body = &url[body_start..];
    let after_credentials = body.find('@').map_or(0, |at| at + 1);
    let mut tls = GivenTls::default();
    let Some(question) = body[after_credentials..].find('?') else {
        return Ok(Split { rest: url.to_owned(), tls });
    };
    let query_start = body_start + after_credentials + question;
    let mut kept = Vec::new();
    for pair in url[query_start + 1..].split('&') {
        let taken = match pair.split_once('=') {
            Some((key, value)) => tls.take(&percent_decode(key)?, percent_decode(value)?),
            None => false,
        };
        if !taken {
            kept.push(pair);
        }
    }
    let mut rest = url[..query_start].to_owned();
    if !kept.is_empty() {
        rest.push('?');
        rest.push_str(&kept.join("&"));
    }
    Ok(Split { rest, tls })
}

fn percent_decode(text: &str) -> Result<String, String> {
    percent_encoding::percent_decode_str(text)
        .decode_utf8()
        .map(|decoded| decoded.into_owned())
        .map_err(|e| format!("a parameter is not UTF-8 once decoded ({e})"))
}

/// The keyword/value form: the TLS parameters' text is cut out, the rest
/// left as written.
fn split_keyword_value(url: &str) -> Result<Split, String> {
    let mut tls = GivenTls::default();
    let mut rest = String::with_capacity(url.len());
    let mut kept_from = 0;
    for parameter in KeywordValues::new(url) {
        let parameter = parameter?;
        if tls.take(parameter.keyword, parameter.value) {
            rest.push_str(&url[kept_from..parameter.span.start]);
            rest.push(' ');
            kept_from = parameter.span.end;
        }
    }
    rest.push_str(&url[kept_from..]);
    Ok(Split { rest, tls })
}

/// One `keyword = value` of a keyword/value string.
#[derive(Debug, PartialEq, Eq)]
struct Parameter<'a> {
    keyword: &'a str,
    /// Unquoted, escapes resolved.
    value: String,
    /// Where it stands in the string, keyword to value.
    span: Range<usize>,
}

/// The parameters of a keyword/value string, read by tokio_postgres's rules
/// (libpq's): whitespace between parameters and around `=`; a value either
/// unquoted, up to whitespace, or in single quotes; a backslash escapes the
/// next character in both.
struct KeywordValues<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> KeywordValues<'a> {
    fn new(text: &'a str) -> KeywordValues<'a> {
        KeywordValues { text, at: 0 }
    }

    fn peek(&self) -> Option<char> {
        self.text[self.at..].chars().next()
    }

    fn skip_while(&mut self, keep: impl Fn(char) -> bool) -> &'a str {
        let start = self.at;
        while let Some(c) = self.peek().filter(|&c| keep(c)) {
            self.at += c.len_utf8();
        }
        &self.text[start..self.at]
    }

    fn parameter(&mut self) -> Result<Option<Parameter<'a>>, String> {
        self.skip_while(char::is_whitespace);
        let start = self.at;
        let keyword = self.skip_while(|c| !c.is_whitespace() && c != '=');
        if keyword.is_empty() {
            return Ok(None);
        }
        self.skip_while(char::is_whitespace);
        if self.peek() != Some('=') {
            return Err(format!("expected `=` after a keyword at byte {}", self.at));
        }
        self.at += 1;
        self.skip_while(char::is_whitespace);
        let value = self.value()?;
        Ok(Some(Parameter { keyword, value, span: start..self.at }))
    }

    fn value(&mut self) -> Result<String, String> {
        let quoted = self.peek() == Some('\'');
        if quoted {
            self.at += 1;
        }
        let mut value = String::new();
        loop {
            match self.peek() {
                Some('\'') if quoted => {
                    self.at += 1;
                    return Ok(value);
                }
                Some(c) if !quoted && c.is_whitespace() => break,
                Some(c) => {
                    self.at += c.len_utf8();
                    if c == '\\' {
                        if let Some(escaped) = self.peek() {
                            self.at += escaped.len_utf8();
                            value.push(escaped);
                        }
                    } else {
                        value.push(c);
                    }
                }
                None if quoted => return Err("unterminated quoted value".to_owned()),
                None => break,
            }
        }
        if value.is_empty() {
            return Err("a keyword without a value".to_owned());
        }
        Ok(value)
    }
}

impl<'a> Iterator for KeywordValues<'a> {
    type Item = Result<Parameter<'a>, String>;

    /// Ends after the first error.
    fn next(&mut self) -> Option<Self::Item> {
        let next = self.parameter();
        if next.is_err() {
            self.at = self.text.len();
        }
        next.transpose()
    }
}

/// Why TLS settings were refused.
#[derive(Debug)]
enum TlsRefusal {
    /// A value in the connection string that is not what its parameter
    /// takes.
    Unparsable(String),
    /// Settings that cannot be used together, a choice the gateway does not
    /// make, or a variable's bad value.
    Invalid(String),
}

/// The TLS settings from what the string gave and, for what it did not,
/// the `PGSSL*` variables as `var` reads them (see [`DbConfig::parse`]).
fn tls_settings(given: GivenTls, var: impl Fn(&str) -> Option<String>) -> Result<TlsSettings, TlsRefusal> {
    let root_cert = given.root_cert.or_else(|| var("PGSSLROOTCERT")).map(|text| RootCert::from_libpq(&text));
    let mode = match (given.mode, var("PGSSLMODE")) {
        (Some(text), _) => text
            .parse::<SslMode>()
            .map_err(|why| if text == "allow" { TlsRefusal::Invalid(why) } else { TlsRefusal::Unparsable(why) })?,
        (None, Some(text)) => text.parse::<SslMode>().map_err(|why| TlsRefusal::Invalid(format!("PGSSLMODE: {why}")))?,
        (None, None) if root_cert == Some(RootCert::System) => SslMode::VerifyFull,
        (None, None) => SslMode::Prefer,
    };
    if root_cert == Some(RootCert::System) && mode != SslMode::VerifyFull {
        return Err(TlsRefusal::Invalid(format!(
            "sslmode={mode} may not be used with sslrootcert=system: use sslmode=verify-full \
             (any authority the platform trusts can sign a certificate, for some other name)"
        )));
    }
    Ok(TlsSettings {
        mode,
        root_cert,
        client_cert: given.client_cert.or_else(|| var("PGSSLCERT")).map(PathBuf::from),
        client_key: given.client_key.or_else(|| var("PGSSLKEY")).map(PathBuf::from),
    })
}

fn quote_path(path: &Path) -> String {
    quote(&path.display().to_string())
}

fn quote(v: &str) -> String {
    if !v.is_empty() && !v.contains([' ', '\'', '\\']) {
        v.to_string()
    } else {
        format!("'{}'", v.replace('\\', "\\\\").replace('\'', "\\'"))
    }
}

/// The keyword/value form of what `cfg` holds but TLS (see
/// [`DbConfig::to_url`]).
fn config_to_url(cfg: &tokio_postgres::Config, with_password: bool) -> String {
    let mut parts = Vec::new();
    let hosts: Vec<String> = cfg
        .get_hosts()
        .iter()
        .map(|h| match h {
            Host::Tcp(name) => name.clone(),
            #[cfg(unix)]
            Host::Unix(path) => path.display().to_string(),
        })
        .collect();
    if !hosts.is_empty() {
        parts.push(format!("host={}", quote(&hosts.join(","))));
    }
    let addrs: Vec<String> = cfg.get_hostaddrs().iter().map(|a| a.to_string()).collect();
    if !addrs.is_empty() {
        parts.push(format!("hostaddr={}", addrs.join(",")));
    }
    let ports: Vec<String> = cfg.get_ports().iter().map(|p| p.to_string()).collect();
    if !ports.is_empty() {
        parts.push(format!("port={}", ports.join(",")));
    }
    if let Some(u) = cfg.get_user() {
        parts.push(format!("user={}", quote(u)));
    }
    if let Some(d) = cfg.get_dbname() {
        parts.push(format!("dbname={}", quote(d)));
    }
    if let Some(pw) = cfg.get_password() {
        if with_password {
            parts.push(format!("password={}", quote(&String::from_utf8_lossy(pw))));
        } else {
            parts.push("password=********".to_string());
        }
    }
    if let Some(o) = cfg.get_options() {
        parts.push(format!("options={}", quote(o)));
    }
    if let Some(a) = cfg.get_application_name() {
        parts.push(format!("application_name={}", quote(a)));
    }
    if let Some(t) = cfg.get_connect_timeout() {
        parts.push(format!("connect_timeout={}", t.as_secs().max(1)));
    }
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_vars(_: &str) -> Option<String> {
        None
    }

    /// The TLS settings of `url`, read without the environment.
    fn tls_of(url: &str) -> Result<TlsSettings, TlsRefusal> {
        tls_settings(split_tls(url).map_err(TlsRefusal::Unparsable)?.tls, no_vars)
    }

    #[test]
    fn keyword_and_uri_forms() {
        let a = DbConfig::parse("host=db.example port=6000 user=u dbname=d password=secret").unwrap();
        let s = a.to_url(false);
        assert!(s.contains("host=db.example"), "{s}");
        assert!(s.contains("port=6000"), "{s}");
        assert!(s.contains("password=********"), "{s}");
        assert!(!s.contains("secret"), "{s}");
        assert!(a.to_url(true).contains("password=secret"));

        let b = DbConfig::parse("postgresql://u:secret@db.example:6001/d").unwrap();
        assert_eq!(b.pg.get_user(), Some("u"));
        assert_eq!(b.pg.get_dbname(), Some("d"));
        assert_eq!(b.pg.get_ports(), &[6001]);
        assert!(!b.to_url(false).contains("secret"));
    }

    #[test]
    fn an_unparsable_string_is_not_shown() {
        for url in [
            "postgresql://u:hunter2@h/d?sslmode=bogus",
            "postgresql://u@h/d?password=hunter2&sslmode=bogus",
            "host=h password = hunter2 sslmode=bogus",
            "host=h password='hunter2 x' sslmode=bogus",
            "host=h password='hunter2 sslmode=require",
            "host=h password=hunter2 sslcert",
            "host=h password=hunter2 nonsense=1",
        ] {
            let error = DbConfig::parse(url).unwrap_err().to_string();
            assert!(!error.contains("hunter2"), "{url}: {error}");
            assert!(error.contains("does not parse"), "{url}: {error}");
        }
    }

    #[test]
    fn tls_parameters_come_out_of_a_uri() {
        let url = "postgresql://u:p%3Fw@db.example:6001/d?application_name=app&sslmode=verify-full\
                   &sslrootcert=%2Fetc%2Fca%20roots.pem&sslcert=/c.pem&sslkey=/k.pem&connect_timeout=3";
        let config = DbConfig::parse(url).unwrap();
        assert_eq!(config.pg.get_application_name(), Some("app"));
        assert_eq!(config.pg.get_connect_timeout(), Some(&Duration::from_secs(3)));
        assert_eq!(config.pg.get_password(), Some(&b"p?w"[..]));
        assert_eq!(
            config.tls,
            TlsSettings {
                mode: SslMode::VerifyFull,
                root_cert: Some(RootCert::File("/etc/ca roots.pem".into())),
                client_cert: Some("/c.pem".into()),
                client_key: Some("/k.pem".into()),
            }
        );
        // A `?` in the credentials does not start the query; a query of TLS
        // parameters alone goes whole.
        let split = split_tls("postgresql://u:a?b@h/d?sslmode=require").unwrap();
        assert_eq!(split.rest, "postgresql://u:a?b@h/d");
        assert_eq!(split.tls.mode.as_deref(), Some("require"));
        let split = split_tls("postgres://h/d?sslmode=disable&target_session_attrs=read-write").unwrap();
        assert_eq!(split.rest, "postgres://h/d?target_session_attrs=read-write");
    }

    #[test]
    fn tls_parameters_come_out_of_keywords_and_values() {
        let url = "host=h sslmode = 'verify-ca' password='x sslmode=disable' sslrootcert='/a b/ca.pem' \
                   sslkey=/k\\ 1.pem dbname=d";
        let config = DbConfig::parse(url).unwrap();
        assert_eq!(config.pg.get_password(), Some(&b"x sslmode=disable"[..]));
        assert_eq!(config.pg.get_dbname(), Some("d"));
        assert_eq!(config.tls.mode, SslMode::VerifyCa);
        assert_eq!(config.tls.root_cert, Some(RootCert::File("/a b/ca.pem".into())));
        assert_eq!(config.tls.client_key, Some(PathBuf::from("/k 1.pem")));
        // Only TLS parameters: everything else from the defaults.
        let config = DbConfig::parse("sslmode=disable").unwrap();
        assert_eq!(config.tls.mode, SslMode::Disable);
        assert!(!config.pg.get_hosts().is_empty());
    }

    #[test]
    fn libpq_rules_for_the_mode() {
        assert_eq!(tls_of("host=h").unwrap().mode, SslMode::Prefer);
        assert_eq!(tls_of("host=h sslrootcert=/ca.pem").unwrap().mode, SslMode::Prefer);
        // sslrootcert=system: verify-full unless said otherwise, and nothing weaker.
        let system = tls_of("host=h sslrootcert=system").unwrap();
        assert_eq!((system.mode, system.root_cert), (SslMode::VerifyFull, Some(RootCert::System)));
        let Err(TlsRefusal::Invalid(why)) = tls_of("host=h sslrootcert=system sslmode=verify-ca") else { panic!() };
        assert!(why.contains("verify-full"), "{why}");
        let Err(TlsRefusal::Invalid(why)) = tls_of("postgresql://h/d?sslmode=allow") else { panic!() };
        assert!(why.contains("allow is not supported"), "{why}");
        let error = DbConfig::parse("host=h sslmode=allow").unwrap_err().to_string();
        assert!(error.contains("not supported") && !error.contains("does not parse"), "{error}");
    }

    #[test]
    fn the_string_comes_before_the_variables() {
        let vars = |name: &str| match name {
            "PGSSLMODE" => Some("verify-ca".to_owned()),
            "PGSSLROOTCERT" => Some("/env/ca.pem".to_owned()),
            "PGSSLCERT" => Some("/env/c.pem".to_owned()),
            "PGSSLKEY" => Some("/env/k.pem".to_owned()),
            _ => None,
        };
        let from_vars = tls_settings(GivenTls::default(), vars).unwrap();
        assert_eq!(
            from_vars,
            TlsSettings {
                mode: SslMode::VerifyCa,
                root_cert: Some(RootCert::File("/env/ca.pem".into())),
                client_cert: Some("/env/c.pem".into()),
                client_key: Some("/env/k.pem".into()),
            }
        );
        let given = split_tls("host=h sslmode=require sslrootcert=/s/ca.pem").unwrap().tls;
        let mixed = tls_settings(given, vars).unwrap();
        assert_eq!(mixed.mode, SslMode::Require);
        assert_eq!(mixed.root_cert, Some(RootCert::File("/s/ca.pem".into())));
        assert_eq!(mixed.client_cert, Some("/env/c.pem".into()));
        // PGSSLROOTCERT=system makes verify-full the default too.
        let system = |name: &str| (name == "PGSSLROOTCERT").then(|| "system".to_owned());
        assert_eq!(tls_settings(GivenTls::default(), system).unwrap().mode, SslMode::VerifyFull);
        let bad = |name: &str| (name == "PGSSLMODE").then(|| "sometimes".to_owned());
        let Err(TlsRefusal::Invalid(why)) = tls_settings(GivenTls::default(), bad) else { panic!() };
        assert!(why.starts_with("PGSSLMODE"), "{why}");
    }

    #[test]
    fn the_rendered_string_says_the_same() {
        for url in [
            "host=h port=7 user=u dbname=d sslmode=verify-full sslrootcert='/x y/ca.pem' sslcert=/c sslkey=/k",
            "postgresql://u@h/d?sslrootcert=system",
            "host=h user=u dbname=d sslmode=disable",
        ] {
            let config = DbConfig::parse(url).unwrap();
            let again = DbConfig::parse(&config.to_url(true)).unwrap();
            assert_eq!(again.tls, config.tls, "{url}");
            assert_eq!(again.pg, config.pg, "{url}");
        }
    }

    #[test]
    fn keyword_value_reading_matches_tokio_postgres() {
        for text in ["user=a dbname = '2 3' options=\\'x application_name='it\\'s'", "\tuser=a\t", "user='' dbname=é\\ ü"] {
            let theirs: tokio_postgres::Config = text.parse().unwrap();
            let ours: Vec<Parameter<'_>> = KeywordValues::new(text).collect::<Result<_, _>>().unwrap();
            for parameter in &ours {
                let expected = match parameter.keyword {
                    "user" => theirs.get_user(),
                    "dbname" => theirs.get_dbname(),
                    "options" => theirs.get_options(),
                    "application_name" => theirs.get_application_name(),
                    other => panic!("{other}"),
                };
                assert_eq!(Some(parameter.value.as_str()), expected, "{text}");
                let cut = &text[parameter.span.clone()];
                assert!(cut.starts_with(parameter.keyword) && !cut.ends_with(char::is_whitespace), "{text}: {cut:?}");
            }
        }
        for refused in ["user", "user=", "user='x", "user dbname=1"] {
            assert!(refused.parse::<tokio_postgres::Config>().is_err(), "{refused}");
            assert!(KeywordValues::new(refused).any(|p| p.is_err()), "{refused}");
        }
    }
}
