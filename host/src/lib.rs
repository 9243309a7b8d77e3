//! stile: an exact, windowed deduplication gateway for message logs kept in
//! PostgreSQL.
//!
//! The layers, from the wire inwards: [`http`] (hyper) → [`api`] (parsing and
//! validation; a push body in one pass by [`push_body`]) → [`gateway`]
//! (layer 1, partition metadata, routing) → [`shard`] (one worker per
//! shard: [`fusion`]'s layer 2, the [`cache`], and one bundle per flush) →
//! [`db`] (PostgreSQL, the one authority). Beside the push path: [`kv`]
//! (KV and once), [`transaction`] (pushes with KV and timer riders, all or
//! nothing) and [`timers`] (scheduled messages and their firer), each over
//! its SQL in `host/sql/`; [`router`] is the table of routes.
#![forbid(unsafe_code)]

pub mod allowed_hosts;
pub mod api;
pub mod cache;
pub mod component;
pub mod configure;
pub mod conn;
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
pub mod openapi;
pub mod payload;
mod payload_sql;
pub mod push_answer;
pub mod push_body;
pub mod push_stepwise;
pub mod router;
pub mod server;
pub mod shard;
pub mod timers;
pub mod transaction;
pub mod wasm;
