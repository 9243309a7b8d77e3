//! Keys: KV operations and `once`, with Queen's wire.
//!
//! `once` is a `putIfAbsent` of `true` with `required`. Every verdict is
//! computed by `stile.kv_apply` (`host/sql/functions/kv.sql`, called from
//! `host/src/kv/sql.rs`) on the key's row under its lock, in the caller's
//! transaction. This module reads each operation into its typed form
//! ([`KvCall`]), so that a malformed request is refused whole, naming the
//! field, before anything is sent; what has rules (a [`Namespace`], a
//! [`Key`], a [`Version`], an [`Expiry`]) is checked where it is read.

pub mod route;
mod sql;

use std::fmt::{self, Display};

use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

use crate::api::{self, BadRequest, DEFAULT_PAGE, MAX_OPS, MAX_PAGE};
pub use sql::{AnswerLimit, Applied, KvResult, apply, apply_in, purge};

/// The largest value, as JSON text.
pub const MAX_VALUE_BYTES: usize = 64 << 10;
/// The longest key, in UTF-8 bytes.
pub const MAX_KEY_BYTES: usize = 1024;

/// One operation on one namespace.
#[derive(Clone, Debug, PartialEq)]
pub struct KvCall {
    pub ns: Namespace,
    /// When it does not apply, everything of its call (and of its
    /// transaction) is rolled back.
    pub required: bool,
    pub op: KvOp,
}

/// What an operation does, with the fields it takes.
#[derive(Clone, Debug, PartialEq)]
pub enum KvOp {
    Get {
        key: Key,
    },
    GetMany {
        keys: Vec<Key>,
    },
    GetPrefix {
        prefix: Key,
        after: Option<Key>,
        limit: u32,
        keys_only: bool,
    },
    /// Applies when the key is at `expect` (0: absent); writes nothing.
    Check {
        key: Key,
        expect: Version,
    },
    Put {
        key: Key,
        value: Value,
        expiry: Expiry,
        expect: Option<Version>,
    },
    PutIfAbsent {
        key: Key,
        value: Value,
        expiry: Expiry,
    },
    Delete {
        key: Key,
        expect: Option<Version>,
    },
    Incr {
        key: Key,
        delta: i64,
        bounds: Bounds,
        expiry: Expiry,
        expect: Option<Version>,
    },
}

/// How long a stored value lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    Seconds(u64),
    Forever,
}

/// An `incr`'s bounds; `min <= max` when both are set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bounds {
    pub min: Option<i64>,
    pub max: Option<i64>,
}

/// A KV namespace: `^[a-z0-9][a-z0-9._-]{0,63}$`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Namespace(String);

