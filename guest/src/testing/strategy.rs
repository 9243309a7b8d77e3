//! Random scenarios: a shard configuration, the host's wall clock against
//! PostgreSQL's, a hash space, the partitions' windows, and a sequence of
//! operations a host and the database might perform, clock steps among them.

use std::vec::Vec;

use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;

use crate::api::{PartitionId, ShardConfig};

/// The partitions a scenario uses, by index. Extreme ids included: the cache
/// must not care what an id looks like.
pub const PARTITIONS: [PartitionId; 4] = [1, 2, 7_000_000_007, PartitionId::MAX];

/// One generated run.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub config: ShardConfig,
    /// The host's wall clock minus PostgreSQL's at the start: anything, from
    /// a few milliseconds to hours either way.
    pub wall_skew_ms: i64,
    /// Hash ids are reduced modulo this; small spaces make repeats frequent.
    pub hash_space: u64,
    /// Whether ids are mixed into uniformly random hashes (as xxh3 output
    /// is) or used raw, which piles every hash into the first filter lines.
    pub mix_hashes: bool,
    /// Each partition's window at the start.
    pub windows_ms: [u64; PARTITIONS.len()],
    pub ops: Vec<Op>,
}

/// One step of a scenario. Partitions are indexes into [`PARTITIONS`].
#[derive(Clone, Debug)]
pub enum Op {
    /// Time passes: the monotonic clock, and with it PostgreSQL's and the
    /// host's wall clock, move forward.
    Tick {
        ms: u32,
    },
    /// PostgreSQL's clock steps (a time-sync correction on the database's
    /// machine), forwards or backwards.
    StepDatabaseClock {
        ms: i64,
    },
    /// The host's wall clock steps, forwards or backwards.
    StepWallClock {
        ms: i64,
    },
    /// One flush: plan the segments, let the model database commit what the
    /// push function would write, and report the commits.
    Push {
        segments: Vec<PushSegment>,
    },
    /// Another gateway commits to the partition; this cache is not told.
    Foreign {
        partition: usize,
        ids: Vec<u64>,
    },
    /// The partition's last commit is reported (again).
    Replay {
        partition: usize,
    },
    /// A full-window read is taken now, for a later stale hydration.
    Snapshot {
        partition: usize,
    },
    /// The host's rebuild: ask the gate, and if admitted, hydrate from a
    /// fresh read or from the saved (stale) snapshot. A read covers the
    /// window plus the skew slack, as the contract asks, plus
    /// `extra_slack_ms` (older rows only widen coverage).
    Rebuild {
        partition: usize,
        stale: bool,
        estimate: Estimate,
        extra_slack_ms: u32,
        shuffle: u64,
    },
    /// `/configure` changes the partition's window.
    SetWindow {
        partition: usize,
        window_ms: u64,
    },
    Expire,
    Forget {
        partition: usize,
    },
    /// A host sends a torn hash list.
    Malformed {
        partition: usize,
        input: MalformedInput,
    },
}

/// One segment of a flush.
#[derive(Clone, Debug)]
pub struct PushSegment {
    pub partition: usize,
    /// Ids of the scenario's hash space.
    pub ids: Vec<u64>,
    /// A run of consecutive ids `(start, length)`, for segments large enough
    /// to seal blocks and spill generations.
    pub range: Option<(u64, u16)>,
    /// Hashes never used before, appended after the ids.
    pub fresh: u16,
    /// Whether the commit reaches the cache (a lost report leaves a gap).
    pub reported: bool,
}

/// The host's estimate of a window, for admission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Estimate {
    Zero,
    /// The model's count of in-window hashes.
    Model,
    Huge,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MalformedInput {
    Segment,
    Commit,
    Hydration,
}

