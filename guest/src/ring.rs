//! The ring: one partition's in-window hashes as generations in time order,
//! oldest at the front. Each generation is a bloom filter over its own exact
//! hashes (see [`generation`]); appends go to the newest generation and spill
//! into a new one when it is full; expiry drops whole generations from the
//! front.
//!
//! Whole-generation expiry is what keeps the cache sound without
//! refcounting: a hash lives independently in every generation that received
//! it, and a generation is dropped only when its newest hash is older than
//! the window plus the skew slack, so the resident set is always a superset
//! of the in-window hashes. A superset can only cause a false local hit (one
//! extra SQL probe), never a false "no duplicate".
//!
//! A lookup that finds hashes also bounds where they were committed: every
//! chunk, run and generation holds the hashes of a range of offsets, and
//! every place that can hold a found hash is searched, so no found hash
//! occurs in the ring below the lowest first offset of the places holding
//! them ([`Found::floor`]). That lets a segment with a local hit be probed
//! from there instead of across the whole window.

mod generation;
mod run;
mod search;
mod sort;

use alloc::collections::VecDeque;
use alloc::vec::Vec;

use crate::api::{Millis, NO_VOUCH, Offset};
use crate::bloom::{self, Maybe, TIERS};
use crate::hash::Hash;
use generation::Generation;

/// The capacity of a new generation: the smallest tier at or above a quarter
/// of the hashes the ring already holds. An idle partition thus carries one
/// small filter, and a busy one grows ×8 per step up to the largest tier.
///
/// A quarter, not the whole: expiry drops whole generations, so a ring holds
/// up to about one generation beyond its window. Generations of a quarter of
/// the window keep that overhead near 25 % (about five live generations to
/// probe); generations as large as the window would keep twice the window.
pub fn capacity_for(held: usize) -> usize {
    let wanted = held / 4;
    TIERS.into_iter().find(|&tier| tier >= wanted).unwrap_or(TIERS[TIERS.len() - 1])
}

/// How far beyond the hashes already held a projection may size the next
/// generation. Eight times takes a ring filling at a high rate from the
/// smallest tier to the largest in three generations (4,096, then 32,768,
/// then 262,144), where sizing by the held count alone makes about a dozen
/// small generations that each stay live for a whole window. It also bounds
/// what a burst followed by silence costs: one generation of the smallest
/// tier of at least twice the hashes held ([`capacity_for`] of eight times
/// them), so less than sixteen times them.
pub const PROJECTION_LIMIT: usize = 8;

/// How many hashes a full generation keeps its recent run apart for (see
/// [`Ring::settle_behind`]): as many as that run holds.
const RECENT_HASHES: usize = run::STEPS_UP_TO_BLOCKS * run::BLOCK;

/// One partition's generations, oldest first.
#[derive(Debug, Default)]
pub struct Ring {
    generations: VecDeque<Generation>,
    /// Hashes across all generations.
    held: usize,
}

/// What an expiry dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Expired {
    pub generations: usize,
    /// The highest offset of the dropped generations, or `NO_VOUCH`.
    pub max_offset: Offset,
}

/// One hash of a batch found in the ring: its index in the batch, and the
/// first offset of the chunk or run holding it, at or below the offset at
/// which that occurrence was committed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hit {
    pub index: u32,
    pub floor: Offset,
}

/// What a batch check saw besides which hashes it found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Found {
    /// Bloom "maybe" answers: the exact checks it took.
    pub maybes: usize,
    /// The lowest floor of any hit: none of the hashes found occurs in the
    /// ring below it. `Offset::MAX` when nothing was found.
    pub floor: Offset,
}

/// Buffers a batch check reuses from call to call.
#[derive(Debug, Default)]
pub struct Scratch {
    maybes: Vec<Maybe>,
    hit_words: Vec<u64>,
    guesses: Vec<Option<usize>>,
}

impl Ring {
    pub fn held(&self) -> usize {
        self.held
    }

    pub fn generation_count(&self) -> usize {
        self.generations.len()
    }

    /// The accounted footprint of every generation.
    pub fn bytes(&self) -> usize {
        self.generations.iter().map(Generation::bytes).sum()
    }

