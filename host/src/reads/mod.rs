//! `GET /api/v1/messages` and `GET /api/v1/messages/by-transaction-id`: a
//! partition's messages read back, bounded by the answer limit on both
//! sides (the gateway's room and PostgreSQL's page, [`sql`]). [`route`]
//! holds the handlers.

pub mod route;
mod sql;

pub use sql::{MessagePage, PageBound, StoredMessage};
