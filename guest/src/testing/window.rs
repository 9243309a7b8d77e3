//! The event-window seed's two tests (`window_semantics` and
//! `memory_bounded_by_rate_times_window`), restated for the cache.
//!
//! An event stream runs through one partition the way the gateway runs it:
//! the partition is hydrated empty, and an event is a first sighting when
//! its plan vouches with no local hit, after which it is committed; it is a
//! duplicate when the plan reports it as a local hit. Time is in
//! milliseconds and the window is 60 s with the gateway's 5 s of skew slack,
//! so a hash is remembered for at least the window plus the slack (the safe
//! side) and at most that plus the span of its generation.
//!
//! Both take any [`DedupCache`] made with [`CONFIG`] and panic on failure.

use std::vec::Vec;

use crate::DedupCache;
use crate::api::*;
use crate::hash::{Hash, encode};
use crate::ring::capacity_for;

/// The configuration both checks expect: a roomy budget, the gateway's slack.
pub const CONFIG: ShardConfig = ShardConfig { budget_bytes: 1 << 34, skew_slack_ms: 5_000 };

const WINDOW_MS: u64 = 60_000;
const PARTITION: PartitionId = 1;

/// The seed's `window_semantics`: duplicates inside the window are local
/// hits, reordered duplicates too, and once the window plus the slack has
/// passed a hash is new again.
pub fn window_semantics<C: DedupCache>(cache: &mut C) {
    let mut events = Events::start(cache, 0);
    assert!(events.first_seen(7, 0));
    assert!(!events.first_seen(7, 30_000), "a duplicate inside the window");
    assert!(!events.first_seen(7, 59_000));
    // The slack keeps a hash longer than the window, never shorter.
    assert!(!events.first_seen(7, 65_000), "still held at exactly window + slack");
    assert!(events.first_seen(7, 65_001), "its generation expired: accepted again");
    for id in [5, 3, 4] {
        assert!(events.first_seen(id, 66_000));
    }
    for id in [3, 5, 4] {
        assert!(!events.first_seen(id, 67_000), "reordered duplicates are caught");
    }
}

/// What [`memory_bounded_by_rate_times_window`] saw.
#[derive(Clone, Copy, Debug)]
pub struct MemoryReport {
    /// The most hashes held at once.
    pub max_held: u64,
    /// The bound it was checked against.
    pub bound: u64,
    /// The most generations live at once.
    pub max_generations: u64,
}

/// The seed's `memory_bounded_by_rate_times_window`: 1,000 distinct events a
/// second for 600 s, all accepted, while the hashes held never exceed the rate
/// times (window + slack + one second of arrivals) plus one generation.
pub fn memory_bounded_by_rate_times_window<C: DedupCache>(cache: &mut C) -> MemoryReport {
    const RATE: u64 = 1_000;
    const SECONDS: u64 = 600;
    let horizon_ms = WINDOW_MS + u64::from(CONFIG.skew_slack_ms) + 1_000;
    let in_horizon = RATE * horizon_ms / 1_000;
    let bound = in_horizon + capacity_for(in_horizon as usize) as u64;
    let mut events = Events::start(cache, 0);
    let mut report = MemoryReport { max_held: 0, bound, max_generations: 0 };
    for second in 0..SECONDS {
        let ids: Vec<u64> = (second * RATE..(second + 1) * RATE).collect();
        let now_ms = (second * 1_000) as Millis;
        let duplicates = events.duplicates(&ids, now_ms);
        assert!(duplicates.is_empty(), "distinct events reported as duplicates at {second} s: {duplicates:?}");
        let stats = events.cache.stats();
        report.max_held = report.max_held.max(stats.hashes);
        report.max_generations = report.max_generations.max(stats.generations);
        assert!(stats.hashes <= bound, "{} hashes held at {second} s, bound {bound}", stats.hashes);
    }
    // The window is full by now; it must hold at least the window's worth.
    assert!(report.max_held >= RATE * WINDOW_MS / 1_000);
    report
}

/// One partition's event stream through a cache.
struct Events<'c, C> {
    cache: &'c mut C,
    last_offset: Offset,
}

impl<'c, C: DedupCache> Events<'c, C> {
    /// Hydrates the partition empty, as the gateway would on first contact.
    fn start(cache: &'c mut C, now_ms: Millis) -> Self {
        assert_eq!(cache.admit(now_ms, PARTITION, WINDOW_MS, 0), Admission::Hydrate);
        let hydration = Hydration { partition: PARTITION, window_ms: WINDOW_MS, last_offset: NO_VOUCH, rows: &[] };
        assert_eq!(cache.hydrate(now_ms, &hydration), Ok(()));
        Events { cache, last_offset: NO_VOUCH }
    }

    /// The seed's `first_seen`, one event at a time.
    fn first_seen(&mut self, id: u64, now_ms: Millis) -> bool {
        self.duplicates(&[id], now_ms).is_empty()
    }

    /// Plans the events as one segment, commits the first sightings, and
    /// answers the indexes of the duplicates.
    fn duplicates(&mut self, ids: &[u64], now_ms: Millis) -> Vec<u32> {
        let hashes: Vec<Hash> = ids.iter().map(|&id| hash_of(id)).collect();
        let bytes = encode(&hashes);
        let segment = Segment { partition: PARTITION, window_ms: WINDOW_MS, hashes: &bytes };
        let plan = self.cache.plan(now_ms, &[segment]).pop().expect("one plan");
        assert_eq!(plan.state, EntryState::Vouching);
        if plan.local_hits.is_empty() {
            assert_eq!(plan.p_verified, self.last_offset, "a complete entry vouches for the allocator");
        } else {
            assert!((NO_VOUCH..self.last_offset).contains(&plan.p_verified), "a hit narrows below the allocator");
        }
        let fresh: Vec<Hash> = hashes
            .iter()
            .enumerate()
            .filter(|(i, _)| plan.local_hits.binary_search(&(*i as u32)).is_err())
            .map(|(_, &h)| h)
            .collect();
        if !fresh.is_empty() {
            let bytes = encode(&fresh);
            let commit = Commit { partition: PARTITION, base_offset: self.last_offset + 1, created_ms: now_ms, hashes: &bytes };
            self.cache.record_commits(now_ms, &[commit]);
            self.last_offset += fresh.len() as Offset;
        }
        plan.local_hits
    }
}

/// Event ids to uniformly spread hashes, as xxh3 would give.
pub(super) fn hash_of(id: u64) -> Hash {
    let mix = |x: u64| {
        let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    u128::from(mix(id)) << 64 | u128::from(mix(!id))
}
