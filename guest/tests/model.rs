//! The shard against the model database, over random operation sequences:
//! plans, commits with correct, gapped and overlapping bases, fresh and stale
//! hydrations, expiry as time moves, clock offsets and steps of the host's and
//! of PostgreSQL's clocks, window changes, tiny budgets and small hash spaces. The same driver runs against the component in `stile-tests`.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use stile_guest::testing::{self, Scenario};
use stile_guest::*;

fn check(scenario: &Scenario) -> Result<(), TestCaseError> {
    testing::run(scenario, Shard::new).map_err(|violation| TestCaseError::fail(violation.to_string()))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn the_shard_never_vouches_over_a_stored_duplicate(scenario in testing::scenario()) {
        check(&scenario)?;
    }
}

/// What the scenarios made a shard do.
#[derive(Debug, Default)]
struct Tally {
    states: BTreeMap<String, u64>,
    vouched_past_zero: u64,
    suppressed_admissions: u64,
    large_commits: u64,
    /// Caches made beyond each scenario's first: the host replaced its cache
    /// after reading that PostgreSQL's clock stepped back.
    caches_replaced: u64,
    /// The shard's counters as last read.
    stats: Stats,
}

/// A shard that keeps a tally, so that the property above is known to reach
/// every state it claims to cover.
struct Tallied {
    shard: Shard,
    tally: Rc<RefCell<Tally>>,
}

impl testing::Forwarding for Tallied {
    fn inner(&mut self) -> &mut dyn DedupCache {
        &mut self.shard
    }

    fn plan(&mut self, now_ms: Millis, segments: &[Segment<'_>]) -> Vec<Plan> {
        let plans = self.shard.plan(now_ms, segments);
        let mut tally = self.tally.borrow_mut();
        for plan in &plans {
            *tally.states.entry(format!("{:?}", plan.state)).or_default() += 1;
            tally.vouched_past_zero += u64::from(plan.p_verified > 0);
        }
        plans
    }
    fn record_commits(&mut self, now_ms: Millis, commits: &[Commit<'_>]) {
        self.tally.borrow_mut().large_commits += commits.iter().filter(|c| c.hashes.len() > 16 * 4_096).count() as u64;
        self.shard.record_commits(now_ms, commits);
    }
    fn admit(&mut self, now_ms: Millis, partition: PartitionId, window_ms: u64, estimate_hashes: u64) -> Admission {
        let admission = self.shard.admit(now_ms, partition, window_ms, estimate_hashes);
        self.tally.borrow_mut().suppressed_admissions += u64::from(admission == Admission::Suppressed);
        admission
    }
    fn stats(&mut self) -> Stats {
        let stats = self.shard.stats();
        self.tally.borrow_mut().stats = stats;
        stats
    }
}

#[test]
fn the_scenarios_reach_every_state() {
    let mut runner = TestRunner::deterministic();
    let strategy = testing::scenario();
    let mut totals = Tally::default();
    for _ in 0..300 {
        let scenario = strategy.new_tree(&mut runner).expect("a scenario").current();
        let tally = Rc::new(RefCell::new(Tally::default()));
        let mut made = 0;
        testing::run(&scenario, |config| {
            made += 1;
            Tallied { shard: Shard::new(config), tally: Rc::clone(&tally) }
        })
        .unwrap_or_else(|violation| panic!("{violation}"));
        let tally = tally.take();
        totals.caches_replaced += made - 1;
        for (state, count) in tally.states {
            *totals.states.entry(state).or_default() += count;
        }
        totals.vouched_past_zero += tally.vouched_past_zero;
        totals.suppressed_admissions += tally.suppressed_admissions;
        totals.large_commits += tally.large_commits;
        totals.stats.local_hits += tally.stats.local_hits;
        totals.stats.evictions += tally.stats.evictions;
        totals.stats.expired_generations += tally.stats.expired_generations;
        totals.stats.bloom_maybes += tally.stats.bloom_maybes;
    }
    println!("{totals:#?}");
    for state in ["Vouching", "Cold", "Gap", "Rebuild", "Suppressed"] {
        assert!(totals.states.get(state).copied().unwrap_or(0) > 0, "no plan in state {state}");
    }
    assert!(totals.vouched_past_zero > 0 && totals.suppressed_admissions > 0 && totals.large_commits > 0);
    assert!(totals.caches_replaced > 0, "no step back of PostgreSQL's clock was ever read");
    let stats = totals.stats;
    assert!(stats.local_hits > 0 && stats.evictions > 0 && stats.expired_generations > 0 && stats.bloom_maybes > 0);
}
