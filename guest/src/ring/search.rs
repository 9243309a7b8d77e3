//! Searching sorted hashes by interpolation.
//!
//! The hashes are xxh3-128 output, uniform over the whole `u128` range, so a
//! hash's rank among `n` sorted ones is predictable from its value to within
//! about `√n / 2`. A binary search of a 64 KiB block takes twelve dependent
//! steps, about half of them cache misses; interpolating takes two or three
//! for uniform keys. Keys a host makes up need not be uniform, so the
//! interpolation is capped at [`INTERPOLATIONS`] steps and a binary search
//! finishes whatever range is left: the search is never worse than
//! logarithmic and always exact.
//!
//! A block search is a chain of cache misses that depend on one another, so
//! one search at a time leaves the memory system idle between them. The
//! searches of a whole flush therefore advance in lockstep ([`resolve`]):
//! each round takes one step of every pending [`Search`], and those steps'
//! loads are independent, so the core overlaps their misses, in WebAssembly
//! as natively.

use alloc::vec::Vec;

use crate::fetch::fetch;
use crate::hash::Hash;

/// The most interpolation steps before the binary search takes over.
const INTERPOLATIONS: usize = 4;

/// Hashes per 64-byte cache line.
const KEYS_PER_LINE: usize = 64 / size_of::<Hash>();

/// Ranges at most this long are binary-searched at once: their keys span a
/// cache line or two, so a guess saves nothing.
const SHORT: usize = 8;

/// How many of the ascending `keys` are below `hash` (where a binary search
/// by `<` would stop).
pub fn lower_bound(keys: &[Hash], hash: Hash) -> usize {
    debug_assert!(u32::try_from(keys.len()).is_ok());
    // Invariant: every key before `low` is below the hash, and none from
    // `high` on is.
    let (mut low, mut high) = (0, keys.len());
    for _ in 0..INTERPOLATIONS {
        if high - low <= SHORT {
            break;
        }
        let (first, last) = (keys[low], keys[high - 1]);
        if hash <= first {
            return low;
        }
        if hash > last {
            return high;
        }
        // `first < hash <= last`: the answer lies in `low + 1..high`.
        let guess = low + 1 + scaled(hash - first - 1, last - first, high - low - 2);
        debug_assert!(low < guess && guess < high);
        if keys[guess] < hash {
            low = guess + 1;
        } else {
            high = guess;
        }
    }
    low + keys[low..high].partition_point(|&key| key < hash)
}

/// How many of the ascending `keys` are at or below `hash`.
pub fn upper_bound(keys: &[Hash], hash: Hash) -> usize {
    match hash.checked_add(1) {
        Some(next) => lower_bound(keys, next),
        None => keys.len(),
    }
}

/// Whether the ascending `keys` hold `hash`.
#[cfg(test)]
pub fn contains(keys: &[Hash], hash: Hash) -> bool {
    keys.get(lower_bound(keys, hash)) == Some(&hash)
}

/// One pending search for a hash in a sorted block, with bounds on the keys
/// left to search so that every step interpolates without extra loads.
/// `Tag` is the caller's name for it.
#[derive(Clone, Copy, Debug)]
pub struct Search<'a, Tag> {
    keys: &'a [Hash],
    hash: Hash,
    /// Every key before `low` is below the hash; none from `high` on is.
    low: usize,
    high: usize,
    /// At or below every key of `keys[low..high]`.
    low_key: Hash,
    /// At or above every key of `keys[low..high]`.
    high_key: Hash,
    /// The caller's name for the search, handed back when it finds the hash.
    tag: Tag,
}

