//! A message's identity inside the cache: its 16-byte big-endian xxh3-128,
//! held as a `u128` so that integer order equals PostgreSQL's byte order.

/// Bytes per hash on the wire.
pub const HASH_LEN: usize = 16;

/// One message hash.
pub type Hash = u128;
