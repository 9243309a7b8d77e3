//! Timers' calls (`host/sql/functions/timers.sql`): apply operations, read
//! pending timers, take the due ones for a fire.
//!
//! Operations go to PostgreSQL as one jsonb array in the form
//! `stile.timers_apply` reads ([`SqlTimerOp`]); answers come back typed.

use std::time::Duration;

use deadpool_postgres::GenericClient;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use super::{TimerCall, TimerOp};
use crate::db::{Db, DbError};
use crate::kv::Key;

/// A pending timer as the API shows it; times in ms since the epoch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Timer {
    pub queue: String,
    pub timer_key: String,
    pub partition: String,
    pub txn: String,
    pub message_id: Uuid,
    pub deliver_at: i64,
    pub scheduled_at: i64,
}

/// What an operation did to its timer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TimerStatus {
    Scheduled,
    Rescheduled,
    Cancelled,
    /// A cancel that found no pending timer.
    Absent,
}

/// One operation's result: the timer as it now is (or, when a cancel found
/// none, the names it was given).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TimerResult {
    /// The operation's place in its call (absent where the call had one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
    pub ok: bool,
    pub status: TimerStatus,
    pub queue: String,
    pub timer_key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub txn: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<Uuid>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deliver_at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled_at: Option<i64>,
}

/// A page of a queue's pending timers, by key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TimerPage {
    pub rows: Vec<Timer>,
    /// More timers follow: the page ended at its limit of timers or of bytes.
    pub truncated: bool,
    /// The key to ask for the next page after, when there is one.
    pub next_after: Option<String>,
}

/// A due timer taken for a fire: its message, to push in the same
/// transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DueTimer {
    pub queue: String,
    pub timer_key: String,
    pub partition: String,
    pub txn: String,
    pub message_id: Uuid,
    /// The payload's JSON text.
    pub payload: String,
}

/// A timer named by its queue, key and message id: a re-schedule gives it
/// another message id, and so makes it another timer here.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TimerId {
    pub queue: String,
    pub timer_key: String,
    pub message_id: Uuid,
}

impl DueTimer {
    pub fn id(&self) -> TimerId {
        TimerId { queue: self.queue.clone(), timer_key: self.timer_key.clone(), message_id: self.message_id }
    }
}

/// What a fire takes: at most `count` timers and, past the first, at most
/// `bytes` of payload, none of those `skip` names.
#[derive(Clone, Copy, Debug)]
pub struct Batch<'a> {
    pub count: i32,
    pub bytes: i64,
    pub skip: &'a [TimerId],
}

/// The three arrays `stile.timers_take_due` and `stile.timers_next_due_ms`
/// take the timers to leave out as.
fn skip_arrays(skip: &[TimerId]) -> (Vec<&str>, Vec<&str>, Vec<Uuid>) {
    (
        skip.iter().map(|id| id.queue.as_str()).collect(),
        skip.iter().map(|id| id.timer_key.as_str()).collect(),
        skip.iter().map(|id| id.message_id).collect(),
    )
}

/// Applies `calls` in the open transaction of `client` (or as a statement of
/// its own): one result per operation.
pub async fn apply_in(client: &impl GenericClient, calls: &[TimerCall]) -> Result<Vec<TimerResult>, DbError> {
    let ops = serde_json::to_value(calls.iter().map(SqlTimerOp::of).collect::<Vec<_>>()).expect("operations serialise");
    let stmt = client.prepare_cached("SELECT stile.timers_apply($1::jsonb) AS results").await?;
    let answer: Value = client.query_one(&stmt, &[&ops]).await?.try_get("results")?;
    let results = Vec::<TimerResult>::deserialize(answer)
        .map_err(|e| DbError::Protocol(format!("stile.timers_apply answered results of another shape: {e}")))?;
    if results.len() != calls.len() {
        return Err(DbError::Protocol(format!(
            "stile.timers_apply answered {} results for {} operations",
            results.len(),
            calls.len()
        )));
    }
    Ok(results)
}

/// A pending timer with its payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pending {
    pub timer: Timer,
    /// The payload's JSON text.
    pub payload: String,
}

/// The pending timer under `queue` and `timer_key`.
pub async fn pending(db: &Db, queue: &str, timer_key: &Key) -> Result<Option<Pending>, DbError> {
    let client = db.pool().get().await?;
    let row = client
        .query_opt(
            "SELECT stile.timer_json(t.queue, t.timer_key, t.partition, t.txn, t.message_id, t.deliver_at, \
                                     t.scheduled_at) AS timer, t.payload::text AS payload \
             FROM stile.timers t WHERE t.queue = $1 AND t.timer_key = $2::text COLLATE \"C\"",
            &[&queue, &timer_key.as_str()],
        )
        .await?;
    let Some(row) = row else { return Ok(None) };
    let timer = Timer::deserialize(row.try_get::<_, Value>("timer")?)
        .map_err(|e| DbError::Protocol(format!("stile.timer_json answered a timer of another shape: {e}")))?;
    Ok(Some(Pending { timer, payload: row.try_get("payload")? }))
}

