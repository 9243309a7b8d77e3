//! A sorted run: immutable sorted blocks of [`BLOCK`] hashes that together
//! form one ascending sequence, with the first key of each block kept as a
//! fence, so that membership is a search to the block and then one in the
//! block (both by interpolation, see [`search`]).
//!
//! Runs only grow by merging two runs of equal block count (the binary
//! counter of the generation that owns them). The merge streams block by
//! block: it allocates one output block at a time and frees each input block
//! as soon as it is consumed, so no allocation ever exceeds one block and the
//! transient overhead is about one block per input.
//!
//! In runs of up to [`STEPS_UP_TO_BLOCKS`] blocks every hash also keeps, in
//! one byte, when it arrived in the run: its arrival index (0 for the run's
//! oldest hash) in steps of 16 hashes in a block of its own, twice as long
//! after each merge. The run's hashes were committed at increasing offsets
//! from its first, so the step gives a floor at or below the hash's own
//! offset, even where the offsets have holes: a hit there, the retry of
//! something of the last few seconds, is probed from close to its original.
//! Larger runs hold older hashes and drop the steps (each further merge
//! would carry them again at a cost per hash); a hit there floors at the
//! run's first offset.

use alloc::boxed::Box;
use alloc::vec;
use alloc::vec::Vec;

use super::search::{self, Search};
use crate::api::Offset;
use crate::hash::Hash;

/// Hashes per sealed block: 64 KiB, the largest allocation the exact ring
/// ever makes.
pub const BLOCK: usize = 4_096;

/// The arrival step of a run of one block: 4,096 arrivals in 256 steps.
const ONE_BLOCK_STEP_SHIFT: u32 = 4;

/// The largest runs that keep arrival steps: 32,768 hashes, in steps of 128.
pub const STEPS_UP_TO_BLOCKS: usize = 8;

const _: () = assert!(BLOCK >> ONE_BLOCK_STEP_SHIFT == 256);

/// A search's tag for a hash looked up in a run: the hash's index in its
/// batch, and where to read its floor once it is found.
#[derive(Clone, Copy, Debug)]
pub struct RunHit<'a> {
    pub index: u32,
    run: &'a Run,
    block: usize,
}

impl RunHit<'_> {
    /// The floor of the hash found at `position` of the searched block.
    pub fn floor(self, position: usize) -> Offset {
        self.run.floor(self.block, position)
    }
}

/// An ascending sequence of hashes held in sealed blocks.
#[derive(Debug)]
pub struct Run {
    blocks: Vec<Box<[Hash]>>,
    /// `steps[i][j]` is when `blocks[i][j]` arrived: its arrival index in the
    /// run shifted right by [`Run::step_shift`]. Empty in a run of more than
    /// [`STEPS_UP_TO_BLOCKS`] blocks.
    steps: Vec<Box<[u8]>>,
    /// `fences[i]` is the first hash of `blocks[i]`.
    fences: Vec<Hash>,
    /// The lowest offset of any hash in the run. A run holds the hashes of
    /// consecutive arrivals, so this bounds where any of them was committed.
    min_offset: Offset,
}

impl Run {
    /// A run of one sealed block, which must be sorted and full, of hashes
    /// committed at increasing offsets from `min_offset` on; `arrivals[j]` is
    /// the arrival index of `block[j]` (0 for the first committed).
    pub fn single(block: Box<[Hash]>, arrivals: &[u16], min_offset: Offset) -> Run {
        assert_eq!(block.len(), BLOCK);
        assert_eq!(arrivals.len(), BLOCK);
        debug_assert!(block.is_sorted());
        let steps: Box<[u8]> = arrivals.iter().map(|&arrival| (arrival >> ONE_BLOCK_STEP_SHIFT) as u8).collect();
        Run { fences: vec![block[0]], blocks: vec![block], steps: vec![steps], min_offset }
    }

    pub fn block_count(&self) -> usize {
        self.blocks.len()
    }

    pub fn len(&self) -> usize {
        self.blocks.len() * BLOCK
    }

    #[cfg(test)]
    pub fn min_offset(&self) -> Offset {
        self.min_offset
    }

    /// The bytes the run allocates for its hashes and their arrival steps.
    pub fn bytes(&self) -> usize {
        self.len() * size_of::<Hash>() + self.steps.len() * BLOCK
    }

    #[cfg(test)]
    pub fn contains(&self, hash: Hash) -> bool {
        let mut found = false;
        if let Some(search) = self.search(hash, 0) {
            search::resolve(&mut [search], &mut Vec::new(), |_, _| found = true);
        }
        found
    }

