//! Timers: messages scheduled for later, with Queen's wire, and the firer
//! every gateway runs.
//!
//! A timer is a row of `stile.timers` (`host/sql/functions/timers.sql`, called
//! from `host/src/timers/sql.rs`), an upsert on queue and key. A fire deletes
//! the row and pushes its message (its `txn` as the transactionId, the
//! message id promised at schedule time) in one PostgreSQL transaction,
//! through the push function: it either commits both or neither, so a
//! gateway killed mid-fire leaves the timer pending or the message stored,
//! never both and never neither. Rows another firer holds are skipped (`FOR
//! UPDATE SKIP LOCKED`), so each timer fires once however many gateways run.
//! A fire that finds its `txn` already stored in the window (a retried fire,
//! or a re-schedule with the same `txn`) stores nothing; a re-schedule with a
//! new `txn`, or after the window, is a second message.

mod firer;
pub mod route;
mod sql;

use std::time::Duration;

use base64::Engine as _;
use serde::Deserialize;
use serde::de::{self, Deserializer};
use serde_json::Value;
use serde_json::value::RawValue;
use uuid::Uuid;

use crate::api::{self, BadRequest, DEFAULT_PAGE, MAX_OPS, MAX_PAGE, Payload, type_name};
use crate::db::DbError;
pub use crate::gateway::FirerWake;
use crate::gateway::Gateway;
use crate::http::query::Query;
use crate::kv::Key;
pub use firer::{FIRE_BATCH, FIRE_BATCH_BYTES, fire_loop};
pub use sql::{Timer, TimerId, TimerPage, TimerResult, TimerStatus, apply_in, next_due};

/// The furthest ahead a timer may be scheduled.
pub const HORIZON_MS: i64 = 90 * 86_400_000;
/// The longest a firer sleeps between looks at the table: a timer scheduled
/// through another gateway fires at most this late.
pub const MAX_SLEEP: Duration = Duration::from_millis(500);

/// One operation on one timer, named by its queue and key.
#[derive(Clone, Debug, PartialEq)]
pub struct TimerCall {
    /// A queue name, validated and composed (NFC).
    pub queue: String,
    pub timer_key: Key,
    pub op: TimerOp,
}

#[derive(Clone, Debug, PartialEq)]
pub enum TimerOp {
    /// Schedules the timer, or replaces the one pending under its key.
    Schedule(Scheduled),
    /// The same as `Schedule`, by its Queen name.
    Reschedule(Scheduled),
    /// Removes the pending timer; `txn` is only echoed when none is.
    Cancel { txn: Option<String> },
}

/// A message to push later, with the ids it will carry chosen now.
#[derive(Clone, Debug, PartialEq)]
pub struct Scheduled {
    /// A partition name, validated and composed (NFC).
    pub partition: String,
    /// The message's transactionId (a new UUID when none was given).
    pub txn: String,
    pub message_id: Uuid,
    /// The payload's JSON text, validated.
    pub payload: String,
    /// From now; a delay in the past is due at once.
    pub delay_ms: i64,
}

impl TimerCall {
    /// Whether the operation may make a timer due.
    fn schedules(&self) -> bool {
        !matches!(self.op, TimerOp::Cancel { .. })
    }
}

/// Wakes this gateway's firer when one of `calls`, committed, schedules a
/// timer: a timer due now fires without waiting for the firer's sleep.
pub fn wake_for(wake: &FirerWake, calls: &[TimerCall]) {
    if calls.iter().any(TimerCall::schedules) {
        wake.wake();
    }
}

/// Parses a list of timer operations; errors name `{field}[i].name`.
pub fn parse_ops(field: &str, ops: &RawValue) -> Result<Vec<TimerCall>, BadRequest> {
    let ops = api::elements(field, ops, MAX_OPS)?;
    ops.iter()
        .enumerate()
        .map(|(i, op)| {
            let at = format!("{field}[{i}]");
            api::object::<WireTimerOp>(&at, op)?.into_call(&at)
        })
        .collect()
}