/// A page of `queue`'s pending timers, by key, after `after`: at most
/// `limit`, ending before the timer that would take the page's timers past
/// `max_bytes` (as PostgreSQL's jsonb text, which is never shorter than the
/// gateway's JSON of them). A page ended early by either says `truncated`
/// and names its last key in `next_after`; a first timer larger than
/// `max_bytes` is refused with SQLSTATE [`ANSWER_TOO_LARGE`](crate::db::ANSWER_TOO_LARGE).
pub async fn list(db: &Db, queue: &str, after: Option<&Key>, limit: u32, max_bytes: usize) -> Result<TimerPage, DbError> {
    let client = db.pool().get().await?;
    let after = after.map(Key::as_str);
    let limit = i32::try_from(limit).unwrap_or(i32::MAX);
    let max_bytes = i64::try_from(max_bytes).unwrap_or(i64::MAX);
    let stmt = client.prepare_cached("SELECT stile.timers_list($1, $2, $3, $4) AS page").await?;
    let page: Value = client.query_one(&stmt, &[&queue, &after, &limit, &max_bytes]).await?.try_get("page")?;
    TimerPage::deserialize(page)
        .map_err(|e| DbError::Protocol(format!("stile.timers_list answered a page of another shape: {e}")))
}

/// Takes a batch of due timers in the open transaction of `client`: their
/// rows are deleted when it commits.
pub async fn take_due(client: &impl GenericClient, batch: Batch<'_>) -> Result<Vec<DueTimer>, DbError> {
    let stmt = client
        .prepare_cached(
            "SELECT queue, timer_key, partition, txn, message_id, payload \
             FROM stile.timers_take_due($1, $2, $3, $4, $5)",
        )
        .await?;
    let (queues, keys, ids) = skip_arrays(batch.skip);
    client
        .query(&stmt, &[&batch.count, &batch.bytes, &queues, &keys, &ids])
        .await?
        .iter()
        .map(|row| {
            Ok(DueTimer {
                queue: row.try_get("queue")?,
                timer_key: row.try_get("timer_key")?,
                partition: row.try_get("partition")?,
                txn: row.try_get("txn")?,
                message_id: row.try_get("message_id")?,
                payload: row.try_get("payload")?,
            })
        })
        .collect()
}

/// How long until the next timer is due (zero when one is), leaving out
/// those `skip` names; `None` when no other timer is pending.
pub async fn next_due(db: &Db, skip: &[TimerId]) -> Result<Option<Duration>, DbError> {
    let client = db.pool().get().await?;
    let (queues, keys, ids) = skip_arrays(skip);
    let ms: Option<i64> = client
        .query_one("SELECT stile.timers_next_due_ms($1, $2, $3) AS due_in_ms", &[&queues, &keys, &ids])
        .await?
        .try_get("due_in_ms")?;
    Ok(ms.map(|ms| Duration::from_millis(ms.max(0) as u64)))
}

/// An operation as `stile.timers_apply` reads it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SqlTimerOp<'a> {
    op: &'static str,
    queue: &'a str,
    timer_key: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    partition: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    txn: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message_id: Option<Uuid>,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    delay_ms: Option<i64>,
}

impl<'a> SqlTimerOp<'a> {
    fn of(call: &'a TimerCall) -> SqlTimerOp<'a> {
        let (op, scheduled, txn) = match &call.op {
            TimerOp::Schedule(scheduled) => ("schedule", Some(scheduled), Some(scheduled.txn.as_str())),
            TimerOp::Reschedule(scheduled) => ("reschedule", Some(scheduled), Some(scheduled.txn.as_str())),
            TimerOp::Cancel { txn } => ("cancel", None, txn.as_deref()),
        };
        SqlTimerOp {
            op,
            queue: &call.queue,
            timer_key: call.timer_key.as_str(),
            partition: scheduled.map(|s| s.partition.as_str()),
            txn,
            message_id: scheduled.map(|s| s.message_id),
            payload: scheduled.map(|s| s.payload.as_str()),
            delay_ms: scheduled.map(|s| s.delay_ms),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The results `stile.timers_apply` builds read into their types and
    /// go out as the same JSON.
    #[test]
    fn results_read_and_render_as_timers_apply_built_them() {
        let id = Uuid::now_v7();
        let answer = json!([
            {"index": 0, "ok": true, "status": "scheduled", "queue": "q", "timerKey": "k", "partition": "Default",
             "txn": "t", "messageId": id, "deliverAt": 5, "scheduledAt": 4},
            {"index": 1, "ok": false, "status": "absent", "queue": "q", "timerKey": "x"},
        ]);
        let results = Vec::<TimerResult>::deserialize(answer.clone()).unwrap();
        assert_eq!((results[0].status, results[1].status), (TimerStatus::Scheduled, TimerStatus::Absent));
        assert_eq!(serde_json::to_value(&results).unwrap(), answer);
    }
}
