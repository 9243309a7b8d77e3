//! The vocabulary every feature's parser shares: the refusal of a request
//! (`BadRequest`), the rules of names and transactionIds, and the JSON
//! helpers that name a bad field.
//!
//! A request is validated whole before anything of it is sent on, so that bad
//! input is refused with a 4xx naming the field (and the item's index) and
//! nothing of that request is written.

use std::fmt::Display;

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;
use unicode_normalization::UnicodeNormalization as _;

pub use crate::payload::Payload;

/// The longest `transactionId` accepted, in UTF-8 bytes.
pub const MAX_TRANSACTION_ID_BYTES: usize = 65_535;

/// The longest queue or partition name accepted, in UTF-8 bytes.
pub const MAX_NAME_BYTES: usize = 255;

/// Most operations in one KV or timers call (a batch, or one transaction's
/// operations of either kind).
pub const MAX_OPS: usize = 256;

/// The largest page of a listing (KV's `getPrefix`, a queue's timers), and
/// the page a listing without a limit gets.
pub const MAX_PAGE: u32 = 1000;
pub const DEFAULT_PAGE: u32 = 100;

/// The partition a push without one goes to.
pub const DEFAULT_PARTITION: &str = "Default";

/// A request the API refuses, with the status to answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct BadRequest {
    pub status: u16,
    pub message: String,
}

impl BadRequest {
    pub fn new(message: impl Into<String>) -> BadRequest {
        BadRequest { status: 400, message: message.into() }
    }

    pub fn too_large(message: impl Into<String>) -> BadRequest {
        BadRequest { status: 413, message: message.into() }
    }
}

/// Checks a transactionId: non-empty, at most [`MAX_TRANSACTION_ID_BYTES`],
/// without U+0000. It is compared byte for byte, never normalised: an id is
/// the producer's, and two spellings are two ids. PostgreSQL's text cannot
/// hold U+0000, so an id with one would fail the whole bundle it joined;
/// it is refused here, before it joins one.
pub fn validate_transaction_id(field: impl Display, id: &str) -> Result<(), BadRequest> {
    if id.is_empty() {
        return Err(BadRequest::new(format!("{field}: must not be empty (omit it to get the message id)")));
    }
    if id.len() > MAX_TRANSACTION_ID_BYTES {
        return Err(BadRequest::new(format!("{field}: {} bytes exceed the limit of {MAX_TRANSACTION_ID_BYTES}", id.len())));
    }
    if id.contains('\0') {
        return Err(nul_refused(field));
    }
    Ok(())
}

/// The refusal of a string holding U+0000, which PostgreSQL's text and
/// jsonb cannot hold.
pub fn nul_refused(field: impl Display) -> BadRequest {
    BadRequest::new(format!("{field}: must not contain the character U+0000"))
}

/// Refuses a JSON value with U+0000 in any string or key: such a value
/// cannot become `jsonb` (a configure's options, a KV value).
pub fn refuse_nul_in(field: impl Display, value: &Value) -> Result<(), BadRequest> {
    fn holds_nul(value: &Value) -> bool {
        match value {
            Value::String(s) => s.contains('\0'),
            Value::Array(items) => items.iter().any(holds_nul),
            Value::Object(fields) => fields.iter().any(|(k, v)| k.contains('\0') || holds_nul(v)),
            Value::Null | Value::Bool(_) | Value::Number(_) => false,
        }
    }
    if holds_nul(value) { Err(nul_refused(field)) } else { Ok(()) }
}

/// Validates a queue or partition name given as a JSON value.
pub fn name_value(field: impl Display + Copy, value: Value) -> Result<String, BadRequest> {
    match value {
        Value::String(name) => checked_name(field, name),
        other => Err(BadRequest::new(format!("{field}: expected a string, got {}", type_name(&other)))),
    }
}

/// A queue or partition name, validated and in Unicode's composed form
/// (NFC): names that differ only in how an accented letter is encoded name
/// one queue. Non-empty, at most 255 bytes (once composed), no control
/// characters (`\x1f` separates names in layer 1's key, and PostgreSQL's
/// text cannot hold U+0000).
pub fn checked_name(field: impl Display, name: String) -> Result<String, BadRequest> {
    let name = match unicode_normalization::is_nfc_quick(name.chars()) {
        unicode_normalization::IsNormalized::Yes => name,
        _ => name.nfc().collect(),
    };
    validate_name(field, &name)?;
    Ok(name)
}

