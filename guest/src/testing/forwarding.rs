//! Wrappers around a cache that change one or two of its calls: the
//! deliberately broken caches that prove the driver can fail, and the
//! recording and checking wrappers of the tests. A wrapper names the cache it
//! wraps and overrides only the calls it is about; every other call goes
//! through unchanged.

use std::vec::Vec;

use crate::DedupCache;
use crate::api::*;

/// A cache that wraps another; [`DedupCache`] follows from it.
pub trait Forwarding {
    /// The wrapped cache.
    fn inner(&mut self) -> &mut dyn DedupCache;

    fn plan(&mut self, now_ms: Millis, segments: &[Segment<'_>]) -> Vec<Plan> {
        self.inner().plan(now_ms, segments)
    }

    fn record_commits(&mut self, now_ms: Millis, commits: &[Commit<'_>]) {
        self.inner().record_commits(now_ms, commits);
    }

    fn admit(&mut self, now_ms: Millis, partition: PartitionId, window_ms: u64, estimate_hashes: u64) -> Admission {
        self.inner().admit(now_ms, partition, window_ms, estimate_hashes)
    }

    fn hydrate(&mut self, now_ms: Millis, hydration: &Hydration<'_>) -> Result<(), HydrateError> {
        self.inner().hydrate(now_ms, hydration)
    }

    fn expire(&mut self, now_ms: Millis) {
        self.inner().expire(now_ms);
    }

    fn forget(&mut self, partition: PartitionId) {
        self.inner().forget(partition);
    }

    fn stats(&mut self) -> Stats {
        self.inner().stats()
    }
}

impl<W: Forwarding> DedupCache for W {
    fn plan(&mut self, now_ms: Millis, segments: &[Segment<'_>]) -> Vec<Plan> {
        Forwarding::plan(self, now_ms, segments)
    }

    fn record_commits(&mut self, now_ms: Millis, commits: &[Commit<'_>]) {
        Forwarding::record_commits(self, now_ms, commits);
    }

    fn admit(&mut self, now_ms: Millis, partition: PartitionId, window_ms: u64, estimate_hashes: u64) -> Admission {
        Forwarding::admit(self, now_ms, partition, window_ms, estimate_hashes)
    }

    fn hydrate(&mut self, now_ms: Millis, hydration: &Hydration<'_>) -> Result<(), HydrateError> {
        Forwarding::hydrate(self, now_ms, hydration)
    }

    fn expire(&mut self, now_ms: Millis) {
        Forwarding::expire(self, now_ms);
    }

    fn forget(&mut self, partition: PartitionId) {
        Forwarding::forget(self, partition);
    }

    fn stats(&mut self) -> Stats {
        Forwarding::stats(self)
    }
}
