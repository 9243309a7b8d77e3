//! The exactness checker, short form: three gateways on one database — one
//! trapping 2 % of its guest calls, one with a 1 MiB cache budget over 8 shards, one plain,
//! the last two with wall clocks two hours (two windows) ahead of and behind
//! PostgreSQL's that swap halfway — six producers with retries and repeats,
//! two producers of a retry storm (replaying their own stored ids as fast as
//! they are answered from a third of the run on), a `kill -9` and restart
//! every few seconds, the window shortened and
//! lengthened mid-run, and for eight seconds a flood of 256 connections of
//! large pushes that the gateways (at `--max-held-mb 8`) must shed. Afterwards
//! every answer is checked against PostgreSQL; there must be no violation,
//! and the flood must have been answered 201 or 503 only.
//!
//! The PostgreSQL restart has a test binary of its own
//! (`checker_pg_restart.rs`), so that it cannot disturb other tests.

use std::time::Duration;

use stile_tests::checker::{self, ClockSkew, Config, Faults, GatewaySpec, OverloadFault, ShortWindow, Spell};
use stile_tests::pg::TestDb;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_under_kills_guest_traps_a_tiny_cache_clock_jumps_window_changes_and_an_overload() {
    let t = TestDb::new().await;
    let mut config = Config::new(&t.url(), Duration::from_secs(30));
    config.storm_producers = 2;
    let two_windows = 2 * i64::from(config.long_window_seconds);
    config.gateways = vec![
        GatewaySpec::traps("g0-traps", 20_000),
        GatewaySpec::tiny_cache("g1-tiny", 1, 8).clock(ClockSkew::jumping(&[two_windows, -two_windows])),
        GatewaySpec::plain("g2").clock(ClockSkew::jumping(&[-two_windows, two_windows])),
    ];
    config.faults = Faults {
        kill_every: Some(Duration::from_secs(6)),
        kill_downtime: Duration::from_millis(700),
        short_window: Some(ShortWindow { seconds: 2, from: 0.3, to: 0.55 }),
        overload: Some(OverloadFault::new(Spell::new(18.0, 8.0))),
        ..Faults::default()
    };
    let report = checker::run(&config).await.expect("the checker runs");
    println!("{report}");
    assert!(report.violations.is_empty(), "violations:\n{report}");
    assert!(report.unexpected_exits.is_empty(), "a gateway exited by itself:\n{report}");
    assert!(report.fault_errors.is_empty(), "a fault could not be injected:\n{report}");
    // The faults really happened and the workload really ran.
    assert!(report.kills >= 3 && report.restarts >= report.kills, "{report}");
    assert!(report.guest_traps > 0, "no guest trap was injected:\n{report}");
    assert!(report.max_evictions + report.max_suppressed > 0, "the tiny budget never evicted nor suppressed:\n{report}");
    assert_eq!(report.window_changes.len(), 2, "{report}");
    assert_eq!(report.clock_jumps, 2, "{report}");
    assert!(report.max_clock_offset_s > config.long_window_seconds as f64, "no gateway measured its clock off:\n{report}");
    assert!(report.queued >= 2_000 && report.duplicate >= 200, "too little traffic:\n{report}");
    assert!(report.retries > 0, "{report}");
    assert!(report.probes.get("committed").is_some_and(|&n| n > 0), "no replay was judged unlocked:\n{report}");
    // The flood was shed and served, and every shed push it sent again was
    // answered with all its items new: nothing of a shed push was written.
    let overload = report.overload.as_ref().expect("the overload ran");
    assert_eq!(overload.findings, 0, "the flood met answers other than 201 and 503:\n{report}");
    assert!(overload.flood_shed > 0 && overload.flood_created > 0, "the gateways did not shed the flood:\n{report}");
    assert!(overload.flood_created_after_shed > 0, "no shed push was answered 201 when sent again:\n{report}");
    assert!(overload.producers_answered > 0, "the producers stopped under the flood:\n{report}");
}
