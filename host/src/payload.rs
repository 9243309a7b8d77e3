//! A message's payload: the JSON text as the producer sent it.
//!
//! The gateway never looks inside a payload; it only stores it (`json`, kept
//! as text by PostgreSQL). So it keeps the validated text itself, shared
//! between the request and the flush that writes it, rather than a tree of
//! maps and strings that would be built, cloned for the flush and encoded
//! again: at batches of ten, building, cloning and dropping those trees was
//! about a fifth of the gateway's CPU. A pushed payload is a view of the
//! request's body (no copy of it is made), and it is stored exactly as sent,
//! numbers included (a tree would have rounded a large integer to a float).

use std::fmt;

use bytestring::ByteString;
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;

/// The deepest nesting of arrays and objects a payload may have: serde_json
/// refuses a value nested 128 deep when it decodes one.
pub(crate) const MAX_DEPTH: usize = 127;

/// What the answer to a refused payload says, from the error of
/// [`Payload::checked`]. serde_json reports nesting past its limit as a
/// syntax error by message alone (its error codes are private), and such a
/// payload is well-formed JSON: the answer names the limit instead.
pub fn refusal(error: &serde_json::Error) -> String {
    if error.to_string().starts_with(HOLDS_NUL) {
        let (line, column) = (error.line(), error.column());
        format!("must not contain the character U+0000, which PostgreSQL's jsonb cannot hold (at line {line} column {column})")
    } else if error.to_string().starts_with("recursion limit exceeded") {
        let (line, column) = (error.line(), error.column());
        format!("nests arrays and objects deeper than {MAX_DEPTH} levels (at line {line} column {column})")
    } else {
        format!("malformed JSON ({error})")
    }
}

/// The error [`Payload::checked`] gives a string (or key) holding U+0000:
/// PostgreSQL's `json` keeps the escape as text, but its `jsonb` cannot hold
/// the character, so a reader's `payload::jsonb` over the queue would fail.
const HOLDS_NUL: &str = "a string holds U+0000";

/// A validated JSON value, as text.
#[derive(Clone)]
pub struct Payload(ByteString);

impl Payload {
    /// The payload of an item that has none.
    pub fn null() -> Payload {
        Payload(ByteString::from_static("null"))
    }

    /// A copy of `raw` once it has passed what a full decode checks: every
    /// escape names a character (no lone surrogate) and every number fits a
    /// double; and no string or key holds U+0000. Capturing a raw value checks only the syntax; PostgreSQL's
    /// `json` would take the rest, but a reader decoding it could not.
    pub fn checked(raw: &RawValue) -> Result<Payload, serde_json::Error> {
        serde_json::from_str::<Checked>(raw.get())?;
        Ok(Payload(ByteString::from(raw.get())))
    }

    /// A payload whose text the caller has checked as [`Payload::checked`]
    /// does, without leading or trailing whitespace.
    pub(crate) fn validated(text: ByteString) -> Payload {
        Payload(text)
    }

    /// The JSON text, as sent.
    pub fn get(&self) -> &str {
        &self.0
    }

    /// The JSON text, as sent, sharing its buffer.
    pub fn text(&self) -> &ByteString {
        &self.0
    }

    /// The validated value, which serialises as its text, unchanged. Its
    /// syntax is read again to make it: the push path binds the text itself
    /// (`crate::payload_sql`), and this serves the read paths' answers.
    pub fn raw(&self) -> &RawValue {
        serde_json::from_str(self.get()).expect("a payload is valid JSON")
    }
}

impl From<Box<RawValue>> for Payload {
    fn from(raw: Box<RawValue>) -> Payload {
        Payload(ByteString::from(String::from(Box::<str>::from(raw))))
    }
}

impl From<&Value> for Payload {
    fn from(value: &Value) -> Payload {
        Payload(ByteString::from(value.to_string()))
    }
}

impl PartialEq for Payload {
    fn eq(&self, other: &Payload) -> bool {
        self.get() == other.get()
    }
}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.get())
    }
}

/// A JSON value walked as a full decode walks it, building nothing: strings
/// decoded (borrowed where they hold no escape), numbers parsed.
struct Checked;

impl<'de> Deserialize<'de> for Checked {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Checked, D::Error> {
        deserializer.deserialize_any(CheckedVisitor)
    }
}

struct CheckedVisitor;

impl<'de> Visitor<'de> for CheckedVisitor {
    type Value = Checked;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Checked, E> {
        if text.contains('\0') {
            return Err(E::custom(HOLDS_NUL));
        }
        Ok(Checked)
    }

    fn visit_unit<E>(self) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
        while seq.next_element::<Checked>()?.is_some() {}
        Ok(Checked)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
        while map.next_entry::<Checked, Checked>()?.is_some() {}
        Ok(Checked)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_is_kept_as_sent() {
        let raw: &RawValue = serde_json::from_str(r#"{ "b": 1, "a": 123456789012345678901234567890 }"#).unwrap();
        let payload = Payload::checked(raw).unwrap();
        assert_eq!(payload.get(), r#"{ "b": 1, "a": 123456789012345678901234567890 }"#);
        assert_eq!(payload.clone(), payload);
        assert_eq!(Payload::null().get(), "null");
        assert_eq!(Payload::from(&serde_json::json!({"x": [1, "y"]})).get(), r#"{"x":[1,"y"]}"#);
    }

    #[test]
    fn what_a_full_decode_refuses_is_refused() {
        for text in [r#"{"a": [1e400]}"#, r#"["\ud800"]"#, r#"{"\udc00": 1}"#, r#"["\ud800\u0041"]"#] {
            let raw: &RawValue = serde_json::from_str(text).expect("the syntax is fine");
            assert!(Payload::checked(raw).is_err(), "{text} accepted");
        }
        let raw: &RawValue =
            serde_json::from_str(r#"{"k\u00e9y": ["\ud83d\ude00", -0.0, 18446744073709551616, null, true]}"#).unwrap();
        assert!(Payload::checked(raw).is_ok());
    }

    #[test]
    fn a_refusal_names_the_nesting_limit_or_the_malformed_json() {
        let nested = |depth: usize| format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
        let check = |text: &str| Payload::checked(&RawValue::from_string(text.to_owned()).unwrap()).map(|_| ());
        assert!(check(&nested(MAX_DEPTH)).is_ok());
        let deep = check(&nested(MAX_DEPTH + 1)).unwrap_err();
        assert_eq!(refusal(&deep), format!("nests arrays and objects deeper than {MAX_DEPTH} levels (at line 1 column 128)"));
        let nul = check(r#"{"a": ["x\u0000"]}"#).unwrap_err();
        assert!(refusal(&nul).starts_with("must not contain the character U+0000"), "{}", refusal(&nul));
        let nul_key = check(r#"{"\u0000": 1}"#).unwrap_err();
        assert!(refusal(&nul_key).starts_with("must not contain the character U+0000"), "{}", refusal(&nul_key));
        let out_of_range = check("[1e400]").unwrap_err();
        assert!(refusal(&out_of_range).starts_with("malformed JSON (number out of range"), "{}", refusal(&out_of_range));
    }
}
