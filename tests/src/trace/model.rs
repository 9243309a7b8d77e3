//! A trace's types: the calls on one shard with their arguments and expected
//! answers, holding their own hashes where the core's types borrow them.
//!
//! The serde attributes here name every field and call as the file does, in
//! the WIT's kebab-case; [`super::wire`] spells the core's own types.

use serde::{Deserialize, Serialize};
use stile_guest::testing::Observed;
use stile_guest::{Admission, HydrateError, Millis, PartitionId, Plan, ShardConfig, Stats};

use super::wire;

/// The owned forms a trace holds its calls' arguments in.
pub use stile_guest::{OwnedCommit, OwnedHydration, OwnedRow, OwnedSegment};

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
