//! KV's calls: `stile.kv_apply` and its atomic form, and the purge of
//! expired keys (`host/sql/functions/kv.sql`).
//!
//! Operations go to PostgreSQL as one jsonb array in the form `kv_apply`
//! reads ([`SqlOp`]); its answer comes back as typed [`KvResult`]s.

use deadpool_postgres::GenericClient;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{Expiry, KvCall, KvOp, Version};
use crate::db::{Db, DbError};

/// The most bytes the results of one call may hold (as PostgreSQL's jsonb);
/// past it the call is refused whole with SQLSTATE
/// [`ANSWER_TOO_LARGE`](crate::db::ANSWER_TOO_LARGE).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AnswerLimit(pub i64);

impl AnswerLimit {
    pub fn bytes(bytes: usize) -> AnswerLimit {
        AnswerLimit(i64::try_from(bytes).unwrap_or(i64::MAX))
    }
}

/// The SQLSTATE under which `stile.kv_apply_atomic` raises a lost
/// precondition, its answer as the message.
const PRECONDITION_LOST: &str = "SK001";

/// What `stile.kv_apply` answered.
#[derive(Clone, Debug, PartialEq)]
pub struct Applied {
    /// One result per operation, in order.
    pub results: Vec<KvResult>,
    /// The first `required` operation that did not apply: everything of the
    /// call (and of its transaction) is rolled back.
    pub failed: Option<usize>,
}

/// One operation's result: what the gateway decides on, typed, and every
/// field as the API answers it (`wire`: `index`, `op`, `key`, `value`,
/// `items`, … as `stile.kv_apply` built them).
#[derive(Clone, Debug, PartialEq)]
pub struct KvResult {
    /// Whether a write or a check applied; `None` for a read.
    pub applied: Option<bool>,
    /// Whether a `get` found its key.
    pub found: Option<bool>,
    /// The key's version after the operation (or as read).
    pub version: Option<i64>,
    /// Why a write did not apply.
    pub reason: Option<String>,
    pub wire: Map<String, Value>,
}

/// The fields of a result the gateway reads.
#[derive(Deserialize)]
struct Verdict {
    applied: Option<bool>,
    found: Option<bool>,
    version: Option<i64>,
    reason: Option<String>,
}

impl KvResult {
    fn read(value: Value) -> Result<KvResult, DbError> {
        let Verdict { applied, found, version, reason } = Verdict::deserialize(&value)
            .map_err(|e| DbError::Protocol(format!("stile.kv_apply answered a result of another shape: {e}")))?;
        let Value::Object(wire) = value else {
            return Err(DbError::Protocol("stile.kv_apply answered a result that is not an object".into()));
        };
        Ok(KvResult { applied, found, version, reason, wire })
    }

    /// The stored value a reader of the key would have seen.
    pub fn value(&self) -> Option<&Value> {
        self.wire.get("value")
    }
}

/// `stile.kv_apply`'s answer.
#[derive(Deserialize)]
struct Answer {
    results: Vec<Value>,
    failed: Option<usize>,
}

/// Applies `calls` in the open transaction of `client`. The caller rolls back
/// when [`Applied::failed`] is set.
pub async fn apply_in(client: &impl GenericClient, calls: &[KvCall], limit: AnswerLimit) -> Result<Applied, DbError> {
    let ops = sql_ops(calls);
    let stmt = client.prepare_cached("SELECT stile.kv_apply($1::jsonb, $2) AS answer").await?;
    let row = client.query_one(&stmt, &[&ops, &limit.0]).await?;
    applied(row.try_get("answer")?, calls.len())
}

/// Applies `calls` as one statement: all of them, or, when a `required` one
/// does not apply, none (the statement is aborted).
pub async fn apply(db: &Db, calls: &[KvCall], limit: AnswerLimit) -> Result<Applied, DbError> {
    let client = db.pool().get().await?;
    let ops = sql_ops(calls);
    let stmt = client.prepare_cached("SELECT stile.kv_apply_atomic($1::jsonb, $2) AS answer").await?;
    match client.query_one(&stmt, &[&ops, &limit.0]).await {
        Ok(row) => applied(row.try_get("answer")?, calls.len()),
        Err(error) => match error.as_db_error() {
            Some(db) if db.code().code() == PRECONDITION_LOST => {
                let answer = serde_json::from_str(db.message())
                    .map_err(|e| DbError::Protocol(format!("stile.kv_apply_atomic raised an answer that is not JSON: {e}")))?;
                applied(answer, calls.len())
            }
            _ => Err(error.into()),
        },
    }
}

/// Deletes keys whose time has passed, up to `limit`; answers how many.
pub async fn purge(db: &Db, limit: i32) -> Result<i64, DbError> {
    let client = db.pool().get().await?;
    Ok(client.query_one("SELECT stile.kv_purge($1) AS purged", &[&limit]).await?.try_get("purged")?)
}

/// Reads `stile.kv_apply`'s answer for `count` operations.
fn applied(answer: Value, count: usize) -> Result<Applied, DbError> {
    let Answer { results, failed } =
        Answer::deserialize(answer).map_err(|e| DbError::Protocol(format!("stile.kv_apply answered no results ({e})")))?;
    if results.len() != count || failed.is_some_and(|i| i >= results.len()) {
        return Err(DbError::Protocol(format!("stile.kv_apply answered {} results for {count} operations", results.len())));
    }
    let results = results.into_iter().map(KvResult::read).collect::<Result<_, _>>()?;
    Ok(Applied { results, failed })
}