    /// How far an arrival step shifts the arrival index: twice as long per
    /// merge, so that 256 steps always cover the run.
    fn step_shift(&self) -> u32 {
        debug_assert!(self.blocks.len().is_power_of_two());
        ONE_BLOCK_STEP_SHIFT + self.blocks.len().trailing_zeros()
    }

    /// An offset at or below every offset at which the hash at `position`
    /// of block `block` was committed in this run.
    fn floor(&self, block: usize, position: usize) -> Offset {
        if self.steps.is_empty() {
            return self.min_offset;
        }
        let keys = &self.blocks[block];
        let hash = keys[position];
        // Equal keys lie together. The search takes the last block that can
        // hold the hash, so this block holds all of its occurrences, unless
        // they start the block and the block before ends with more: then
        // only the run's first offset is certain. (Every hash that starts a
        // block, one in 4,096, would otherwise floor there: a retry of 100
        // hashes, one time in 40, from up to 32,767 offsets below.)
        let first = keys[..position].iter().rposition(|&key| key != hash).map_or(0, |before| before + 1);
        if first == 0 && block > 0 && self.blocks[block - 1].last() == Some(&hash) {
            return self.min_offset;
        }
        let end = keys[position..].iter().position(|&key| key != hash).map_or(keys.len(), |after| position + after);
        let step = self.steps[block][first..end].iter().copied().min().expect("the found key itself");
        self.min_offset + (Offset::from(step) << self.step_shift())
    }

    /// The search for a hash in the one block that can hold it, or `None`
    /// when the hash lies below the whole run. The fences bound the block's
    /// keys for the interpolation: its own below, the next one's above.
    pub fn search(&self, hash: Hash, index: u32) -> Option<Search<'_, RunHit<'_>>> {
        // The last block whose first key is at or below the hash is the only
        // one that can hold it: every later block starts above it, and an
        // earlier block that also holds it (a repeat spanning a boundary)
        // would make this block's first key equal to it.
        //
        // The hashes are uniform, so the block is first guessed from the
        // hash's value; only the fences on the side it turns out to lie on
        // are searched, and usually the first one tested settles it.
        let fences = self.fences.as_slice();
        let guess = (((hash >> 96) as u64 * fences.len() as u64) >> 32) as usize;
        let block = if hash < fences[guess] {
            search::upper_bound(&fences[..guess], hash).checked_sub(1)?
        } else {
            guess + search::upper_bound(&fences[guess + 1..], hash)
        };
        debug_assert_eq!(Some(block), search::upper_bound(fences, hash).checked_sub(1));
        let high_key = self.fences.get(block + 1).copied().unwrap_or(Hash::MAX);
        let tag = RunHit { index, run: self, block };
        Some(Search::new(&self.blocks[block], self.fences[block], high_key, hash, tag))
    }

    /// Merges two runs of equal block count into one, streaming block by
    /// block. The merged run's arrival steps, if it keeps them, are twice as
    /// long: the older run's halve, and the newer run's, which arrived after
    /// all of the older's, follow them from step 128.
    pub fn merge(older: Run, newer: Run) -> Run {
        let block_count = older.blocks.len() + newer.blocks.len();
        if block_count <= STEPS_UP_TO_BLOCKS {
            Run::merge_with::<true>(older, newer)
        } else {
            Run::merge_with::<false>(older, newer)
        }
    }

    fn merge_with<const STEPS: bool>(older: Run, newer: Run) -> Run {
        debug_assert!(older.min_offset < newer.min_offset);
        assert_eq!(older.blocks.len(), newer.blocks.len());
        assert!(!STEPS || (older.steps.len() == older.blocks.len() && newer.steps.len() == newer.blocks.len()));
        let block_count = older.blocks.len() + newer.blocks.len();
        let mut merged = Run {
            blocks: Vec::with_capacity(block_count),
            steps: Vec::with_capacity(if STEPS { block_count } else { 0 }),
            fences: Vec::with_capacity(block_count),
            min_offset: older.min_offset,
        };
        let mut left = Cursor::new(older.blocks, older.steps, 0);
        let mut right = Cursor::new(newer.blocks, newer.steps, 128);
        let mut block = Vec::with_capacity(BLOCK);
        let mut steps = Vec::with_capacity(if STEPS { BLOCK } else { 0 });
        loop {
            let room = BLOCK - block.len();
            match (left.rest(), right.rest()) {
                (Some(l), Some(r)) => {
                    let count = room.min(l.keys.len()).min(r.keys.len());
                    let (from_left, from_right) = merge_prefix::<STEPS>(l, r, count, &mut block, &mut steps);
                    left.position += from_left;
                    right.position += from_right;
                }
                (Some(_), None) => left.copy_into::<STEPS>(&mut block, &mut steps, room),
                (None, Some(_)) => right.copy_into::<STEPS>(&mut block, &mut steps, room),
                (None, None) => break,
            }
            if block.len() == BLOCK {
                let block = core::mem::replace(&mut block, Vec::with_capacity(BLOCK));
                let steps = STEPS.then(|| core::mem::replace(&mut steps, Vec::with_capacity(BLOCK)));
                merged.push(block, steps);
            }
        }
        // Both inputs are whole blocks, so the output is too; the spare
        // buffers allocated after the last push are dropped here.
        assert!(block.is_empty());
        assert_eq!(merged.blocks.len(), block_count);
        merged
    }