    /// The hashes the ring will hold once a window of `window_ms` has filled
    /// at the arrival rate seen so far (the held count over the time since
    /// the oldest held hash was created, at `now_ms`), but at most
    /// [`PROJECTION_LIMIT`] times the held count. Only generation sizes
    /// depend on it, never what is held or expired.
    pub fn projected(&self, now_ms: Millis, window_ms: u64) -> usize {
        let Some(oldest) = self.generations.front() else {
            return 0;
        };
        let span_ms = now_ms.saturating_sub(oldest.min_created_ms()).max(1) as u128;
        let projected = self.held as u128 * u128::from(window_ms) / span_ms;
        projected.min(self.held.saturating_mul(PROJECTION_LIMIT) as u128) as usize
    }

    /// Appends hashes committed at the contiguous offsets `first_offset..`,
    /// which must lie above every offset already appended. (The cache
    /// always sizes its appends; tests use this for the plain tiers.)
    #[cfg(test)]
    pub fn append(&mut self, first_offset: Offset, created_ms: Millis, hashes: &[Hash]) {
        self.append_sized(first_offset, created_ms, hashes, 0);
    }

    /// [`Ring::append`], sizing new generations as if the ring already held
    /// at least `expected` hashes. A hydration passes the window's total, and
    /// a commit the [`Ring::projected`] total, so that the ring gets the few
    /// large generations of a full window, not a staircase of small ones to
    /// probe.
    pub fn append_sized(&mut self, first_offset: Offset, created_ms: Millis, hashes: &[Hash], expected: usize) {
        debug_assert!(self.generations.back().is_none_or(|newest| newest.max_offset() < first_offset));
        let mut offset = first_offset;
        let mut rest = hashes;
        while !rest.is_empty() {
            if self.generations.back().is_none_or(|newest| newest.room() == 0) {
                self.generations.push_back(Generation::new(capacity_for(self.held.max(expected))));
            }
            let newest = self.generations.back_mut().expect("just ensured");
            let (now, later) = rest.split_at(rest.len().min(newest.room()));
            newest.append(offset, created_ms, now);
            self.held += now.len();
            offset += now.len() as Offset;
            rest = later;
        }
        self.settle_behind(hashes.len());
    }

    /// Settles every full generation that the ring has appended a recent
    /// run's worth of hashes past ([`Generation::settle`]): until then its
    /// newest blocks keep their arrival steps, for the retries of what it
    /// took last; after, an exact check there is one search. The walk back
    /// stops where the generations were that far behind before the last
    /// `appended` hashes: those were settled then.
    fn settle_behind(&mut self, appended: usize) {
        // The hashes held by the generations newer than the one at hand.
        let mut past = 0;
        for generation in self.generations.iter_mut().rev() {
            if past >= RECENT_HASHES + appended {
                break;
            }
            if past >= RECENT_HASHES && !generation.is_settled() {
                generation.settle();
            }
            past += generation.len();
        }
        debug_assert!(self.all_behind_settled());
    }

    /// Whether every generation a recent run's worth behind is settled.
    fn all_behind_settled(&self) -> bool {
        let mut past = 0;
        self.generations.iter().rev().all(|generation| {
            let settled = past < RECENT_HASHES || generation.is_settled();
            past += generation.len();
            settled
        })
    }

    /// Drops generations from the front while their newest hash was created
    /// before `cutoff_ms`. Stops at the first that is not entirely stale, so
    /// that the survivors always cover every offset above those dropped.
    pub fn expire(&mut self, cutoff_ms: Millis) -> Expired {
        let mut expired = Expired { generations: 0, max_offset: NO_VOUCH };
        while let Some(oldest) = self.generations.front()
            && oldest.max_created_ms() < cutoff_ms
        {
            let oldest = self.generations.pop_front().expect("just seen");
            self.held -= oldest.len();
            expired.generations += 1;
            expired.max_offset = expired.max_offset.max(oldest.max_offset());
        }
        debug_assert!(self.generations.front().is_none_or(|front| front.min_offset() > expired.max_offset));
        expired
    }