fn sql_ops(ops: &[KvCall]) -> Value {
    serde_json::to_value(ops.iter().map(SqlOp::of).collect::<Vec<_>>()).expect("operations serialise")
}

/// An operation as `stile.kv_apply` reads it: `ttl` in seconds or null for
/// forever, `expect` null, 0 (must not exist) or a version.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SqlOp<'a> {
    op: &'static str,
    ns: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    keys: Option<Vec<&'a str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    prefix: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    after: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    limit: Option<u32>,
    keys_only: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<&'a Value>,
    ttl: Option<u64>,
    expect: Option<i64>,
    required: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    delta: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    min: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max: Option<i64>,
}

impl<'a> SqlOp<'a> {
    fn of(call: &'a KvCall) -> SqlOp<'a> {
        let mut op = SqlOp {
            op: "",
            ns: call.ns.as_str(),
            key: None,
            keys: None,
            prefix: None,
            after: None,
            limit: None,
            keys_only: false,
            value: None,
            ttl: None,
            expect: None,
            required: call.required,
            delta: None,
            min: None,
            max: None,
        };
        let ttl = |expiry: &Expiry| match expiry {
            Expiry::Seconds(seconds) => Some(*seconds),
            Expiry::Forever => None,
        };
        let expect = |expect: &Option<Version>| expect.map(Version::get);
        match &call.op {
            KvOp::Get { key } => (op.op, op.key) = ("get", Some(key.as_str())),
            KvOp::GetMany { keys } => (op.op, op.keys) = ("getMany", Some(keys.iter().map(|k| k.as_str()).collect())),
            KvOp::GetPrefix { prefix, after, limit, keys_only } => {
                op.op = "getPrefix";
                op.prefix = Some(prefix.as_str());
                op.after = after.as_ref().map(|k| k.as_str());
                op.limit = Some(*limit);
                op.keys_only = *keys_only;
            }
            KvOp::Check { key, expect } => (op.op, op.key, op.expect) = ("check", Some(key.as_str()), Some(expect.get())),
            KvOp::Put { key, value, expiry, expect: e } => {
                (op.op, op.key, op.value, op.ttl, op.expect) = ("put", Some(key.as_str()), Some(value), ttl(expiry), expect(e));
            }
            KvOp::PutIfAbsent { key, value, expiry } => {
                (op.op, op.key, op.value, op.ttl) = ("putIfAbsent", Some(key.as_str()), Some(value), ttl(expiry));
            }
            KvOp::Delete { key, expect: e } => (op.op, op.key, op.expect) = ("delete", Some(key.as_str()), expect(e)),
            KvOp::Incr { key, delta, bounds, expiry, expect: e } => {
                (op.op, op.key, op.ttl, op.expect) = ("incr", Some(key.as_str()), ttl(expiry), expect(e));
                (op.delta, op.min, op.max) = (Some(*delta), bounds.min, bounds.max);
            }
        }
        op
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::kv::parse_batch;

    /// The form `stile.kv_apply` reads, field for field, for each operation.
    #[test]
    fn operations_go_to_postgresql_in_the_form_kv_apply_reads() {
        let calls = parse_batch(
            json!([
                {"op": "putIfAbsent", "ns": "o", "key": "k", "value": true, "ttlSeconds": 60, "required": true},
                {"op": "incr", "ns": "o", "key": "n", "delta": 2, "max": 9, "forever": true, "expect": 0},
                {"op": "getPrefix", "ns": "o", "prefix": "a", "keysOnly": true},
                {"op": "getMany", "ns": "o", "keys": ["a", "b"]},
            ])
            .to_string()
            .as_bytes(),
        )
        .unwrap();
        assert_eq!(
            sql_ops(&calls),
            json!([
                {"op": "putIfAbsent", "ns": "o", "key": "k", "keysOnly": false, "value": true, "ttl": 60, "expect": null,
                 "required": true},
                {"op": "incr", "ns": "o", "key": "n", "keysOnly": false, "ttl": null, "expect": 0, "required": false,
                 "delta": 2, "max": 9},
                {"op": "getPrefix", "ns": "o", "prefix": "a", "limit": 100, "keysOnly": true, "ttl": null, "expect": null,
                 "required": false},
                {"op": "getMany", "ns": "o", "keys": ["a", "b"], "keysOnly": false, "ttl": null, "expect": null,
                 "required": false},
            ])
        );
    }

    #[test]
    fn an_answer_of_another_shape_is_a_protocol_error() {
        let answer = json!({"results": [{"index": 0, "op": "get", "found": true, "version": 3}], "failed": null});
        let parsed = applied(answer.clone(), 1).unwrap();
        assert_eq!((parsed.results[0].found, parsed.results[0].version, parsed.failed), (Some(true), Some(3), None));
        assert!(applied(answer, 2).is_err());
        assert!(applied(json!({"results": [7], "failed": null}), 1).is_err());
    }
}
