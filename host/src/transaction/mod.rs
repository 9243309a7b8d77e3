//! Transactions: pushes with KV and timer riders, all or nothing, in one
//! PostgreSQL transaction, with Queen's wire (`POST /api/v1/transaction`).
//!
//! The timers go first: the firer holds the timers it takes while it pushes
//! their messages, so a transaction that held a partition's row while waiting
//! for a timer's could deadlock with it; taking timer rows before partition
//! rows, as the firer does, leaves no cycle. Then the pushes, through the push
//! function, probed in full under their partitions' row locks. A push whose id
//! its partition already stores in the window rolls everything back (`reason:
//! "duplicate"`), which is what makes a retried transaction safe: if the first
//! attempt committed, the retry writes nothing. An id repeated inside the
//! transaction is stored once and its repeats answer `"duplicate": true`. Then
//! the KV operations: a lost `required` one rolls everything back (`reason:
//! "kv_precondition"`). The answer lists the pushes, the KV operations and the
//! timers, in that order. Once committed, the shards' caches are told of the
//! segments, so that a partition written by transactions is not rebuilt after
//! each one.

pub mod route;

use bytes::Bytes;
use bytestring::ByteString;
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::api::{self, BadRequest};
use crate::db::DbError;
use crate::gateway::{Gateway, PushResult, RequestPlan};
use crate::kv::{self, KvCall, OpsContext, PreconditionLost};
use crate::push::PushItem;
use crate::timers::{self, FirerWake, TimerCall, TimerResult};

/// A validated transaction.
#[derive(Debug)]
pub struct TransactionRequest {
    pub pushes: Vec<PushItem>,
    pub kv: Vec<KvCall>,
    pub timers: Vec<TimerCall>,
}

/// Parses a `POST /api/v1/transaction` body: `{"operations": [{"type":
/// "push", "items": [...]}], "kv"?: [...], "timers"?: [...],
/// "requiredLeases"?: []}`.
pub fn parse(body: &Bytes, max_items: usize) -> Result<TransactionRequest, BadRequest> {
    let root: &RawValue = api::parse_json(body)?;
    // JSON as serde_json captured it is UTF-8 throughout. The push items are
    // read as views of this text.
    let text = ByteString::try_from(body.clone()).map_err(|_| BadRequest::new("body: not UTF-8"))?;
    if api::raw_type_name(root) != api::OBJECT {
        return Err(BadRequest::new("body: expected a JSON object with an \"operations\" array"));
    }
    let root: WireTransaction<'_> = api::object("body", root)?;
    let mut pushes = Vec::new();
    let operations = root.operations.map(|ops| api::elements("operations", ops, usize::MAX)).transpose()?;
    for (i, op) in operations.unwrap_or_default().iter().enumerate() {
        let at = format!("operations[{i}].");
        let op: WireOperation<'_> = api::object(format_args!("operations[{i}]"), op)?;
        match op.kind.as_deref() {
            Some("push") => {}
            Some("ack") => {
                return Err(BadRequest::new(format!(
                    "{at}type: ack is refused: stile keeps no consumers, so there is nothing to acknowledge"
                )));
            }
            Some(other) => return Err(BadRequest::new(format!("{at}type: unknown operation {other:?} (push)"))),
            None => return Err(BadRequest::new(format!("{at}type: missing"))),
        }
        let Some(items) = op.items.filter(|items| api::raw_type_name(items) == api::ARRAY) else {
            return Err(BadRequest::new(format!("{at}items: expected an array")));
        };
        pushes.extend(crate::push::parse_items(&at, &text, items, max_items)?);
        if pushes.len() > max_items {
            return Err(BadRequest::too_large(format!("operations: more than {max_items} items in one transaction")));
        }
    }
    let kv = match root.kv {
        None => Vec::new(),
        Some(ops) => kv::parse_ops(OpsContext { field: "kv", in_transaction: true }, ops)?,
    };
    let timers = match root.timers {
        None => Vec::new(),
        Some(ops) => timers::parse_ops("timers", ops)?,
    };
    let holds_no_leases = match root.required_leases {
        None => true,
        Some(leases) => serde_json::from_str::<Vec<IgnoredAny>>(leases.get()).is_ok_and(|leases| leases.is_empty()),
    };
    if !holds_no_leases {
        return Err(BadRequest::new("requiredLeases: stile keeps no consumers, so it holds no leases"));
    }
    if pushes.is_empty() && kv.is_empty() && timers.is_empty() {
        return Err(BadRequest::new("operations: the transaction has nothing to do"));
    }
    Ok(TransactionRequest { pushes, kv, timers })
}

