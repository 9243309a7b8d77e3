//! TLS between the gateway and PostgreSQL, with real gateway processes
//! against PostgreSQL servers of the tests' own: one with TLS on (its
//! certificate for `localhost`, from an authority each test makes), one
//! without. Each `sslmode` keeps libpq's meaning: `prefer` (the default) and
//! `require` take any certificate, `verify-ca` its chain, `verify-full` its
//! chain and the host's name; a unix socket never uses TLS. The settings come
//! from the URL, the keyword/value string or the `PGSSL*` variables alike,
//! and what is refused is refused at start, with a message that says why.
//!
//! The shared server is not used: whether it has TLS on or not, these tests
//! do not depend on it.

use std::path::Path;

use serde_json::json;
use stile_tests::gateway::{Gateway, GatewayOptions, item};
use stile_tests::scratch::ScratchServer;
use stile_tests::tls_pki::{Authority, CERT_DATABASE, OPEN_DATABASE, TlsServer};

/// The TLS variables, cleared unless a test sets them, and a home without
/// `~/.postgresql`, so that neither the tests' environment nor libpq's
/// default files change what a gateway does.
fn isolated(home: &Path) -> GatewayOptions {
    let mut options = GatewayOptions { shards: Some(1), pool_size: Some(2), ..GatewayOptions::default() };
    for var in ["PGSSLMODE", "PGSSLROOTCERT", "PGSSLCERT", "PGSSLKEY"] {
        options.env.insert(var.to_owned(), None);
    }
    options.env.insert("HOME".to_owned(), Some(home.display().to_string()));
    options
}

