//! Keys: KV operations and `once`, with Queen's wire.
//!
//! `once` is a `putIfAbsent` of `true` with `required`. Every verdict is
//! computed by `stile.kv_apply` (`host/sql/functions/kv.sql`) on the key's row under
//! its lock, in the caller's transaction; this module validates and
//! normalises the operations first, so that a malformed request is refused
//! whole, naming the field, before anything is sent.

use deadpool_postgres::GenericClient;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::api::{BadRequest, type_name};
use crate::db::{Db, DbError};

/// Most operations in one call.
pub const MAX_OPS: usize = 256;
/// The largest value, as JSON text.
pub const MAX_VALUE_BYTES: usize = 64 << 10;
/// The longest key, in UTF-8 bytes.
pub const MAX_KEY_BYTES: usize = 1024;
/// The largest page of `getPrefix`, and its default.
pub const MAX_PAGE: u32 = 1000;
pub const DEFAULT_PAGE: u32 = 100;

/// One validated operation, as `stile.kv_apply` reads it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KvOp {
    pub op: OpKind,
    pub ns: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keys: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    pub keys_only: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value: Option<Value>,
    /// Seconds to live; `None` with a value: forever.
    pub ttl: Option<u64>,
    pub expect: Option<u64>,
    pub required: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delta: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max: Option<i64>,
}

/// The operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum OpKind {
    Get,
    GetMany,
    GetPrefix,
    Check,
    Put,
    PutIfAbsent,
    Delete,
    Incr,
}

impl OpKind {
    fn parse(name: &str) -> Option<OpKind> {
        Some(match name {
            "get" => OpKind::Get,
            "getMany" => OpKind::GetMany,
            "getPrefix" => OpKind::GetPrefix,
            "check" => OpKind::Check,
            "put" => OpKind::Put,
            "putIfAbsent" => OpKind::PutIfAbsent,
            "delete" => OpKind::Delete,
            "incr" => OpKind::Incr,
            _ => return None,
        })
    }

