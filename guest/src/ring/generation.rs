//! One generation of a partition's ring: a bloom filter sized for the
//! generation's capacity and the exact hashes it fronts.
//!
//! The exact hashes live in a hot arrival-order buffer and in sorted runs of
//! sealed blocks. The hot buffer grows by doubling up to exactly one block and
//! is sealed the instant it is full: sorted in place and handed to a new run
//! as is, without a copy. Runs merge binary-counter style (two runs of equal
//! block count become one), with one exception that keeps a retry's floor
//! close: the newest complete run of [`STEPS_UP_TO_BLOCKS`] blocks, the
//! largest that keeps arrival steps, stays apart until the next one is
//! complete, and only then joins the counter of the larger runs. So the
//! newest 8 to 15 sealed blocks always keep their steps, a generation holds
//! at most log2(blocks) + 2 runs, and a full one holds a chain of runs that
//! [`Generation::settle`] merges into exactly one (capacities are powers of
//! two of blocks) once its ring has moved on by a recent run's worth.
//!
//! While the hot buffer fills, each completed chunk of [`CHUNK`] hashes is
//! sorted in place, so an exact lookup binary-searches the chunks and scans
//! only the unsorted tail.
//!
//! Hashes arrive in offset order, so every run and the hot buffer hold the
//! hashes of an offset range, and the generation keeps where each begins.
//! A lookup that finds a hash also answers a floor below which that
//! occurrence cannot lie (see [`super::Hit`]): in the hot buffer, where
//! commits are contiguous, the very offset it was committed at (each sorted
//! chunk keeps the arrival position of every hash, one byte each); in a
//! sealed run of up to 8 blocks, its arrival step there (see [`super::run`]:
//! within 16 offsets in a block of its own, twice that per merge), and in a
//! larger, older run the run's first offset. The newest 8 sealed blocks at
//! least are always in runs of up to 8 blocks, so a retry, the usual local
//! hit, is probed from at or just below its original's offset.

use alloc::vec::Vec;

use super::run::{BLOCK, Run, RunHit, STEPS_UP_TO_BLOCKS};
use super::search::Search;
use super::sort;
use crate::api::{Millis, NO_VOUCH, Offset};
use crate::bloom::Bloom;
use crate::hash::{HASH_LEN, Hash};

/// Hashes per sorted chunk of the hot buffer.
pub const CHUNK: usize = 256;

/// Accounted bytes of a generation besides its filter and its hashes.
pub const GENERATION_OVERHEAD: usize = 416;

/// A generation allocates its filter once it holds this many hashes. Below,
/// its filter is deferred (it answers "maybe") and every lookup is an exact
/// check of fewer hashes than this in the hot buffer: cheaper than carrying
/// the 8 KiB filter of the smallest tier for a partition that holds a
/// handful of messages, and what lets a shard hold many such partitions.
pub const FILTER_FROM: usize = 64;

/// The smallest capacity the hot buffer starts at.
const HOT_START: usize = 16;

const _: () = assert!(BLOCK.is_multiple_of(CHUNK) && BLOCK.is_power_of_two() && HOT_START.is_power_of_two());
const _: () = assert!(FILTER_FROM < BLOCK);

#[derive(Debug)]
pub struct Generation {
    bloom: Bloom,
    /// Arrival order; every complete `CHUNK` of it is sorted.
    hot: Vec<Hash>,
    /// The offset of `hot[0]`; `NO_VOUCH` while the buffer is empty.
    hot_from: Offset,
    /// For every complete chunk, `hot_arrival[c * CHUNK + j]` is the position
    /// in the chunk at which `hot[c * CHUNK + j]` arrived (the chunk is
    /// sorted stably, so among equal hashes the first is the oldest).
    hot_arrival: Vec<u8>,
    /// Block counts decrease front to back, but for a recent run of
    /// [`STEPS_UP_TO_BLOCKS`] blocks kept apart behind one of its size (see
    /// the module's doc).
    runs: Vec<Run>,
    /// The accounted bytes of `runs`, kept as they change (at most once per
    /// block sealed), because every commit asks for the footprint.
    runs_bytes: usize,
    len: usize,
    min_offset: Offset,
    max_offset: Offset,
    min_created_ms: Millis,
    max_created_ms: Millis,
}

