//! A message's payload: the JSON text as the producer sent it.
//!
//! The gateway never looks inside a payload; it only stores it (`json`, kept
//! as text by PostgreSQL). So it keeps the validated text itself, shared
//! between the request and the flush that writes it, rather than a tree of
//! maps and strings that would be built, cloned for the flush and encoded
//! again: at batches of ten, building, cloning and dropping those trees was
//! about a fifth of the gateway's CPU. The text is also stored exactly as
//! sent, numbers included (a tree would have rounded a large integer to a
//! float).

use std::fmt;
use std::sync::Arc;

use serde_json::Value;
use serde_json::value::RawValue;

/// A validated JSON value, as text.
#[derive(Clone)]
pub struct Payload(Arc<RawValue>);

impl Payload {
    /// The payload of an item that has none.
    pub fn null() -> Payload {
        Payload::from_raw(RawValue::NULL)
    }

    /// A copy of `raw`, which serde_json has already validated.
    pub fn from_raw(raw: &RawValue) -> Payload {
        Payload(Arc::from(raw.to_owned()))
    }

    /// The JSON text, as sent.
    pub fn get(&self) -> &str {
        self.0.get()
    }

    /// The validated value, which serialises as its text, unchanged (bound
    /// to a `json` parameter as `Json(payload.raw())`).
    pub fn raw(&self) -> &RawValue {
        &self.0
    }
}

impl From<&Value> for Payload {
    fn from(value: &Value) -> Payload {
        let raw = serde_json::value::to_raw_value(value).expect("a JSON value always serialises");
        Payload(Arc::from(raw))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_is_kept_as_sent() {
        let raw: &RawValue = serde_json::from_str(r#"{ "b": 1, "a": 123456789012345678901234567890 }"#).unwrap();
        let payload = Payload::from_raw(raw);
        assert_eq!(payload.get(), r#"{ "b": 1, "a": 123456789012345678901234567890 }"#);
        assert_eq!(payload.clone(), payload);
        assert_eq!(Payload::null().get(), "null");
        assert_eq!(Payload::from(&serde_json::json!({"x": [1, "y"]})).get(), r#"{"x":[1,"y"]}"#);
    }
}
