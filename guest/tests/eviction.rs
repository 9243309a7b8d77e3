//! The budget's recent-use guard under churn: a partition used in the last
//! five seconds is never evicted, neither to admit another nor to get back
//! under the budget, however many partitions come and go. A reference of
//! each partition's last use (the calls that mark it used: a plan or a
//! commit while it is resident, a hydration that installs it) is held
//! against the shard after every call.

use std::collections::BTreeMap;

use proptest::prelude::*;
use stile_guest::{
    Admission, Commit, DedupCache, Hydration, Millis, PartitionId, RECENT_USE_MS, Segment, Shard, ShardConfig, TxnsRow,
};

const WINDOW_MS: u64 = 60_000;
const PARTITIONS: PartitionId = 24;

#[derive(Clone, Debug)]
enum Op {
    /// Time passes.
    Advance(Millis),
    /// A flush of `count` new messages to a partition: plan, push, record; a
    /// partition without an entry asks the gate and, if admitted, hydrates.
    Push { partition: PartitionId, count: usize },
    /// The host's periodic expiry.
    Expire,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0..3_000i64).prop_map(Op::Advance),
        6 => (0..PARTITIONS, 1..40usize).prop_map(|(partition, count)| Op::Push { partition, count }),
        1 => Just(Op::Expire),
    ]
}

/// What PostgreSQL holds for one partition: one txns row per commit.
#[derive(Default)]
struct Stored {
    rows: Vec<(i64, i64, Millis, Vec<u8>)>,
    last_offset: i64,
}

struct Run {
    shard: Shard,
    stored: BTreeMap<PartitionId, Stored>,
    last_used: BTreeMap<PartitionId, Millis>,
    now: Millis,
    next_hash: u64,
}

impl Run {
    fn new(budget_bytes: u64) -> Run {
        let config = ShardConfig { budget_bytes, skew_slack_ms: ShardConfig::DEFAULT_SKEW_SLACK_MS };
        Run { shard: Shard::new(config), stored: BTreeMap::new(), last_used: BTreeMap::new(), now: 0, next_hash: 1 }
    }

    fn hashes(&mut self, count: usize) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(count * 16);
        for _ in 0..count {
            let hash = u128::from(self.next_hash).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835);
            self.next_hash += 1;
            bytes.extend_from_slice(&hash.to_be_bytes());
        }
        bytes
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Advance(ms) => self.now += ms,
            Op::Expire => self.shard.expire(self.now),
            Op::Push { partition, count } => self.push(partition, count),
        }
    }

    fn push(&mut self, partition: PartitionId, count: usize) {
        let hashes = self.hashes(count);
        if !self.shard.is_resident(partition) {
            let held: u64 = self.stored.get(&partition).map_or(0, |s| s.rows.iter().map(|r| r.3.len() as u64 / 16).sum());
            if self.shard.admit(self.now, partition, WINDOW_MS, held) == Admission::Hydrate {
                let stored = self.stored.entry(partition).or_default();
                let rows: Vec<TxnsRow<'_>> = stored
                    .rows
                    .iter()
                    .map(|(base_offset, end_offset, created_ms, hashes)| TxnsRow {
                        base_offset: *base_offset,
                        end_offset: *end_offset,
                        created_ms: *created_ms,
                        hashes,
                    })
                    .collect();
                let hydration = Hydration { partition, window_ms: WINDOW_MS, last_offset: stored.last_offset, rows: &rows };
                if self.shard.hydrate(self.now, &hydration).is_ok() {
                    self.last_used.insert(partition, self.now);
                }
            }
        }
        let was_resident = self.shard.is_resident(partition);
        let plan = self.shard.plan(self.now, &[Segment { partition, window_ms: WINDOW_MS, hashes: &hashes }]);
        assert_eq!(plan.len(), 1);
        if was_resident {
            self.last_used.insert(partition, self.now);
        }
        // The push function writes every new hash (these are all new).
        let stored = self.stored.entry(partition).or_default();
        let base_offset = stored.last_offset + 1;
        stored.last_offset += count as i64;
        stored.rows.push((base_offset, stored.last_offset, self.now, hashes.clone()));
        let resident = self.shard.is_resident(partition);
        self.shard.record_commits(self.now, &[Commit { partition, base_offset, created_ms: self.now, hashes: &hashes }]);
        if resident {
            self.last_used.insert(partition, self.now);
        }
    }

    /// Partitions resident now and used within the guard's span.
    fn recently_used_residents(&self) -> Vec<PartitionId> {
        self.last_used
            .iter()
            .filter(|&(&partition, &used)| self.now - used < RECENT_USE_MS && self.shard.is_resident(partition))
            .map(|(&partition, _)| partition)
            .collect()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn a_partition_used_in_the_last_five_seconds_is_never_evicted(
        ops in proptest::collection::vec(op(), 1..400),
        budget_kib in 16u64..96,
    ) {
        let mut run = Run::new(budget_kib * 1024);
        for op in &ops {
            let guarded = run.recently_used_residents();
            run.apply(op);
            for partition in guarded {
                // The call may have been about this very partition: a
                // resident entry refused a rebuild is dropped by design.
                let subject = matches!(op, Op::Push { partition: p, .. } if *p == partition);
                prop_assert!(
                    subject || run.shard.is_resident(partition),
                    "partition {partition}, last used at {} ms, was evicted at {} ms by {op:?}",
                    run.last_used[&partition],
                    run.now
                );
            }
        }
    }
}

/// The property above is not vacuous: the same churn does evict (idle
/// partitions) and suppress (partitions that come back to a full cache).
#[test]
fn the_churn_evicts_and_suppresses() {
    let mut run = Run::new(32 * 1024);
    let mut suppressed = 0;
    for step in 0..4_000u64 {
        let partition = (step * 7 % PARTITIONS as u64) as PartitionId;
        run.apply(&Op::Push { partition, count: 1 + (step % 30) as usize });
        run.apply(&Op::Advance(300));
        suppressed = suppressed.max(run.shard.stats().suppressed);
    }
    let stats = run.shard.stats();
    assert!(stats.evictions > 0, "{stats:?}");
    assert!(suppressed > 0, "{stats:?}");
}
