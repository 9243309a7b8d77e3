//! stile: an exact, windowed deduplication gateway for message logs kept in
//! PostgreSQL.
//!
//! A request's way: [`server`] accepts a connection → [`http`] screens the
//! request, bounds what it holds and finds its row in the route table →
//! its feature's handler ([`push`], [`kv`], [`timers`], [`transaction`],
//! [`reads`], [`configure`], [`service`]) parses it, runs it and answers it.
//! A push runs through the [`gateway`] (partition metadata, routing) and a
//! [`shard`] (one worker per shard: [`fusion`]'s layer 2, the [`cache`], one
//! bundle per flush) to [`db`], PostgreSQL, the one authority. Each feature
//! keeps its SQL calls in its own folder; [`db`] keeps the pool, the
//! migrations, the errors and the push's call, and imports no feature.
//! ARCHITECTURE.md states who may import whom; `host/tests/layers.rs` holds
//! the code to it.
#![forbid(unsafe_code)]

pub mod api;
pub mod cache;
pub mod component;
pub mod configure;
pub mod db;
pub mod fusion;
pub mod gateway;
pub mod hash;
pub mod http;
pub mod intake;
pub mod json_string;
pub mod kv;
pub mod log_limit;
pub mod message_id;
pub mod metrics;
pub mod payload;
mod payload_sql;
pub mod push;
pub mod reads;
pub mod server;
pub mod service;
pub mod shard;
pub mod timers;
pub mod transaction;
pub mod wasm;