    fn push(&mut self, block: Vec<Hash>, steps: Option<Vec<u8>>) {
        debug_assert_eq!(block.len(), BLOCK);
        debug_assert!(self.blocks.last().is_none_or(|last| last[BLOCK - 1] <= block[0]));
        self.fences.push(block[0]);
        self.blocks.push(block.into_boxed_slice());
        if let Some(steps) = steps {
            debug_assert_eq!(steps.len(), BLOCK);
            self.steps.push(steps.into_boxed_slice());
        }
    }
}

/// The unread part of a merge input's current block: its keys, their
/// arrival steps, and what the merged run's steps add to them (halved).
#[derive(Clone, Copy)]
struct Side<'a> {
    keys: &'a [Hash],
    steps: &'a [u8],
    base: u8,
}

impl Side<'_> {
    /// The merged run's arrival step of the hash at `i`.
    fn step(&self, i: usize) -> u8 {
        self.base + (self.steps[i] >> 1)
    }
}

/// A read position in a sequence of blocks that frees each block once read.
struct Cursor {
    blocks: vec::IntoIter<Box<[Hash]>>,
    steps: vec::IntoIter<Box<[u8]>>,
    current: Box<[Hash]>,
    current_steps: Box<[u8]>,
    position: usize,
    base: u8,
}

impl Cursor {
    fn new(blocks: Vec<Box<[Hash]>>, steps: Vec<Box<[u8]>>, base: u8) -> Cursor {
        Cursor {
            blocks: blocks.into_iter(),
            steps: steps.into_iter(),
            current: Box::new([]),
            current_steps: Box::new([]),
            position: 0,
            base,
        }
    }

    /// The hashes of the current block not yet read, moving on to the next
    /// block when it is used up; `None` at the end.
    fn rest(&mut self) -> Option<Side<'_>> {
        if self.position == self.current.len() {
            // Assigning drops the consumed block: its memory is back before
            // the merge allocates its next output block.
            self.current = self.blocks.next().unwrap_or_default();
            self.current_steps = self.steps.next().unwrap_or_default();
            self.position = 0;
        }
        let side = self.side();
        (!side.keys.is_empty()).then_some(side)
    }

    fn side(&self) -> Side<'_> {
        // A run without steps, or one whose steps the merge drops, has none.
        let steps = self.current_steps.get(self.position..).unwrap_or_default();
        Side { keys: &self.current[self.position..], steps, base: self.base }
    }

    /// Appends up to `room` hashes of the current block to `out`, and with
    /// `STEPS` their merged steps to `out_steps`.
    fn copy_into<const STEPS: bool>(&mut self, out: &mut Vec<Hash>, out_steps: &mut Vec<u8>, room: usize) {
        let side = self.side();
        let count = room.min(side.keys.len());
        out.extend_from_slice(&side.keys[..count]);
        if STEPS {
            out_steps.extend((0..count).map(|i| side.step(i)));
        }
        self.position += count;
    }
}

