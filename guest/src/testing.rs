//! Properties of the cache that hold for any implementation of its contract
//! (`wit/dedup.wit`), written once and run against this crate's [`Shard`]
//! natively and, by the integration tests, against the component in
//! wasmtime.
//!
//! - [`Cache`] is the whole contract as a trait: implement it for a wrapper
//!   around whatever holds the cache.
//! - [`scenario()`] generates random operation sequences (a proptest
//!   strategy) and [`run`] drives one through a cache next to a plain model of
//!   what PostgreSQL stores, checking every plan against it.
//! - [`window`] holds the two deterministic checks of the event-window seed,
//!   and [`floors`] how close to its original a retry is floored.
//!
//! ```ignore
//! proptest! {
//!     #[test]
//!     fn component_is_sound(scenario in stile_guest::testing::scenario()) {
//!         stile_guest::testing::run(&scenario, |config| MyComponent::new(config))
//!             .map_err(|violation| TestCaseError::fail(violation.to_string()))?;
//!     }
//! }
//! ```

mod driver;
pub mod floors;
mod model;
mod strategy;
pub mod window;

use alloc::vec::Vec;

use crate::api::*;
use crate::shard::Shard;

pub use driver::{Violation, run};
pub use strategy::{Estimate, MalformedInput, Op, PARTITIONS, PushSegment, Scenario, scenario};

/// The cache's contract: one method per export of the `shard` resource in
/// `wit/dedup.wit`, in the core's types. Construction is left to the caller
/// (see [`run`]), because a component needs an engine and a store to make one.
pub trait Cache {
    fn plan(&mut self, now_ms: Millis, segments: &[Segment<'_>]) -> Vec<Plan>;
    fn record_commits(&mut self, now_ms: Millis, commits: &[Commit<'_>]);
    fn admit(&mut self, now_ms: Millis, partition: PartitionId, window_ms: u64, estimate_hashes: u64) -> Admission;
    fn hydrate(&mut self, now_ms: Millis, hydration: &Hydration<'_>) -> Result<(), HydrateError>;
    fn expire(&mut self, now_ms: Millis);
    fn forget(&mut self, partition: PartitionId);
    /// `&mut` because a component host needs its store mutably even to read.
    fn stats(&mut self) -> Stats;
}

impl Cache for Shard {
    fn plan(&mut self, now_ms: Millis, segments: &[Segment<'_>]) -> Vec<Plan> {
        Shard::plan(self, now_ms, segments)
    }

    fn record_commits(&mut self, now_ms: Millis, commits: &[Commit<'_>]) {
        Shard::record_commits(self, now_ms, commits);
    }

    fn admit(&mut self, now_ms: Millis, partition: PartitionId, window_ms: u64, estimate_hashes: u64) -> Admission {
        Shard::admit(self, now_ms, partition, window_ms, estimate_hashes)
    }

    fn hydrate(&mut self, now_ms: Millis, hydration: &Hydration<'_>) -> Result<(), HydrateError> {
        Shard::hydrate(self, now_ms, hydration)
    }

    fn expire(&mut self, now_ms: Millis) {
        Shard::expire(self, now_ms);
    }

    fn forget(&mut self, partition: PartitionId) {
        Shard::forget(self, partition);
    }

    fn stats(&mut self) -> Stats {
        Shard::stats(self)
    }
}
