//! The cache's contract as a Rust trait: one method per export of the `shard`
//! resource in `wit/dedup.wit`, in the core's types.
//!
//! [`Shard`](crate::Shard) is the cache itself; a host's wrapper around the
//! component implements the same trait, so the gateway holds either behind
//! it and every property, trace and benchmark drives either through it.
//! Construction is left out: a component needs an engine and a store to make
//! one.

use alloc::vec::Vec;

use crate::api::{Admission, Commit, HydrateError, Hydration, Millis, PartitionId, Plan, Segment, Stats};

/// One shard's deduplication cache. Every call that depends on time takes
/// `now_ms`, a lower bound of the database's clock, monotone across the
/// calls (see [`DbClock`](crate::DbClock)).
pub trait DedupCache {
    /// Plans one flush: a `p_verified` per segment, in order. Planning
    /// expires each touched entry first and marks it used.
    fn plan(&mut self, now_ms: Millis, segments: &[Segment<'_>]) -> Vec<Plan>;

    /// Records committed segments in allocation order. Commits to partitions
    /// without an entry are ignored: entries are born only by hydration.
    fn record_commits(&mut self, now_ms: Millis, commits: &[Commit<'_>]);

    /// The admission gate before a hydration.
    fn admit(&mut self, now_ms: Millis, partition: PartitionId, window_ms: u64, estimate_hashes: u64) -> Admission;

    /// Installs a full-window read as the partition's entry, replacing any
    /// old one. A refused hydration leaves the old entry as it was.
    fn hydrate(&mut self, now_ms: Millis, hydration: &Hydration<'_>) -> Result<(), HydrateError>;

    /// Expires every entry and ends finished cooldowns.
    fn expire(&mut self, now_ms: Millis);

    /// Forgets a partition entirely: entry, footprint hint and cooldown.
    fn forget(&mut self, partition: PartitionId);

    /// Counters and gauges. `&mut` because a component host needs its store
    /// mutably even to read.
    fn stats(&mut self) -> Stats;
}
