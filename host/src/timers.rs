//! Timers: messages scheduled for later, with Queen's wire, and the firer
//! every gateway runs.
//!
//! A timer is a row of `stile.timers` (`host/sql/functions/timers.sql`), an upsert on
//! queue and key. A fire deletes the row and pushes its message (its `txn` as
//! the transactionId, the message id promised at schedule time) in one
//! PostgreSQL transaction, through the push function: it either commits both
//! or neither, so a gateway killed mid-fire leaves the timer pending or the
//! message stored, never both and never neither. Rows another firer holds
//! are skipped (`FOR UPDATE SKIP LOCKED`), so each timer fires once however
//! many gateways run. A fire that finds its `txn` already stored in the
//! window (a retried fire, or a re-schedule with the same `txn`) stores
//! nothing; a re-schedule with a new `txn`, or after the window, is a second
//! message.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use deadpool_postgres::GenericClient;
use serde::Serialize;
use serde_json::Value;
use serde_json::value::RawValue;
use tokio::sync::Notify;
use uuid::Uuid;

use crate::api::{self, BadRequest, Payload, type_name};
use crate::db::DbError;
use crate::gateway::{Gateway, TransactionalPush};
use crate::kv;

/// The furthest ahead a timer may be scheduled.
pub const HORIZON_MS: i64 = 90 * 86_400_000;
/// Most operations in one call.
pub const MAX_OPS: usize = 256;
/// Most timers one fire takes.
pub const FIRE_BATCH: i32 = 512;
/// The longest a firer sleeps between looks at the table: a timer scheduled
/// through another gateway fires at most this late.
pub const MAX_SLEEP: Duration = Duration::from_millis(500);

/// Fields the server owns: refused by name rather than dropped.
const SERVER_OWNED: &[&str] =
    &["messageId", "message_id", "deliverAt", "deliver_at", "delaySeconds", "delay_seconds", "attempts"];

/// One validated operation, as `stile.timers_apply` reads it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TimerOp {
    pub op: TimerOpKind,
    pub queue: String,
    pub timer_key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub txn: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message_id: Option<Uuid>,
    /// The decoded payload's JSON text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<i64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum TimerOpKind {
    Schedule,
    Reschedule,
    Cancel,
}

/// Parses a list of timer operations; errors name `{field}[i].name`.
pub fn parse_ops(field: &str, ops: &Value) -> Result<Vec<TimerOp>, BadRequest> {
    let Value::Array(ops) = ops else {
        return Err(BadRequest::new(format!("{field}: expected an array, got {}", type_name(ops))));
    };
    if ops.len() > MAX_OPS {
        return Err(BadRequest::too_large(format!("{field}: {} operations exceed the limit of {MAX_OPS}", ops.len())));
    }
    ops.iter().enumerate().map(|(i, op)| parse_op(&format!("{field}[{i}]"), op)).collect()
}

/// The body of `POST /api/v1/timers`: `{"operations": [...]}`.
pub fn parse_batch(body: &[u8]) -> Result<Vec<TimerOp>, BadRequest> {
    let Value::Object(mut root) = api::parse_json(body)? else {
        return Err(BadRequest::new("body: expected an object with an \"operations\" array"));
    };
    let ops = root.remove("operations").ok_or_else(|| BadRequest::new("operations: missing"))?;
    let ops = parse_ops("operations", &ops)?;
    if ops.is_empty() {
        return Err(BadRequest::new("operations: must not be empty"));
    }
    Ok(ops)
}

/// A cancel of the timer a path names.
pub fn cancel_op(queue: &str, timer_key: &str, txn: Option<String>) -> Result<TimerOp, BadRequest> {
    let queue = api::checked_name("queue", queue.to_owned())?;
    kv::validate_key("timerKey", timer_key)?;
    if let Some(txn) = &txn {
        api::validate_transaction_id("txn", txn)?;
    }
    Ok(TimerOp {
        op: TimerOpKind::Cancel,
        queue,
        timer_key: timer_key.to_owned(),
        partition: None,
        txn,
        message_id: None,
        payload: None,
        delay_ms: None,
    })
}