/// Starts a gateway on `url` (which names `application_name=<app>`), pushes
/// a message through it, and answers, for each of its connections to
/// `server`, whether it uses TLS.
async fn push_through(server: &ScratchServer, url: &str, options: &GatewayOptions, app: &str) -> Vec<bool> {
    let gateway = Gateway::start_with(url, options).await;
    let mut client = gateway.client().await;
    let answers = client.push(vec![item("tls", app, Some("first"), json!({"over": app}))]).await;
    assert!(answers[0].queued(), "{app}: {answers:?}");
    let again = client.push(vec![item("tls", app, Some("first"), json!({"over": app}))]).await;
    assert!(again[0].duplicate(), "{app}: {again:?}");
    let admin = server.admin_config("postgres").connect().await.expect("connect to the scratch server");
    let rows = admin
        .query("SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.application_name = $1", &[&app])
        .await
        .expect("read pg_stat_ssl");
    let tls: Vec<bool> = rows.iter().map(|row| row.get("ssl")).collect();
    assert!(!tls.is_empty(), "{app}: the gateway has no connection to the server:\n{}", gateway.logs());
    tls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mode_connects_over_tls_to_a_server_that_offers_it() {
    let tls = TlsServer::start(&[]).await.expect("start a server with TLS");
    let options = isolated(tls.server.socket_dir());
    let ca = tls.ca_file.display().to_string();
    let cases = [
        // libpq's default, prefer: TLS where the server offers it.
        ("default", tls.url("127.0.0.1", OPEN_DATABASE, "application_name=default")),
        ("require", tls.url("127.0.0.1", OPEN_DATABASE, "application_name=require&sslmode=require")),
        // verify-ca holds the chain only: 127.0.0.1 is not a name of the certificate.
        (
            "verify-ca",
            tls.url("127.0.0.1", OPEN_DATABASE, &format!("application_name=verify-ca&sslmode=verify-ca&sslrootcert={ca}")),
        ),
        (
            "verify-full",
            tls.url("localhost", OPEN_DATABASE, &format!("application_name=verify-full&sslmode=verify-full&sslrootcert={ca}")),
        ),
        (
            "keyword-value",
            format!(
                "host=localhost port={} user=postgres dbname={OPEN_DATABASE} application_name=keyword-value \
                 sslmode=verify-full sslrootcert='{ca}'",
                tls.server.port()
            ),
        ),
    ];
    for (app, url) in cases {
        let connections = push_through(&tls.server, &url, &options, app).await;
        assert!(connections.iter().all(|&tls| tls), "{app}: a connection without TLS: {connections:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_that_does_not_pass_is_refused_at_start_saying_why() {
    let tls = TlsServer::start(&[]).await.expect("start a server with TLS");
    let options = isolated(tls.server.socket_dir());
    let ca = tls.ca_file.display().to_string();

    // verify-full: the certificate names localhost, not 127.0.0.1.
    let wrong_name = tls.url("127.0.0.1", OPEN_DATABASE, &format!("sslmode=verify-full&sslrootcert={ca}"));
    let refused = Gateway::refused(&wrong_name, &options).await;
    assert!(!refused.status.success(), "{refused:?}");
    assert!(
        refused.stderr.contains("the host name \"127.0.0.1\" does not match the server's certificate"),
        "the error says the name does not match:\n{}",
        refused.stderr
    );
    assert!(refused.stderr.contains("sslmode=verify-full"), "{}", refused.stderr);

    // An authority the server's certificate does not chain to.
    let other = Authority::new("another authority");
    let other_ca = tls.server.write_file("other-ca.crt", other.cert_pem().as_bytes()).expect("write a file");
    let untrusted = tls.url("localhost", OPEN_DATABASE, &format!("sslmode=verify-ca&sslrootcert={}", other_ca.display()));
    let refused = Gateway::refused(&untrusted, &options).await;
    assert!(!refused.status.success(), "{refused:?}");
    assert!(refused.stderr.contains("is not signed by a trusted authority"), "{}", refused.stderr);
    // With that root file there, require verifies the chain too (libpq's rule).
    let require = tls.url("localhost", OPEN_DATABASE, &format!("sslmode=require&sslrootcert={}", other_ca.display()));
    let refused = Gateway::refused(&require, &options).await;
    assert!(refused.stderr.contains("is not signed by a trusted authority"), "{}", refused.stderr);

    // verify-full without any root to verify with.
    let no_roots = tls.url("localhost", OPEN_DATABASE, "sslmode=verify-full");
    let refused = Gateway::refused(&no_roots, &options).await;
    assert!(!refused.status.success(), "{refused:?}");
    assert!(refused.stderr.contains("sslrootcert"), "{}", refused.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_is_presented_where_the_server_requires_one() {
    let tls = TlsServer::start(&[]).await.expect("start a server with TLS");
    let options = isolated(tls.server.socket_dir());
    let ca = tls.ca_file.display().to_string();
    let client = tls.client_files("client", "postgres").expect("write a client certificate");
    let with_cert = tls.url(
        "localhost",
        CERT_DATABASE,
        &format!(
            "application_name=client-cert&sslmode=verify-full&sslrootcert={ca}&sslcert={}&sslkey={}",
            client.cert.display(),
            client.key.display()
        ),
    );
    let connections = push_through(&tls.server, &with_cert, &options, "client-cert").await;
    assert!(connections.iter().all(|&tls| tls), "{connections:?}");

    let without = tls.url("localhost", CERT_DATABASE, &format!("sslmode=verify-full&sslrootcert={ca}"));
    let refused = Gateway::refused(&without, &options).await;
    assert!(!refused.status.success(), "{refused:?}");
    assert!(refused.stderr.contains("certificate"), "the server's refusal is shown:\n{}", refused.stderr);

    // A certificate for another user: clientcert=verify-full holds its name
    // to the user's.
    let stranger = tls.client_files("stranger", "someone-else").expect("write a client certificate");
    let wrong_user = tls.url(
        "localhost",
        CERT_DATABASE,
        &format!("sslmode=require&sslcert={}&sslkey={}", stranger.cert.display(), stranger.key.display()),
    );
    let refused = Gateway::refused(&wrong_user, &options).await;
    assert!(!refused.status.success(), "{refused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pg_variables_give_what_the_string_leaves_out_and_unix_sockets_stay_plain() {
    let tls = TlsServer::start(&[]).await.expect("start a server with TLS");
    let ca = tls.ca_file.display().to_string();

    let mut from_vars = isolated(tls.server.socket_dir());
    from_vars.env.insert("PGSSLMODE".to_owned(), Some("verify-full".to_owned()));
    from_vars.env.insert("PGSSLROOTCERT".to_owned(), Some(ca.clone()));
    let url = tls.url("localhost", OPEN_DATABASE, "application_name=from-vars");
    let connections = push_through(&tls.server, &url, &from_vars, "from-vars").await;
    assert!(connections.iter().all(|&tls| tls), "{connections:?}");
    // The same variables, with a name the certificate does not hold: the
    // mode really was verify-full.
    let refused = Gateway::refused(&tls.url("127.0.0.1", OPEN_DATABASE, ""), &from_vars).await;
    assert!(refused.stderr.contains("does not match"), "{}", refused.stderr);
    // The string comes first.
    let url = tls.url("127.0.0.1", OPEN_DATABASE, "application_name=string-first&sslmode=disable");
    let connections = push_through(&tls.server, &url, &from_vars, "string-first").await;
    assert!(connections.iter().all(|&tls| !tls), "{connections:?}");

    // A unix socket never uses TLS, whatever the mode (as in libpq).
    let socket = format!(
        "host={} port={} user=postgres dbname={OPEN_DATABASE} application_name=socket sslmode=verify-full sslrootcert='{ca}'",
        tls.server.socket_dir().display(),
        tls.server.port()
    );
    let connections = push_through(&tls.server, &socket, &isolated(tls.server.socket_dir()), "socket").await;
    assert!(connections.iter().all(|&tls| !tls), "{connections:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_is_refused_and_prefer_goes_plain_where_the_server_has_no_tls() {
    let server = ScratchServer::init("plain").await.expect("make a server");
    server.start(&["ssl=off".to_owned()]).await.expect("start a server without TLS");
    server.create_database(OPEN_DATABASE).await.expect("create its database");
    let options = isolated(server.socket_dir());
    let url = |query: &str| format!("postgresql://postgres@127.0.0.1:{}/{OPEN_DATABASE}?{query}", server.port());

    let refused = Gateway::refused(&url("sslmode=require"), &options).await;
    assert!(!refused.status.success(), "{refused:?}");
    assert!(refused.stderr.contains("server does not support TLS"), "{}", refused.stderr);

    for (app, query) in [("prefer", "application_name=prefer&sslmode=prefer"), ("default", "application_name=default")] {
        let connections = push_through(&server, &url(query), &options, app).await;
        assert!(connections.iter().all(|&tls| !tls), "{app}: {connections:?}");
    }
    let mut require_from_vars = options.clone();
    require_from_vars.env.insert("PGSSLMODE".to_owned(), Some("require".to_owned()));
    let refused = Gateway::refused(&url(""), &require_from_vars).await;
    assert!(refused.stderr.contains("server does not support TLS"), "{}", refused.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_that_cannot_be_used_are_refused_naming_them() {
    let home = std::env::temp_dir();
    let options = isolated(&home);
    let missing = home.join("stile-no-such-dir").join("root.pem");
    let cases = [
        (
            format!("postgresql://postgres@127.0.0.1:1/x?sslmode=verify-ca&sslrootcert={}", missing.display()),
            missing.display().to_string(),
        ),
        (format!("host=127.0.0.1 port=1 sslmode=require sslcert='{}'", missing.display()), missing.display().to_string()),
        ("host=127.0.0.1 port=1 sslmode=allow".to_owned(), "sslmode=allow is not supported".to_owned()),
        ("postgresql://127.0.0.1:1/x?sslrootcert=system&sslmode=require".to_owned(), "verify-full".to_owned()),
    ];
    for (url, named) in cases {
        let refused = Gateway::refused(&url, &options).await;
        assert!(!refused.status.success(), "{url}: {refused:?}");
        assert!(refused.stderr.contains(&named), "{url}: the error names {named}:\n{}", refused.stderr);
    }
}