impl<'a, Tag: Copy> Search<'a, Tag> {
    /// A search for `hash` in the ascending `keys`, all of which lie in
    /// `low_key..=high_key` (for a block of a run: its fence and the next
    /// block's).
    pub fn new(keys: &'a [Hash], low_key: Hash, high_key: Hash, hash: Hash, tag: Tag) -> Search<'a, Tag> {
        debug_assert!(u32::try_from(keys.len()).is_ok());
        debug_assert!(keys.first().is_none_or(|&first| low_key <= first));
        debug_assert!(keys.last().is_none_or(|&last| last <= high_key));
        Search { keys, hash, low: 0, high: keys.len(), low_key, high_key, tag }
    }

    /// Where the next interpolation step looks, or `None` once interpolating
    /// no longer pays (the range is short) or the answer is known.
    fn guess(&self) -> Option<usize> {
        let Search { hash, low, high, low_key, high_key, .. } = *self;
        if high - low <= SHORT || hash < low_key || hash > high_key {
            return None;
        }
        let guess = low + scaled(hash - low_key, high_key - low_key, high - low - 1);
        debug_assert!(low <= guess && guess < high);
        Some(guess)
    }

    /// Narrows the range by the key at `guess`, from [`Search::guess`].
    fn narrow(&mut self, guess: usize) {
        let key = self.keys[guess];
        if key < self.hash {
            (self.low, self.low_key) = (guess + 1, key);
        } else {
            (self.high, self.high_key) = (guess, key);
        }
    }

    /// Fetches the key at `guess` and the lines on either side of it: on
    /// uniform keys the next guess, from a bound this close, usually lands
    /// within a line of this one, so the next round finds its key in cache.
    fn fetch_around(&self, guess: usize) {
        fetch(&self.keys[guess]);
        for neighbour in [guess.wrapping_sub(KEYS_PER_LINE), guess + KEYS_PER_LINE] {
            if (self.low..self.high).contains(&neighbour) {
                fetch(&self.keys[neighbour]);
            }
        }
    }

    /// Fetches the keys [`Search::found`] will read.
    fn fetch_rest(&self) {
        if let Some(first) = self.keys.get(self.low) {
            fetch(first);
        }
        if let Some(last) = self.keys.get(self.high) {
            fetch(last);
        }
    }

    /// Where the block holds the hash, if it does, searching what is left.
    fn found(&self) -> Option<usize> {
        let at = self.low + self.keys[self.low..self.high].partition_point(|&key| key < self.hash);
        (self.keys.get(at) == Some(&self.hash)).then_some(at)
    }
}

/// Runs every search to its end, in lockstep, and calls `found` with the tag
/// of each that finds its hash and the position in its keys it found it at.
///
/// Each round first works out every search's next key and fetches it, then
/// narrows every search by its key; so one round costs about one cache miss,
/// not one per search. `guesses` is scratch space.
pub fn resolve<Tag: Copy>(searches: &mut [Search<'_, Tag>], guesses: &mut Vec<Option<usize>>, mut found: impl FnMut(Tag, usize)) {
    for _ in 0..INTERPOLATIONS {
        guesses.clear();
        guesses.extend(searches.iter().map(Search::guess));
        if guesses.iter().all(Option::is_none) {
            break;
        }
        for (search, guess) in searches.iter().zip(guesses.iter()) {
            if let Some(guess) = *guess {
                search.fetch_around(guess);
            }
        }
        for (search, guess) in searches.iter_mut().zip(guesses.iter()) {
            if let Some(guess) = *guess {
                search.narrow(guess);
            }
        }
    }
    searches.iter().for_each(Search::fetch_rest);
    for search in searches.iter() {
        if let Some(at) = search.found() {
            found(search.tag, at);
        }
    }
}

/// `part / whole × width`, rounded down, for `part <= whole`: computed on
/// the top 32 significant bits of `whole`, so that the product fits in a
/// `u64`.
fn scaled(part: Hash, whole: Hash, width: usize) -> usize {
    debug_assert!(part <= whole);
    let shift = (128 - whole.leading_zeros()).saturating_sub(32);
    let (part, whole) = ((part >> shift) as u64, (whole >> shift) as u64);
    let scaled = part * width as u64 / whole.max(1);
    debug_assert!(scaled <= width as u64);
    scaled as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;

    fn uniform(seed: u64, n: usize) -> Vec<Hash> {
        let mut state = seed;
        let mut keys: Vec<Hash> = (0..n)
            .map(|_| {
                state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                u128::from(state ^ (state >> 29)) << 64 | u128::from(state.rotate_left(23))
            })
            .collect();
        keys.sort_unstable();
        keys
    }

    fn agrees_with_binary_search(keys: &[Hash], probes: impl IntoIterator<Item = Hash>) {
        for hash in probes {
            assert_eq!(lower_bound(keys, hash), keys.partition_point(|&key| key < hash), "{hash:#x}");
            assert_eq!(upper_bound(keys, hash), keys.partition_point(|&key| key <= hash), "{hash:#x}");
            assert_eq!(contains(keys, hash), keys.binary_search(&hash).is_ok());
        }
    }

    #[test]
    fn finds_every_key_and_ranks_strangers_among_uniform_keys() {
        for n in [0, 1, 2, 9, 100, 4_096] {
            let keys = uniform(n as u64, n);
            agrees_with_binary_search(&keys, keys.iter().copied());
            agrees_with_binary_search(&keys, keys.iter().flat_map(|&key| [key.wrapping_sub(1), key.wrapping_add(1)]));
            agrees_with_binary_search(&keys, uniform(99, 500));
            agrees_with_binary_search(&keys, [0, 1, u128::MAX, u128::MAX - 1]);
        }
    }

    /// Resolves one search per probe in a single lockstep batch and checks
    /// each answer against a binary search.
    fn resolve_agrees(keys: &[Hash], low_key: Hash, high_key: Hash, probes: &[Hash]) {
        let mut searches: Vec<Search<'_, usize>> =
            probes.iter().enumerate().map(|(tag, &hash)| Search::new(keys, low_key, high_key, hash, tag)).collect();
        let mut found = Vec::new();
        resolve(&mut searches, &mut Vec::new(), |tag, at| {
            assert_eq!(keys[at], probes[tag], "the position found holds the hash");
            found.push(tag);
        });
        let expected: Vec<usize> = (0..probes.len()).filter(|&i| keys.binary_search(&probes[i]).is_ok()).collect();
        assert_eq!(found, expected);
    }

    #[test]
    fn lockstep_searches_agree_with_binary_search() {
        for n in [0, 1, 2, 9, 100, 4_096] {
            let keys = uniform(n as u64 + 50, n);
            let mut probes: Vec<Hash> = keys.iter().flat_map(|&key| [key, key.wrapping_add(1), key.wrapping_sub(1)]).collect();
            probes.extend(uniform(7, 300));
            probes.extend([0, u128::MAX]);
            resolve_agrees(&keys, 0, u128::MAX, &probes);
            // Tight bounds, as a run's fences give them.
            if let (Some(&first), Some(&last)) = (keys.first(), keys.last()) {
                resolve_agrees(&keys, first, last, &probes);
            }
        }
        let mut skewed: Vec<Hash> = (0..3_000u128).map(|i| i * i * i).collect();
        skewed.extend(core::iter::repeat_n(1u128 << 90, 700));
        skewed.sort_unstable();
        let probes: Vec<Hash> = skewed.iter().flat_map(|&key| [key, key + 1, key.saturating_sub(1)]).collect();
        resolve_agrees(&skewed, 0, u128::MAX, &probes);
        resolve_agrees(&[5; 40], 5, 5, &[4, 5, 6]);
    }

    #[test]
    fn skewed_and_repeated_keys_are_still_found() {
        // Small integers, a cluster at the top, long runs of one key: the
        // interpolation guesses badly and the binary search must recover.
        let mut keys: Vec<Hash> = (0..3_000u128).map(|i| i * i).collect();
        keys.extend((0..500u128).map(|i| u128::MAX - 1_000 + i));
        keys.extend(core::iter::repeat_n(1u128 << 100, 600));
        keys.sort_unstable();
        let probes: Vec<Hash> = keys.iter().flat_map(|&key| [key, key + 1, key.saturating_sub(1)]).collect();
        agrees_with_binary_search(&keys, probes);
        let same = [7u128; 50];
        agrees_with_binary_search(&same, [6, 7, 8]);
    }
}
