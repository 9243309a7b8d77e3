//! Owned forms of the calls' borrowed arguments: a [`Segment`], a [`Commit`],
//! a [`TxnsRow`] and a [`Hydration`] that hold their own hashes, for a host
//! that keeps them past the call that made them (the gateway between a
//! bundle's answer and the cache, a trace between a recording and a replay).
//!
//! Each converts from its borrowed form with `of` and lends one with
//! `borrow` (a hydration, whose rows must live somewhere while it is lent,
//! with [`OwnedHydration::with`]). With the `serde` feature, each reads and
//! writes itself in the WIT's kebab-case names, hashes as one 32-digit hex
//! string each.

use alloc::vec::Vec;

use crate::api::{Commit, Hydration, Millis, Offset, PartitionId, Segment, TxnsRow};

/// A [`Segment`] that owns its hashes (16 bytes each, concatenated).
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(rename_all = "kebab-case"))]
pub struct OwnedSegment {
    pub partition: PartitionId,
    pub window_ms: u64,
    #[cfg_attr(feature = "serde", serde(with = "hex_hashes"))]
    pub hashes: Vec<u8>,
}

/// A [`Commit`] that owns its hashes.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(rename_all = "kebab-case"))]
pub struct OwnedCommit {
    pub partition: PartitionId,
    pub base_offset: Offset,
    /// When the segment was committed, in ms since the epoch, rounded up.
    pub created_ms: Millis,
    /// The stored messages' hashes, in offset order.
    #[cfg_attr(feature = "serde", serde(with = "hex_hashes"))]
    pub hashes: Vec<u8>,
}

/// A [`TxnsRow`] (one log row's hashes) that owns its hashes.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(rename_all = "kebab-case"))]
pub struct OwnedRow {
    pub base_offset: Offset,
    /// The row's last offset, inclusive.
    pub end_offset: Offset,
    pub created_ms: Millis,
    /// 16 bytes per offset, in offset order.
    #[cfg_attr(feature = "serde", serde(with = "hex_hashes"))]
    pub hashes: Vec<u8>,
}

/// A [`Hydration`] that owns its rows.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize), serde(rename_all = "kebab-case"))]
pub struct OwnedHydration {
    pub partition: PartitionId,
    pub window_ms: u64,
    pub last_offset: Offset,
    pub rows: Vec<OwnedRow>,
}

impl OwnedSegment {
    /// A copy of a borrowed segment.
    pub fn of(segment: &Segment<'_>) -> OwnedSegment {
        OwnedSegment { partition: segment.partition, window_ms: segment.window_ms, hashes: segment.hashes.to_vec() }
    }

    /// The borrowed form every [`crate::DedupCache`] takes.
    pub fn borrow(&self) -> Segment<'_> {
        Segment { partition: self.partition, window_ms: self.window_ms, hashes: &self.hashes }
    }
}

impl OwnedCommit {
    /// A copy of a borrowed commit.
    pub fn of(commit: &Commit<'_>) -> OwnedCommit {
        OwnedCommit {
            partition: commit.partition,
            base_offset: commit.base_offset,
            created_ms: commit.created_ms,
            hashes: commit.hashes.to_vec(),
        }
    }

    /// The borrowed form every [`crate::DedupCache`] takes.
    pub fn borrow(&self) -> Commit<'_> {
        Commit { partition: self.partition, base_offset: self.base_offset, created_ms: self.created_ms, hashes: &self.hashes }
    }
}

impl OwnedRow {
    /// A copy of a borrowed row.
    pub fn of(row: &TxnsRow<'_>) -> OwnedRow {
        OwnedRow {
            base_offset: row.base_offset,
            end_offset: row.end_offset,
            created_ms: row.created_ms,
            hashes: row.hashes.to_vec(),
        }
    }

    /// The borrowed form a [`Hydration`] holds.
    pub fn borrow(&self) -> TxnsRow<'_> {
        TxnsRow { base_offset: self.base_offset, end_offset: self.end_offset, created_ms: self.created_ms, hashes: &self.hashes }
    }
}

impl OwnedHydration {
    /// A copy of a borrowed hydration and its rows.
    pub fn of(hydration: &Hydration<'_>) -> OwnedHydration {
        OwnedHydration {
            partition: hydration.partition,
            window_ms: hydration.window_ms,
            last_offset: hydration.last_offset,
            rows: hydration.rows.iter().map(OwnedRow::of).collect(),
        }
    }

    /// Calls `f` with the borrowed form every [`crate::DedupCache`] takes,
    /// whose rows live on `f`'s caller's stack while it runs.
    pub fn with<R>(&self, f: impl FnOnce(&Hydration<'_>) -> R) -> R {
        let rows: Vec<TxnsRow<'_>> = self.rows.iter().map(OwnedRow::borrow).collect();
        f(&Hydration { partition: self.partition, window_ms: self.window_ms, last_offset: self.last_offset, rows: &rows })
    }
}

/// A flat list of 16-byte big-endian hashes, as one 32-digit hex string per
/// hash: a reader can compare hashes by eye, and a host concatenates them
/// back into the flat `list<u8>` the WIT takes.
#[cfg(feature = "serde")]
mod hex_hashes {
    use alloc::format;
    use alloc::string::String;
    use alloc::vec::Vec;

    use serde::de::Error as _;
    use serde::ser::Error as _;
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::hash::{HASH_LEN, Hash};

    pub fn serialize<S: Serializer>(hashes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        let (hashes, rest) = hashes.as_chunks::<HASH_LEN>();
        if !rest.is_empty() {
            return Err(S::Error::custom("only whole hashes are written"));
        }
        serializer.collect_seq(hashes.iter().map(|hash| format!("{:032x}", Hash::from_be_bytes(*hash))))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        let hexes = Vec::<String>::deserialize(deserializer)?;
        let mut bytes = Vec::with_capacity(hexes.len() * HASH_LEN);
        for hex in &hexes {
            if hex.len() != 2 * HASH_LEN || !hex.bytes().all(|digit| digit.is_ascii_hexdigit()) {
                return Err(D::Error::custom(format!("{hex:?} is not a 32-digit hex hash")));
            }
            let hash = Hash::from_str_radix(hex, 16).expect("32 hex digits fit a hash");
            bytes.extend_from_slice(&hash.to_be_bytes());
        }
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use alloc::vec;

    use super::*;

    #[test]
    fn a_hydration_lends_the_rows_it_was_made_of() {
        let rows = [
            TxnsRow { base_offset: 0, end_offset: 1, created_ms: 5, hashes: &[1; 32] },
            TxnsRow { base_offset: 2, end_offset: 2, created_ms: 7, hashes: &[2; 16] },
        ];
        let hydration = Hydration { partition: 3, window_ms: 1_000, last_offset: 2, rows: &rows };
        let owned = OwnedHydration::of(&hydration);
        assert_eq!(owned.rows.len(), 2);
        owned.with(|lent| {
            assert_eq!((lent.partition, lent.window_ms, lent.last_offset), (3, 1_000, 2));
            assert_eq!(lent.rows.iter().map(OwnedRow::of).collect::<Vec<_>>(), owned.rows);
        });
        let commit = OwnedCommit { partition: 3, base_offset: 4, created_ms: 9, hashes: vec![7; 48] };
        assert_eq!(OwnedCommit::of(&commit.borrow()), commit);
    }
}
