//! The exactness checker over TLS: three gateways (one trapping 2 % of its
//! guest calls, one with a 1 MiB cache budget) on a PostgreSQL server of the
//! test's own with TLS on, each given `sslmode=verify-full` with the test's
//! authority, six producers with retries and repeats, a `kill -9` and restart
//! every few seconds, and the window shortened and lengthened mid-run.
//! Afterwards every answer is checked against PostgreSQL, read over TLS too;
//! there must be no violation. Under `verify-full` a gateway cannot fall
//! back to a plain connection, so a run that served at all served over TLS.

use std::time::Duration;

use stile_tests::checker::{self, Config, Faults, GatewaySpec, ShortWindow};
use stile_tests::tls_pki::{OPEN_DATABASE, TlsServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_over_tls_under_kills_guest_traps_a_tiny_cache_and_window_changes() {
    let tls = TlsServer::start(&["max_connections=150".to_owned()]).await.expect("start a server with TLS");
    let url = tls.url("localhost", OPEN_DATABASE, &format!("sslmode=verify-full&sslrootcert={}", tls.ca_file.display()));
    let mut config = Config::new(&url, Duration::from_secs(20));
    config.gateways =
        vec![GatewaySpec::traps("g0-traps", 20_000), GatewaySpec::tiny_cache("g1-tiny", 1, 8), GatewaySpec::plain("g2")];
    config.faults = Faults {
        kill_every: Some(Duration::from_secs(6)),
        kill_downtime: Duration::from_millis(700),
        short_window: Some(ShortWindow { seconds: 2, from: 0.3, to: 0.55 }),
        ..Faults::default()
    };
    let report = checker::run(&config).await.expect("the checker runs");
    println!("{report}");
    assert!(report.violations.is_empty(), "violations:\n{report}");
    assert!(report.unexpected_exits.is_empty(), "a gateway exited by itself:\n{report}");
    assert!(report.fault_errors.is_empty(), "a fault could not be injected:\n{report}");
    assert!(report.kills >= 2 && report.restarts >= report.kills, "{report}");
    assert!(report.guest_traps > 0, "no guest trap was injected:\n{report}");
    assert_eq!(report.window_changes.len(), 2, "{report}");
    assert!(report.queued >= 1_000 && report.duplicate >= 100, "too little traffic:\n{report}");
}
