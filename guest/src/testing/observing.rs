//! One wrapper that passes every call through to the cache it wraps and
//! reports the call, with its arguments and its answer, to an observer: the
//! tests' recording and checking wrappers are uses of it.

use std::vec::Vec;

use crate::DedupCache;
use crate::api::*;

/// One call a cache answered, with its arguments and its answer.
#[derive(Clone, Copy, Debug)]
pub enum Observed<'c, 'a> {
    Plan { now_ms: Millis, segments: &'c [Segment<'a>], plans: &'c [Plan] },
    RecordCommits { now_ms: Millis, commits: &'c [Commit<'a>] },
    Admit { now_ms: Millis, partition: PartitionId, window_ms: u64, estimate_hashes: u64, admission: Admission },
    Hydrate { now_ms: Millis, hydration: &'c Hydration<'a>, result: Result<(), HydrateError> },
    Expire { now_ms: Millis },
    Forget { partition: PartitionId },
    Stats { stats: Stats },
}

/// Passes every call through to `inner`, then hands `observer` the wrapped
/// cache and the call it answered.
#[derive(Debug)]
pub struct Observing<C, O> {
    pub inner: C,
    pub observer: O,
}

impl<C, O> Observing<C, O>
where
    C: DedupCache,
    O: FnMut(&mut C, Observed<'_, '_>),
{
    pub fn new(inner: C, observer: O) -> Observing<C, O> {
        Observing { inner, observer }
    }
}

impl<C, O> DedupCache for Observing<C, O>
where
    C: DedupCache,
    O: FnMut(&mut C, Observed<'_, '_>),
{
    fn plan(&mut self, now_ms: Millis, segments: &[Segment<'_>]) -> Vec<Plan> {
        let plans = self.inner.plan(now_ms, segments);
        (self.observer)(&mut self.inner, Observed::Plan { now_ms, segments, plans: &plans });
        plans
    }

    fn record_commits(&mut self, now_ms: Millis, commits: &[Commit<'_>]) {
        self.inner.record_commits(now_ms, commits);
        (self.observer)(&mut self.inner, Observed::RecordCommits { now_ms, commits });
    }

    fn admit(&mut self, now_ms: Millis, partition: PartitionId, window_ms: u64, estimate_hashes: u64) -> Admission {
        let admission = self.inner.admit(now_ms, partition, window_ms, estimate_hashes);
        (self.observer)(&mut self.inner, Observed::Admit { now_ms, partition, window_ms, estimate_hashes, admission });
        admission
    }

    fn hydrate(&mut self, now_ms: Millis, hydration: &Hydration<'_>) -> Result<(), HydrateError> {
        let result = self.inner.hydrate(now_ms, hydration);
        (self.observer)(&mut self.inner, Observed::Hydrate { now_ms, hydration, result });
        result
    }

    fn expire(&mut self, now_ms: Millis) {
        self.inner.expire(now_ms);
        (self.observer)(&mut self.inner, Observed::Expire { now_ms });
    }

    fn forget(&mut self, partition: PartitionId) {
        self.inner.forget(partition);
        (self.observer)(&mut self.inner, Observed::Forget { partition });
    }

    fn stats(&mut self) -> Stats {
        let stats = self.inner.stats();
        (self.observer)(&mut self.inner, Observed::Stats { stats });
        stats
    }
}