/// Applies `ops` in the open transaction of `client`: one result per
/// operation.
pub async fn apply_in(client: &impl GenericClient, ops: &[TimerOp]) -> Result<Vec<Value>, DbError> {
    let json = serde_json::to_value(ops).expect("operations serialise");
    let stmt = client.prepare_cached("SELECT stile.timers_apply($1::jsonb) AS results").await?;
    let answer: Value = client.query_one(&stmt, &[&json]).await?.try_get("results")?;
    match answer {
        Value::Array(results) if results.len() == ops.len() => Ok(results),
        _ => Err(DbError::Protocol("stile.timers_apply answered a result per operation".into())),
    }
}

/// Applies `ops` in a transaction of their own.
pub async fn apply(gateway: &Gateway, ops: &[TimerOp]) -> Result<Vec<Value>, DbError> {
    // One statement: its own transaction, all of it or nothing.
    let client = gateway.db().pool().get().await?;
    let results = apply_in(&client, ops).await?;
    wake_firer(gateway, ops);
    Ok(results)
}

/// Wakes this gateway's firer once `ops` have committed, if they scheduled
/// anything: a timer due now fires without waiting for the firer's sleep.
pub fn wake_firer(gateway: &Gateway, ops: &[TimerOp]) {
    if ops.iter().any(|op| op.op != TimerOpKind::Cancel) {
        gateway.timers_scheduled().notify_one();
    }
}

/// One pending timer, `None` when there is none.
pub async fn peek(gateway: &Gateway, queue: &str, timer_key: &str) -> Result<Option<Value>, DbError> {
    let client = gateway.db().pool().get().await?;
    let row = client
        .query_opt(
            "SELECT stile.timer_row(t) || jsonb_build_object('found', true, 'payload', t.payload::text) AS timer \
             FROM stile.timers t WHERE t.queue = $1 AND t.timer_key = $2::text COLLATE \"C\"",
            &[&queue, &timer_key],
        )
        .await?;
    let Some(row) = row else { return Ok(None) };
    let mut value: Value = row.try_get("timer")?;
    // The wire carries payloads as base64 of their bytes.
    if let Some(Value::String(text)) = value.get("payload").cloned() {
        value["payload"] = Value::from(base64::engine::general_purpose::STANDARD.encode(text.as_bytes()));
    }
    Ok(Some(value))
}

/// A page of a queue's pending timers, by key.
pub async fn list(gateway: &Gateway, queue: &str, after: Option<&str>, limit: i32) -> Result<Value, DbError> {
    let client = gateway.db().pool().get().await?;
    Ok(client.query_one("SELECT stile.timers_list($1, $2, $3) AS page", &[&queue, &after, &limit]).await?.try_get("page")?)
}

/// Fires due timers until none is due, then sleeps until the next one is
/// (at most [`MAX_SLEEP`], less when a schedule through this gateway wakes
/// it). Runs for the gateway's life.
pub async fn fire_loop(gateway: Arc<Gateway>) {
    let wake: Arc<Notify> = gateway.timers_scheduled().clone();
    loop {
        let sleep = match fire_due(&gateway).await {
            Ok(fired) if fired > 0 => continue,
            Ok(_) => next_due(&gateway).await.unwrap_or(MAX_SLEEP),
            Err(error) => {
                tracing::warn!(error = %error, "firing timers failed; retrying");
                Duration::from_secs(1)
            }
        };
        tokio::select! {
            () = tokio::time::sleep(sleep) => {}
            () = wake.notified() => {}
        }
    }
}

/// Takes up to [`FIRE_BATCH`] due timers and pushes their messages, in one
/// transaction. Answers how many fired.
pub async fn fire_due(gateway: &Gateway) -> Result<usize, DbError> {
    let mut client = gateway.db().pool().get().await?;
    let tx = client.transaction().await?;
    let stmt = tx
        .prepare_cached("SELECT queue, partition, txn, message_id, payload::text AS payload FROM stile.timers_take_due($1)")
        .await?;
    let rows = tx.query(&stmt, &[&FIRE_BATCH]).await?;
    if rows.is_empty() {
        tx.rollback().await?;
        return Ok(0);
    }
    let mut pushes = Vec::with_capacity(rows.len());
    for row in &rows {
        let payload: String = row.try_get("payload")?;
        let raw = RawValue::from_string(payload).map_err(|e| DbError::Protocol(format!("a timer's payload: {e}")))?;
        pushes.push(TransactionalPush {
            queue: row.try_get("queue")?,
            partition: row.try_get("partition")?,
            transaction_id: row.try_get("txn")?,
            message_id: row.try_get("message_id")?,
            payload: Payload::from(raw),
        });
    }
    let planned = gateway.plan_pushes(&tx, pushes).await?;
    let pushed = gateway.push_planned(&tx, planned).await?;
    tx.commit().await?;
    gateway.committed_elsewhere(pushed.committed).await;
    gateway.metrics().timers_fired(rows.len() as u64);
    Ok(rows.len())
}

