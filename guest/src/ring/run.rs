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

use alloc::boxed::Box;
use alloc::vec;
use alloc::vec::Vec;

use super::search::{self, Search};
use crate::api::Offset;
use crate::hash::Hash;

/// Hashes per sealed block: 64 KiB, the largest allocation the exact ring
/// ever makes.
pub const BLOCK: usize = 4_096;

/// An ascending sequence of hashes held in sealed blocks.
#[derive(Debug)]
pub struct Run {
    blocks: Vec<Box<[Hash]>>,
    /// `fences[i]` is the first hash of `blocks[i]`.
    fences: Vec<Hash>,
    /// The lowest offset of any hash in the run. A run holds the hashes of
    /// consecutive arrivals, so this bounds where any of them was committed.
    min_offset: Offset,
}

impl Run {
    /// A run of one sealed block, which must be sorted and full, of hashes
    /// committed at offsets from `min_offset` on.
    pub fn single(block: Box<[Hash]>, min_offset: Offset) -> Run {
        assert_eq!(block.len(), BLOCK);
        debug_assert!(block.is_sorted());
        Run { fences: vec![block[0]], blocks: vec![block], min_offset }
    }

    pub fn block_count(&self) -> usize {
        self.blocks.len()
    }

    pub fn len(&self) -> usize {
        self.blocks.len() * BLOCK
    }

    pub fn min_offset(&self) -> Offset {
        self.min_offset
    }

    #[cfg(test)]
    pub fn contains(&self, hash: Hash) -> bool {
        let mut found = false;
        if let Some(search) = self.search(hash, ()) {
            search::resolve(&mut [search], &mut Vec::new(), |_| found = true);
        }
        found
    }

    /// The search for a hash in the one block that can hold it, or `None`
    /// when the hash lies below the whole run. The fences bound the block's
    /// keys for the interpolation: its own below, the next one's above.
    pub fn search<Tag: Copy>(&self, hash: Hash, tag: Tag) -> Option<Search<'_, Tag>> {
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
        Some(Search::new(&self.blocks[block], self.fences[block], high_key, hash, tag))
    }

    /// Merges two runs into one, streaming block by block.
    pub fn merge(older: Run, newer: Run) -> Run {
        debug_assert!(older.min_offset < newer.min_offset);
        let block_count = older.blocks.len() + newer.blocks.len();
        let mut merged = Run {
            blocks: Vec::with_capacity(block_count),
            fences: Vec::with_capacity(block_count),
            min_offset: older.min_offset,
        };
        let mut left = Cursor::new(older.blocks);
        let mut right = Cursor::new(newer.blocks);
        let mut block = Vec::with_capacity(BLOCK);
        loop {
            let room = BLOCK - block.len();
            match (left.rest(), right.rest()) {
                (Some(l), Some(r)) => {
                    let (from_left, from_right) = merge_prefix(l, r, room.min(l.len()).min(r.len()), &mut block);
                    left.position += from_left;
                    right.position += from_right;
                }
                (Some(_), None) => left.copy_into(&mut block, room),
                (None, Some(_)) => right.copy_into(&mut block, room),
                (None, None) => break,
            }
            if block.len() == BLOCK {
                merged.push(core::mem::replace(&mut block, Vec::with_capacity(BLOCK)));
            }
        }
        // Both inputs are whole blocks, so the output is too; the spare
        // buffer allocated after the last push is dropped here.
        assert!(block.is_empty());
        assert_eq!(merged.blocks.len(), block_count);
        merged
    }

    fn push(&mut self, block: Vec<Hash>) {
        debug_assert_eq!(block.len(), BLOCK);
        debug_assert!(self.blocks.last().is_none_or(|last| last[BLOCK - 1] <= block[0]));
        self.fences.push(block[0]);
        self.blocks.push(block.into_boxed_slice());
    }
}

/// A read position in a sequence of blocks that frees each block once read.
struct Cursor {
    blocks: vec::IntoIter<Box<[Hash]>>,
    current: Box<[Hash]>,
    position: usize,
}

impl Cursor {
    fn new(blocks: Vec<Box<[Hash]>>) -> Cursor {
        Cursor { blocks: blocks.into_iter(), current: Box::new([]), position: 0 }
    }

    /// The hashes of the current block not yet read, moving on to the next
    /// block when it is used up; `None` at the end.
    fn rest(&mut self) -> Option<&[Hash]> {
        if self.position == self.current.len() {
            // Assigning drops the consumed block: its memory is back before
            // the merge allocates its next output block.
            self.current = self.blocks.next().unwrap_or_default();
            self.position = 0;
        }
        let rest = &self.current[self.position..];
        (!rest.is_empty()).then_some(rest)
    }

    /// Appends up to `room` hashes of the current block to `out`.
    fn copy_into(&mut self, out: &mut Vec<Hash>, room: usize) {
        let rest = &self.current[self.position..];
        let count = room.min(rest.len());
        out.extend_from_slice(&rest[..count]);
        self.position += count;
    }
}

/// Appends the `count` smallest hashes of the ascending `left` and `right`,
/// each at least `count` long, to `out` in order, and answers how many came
/// from each.
///
/// Neither input can run out within `count` steps, so the loop has no end
/// tests of its own, and which side to take is a data select rather than a
/// branch: on uniform hashes that branch would be mispredicted half the
/// time, which is what a merge of random keys spends most of its time on.
fn merge_prefix(left: &[Hash], right: &[Hash], count: usize, out: &mut Vec<Hash>) -> (usize, usize) {
    debug_assert!(count <= left.len() && count <= right.len() && out.len() + count <= out.capacity());
    let (mut i, mut j) = (0, 0);
    for _ in 0..count {
        let (l, r) = (left[i], right[j]);
        let take_left = l <= r;
        out.push(if take_left { l } else { r });
        i += usize::from(take_left);
        j += usize::from(!take_left);
    }
    (i, j)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block_from(mut hashes: Vec<Hash>) -> Box<[Hash]> {
        hashes.sort_unstable();
        hashes.into_boxed_slice()
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
        let run = Run::single(block_from(hashes.clone()), 0);
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
                Run::single(block_from(hashes), 100 + seed as Offset * BLOCK as Offset)
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
    fn repeats_spanning_block_boundaries_are_found() {
        // Two blocks made mostly of one hash: after merging, the repeat spans
        // the boundary and appears as a fence.
        let repeated = 1u128 << 100;
        let mut first = vec![repeated; BLOCK];
        first[0] = 5;
        let mut second = vec![repeated; BLOCK];
        second[BLOCK - 1] = u128::MAX;
        let merged = Run::merge(Run::single(block_from(first), 0), Run::single(block_from(second), BLOCK as Offset));
        assert!(merged.contains(5) && merged.contains(repeated) && merged.contains(u128::MAX));
        assert!(!merged.contains(6) && !merged.contains(repeated + 1) && !merged.contains(0));
    }

    #[test]
    #[should_panic(expected = "assertion")]
    fn a_partial_block_is_refused() {
        let _ = Run::single(block_from(pseudo_random(3, BLOCK - 1)), 0);
    }
}