    /// Whether the operation stores a value, and so needs an expiry.
    fn stores(self) -> bool {
        matches!(self, OpKind::Put | OpKind::PutIfAbsent | OpKind::Incr)
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

/// Parses a list of operations: a JSON array, or an object with
/// `operations` (the standalone route accepts both).
pub fn parse_ops(context: OpsContext, ops: &Value) -> Result<Vec<KvOp>, BadRequest> {
    let field = context.field;
    let Value::Array(ops) = ops else {
        return Err(BadRequest::new(format!("{field}: expected an array, got {}", type_name(ops))));
    };
    if ops.len() > MAX_OPS {
        return Err(BadRequest::too_large(format!("{field}: {} operations exceed the limit of {MAX_OPS}", ops.len())));
    }
    ops.iter().enumerate().map(|(i, op)| parse_op(context, &format!("{field}[{i}]"), op)).collect()
}

/// The body of `POST /api/v1/kv`: `{"operations": [...]}` or a bare array.
pub fn parse_batch(body: &[u8]) -> Result<Vec<KvOp>, BadRequest> {
    let root: Value = crate::api::parse_json(body)?;
    let context = OpsContext { field: "operations", in_transaction: false };
    let ops = match root {
        Value::Array(_) => parse_ops(context, &root)?,
        Value::Object(mut root) => match root.remove("operations") {
            Some(ops) => parse_ops(context, &ops)?,
            None => return Err(BadRequest::new("operations: missing")),
        },
        other => return Err(BadRequest::new(format!("body: expected an object or an array, got {}", type_name(&other)))),
    };
    if ops.is_empty() {
        return Err(BadRequest::new("operations: must not be empty"));
    }
    Ok(ops)
}

/// The body of `PUT /api/v1/kv/{ns}/{key}`: `{"value", "ttlSeconds" | "forever",
/// "expect"?}`, a `put` of that key.
pub fn parse_put(ns: &str, key: &str, body: &[u8]) -> Result<KvOp, BadRequest> {
    let Value::Object(mut fields) = crate::api::parse_json(body)? else {
        return Err(BadRequest::new("body: expected an object with \"value\" and \"ttlSeconds\" or \"forever\""));
    };
    fields.insert("op".into(), Value::from("put"));
    fields.insert("ns".into(), Value::from(ns));
    fields.insert("key".into(), Value::from(key));
    parse_op(OpsContext { field: "body", in_transaction: false }, "body", &Value::Object(fields))
}

/// A `get` or `delete` of one key named by the path.
pub fn path_op(op: OpKind, ns: &str, key: &str) -> Result<KvOp, BadRequest> {
    let mut fields = Map::new();
    fields.insert("op".into(), Value::from(if op == OpKind::Get { "get" } else { "delete" }));
    fields.insert("ns".into(), Value::from(ns));
    fields.insert("key".into(), Value::from(key));
    parse_op(OpsContext { field: "path", in_transaction: false }, "path", &Value::Object(fields))
}

/// What `stile.kv_apply` answered.
#[derive(Clone, Debug, PartialEq)]
pub struct Applied {
    /// One result per operation, in order, as the API answers them.
    pub results: Vec<Value>,
    /// The first `required` operation that did not apply: everything of the
    /// call (and of its transaction) is rolled back.
    pub failed: Option<usize>,
}

impl Applied {
    /// The answer of a lost precondition: `kvReason`, and the `value` and
    /// `version` a reader would have seen.
    pub fn precondition_failure(&self, failed: usize, failed_index: usize) -> Map<String, Value> {
        let result = &self.results[failed];
        let mut out = Map::new();
        out.insert("ok".into(), Value::Bool(false));
        out.insert("reason".into(), Value::from("kv_precondition"));
        out.insert("failedIndex".into(), Value::from(failed_index));
        out.insert("kvReason".into(), result.get("reason").cloned().unwrap_or(Value::Null));
        out.insert("version".into(), result.get("version").cloned().unwrap_or(Value::Null));
        out.insert("value".into(), result.get("value").cloned().unwrap_or(Value::Null));
        out
    }
}

/// The most bytes the results of one call may hold (as PostgreSQL's jsonb);
/// past it the call is refused whole with SQLSTATE [`ANSWER_TOO_LARGE`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AnswerLimit(pub i64);

impl AnswerLimit {
    pub fn bytes(bytes: usize) -> AnswerLimit {
        AnswerLimit(i64::try_from(bytes).unwrap_or(i64::MAX))
    }
}

/// The SQLSTATE under which `stile.kv_apply` refuses an answer past its
/// [`AnswerLimit`].
pub const ANSWER_TOO_LARGE: &str = "SK002";

/// Applies `ops` in the open transaction of `client`. The caller rolls back
/// when [`Applied::failed`] is set.
pub async fn apply_in(client: &impl GenericClient, ops: &[KvOp], limit: AnswerLimit) -> Result<Applied, DbError> {
    let json = serde_json::to_value(ops).expect("operations serialise");
    let stmt = client.prepare_cached("SELECT stile.kv_apply($1::jsonb, $2) AS answer").await?;
    let row = client.query_one(&stmt, &[&json, &limit.0]).await?;
    applied(row.try_get("answer")?, ops.len())
}

/// The SQLSTATE under which `stile.kv_apply_atomic` raises a lost
/// precondition, its answer as the message.
const PRECONDITION_LOST: &str = "SK001";

/// Applies `ops` as one statement: all of them, or, when a `required` one
/// does not apply, none (the statement is aborted).
pub async fn apply(db: &Db, ops: &[KvOp], limit: AnswerLimit) -> Result<Applied, DbError> {
    let client = db.pool().get().await?;
    let json = serde_json::to_value(ops).expect("operations serialise");
    let stmt = client.prepare_cached("SELECT stile.kv_apply_atomic($1::jsonb, $2) AS answer").await?;
    match client.query_one(&stmt, &[&json, &limit.0]).await {
        Ok(row) => applied(row.try_get("answer")?, ops.len()),
        Err(error) => match error.as_db_error() {
            Some(db) if db.code().code() == PRECONDITION_LOST => {
                let answer = serde_json::from_str(db.message())
                    .map_err(|e| DbError::Protocol(format!("stile.kv_apply_atomic raised an answer that is not JSON: {e}")))?;
                applied(answer, ops.len())
            }
            _ => Err(error.into()),
        },
    }
}

/// Reads `stile.kv_apply`'s answer for `count` operations.
fn applied(answer: Value, count: usize) -> Result<Applied, DbError> {
    let results = match answer.get("results") {
        Some(Value::Array(results)) => results.clone(),
        _ => return Err(DbError::Protocol("stile.kv_apply answered no results".into())),
    };
    let failed = answer.get("failed").and_then(Value::as_u64).map(|i| i as usize);
    if results.len() != count || failed.is_some_and(|i| i >= results.len()) {
        return Err(DbError::Protocol(format!("stile.kv_apply answered {} results for {count} operations", results.len())));
    }
    Ok(Applied { results, failed })
}

/// Deletes keys whose time has passed, up to `limit`; answers how many.
pub async fn purge(db: &Db, limit: i32) -> Result<i64, DbError> {
    let client = db.pool().get().await?;
    Ok(client.query_one("SELECT stile.kv_purge($1) AS purged", &[&limit]).await?.try_get("purged")?)
}

fn parse_op(context: OpsContext, at: &str, op: &Value) -> Result<KvOp, BadRequest> {
    let Value::Object(fields) = op else {
        return Err(BadRequest::new(format!("{at}: expected an object, got {}", type_name(op))));
    };
    let f = Fields { at, fields };
    let name = f.string("op")?.ok_or_else(|| f.bad("op", "missing"))?;
    let kind = OpKind::parse(&name).ok_or_else(|| {
        f.bad("op", &format!("unknown operation {name:?} (get, getMany, getPrefix, check, put, putIfAbsent, delete, incr)"))
    })?;
    if kind == OpKind::GetPrefix && context.in_transaction {
        return Err(f.bad("op", "getPrefix is not allowed inside a transaction (its cost is not bounded by the caller)"));
    }
    let ns = f.string("ns")?.ok_or_else(|| f.bad("ns", "missing"))?;
    if !valid_ns(&ns) {
        return Err(f.bad("ns", "must match ^[a-z0-9][a-z0-9._-]{0,63}$"));
    }
    let mut out = KvOp {
        op: kind,
        ns,
        key: None,
        keys: None,
        prefix: None,
        after: None,
        limit: None,
        keys_only: false,
        value: None,
        ttl: None,
        expect: None,
        required: f.boolean("required")?.unwrap_or(false),
        delta: None,
        min: None,
        max: None,
    };
    match kind {
        OpKind::GetMany => out.keys = Some(f.keys()?),
        OpKind::GetPrefix => {
            let prefix = f.string("prefix")?.ok_or_else(|| f.bad("prefix", "missing"))?;
            out.prefix = Some(f.key_text("prefix", prefix)?);
            out.after = f.string("after")?.map(|after| f.key_text("after", after)).transpose()?;
            out.limit = Some(match f.integer("limit")? {
                None => DEFAULT_PAGE,
                Some(n) if (1..=i64::from(MAX_PAGE)).contains(&n) => n as u32,
                Some(_) => return Err(f.bad("limit", &format!("must be between 1 and {MAX_PAGE}"))),
            });
            out.keys_only = f.boolean("keysOnly")?.unwrap_or(false);
        }
        _ => {
            let key = f.string("key")?.ok_or_else(|| f.bad("key", "missing"))?;
            out.key = Some(f.key_text("key", key)?);
        }
    }
    if matches!(kind, OpKind::Put | OpKind::PutIfAbsent) {
        let value = f.fields.get("value").ok_or_else(|| f.bad("value", "missing"))?;
        let text = value.to_string();
        if text.len() > MAX_VALUE_BYTES {
            return Err(BadRequest::too_large(format!("{at}.value: {} bytes exceed the limit of {MAX_VALUE_BYTES}", text.len())));
        }
        crate::api::refuse_nul_in(format_args!("{at}.value"), value)?;
        out.value = Some(value.clone());
    }
    if kind.stores() {
        out.ttl = f.expiry()?;
    } else {
        f.refuse(&["ttlSeconds", "forever"], &format!("not taken by {name} (it stores nothing)"))?;
    }
    match kind {
        OpKind::Put | OpKind::Delete | OpKind::Incr => out.expect = f.expect()?,
        OpKind::Check => {
            out.expect =
                Some(f.expect()?.ok_or_else(|| f.bad("expect", "missing (check needs the version the key must be at, or 0)"))?)
        }
        _ => f.refuse(&["expect"], &format!("not taken by {name}"))?,
    }
    if kind == OpKind::Incr {
        out.delta = Some(f.integer("delta")?.unwrap_or(1));
        out.min = f.integer("min")?;
        out.max = f.integer("max")?;
        if let (Some(min), Some(max)) = (out.min, out.max)
            && min > max
        {
            return Err(f.bad("min", "must not exceed max"));
        }
    }
    Ok(out)
}

/// An operation's fields, with error messages that name them.
struct Fields<'a> {
    at: &'a str,
    fields: &'a Map<String, Value>,
}

impl Fields<'_> {
    fn bad(&self, field: &str, what: &str) -> BadRequest {
        BadRequest::new(format!("{}.{field}: {what}", self.at))
    }