impl Generation {
    /// An empty generation for `capacity` hashes, a power of two of blocks.
    pub fn new(capacity: usize) -> Generation {
        assert!(capacity.is_power_of_two() && capacity >= BLOCK);
        Generation {
            bloom: Bloom::deferred(capacity),
            hot: Vec::new(),
            hot_from: NO_VOUCH,
            hot_arrival: Vec::new(),
            runs: Vec::new(),
            runs_bytes: 0,
            len: 0,
            min_offset: Offset::MAX,
            max_offset: NO_VOUCH,
            min_created_ms: Millis::MAX,
            max_created_ms: Millis::MIN,
        }
    }

    pub fn capacity(&self) -> usize {
        self.bloom.capacity()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// How many more hashes fit.
    pub fn room(&self) -> usize {
        self.capacity() - self.len
    }

    /// The lowest offset appended; `Offset::MAX` while empty.
    pub fn min_offset(&self) -> Offset {
        self.min_offset
    }

    /// The highest offset appended; `NO_VOUCH` while empty.
    pub fn max_offset(&self) -> Offset {
        self.max_offset
    }

    /// The oldest `created_ms` appended; `Millis::MAX` while empty.
    pub fn min_created_ms(&self) -> Millis {
        self.min_created_ms
    }

    /// The newest `created_ms` appended; `Millis::MIN` while empty.
    pub fn max_created_ms(&self) -> Millis {
        self.max_created_ms
    }

    /// The accounted footprint: filter, hashes and a fixed overhead. The hot
    /// buffer counts by its capacity, not its length: it grows by doubling,
    /// and for the many partitions that hold a few hashes its spare room is
    /// most of what they allocate (`guest/tests/footprint.rs`).
    pub fn bytes(&self) -> usize {
        debug_assert_eq!(self.runs_bytes, self.runs.iter().map(Run::bytes).sum::<usize>());
        GENERATION_OVERHEAD + self.bloom.bytes() + self.runs_bytes + self.hot.capacity() * HASH_LEN + self.hot_arrival.capacity()
    }

    /// Appends hashes committed at the contiguous offsets `first_offset..`.
    /// They must fit in the room left.
    pub fn append(&mut self, first_offset: Offset, created_ms: Millis, hashes: &[Hash]) {
        assert!(hashes.len() <= self.room());
        if hashes.is_empty() {
            return;
        }
        let last_offset = first_offset + (hashes.len() as Offset - 1);
        self.min_offset = self.min_offset.min(first_offset);
        self.max_offset = self.max_offset.max(last_offset);
        self.min_created_ms = self.min_created_ms.min(created_ms);
        self.max_created_ms = self.max_created_ms.max(created_ms);
        if !self.bloom.is_built() && self.len + hashes.len() >= FILTER_FROM {
            // Fewer than `FILTER_FROM < BLOCK` hashes: all in the hot buffer.
            debug_assert!(self.runs.is_empty() && self.hot.len() == self.len);
            self.bloom.build(&self.hot);
        }
        self.bloom.insert_many(hashes);
        let mut rest = hashes;
        let mut offset = first_offset;
        while !rest.is_empty() {
            let (now, later) = rest.split_at(rest.len().min(BLOCK - self.hot.len()));
            self.push_hot(offset, now);
            offset += now.len() as Offset;
            rest = later;
        }
        self.len += hashes.len();
        debug_assert_eq!(self.len, self.hot.len() + self.runs.iter().map(Run::len).sum::<usize>());
        debug_assert!(self.len < self.capacity() || self.hot.is_empty());
    }

    /// Whether the exact hashes are at most one run: always true of an
    /// empty generation, and of a full one once [`Generation::settle`]d.
    pub fn is_settled(&self) -> bool {
        self.hot.is_empty() && self.runs.len() <= 1
    }

    /// Merges a full generation's runs into one, so that an exact check
    /// there is one search. The counter's runs and the recent run kept
    /// apart form a chain of equal pairs from the back (`capacity - 8`
    /// blocks in powers of two from 8 blocks up, then 8 more), so every
    /// merge is of equal runs.
    pub fn settle(&mut self) {
        assert_eq!(self.room(), 0, "only a full generation settles");
        debug_assert!(self.hot.is_empty());
        self.merge_equal_tail(usize::MAX);
        assert_eq!(self.runs.len(), 1, "a full generation settles into one run");
        self.runs_bytes = self.runs.iter().map(Run::bytes).sum();
    }

    /// The filter in front of the exact hashes.
    pub fn bloom(&self) -> &Bloom {
        &self.bloom
    }

    /// The exact check: whether the generation holds the hash.
    #[cfg(test)]
    pub fn contains(&self, hash: Hash) -> bool {
        self.runs.iter().any(|run| run.contains(hash)) || self.hot_floor(hash).is_some()
    }

    /// The exact check, deferred: the floor of the hash in the hot buffer,
    /// if it holds it; and the searches of every sealed run that could hold
    /// it (older than any chunk, so they may lower the floor), added to
    /// `searches` for the caller to resolve with others; a search that finds
    /// it answers its floor in that run ([`RunHit::floor`]).
    pub fn check<'a>(&'a self, hash: Hash, index: u32, searches: &mut Vec<Search<'a, RunHit<'a>>>) -> Option<Offset> {
        searches.extend(self.runs.iter().filter_map(|run| run.search(hash, index)));
        self.hot_floor(hash)
    }

