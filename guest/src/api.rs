//! The cache's public vocabulary. Every type here mirrors one in
//! `wit/dedup.wit`, so that the native core and the component answer the same
//! calls with the same values.

use alloc::vec::Vec;

/// A partition, by the numeric id PostgreSQL gave it.
pub type PartitionId = i64;

/// A message offset within a partition; `-1` means "none".
pub type Offset = i64;

/// Milliseconds since the Unix epoch.
pub type Millis = i64;

/// The watermark that vouches for nothing. Always sound.
pub const NO_VOUCH: Offset = -1;

/// Fixed settings of one shard's cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardConfig {
    /// The shard's memory budget in bytes.
    pub budget_bytes: u64,
    /// Clock-skew slack, applied on the safe side of every expiry.
    pub skew_slack_ms: u32,
}

impl ShardConfig {
    /// The slack the gateway uses: five seconds.
    pub const DEFAULT_SKEW_SLACK_MS: u32 = 5_000;
}

/// One segment a flush is about to push.
#[derive(Clone, Copy, Debug)]
pub struct Segment<'a> {
    pub partition: PartitionId,
    /// The partition's window in milliseconds; 0 turns deduplication off.
    pub window_ms: u64,
    /// 16 bytes per message, big-endian xxh3-128.
    pub hashes: &'a [u8],
}

/// What the cache knows about a partition's entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EntryState {
    /// Complete and current: `p_verified` vouches.
    Vouching,
    /// No entry.
    Cold,
    /// Another writer committed past `verified_upto + 1`.
    Gap,
    /// An overlapping commit or a window change; sticky until hydrated.
    Rebuild,
    /// Refused by the budget; answers -1 until its cooldown ends.
    Suppressed,
}

/// The cache's answer for one segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The watermark to push with, or [`NO_VOUCH`].
    pub p_verified: Offset,
    /// Indexes of hashes the cache has seen committed. Non-empty implies
    /// that `p_verified` lies below the oldest stored occurrence of each.
    pub local_hits: Vec<u32>,
    /// The entry's state after planning.
    pub state: EntryState,
}

/// One segment PostgreSQL committed.
#[derive(Clone, Copy, Debug)]
pub struct Commit<'a> {
    pub partition: PartitionId,
    pub base_offset: Offset,
    pub created_ms: Millis,
    /// 16 bytes per message, in offset order.
    pub hashes: &'a [u8],
}

/// One row of `stile.txns`.
#[derive(Clone, Copy, Debug)]
pub struct TxnsRow<'a> {
    pub base_offset: Offset,
    /// The row's last offset, inclusive.
    pub end_offset: Offset,
    pub created_ms: Millis,
    pub hashes: &'a [u8],
}

/// A full-window read of one partition, taken in one snapshot.
#[derive(Clone, Copy, Debug)]
pub struct Hydration<'a> {
    pub partition: PartitionId,
    pub window_ms: u64,
    /// The allocator watermark in the same snapshot as the rows.
    pub last_offset: Offset,
    pub rows: &'a [TxnsRow<'a>],
}

/// The admission gate's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Admission {
    Hydrate,
    Suppressed,
}

/// Why a hydration was not installed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HydrateError {
    /// A row's hash count does not match its offsets, a row ends past
    /// `last_offset`, or rows overlap.
    Malformed,
    /// The window is 0.
    WindowOff,
    /// The host's instance of the component failed during the call and was
    /// replaced by an empty one: nothing was installed. The cache itself
    /// never answers this (the WIT's `hydrate-error` has no such case); a
    /// host that wraps the component does.
    Lost,
}

/// Counters and gauges of one shard.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub entries: u64,
    pub vouching: u64,
    pub bytes: u64,
    pub hashes: u64,
    pub generations: u64,
    pub suppressed: u64,
    pub segments_planned: u64,
    pub segments_vouched: u64,
    pub hashes_checked: u64,
    pub bloom_maybes: u64,
    pub local_hits: u64,
    pub hydrations: u64,
    pub evictions: u64,
    pub expired_generations: u64,
}
