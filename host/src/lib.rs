//! stile: an exact, windowed deduplication gateway for message logs kept in
//! PostgreSQL.

pub mod component;