    /// Adds hashes committed at the contiguous offsets `first_offset..` that
    /// fit in the hot buffer without passing one block.
    fn push_hot(&mut self, first_offset: Offset, hashes: &[Hash]) {
        let before = self.hot.len();
        let after = before + hashes.len();
        assert!(after <= BLOCK);
        if before == 0 {
            self.hot_from = first_offset;
        }
        self.reserve_hot(after);
        self.hot.extend_from_slice(hashes);
        // Grown a chunk at a time (at most sixteen small reallocations per
        // block), so that it never holds more than the sorted chunks need.
        let sorted = after / CHUNK * CHUNK;
        self.hot_arrival.reserve_exact(sorted - self.hot_arrival.len());
        self.hot_arrival.resize(sorted, 0);
        for chunk in before / CHUNK..after / CHUNK {
            let range = chunk * CHUNK..(chunk + 1) * CHUNK;
            sort::sort_with_arrival(&mut self.hot[range.clone()], &mut self.hot_arrival[range]);
        }
        if after == BLOCK {
            self.seal();
        }
    }

    /// Grows the hot buffer by doubling so that its capacity stays a power of
    /// two no larger than one block, which makes the seal a hand-off.
    fn reserve_hot(&mut self, needed: usize) {
        let capacity = self.hot.capacity();
        if needed <= capacity {
            return;
        }
        let grown = needed.next_power_of_two().max(capacity * 2).clamp(HOT_START, BLOCK);
        self.hot.reserve_exact(grown - self.hot.len());
        debug_assert!(self.hot.capacity() <= BLOCK);
    }

