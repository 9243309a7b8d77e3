//! Sorting hashes, with their arrival positions: one pass that distributes
//! them by their top bits, then a small sort of each bucket.
//!
//! The hashes are uniform, so distributing `n` of them over about `n / 2`
//! buckets by their leading bits leaves about two per bucket, and the
//! comparison sorts that remain are tiny: about one comparison per hash
//! instead of the twelve of a comparison sort of a whole 4,096-hash block,
//! many of them mispredicted. Keys a host makes up may all land in one
//! bucket; that bucket then gets the comparison sort of the whole, so the
//! result is always sorted and never slower than a plain sort by more than
//! the distribution pass.

use alloc::vec;
use alloc::vec::Vec;

use crate::hash::Hash;

/// The widest distribution: 2,048 buckets, an 8 KiB count table.
const MAX_BUCKET_BITS: u32 = 11;

/// Hashes per bucket the distribution aims at. With two, most buckets hold
/// zero to three hashes and their sorts are a compare or two; eight left an
/// insertion sort of eight random keys per bucket, mispredicted throughout.
const PER_BUCKET: usize = 2;

/// Sorts `keys` ascending and records where each came from: afterwards
/// `arrival[j]` is the position `keys[j]` held before the sort, and equal
/// keys keep their order (a stable sort). For the hot buffer's chunks, at
/// most 256 keys.
///
/// The distribution pass, carrying the positions along; the
/// buckets, about two keys each on uniform keys, are finished by insertion.
/// Keys a host makes up may crowd one bucket, which then costs up to the
/// square of the chunk: bounded, as the chunk is.
pub fn sort_with_arrival(keys: &mut [Hash], arrival: &mut [u8]) {
    let n = keys.len();
    assert!(n <= 256 && arrival.len() == n);
    let mut sorted = [(0 as Hash, 0u8); 256];
    let arrivals = keys.iter().enumerate().map(|(position, &key)| (key, position as u8));
    distribute(arrivals, |&(key, _)| key, &mut sorted[..n], insertion_sort);
    for (j, &(key, position)) in sorted[..n].iter().enumerate() {
        keys[j] = key;
        arrival[j] = position;
    }
}

/// Sorts `keys` ascending and moves each `payload[i]` along with `keys[i]`;
/// equal keys may end up in any order. For a sealed block, with each hash's
/// arrival index as its payload.
///
/// The distribution pass over positions instead of keys, then one
/// gather of each: besides a position per key, it allocates one copy of the
/// keys (one block, for a block) and one of the payloads.
pub fn sort_with_payload<T: Copy>(keys: &mut [Hash], payload: &mut [T]) {
    let n = keys.len();
    assert!(n <= 1 << 16 && payload.len() == n);
    let mut order: Vec<u16> = vec![0; n];
    {
        let keys = &*keys;
        let key = |&i: &u16| keys[usize::from(i)];
        distribute((0..n).map(|i| i as u16), key, &mut order, |bucket| bucket.sort_unstable_by_key(key));
    }
    let sorted: Vec<Hash> = order.iter().map(|&i| keys[usize::from(i)]).collect();
    let moved: Vec<T> = order.iter().map(|&i| payload[usize::from(i)]).collect();
    keys.copy_from_slice(&sorted);
    payload.copy_from_slice(&moved);
}

/// The pass the sorts share: scatters `items` into `out` (as long as they
/// are) by the leading bits of their keys, about [`PER_BUCKET`] to a bucket,
/// keeping their order within a bucket, and hands each bucket to `finish`.
fn distribute<T: Copy>(
    items: impl Iterator<Item = T> + Clone,
    key: impl Fn(&T) -> Hash,
    out: &mut [T],
    mut finish: impl FnMut(&mut [T]),
) {
    let n = out.len();
    let bits = (n / PER_BUCKET).max(1).ilog2().min(MAX_BUCKET_BITS);
    let bucket = |item: &T| if bits == 0 { 0 } else { (key(item) >> (Hash::BITS - bits)) as usize };
    // `starts[b]` becomes the first slot of bucket `b`, `starts[b + 1]` its end.
    let mut starts = [0u32; (1 << MAX_BUCKET_BITS) + 1];
    let starts = &mut starts[..(1 << bits) + 1];
    for item in items.clone() {
        starts[bucket(&item) + 1] += 1;
    }
    for b in 1..starts.len() {
        starts[b] += starts[b - 1];
    }
    debug_assert_eq!(starts[starts.len() - 1] as usize, n);
    let mut next = [0u32; 1 << MAX_BUCKET_BITS];
    let next = &mut next[..1 << bits];
    next.copy_from_slice(&starts[..1 << bits]);
    for item in items {
        let slot = &mut next[bucket(&item)];
        out[*slot as usize] = item;
        *slot += 1;
    }
    for range in starts.windows(2) {
        finish(&mut out[range[0] as usize..range[1] as usize]);
    }
}

