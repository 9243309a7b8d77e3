//! How close to its original a retry is floored: the narrowed probe reads
//! every stored offset between `p_verified` and the original, so a floor far
//! below costs PostgreSQL a scan of the rows in between.
//!
//! One partition is hydrated with rows of 156 hashes (a window written in
//! large requests), then takes commits of 100 hashes; after each commit, the
//! last [`RETRIED`] commits are planned again, as retries. Their 6,000 hashes
//! lie in the hot buffer and the newest 8 sealed blocks, whose floors are
//! within one arrival step (at most 128 offsets) of every hash, whichever
//! place its block sorts it to.
//!
//! Takes any [`DedupCache`] made with [`super::window::CONFIG`] and panics on
//! failure.

use std::vec::Vec;

use super::window::hash_of;
use crate::DedupCache;
use crate::api::*;
use crate::hash::{Hash, encode};

/// Commits retried after each commit.
pub const RETRIED: usize = 60;

/// The furthest a retry of a recent commit may be floored below its base:
/// one arrival step of a run of 8 blocks, less one.
pub const MAX_BELOW: Offset = 127;

const WINDOW_MS: u64 = 3_600_000;
const PARTITION: PartitionId = 7;
const HYDRATED_ROWS: usize = 100;
const ROW: usize = 156;
const COMMIT: usize = 100;

/// Runs `commits` commits and their retries; answers the furthest any retry
/// was floored below its original's base offset.
pub fn retries_floor_within_an_arrival_step<C: DedupCache>(cache: &mut C, commits: usize) -> Offset {
    let now_ms = 1_000_000;
    let mut next_id = 0u64;
    let mut fresh = |count: usize| -> Vec<u8> {
        let hashes: Vec<Hash> = (next_id..next_id + count as u64).map(hash_of).collect();
        next_id += count as u64;
        encode(&hashes)
    };
    let rows: Vec<(Offset, Vec<u8>)> = (0..HYDRATED_ROWS).map(|i| ((i * ROW) as Offset, fresh(ROW))).collect();
    let txns: Vec<TxnsRow<'_>> = rows
        .iter()
        .map(|(base, hashes)| TxnsRow { base_offset: *base, end_offset: base + ROW as Offset - 1, created_ms: now_ms, hashes })
        .collect();
    let mut last_offset = (HYDRATED_ROWS * ROW) as Offset - 1;
    assert_eq!(cache.admit(now_ms, PARTITION, WINDOW_MS, (HYDRATED_ROWS * ROW) as u64), Admission::Hydrate);
    let hydration = Hydration { partition: PARTITION, window_ms: WINDOW_MS, last_offset, rows: &txns };
    cache.hydrate(now_ms, &hydration).expect("a roomy budget admits the window");
    let mut committed: Vec<(Offset, Vec<u8>)> = Vec::with_capacity(commits);
    let mut furthest = 0;
    for _ in 0..commits {
        let hashes = fresh(COMMIT);
        let [first] = plan_one(cache, now_ms, &hashes);
        assert!(first.local_hits.is_empty() && first.p_verified == last_offset, "fresh hashes not vouched for: {first:?}");
        let base_offset = last_offset + 1;
        cache.record_commits(now_ms, &[Commit { partition: PARTITION, base_offset, created_ms: now_ms, hashes: &hashes }]);
        last_offset += COMMIT as Offset;
        committed.push((base_offset, hashes));
        for (base, hashes) in committed.iter().rev().take(RETRIED) {
            let [retry] = plan_one(cache, now_ms, hashes);
            assert_eq!(retry.local_hits.len(), COMMIT, "a retry's every hash is a local hit");
            let below = base - 1 - retry.p_verified;
            assert!((0..=MAX_BELOW).contains(&below), "the retry of {base} floored {below} offsets below it");
            furthest = furthest.max(below);
        }
    }
    furthest
}

fn plan_one<C: DedupCache>(cache: &mut C, now_ms: Millis, hashes: &[u8]) -> [Plan; 1] {
    let plans = cache.plan(now_ms, &[Segment { partition: PARTITION, window_ms: WINDOW_MS, hashes }]);
    plans.try_into().expect("one plan per segment")
}
