//! stile's deduplication cache.
//!
//! One [`Shard`] holds, for every partition the shard has seen, a bloom front
//! over an exact ring of 16-byte hashes, and answers one question per segment:
//! `p_verified`, the offset at or below which it vouches that none of the
//! segment's hashes was committed within the window. `-1` is always sound; the
//! cache can make stile faster and can never change a verdict.
//!
//! The crate is `#![no_std]` + `alloc` so that the same code runs natively in
//! the gateway (`--engine native`) and inside the WebAssembly component
//! (feature `component`), which imports nothing.
#![no_std]

extern crate alloc;

// std supplies the allocator and panic handler that the cdylib artifact needs:
// the component links it (on wasm32-unknown-unknown std imports nothing), and
// so does every native build, where the host links std anyway. The cache's own
// code uses only `core` and `alloc`; `testing` is the one module that uses std.
#[cfg(any(feature = "component", feature = "testing", not(target_family = "wasm")))]
extern crate std;

mod api;
mod bloom;
mod budget;
mod cache;
mod clock;
mod entry;
mod fetch;
mod hash;
mod owned;
mod ring;
mod shard;

#[cfg(feature = "component")]
mod component;

/// A reference model of PostgreSQL and a property driver that runs against any
/// implementation of [`DedupCache`]: this crate's [`Shard`] natively, and
/// the component as loaded by a host.
#[cfg(feature = "testing")]
pub mod testing;

pub use api::*;
pub use budget::{COOLDOWN_MS, FIT_PERCENT, RECENT_USE_MS};
pub use cache::DedupCache;
pub use clock::{DbClock, Reading};
pub use hash::{HASH_LEN, Hash};
pub use owned::{OwnedCommit, OwnedHydration, OwnedRow, OwnedSegment};
pub use shard::Shard;