    fn string(&self, field: &str) -> Result<Option<String>, BadRequest> {
        match self.fields.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(self.bad(field, &format!("expected a string, got {}", type_name(other)))),
        }
    }

    fn boolean(&self, field: &str) -> Result<Option<bool>, BadRequest> {
        match self.fields.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(self.bad(field, &format!("expected a boolean, got {}", type_name(other)))),
        }
    }

    fn integer(&self, field: &str) -> Result<Option<i64>, BadRequest> {
        match self.fields.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) => n.as_i64().map(Some).ok_or_else(|| self.bad(field, "expected an integer")),
            Some(other) => Err(self.bad(field, &format!("expected an integer, got {}", type_name(other)))),
        }
    }

    fn refuse(&self, fields: &[&str], why: &str) -> Result<(), BadRequest> {
        match fields.iter().find(|f| self.fields.contains_key(**f)) {
            Some(field) => Err(self.bad(field, why)),
            None => Ok(()),
        }
    }

    fn key_text(&self, field: &str, key: String) -> Result<String, BadRequest> {
        validate_key(format_args!("{}.{field}", self.at), &key)?;
        Ok(key)
    }

    fn keys(&self) -> Result<Vec<String>, BadRequest> {
        let keys = match self.fields.get("keys") {
            Some(Value::Array(keys)) if !keys.is_empty() => keys,
            Some(Value::Array(_)) => return Err(self.bad("keys", "must not be empty")),
            Some(other) => return Err(self.bad("keys", &format!("expected an array, got {}", type_name(other)))),
            None => return Err(self.bad("keys", "missing")),
        };
        if keys.len() > MAX_OPS {
            return Err(self.bad("keys", &format!("{} keys exceed the limit of {MAX_OPS}", keys.len())));
        }
        keys.iter()
            .enumerate()
            .map(|(i, key)| match key {
                Value::String(key) => self.key_text(&format!("keys[{i}]"), key.clone()),
                other => Err(self.bad(&format!("keys[{i}]"), &format!("expected a string, got {}", type_name(other)))),
            })
            .collect()
    }

    /// Exactly one of `ttlSeconds` (a positive integer) and `forever: true`.
    fn expiry(&self) -> Result<Option<u64>, BadRequest> {
        let ttl = self.fields.get("ttlSeconds").filter(|v| !v.is_null());
        let forever = self.fields.get("forever").filter(|v| !v.is_null());
        match (ttl, forever) {
            (Some(_), Some(_)) | (None, None) => Err(BadRequest::new(format!(
                "{}: exactly one of ttlSeconds or forever is required (kv_expiry_not_specified)",
                self.at
            ))),
            (None, Some(Value::Bool(true))) => Ok(None),
            (None, Some(_)) => Err(self.bad("forever", "must be true when given")),
            (Some(ttl), None) => match ttl.as_u64() {
                Some(seconds) if seconds > 0 && seconds <= 100 * 365 * 86_400 => Ok(Some(seconds)),
                _ => Err(self.bad("ttlSeconds", "must be a whole number of seconds from 1 to 100 years (kv_bad_ttl)")),
            },
        }
    }

    /// A version or 0. Versions are PostgreSQL bigints, which cannot hold
    /// one past `i64::MAX`: such a value is refused here rather than
    /// failing the statement.
    fn expect(&self) -> Result<Option<u64>, BadRequest> {
        match self.fields.get("expect") {
            None => Ok(None),
            Some(value) => value.as_u64().filter(|&version| i64::try_from(version).is_ok()).map(Some).ok_or_else(|| {
                self.bad("expect", &format!("expected a version (an integer from 0, for \"must not exist\", to {})", i64::MAX))
            }),
        }
    }
}

