//! A message's identity inside the cache: its 16-byte big-endian xxh3-128,
//! held as a `u128` so that integer order equals PostgreSQL's byte order.
//!
//! Hashes cross the host boundary as one flat byte list. A list whose length is
//! not a multiple of [`HASH_LEN`] is malformed input from a host, never a
//! reason to panic: the decoders here answer `None` and each caller degrades on
//! the safe side (a plan answers -1, a commit marks its entry for rebuild, a
//! hydration is refused).

use alloc::vec::Vec;

/// Bytes per hash on the wire.
pub const HASH_LEN: usize = 16;

/// One message hash.
pub type Hash = u128;

/// The number of hashes in a flat list, or `None` when the list is malformed.
pub fn count(bytes: &[u8]) -> Option<usize> {
    if bytes.len().is_multiple_of(HASH_LEN) { Some(bytes.len() / HASH_LEN) } else { None }
}

/// The hashes of a flat list in order, or `None` when the list is malformed.
pub fn iter(bytes: &[u8]) -> Option<impl ExactSizeIterator<Item = Hash> + '_> {
    let (chunks, rest) = bytes.as_chunks::<HASH_LEN>();
    if rest.is_empty() { Some(chunks.iter().map(|chunk| Hash::from_be_bytes(*chunk))) } else { None }
}

/// Decodes a flat list into `out` (cleared first). Answers `false`, leaving
/// `out` empty, when the list is malformed.
pub fn decode_into(bytes: &[u8], out: &mut Vec<Hash>) -> bool {
    out.clear();
    match iter(bytes) {
        Some(hashes) => {
            out.extend(hashes);
            true
        }
        None => false,
    }
}

/// Encodes hashes as one flat big-endian list, the inverse of [`iter`]. Only
/// tests need it: the cache never sends hashes back.
#[cfg(any(test, feature = "testing"))]
pub fn encode(hashes: &[Hash]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(hashes.len() * HASH_LEN);
    for hash in hashes {
        bytes.extend_from_slice(&hash.to_be_bytes());
    }
    bytes
}

/// `n` deterministic, uniformly spread hashes for the unit tests (a linear
/// congruential stream, its state folded and rotated into both halves).
#[cfg(test)]
pub fn test_hashes(seed: u64, n: usize) -> Vec<Hash> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            u128::from(state ^ (state >> 31)) << 64 | u128::from(state.rotate_left(41))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    #[test]
    fn integer_order_is_byte_order() {
        // PostgreSQL compares bytea bytewise; u128 from big-endian bytes must
        // order the same way, or fence-key searches would disagree with SQL.
        let low = [0u8; 16];
        let mut high = [0u8; 16];
        high[0] = 1;
        let mut lower_tail = [0xffu8; 16];
        lower_tail[0] = 0;
        let decoded: Vec<Hash> = iter(&[low, lower_tail, high].concat()).unwrap().collect();
        assert!(decoded[0] < decoded[1] && decoded[1] < decoded[2]);
        assert_eq!(decoded[2], 1u128 << 120);
    }

    #[test]
    fn round_trip() {
        let hashes = vec![0, 1, u128::MAX, 0x0123_4567_89ab_cdef_0011_2233_4455_6677];
        let bytes = encode(&hashes);
        assert_eq!(bytes.len(), hashes.len() * HASH_LEN);
        assert_eq!(count(&bytes), Some(hashes.len()));
        let mut out = Vec::new();
        assert!(decode_into(&bytes, &mut out));
        assert_eq!(out, hashes);
    }

    #[test]
    fn malformed_lengths_are_refused_without_panic() {
        let mut out = vec![7];
        for len in [1, 15, 17, 31, 33] {
            let bytes = vec![0u8; len];
            assert_eq!(count(&bytes), None);
            assert!(iter(&bytes).is_none());
            assert!(!decode_into(&bytes, &mut out));
            assert!(out.is_empty());
        }
        assert_eq!(count(&[]), Some(0));
        assert!(decode_into(&[], &mut out));
        assert!(out.is_empty());
    }
}
