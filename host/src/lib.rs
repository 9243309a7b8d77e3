//! stile: an exact, windowed deduplication gateway for message logs kept in
//! PostgreSQL.
//!
//! The layers, from the wire inwards: [`http`] (hyper) → [`api`] (parsing and
//! validation) → [`gateway`] (layer 1, partition metadata, routing) →
//! [`shard`] (one worker per shard: [`fusion`]'s layer 2, the [`cache`], and
//! one bundle per flush) → [`db`] (PostgreSQL, the one authority).
#![forbid(unsafe_code)]

pub mod api;
pub mod cache;
pub mod component;
pub mod db;
pub mod fusion;
pub mod gateway;
pub mod hash;
pub mod http;
pub mod intake;
pub mod metrics;
pub mod payload;
pub mod server;
pub mod shard;
pub mod wasm;
