//! How the core's values are spelled in the trace file: records and enums
//! under the WIT's kebab-case names, `hydrate`'s result as the WIT's
//! `result`, and hashes as hex strings.
//!
//! The core's types are `stile_guest`'s, which knows nothing of serde, so each
//! is described here as serde's remote definition: the derive reads and
//! builds the core's type itself, and the compiler checks every field and
//! case against it.

use serde::{Deserialize, Serialize};
use stile_guest::{Admission, EntryState, HydrateError, Offset, Plan, ShardConfig, Stats};

/// A `shard-config`.
#[derive(Serialize, Deserialize)]
#[serde(remote = "ShardConfig", rename_all = "kebab-case")]
pub(super) struct ShardConfigDef {
    budget_bytes: u64,
    skew_slack_ms: u32,
}

/// An `entry-state`.
#[derive(Serialize, Deserialize)]
#[serde(remote = "EntryState", rename_all = "kebab-case")]
enum EntryStateDef {
    Vouching,
    Cold,
    Gap,
    Rebuild,
    Suppressed,
}

/// A `plan`.
#[derive(Serialize, Deserialize)]
#[serde(remote = "Plan", rename_all = "kebab-case")]
struct PlanDef {
    p_verified: Offset,
    local_hits: Vec<u32>,
    #[serde(with = "EntryStateDef")]
    state: EntryState,
}

/// An `admission`.
#[derive(Serialize, Deserialize)]
#[serde(remote = "Admission", rename_all = "kebab-case")]
pub(super) enum AdmissionDef {
    Hydrate,
    Suppressed,
}

/// A `hydrate-error`. `Lost` is the gateway's wrapper's own answer, which the
/// WIT has no case for and the native core never gives, so a trace neither
/// writes nor reads it.
#[derive(Serialize, Deserialize)]
#[serde(remote = "HydrateError", rename_all = "kebab-case")]
enum HydrateErrorDef {
    Malformed,
    WindowOff,
    #[serde(skip)]
    Lost,
}

/// `hydrate`'s answer, `result<_, hydrate-error>`: `{"ok": null}` or
/// `{"err": "malformed"}`.
#[derive(Serialize, Deserialize)]
#[serde(remote = "Result<(), HydrateError>", rename_all = "kebab-case")]
pub(super) enum HydrateResultDef {
    Ok(()),
    Err(#[serde(with = "HydrateErrorDef")] HydrateError),
}

/// A `stats` record.
#[derive(Serialize, Deserialize)]
#[serde(remote = "Stats", rename_all = "kebab-case")]
pub(super) struct StatsDef {
    entries: u64,
    vouching: u64,
    bytes: u64,
    hashes: u64,
    generations: u64,
    suppressed: u64,
    segments_planned: u64,
    segments_vouched: u64,
    hashes_checked: u64,
    bloom_maybes: u64,
    local_hits: u64,
    hydrations: u64,
    evictions: u64,
    expired_generations: u64,
}

/// `plan`'s answer, a list of [`Plan`]s (serde's remote definitions spell
/// one value, not a list of them).
pub(super) mod plans {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use stile_guest::Plan;

    use super::PlanDef;

    pub fn serialize<S: Serializer>(plans: &[Plan], serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Spelled<'a>(#[serde(with = "PlanDef")] &'a Plan);
        serializer.collect_seq(plans.iter().map(Spelled))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<Plan>, D::Error> {
        #[derive(Deserialize)]
        struct Spelled(#[serde(with = "PlanDef")] Plan);
        let plans = Vec::<Spelled>::deserialize(deserializer)?;
        Ok(plans.into_iter().map(|Spelled(plan)| plan).collect())
    }
}
