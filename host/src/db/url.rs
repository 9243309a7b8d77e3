//! Connection strings: libpq keyword/value or URI form, with libpq's
//! environment defaults filled in (tokio_postgres reads no environment).

use std::path::Path;
use std::time::Duration;

use tokio_postgres::config::Host;

use super::DbError;

/// The unix socket directory preferred when neither the string nor `PGHOST`
/// names a host.
const SOCKET_DIR: &str = "/var/run/postgresql";

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Parses a connection string (`host=… dbname=…` or `postgresql://…`; empty
/// for all defaults) and fills in what it leaves out the way libpq would:
/// host from `PGHOST`, else the unix socket directory `/var/run/postgresql` if
/// it exists, else `127.0.0.1`; port from `PGPORT`, else 5432; user from
/// `PGUSER`, else `$USER`, else `root`; database from `PGDATABASE`, else the
/// user; password from `PGPASSWORD`. Also sets `application_name=stile` and a
/// 5 s connect timeout unless given.
pub fn pg_config(url: &str) -> Result<tokio_postgres::Config, DbError> {
    let mut cfg = if url.trim().is_empty() {
        tokio_postgres::Config::new()
    } else {
        // The string is not shown: where it fails to parse, no rule can say
        // which part of it is a password.
        url.parse::<tokio_postgres::Config>().map_err(|e| {
            DbError::Config(format!("the connection string does not parse ({e}); it is not shown, as it may hold a password"))
        })?
    };
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
    Ok(cfg)
}

fn quote(v: &str) -> String {
    if !v.is_empty() && !v.contains([' ', '\'', '\\']) {
        v.to_string()
    } else {
        format!("'{}'", v.replace('\\', "\\\\").replace('\'', "\\'"))
    }
}

/// Renders a configuration as a libpq keyword/value string, the password
/// shown only when `with_password` is set (else `password=********` marks that
/// there is one).
pub fn config_to_url(cfg: &tokio_postgres::Config, with_password: bool) -> String {
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

    #[test]
    fn keyword_and_uri_forms() {
        let a = pg_config("host=db.example port=6000 user=u dbname=d password=secret").unwrap();
        let s = config_to_url(&a, false);
        assert!(s.contains("host=db.example"), "{s}");
        assert!(s.contains("port=6000"), "{s}");
        assert!(s.contains("password=********"), "{s}");
        assert!(!s.contains("secret"), "{s}");
        assert!(config_to_url(&a, true).contains("password=secret"));

        let b = pg_config("postgresql://u:secret@db.example:6001/d").unwrap();
        assert_eq!(b.get_user(), Some("u"));
        assert_eq!(b.get_dbname(), Some("d"));
        assert_eq!(b.get_ports(), &[6001]);
        assert!(!config_to_url(&b, false).contains("secret"));
    }

    #[test]
    fn an_unparsable_string_is_not_shown() {
        for url in [
            "postgresql://u:hunter2@h/d?sslmode=bogus",
            "postgresql://u@h/d?password=hunter2&sslmode=bogus",
            "host=h password = hunter2 sslmode=bogus",
            "host=h password='hunter2 x' sslmode=bogus",
        ] {
            let error = pg_config(url).unwrap_err().to_string();
            assert!(!error.contains("hunter2"), "{url}: {error}");
            assert!(error.contains("does not parse"), "{url}: {error}");
        }
    }
}
