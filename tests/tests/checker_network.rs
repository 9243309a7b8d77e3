//! The exactness checker with faults between the gateways and PostgreSQL,
//! and in PostgreSQL, one after another in each run, each followed by time
//! to recover before the next:
//!
//! - through a fault proxy of the checker's own (`stile_tests::proxy`):
//!   50 ms of latency each way with 10 ms of jitter, 5 % of chunks lost and
//!   retransmitted, a full partition, and every connection reset right after
//!   its next request reached PostgreSQL;
//! - on a server of the checker's own, on a tmpfs (mounting it takes root):
//!   another client holding every free connection, a lock held on one
//!   partition's row, a table lock, and the disk full.
//!
//! Afterwards every answer is checked against PostgreSQL: nothing stored
//! twice, nothing acknowledged and lost; and after every fault the gateways
//! served again. The long form, with 20 s spells, is in
//! bench/checker/RESULTS.md.

use std::time::Duration;

use stile_tests::checker::{self, Config, DbFaultReport, Faults, GatewaySpec, LatencyFault, LossFault, Report, Spell};
use stile_tests::pg::TestDb;

/// The most a gateway may take to answer a push after a fault ends.
const RECOVERY_BOUND: Duration = Duration::from_secs(10);

fn config(database_url: &str, seconds: u64) -> Config {
    let mut config = Config::new(database_url, Duration::from_secs(seconds));
    config.producers = 4;
    config.gateways = vec![GatewaySpec::plain("g0"), GatewaySpec::traps("g1-traps", 20_000)];
    config
}

/// The run was exact, every fault was injected, and the gateways served
/// again after each one.
fn assert_exact_and_recovered(report: &Report, faults: usize) {
    assert!(report.violations.is_empty(), "violations:\n{report}");
    assert!(report.unexpected_exits.is_empty(), "a gateway exited by itself:\n{report}");
    assert!(report.fault_errors.is_empty(), "a fault could not be injected:\n{report}");
    assert_eq!(report.db_faults.len(), faults, "{report}");
    for fault in &report.db_faults {
        assert!(
            fault.served_again_after.is_some_and(|after| after < RECOVERY_BOUND),
            "the gateways did not serve again within {RECOVERY_BOUND:?} of the end of {}:\n{report}",
            fault.fault
        );
    }
    assert!(report.queued >= 1_000, "too little traffic:\n{report}");
    assert_eq!(report.requests_given_up, 0, "{report}");
}

fn fault<'a>(report: &'a Report, name: &str) -> &'a DbFaultReport {
    report.db_faults.iter().find(|f| f.fault.contains(name)).unwrap_or_else(|| panic!("no {name} fault:\n{report}"))
}

fn failed(fault: &DbFaultReport, how: &str) -> u64 {
    fault.failed.get(how).copied().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_through_latency_loss_a_partition_and_resets_between_gateways_and_postgres() {
    let t = TestDb::new().await;
    // A fault's recovery is the first answer after its end, whatever
    // follows: when the next fault begins before any answer, the wait runs
    // on through it. So the gap after the loss outlasts an attempt's timeout
    // (5 s) beside a chunk lost three times in a row (1.4 s late). With 2 s,
    // one run read the loss as recovered 10.02 s after its end, the moment
    // the partition ended: producers still waiting on stalled attempts when
    // the partition began would read so.
    let mut config = config(&t.url(), 44);
    config.faults = Faults {
        latency: Some(LatencyFault {
            spell: Spell::new(3.0, 6.0),
            delay: Duration::from_millis(50),
            jitter: Duration::from_millis(10),
        }),
        packet_loss: Some(LossFault { spell: Spell::new(12.0, 6.0), percent: 5.0 }),
        network_partition: Some(Spell::new(25.0, 8.0)),
        resets_at: vec![Duration::from_secs(36), Duration::from_secs(39)],
        ..Faults::default()
    };
    let report = checker::run(&config).await.expect("the checker runs");
    println!("{report}");
    assert_exact_and_recovered(&report, 5);
    // Latency and loss slow the gateways down without stopping them.
    assert!(fault(&report, "latency").answered_during >= 30, "{report}");
    assert!(fault(&report, "loss").answered_during >= 30, "{report}");
    // Nothing crosses a partition: pushes wait and time out, or are refused.
    let partition = fault(&report, "partition");
    assert!(partition.answered_during <= 10, "pushes were answered through a partition:\n{report}");
    assert!(failed(partition, "timeout") + failed(partition, "503") > 0, "{report}");
    assert_eq!(failed(partition, "500"), 0, "a 500 where a 503 is due:\n{report}");
    let proxy = report.proxy.expect("the proxy's counts");
    assert!(proxy.chunks_lost > 0 && proxy.resets > 0, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_when_postgres_is_out_of_connections_a_row_or_table_is_locked_and_its_disk_is_full() {
    let mut config = config("", 40);
    config.probe_rate = 20.0;
    // A push waits at most `--lock-timeout` for a row lock: until a shard
    // has seen the row held once, its shard-mates wait with it, so a lock
    // timeout well inside the probes' patience lets them answer in time.
    for gateway in &mut config.gateways {
        gateway.args.extend(["--lock-timeout".to_owned(), "0.25".to_owned()]);
    }
    config.faults = Faults {
        connections_taken: Some(Spell::new(3.0, 5.0)),
        row_lock: Some(Spell::new(11.0, 8.0)),
        table_lock: Some(Spell::new(22.0, 4.0)),
        disk_full: Some(Spell::new(29.0, 5.0)),
        ..Faults::default()
    };
    let report = checker::run(&config).await.expect("the checker runs");
    println!("{report}");
    assert_exact_and_recovered(&report, 4);
    // Without a connection, and with a full disk, pushes are refused with a
    // 503 and retried; never a 500.
    for name in ["out of connections", "disk full"] {
        let fault = fault(&report, name);
        assert!(failed(fault, "503") > 0, "no push was refused during {}:\n{report}", fault.fault);
        assert_eq!(failed(fault, "500"), 0, "a 500 where a 503 is due:\n{report}");
    }
    // Out of connections, the gateways could not serve at all.
    assert!(fault(&report, "out of connections").answered_during <= 10, "{report}");
    // The locked partition was refused (503) while its row was held, and
    // served again once it was released; every other partition kept
    // flowing meanwhile, its shard-mates too: a push waits for a row lock
    // at most `--lock-timeout`, then the locked partition goes on its own.
    let row_lock = fault(&report, "row lock");
    assert_eq!(failed(row_lock, "500"), 0, "a 500 where a 503 is due:\n{report}");
    let flow = row_lock.flow.as_ref().expect("the row lock's figures");
    assert!(flow.locked_served_again_after.is_some_and(|after| after < RECOVERY_BOUND), "{report}");
    let probes = flow.probes.expect("probes");
    for (whose, count) in [("its shard-mates", probes.same_shard), ("the other shards", probes.other_shards)] {
        assert!(count.sent >= 20, "too few probes to {whose}:\n{report}");
        assert!(count.answered * 10 >= count.sent * 9, "{whose} did not keep flowing through the lock:\n{report}");
    }
}