/// A transaction's answer: always 200, since a rolled-back transaction is
/// a verdict, not an error.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum TransactionAnswer {
    Committed(Committed),
    /// A push already stored in the window rolled it back.
    Duplicate(RolledBack),
    /// A `required` KV operation did not apply.
    PreconditionLost {
        #[serde(flatten)]
        rolled_back: RolledBack,
        #[serde(flatten)]
        lost: PreconditionLost,
    },
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Committed {
    transaction_id: Uuid,
    success: bool,
    /// The pushes' answers, then the KV operations', then the timers'.
    results: Vec<TransactionResult>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RolledBack {
    transaction_id: Uuid,
    success: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'static str>,
    error: String,
    /// Always empty: nothing of it was written.
    results: [(); 0],
}

impl RolledBack {
    fn new(transaction_id: Uuid, reason: Option<&'static str>, error: String) -> RolledBack {
        RolledBack { transaction_id, success: false, reason, error, results: [] }
    }
}

/// One entry of a committed transaction's flat result list.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum TransactionResult {
    Push(PushEntry),
    Kv(Rider<Map<String, Value>>),
    Timer(Rider<TimerResult>),
}

/// A push's answer in a transaction's result list.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PushEntry {
    index: usize,
    #[serde(rename = "type")]
    kind: &'static str,
    success: bool,
    transaction_id: ByteString,
    message_id: Uuid,
    queue_name: ByteString,
    partition: ByteString,
    offset: i64,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    duplicate: bool,
}

/// A KV or timer result in a transaction's result list: its place in the
/// list, its place among its kind's operations, and the result's fields.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Rider<T> {
    index: usize,
    op_index: usize,
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(flatten)]
    result: T,
}

/// Runs a transaction: the timers, then the pushes, then the KV operations,
/// in one PostgreSQL transaction, all or nothing.
pub async fn run(
    gateway: &Gateway,
    wake: &FirerWake,
    request: TransactionRequest,
    kv_limit: kv::AnswerLimit,
) -> Result<TransactionAnswer, DbError> {
    let transaction_id = Uuid::now_v7();
    let push_count = request.pushes.len();
    let mut client = gateway.db().pool().get().await?;
    let tx = client.transaction().await?;
    let timer_results = if request.timers.is_empty() { Vec::new() } else { timers::apply_in(&tx, &request.timers).await? };
    let pushed = gateway.push_in(&tx, RequestPlan::new(request.pushes)).await?;
    if pushed.already_stored > 0 {
        tx.rollback().await?;
        gateway.metrics().transaction("duplicate");
        let error = format!(
            "QDUP: {} of the transaction's pushes already stored in the window; transaction rolled back",
            pushed.already_stored
        );
        return Ok(TransactionAnswer::Duplicate(RolledBack::new(transaction_id, Some("duplicate"), error)));
    }
    let applied = if request.kv.is_empty() { None } else { Some(kv::apply_in(&tx, &request.kv, kv_limit).await?) };
    if let Some(applied) = &applied
        && let Some(failed) = applied.failed
    {
        tx.rollback().await?;
        gateway.metrics().transaction("kv_precondition");
        let rolled_back = RolledBack::new(transaction_id, None, "kv_precondition_failed".into());
        return Ok(TransactionAnswer::PreconditionLost {
            rolled_back,
            lost: applied.precondition_lost(failed, push_count + failed),
        });
    }
    tx.commit().await?;
    drop(client);
    gateway.committed_elsewhere(pushed.committed).await;
    timers::wake_for(wake, &request.timers);
    gateway.metrics().transaction("committed");
    let mut results: Vec<TransactionResult> =
        pushed.results.into_iter().enumerate().map(|(i, r)| TransactionResult::Push(push_entry(i, r))).collect();
    for (i, result) in applied.into_iter().flat_map(|a| a.results).enumerate() {
        let mut fields = result.wire;
        fields.remove("index");
        results.push(TransactionResult::Kv(Rider { index: results.len(), op_index: i, kind: "kv", result: fields }));
    }
    for (i, mut result) in timer_results.into_iter().enumerate() {
        result.index = None;
        results.push(TransactionResult::Timer(Rider { index: results.len(), op_index: i, kind: "timer", result }));
    }
    Ok(TransactionAnswer::Committed(Committed { transaction_id, success: true, results }))
}