/// The body of `POST /api/v1/timers`: `{"operations": [...]}`.
pub fn parse_batch(body: &[u8]) -> Result<Vec<TimerCall>, BadRequest> {
    let root: &RawValue = api::parse_json(body)?;
    if api::raw_type_name(root) != api::OBJECT {
        return Err(BadRequest::new("body: expected an object with an \"operations\" array"));
    }
    let batch: api::OperationsBody<'_> = api::object("body", root)?;
    let ops = parse_ops("operations", batch.operations.ok_or_else(|| BadRequest::new("operations: missing"))?)?;
    if ops.is_empty() {
        return Err(BadRequest::new("operations: must not be empty"));
    }
    Ok(ops)
}

/// A cancel of the timer a path names.
pub fn cancel_op(queue: &str, timer_key: &str, txn: Option<String>) -> Result<TimerCall, BadRequest> {
    let queue = api::checked_name("queue", queue.to_owned())?;
    let timer_key = Key::named("timerKey", timer_key)?;
    if let Some(txn) = &txn {
        api::validate_transaction_id("txn", txn)?;
    }
    Ok(TimerCall { queue, timer_key, op: TimerOp::Cancel { txn } })
}

/// Which page of a queue's timers to list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageQuery {
    /// The key the page starts after; the first page when none.
    pub after: Option<Key>,
    /// At most this many timers, 1 to [`MAX_PAGE`].
    pub limit: u32,
}

impl PageQuery {
    /// A list's query string: `after` and `limit` ([`DEFAULT_PAGE`] when absent).
    pub fn parse(query: &Query) -> Result<PageQuery, BadRequest> {
        let after = query.get("after").filter(|a| !a.is_empty()).map(|after| Key::named("after", after)).transpose()?;
        let limit = match query.get("limit") {
            None => DEFAULT_PAGE,
            Some(raw) => match raw.parse::<u32>() {
                Ok(n) if (1..=MAX_PAGE).contains(&n) => n,
                _ => return Err(BadRequest::new(format!("limit: must be an integer from 1 to {MAX_PAGE}, got {raw:?}"))),
            },
        };
        Ok(PageQuery { after, limit })
    }
}

/// Applies `calls` in a transaction of their own (one statement), then
/// wakes the firer.
pub async fn apply(gateway: &Gateway, wake: &FirerWake, calls: &[TimerCall]) -> Result<Vec<TimerResult>, DbError> {
    let client = gateway.db().pool().get().await?;
    let results = apply_in(&client, calls).await?;
    wake_for(wake, calls);
    Ok(results)
}

/// One pending timer as the API shows it: its payload as base64 of its
/// bytes, as the wire carries payloads.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TimerView {
    #[serde(flatten)]
    pub timer: Timer,
    pub found: bool,
    pub payload: String,
}

/// The pending timer under `queue` and `timer_key`, if any.
pub async fn peek(gateway: &Gateway, queue: &str, timer_key: &Key) -> Result<Option<TimerView>, DbError> {
    let pending = sql::pending(gateway.db(), queue, timer_key).await?;
    Ok(pending.map(|sql::Pending { timer, payload }| TimerView {
        timer,
        found: true,
        payload: base64::engine::general_purpose::STANDARD.encode(payload.as_bytes()),
    }))
}

/// Room in a timers page's answer for what surrounds its timers: the
/// brackets, `truncated` and `nextAfter`, a key of up to
/// [`MAX_KEY_BYTES`](crate::kv::MAX_KEY_BYTES) that JSON's escaping may make
/// six times longer.
const PAGE_FRAME_BYTES: usize = 8 << 10;

