//! The exactness checker across a failover: two gateways given a primary and
//! its synchronous standby (libpq's multi-host form with
//! `target_session_attrs=read-write`), producers retrying, the primary
//! stopped immediately mid-run and the standby promoted. Afterwards the
//! truth is read from the promoted standby alone: every message the old
//! primary acknowledged must be there, no id stored twice, every answer
//! consistent.
//!
//! The checker makes both servers itself, in a temporary directory on free
//! ports, and removes them when the run ends, failed or not; the shared
//! server is not touched.

use std::time::Duration;

use stile_tests::checker::{self, Config, Faults, GatewaySpec};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_across_a_failover_to_a_synchronous_standby() {
    let mut config = Config::new("", Duration::from_secs(16));
    config.producers = 4;
    config.gateways = vec![GatewaySpec::plain("g0"), GatewaySpec::traps("g1-traps", 20_000)];
    config.faults = Faults { failover_at: Some(Duration::from_secs(7)), ..Faults::default() };
    let report = checker::run(&config).await.expect("the checker runs");
    println!("{report}");
    assert!(report.violations.is_empty(), "violations:\n{report}");
    assert!(report.unexpected_exits.is_empty(), "a gateway exited by itself:\n{report}");
    assert!(report.fault_errors.is_empty(), "a fault could not be injected:\n{report}");
    // The failover happened, with the standby synchronous up to the stop.
    let failover = report.failover.as_ref().expect("the failover happened");
    assert_eq!(failover.sync_state, "sync", "the primary's commits did not wait for the standby:\n{report}");
    // The truth came from the promoted standby, and it holds what the old
    // primary acknowledged (the checks find every answer there).
    assert_eq!(failover.truth_from, failover.standby, "{report}");
    assert!(!failover.truth_in_recovery, "the standby was not promoted:\n{report}");
    assert!(failover.queued_before >= 300, "too little acknowledged before the stop:\n{report}");
    // The gateways served again, from the promoted standby: only it could
    // answer pushes sent after the stop.
    assert!(failover.served_again_after.is_some_and(|after| after < Duration::from_secs(10)), "{report}");
    assert!(failover.queued_after >= 300, "too little served after the failover:\n{report}");
}