async fn next_due(gateway: &Gateway) -> Result<Duration, DbError> {
    let client = gateway.db().pool().get().await?;
    let ms: Option<i64> = client.query_one("SELECT stile.timers_next_due_ms() AS due_in_ms", &[]).await?.try_get("due_in_ms")?;
    Ok(ms.map_or(MAX_SLEEP, |ms| Duration::from_millis(ms.max(0) as u64).min(MAX_SLEEP)))
}

fn parse_op(at: &str, op: &Value) -> Result<TimerOp, BadRequest> {
    let Value::Object(fields) = op else {
        return Err(BadRequest::new(format!("{at}: expected an object, got {}", type_name(op))));
    };
    let bad = |field: &str, what: &str| BadRequest::new(format!("{at}.{field}: {what}"));
    if let Some(field) = fields.keys().find(|f| SERVER_OWNED.contains(&f.as_str())) {
        return Err(bad(field, "is the server's to set (a timer carries only a relative delayMs)"));
    }
    let string = |field: &str| -> Result<Option<String>, BadRequest> {
        match fields.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(bad(field, &format!("expected a string, got {}", type_name(other)))),
        }
    };
    let op = match string("op")?.as_deref() {
        Some("schedule") => TimerOpKind::Schedule,
        Some("reschedule") => TimerOpKind::Reschedule,
        Some("cancel") => TimerOpKind::Cancel,
        Some(other) => return Err(bad("op", &format!("unknown operation {other:?} (schedule, reschedule, cancel)"))),
        None => return Err(bad("op", "missing")),
    };
    let queue = string("queue")?.ok_or_else(|| bad("queue", "missing"))?;
    let queue = api::checked_name(format_args!("{at}.queue"), queue)?;
    let timer_key = string("timerKey")?.ok_or_else(|| bad("timerKey", "missing"))?;
    kv::validate_key(format_args!("{at}.timerKey"), &timer_key)?;
    let txn = string("txn")?;
    if let Some(txn) = &txn {
        api::validate_transaction_id(format_args!("{at}.txn"), txn)?;
    }
    let mut out = TimerOp { op, queue, timer_key, partition: None, txn, message_id: None, payload: None, delay_ms: None };
    if op == TimerOpKind::Cancel {
        return Ok(out);
    }
    if fields.get("payloadZstd").is_some_and(|v| v != &Value::Bool(false)) {
        return Err(bad("payloadZstd", "compressed timer payloads are not supported; send the payload uncompressed"));
    }
    let partition = string("partition")?.unwrap_or_else(|| api::DEFAULT_PARTITION.to_owned());
    let partition = api::checked_name(format_args!("{at}.partition"), partition)?;
    let delay_ms = match fields.get("delayMs") {
        Some(Value::Number(n)) => n.as_i64().ok_or_else(|| bad("delayMs", "expected an integer number of milliseconds"))?,
        Some(other) => return Err(bad("delayMs", &format!("expected an integer, got {}", type_name(other)))),
        None => return Err(bad("delayMs", "missing")),
    };
    if delay_ms > HORIZON_MS {
        return Err(bad("delayMs", "exceeds the 90-day horizon (timer_horizon_exceeded)"));
    }
    // A delay in the past means "due now"; one further back than the
    // horizon is a mistake, and would leave PostgreSQL's timestamp range.
    if delay_ms < -HORIZON_MS {
        return Err(bad("delayMs", "is more than the 90-day horizon in the past"));
    }
    let payload = string("payload")?.ok_or_else(|| bad("payload", "missing (base64 of the message's JSON)"))?;
    out.payload = Some(decode_payload(&payload).map_err(|what| bad("payload", &what))?);
    out.partition = Some(partition);
    out.txn = Some(out.txn.take().unwrap_or_else(|| Uuid::now_v7().to_string()));
    out.message_id = Some(Uuid::now_v7());
    out.delay_ms = Some(delay_ms);
    Ok(out)
}

