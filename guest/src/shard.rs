//! One shard's cache.
use crate::api::*;
use alloc::vec::Vec;

/// One shard's cache.
#[derive(Debug)]
pub struct Shard {
    config: ShardConfig,
}

impl Shard {
    pub fn new(config: ShardConfig) -> Shard {
        Shard { config }
    }
    pub fn plan(&mut self, _now_ms: Millis, segments: &[Segment<'_>]) -> Vec<Plan> {
        segments.iter().map(|_| Plan { p_verified: NO_VOUCH, local_hits: Vec::new(), state: EntryState::Cold }).collect()
    }
    pub fn record_commits(&mut self, _now_ms: Millis, _commits: &[Commit<'_>]) {}
    pub fn admit(&mut self, _now_ms: Millis, _partition: PartitionId, _window_ms: u64, _estimate_hashes: u64) -> Admission {
        Admission::Suppressed
    }
    pub fn hydrate(&mut self, _now_ms: Millis, _hydration: &Hydration<'_>) -> Result<(), HydrateError> {
        Err(HydrateError::Malformed)
    }
    pub fn expire(&mut self, _now_ms: Millis) {}
    pub fn forget(&mut self, _partition: PartitionId) {}
    pub fn stats(&self) -> Stats {
        let _ = self.config;
        Stats::default()
    }
}