#[derive(Deserialize)]
struct WireTransaction<'a> {
    #[serde(borrow, default)]
    operations: Option<&'a RawValue>,
    #[serde(borrow, default)]
    kv: Option<&'a RawValue>,
    #[serde(borrow, default)]
    timers: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "requiredLeases")]
    required_leases: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct WireOperation<'a> {
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(borrow, default)]
    items: Option<&'a RawValue>,
}

fn push_entry(index: usize, result: PushResult) -> PushEntry {
    PushEntry {
        index,
        kind: "push",
        success: true,
        transaction_id: result.transaction_id,
        message_id: result.message_id,
        queue_name: result.queue,
        partition: result.partition,
        offset: result.offset,
        duplicate: result.duplicate,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(body: &str) -> Result<TransactionRequest, BadRequest> {
        parse(&Bytes::copy_from_slice(body.as_bytes()), 100)
    }

    #[test]
    fn pushes_kv_and_timers_are_read_with_fields_named_by_place() {
        let request = parse_str(
            r#"{"operations":[{"type":"push","items":[{"queue":"q","transactionId":"a","payload":{"x":1}}]}],
                "requiredLeases":[],
                "kv":[{"op":"putIfAbsent","ns":"o","key":"k","value":true,"ttlSeconds":5,"required":true}]}"#,
        )
        .unwrap();
        assert_eq!((request.pushes.len(), request.kv.len(), request.timers.len()), (1, 1, 0));
        assert_eq!(request.pushes[0].payload.get(), r#"{"x":1}"#);
        let error = parse_str(r#"{"operations":[{"type":"push","items":[{"queue":"q"},{"queue":""}]}]}"#).unwrap_err();
        assert!(error.message.starts_with("operations[0].items[1].queue"), "{}", error.message);
    }

    #[test]
    fn acks_leases_and_empty_transactions_are_refused() {
        let cases = [
            (r#"{"operations":[{"type":"ack","transactionId":"a","partitionId":"p"}]}"#, "operations[0].type: ack is refused"),
            (r#"{"operations":[],"requiredLeases":["l1"]}"#, "requiredLeases"),
            (r#"{"operations":[]}"#, "operations: the transaction has nothing to do"),
            (r#"{"operations":[{"type":"push"}]}"#, "operations[0].items: expected an array"),
            (r#"{"operations":[{"type":"pop"}]}"#, "operations[0].type: unknown"),
            (r#"{"kv":[{"op":"getPrefix","ns":"o","prefix":"a"}]}"#, "kv[0].op: getPrefix"),
            (r#"[1]"#, "body: expected a JSON object"),
        ];
        for (body, expected) in cases {
            let error = parse_str(body).expect_err(body);
            assert!(error.message.starts_with(expected), "{body}: {}", error.message);
        }
    }
}