/// Scenarios for [`run`](super::run).
pub fn scenario() -> impl Strategy<Value = Scenario> {
    let config = (budget(), prop_oneof![Just(0u32), Just(1_000), Just(5_000)])
        .prop_map(|(budget_bytes, skew_slack_ms)| ShardConfig { budget_bytes, skew_slack_ms });
    (
        config,
        prop_oneof![2 => -1_000i64..=1_000, 1 => -10_000_000i64..=10_000_000],
        prop_oneof![Just(8u64), Just(64), Just(4_096), Just(1 << 40)],
        prop::bool::weighted(0.8),
        [window(), window(), window(), window()],
        vec(op(), 1..80),
    )
        .prop_map(|(config, wall_skew_ms, hash_space, mix_hashes, windows_ms, ops)| Scenario {
            wall_skew_ms,
            config,
            hash_space,
            mix_hashes,
            windows_ms,
            ops,
        })
}

/// Tiny budgets (a few entries at most), a small one, and a roomy one.
fn budget() -> impl Strategy<Value = u64> {
    prop_oneof![2 => 20_000u64..300_000, 1 => Just(2_000_000), 3 => Just(1 << 40)]
}

fn window() -> impl Strategy<Value = u64> {
    prop_oneof![1 => Just(0u64), 2 => Just(1_000), 2 => Just(10_000), 4 => Just(60_000)]
}

fn partition() -> impl Strategy<Value = usize> {
    prop_oneof![3 => Just(0usize), 2 => Just(1), 1 => Just(2), 1 => Just(3)]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => prop_oneof![
            4 => prop_oneof![3 => 0u32..2_000, 2 => 0u32..20_000, 1 => 20_000u32..80_000].prop_map(|ms| Op::Tick { ms }),
            1 => clock_step().prop_map(|ms| Op::StepDatabaseClock { ms }),
            1 => clock_step().prop_map(|ms| Op::StepWallClock { ms }),
        ],
        8 => vec(push_segment(), 1..=3).prop_map(|segments| Op::Push { segments }),
        1 => (partition(), vec(any::<u64>(), 1..6)).prop_map(|(partition, ids)| Op::Foreign { partition, ids }),
        1 => partition().prop_map(|partition| Op::Replay { partition }),
        1 => partition().prop_map(|partition| Op::Snapshot { partition }),
        4 => (
            partition(),
            prop::bool::weighted(0.3),
            prop_oneof![Just(Estimate::Zero), Just(Estimate::Model), Just(Estimate::Huge)],
            prop_oneof![Just(0u32), Just(5_000), Just(20_000)],
            any::<u64>(),
        )
            .prop_map(|(partition, stale, estimate, extra_slack_ms, shuffle)| Op::Rebuild {
                partition,
                stale,
                estimate,
                extra_slack_ms,
                shuffle
            }),
        1 => (partition(), window()).prop_map(|(partition, window_ms)| Op::SetWindow { partition, window_ms }),
        1 => Just(Op::Expire),
        1 => partition().prop_map(|partition| Op::Forget { partition }),
        1 => (partition(), prop_oneof![Just(MalformedInput::Segment), Just(MalformedInput::Commit), Just(MalformedInput::Hydration)])
            .prop_map(|(partition, input)| Op::Malformed { partition, input }),
    ]
}

/// Steps within the skew slack, past it, and past the longest window, either
/// way.
fn clock_step() -> impl Strategy<Value = i64> {
    prop_oneof![-6_000i64..=6_000, -200_000i64..=200_000]
}

fn push_segment() -> impl Strategy<Value = PushSegment> {
    (
        partition(),
        vec(any::<u64>(), 0..10),
        // Starts near zero make ranges overlap, so that whole sealed blocks
        // come back as duplicates.
        option::weighted(0.1, (prop_oneof![any::<u64>(), 0u64..8_192], 1u16..6_000)),
        prop_oneof![4 => Just(0u16), 2 => 1u16..5, 1 => 100u16..5_000],
        prop::bool::weighted(0.9),
    )
        .prop_map(|(partition, ids, range, fresh, reported)| PushSegment { partition, ids, range, fresh, reported })
}