/// A page of `queue`'s pending timers, by key, after `after`, in an answer
/// of at most `answer_limit` bytes: a page cut by that bound says
/// `truncated` and names its last key, as one cut by its limit of timers
/// does, and a first timer larger than the bound is refused (413 naming
/// it).
pub async fn list(gateway: &Gateway, queue: &str, page: &PageQuery, answer_limit: usize) -> Result<TimerPage, DbError> {
    let max_bytes = answer_limit.saturating_sub(PAGE_FRAME_BYTES);
    sql::list(gateway.db(), queue, page.after.as_ref(), page.limit, max_bytes).await
}

/// A timer operation as sent, each field read into its type as it is read.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireTimerOp {
    op: Option<TimerOpName>,
    queue: Option<String>,
    timer_key: Option<Key>,
    partition: Option<String>,
    txn: Option<String>,
    payload: Option<String>,
    #[serde(default, deserialize_with = "api::present")]
    payload_zstd: Option<Value>,
    delay_ms: Option<DelayMs>,
    /// Fields the server owns: refused by name rather than dropped.
    #[serde(flatten)]
    server_owned: ServerOwned,
}

/// The fields a timer's schedule must not carry: the server sets them.
#[derive(Default, Deserialize)]
struct ServerOwned {
    #[serde(default, deserialize_with = "api::present", rename = "messageId")]
    message_id: Option<Value>,
    #[serde(default, deserialize_with = "api::present", rename = "message_id")]
    message_id_snake: Option<Value>,
    #[serde(default, deserialize_with = "api::present", rename = "deliverAt")]
    deliver_at: Option<Value>,
    #[serde(default, deserialize_with = "api::present", rename = "deliver_at")]
    deliver_at_snake: Option<Value>,
    #[serde(default, deserialize_with = "api::present", rename = "delaySeconds")]
    delay_seconds: Option<Value>,
    #[serde(default, deserialize_with = "api::present", rename = "delay_seconds")]
    delay_seconds_snake: Option<Value>,
    #[serde(default, deserialize_with = "api::present")]
    attempts: Option<Value>,
}

impl ServerOwned {
    /// The first such field sent, by its wire name.
    fn first(&self) -> Option<&'static str> {
        [
            ("messageId", &self.message_id),
            ("message_id", &self.message_id_snake),
            ("deliverAt", &self.deliver_at),
            ("deliver_at", &self.deliver_at_snake),
            ("delaySeconds", &self.delay_seconds),
            ("delay_seconds", &self.delay_seconds_snake),
            ("attempts", &self.attempts),
        ]
        .into_iter()
        .find_map(|(name, value)| value.is_some().then_some(name))
    }
}

