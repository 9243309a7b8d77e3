//! A push body read by serde_json, in steps: the whole body captured as raw
//! JSON (its syntax checked), then its `items`, then each item's fields, each
//! decoded from its own text.
//!
//! [`super::body`] reads a body in one pass and accepts exactly the bodies
//! this reading accepts. This reading's refusals are the API's words (each names the field, the
//! item's index and serde_json's account of bad JSON), so the one-pass
//! reader hands every body it refuses to this one to name what is wrong. It
//! is also the reference that reader is tested and fuzzed against, and
//! beside which its speed is measured.

use std::fmt::{self, Display};

use bytestring::ByteString;
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use super::item::PushItem;
use crate::api::{
    ARRAY, BadRequest, DEFAULT_PARTITION, NULL, OBJECT, STRING, checked_name, parse_json, raw_type_name, validate_transaction_id,
};
use crate::payload::{self, Payload};

/// Parses and validates a `POST /api/v1/push` body, in steps.
pub fn parse_push(body: &[u8], max_items: usize) -> Result<Vec<PushItem>, BadRequest> {
    let root: &RawValue = parse_json(body)?;
    if raw_type_name(root) != OBJECT {
        return Err(BadRequest::new("body: expected a JSON object with an \"items\" array"));
    }
    let root: RawPush<'_> = fields("body", root)?;
    let items = match root.items {
        Some(items) if raw_type_name(items) == ARRAY => items,
        Some(other) => return Err(BadRequest::new(format!("items: expected an array, got {}", raw_type_name(other)))),
        None => return Err(BadRequest::new("items: missing")),
    };
    parse_items("", items, max_items)
}

/// Parses a non-empty JSON array of push items (whose type the caller has
/// checked). Errors name each field as `{at}items[3].queue`.
pub fn parse_items(at: &str, items: &RawValue, max_items: usize) -> Result<Vec<PushItem>, BadRequest> {
    let items: Vec<&RawValue> = fields(format_args!("{at}items"), items)?;
    if items.is_empty() {
        return Err(BadRequest::new(format!("{at}items: must not be empty")));
    }
    if items.len() > max_items {
        return Err(BadRequest::too_large(format!(
            "{at}items: {} items exceed the limit of {max_items} per request",
            items.len()
        )));
    }
    items.into_iter().enumerate().map(|(index, item)| parse_item(at, index, item)).collect()
}

/// The fields of a push body the API reads, each as raw JSON: `None` when
/// absent (a JSON `null` is a value here, so that it can be refused by name).
#[derive(Deserialize)]
struct RawPush<'a> {
    #[serde(borrow, default, deserialize_with = "present")]
    items: Option<&'a RawValue>,
}

/// The fields of a push item the API reads; others are ignored.
#[derive(Deserialize)]
struct RawItem<'a> {
    #[serde(borrow, default, deserialize_with = "present")]
    queue: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    partition: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present", rename = "transactionId")]
    transaction_id: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    payload: Option<&'a RawValue>,
}

fn present<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(deserializer).map(Some)
}

/// Decodes `raw`, whose JSON type the caller has checked, as `T`; what can
/// still fail (a field given twice) is refused naming `field`.
fn fields<'a, T: Deserialize<'a>>(field: impl Display, raw: &'a RawValue) -> Result<T, BadRequest> {
    serde_json::from_str(raw.get()).map_err(|error| BadRequest::new(format!("{field}: {error}")))
}

fn parse_item(at: &str, index: usize, item: &RawValue) -> Result<PushItem, BadRequest> {
    if raw_type_name(item) != OBJECT {
        return Err(BadRequest::new(format!("{at}items[{index}]: expected an object, got {}", raw_type_name(item))));
    }
    let field = |name| ItemField { at, index, name };
    let item: RawItem<'_> = fields(format_args!("{at}items[{index}]"), item)?;
    let queue = match item.queue {
        Some(raw) => raw_name(field("queue"), raw)?,
        None => return Err(BadRequest::new(format!("{}: missing", field("queue")))),
    };
    let partition = match item.partition {
        Some(raw) if raw_type_name(raw) != NULL => raw_name(field("partition"), raw)?,
        _ => DEFAULT_PARTITION.to_owned(),
    };
    let transaction_id = match item.transaction_id {
        Some(raw) if raw_type_name(raw) == STRING => {
            let field = field("transactionId");
            let id = decode_string(field, raw)?;
            validate_transaction_id(field, &id)?;
            Some(id)
        }
        Some(raw) if raw_type_name(raw) != NULL => {
            return Err(BadRequest::new(format!("{}: expected a string, got {}", field("transactionId"), raw_type_name(raw))));
        }
        _ => None,
    };
    let payload = match item.payload {
        None => Payload::null(),
        Some(raw) => Payload::checked(raw)
            .map_err(|error| BadRequest::new(format!("{}: {}", field("payload"), payload::refusal(&error))))?,
    };
    Ok(PushItem {
        queue: queue.into(),
        partition: partition.into(),
        payload,
        transaction_id: transaction_id.map(ByteString::from),
    })
}

/// A field of a push item, named in error messages as `items[3].queue`.
/// Formatted only when an error names it: a valid item costs no string.
#[derive(Clone, Copy)]
struct ItemField<'a> {
    at: &'a str,
    index: usize,
    name: &'a str,
}

impl Display for ItemField<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}items[{}].{}", self.at, self.index, self.name)
    }
}

/// Validates a queue or partition name given as raw JSON.
fn raw_name(field: impl Display + Copy, raw: &RawValue) -> Result<String, BadRequest> {
    if raw_type_name(raw) != STRING {
        return Err(BadRequest::new(format!("{field}: expected a string, got {}", raw_type_name(raw))));
    }
    checked_name(field, decode_string(field, raw)?)
}

/// The string a raw JSON string holds. Capturing the raw value checked its
/// syntax only: an escape may still name no character (a lone surrogate).
fn decode_string(field: impl Display, raw: &RawValue) -> Result<String, BadRequest> {
    debug_assert_eq!(raw_type_name(raw), STRING);
    serde_json::from_str(raw.get()).map_err(|error| BadRequest::new(format!("{field}: malformed JSON string ({error})")))
}
