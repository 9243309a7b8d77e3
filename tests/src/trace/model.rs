//! A trace's types: the calls on one shard with their arguments and expected
//! answers, holding their own hashes where the core's types borrow them.
//!
//! The serde attributes here name every field and call as the file does, in
//! the WIT's kebab-case; [`super::wire`] spells the core's own types.

use serde::{Deserialize, Serialize};
use stile_guest::testing::Observed;
use stile_guest::{
    Admission, Commit, HydrateError, Hydration, Millis, Offset, PartitionId, Plan, Segment, ShardConfig, Stats, TxnsRow,
};

use super::wire;

/// A recorded scenario: the shard's settings and every call in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trace {
    pub config: ShardConfig,
    pub calls: Vec<NotedCall>,
}

/// One call, with an optional note saying what it exercises.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotedCall {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    #[serde(flatten)]
    pub call: Call,
}

/// One call on the shard and, where the call answers, the expected answer.
///
/// In the file a call is one object: its name under `call` first, then its
/// arguments in the order the WIT takes them, then `expect`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "call", rename_all = "kebab-case", rename_all_fields = "kebab-case")]
pub enum Call {
    Plan {
        now_ms: Millis,
        segments: Vec<OwnedSegment>,
        #[serde(with = "wire::plans")]
        expect: Vec<Plan>,
    },
    RecordCommits {
        now_ms: Millis,
        commits: Vec<OwnedCommit>,
    },
    Admit {
        now_ms: Millis,
        partition: PartitionId,
        window_ms: u64,
        estimate_hashes: u64,
        #[serde(with = "wire::AdmissionDef")]
        expect: Admission,
    },
    Hydrate {
        now_ms: Millis,
        hydration: OwnedHydration,
        #[serde(with = "wire::HydrateResultDef")]
        expect: Result<(), HydrateError>,
    },
    Expire {
        now_ms: Millis,
    },
    Forget {
        partition: PartitionId,
    },
    Stats {
        #[serde(with = "wire::StatsDef")]
        expect: Stats,
    },
}

impl Call {
    /// The call a cache answered, holding its own hashes.
    pub fn of(observed: Observed<'_, '_>) -> Call {
        match observed {
            Observed::Plan { now_ms, segments, plans } => {
                Call::Plan { now_ms, segments: segments.iter().map(OwnedSegment::of).collect(), expect: plans.to_vec() }
            }
            Observed::RecordCommits { now_ms, commits } => {
                Call::RecordCommits { now_ms, commits: commits.iter().map(OwnedCommit::of).collect() }
            }
            Observed::Admit { now_ms, partition, window_ms, estimate_hashes, admission } => {
                Call::Admit { now_ms, partition, window_ms, estimate_hashes, expect: admission }
            }
            Observed::Hydrate { now_ms, hydration, result } => {
                Call::Hydrate { now_ms, hydration: OwnedHydration::of(hydration), expect: result }
            }
            Observed::Expire { now_ms } => Call::Expire { now_ms },
            Observed::Forget { partition } => Call::Forget { partition },
            Observed::Stats { stats } => Call::Stats { expect: stats },
        }
    }

    /// The call's name in the file (the WIT's method name).
    pub fn name(&self) -> &'static str {
        match self {
            Call::Plan { .. } => "plan",
            Call::RecordCommits { .. } => "record-commits",
            Call::Admit { .. } => "admit",
            Call::Hydrate { .. } => "hydrate",
            Call::Expire { .. } => "expire",
            Call::Forget { .. } => "forget",
            Call::Stats { .. } => "stats",
        }
    }
}

/// A `segment` that owns its hashes (16 bytes each, concatenated).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct OwnedSegment {
    pub partition: PartitionId,
    pub window_ms: u64,
    #[serde(with = "wire::hashes")]
    pub hashes: Vec<u8>,
}

/// A `commit` that owns its hashes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct OwnedCommit {
    pub partition: PartitionId,
    pub base_offset: Offset,
    pub created_ms: Millis,
    #[serde(with = "wire::hashes")]
    pub hashes: Vec<u8>,
}

/// A `txns-row` that owns its hashes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct OwnedRow {
    pub base_offset: Offset,
    pub end_offset: Offset,
    pub created_ms: Millis,
    #[serde(with = "wire::hashes")]
    pub hashes: Vec<u8>,
}

/// A `hydration` that owns its rows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct OwnedHydration {
    pub partition: PartitionId,
    pub window_ms: u64,
    pub last_offset: Offset,
    pub rows: Vec<OwnedRow>,
}

impl OwnedSegment {
    /// A copy of a borrowed segment.
    pub fn of(segment: &Segment<'_>) -> OwnedSegment {
        OwnedSegment { partition: segment.partition, window_ms: segment.window_ms, hashes: segment.hashes.to_vec() }
    }

    /// The borrowed form the core and every [`stile_guest::DedupCache`] take.
    pub fn borrow(&self) -> Segment<'_> {
        Segment { partition: self.partition, window_ms: self.window_ms, hashes: &self.hashes }
    }
}

impl OwnedCommit {
    /// A copy of a borrowed commit.
    pub fn of(commit: &Commit<'_>) -> OwnedCommit {
        OwnedCommit {
            partition: commit.partition,
            base_offset: commit.base_offset,
            created_ms: commit.created_ms,
            hashes: commit.hashes.to_vec(),
        }
    }

    /// The borrowed form the core and every [`stile_guest::DedupCache`] take.
    pub fn borrow(&self) -> Commit<'_> {
        Commit { partition: self.partition, base_offset: self.base_offset, created_ms: self.created_ms, hashes: &self.hashes }
    }
}

impl OwnedRow {
    /// A copy of a borrowed row.
    pub fn of(row: &TxnsRow<'_>) -> OwnedRow {
        OwnedRow {
            base_offset: row.base_offset,
            end_offset: row.end_offset,
            created_ms: row.created_ms,
            hashes: row.hashes.to_vec(),
        }
    }

    /// The borrowed form a [`Hydration`] holds.
    pub fn borrow(&self) -> TxnsRow<'_> {
        TxnsRow { base_offset: self.base_offset, end_offset: self.end_offset, created_ms: self.created_ms, hashes: &self.hashes }
    }
}

impl OwnedHydration {
    /// A copy of a borrowed hydration and its rows.
    pub fn of(hydration: &Hydration<'_>) -> OwnedHydration {
        OwnedHydration {
            partition: hydration.partition,
            window_ms: hydration.window_ms,
            last_offset: hydration.last_offset,
            rows: hydration.rows.iter().map(OwnedRow::of).collect(),
        }
    }

    /// Calls `f` with the borrowed form the core and every
    /// [`stile_guest::DedupCache`] take, whose rows must live somewhere
    /// while it runs.
    pub fn with<R>(&self, f: impl FnOnce(&Hydration<'_>) -> R) -> R {
        let rows: Vec<TxnsRow<'_>> = self.rows.iter().map(OwnedRow::borrow).collect();
        f(&Hydration { partition: self.partition, window_ms: self.window_ms, last_offset: self.last_offset, rows: &rows })
    }
}
