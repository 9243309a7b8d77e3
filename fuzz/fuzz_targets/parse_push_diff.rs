//! The one-pass push-body reader (`host/src/push/body.rs`) against the
//! stepwise serde_json reading it replaced (`host/src/push/stepwise.rs`), on
//! the same bytes: the same verdict, the same items (names, ids and payload
//! texts), and the gateway's entry point answering exactly as the stepwise
//! reading does, refusals' messages included.
//!
//! The readers are compiled here as modules of their own, as in
//! `parse_push.rs`: the code under test is the same files.
//!
//! Input: the first byte picks `max_items` (1 to 16), whether `*` in the body
//! expands to 8,191 `a`s (so the 65,535-byte transactionId limit is in
//! reach), and whether the body is read as a push body or, as a transaction's
//! items, as an items array; the rest is the body.

#![no_main]

use bytes::Bytes;
use bytestring::ByteString;
use libfuzzer_sys::fuzz_target;
use serde_json::value::RawValue;

#[allow(dead_code, unused_imports, clippy::all)]
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
    let body = if first & 0x80 != 0 {
        let mut out = Vec::with_capacity(body.len());
        for &b in body {
            if b == b'*' {
                out.resize(out.len() + 8_191, b'a');
            } else {
                out.push(b);
            }
        }
        Bytes::from(out)
    } else {
        Bytes::copy_from_slice(body)
    };
    if first & 0x40 != 0 {
        items(&body, max_items);
    } else {
        push(&body, max_items);
    }
});

fn push(body: &Bytes, max_items: usize) {
    let stepwise = stepwise::parse_push(body, max_items);
    let one_pass = ByteString::try_from(body.clone()).ok().and_then(|text| body::read_push(&text, max_items));
    same(&stepwise, one_pass.as_deref());
    assert_eq!(body::parse_push(body, max_items), stepwise);
}

/// A transaction's items: an array inside a body serde_json has captured.
fn items(body: &Bytes, max_items: usize) {
    let Ok(text) = ByteString::try_from(body.clone()) else { return };
    let Ok(raw) = serde_json::from_str::<&RawValue>(&text) else { return };
    if !raw.get().starts_with('[') {
        return;
    }
    let stepwise = stepwise::parse_items("operations[0].", raw, max_items);
    let one_pass = body::read_items(&text, raw, max_items);
    same(&stepwise, one_pass.as_deref());
    assert_eq!(body::parse_items("operations[0].", &text, raw, max_items), stepwise);
}

fn same(stepwise: &Result<Vec<item::PushItem>, api::BadRequest>, one_pass: Option<&[item::PushItem]>) {
    match (stepwise, one_pass) {
        (Ok(expected), Some(found)) => assert_eq!(expected.as_slice(), found),
        (Err(_), None) => {}
        (Ok(expected), None) => panic!("the one-pass reader refused {} items the stepwise reading accepts", expected.len()),
        (Err(bad), Some(found)) => {
            panic!("the one-pass reader accepted {} items the stepwise reading refuses: {}", found.len(), bad.message)
        }
    }
}