    /// Turns the full hot buffer into a run of one block and carries the
    /// runs' counter (see the module's doc).
    fn seal(&mut self) {
        let mut block = core::mem::take(&mut self.hot);
        assert_eq!(block.len(), BLOCK);
        debug_assert_eq!(block.capacity(), BLOCK, "the seal must not reallocate");
        debug_assert_eq!(self.hot_arrival.len(), BLOCK, "every chunk is sorted");
        // Each hash's arrival index in the block: its chunk's first, plus its
        // position in the chunk, kept through the chunk's sort.
        let mut arrivals: Vec<u16> =
            self.hot_arrival.iter().enumerate().map(|(i, &in_chunk)| (i / CHUNK * CHUNK) as u16 + u16::from(in_chunk)).collect();
        sort::sort_with_payload(&mut block, &mut arrivals);
        self.runs.push(Run::single(block.into_boxed_slice(), &arrivals, self.hot_from));
        self.hot_from = NO_VOUCH;
        // Kept for the next block: it would grow back to the same size.
        self.hot_arrival.clear();
        self.merge_equal_tail(STEPS_UP_TO_BLOCKS);
        if self.runs.last().is_some_and(|newest| newest.block_count() == STEPS_UP_TO_BLOCKS) {
            // A recent run just completed: the one it replaces (if any)
            // joins the counter of larger runs, and it stays apart.
            let recent = self.runs.pop().expect("just seen");
            self.merge_equal_tail(usize::MAX);
            self.runs.push(recent);
        }
        self.runs_bytes = self.runs.iter().map(Run::bytes).sum();
        // Block counts decrease front to back, but for the recent run and
        // the counter's smallest, which may both have 8 blocks.
        debug_assert!(self.runs.windows(2).filter(|w| w[0].block_count() <= w[1].block_count()).count() <= 1);
        debug_assert!(self.runs.windows(2).all(|w| w[0].block_count() > w[1].block_count()
            || (w[0].block_count() == STEPS_UP_TO_BLOCKS && w[1].block_count() == STEPS_UP_TO_BLOCKS)));
    }

    /// Merges the newest two runs while they have equal block counts and
    /// would make a run of at most `up_to` blocks.
    fn merge_equal_tail(&mut self, up_to: usize) {
        while let [.., older, newer] = self.runs.as_slice()
            && older.block_count() == newer.block_count()
            && older.block_count() * 2 <= up_to
        {
            let newer = self.runs.pop().expect("two runs");
            let older = self.runs.pop().expect("two runs");
            self.runs.push(Run::merge(older, newer));
        }
    }