/// Appends the `count` smallest hashes of the ascending `left` and `right`,
/// each at least `count` long, to `out` in order, and with `STEPS` their
/// merged arrival steps to `out_steps`, and answers how many came from each.
///
/// Neither input can run out within `count` steps, so the loop has no end
/// tests of its own, and which side to take is a data select rather than a
/// branch: on uniform hashes that branch would be mispredicted half the
/// time, which is what a merge of random keys spends most of its time on.
fn merge_prefix<const STEPS: bool>(
    left: Side<'_>,
    right: Side<'_>,
    count: usize,
    out: &mut Vec<Hash>,
    out_steps: &mut Vec<u8>,
) -> (usize, usize) {
    debug_assert!(count <= left.keys.len() && count <= right.keys.len() && out.len() + count <= out.capacity());
    let (mut i, mut j) = (0, 0);
    for _ in 0..count {
        let (l, r) = (left.keys[i], right.keys[j]);
        let take_left = l <= r;
        out.push(if take_left { l } else { r });
        if STEPS {
            out_steps.push(if take_left { left.step(i) } else { right.step(j) });
        }
        i += usize::from(take_left);
        j += usize::from(!take_left);
    }
    (i, j)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run of one block of `hashes`, in their arrival order, committed at
    /// offsets from `min_offset` on.
    fn sealed(hashes: Vec<Hash>, min_offset: Offset) -> Run {
        let mut keys = hashes;
        let mut arrivals: Vec<u16> = (0..keys.len() as u16).collect();
        crate::ring::sort::sort_with_payload(&mut keys, &mut arrivals);
        Run::single(keys.into_boxed_slice(), &arrivals, min_offset)
    }

    /// The floor `search` and `floor` answer for a hash the run holds.
    fn floor_of(run: &Run, hash: Hash) -> Offset {
        let mut floor = None;
        let search = run.search(hash, 0).expect("within the run");
        search::resolve(&mut [search], &mut Vec::new(), |hit, at| floor = Some(hit.floor(at)));
        floor.expect("found")
    }

    fn pseudo_random(seed: u64, n: usize) -> Vec<Hash> {
        let mut state = seed;
        (0..n)
            .map(|_| {
                state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                u128::from(state) << 64 | u128::from(state >> 7)
            })
            .collect()
    }

    #[test]
    fn single_block_membership() {
        let hashes = pseudo_random(1, BLOCK);
        let run = sealed(hashes.clone(), 0);
        assert!(hashes.iter().all(|&h| run.contains(h)));
        assert!(pseudo_random(2, 1_000).iter().all(|&h| !run.contains(h)));
        assert!(!run.contains(0) && !run.contains(u128::MAX));
        assert_eq!(run.len(), BLOCK);
    }

    #[test]
    fn merges_keep_every_hash_and_global_order() {
        let mut all = Vec::new();
        let mut runs: Vec<Run> = (0..4)
            .map(|seed| {
                let hashes = pseudo_random(seed + 10, BLOCK);
                all.extend_from_slice(&hashes);
                sealed(hashes, 100 + seed as Offset * BLOCK as Offset)
            })
            .collect();
        let d = runs.pop().unwrap();
        let c = runs.pop().unwrap();
        let b = runs.pop().unwrap();
        let a = runs.pop().unwrap();
        let merged = Run::merge(Run::merge(a, b), Run::merge(c, d));
        assert_eq!(merged.block_count(), 4);
        assert_eq!(merged.min_offset(), 100, "the oldest block's first offset");
        let flat: Vec<Hash> = merged.blocks.iter().flat_map(|b| b.iter().copied()).collect();
        assert!(flat.is_sorted());
        assert_eq!(merged.fences, merged.blocks.iter().map(|b| b[0]).collect::<Vec<_>>());
        assert!(all.iter().all(|&h| merged.contains(h)));
        assert!(pseudo_random(99, 2_000).iter().all(|&h| !merged.contains(h)));
    }

    #[test]
    fn a_found_hash_floors_at_its_arrival_step() {
        // One block: steps of 16 arrivals from the run's first offset.
        let hashes = pseudo_random(20, BLOCK);
        let run = sealed(hashes.clone(), 1_000);
        for arrival in [0, 1, 15, 16, 17, 2_000, BLOCK - 1] {
            assert_eq!(floor_of(&run, hashes[arrival]), 1_000 + (arrival as Offset & !15), "arrival {arrival}");
        }
        // Four blocks, merged twice: steps of 64 arrivals, counted across
        // the runs in the order they arrived.
        let all: Vec<Vec<Hash>> = (0..4).map(|seed| pseudo_random(seed + 30, BLOCK)).collect();
        let runs: Vec<Run> = all.iter().enumerate().map(|(i, h)| sealed(h.clone(), 5_000 + (i * BLOCK) as Offset)).collect();
        let [a, b, c, d]: [Run; 4] = runs.try_into().expect("four");
        let merged = Run::merge(Run::merge(a, b), Run::merge(c, d));
        for (block, arrival) in [(0, 0), (0, 63), (0, 64), (1, 100), (2, 4_000), (3, BLOCK - 1)] {
            let index = block * BLOCK + arrival;
            let expected = 5_000 + (index as Offset & !63);
            assert_eq!(floor_of(&merged, all[block][arrival]), expected, "block {block} arrival {arrival}");
        }
        // Holes in the offsets only make the floor lower than the hash's own.
        let gappy = Run::merge(sealed(all[0].clone(), 0), sealed(all[1].clone(), 1_000_000));
        assert_eq!(floor_of(&gappy, all[1][0]), BLOCK as Offset);
    }

    #[test]
    fn a_hash_that_starts_a_block_floors_at_its_arrival_step() {
        // The search lands on the block the hash starts; the block before
        // does not end with it, so this block holds its one occurrence.
        let all: Vec<Vec<Hash>> = (0..4).map(|seed| pseudo_random(seed + 60, BLOCK)).collect();
        let runs: Vec<Run> = all.iter().enumerate().map(|(i, h)| sealed(h.clone(), 5_000 + (i * BLOCK) as Offset)).collect();
        let [a, b, c, d]: [Run; 4] = runs.try_into().expect("four");
        let merged = Run::merge(Run::merge(a, b), Run::merge(c, d));
        for block in 1..merged.block_count() {
            let starts = merged.fences[block];
            let index = all.iter().flatten().position(|&h| h == starts).expect("held");
            assert_eq!(floor_of(&merged, starts), 5_000 + (index as Offset & !63), "block {block}");
        }
    }

    #[test]
    fn runs_larger_than_the_step_limit_floor_at_their_first_offset() {
        let mut runs: Vec<Run> = Vec::new();
        let all: Vec<Hash> = pseudo_random(50, BLOCK * 2 * STEPS_UP_TO_BLOCKS);
        for (i, block) in all.chunks(BLOCK).enumerate() {
            runs.push(sealed(block.to_vec(), 7 + (i * BLOCK) as Offset));
            // The binary counter, as a generation carries it.
            while let [.., older, newer] = runs.as_slice()
                && older.block_count() == newer.block_count()
            {
                let newer = runs.pop().expect("two");
                let older = runs.pop().expect("two");
                runs.push(Run::merge(older, newer));
            }
            let last = runs.last().expect("one");
            assert_eq!(last.steps.is_empty(), last.block_count() > STEPS_UP_TO_BLOCKS);
        }
        let [run] = runs.try_into().expect("one run");
        assert_eq!(run.block_count(), 2 * STEPS_UP_TO_BLOCKS);
        assert_eq!(run.bytes(), run.len() * size_of::<Hash>(), "no steps accounted");
        assert!(all.iter().step_by(101).all(|&h| floor_of(&run, h) == 7));
    }

    #[test]
    fn a_repeated_hash_floors_at_its_oldest_arrival() {
        let mut hashes = pseudo_random(40, BLOCK);
        let repeated = hashes[3_000];
        hashes[100] = repeated;
        hashes[2_000] = repeated;
        let run = sealed(hashes, 0);
        assert_eq!(floor_of(&run, repeated), 96);
        // Repeats that may begin in the block before: the run's first offset.
        let repeated = 1u128 << 100;
        let mut first = pseudo_random(41, BLOCK);
        first[4_000] = repeated;
        first.iter_mut().take(2_100).skip(2_000).for_each(|h| *h = repeated + 1);
        let second = vec![repeated; BLOCK];
        let merged = Run::merge(sealed(first, 10), sealed(second, 10 + BLOCK as Offset));
        assert_eq!(floor_of(&merged, repeated), 10);
    }

    #[test]
    fn repeats_spanning_block_boundaries_are_found() {
        // Two blocks made mostly of one hash: after merging, the repeat spans
        // the boundary and appears as a fence.
        let repeated = 1u128 << 100;
        let mut first = vec![repeated; BLOCK];
        first[0] = 5;
        let mut second = vec![repeated; BLOCK];
        second[BLOCK - 1] = u128::MAX;
        let merged = Run::merge(sealed(first, 0), sealed(second, BLOCK as Offset));
        assert!(merged.contains(5) && merged.contains(repeated) && merged.contains(u128::MAX));
        assert!(!merged.contains(6) && !merged.contains(repeated + 1) && !merged.contains(0));
    }

    #[test]
    #[should_panic(expected = "assertion")]
    fn a_partial_block_is_refused() {
        let _ = sealed(pseudo_random(3, BLOCK - 1), 0);
    }
}
