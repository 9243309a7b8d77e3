//! The exactness checker across a PostgreSQL restart: two gateways on one
//! database, producers retrying through the outage, a retry storm replaying
//! stored ids at full speed across it, and every answer checked against
//! PostgreSQL afterwards.
//!
//! This restarts the PostgreSQL cluster the test database lives on
//! (`pg_ctlcluster --skip-systemctl-redirect VERSION NAME restart`, the
//! cluster found from the port of `STILE_TEST_DATABASE_URL`). It is the only
//! test in this binary, so no other test runs meanwhile (cargo runs test
//! binaries one after another).

use std::time::Duration;

use stile_tests::checker::{self, Config, Faults, GatewaySpec};
use stile_tests::pg::TestDb;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_across_a_postgres_restart() {
    let t = TestDb::new().await;
    let mut config = Config::new(&t.url(), Duration::from_secs(16));
    config.producers = 4;
    config.storm_producers = 2;
    config.gateways = vec![GatewaySpec::plain("g0"), GatewaySpec::traps("g1-traps", 20_000)];
    config.faults = Faults { pg_restart_at: vec![Duration::from_secs(6)], ..Faults::default() };
    let report = checker::run(&config).await.expect("the checker runs");
    println!("{report}");
    assert!(report.violations.is_empty(), "violations:\n{report}");
    assert!(report.unexpected_exits.is_empty(), "a gateway exited by itself:\n{report}");
    assert!(report.fault_errors.is_empty(), "a fault could not be injected:\n{report}");
    assert_eq!(report.pg_restarts, 1, "{report}");
    assert!(report.queued >= 500, "too little traffic:\n{report}");
    assert!(report.probes.get("committed").is_some_and(|&n| n > 0), "no replay was judged unlocked:\n{report}");
}