impl Namespace {
    pub fn parse(text: String) -> Result<Namespace, String> {
        let bytes = text.as_bytes();
        let valid = !bytes.is_empty()
            && bytes.len() <= 64
            && (bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit())
            && bytes.iter().all(|&b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-'));
        if valid { Ok(Namespace(text)) } else { Err("must match ^[a-z0-9][a-z0-9._-]{0,63}$".into()) }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A key, of KV or a timer's: 1 to [`MAX_KEY_BYTES`] bytes, without U+0000
/// (which PostgreSQL's text cannot hold). Compared byte for byte.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Key(String);

impl Key {
    pub fn parse(text: String) -> Result<Key, String> {
        if text.is_empty() {
            return Err("must not be empty".into());
        }
        if text.len() > MAX_KEY_BYTES {
            return Err(format!("{} bytes exceed the limit of {MAX_KEY_BYTES}", text.len()));
        }
        if text.contains('\0') {
            return Err("must not contain the character U+0000".into());
        }
        Ok(Key(text))
    }

    /// [`Key::parse`], refused as a request naming `field`.
    pub fn named(field: impl Display, text: &str) -> Result<Key, BadRequest> {
        Key::parse(text.to_owned()).map_err(|what| BadRequest::new(format!("{field}: {what}")))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A key's version, or 0 for "must not exist". Versions are PostgreSQL
/// bigints, which cannot hold one past `i64::MAX`: such a value is refused
/// where it is read rather than failing the statement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Version(i64);

impl Version {
    pub fn get(self) -> i64 {
        self.0
    }
}

/// The answer of a lost precondition: the first `required` operation that
/// did not apply (`failedIndex`, counted in its request), why (`kvReason`),
/// and the `value` and `version` a reader would have seen.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PreconditionLost {
    ok: bool,
    reason: &'static str,
    failed_index: usize,
    kv_reason: Option<String>,
    version: Option<i64>,
    value: Option<Value>,
}

impl Applied {
    /// The answer of the operation at `failed`, at `failed_index` in its
    /// request.
    pub fn precondition_lost(&self, failed: usize, failed_index: usize) -> PreconditionLost {
        let result = &self.results[failed];
        PreconditionLost {
            ok: false,
            reason: "kv_precondition",
            failed_index,
            kv_reason: result.reason.clone(),
            version: result.version,
            value: result.value().cloned(),
        }
    }
}

/// Where a list of operations sits in its request, for error messages
/// (`operations[2].ttlSeconds`, `kv[0].ns`).
#[derive(Clone, Copy, Debug)]
pub struct OpsContext {
    pub field: &'static str,
    /// Whether the operations ride a transaction, where a read whose cost the
    /// caller does not bound (`getPrefix`) is refused.
    pub in_transaction: bool,
}

/// Parses a list of operations, a JSON array.
pub fn parse_ops(context: OpsContext, ops: &RawValue) -> Result<Vec<KvCall>, BadRequest> {
    let field = context.field;
    let ops = api::elements(field, ops, MAX_OPS)?;
    ops.iter().enumerate().map(|(i, op)| parse_op(context, &format!("{field}[{i}]"), op)).collect()
}

/// The body of `POST /api/v1/kv`: `{"operations": [...]}` or a bare array.
pub fn parse_batch(body: &[u8]) -> Result<Vec<KvCall>, BadRequest> {
    let root: &RawValue = api::parse_json(body)?;
    let context = OpsContext { field: "operations", in_transaction: false };
    let ops = match api::raw_type_name(root) {
        api::ARRAY => parse_ops(context, root)?,
        api::OBJECT => {
            let batch: api::OperationsBody<'_> = api::object("body", root)?;
            parse_ops(context, batch.operations.ok_or_else(|| BadRequest::new("operations: missing"))?)?
        }
        other => return Err(BadRequest::new(format!("body: expected an object or an array, got {other}"))),
    };
    if ops.is_empty() {
        return Err(BadRequest::new("operations: must not be empty"));
    }
    Ok(ops)
}

/// The body of `PUT /api/v1/kv/{ns}/{key}`: `{"value", "ttlSeconds" |
/// "forever", "expect"?}`, a `put` of that key.
pub fn parse_put(ns: &str, key: &str, body: &[u8]) -> Result<KvCall, BadRequest> {
    let root: &RawValue = api::parse_json(body)?;
    if api::raw_type_name(root) != api::OBJECT {
        return Err(BadRequest::new("body: expected an object with \"value\" and \"ttlSeconds\" or \"forever\""));
    }
    let mut wire: WireOp = api::object("body", root)?;
    wire.op = Some(OpName::Put);
    let ns = Namespace::parse(ns.to_owned()).map_err(|what| BadRequest::new(format!("body.ns: {what}")))?;
    wire.ns = Some(ns);
    wire.key = Some(Key::named("body.key", key)?);
    wire.into_call(OpsContext { field: "body", in_transaction: false }, "body")
}

/// What a request on one key's path does with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PathVerb {
    Get,
    Delete,
}

/// A `get` or `delete` of one key named by the path.
pub fn path_op(verb: PathVerb, ns: &str, key: &str) -> Result<KvCall, BadRequest> {
    let ns = Namespace::parse(ns.to_owned()).map_err(|what| BadRequest::new(format!("path.ns: {what}")))?;
    let key = Key::named("path.key", key)?;
    let op = match verb {
        PathVerb::Get => KvOp::Get { key },
        PathVerb::Delete => KvOp::Delete { key, expect: None },
    };
    Ok(KvCall { ns, required: false, op })
}

fn parse_op(context: OpsContext, at: &str, op: &RawValue) -> Result<KvCall, BadRequest> {
    let wire: WireOp = api::object(at, op)?;
    wire.into_call(context, at)
}

/// An operation as sent: every field it may carry, each read into its type
/// (and checked) as it is read. [`WireOp::into_call`] checks which ones its
/// operation needs and takes.
#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireOp {
    op: Option<OpName>,
    ns: Option<Namespace>,
    key: Option<Key>,
    keys: Option<Vec<Key>>,
    prefix: Option<Key>,
    after: Option<Key>,
    limit: Option<i64>,
    keys_only: Option<bool>,
    /// `Some("null")` for `"value": null`, a value like any other; the text
    /// as sent, so that its numbers can be checked as written.
    #[serde(default, deserialize_with = "present_text")]
    value: Option<Box<RawValue>>,
    ttl_seconds: Option<TtlSeconds>,
    /// Present at all (`null` too), for the operations that take none.
    #[serde(default, deserialize_with = "api::present")]
    forever: Option<Value>,
    expect: Option<Version>,
    required: Option<bool>,
    delta: Option<i64>,
    min: Option<i64>,
    max: Option<i64>,
}

impl WireOp {
    /// The operation the fields make, each field moved into it.
    fn into_call(self, context: OpsContext, at: &str) -> Result<KvCall, BadRequest> {
        let bad = |field: &str, what: &str| BadRequest::new(format!("{at}.{field}: {what}"));
        let name = self.op.ok_or_else(|| bad("op", "missing"))?;
        if name == OpName::GetPrefix && context.in_transaction {
            return Err(bad("op", "getPrefix is not allowed inside a transaction (its cost is not bounded by the caller)"));
        }
        let WireOp {
            op: _,
            ns,
            key,
            keys,
            prefix,
            after,
            limit,
            keys_only,
            value,
            ttl_seconds,
            forever,
            expect,
            required,
            delta,
            min,
            max,
        } = self;
        let ns = ns.ok_or_else(|| bad("ns", "missing"))?;
        let required = required.unwrap_or(false);
        if !name.stores() {
            if ttl_seconds.is_some() {
                return Err(bad("ttlSeconds", &format!("not taken by {name} (it stores nothing)")));
            }
            if forever.is_some() {
                return Err(bad("forever", &format!("not taken by {name} (it stores nothing)")));
            }
        }
        if !matches!(name, OpName::Put | OpName::Delete | OpName::Incr | OpName::Check) && expect.is_some() {
            return Err(bad("expect", &format!("not taken by {name}")));
        }
        let key = || key.ok_or_else(|| bad("key", "missing"));
        let expiry = || expiry_of(at, ttl_seconds, forever.as_ref());
        let op = match name {
            OpName::Get => KvOp::Get { key: key()? },
            OpName::GetMany => KvOp::GetMany { keys: keys_of(at, keys)? },
            OpName::GetPrefix => KvOp::GetPrefix {
                prefix: prefix.ok_or_else(|| bad("prefix", "missing"))?,
                after,
                limit: match limit {
                    None => DEFAULT_PAGE,
                    Some(n) if (1..=i64::from(MAX_PAGE)).contains(&n) => n as u32,
                    Some(_) => return Err(bad("limit", &format!("must be between 1 and {MAX_PAGE}"))),
                },
                keys_only: keys_only.unwrap_or(false),
            },
            OpName::Check => KvOp::Check {
                key: key()?,
                expect: expect.ok_or_else(|| bad("expect", "missing (check needs the version the key must be at, or 0)"))?,
            },
            OpName::Put => KvOp::Put { key: key()?, value: value_of(at, value)?, expiry: expiry()?, expect },
            OpName::PutIfAbsent => KvOp::PutIfAbsent { key: key()?, value: value_of(at, value)?, expiry: expiry()? },
            OpName::Delete => KvOp::Delete { key: key()?, expect },
            OpName::Incr => {
                let bounds = Bounds { min, max };
                if let Bounds { min: Some(min), max: Some(max) } = bounds
                    && min > max
                {
                    return Err(bad("min", "must not exceed max"));
                }
                KvOp::Incr { key: key()?, delta: delta.unwrap_or(1), bounds, expiry: expiry()?, expect }
            }
        };
        Ok(KvCall { ns, required, op })
    }
}

fn keys_of(at: &str, keys: Option<Vec<Key>>) -> Result<Vec<Key>, BadRequest> {
    match keys {
        None => Err(BadRequest::new(format!("{at}.keys: missing"))),
        Some(keys) if keys.is_empty() => Err(BadRequest::new(format!("{at}.keys: must not be empty"))),
        Some(keys) if keys.len() > MAX_OPS => {
            Err(BadRequest::new(format!("{at}.keys: {} keys exceed the limit of {MAX_OPS}", keys.len())))
        }
        Some(keys) => Ok(keys),
    }
}

/// A field's JSON text, present (`null` too).
fn present_text<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Box<RawValue>>, D::Error> {
    Box::<RawValue>::deserialize(deserializer).map(Some)
}

/// The value to store: at most [`MAX_VALUE_BYTES`] as JSON text, no U+0000
/// (jsonb cannot hold it), and no number it would not keep as written.
fn value_of(at: &str, value: Option<Box<RawValue>>) -> Result<Value, BadRequest> {
    let text = value.ok_or_else(|| BadRequest::new(format!("{at}.value: missing")))?;
    if let Some(number) = numbers(text.get()).find(|number| !kept_as_written(number)) {
        return Err(BadRequest::new(format!(
            "{at}.value: the number {number} would not be kept as written: a value's numbers are read as 64-bit \
             integers (-9223372036854775808 to 18446744073709551615) or doubles (up to 17 significant digits, \
             magnitudes up to about 1.8e308); send it as a string"
        )));
    }
    let value: Value = serde_json::from_str(text.get()).map_err(|e| BadRequest::new(format!("{at}.value: {e}")))?;
    let bytes = value.to_string().len();
    if bytes > MAX_VALUE_BYTES {
        return Err(BadRequest::too_large(format!("{at}.value: {bytes} bytes exceed the limit of {MAX_VALUE_BYTES}")));
    }
    api::refuse_nul_in(format_args!("{at}.value"), &value)?;
    Ok(value)
}

/// The number tokens of a JSON text, in order (none inside strings).
fn numbers(json: &str) -> impl Iterator<Item = &str> {
    let bytes = json.as_bytes();
    let mut at = 0;
    let mut in_string = false;
    std::iter::from_fn(move || {
        while at < bytes.len() {
            let byte = bytes[at];
            if in_string {
                match byte {
                    b'\\' => at += 1,
                    b'"' => in_string = false,
                    _ => {}
                }
                at += 1;
            } else if byte == b'"' {
                in_string = true;
                at += 1;
            } else if byte == b'-' || byte.is_ascii_digit() {
                let start = at;
                while at < bytes.len() && matches!(bytes[at], b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E') {
                    at += 1;
                }
                return Some(&json[start..at]);
            } else {
                at += 1;
            }
        }
        None
    })
}

/// Whether a JSON number reads back as the number written once stored: the
/// gateway reads a value's numbers as 64-bit integers, or else as the
/// nearest double, and writes them back as such (as does its read of them
/// from PostgreSQL). `0.1` and `1e2` are kept (the double's shortest digits
/// are the same number); `123456789012345678901234567890` and
/// `0.12345678901234567890` are not.
fn kept_as_written(number: &str) -> bool {
    let Ok(read) = serde_json::from_str::<Value>(number) else { return false };
    decimal(number).is_some_and(|written| decimal(&read.to_string()) == Some(written))
}

/// A JSON number's value as sign, significant digits (no leading or
/// trailing zeros) and the power of ten of the last digit; zero has no
/// digits and no sign.
fn decimal(number: &str) -> Option<(bool, String, i64)> {
    let (negative, rest) = match number.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, number),
    };
    let (mantissa, exponent) = match rest.find(['e', 'E']) {
        Some(e) => (&rest[..e], rest[e + 1..].parse::<i64>().ok()?),
        None => (rest, 0),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits: String = whole.chars().chain(fraction.chars()).collect();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let significant = digits.trim_start_matches('0');
    let trimmed = significant.trim_end_matches('0');
    if trimmed.is_empty() {
        return Some((false, String::new(), 0));
    }
    let power = exponent - fraction.len() as i64 + (significant.len() - trimmed.len()) as i64;
    Some((negative, trimmed.to_owned(), power))
}

/// Exactly one of `ttlSeconds` and `forever: true`.
fn expiry_of(at: &str, ttl_seconds: Option<TtlSeconds>, forever: Option<&Value>) -> Result<Expiry, BadRequest> {
    match (ttl_seconds, forever.filter(|v| !v.is_null())) {
        (Some(_), Some(_)) | (None, None) => {
            Err(BadRequest::new(format!("{at}: exactly one of ttlSeconds or forever is required (kv_expiry_not_specified)")))
        }
        (None, Some(Value::Bool(true))) => Ok(Expiry::Forever),
        (None, Some(_)) => Err(BadRequest::new(format!("{at}.forever: must be true when given"))),
        (Some(TtlSeconds(seconds)), None) => Ok(Expiry::Seconds(seconds)),
    }
}

/// The operations' names on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OpName {
    Get,
    GetMany,
    GetPrefix,
    Check,
    Put,
    PutIfAbsent,
    Delete,
    Incr,
}