/// [`checked_name`]'s rules, on a name already composed.
pub(crate) fn validate_name(field: impl Display, name: &str) -> Result<(), BadRequest> {
    if name.is_empty() {
        return Err(BadRequest::new(format!("{field}: must not be empty")));
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(BadRequest::new(format!("{field}: {} bytes exceed the limit of {MAX_NAME_BYTES}", name.len())));
    }
    if name.chars().any(char::is_control) {
        return Err(BadRequest::new(format!("{field}: must not contain control characters")));
    }
    Ok(())
}

pub(crate) fn parse_json<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, BadRequest> {
    serde_json::from_slice(body).map_err(|error| {
        if error.is_eof() {
            BadRequest::new(format!("body: truncated JSON ({error})"))
        } else {
            BadRequest::new(format!("body: malformed JSON ({error})"))
        }
    })
}

/// A JSON array's elements, as views of the request's text: `{field}:
/// expected an array` for anything else, 413 past `max` elements.
pub(crate) fn elements(field: impl Display, raw: &RawValue, max: usize) -> Result<Vec<&RawValue>, BadRequest> {
    if raw_type_name(raw) != ARRAY {
        return Err(BadRequest::new(format!("{field}: expected an array, got {}", raw_type_name(raw))));
    }
    let elements: Vec<&RawValue> =
        serde_json::from_str(raw.get()).map_err(|error| BadRequest::new(format!("{field}: {}", without_position(&error))))?;
    if elements.len() > max {
        return Err(BadRequest::too_large(format!("{field}: {} operations exceed the limit of {max}", elements.len())));
    }
    Ok(elements)
}

/// Reads a JSON object into `T` (a request's typed wire form), refusing it
/// with the path of the field at fault: `{at}.{field}: {what}`, or
/// `{at}: expected an object` for anything but an object.
pub(crate) fn object<'a, T: Deserialize<'a>>(at: impl Display, raw: &'a RawValue) -> Result<T, BadRequest> {
    if raw_type_name(raw) != OBJECT {
        return Err(BadRequest::new(format!("{at}: expected an object, got {}", raw_type_name(raw))));
    }
    let mut deserializer = serde_json::Deserializer::from_str(raw.get());
    serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
        let path = error.path().to_string();
        let what = without_position(error.inner());
        if path == "." { BadRequest::new(format!("{at}: {what}")) } else { BadRequest::new(format!("{at}.{path}: {what}")) }
    })
}

/// The body of a KV or timers call: `{"operations": [...]}`.
#[derive(Deserialize)]
pub(crate) struct OperationsBody<'a> {
    #[serde(borrow, default)]
    pub operations: Option<&'a RawValue>,
}

/// Reads a field that is present at all, `null` included, as `Some`: with
/// `#[serde(default)]`, an absent field stays `None`.
pub(crate) fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(deserializer).map(Some)
}

/// serde_json's message without the " at line L column C" it appends: the
/// field's path says where.
fn without_position(error: &serde_json::Error) -> String {
    let message = error.to_string();
    match message.rfind(" at line ") {
        Some(at) if error.line() > 0 => message[..at].to_owned(),
        _ => message,
    }
}

/// A raw value's JSON type, for error messages, from its first byte (a raw
/// value starts at its first character, never at whitespace).
pub(crate) fn raw_type_name(raw: &RawValue) -> &'static str {
    match raw.get().as_bytes().first() {
        Some(b'{') => OBJECT,
        Some(b'[') => ARRAY,
        Some(b'"') => STRING,
        Some(b't' | b'f') => "a boolean",
        Some(b'n') => NULL,
        _ => "a number",
    }
}

pub(crate) const NULL: &str = "null";
pub(crate) const STRING: &str = "a string";
pub(crate) const ARRAY: &str = "an array";
pub(crate) const OBJECT: &str = "an object";

/// A value's JSON type, for error messages.
pub fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => NULL,
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => STRING,
        Value::Array(_) => ARRAY,
        Value::Object(_) => OBJECT,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_limit_is_inclusive() {
        assert!(checked_name("queue", "q".repeat(MAX_NAME_BYTES)).is_ok());
        assert!(checked_name("queue", "q".repeat(MAX_NAME_BYTES + 1)).is_err());
    }
}