    /// If the hot buffer holds the hash, the offset its oldest occurrence
    /// there was committed at; `hot_from` if the buffer's offsets have
    /// holes.
    fn hot_floor(&self, hash: Hash) -> Option<Offset> {
        let (chunks, tail) = self.hot.as_chunks::<CHUNK>();
        // The buffer is in cache, so a plain binary search, with no division
        // per step, beats interpolating. Chunks are in arrival order, so the
        // first that holds the hash holds its oldest occurrence.
        let in_chunks = chunks.iter().enumerate().find_map(|(c, chunk)| {
            let j = chunk.partition_point(|&held| held < hash);
            (chunk.get(j) == Some(&hash)).then(|| c * CHUNK + usize::from(self.hot_arrival[c * CHUNK + j]))
        });
        let position = match in_chunks {
            Some(position) => position,
            None => chunks.len() * CHUNK + tail.iter().position(|&held| held == hash)?,
        };
        debug_assert!(self.hot_from >= self.min_offset);
        // Offsets only grow, so `hot[i]` was committed at `hot_from + i` for
        // every `i` exactly when the newest, the generation's highest, is
        // `hot_from + len - 1` (commits are contiguous; a hydration's rows
        // may leave holes).
        let dense = self.max_offset - self.hot_from == self.hot.len() as Offset - 1;
        Some(if dense { self.hot_from + position as Offset } else { self.hot_from })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bloom::TIERS;

    use crate::hash::test_hashes as hashes;

    #[test]
    fn appends_track_offsets_and_time() {
        let mut generation = Generation::new(TIERS[0]);
        assert_eq!((generation.len(), generation.max_offset()), (0, NO_VOUCH));
        generation.append(10, 1_000, &hashes(1, 3));
        generation.append(13, 900, &hashes(2, 2));
        assert_eq!(generation.len(), 5);
        assert_eq!(generation.max_offset(), 14);
        assert_eq!((generation.min_created_ms(), generation.max_created_ms()), (900, 1_000));
        assert_eq!(generation.room(), TIERS[0] - 5);
        generation.append(15, 2_000, &[]);
        assert_eq!(generation.max_offset(), 14, "an empty append changes nothing");
    }

    #[test]
    fn every_appended_hash_is_found_at_every_fill_level() {
        let capacity = TIERS[1];
        let all = hashes(7, capacity);
        let strangers = hashes(8, 500);
        let mut generation = Generation::new(capacity);
        let mut offset = 0;
        // Uneven segment sizes cross chunk and block boundaries at odd places.
        for (i, segment) in all.chunks(1_000 + 37).enumerate() {
            generation.append(offset, i as Millis, segment);
            offset += segment.len() as Offset;
            let held = &all[..offset as usize];
            let step = (held.len() / 300).max(1);
            assert!(held.iter().step_by(step).all(|&h| generation.contains(h)));
            assert!(held[held.len().saturating_sub(300)..].iter().all(|&h| generation.contains(h)));
            assert!(strangers.iter().all(|&h| !generation.contains(h)));
        }
        assert_eq!(generation.room(), 0);
        assert_eq!(generation.runs.len(), 1, "a full generation is one run");
        assert!(generation.hot.is_empty());
        assert!(all.iter().all(|&h| generation.contains(h)));
    }

    #[test]
    fn hot_buffer_doubles_and_never_passes_one_block() {
        let mut generation = Generation::new(TIERS[0] * 2);
        let all = hashes(3, TIERS[0] * 2);
        let mut capacities = Vec::new();
        for (i, &hash) in all.iter().enumerate() {
            generation.append(i as Offset, 0, &[hash]);
            let capacity = generation.hot.capacity();
            assert!(capacity <= BLOCK && (capacity == 0 || capacity.is_power_of_two()));
            if capacities.last() != Some(&capacity) {
                capacities.push(capacity);
            }
        }
        assert_eq!(capacities[..4], [16, 32, 64, 128]);
        assert!(capacities.contains(&BLOCK));
    }

    /// The floor `check` answers for a hash the generation holds once.
    fn floor_of(generation: &Generation, hash: Hash) -> Offset {
        let mut searches = Vec::new();
        let hot = generation.check(hash, 0, &mut searches);
        let mut floor = hot.unwrap_or(Offset::MAX);
        super::super::search::resolve(&mut searches, &mut Vec::new(), |hit: RunHit, at| floor = floor.min(hit.floor(at)));
        floor
    }

    #[test]
    fn a_found_hash_floors_at_its_offset_or_its_arrival_step() {
        let mut generation = Generation::new(TIERS[1]);
        let all = hashes(12, BLOCK + CHUNK * 2 + 10);
        generation.append(50, 0, &all[..BLOCK + 3]);
        generation.append(50 + BLOCK as Offset + 3, 0, &all[BLOCK + 3..]);
        // Sealed: the hash's arrival step in the run, 16 offsets long.
        assert_eq!(floor_of(&generation, all[17]), 50 + 16);
        assert_eq!(floor_of(&generation, all[BLOCK - 1]), 50 + BLOCK as Offset - 16);
        // A sorted hot chunk: the hash's own offset, kept through the sort.
        for in_chunk in [BLOCK, BLOCK + 7, BLOCK + CHUNK + 200, BLOCK + 2 * CHUNK - 1] {
            assert_eq!(floor_of(&generation, all[in_chunk]), 50 + in_chunk as Offset);
        }
        // The unsorted tail: the hash's own offset.
        let in_tail = BLOCK + CHUNK * 2 + 4;
        assert_eq!(floor_of(&generation, all[in_tail]), 50 + in_tail as Offset);
        assert_eq!(floor_of(&generation, hashes(13, 1)[0]), Offset::MAX, "not held");
        // A hole in the hot buffer's offsets: its first offset is all that
        // is known.
        generation.append(100_000, 0, &hashes(14, 3));
        assert_eq!(floor_of(&generation, all[in_tail]), 50 + BLOCK as Offset);
        assert_eq!(floor_of(&generation, hashes(14, 3)[2]), 50 + BLOCK as Offset);
    }

    /// A retry repeats something committed shortly before; wherever the
    /// counter has merged it to, its floor stays within an arrival step.
    #[test]
    fn the_newest_sealed_blocks_keep_their_arrival_steps_at_every_fill_level() {
        let capacity = TIERS[2];
        let all = hashes(16, capacity);
        let mut generation = Generation::new(capacity);
        let recent = STEPS_UP_TO_BLOCKS * BLOCK;
        let mut offset: Offset = 1_000;
        for segment in all.chunks(3_001) {
            generation.append(offset, 0, segment);
            offset += segment.len() as Offset;
            let held = generation.len();
            let sealed = held / BLOCK * BLOCK;
            for position in (sealed.saturating_sub(recent)..sealed).step_by(997) {
                let committed = 1_000 + position as Offset;
                let floor = floor_of(&generation, all[position]);
                // An 8-block run's step: 128 arrivals.
                assert!(floor <= committed && committed - floor < 128, "{held} held, {committed}: {floor}");
            }
            assert!(generation.runs.len() <= (capacity / BLOCK).trailing_zeros() as usize + 2, "{held} held");
        }
        assert_eq!(generation.room(), 0);
        assert!(generation.runs.len() > 1 && !generation.is_settled(), "the recent run is kept apart");
        let counts: Vec<usize> = generation.runs.iter().map(Run::block_count).collect();
        assert_eq!(counts, [32, 16, 8, 8]);
        generation.settle();
        assert!(generation.is_settled());
        assert!(all.iter().step_by(101).all(|&hash| generation.contains(hash)));
        assert!(hashes(17, 300).iter().all(|&hash| !generation.contains(hash)));
        // Settled, a hit floors at the generation's first offset.
        assert_eq!(floor_of(&generation, all[capacity - 1]), 1_000);
    }

    #[test]
    fn a_hash_held_twice_in_the_hot_buffer_floors_at_its_first_arrival() {
        let mut generation = Generation::new(TIERS[0]);
        let mut held = hashes(15, CHUNK * 2 + 5);
        let repeated = held[100];
        held[10] = repeated;
        held[CHUNK + 3] = repeated;
        generation.append(1_000, 0, &held);
        assert_eq!(floor_of(&generation, repeated), 1_010);
    }

    #[test]
    fn hot_chunks_are_sorted_as_they_fill() {
        let mut generation = Generation::new(TIERS[0]);
        generation.append(0, 0, &hashes(4, CHUNK * 3 + 10));
        let (chunks, tail) = generation.hot.as_chunks::<CHUNK>();
        assert_eq!((chunks.len(), tail.len()), (3, 10));
        assert!(chunks.iter().all(|chunk| chunk.is_sorted()));
    }

    #[test]
    fn the_filter_has_no_false_negatives() {
        let mut generation = Generation::new(TIERS[0]);
        let held = hashes(5, 2_000);
        generation.append(0, 0, &held);
        assert!(held.iter().all(|&hash| generation.bloom().may_contain(hash)));
    }

    #[test]
    fn the_filter_is_built_when_the_generation_reaches_filter_from() {
        let mut generation = Generation::new(TIERS[0]);
        let held = hashes(7, FILTER_FROM + 10);
        // Below the threshold: no filter bits, every lookup an exact check.
        generation.append(0, 0, &held[..FILTER_FROM - 1]);
        assert!(!generation.bloom().is_built());
        assert!(generation.bytes() < GENERATION_OVERHEAD + FILTER_FROM * HASH_LEN + 256);
        assert!(generation.bloom().may_contain(hashes(8, 1)[0]), "a deferred filter answers maybe");
        assert!(held[..FILTER_FROM - 1].iter().all(|&hash| generation.contains(hash)));
        // One commit that crosses it builds the filter over everything held.
        generation.append(FILTER_FROM as Offset - 1, 0, &held[FILTER_FROM - 1..]);
        assert!(generation.bloom().is_built());
        assert!(generation.bytes() >= TIERS[0] * 2);
        assert!(held.iter().all(|&hash| generation.bloom().may_contain(hash) && generation.contains(hash)));
        let strangers = hashes(9, 1_000);
        assert!(strangers.iter().filter(|&&hash| generation.bloom().may_contain(hash)).count() < 10);
    }

    #[test]
    #[should_panic(expected = "assertion")]
    fn overfilling_is_a_bug() {
        let mut generation = Generation::new(TIERS[0]);
        generation.append(0, 0, &hashes(6, TIERS[0] + 1));
    }
}