const OP_NAMES: [(&str, OpName); 8] = [
    ("get", OpName::Get),
    ("getMany", OpName::GetMany),
    ("getPrefix", OpName::GetPrefix),
    ("check", OpName::Check),
    ("put", OpName::Put),
    ("putIfAbsent", OpName::PutIfAbsent),
    ("delete", OpName::Delete),
    ("incr", OpName::Incr),
];

impl OpName {
    /// Whether the operation stores a value, and so needs an expiry.
    fn stores(self) -> bool {
        matches!(self, OpName::Put | OpName::PutIfAbsent | OpName::Incr)
    }
}

impl Display for OpName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (name, _) = OP_NAMES.iter().find(|(_, op)| op == self).expect("every operation is named");
        f.write_str(name)
    }
}

impl<'de> Deserialize<'de> for OpName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<OpName, D::Error> {
        let name = String::deserialize(deserializer)?;
        OP_NAMES.iter().find(|(text, _)| *text == name).map(|&(_, op)| op).ok_or_else(|| {
            de::Error::custom(format!(
                "unknown operation {name:?} (get, getMany, getPrefix, check, put, putIfAbsent, delete, incr)"
            ))
        })
    }
}

impl<'de> Deserialize<'de> for Namespace {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Namespace, D::Error> {
        Namespace::parse(String::deserialize(deserializer)?).map_err(de::Error::custom)
    }
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Key, D::Error> {
        Key::parse(String::deserialize(deserializer)?).map_err(de::Error::custom)
    }
}

