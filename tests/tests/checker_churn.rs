//! The checker, churning: ids spread over 100,000 partitions by a hot group
//! that keeps moving on, through one gateway whose small cache budget must
//! evict idle partitions and suppress the ones that come back when it is
//! full of recently used ones. No fault is injected; every answer is still
//! checked against PostgreSQL, so an eviction or a suppression that changed a
//! verdict is a violation. The long form (a 64 MiB budget for minutes) is
//! in bench/checker/RESULTS.md.

use std::time::Duration;

use stile_tests::checker::{self, Config, GatewaySpec};
use stile_tests::pg::TestDb;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_partitions_through_a_small_budget_change_no_verdict() {
    let t = TestDb::new().await;
    let mut config = Config::new(&t.url(), Duration::from_secs(20));
    const BUDGET_MIB: u64 = 2;
    config.gateways = vec![GatewaySpec::plain("g0").flag("cache-mb", BUDGET_MIB).flag("shards", 2)];
    config.partitions = 100_000;
    config.hot_partitions = 400;
    config.hot_phase = Duration::from_secs(1);
    config.producers = 8;
    config.rate = 0.0;
    let report = checker::run(&config).await.expect("the checker runs");
    println!("{report}");
    assert!(report.violations.is_empty(), "violations:\n{report}");
    assert!(report.unexpected_exits.is_empty(), "the gateway exited by itself:\n{report}");
    assert!(report.stored_partitions >= 2_000, "too few partitions touched:\n{report}");
    assert!(report.max_evictions > 0, "the budget never evicted:\n{report}");
    assert!(report.max_suppressed > 0, "the budget never suppressed:\n{report}");
    // What the cache holds past the budget is the partitions used in the
    // last five seconds, which are never evicted; the figures are printed
    // above and, for the long form, recorded beside its results.
    let samples = report.samples.concat();
    assert!(samples.len() >= 10, "the gateway was scraped {} times:\n{report}", samples.len());
    assert!(samples.iter().all(|s| s.resident > 0), "no resident memory figure:\n{report}");
}
