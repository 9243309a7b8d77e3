//! Replay: a trace's calls run on any [`DedupCache`], each answer held
//! against the one recorded, stopping at the first that differs.

use std::fmt;

use stile_guest::{Commit, DedupCache, Segment};

use super::model::{Call, OwnedCommit, OwnedSegment, Trace};

/// Replays every call of `trace` on `cache` (constructed with
/// `trace.config`) and answers how many calls ran, or the first divergence.
pub fn replay(trace: &Trace, cache: &mut impl DedupCache) -> Result<usize, Divergence> {
    for (index, step) in trace.calls.iter().enumerate() {
        let diverged = |expected: String, actual: String| Divergence {
            index,
            call: step.call.name(),
            note: step.note.clone(),
            expected,
            actual,
        };
        match &step.call {
            Call::Plan { now_ms, segments, expect } => {
                let segments: Vec<Segment<'_>> = segments.iter().map(OwnedSegment::borrow).collect();
                let actual = cache.plan(*now_ms, &segments);
                if &actual != expect {
                    return Err(diverged(format!("{expect:?}"), format!("{actual:?}")));
                }
            }
            Call::RecordCommits { now_ms, commits } => {
                let commits: Vec<Commit<'_>> = commits.iter().map(OwnedCommit::borrow).collect();
                cache.record_commits(*now_ms, &commits);
            }
            Call::Admit { now_ms, partition, window_ms, estimate_hashes, expect } => {
                let actual = cache.admit(*now_ms, *partition, *window_ms, *estimate_hashes);
                if &actual != expect {
                    return Err(diverged(format!("{expect:?}"), format!("{actual:?}")));
                }
            }
            Call::Hydrate { now_ms, hydration, expect } => {
                let actual = hydration.with(|hydration| cache.hydrate(*now_ms, hydration));
                if &actual != expect {
                    return Err(diverged(format!("{expect:?}"), format!("{actual:?}")));
                }
            }
            Call::Expire { now_ms } => cache.expire(*now_ms),
            Call::Forget { partition } => cache.forget(*partition),
            Call::Stats { expect } => {
                let actual = cache.stats();
                if &actual != expect {
                    return Err(diverged(format!("{expect:?}"), format!("{actual:?}")));
                }
            }
        }
    }
    Ok(trace.calls.len())
}

/// The first call on which a cache answered differently from the trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Divergence {
    /// The call's index in `calls`.
    pub index: usize,
    pub call: &'static str,
    pub note: Option<String>,
    pub expected: String,
    pub actual: String,
}

impl fmt::Display for Divergence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "call #{} ({})", self.index, self.call)?;
        if let Some(note) = &self.note {
            write!(f, " [{note}]")?;
        }
        write!(f, " answered differently\n  expected: {}\n  actual:   {}", self.expected, self.actual)
    }
}

impl std::error::Error for Divergence {}