impl<'de> Deserialize<'de> for Version {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Version, D::Error> {
        let value = Value::deserialize(deserializer)?;
        value.as_u64().and_then(|version| i64::try_from(version).ok()).map(Version).ok_or_else(|| {
            de::Error::custom(format!("expected a version (an integer from 0, for \"must not exist\", to {})", i64::MAX))
        })
    }
}

/// `ttlSeconds`: a whole number of seconds from 1 to 100 years.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct TtlSeconds(u64);

impl<'de> Deserialize<'de> for TtlSeconds {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<TtlSeconds, D::Error> {
        let value = Value::deserialize(deserializer)?;
        match value.as_u64() {
            Some(seconds) if seconds > 0 && seconds <= 100 * 365 * 86_400 => Ok(TtlSeconds(seconds)),
            _ => Err(de::Error::custom("must be a whole number of seconds from 1 to 100 years (kv_bad_ttl)")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn batch(value: Value) -> Result<Vec<KvCall>, BadRequest> {
        parse_batch(value.to_string().as_bytes())
    }

    #[test]
    fn once_is_a_put_if_absent_with_its_expiry() {
        let ops = batch(json!({"operations": [{"op": "putIfAbsent", "ns": "orders", "key": "ord_1", "value": true,
                                               "ttlSeconds": 60, "required": true}]}))
        .unwrap();
        let KvOp::PutIfAbsent { value, expiry, .. } = &ops[0].op else { panic!("{:?}", ops[0]) };
        assert_eq!((expiry, ops[0].required, value), (&Expiry::Seconds(60), true, &json!(true)));
        let bare = batch(json!([{"op": "put", "ns": "o", "key": "k", "value": null, "forever": true}])).unwrap();
        assert!(matches!(&bare[0].op, KvOp::Put { expiry: Expiry::Forever, value: Value::Null, .. }), "{bare:?}");
    }

    #[test]
    fn malformed_operations_are_refused_naming_the_field() {
        let cases = [
            (json!([{"op": "put", "ns": "o", "key": "k", "value": 1}]), "operations[0]: exactly one of ttlSeconds or forever"),
            (json!([{"op": "put", "ns": "o", "key": "k", "value": 1, "ttlSeconds": 0}]), "operations[0].ttlSeconds"),
            (json!([{"op": "get", "ns": "o", "key": "k"}, {"op": "get", "ns": "Bad", "key": "k"}]), "operations[1].ns"),
            (json!([{"op": "frob", "ns": "o", "key": "k"}]), "operations[0].op: unknown operation"),
            (json!([{"op": "get", "ns": "o", "key": ""}]), "operations[0].key: must not be empty"),
            (json!([{"op": "get", "ns": "o", "key": 7}]), "operations[0].key: invalid type"),
            (json!([{"op": "get", "ns": "o", "key": "a\u{0}b"}]), "operations[0].key: must not contain the character U+0000"),
            (json!([{"op": "get", "ns": "o"}]), "operations[0].key: missing"),
            (json!([{"op": "check", "ns": "o", "key": "k"}]), "operations[0].expect: missing"),
            (json!([{"op": "check", "ns": "o", "key": "k", "expect": 9_223_372_036_854_775_808u64}]), "operations[0].expect"),
            (json!([{"op": "delete", "ns": "o", "key": "k", "expect": u64::MAX}]), "operations[0].expect"),
            (
                json!([{"op": "putIfAbsent", "ns": "o", "key": "k", "value": 1, "forever": true, "expect": 3}]),
                "operations[0].expect",
            ),
            (json!([{"op": "delete", "ns": "o", "key": "k", "ttlSeconds": 3}]), "operations[0].ttlSeconds"),
            (json!([{"op": "incr", "ns": "o", "key": "k", "delta": 1.5, "forever": true}]), "operations[0].delta"),
            (json!([{"op": "incr", "ns": "o", "key": "k", "min": 5, "max": 1, "forever": true}]), "operations[0].min"),
            (json!([{"op": "getPrefix", "ns": "o"}]), "operations[0].prefix: missing"),
            (json!([{"op": "getMany", "ns": "o", "keys": []}]), "operations[0].keys: must not be empty"),
            (json!([{"op": "getMany", "ns": "o", "keys": ["a", ""]}]), "operations[0].keys[1]: must not be empty"),
            (json!([{"op": "put", "ns": "o", "key": "k", "forever": true}]), "operations[0].value: missing"),
            (json!([7]), "operations[0]: expected an object, got a number"),
            (json!({"operations": {}}), "operations: expected an array, got an object"),
            (json!({"ops": []}), "operations: missing"),
            (json!([]), "operations: must not be empty"),
            (json!("x"), "body: expected an object or an array, got a string"),
        ];
        for (body, expected) in cases {
            let error = batch(body.clone()).expect_err(&body.to_string());
            assert!(error.message.starts_with(expected), "{body}: {}", error.message);
        }
    }

    #[test]
    fn a_put_by_path_takes_its_key_from_the_path() {
        let call = parse_put("orders", "k1", br#"{"value": {"a": 1}, "ttlSeconds": 5, "expect": 0}"#).unwrap();
        assert_eq!(call.ns.as_str(), "orders");
        let KvOp::Put { key, expect, .. } = &call.op else { panic!("{call:?}") };
        assert_eq!((key.as_str(), expect.map(Version::get)), ("k1", Some(0)));
        let error = parse_put("orders", "k1", br#"{"value": 1}"#).unwrap_err();
        assert!(error.message.starts_with("body: exactly one of ttlSeconds"), "{}", error.message);
        assert!(parse_put("Orders", "k1", br#"{"value": 1, "forever": true}"#).unwrap_err().message.starts_with("body.ns"));
    }

    /// jsonb prints a double in plain decimal notation (the largest as 309
    /// digits); serde_json's `float_roundtrip` reads every such text back as
    /// the same double, so that a stored value is always readable, including
    /// one written before values were checked at all.
    #[test]
    fn every_double_reads_back_from_the_notation_jsonb_prints() {
        for x in [f64::MAX, f64::MIN, 1e308, -1e308, 5e-324, f64::MIN_POSITIVE, 1.5, 0.1, 18_446_744_073_709_551_615u64 as f64] {
            // A double's `Display` is that plain notation, from the same
            // shortest digits that jsonb was given.
            let plain = x.to_string();
            let back: Value = serde_json::from_str(&plain).unwrap_or_else(|error| panic!("{plain}: {error}"));
            assert_eq!(back.as_f64(), Some(x), "{plain}");
            assert!(batch(json!([{"op": "put", "ns": "o", "key": "k", "value": [{"x": x}], "forever": true}])).is_ok(), "{x}");
        }
    }

    #[test]
    fn numbers_are_found_outside_strings_only() {
        let found: Vec<&str> = numbers(r#"{"a-1": [1, -2.5e+3, "3 \" 4", {"b": 0}], "c": 1E2}"#).collect();
        assert_eq!(found, ["1", "-2.5e+3", "0", "1E2"]);
    }

    #[test]
    fn a_number_is_kept_when_it_reads_back_as_written() {
        for kept in [
            "0",
            "-0",
            "0.0",
            "1e2",
            "100",
            "1.0",
            "0.1",
            "-0.1",
            "1.5e-7",
            "9007199254740993",
            "-9223372036854775808",
            "18446744073709551615",
            "1e300",
            "1.7976931348623157e308",
            "123456789012345680000000000000",
        ] {
            assert!(kept_as_written(kept), "{kept}");
        }
        for changed in [
            "123456789012345678901234567890",
            "18446744073709551616",
            "-9223372036854775809",
            "0.12345678901234567890",
            "1e999",
            "2.00000000000000000001",
        ] {
            assert!(!kept_as_written(changed), "{changed}");
        }
        let body =
            br#"[{"op": "put", "ns": "o", "key": "k", "value": {"n": [1, 123456789012345678901234567890]}, "forever": true}]"#;
        let refused = parse_batch(body).unwrap_err();
        assert!(
            refused.message.starts_with("operations[0].value: the number 123456789012345678901234567890"),
            "{}",
            refused.message
        );
    }

    proptest::proptest! {
        /// Every 64-bit integer and every double, as serde_json writes it, is
        /// kept; an integer past 64 bits, or a decimal, of more than 17
        /// significant digits (no double has more) is refused.
        #[test]
        fn integers_and_doubles_are_kept_longer_digits_refused(
            signed in proptest::num::i64::ANY,
            unsigned in proptest::num::u64::ANY,
            double in proptest::num::f64::NORMAL | proptest::num::f64::SUBNORMAL | proptest::num::f64::ZERO,
            integer in "[1-9][0-9]{19,40}[1-9]",
            digits in "[1-9][0-9]{16,40}[1-9]",
            exponent in -400i64..400,
            negative in proptest::bool::ANY,
        ) {
            proptest::prop_assert!(kept_as_written(&signed.to_string()));
            proptest::prop_assert!(kept_as_written(&unsigned.to_string()));
            proptest::prop_assert!(kept_as_written(&serde_json::to_string(&double).unwrap()));
            let sign = if negative { "-" } else { "" };
            // Past 20 digits an integer is past 64 bits, and more digits
            // than a double has.
            let long = format!("{sign}{integer}");
            proptest::prop_assert!(!kept_as_written(&long), "{}", long);
            let long = format!("{sign}{}.{}e{exponent}", &digits[..1], &digits[1..]);
            proptest::prop_assert!(!kept_as_written(&long), "{}", long);
        }
    }

    #[test]
    fn a_transaction_refuses_an_unbounded_read() {
        let context = OpsContext { field: "kv", in_transaction: true };
        let ops = RawValue::from_string(json!([{"op": "getPrefix", "ns": "o", "prefix": "a"}]).to_string()).unwrap();
        let error = parse_ops(context, &ops).unwrap_err();
        assert!(error.message.starts_with("kv[0].op: getPrefix is not allowed"), "{}", error.message);
    }

    #[test]
    fn namespaces_follow_the_pattern() {
        let valid = |ns: &str| Namespace::parse(ns.to_owned()).is_ok();
        assert!(valid("orders") && valid("a.b_c-9") && valid(&"a".repeat(64)));
        assert!(!valid("") && !valid("-a") && !valid("A") && !valid(&"a".repeat(65)) && !valid("a/b"));
    }
}