/// Sorts by key, and among equal keys by position: stable, since the
/// distribution pass keeps arrival order within a bucket.
fn insertion_sort(pairs: &mut [(Hash, u8)]) {
    for i in 1..pairs.len() {
        let mut j = i;
        while j > 0 && pairs[j - 1].0 > pairs[j].0 {
            pairs.swap(j - 1, j);
            j -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::hash::test_hashes as uniform;

    fn sorts_like_the_standard_sort(keys: Vec<Hash>) {
        let mut expected = keys.clone();
        expected.sort_unstable();
        let mut keys = keys;
        let mut payload = vec![(); keys.len()];
        sort_with_payload(&mut keys, &mut payload);
        assert_eq!(keys, expected);
    }

    #[test]
    fn sorts_uniform_hashes_of_every_size() {
        for n in [0, 1, 2, 63, 64, 65, 256, 1_000, 4_096, 20_000] {
            sorts_like_the_standard_sort(uniform(n as u64, n));
        }
    }

    fn sorts_with_arrival_like_a_stable_sort(keys: Vec<Hash>) {
        let mut expected: Vec<(Hash, u8)> = keys.iter().enumerate().map(|(i, &key)| (key, i as u8)).collect();
        expected.sort();
        let mut sorted = keys.clone();
        let mut arrival = vec![0u8; keys.len()];
        sort_with_arrival(&mut sorted, &mut arrival);
        let got: Vec<(Hash, u8)> = sorted.into_iter().zip(arrival).collect();
        assert_eq!(got, expected);
    }

    #[test]
    fn sorts_chunks_with_their_arrival_order() {
        for n in [0, 1, 2, 3, 64, 255, 256] {
            sorts_with_arrival_like_a_stable_sort(uniform(n as u64 + 40, n));
        }
        sorts_with_arrival_like_a_stable_sort((0..256u128).rev().collect());
        sorts_with_arrival_like_a_stable_sort(vec![7; 256]);
        let mut mixed = uniform(5, 200);
        mixed.extend(core::iter::repeat_n(mixed[3], 30));
        mixed.extend((0..26u128).map(|i| i << 120));
        sorts_with_arrival_like_a_stable_sort(mixed);
    }

    fn sorts_with_payload_like_the_standard_sort(keys: Vec<Hash>) {
        let mut expected: Vec<(Hash, u16)> = keys.iter().enumerate().map(|(i, &key)| (key, i as u16)).collect();
        expected.sort();
        let mut sorted = keys.clone();
        let mut payload: Vec<u16> = (0..keys.len() as u16).collect();
        sort_with_payload(&mut sorted, &mut payload);
        let mut got: Vec<(Hash, u16)> = sorted.into_iter().zip(payload).collect();
        assert!(got.is_sorted_by_key(|&(key, _)| key));
        // Equal keys in any order, each with its own payload.
        got.sort();
        assert_eq!(got, expected);
    }

    #[test]
    fn sorts_blocks_with_their_payloads() {
        for n in [0, 1, 2, 63, 64, 1_000, 4_096] {
            sorts_with_payload_like_the_standard_sort(uniform(n as u64 + 70, n));
        }
        sorts_with_payload_like_the_standard_sort((0..4_096u128).rev().collect());
        let mut mixed = uniform(6, 3_000);
        mixed.extend(core::iter::repeat_n(mixed[9], 96));
        mixed.extend((0..1_000u128).map(|i| i << 100));
        sorts_with_payload_like_the_standard_sort(mixed);
    }

    #[test]
    fn sorts_skewed_and_repeated_keys() {
        sorts_like_the_standard_sort((0..4_096u128).rev().collect());
        sorts_like_the_standard_sort(vec![7; 300]);
        let mut mixed = uniform(3, 2_000);
        mixed.extend(core::iter::repeat_n(u128::MAX, 500));
        mixed.extend((0..500u128).map(|i| i << 100));
        sorts_like_the_standard_sort(mixed);
    }
}