/// Base64 of a JSON document, decoded to its validated text.
fn decode_payload(base64_text: &str) -> Result<String, String> {
    let bytes = base64::engine::general_purpose::STANDARD.decode(base64_text).map_err(|e| format!("not base64 ({e})"))?;
    let text = String::from_utf8(bytes).map_err(|_| "the decoded bytes are not UTF-8 JSON".to_owned())?;
    let raw = RawValue::from_string(text.trim().to_owned()).map_err(|e| format!("the decoded bytes are not JSON ({e})"))?;
    let checked = Payload::checked(&raw).map_err(|e| format!("the decoded bytes are not JSON ({e})"))?;
    if checked.get().contains("\\u0000") {
        return Err("the decoded JSON must not contain the character U+0000".into());
    }
    Ok(checked.get().to_owned())
}

/// A list page's query: `after` and `limit` (1 to 1000, 100 by default).
pub fn page_query(query: &HashMap<String, String>) -> Result<(Option<String>, i32), BadRequest> {
    let after = query.get("after").filter(|a| !a.is_empty()).cloned();
    if let Some(after) = &after {
        kv::validate_key("after", after)?;
    }
    let limit = match query.get("limit") {
        None => 100,
        Some(raw) => match raw.parse::<i32>() {
            Ok(n) if (1..=1000).contains(&n) => n,
            _ => return Err(BadRequest::new(format!("limit: must be an integer from 1 to 1000, got {raw:?}"))),
        },
    };
    Ok((after, limit))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn b64(text: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(text)
    }

    #[test]
    fn a_schedule_gets_a_message_id_a_partition_and_its_decoded_payload() {
        let ops = parse_batch(
            json!({"operations": [{"op": "schedule", "queue": "q", "timerKey": "k", "delayMs": -5,
                                   "txn": "t1", "payload": b64(" {\"a\": 1} ")}]})
            .to_string()
            .as_bytes(),
        )
        .unwrap();
        assert_eq!(ops[0].payload.as_deref(), Some("{\"a\": 1}"));
        assert_eq!(ops[0].partition.as_deref(), Some("Default"));
        assert!(ops[0].message_id.is_some());
        assert_eq!((ops[0].txn.as_deref(), ops[0].delay_ms), (Some("t1"), Some(-5)));
    }

    #[test]
    fn malformed_operations_are_refused_naming_the_field() {
        let cases = [
            (json!({"op": "schedule", "queue": "q", "timerKey": "k", "delayMs": 1}), "operations[0].payload: missing"),
            (
                json!({"op": "schedule", "queue": "q", "timerKey": "k", "delayMs": 1, "payload": "%%"}),
                "operations[0].payload: not base64",
            ),
            (
                json!({"op": "schedule", "queue": "q", "timerKey": "k", "delayMs": 1, "payload": b64("nope")}),
                "operations[0].payload: the decoded",
            ),
            (json!({"op": "schedule", "queue": "q", "timerKey": "k", "payload": b64("1")}), "operations[0].delayMs: missing"),
            (
                json!({"op": "schedule", "queue": "q", "timerKey": "k", "delayMs": HORIZON_MS + 1, "payload": b64("1")}),
                "operations[0].delayMs: exceeds",
            ),
            (
                json!({"op": "schedule", "queue": "q", "timerKey": "k", "delayMs": 1, "payload": b64("1"), "deliverAt": 5}),
                "operations[0].deliverAt",
            ),
            (json!({"op": "fire", "queue": "q", "timerKey": "k"}), "operations[0].op: unknown"),
            (json!({"op": "cancel", "queue": "", "timerKey": "k"}), "operations[0].queue: must not be empty"),
            (json!({"op": "cancel", "queue": "q", "timerKey": ""}), "operations[0].timerKey"),
        ];
        for (op, expected) in cases {
            let body = json!({ "operations": [op] }).to_string();
            let error = parse_batch(body.as_bytes()).expect_err(&body);
            assert!(error.message.starts_with(expected), "{body}: {}", error.message);
        }
    }
}
