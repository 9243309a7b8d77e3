//! Recording: each call runs on a native [`Shard`], and the call is written
//! down with the answer the shard gave, which every other host must give too.

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
        let expect = self.shard.plan(now_ms, &borrowed);
        self.push(Call::Plan { now_ms, segments, expect: expect.clone() });
        expect
    }

    pub fn record_commits(&mut self, now_ms: Millis, commits: Vec<OwnedCommit>) {
        let borrowed: Vec<Commit<'_>> = commits.iter().map(OwnedCommit::borrow).collect();
        self.shard.record_commits(now_ms, &borrowed);
        self.push(Call::RecordCommits { now_ms, commits });
    }

    pub fn admit(&mut self, now_ms: Millis, partition: PartitionId, window_ms: u64, estimate_hashes: u64) -> Admission {
        let expect = self.shard.admit(now_ms, partition, window_ms, estimate_hashes);
        self.push(Call::Admit { now_ms, partition, window_ms, estimate_hashes, expect });
        expect
    }

    pub fn hydrate(&mut self, now_ms: Millis, hydration: OwnedHydration) -> Result<(), HydrateError> {
        let expect = hydration.with(|borrowed| self.shard.hydrate(now_ms, borrowed));
        self.push(Call::Hydrate { now_ms, hydration, expect });
        expect
    }

    pub fn expire(&mut self, now_ms: Millis) {
        self.shard.expire(now_ms);
        self.push(Call::Expire { now_ms });
    }

    pub fn forget(&mut self, partition: PartitionId) {
        self.shard.forget(partition);
        self.push(Call::Forget { partition });
    }

    pub fn stats(&mut self) -> Stats {
        let expect = self.shard.stats();
        self.push(Call::Stats { expect });
        expect
    }

    fn push(&mut self, call: Call) {
        let note = self.note.take();
        self.trace.calls.push(NotedCall { note, call });
    }
}
