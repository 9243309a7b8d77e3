//! Properties of the cache that hold for any implementation of its contract
//! (`wit/dedup.wit`), written once and run against this crate's [`Shard`]
//! natively and, by the integration tests, against the component in
//! wasmtime.
//!
//! - [`DedupCache`](crate::DedupCache) is the whole contract as a trait:
//!   implement it for a wrapper around whatever holds the cache.
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
mod forwarding;
mod model;
mod observing;
mod strategy;
pub mod window;

pub use driver::{Violation, run};
pub use forwarding::Forwarding;
pub use observing::{Observed, Observing};
pub use strategy::{Estimate, MalformedInput, Op, PARTITIONS, PushSegment, Scenario, scenario};
