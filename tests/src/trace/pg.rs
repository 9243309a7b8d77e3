//! The scenario's stand-in for PostgreSQL: per partition the allocator
//! watermark and the `stile.txns` rows, which is all the cache's calls can
//! see of it.

use std::collections::BTreeMap;

use stile::hash::txn_hash;
use stile_guest::{HASH_LEN, Millis, Offset, PartitionId};

use super::model::{OwnedCommit, OwnedHydration, OwnedRow};

/// What PostgreSQL holds, as far as the cache's calls can see it: per
/// partition the allocator watermark and the txns rows. Hashes are the
/// gateway's own of made-up transaction ids, so that the trace carries real
/// hashes.
#[derive(Debug, Default)]
pub struct Pg {
    partitions: BTreeMap<PartitionId, Log>,
    next_txn: u64,
}

impl Pg {
    /// `count` hashes of transaction ids never used before.
    pub fn fresh(&mut self, count: usize) -> Vec<u8> {
        let mut hashes = Vec::with_capacity(count * HASH_LEN);
        for _ in 0..count {
            self.next_txn += 1;
            hashes.extend_from_slice(&txn_hash(&format!("order-{}", self.next_txn)));
        }
        hashes
    }

    /// Allocates offsets for `hashes` (one message each) and stores the row.
    pub fn commit(&mut self, partition: PartitionId, created_ms: Millis, hashes: Vec<u8>) -> OwnedCommit {
        assert!(!hashes.is_empty() && hashes.len().is_multiple_of(HASH_LEN));
        let log = self.partitions.entry(partition).or_default();
        let base_offset = log.last_offset + 1;
        let end_offset = base_offset + (hashes.len() / HASH_LEN) as Offset - 1;
        log.last_offset = end_offset;
        log.rows.push(OwnedRow { base_offset, end_offset, created_ms, hashes: hashes.clone() });
        OwnedCommit { partition, base_offset, created_ms, hashes }
    }

    /// The partition's allocator watermark.
    pub fn last_offset(&self, partition: PartitionId) -> Offset {
        self.partitions.get(&partition).map_or(-1, |log| log.last_offset)
    }

    /// A full-window read at `now_ms`: every row created within the window
    /// plus `slack_ms`, newest first (the cache takes rows in any order).
    pub fn read(&self, partition: PartitionId, window_ms: u64, slack_ms: u32, now_ms: Millis) -> OwnedHydration {
        let cutoff = now_ms - window_ms as Millis - Millis::from(slack_ms);
        let log = self.partitions.get(&partition);
        let rows =
            log.map_or_else(Vec::new, |log| log.rows.iter().rev().filter(|row| row.created_ms >= cutoff).cloned().collect());
        OwnedHydration { partition, window_ms, last_offset: self.last_offset(partition), rows }
    }

    /// Every row of the partition, however old (older rows only widen the
    /// cache's coverage).
    pub fn read_all(&self, partition: PartitionId, window_ms: u64) -> OwnedHydration {
        let rows = self.partitions.get(&partition).map_or_else(Vec::new, |log| log.rows.clone());
        OwnedHydration { partition, window_ms, last_offset: self.last_offset(partition), rows }
    }
}

/// One partition's log.
#[derive(Debug)]
struct Log {
    last_offset: Offset,
    rows: Vec<OwnedRow>,
}

impl Default for Log {
    fn default() -> Log {
        Log { last_offset: -1, rows: Vec::new() }
    }
}