/// A key (of KV, or a timer's): 1 to [`MAX_KEY_BYTES`] bytes, without
/// U+0000 (which PostgreSQL's text cannot hold).
pub fn validate_key(field: impl std::fmt::Display, key: &str) -> Result<(), BadRequest> {
    if key.is_empty() {
        return Err(BadRequest::new(format!("{field}: must not be empty")));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(BadRequest::new(format!("{field}: {} bytes exceed the limit of {MAX_KEY_BYTES}", key.len())));
    }
    if key.contains('\0') {
        return Err(crate::api::nul_refused(field));
    }
    Ok(())
}

/// `^[a-z0-9][a-z0-9._-]{0,63}$`
fn valid_ns(ns: &str) -> bool {
    let bytes = ns.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 64
        && (bytes[0].is_ascii_lowercase() || bytes[0].is_ascii_digit())
        && bytes.iter().all(|&b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn batch(value: Value) -> Result<Vec<KvOp>, BadRequest> {
        parse_batch(value.to_string().as_bytes())
    }

    #[test]
    fn once_is_a_put_if_absent_with_its_expiry() {
        let ops = batch(json!({"operations": [{"op": "putIfAbsent", "ns": "orders", "key": "ord_1", "value": true,
                                               "ttlSeconds": 60, "required": true}]}))
        .unwrap();
        assert_eq!(ops[0].op, OpKind::PutIfAbsent);
        assert_eq!((ops[0].ttl, ops[0].required, ops[0].value.clone()), (Some(60), true, Some(json!(true))));
        let bare = batch(json!([{"op": "put", "ns": "o", "key": "k", "value": 1, "forever": true}])).unwrap();
        assert_eq!(bare[0].ttl, None);
    }

    #[test]
    fn malformed_operations_are_refused_naming_the_field() {
        let cases = [
            (json!([{"op": "put", "ns": "o", "key": "k", "value": 1}]), "operations[0]: exactly one of ttlSeconds or forever"),
            (json!([{"op": "put", "ns": "o", "key": "k", "value": 1, "ttlSeconds": 0}]), "operations[0].ttlSeconds"),
            (json!([{"op": "get", "ns": "o", "key": "k"}, {"op": "get", "ns": "Bad", "key": "k"}]), "operations[1].ns"),
            (json!([{"op": "frob", "ns": "o", "key": "k"}]), "operations[0].op: unknown operation"),
            (json!([{"op": "get", "ns": "o", "key": ""}]), "operations[0].key: must not be empty"),
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
            (json!({"ops": []}), "operations: missing"),
            (json!([]), "operations: must not be empty"),
        ];
        for (body, expected) in cases {
            let error = batch(body.clone()).expect_err(&body.to_string());
            assert!(error.message.starts_with(expected), "{body}: {}", error.message);
        }
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
    fn a_transaction_refuses_an_unbounded_read() {
        let context = OpsContext { field: "kv", in_transaction: true };
        let error = parse_ops(context, &json!([{"op": "getPrefix", "ns": "o", "prefix": "a"}])).unwrap_err();
        assert!(error.message.starts_with("kv[0].op: getPrefix is not allowed"), "{}", error.message);
    }

    #[test]
    fn namespaces_follow_the_pattern() {
        assert!(valid_ns("orders") && valid_ns("a.b_c-9") && valid_ns(&"a".repeat(64)));
        assert!(!valid_ns("") && !valid_ns("-a") && !valid_ns("A") && !valid_ns(&"a".repeat(65)) && !valid_ns("a/b"));
    }
}
