//! The push-body parser must never panic, and whatever it accepts must obey
//! the documented limits: 1 to `max_items` items; queue and partition names
//! of 1 to 255 bytes without control characters; a transactionId, when
//! given, of 1 to 65,535 bytes.
//!
//! The parser is `host/src/push/body.rs` (with `host/src/api.rs`,
//! `host/src/payload.rs` and `host/src/push/stepwise.rs`, which names its
//! refusals), compiled here as modules of their own (they depend on serde,
//! serde_json, bytes, bytestring, unicode-normalization and thiserror only),
//! so that the instrumented build
//! does not have to build wasmtime and the component for the `stile` crate
//! around it: the code under test is the same files.
//!
//! Input: the first byte picks `max_items` (1 to 16) and whether `*` in the
//! body expands to 8,191 `a`s, so that the fuzzer can reach the 65,535-byte
//! limit with a short input; the rest is the body.

#![no_main]

use libfuzzer_sys::fuzz_target;
use unicode_normalization::UnicodeNormalization as _;

#[allow(dead_code, clippy::all)]
#[path = "../../host/src/api.rs"]
mod api;
#[allow(dead_code, clippy::all)]
#[path = "../../host/src/payload.rs"]
mod payload;
// `host/src/push/`'s readers and item, as modules of the crate's root: their
// `super::` paths then name each other.
#[allow(dead_code, clippy::all)]
#[path = "../../host/src/push/body.rs"]
mod body;
#[allow(dead_code, clippy::all)]
#[path = "../../host/src/push/item.rs"]
mod item;
#[allow(dead_code, clippy::all)]
#[path = "../../host/src/push/stepwise.rs"]
mod stepwise;

fuzz_target!(|data: &[u8]| {
    let Some((&first, body)) = data.split_first() else { return };
    let max_items = usize::from(first & 0x0f) + 1;
    let expanded;
    let body = if first & 0x80 != 0 {
        let mut out = Vec::with_capacity(body.len());
        for &b in body {
            if b == b'*' {
                out.resize(out.len() + 8_191, b'a');
            } else {
                out.push(b);
            }
        }
        expanded = out;
        &expanded[..]
    } else {
        body
    };
    let body = &bytes::Bytes::copy_from_slice(body);
    match body::parse_push(body, max_items) {
        Ok(items) => {
            assert!(!items.is_empty() && items.len() <= max_items, "{} items accepted with max_items {max_items}", items.len());
            for item in &items {
                for (field, name) in [("queue", &item.queue), ("partition", &item.partition)] {
                    assert!(!name.is_empty() && name.len() <= api::MAX_NAME_BYTES, "{field} of {} bytes accepted", name.len());
                    assert!(!name.chars().any(char::is_control), "{field} {name:?} with a control character accepted");
                }
                if let Some(id) = &item.transaction_id {
                    assert!(
                        !id.is_empty() && id.len() <= api::MAX_TRANSACTION_ID_BYTES,
                        "transactionId of {} bytes accepted",
                        id.len()
                    );
                }
            }
            // What was accepted is what the body said: the JSON parses the
            // same way, and every item is an object naming that queue (in
            // Unicode's composed form, NFC, which is how names are kept). Only
            // a field the parser ignores (an unknown key) can hold what a
            // full decode refuses, a lone surrogate: the body is JSON still.
            let value: serde_json::Value = match serde_json::from_slice(body) {
                Ok(value) => value,
                Err(error) => {
                    let syntax = serde_json::from_slice::<serde::de::IgnoredAny>(body);
                    assert!(syntax.is_ok(), "an accepted body is not JSON: {error}");
                    return;
                }
            };
            let sent = value["items"].as_array().expect("accepted bodies have an items array");
            assert_eq!(sent.len(), items.len());
            for (sent, item) in sent.iter().zip(&items) {
                let composed = sent["queue"].as_str().map(|queue| queue.nfc().collect::<String>());
                assert_eq!(composed.as_deref(), Some(&*item.queue));
                assert_eq!(sent.get("transactionId").and_then(|t| t.as_str()), item.transaction_id.as_deref());
                // The payload is kept as text that means what was sent.
                let payload: serde_json::Value = serde_json::from_str(item.payload.get()).expect("a payload is JSON");
                assert_eq!(&payload, sent.get("payload").unwrap_or(&serde_json::Value::Null));
            }
        }
        Err(bad) => {
            assert!(bad.status == 400 || bad.status == 413, "status {} for {:?}", bad.status, bad.message);
            assert!(!bad.message.is_empty());
        }
    }
});
