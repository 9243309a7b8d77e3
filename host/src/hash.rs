//! The dedup key of a message.

/// The dedup key of a `transactionId`: xxh3-128 of its UTF-8 bytes, 16 bytes
/// big-endian. Only the gateway hashes; PostgreSQL compares these bytes.
pub fn txn_hash(transaction_id: &str) -> [u8; 16] {
    xxhash_rust::xxh3::xxh3_128(transaction_id.as_bytes()).to_be_bytes()
}

#[cfg(test)]
mod tests {
    use super::txn_hash;

    #[test]
    fn big_endian_xxh3_128() {
        let h = txn_hash("order-9137-paid");
        let v = xxhash_rust::xxh3::xxh3_128(b"order-9137-paid");
        assert_eq!(u128::from_be_bytes(h), v);
        assert_ne!(txn_hash("a"), txn_hash("b"));
    }
}
