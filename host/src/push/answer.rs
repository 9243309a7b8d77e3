//! The answer to a push, written straight into its body: an array with one
//! object per item, in request order, fields in alphabetical order
//! (`index`, `message_id`, `offset`, `partition`, `queueName`, `status`,
//! `transaction_id`), byte for byte what serde_json writes for them.
//!
//! The keys are literals and the strings go through [`json_string`], which
//! copies a name or transactionId as it is unless it holds a character JSON
//! must escape: at 100 items per request, escaping seven keys and three
//! strings per item through a serializer was the gateway's largest single
//! cost.

use crate::gateway::PushResult;
use crate::json_string;

/// The body answering `results`, one entry per item, in order.
pub fn render(results: &[PushResult]) -> Vec<u8> {
    let strings: usize = results.iter().map(|r| r.queue.len() + r.partition.len() + r.transaction_id.len()).sum();
    let mut out = Vec::with_capacity(2 + ENTRY_BYTES * results.len() + strings);
    out.push(b'[');
    for (index, result) in results.iter().enumerate() {
        if index > 0 {
            out.push(b',');
        }
        entry(&mut out, index, result);
    }
    out.push(b']');
    out
}

/// An entry's bytes besides its three strings, at most.
const ENTRY_BYTES: usize = 160;

fn entry(out: &mut Vec<u8>, index: usize, result: &PushResult) {
    let mut numbers = itoa::Buffer::new();
    let mut id = [0u8; uuid::fmt::Hyphenated::LENGTH];
    out.extend_from_slice(b"{\"index\":");
    out.extend_from_slice(numbers.format(index).as_bytes());
    out.extend_from_slice(b",\"message_id\":\"");
    out.extend_from_slice(result.message_id.hyphenated().encode_lower(&mut id).as_bytes());
    out.extend_from_slice(b"\",\"offset\":");
    out.extend_from_slice(numbers.format(result.offset).as_bytes());
    out.extend_from_slice(b",\"partition\":");
    string(out, &result.partition);
    out.extend_from_slice(b",\"queueName\":");
    string(out, &result.queue);
    out.extend_from_slice(if result.duplicate { b",\"status\":\"duplicate\"" } else { b",\"status\":\"queued\"" });
    out.extend_from_slice(b",\"transaction_id\":");
    string(out, &result.transaction_id);
    out.push(b'}');
}

fn string(out: &mut Vec<u8>, s: &str) {
    json_string::write(out, s).expect("a Vec takes every write");
}

#[cfg(test)]
mod tests {
    use bytestring::ByteString;
    use proptest::prelude::*;
    use serde::Serialize;
    use uuid::Uuid;

    use super::*;

    /// The reference: the entry as serde_json serialises it.
    #[derive(Serialize)]
    struct Entry<'a> {
        index: usize,
        message_id: Uuid,
        offset: i64,
        partition: &'a str,
        #[serde(rename = "queueName")]
        queue: &'a str,
        status: &'static str,
        transaction_id: &'a str,
    }

    fn by_serde(results: &[PushResult]) -> Vec<u8> {
        let entries: Vec<Entry<'_>> = results
            .iter()
            .enumerate()
            .map(|(index, r)| Entry {
                index,
                message_id: r.message_id,
                offset: r.offset,
                partition: &r.partition,
                queue: &r.queue,
                status: if r.duplicate { "duplicate" } else { "queued" },
                transaction_id: &r.transaction_id,
            })
            .collect();
        serde_json::to_vec(&entries).expect("serialises")
    }

    fn result() -> impl Strategy<Value = PushResult> {
        // Strings drawn to hit every escape: quotes, backslashes, control
        // characters, DEL and characters beyond ASCII.
        let text = "[a-z\"\\\\\u{0}-\u{1f}\u{7f}é€😀 ]{0,12}";
        (any::<u128>(), any::<i64>(), text, text, text, any::<bool>()).prop_map(
            |(id, offset, queue, partition, transaction_id, duplicate)| PushResult {
                message_id: Uuid::from_u128(id),
                transaction_id: ByteString::from(transaction_id),
                queue: ByteString::from(queue),
                partition: ByteString::from(partition),
                offset,
                duplicate,
            },
        )
    }

    proptest! {
        #[test]
        fn the_answer_is_what_serde_json_writes(results in proptest::collection::vec(result(), 0..8)) {
            prop_assert_eq!(String::from_utf8(render(&results)).unwrap(), String::from_utf8(by_serde(&results)).unwrap());
        }
    }

    #[test]
    fn an_entry_reads_back_with_its_fields() {
        let results = [PushResult {
            message_id: Uuid::from_u128(7),
            transaction_id: ByteString::from("order \"7\""),
            queue: ByteString::from("q"),
            partition: ByteString::from("p"),
            offset: 41,
            duplicate: true,
        }];
        let back: serde_json::Value = serde_json::from_slice(&render(&results)).unwrap();
        assert_eq!(back[0]["transaction_id"], "order \"7\"");
        assert_eq!(back[0]["status"], "duplicate");
        assert_eq!(back[0]["offset"], 41);
        assert_eq!(back[0]["message_id"], Uuid::from_u128(7).to_string());
    }
}
