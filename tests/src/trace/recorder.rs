//! Recording: each call runs on a native [`Shard`] behind the observing
//! wrapper, and the call it reports is written down with the answer the shard
//! gave, which every other host must give too.

use stile_guest::testing::{Forwarding, Observing};
use stile_guest::{Admission, Commit, DedupCache, HydrateError, Millis, PartitionId, Plan, Segment, Shard, ShardConfig, Stats};

use super::model::{Call, NotedCall, OwnedCommit, OwnedHydration, OwnedSegment, Trace};

/// Runs calls on a native [`Shard`] and writes each down with its answer.
#[derive(Debug)]
pub struct Recorder {
    shard: Shard,
    trace: Trace,
    note: Option<String>,
}

impl Recorder {
    pub fn new(config: ShardConfig) -> Recorder {
        Recorder { shard: Shard::new(config), trace: Trace { config, calls: Vec::new() }, note: None }
    }

    /// Attaches a note to the next recorded call.
    pub fn note(&mut self, note: impl Into<String>) {
        self.note = Some(note.into());
    }

    /// The calls recorded so far.
    pub fn finish(self) -> Trace {
        self.trace
    }

    pub fn plan(&mut self, now_ms: Millis, segments: Vec<OwnedSegment>) -> Vec<Plan> {
        let borrowed: Vec<Segment<'_>> = segments.iter().map(OwnedSegment::borrow).collect();
        self.observed(|shard| shard.plan(now_ms, &borrowed))
    }

    pub fn record_commits(&mut self, now_ms: Millis, commits: Vec<OwnedCommit>) {
        let borrowed: Vec<Commit<'_>> = commits.iter().map(OwnedCommit::borrow).collect();
        self.observed(|shard| shard.record_commits(now_ms, &borrowed));
    }

    pub fn admit(&mut self, now_ms: Millis, partition: PartitionId, window_ms: u64, estimate_hashes: u64) -> Admission {
        self.observed(|shard| shard.admit(now_ms, partition, window_ms, estimate_hashes))
    }

    pub fn hydrate(&mut self, now_ms: Millis, hydration: OwnedHydration) -> Result<(), HydrateError> {
        self.observed(|shard| hydration.with(|borrowed| shard.hydrate(now_ms, borrowed)))
    }

    pub fn expire(&mut self, now_ms: Millis) {
        self.observed(|shard| shard.expire(now_ms));
    }

    pub fn forget(&mut self, partition: PartitionId) {
        self.observed(|shard| shard.forget(partition));
    }

    pub fn stats(&mut self) -> Stats {
        self.observed(|shard| shard.stats())
    }

    /// Makes one call on the shard and writes it down, with its answer and
    /// the pending note.
    fn observed<R>(&mut self, call: impl FnOnce(&mut dyn DedupCache) -> R) -> R {
        let mut seen = None;
        let answer = call(&mut Observing::new(OnShard(&mut self.shard), |_, observed| seen = Some(Call::of(observed))));
        let call = seen.expect("the shard answered one call");
        let note = self.note.take();
        self.trace.calls.push(NotedCall { note, call });
        answer
    }
}

/// The recorder's shard, lent to one observed call.
struct OnShard<'a>(&'a mut Shard);

impl Forwarding for OnShard<'_> {
    fn inner(&mut self) -> &mut dyn DedupCache {
        &mut *self.0
    }
}