impl WireTimerOp {
    fn into_call(self, at: &str) -> Result<TimerCall, BadRequest> {
        let bad = |field: &str, what: &str| BadRequest::new(format!("{at}.{field}: {what}"));
        if let Some(field) = self.server_owned.first() {
            return Err(bad(field, "is the server's to set (a timer carries only a relative delayMs)"));
        }
        let name = self.op.ok_or_else(|| bad("op", "missing"))?;
        let queue = self.queue.ok_or_else(|| bad("queue", "missing"))?;
        let queue = api::checked_name(format_args!("{at}.queue"), queue)?;
        let timer_key = self.timer_key.ok_or_else(|| bad("timerKey", "missing"))?;
        if let Some(txn) = &self.txn {
            api::validate_transaction_id(format_args!("{at}.txn"), txn)?;
        }
        if name == TimerOpName::Cancel {
            return Ok(TimerCall { queue, timer_key, op: TimerOp::Cancel { txn: self.txn } });
        }
        if self.payload_zstd.is_some_and(|v| v != Value::Bool(false)) {
            return Err(bad("payloadZstd", "compressed timer payloads are not supported; send the payload uncompressed"));
        }
        let partition = self.partition.unwrap_or_else(|| api::DEFAULT_PARTITION.to_owned());
        let partition = api::checked_name(format_args!("{at}.partition"), partition)?;
        let DelayMs(delay_ms) = self.delay_ms.ok_or_else(|| bad("delayMs", "missing"))?;
        let payload = self.payload.ok_or_else(|| bad("payload", "missing (base64 of the message's JSON)"))?;
        let scheduled = Scheduled {
            partition,
            txn: self.txn.unwrap_or_else(|| Uuid::now_v7().to_string()),
            message_id: crate::message_id::one(),
            payload: decode_payload(&payload).map_err(|what| bad("payload", &what))?,
            delay_ms,
        };
        let op = match name {
            TimerOpName::Schedule => TimerOp::Schedule(scheduled),
            _ => TimerOp::Reschedule(scheduled),
        };
        Ok(TimerCall { queue, timer_key, op })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TimerOpName {
    Schedule,
    Reschedule,
    Cancel,
}

impl<'de> Deserialize<'de> for TimerOpName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<TimerOpName, D::Error> {
        match String::deserialize(deserializer)?.as_str() {
            "schedule" => Ok(TimerOpName::Schedule),
            "reschedule" => Ok(TimerOpName::Reschedule),
            "cancel" => Ok(TimerOpName::Cancel),
            other => Err(de::Error::custom(format!("unknown operation {other:?} (schedule, reschedule, cancel)"))),
        }
    }
}

/// `delayMs`: whole milliseconds from now, within the horizon either way (a
/// delay in the past means "due now"; one further back than the horizon is
/// a mistake, and would leave PostgreSQL's timestamp range).
#[derive(Clone, Copy, Debug)]
struct DelayMs(i64);

impl<'de> Deserialize<'de> for DelayMs {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<DelayMs, D::Error> {
        let delay = match Value::deserialize(deserializer)? {
            Value::Number(n) => n.as_i64().ok_or_else(|| de::Error::custom("expected an integer number of milliseconds"))?,
            other => return Err(de::Error::custom(format!("expected an integer, got {}", type_name(&other)))),
        };
        if delay > HORIZON_MS {
            return Err(de::Error::custom("exceeds the 90-day horizon (timer_horizon_exceeded)"));
        }
        if delay < -HORIZON_MS {
            return Err(de::Error::custom("is more than the 90-day horizon in the past"));
        }
        Ok(DelayMs(delay))
    }
}

/// Base64 of a JSON document, decoded to its validated text.
fn decode_payload(base64_text: &str) -> Result<String, String> {
    let bytes = base64::engine::general_purpose::STANDARD.decode(base64_text).map_err(|e| format!("not base64 ({e})"))?;
    let text = String::from_utf8(bytes).map_err(|_| "the decoded bytes are not UTF-8 JSON".to_owned())?;
    let raw = RawValue::from_string(text.trim().to_owned()).map_err(|e| format!("the decoded bytes are not JSON ({e})"))?;
    let checked = Payload::checked(&raw).map_err(|e| format!("the decoded bytes: {}", crate::payload::refusal(&e)))?;
    if checked.get().contains("\\u0000") {
        return Err("the decoded JSON must not contain the character U+0000".into());
    }
    Ok(checked.get().to_owned())
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
        let TimerOp::Schedule(scheduled) = &ops[0].op else { panic!("{:?}", ops[0]) };
        assert_eq!(scheduled.payload, "{\"a\": 1}");
        assert_eq!(scheduled.partition, "Default");
        assert_eq!((scheduled.txn.as_str(), scheduled.delay_ms), ("t1", -5));
        assert_eq!(ops[0].timer_key.as_str(), "k");
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
                json!({"op": "schedule", "queue": "q", "timerKey": "k", "delayMs": "1", "payload": b64("1")}),
                "operations[0].delayMs: expected an integer, got a string",
            ),
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
            (json!({"op": "cancel", "queue": "q"}), "operations[0].timerKey: missing"),
            (json!("x"), "operations[0]: expected an object, got a string"),
        ];
        for (op, expected) in cases {
            let body = json!({ "operations": [op] }).to_string();
            let error = parse_batch(body.as_bytes()).expect_err(&body);
            assert!(error.message.starts_with(expected), "{body}: {}", error.message);
        }
    }
}