    /// Replaces `hits` with the indexes of `hashes` that some generation
    /// holds, ascending, and answers how many bloom "maybe"s it took and the
    /// floor below which none of them occurs in the ring.
    ///
    /// Every hash is probed through every generation's filter first, in one
    /// pass (see [`bloom::maybe_many`]); only the "maybe"s fall through to
    /// their generation's exact check, and a definite miss touches nothing
    /// else. A filter has no false negatives, so every generation holding a
    /// hash is checked, and in it every place that can hold it: the floor
    /// is the lowest of them all.
    pub fn find(&self, hashes: &[Hash], scratch: &mut Scratch, hits: &mut Vec<u32>) -> Found {
        let Scratch { maybes, hit_words, guesses } = scratch;
        hit_words.clear();
        hit_words.resize(hashes.len().div_ceil(64), 0);
        // Newest first: a retry usually repeats something recent.
        bloom::maybe_many(self.generations.iter().rev().map(Generation::bloom), hashes, maybes);
        // The hot buffers are checked at once (they are in cache); the
        // sealed blocks are searched together, so that their cache misses
        // overlap.
        let mut searches = Vec::new();
        let mut floor = Offset::MAX;
        let mut hit = |found: Hit| {
            hit_words[found.index as usize / 64] |= 1 << (found.index % 64);
            floor = floor.min(found.floor);
        };
        for maybe in maybes.iter() {
            let generation = &self.generations[self.generations.len() - 1 - maybe.filter as usize];
            if let Some(hot_floor) = generation.check(hashes[maybe.index as usize], maybe.index, &mut searches) {
                hit(Hit { index: maybe.index, floor: hot_floor });
            }
        }
        search::resolve(&mut searches, guesses, |run_hit, at| hit(Hit { index: run_hit.index, floor: run_hit.floor(at) }));
        hits.clear();
        for (word_index, &word) in hit_words.iter().enumerate() {
            let mut word = word;
            while word != 0 {
                hits.push((word_index * 64) as u32 + word.trailing_zeros());
                word &= word - 1;
            }
        }
        debug_assert_eq!(hits.is_empty(), floor == Offset::MAX);
        Found { maybes: maybes.len(), floor }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    use crate::hash::test_hashes as hashes;

    #[test]
    fn capacity_tiers_follow_the_held_count() {
        assert_eq!(capacity_for(0), 4_096);
        assert_eq!(capacity_for(16_384 + 3), 4_096);
        assert_eq!(capacity_for(16_384 + 4), 32_768);
        assert_eq!(capacity_for(160_000), 262_144);
        assert_eq!(capacity_for(4 * 262_144 + 4), 1_048_576);
        assert_eq!(capacity_for(50_000_000), 1_048_576);
    }

    #[test]
    fn a_sized_append_starts_with_the_generations_of_its_total() {
        let mut ring = Ring::default();
        let all = hashes(2, 65_536);
        ring.append_sized(0, 7, &all, all.len());
        let capacities: Vec<usize> = ring.generations.iter().map(Generation::capacity).collect();
        assert_eq!(capacities, [32_768, 32_768]);
        assert_eq!(ring.held(), all.len());
    }

    #[test]
    fn the_projection_follows_the_arrival_rate_up_to_its_limit() {
        let mut ring = Ring::default();
        assert_eq!(ring.projected(1_000, 60_000), 0, "nothing held, nothing projected");
        ring.append(0, 1_000, &hashes(6, 1_000));
        // 1,000 hashes in 20 s project to 3,000 in a 60 s window.
        assert_eq!(ring.projected(21_000, 60_000), 3_000);
        // 1,000 hashes in 1 ms would project to 60 M: the limit holds it.
        assert_eq!(ring.projected(1_000, 60_000), 1_000 * PROJECTION_LIMIT);
        // A slow ring projects below what it holds; sizing uses the larger.
        assert_eq!(ring.projected(601_000, 60_000), 100);
    }

    #[test]
    fn a_projected_append_reaches_the_largest_tier_in_three_steps() {
        let mut ring = Ring::default();
        let all = hashes(7, 400_000);
        let mut offset = 0;
        // 100 hashes a millisecond, committed 1,000 at a time.
        for (i, commit) in all.chunks(1_000).enumerate() {
            let now = i as Millis * 10;
            let expected = ring.projected(now, 60_000);
            ring.append_sized(offset, now, commit, expected);
            offset += commit.len() as Offset;
        }
        let capacities: Vec<usize> = ring.generations.iter().map(Generation::capacity).collect();
        assert_eq!(capacities, [4_096, 32_768, 262_144, 1_048_576]);
    }

    #[test]
    fn a_large_append_spills_into_growing_generations() {
        let mut ring = Ring::default();
        let all = hashes(1, 50_000);
        ring.append(0, 7, &all);
        // Five of 4,096 (held up to 16,384), then 32,768 (held 20,480).
        let capacities: Vec<usize> = ring.generations.iter().map(Generation::capacity).collect();
        assert_eq!(capacities, [4_096, 4_096, 4_096, 4_096, 4_096, 32_768]);
        assert_eq!(ring.held(), all.len());
        let offsets: Vec<(Offset, Offset)> = ring.generations.iter().map(|g| (g.min_offset(), g.max_offset())).collect();
        assert_eq!(offsets, [(0, 4_095), (4_096, 8_191), (8_192, 12_287), (12_288, 16_383), (16_384, 20_479), (20_480, 49_999)]);
        let mut scratch = Scratch::default();
        let mut hits = Vec::new();
        ring.find(&all, &mut scratch, &mut hits);
        assert_eq!(hits.len(), all.len());
    }

    #[test]
    fn find_reports_exact_hits_in_order() {
        let mut ring = Ring::default();
        let held = hashes(2, 6_000);
        ring.append(100, 0, &held[..3_000]);
        ring.append(3_100, 0, &held[3_000..]);
        let strangers = hashes(3, 1_000);
        let batch = vec![strangers[0], held[5], strangers[1], held[5_999], held[5], strangers[2]];
        let mut scratch = Scratch::default();
        let mut hits = vec![42];
        let found = ring.find(&batch, &mut scratch, &mut hits);
        assert_eq!(hits, [1, 3, 4]);
        assert!(found.maybes >= 3);
        assert!(found.floor <= 105, "held[5] was committed at 105");
        // A long batch of strangers: false positives are possible in the
        // filters, never in the answer.
        let found = ring.find(&strangers, &mut scratch, &mut hits);
        assert!(hits.is_empty() && found.floor == Offset::MAX);
        assert!(found.maybes < 10, "{} maybes for 1,000 strangers", found.maybes);
    }

    /// The floor of a single hash found in a ring holding each hash once:
    /// at or below the offset it was committed at, and within the place
    /// that holds it (a hot chunk, a run, or the generation).
    #[test]
    fn the_floor_is_at_most_a_place_below_the_hit() {
        let mut ring = Ring::default();
        let held = hashes(8, 40_000);
        let mut offset = 1_000;
        for segment in held.chunks(777) {
            ring.append(offset, 0, segment);
            offset += segment.len() as Offset;
        }
        let mut scratch = Scratch::default();
        let mut hits = Vec::new();
        for position in (0..held.len()).step_by(97).chain([0, held.len() - 1]) {
            let committed = 1_000 + position as Offset;
            let found = ring.find(&[held[position]], &mut scratch, &mut hits);
            assert_eq!(hits, [0]);
            let generation = ring.generations.iter().find(|g| g.min_offset() <= committed && committed <= g.max_offset());
            let generation = generation.expect("some generation holds it");
            assert!(generation.min_offset() <= found.floor && found.floor <= committed, "{committed}: {found:?}");
            // Sealed or hot, within one arrival step: 16 offsets per block of
            // a run (a 32,768-hash generation is one run of 8 blocks).
            assert!(committed - found.floor < 16 * 8, "{committed}: {found:?}");
        }
        // With holes in the offsets (a hydration's rows), the floors only
        // lie further below.
        let mut gappy = Ring::default();
        let mut offsets = Vec::with_capacity(held.len());
        let mut offset = 0;
        for segment in held.chunks(777) {
            gappy.append(offset, 0, segment);
            offsets.extend((0..segment.len() as Offset).map(|i| offset + i));
            offset += segment.len() as Offset + 5;
        }
        for position in (0..held.len()).step_by(89) {
            let found = gappy.find(&[held[position]], &mut scratch, &mut hits);
            assert!(hits == [0] && found.floor <= offsets[position], "{}: {found:?}", offsets[position]);
        }
        // The newest hashes sit in a hot chunk: the floor is at most one
        // chunk below them, so a retry of something recent is probed over a
        // few hundred offsets, not the window.
        let newest = held.len() - 1;
        let found = ring.find(&[held[newest]], &mut scratch, &mut hits);
        assert!(1_000 + newest as Offset - found.floor < generation::CHUNK as Offset, "{found:?}");
        // A batch's floor is its lowest hit's, whatever the order.
        let found = ring.find(&[held[newest], hashes(9, 1)[0], held[5]], &mut scratch, &mut hits);
        assert_eq!((hits.as_slice(), found.floor), ([0, 2].as_slice(), 1_000));
    }

    #[test]
    fn a_full_generation_settles_once_a_recent_run_has_been_appended_past_it() {
        let mut ring = Ring::default();
        let all = hashes(12, TIERS[2] + RECENT_HASHES + 1);
        let mut offset = 0;
        // Sized for a large window: 262,144-hash generations.
        let mut append = |ring: &mut Ring, hashes: &[Hash]| {
            ring.append_sized(offset, 0, hashes, 4 * TIERS[2]);
            offset += hashes.len() as Offset;
        };
        append(&mut ring, &all[..TIERS[2]]);
        assert_eq!(ring.generation_count(), 1);
        assert!(!ring.generations[0].is_settled(), "just filled: its newest blocks keep their steps");
        // A retry of the full generation's last hash, before it settles:
        // floored within an 8-block run's arrival step.
        let mut hits = Vec::new();
        let last = TIERS[2] - 1;
        let found = ring.find(&[all[last]], &mut Scratch::default(), &mut hits);
        assert!(hits == [0] && last as Offset - found.floor < 128, "{found:?}");
        for commit in all[TIERS[2]..TIERS[2] + RECENT_HASHES - 1].chunks(1_000) {
            append(&mut ring, commit);
            assert!(!ring.generations[0].is_settled());
        }
        append(&mut ring, &all[TIERS[2] + RECENT_HASHES - 1..TIERS[2] + RECENT_HASHES]);
        assert!(ring.generations[0].is_settled(), "a recent run's worth later");
        assert_eq!(ring.find(&all, &mut Scratch::default(), &mut hits).floor, 0);
        assert_eq!(hits.len(), all.len() - 1);
        append(&mut ring, &all[all.len() - 1..]);
        assert!(ring.all_behind_settled());
    }

    #[test]
    fn a_repeated_hash_floors_at_its_oldest_occurrence() {
        let mut ring = Ring::default();
        let first = hashes(10, 9_000);
        let repeated = first[8_500];
        ring.append(0, 0, &first);
        ring.append(9_000, 0, &hashes(11, 30_000));
        ring.append(39_000, 0, &[repeated]);
        let mut hits = Vec::new();
        let found = ring.find(&[repeated], &mut Scratch::default(), &mut hits);
        assert_eq!(hits, [0]);
        // The older occurrence sets the floor: its arrival step in the sealed
        // run that holds it (the third generation's, from 8,192), 16 long.
        assert_eq!(found.floor, 8_192 + (308 & !15));
    }

    #[test]
    fn expiry_drops_whole_stale_generations_from_the_front() {
        let mut ring = Ring::default();
        let all = hashes(4, 4_096 * 3);
        ring.append(0, 1_000, &all[..4_096]);
        ring.append(4_096, 2_000, &all[4_096..4_100]);
        ring.append(4_100, 9_000, &all[4_100..8_192]);
        ring.append(8_192, 3_000, &all[8_192..]);
        assert_eq!(ring.generation_count(), 3);
        assert_eq!(ring.expire(1_000), Expired { generations: 0, max_offset: NO_VOUCH }, "not strictly older");
        // The second generation is stale by its first hashes but not by its
        // newest, so it stays, and so does the third behind it.
        assert_eq!(ring.expire(5_000), Expired { generations: 1, max_offset: 4_095 });
        assert_eq!(ring.held(), 4_096 * 2);
        assert_eq!(ring.expire(9_001), Expired { generations: 2, max_offset: 4_096 * 3 - 1 });
        assert_eq!((ring.held(), ring.generation_count(), ring.bytes()), (0, 0, 0));
        let mut hits = Vec::new();
        ring.find(&all, &mut Scratch::default(), &mut hits);
        assert!(hits.is_empty());
    }

    #[test]
    fn repeated_hashes_stay_known_until_their_last_generation_goes() {
        let mut ring = Ring::default();
        let first = hashes(5, 4_096);
        let repeated = first[17];
        ring.append(0, 1_000, &first);
        ring.append(4_096, 5_000, &[repeated]);
        assert_eq!(ring.expire(2_000).generations, 1);
        let mut hits = Vec::new();
        ring.find(&[repeated], &mut Scratch::default(), &mut hits);
        assert_eq!(hits, [0]);
    }
}
