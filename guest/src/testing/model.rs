//! A plain model of what PostgreSQL stores for each partition: the allocator,
//! the window, and every txns row with its hashes. It answers the questions
//! the push function and a hydration ask, by brute force.

use std::collections::{HashMap, HashSet};
use std::vec::Vec;

use crate::api::{Millis, NO_VOUCH, Offset, PartitionId};
use crate::hash::Hash;

/// One txns row: a committed segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub base_offset: Offset,
    pub created_ms: Millis,
    pub hashes: Vec<Hash>,
}

impl Row {
    pub fn end_offset(&self) -> Offset {
        self.base_offset + self.hashes.len() as Offset - 1
    }
}

/// A full-window read of one partition, in one snapshot.
#[derive(Clone, Debug)]
pub struct Read {
    pub window_ms: u64,
    pub last_offset: Offset,
    pub rows: Vec<Row>,
}

/// One partition as PostgreSQL holds it.
#[derive(Clone, Debug)]
pub struct Log {
    pub window_ms: u64,
    pub last_offset: Offset,
    rows: Vec<Row>,
    /// Every offset and creation time at which each hash was committed.
    occurrences: HashMap<Hash, Vec<(Offset, Millis)>>,
}

impl Log {
    pub fn new(window_ms: u64) -> Log {
        Log { window_ms, last_offset: NO_VOUCH, rows: Vec::new(), occurrences: HashMap::new() }
    }

    /// Whether the hash was ever committed to this partition.
    pub fn ever_committed(&self, hash: Hash) -> bool {
        self.occurrences.contains_key(&hash)
    }

    /// Whether the hash was committed at or below `offset` and created at or
    /// after `window_start_ms`: exactly what a vouch for `offset` denies.
    pub fn in_window_at_or_below(&self, hash: Hash, offset: Offset, window_start_ms: Millis) -> bool {
        self.occurrences
            .get(&hash)
            .is_some_and(|seen| seen.iter().any(|&(at, created)| at <= offset && created >= window_start_ms))
    }

    /// What the push function writes for a segment at PostgreSQL time
    /// `pg_now_ms`: with the window on, the hashes not already stored within
    /// it, first occurrence only; with the window off, everything.
    pub fn to_write(&self, hashes: &[Hash], pg_now_ms: Millis) -> Vec<Hash> {
        if self.window_ms == 0 {
            return hashes.to_vec();
        }
        let window_start = pg_now_ms - self.window_ms as Millis;
        let mut seen = HashSet::new();
        hashes
            .iter()
            .copied()
            .filter(|&hash| seen.insert(hash) && !self.in_window_at_or_below(hash, self.last_offset, window_start))
            .collect()
    }

    /// Allocates offsets for `hashes` and stores them as one row.
    pub fn commit(&mut self, hashes: Vec<Hash>, created_ms: Millis) -> Row {
        assert!(!hashes.is_empty());
        let row = Row { base_offset: self.last_offset + 1, created_ms, hashes };
        for (i, &hash) in row.hashes.iter().enumerate() {
            self.occurrences.entry(hash).or_default().push((row.base_offset + i as Offset, created_ms));
        }
        self.last_offset = row.end_offset();
        self.rows.push(row.clone());
        row
    }

    /// The hydration query: every row created at or after
    /// `pg_now_ms - window - slack_ms`, with the allocator, in one snapshot.
    pub fn read(&self, pg_now_ms: Millis, slack_ms: u32) -> Read {
        let since = pg_now_ms - self.window_ms as Millis - Millis::from(slack_ms);
        let rows = self.rows.iter().filter(|row| row.created_ms >= since).cloned().collect();
        Read { window_ms: self.window_ms, last_offset: self.last_offset, rows }
    }

    /// Hashes stored within the window: the host's estimate for admission.
    pub fn in_window_count(&self, pg_now_ms: Millis) -> u64 {
        let since = pg_now_ms - self.window_ms as Millis;
        self.rows.iter().filter(|row| row.created_ms >= since).map(|row| row.hashes.len() as u64).sum()
    }
}

/// Every partition of the model database.
#[derive(Clone, Debug, Default)]
pub struct Database {
    logs: HashMap<PartitionId, Log>,
}

impl Database {
    pub fn create(&mut self, partition: PartitionId, window_ms: u64) {
        self.logs.insert(partition, Log::new(window_ms));
    }

    pub fn log(&self, partition: PartitionId) -> &Log {
        &self.logs[&partition]
    }

    pub fn log_mut(&mut self, partition: PartitionId) -> &mut Log {
        self.logs.get_mut(&partition).expect("created at the start")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec;

    #[test]
    fn the_model_dedups_within_its_window_only() {
        let mut log = Log::new(1_000);
        let row = log.commit(vec![1, 2], 10_000);
        assert_eq!((row.base_offset, row.end_offset(), log.last_offset), (0, 1, 1));
        assert_eq!(log.to_write(&[2, 3, 3, 4], 10_500), [3, 4]);
        assert_eq!(log.to_write(&[2], 11_001), [2], "out of the window");
        assert!(log.in_window_at_or_below(2, 1, 10_000));
        assert!(!log.in_window_at_or_below(2, 0, 10_000));
        assert!(!log.in_window_at_or_below(2, 1, 10_001));
        log.commit(vec![5], 12_000);
        assert_eq!(log.read(12_500, 0).rows.len(), 1);
        assert_eq!(log.read(12_500, 1_500).rows.len(), 2);
        assert_eq!(log.in_window_count(12_500), 1);
        let mut off = Log::new(0);
        assert_eq!(off.to_write(&[1, 1], 0), [1, 1]);
        off.commit(vec![1, 1], 0);
        assert_eq!(off.to_write(&[1], 0), [1]);
    }
}
