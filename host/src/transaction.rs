//! Transactions: pushes with KV and timer riders, all or nothing, in one
//! PostgreSQL transaction, with Queen's wire (`POST /api/v1/transaction`).
//!
//! The pushes go first, through the push function, probed in full under
//! their partitions' row locks. A push whose id its partition already stores
//! in the window rolls everything back (`reason: "duplicate"`), which is what
//! makes a retried transaction safe: if the first attempt committed, the
//! retry writes nothing. An id repeated inside the transaction is stored
//! once and its repeats answer `"duplicate": true`. Then the KV operations:
//! a lost `required` one rolls everything back (`reason: "kv_precondition"`).
//! Then the timers. Once committed, the shards' caches are told of the
//! segments, so that a partition written by transactions is not rebuilt
//! after each one.

use bytes::Bytes;
use bytestring::ByteString;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};
use uuid::Uuid;

use crate::api::{self, BadRequest, PushItem};
use crate::db::DbError;
use crate::gateway::{Gateway, PushResult, TransactionalPush};
use crate::kv::{self, KvOp, OpsContext};
use crate::timers::{self, TimerOp};

/// A validated transaction.
#[derive(Debug)]
pub struct TransactionRequest {
    pub pushes: Vec<PushItem>,
    pub kv: Vec<KvOp>,
    pub timers: Vec<TimerOp>,
}

/// Parses a `POST /api/v1/transaction` body: `{"operations": [{"type":
/// "push", "items": [...]}], "kv"?: [...], "timers"?: [...],
/// "requiredLeases"?: []}`.
pub fn parse(body: &Bytes, max_items: usize) -> Result<TransactionRequest, BadRequest> {
    let root: &RawValue = api::parse_json(body)?;
    // JSON as serde_json captured it is UTF-8 throughout. The push items are
    // read as views of this text.
    let text = ByteString::try_from(body.clone()).map_err(|_| BadRequest::new("body: not UTF-8"))?;
    if !root.get().starts_with('{') {
        return Err(BadRequest::new("body: expected a JSON object with an \"operations\" array"));
    }
    let root: RawTransaction<'_> = serde_json::from_str(root.get()).map_err(|error| BadRequest::new(format!("body: {error}")))?;
    let mut pushes = Vec::new();
    if let Some(operations) = root.operations {
        let operations: Vec<RawOperation<'_>> = serde_json::from_str(operations.get())
            .map_err(|error| BadRequest::new(format!("operations: expected an array of objects ({error})")))?;
        for (i, op) in operations.iter().enumerate() {
            let at = format!("operations[{i}].");
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
            let Some(items) = op.items.filter(|items| items.get().starts_with('[')) else {
                return Err(BadRequest::new(format!("{at}items: expected an array")));
            };
            pushes.extend(api::parse_items(&at, &text, items, max_items)?);
            if pushes.len() > max_items {
                return Err(BadRequest::too_large(format!("operations: more than {max_items} items in one transaction")));
            }
        }
    }
    let kv = match root.kv.map(raw_to_value).transpose()? {
        None | Some(Value::Null) => Vec::new(),
        Some(ops) => kv::parse_ops(OpsContext { field: "kv", in_transaction: true }, &ops)?,
    };
    let timers = match root.timers.map(raw_to_value).transpose()? {
        None | Some(Value::Null) => Vec::new(),
        Some(ops) => timers::parse_ops("timers", &ops)?,
    };
    match root.required_leases.map(raw_to_value).transpose()? {
        None | Some(Value::Null) => {}
        Some(Value::Array(leases)) if leases.is_empty() => {}
        Some(_) => return Err(BadRequest::new("requiredLeases: stile keeps no consumers, so it holds no leases")),
    }
    if pushes.is_empty() && kv.is_empty() && timers.is_empty() {
        return Err(BadRequest::new("operations: the transaction has nothing to do"));
    }
    Ok(TransactionRequest { pushes, kv, timers })
}

/// Runs a transaction and answers its body (always 200: a rolled-back
/// transaction is a verdict, not an error).
pub async fn run(gateway: &Gateway, request: TransactionRequest, kv_limit: kv::AnswerLimit) -> Result<Value, DbError> {
    let transaction_id = Uuid::now_v7();
    let pushes: Vec<TransactionalPush> = request.pushes.into_iter().map(transactional).collect();
    let push_count = pushes.len();
    let mut client = gateway.db().pool().get().await?;
    let tx = client.transaction().await?;
    let planned = gateway.plan_pushes(&tx, pushes).await?;
    let pushed = gateway.push_planned(&tx, planned).await?;
    if pushed.already_stored > 0 {
        tx.rollback().await?;
        gateway.metrics().transaction("duplicate");
        return Ok(json!({
            "transactionId": transaction_id,
            "success": false,
            "reason": "duplicate",
            "error": format!(
                "QDUP: {} of the transaction's pushes already stored in the window; transaction rolled back",
                pushed.already_stored
            ),
            "results": [],
        }));
    }
    let applied = if request.kv.is_empty() { None } else { Some(kv::apply_in(&tx, &request.kv, kv_limit).await?) };
    if let Some(failed) = applied.as_ref().and_then(|a| a.failed) {
        tx.rollback().await?;
        gateway.metrics().transaction("kv_precondition");
        let applied = applied.as_ref().expect("set when failed is");
        let mut answer = applied.precondition_failure(failed, push_count + failed);
        answer.insert("transactionId".into(), json!(transaction_id));
        answer.insert("success".into(), Value::Bool(false));
        answer.insert("error".into(), Value::from("kv_precondition_failed"));
        answer.insert("results".into(), json!([]));
        return Ok(Value::Object(answer));
    }
    let timer_results = if request.timers.is_empty() { Vec::new() } else { timers::apply_in(&tx, &request.timers).await? };
    tx.commit().await?;
    drop(client);
    gateway.committed_elsewhere(pushed.committed).await;
    timers::wake_firer(gateway, &request.timers);
    gateway.metrics().transaction("committed");
    let mut results: Vec<Value> = pushed.results.iter().enumerate().map(|(i, r)| push_result(i, r)).collect();
    if let Some(applied) = applied {
        results.extend(applied.results.into_iter().enumerate().map(|(i, r)| rider(push_count + i, i, "kv", r)));
    }
    let base = results.len();
    results.extend(timer_results.into_iter().enumerate().map(|(i, r)| rider(base + i, i, "timer", r)));
    Ok(json!({ "transactionId": transaction_id, "success": true, "results": results }))
}

#[derive(Deserialize)]
struct RawTransaction<'a> {
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
struct RawOperation<'a> {
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(borrow, default)]
    items: Option<&'a RawValue>,
}

fn raw_to_value(raw: &RawValue) -> Result<Value, BadRequest> {
    serde_json::from_str(raw.get()).map_err(|error| BadRequest::new(format!("body: {error}")))
}

/// A push item with its id chosen: a push without a transactionId gets its
/// message id, new every time.
fn transactional(item: PushItem) -> TransactionalPush {
    let message_id = Uuid::now_v7();
    TransactionalPush {
        transaction_id: item.transaction_id.map_or_else(|| message_id.to_string(), |id| id.to_string()),
        queue: item.queue.to_string(),
        partition: item.partition.to_string(),
        message_id,
        payload: item.payload,
    }
}

fn push_result(index: usize, result: &PushResult) -> Value {
    let mut out = Map::new();
    out.insert("index".into(), json!(index));
    out.insert("type".into(), json!("push"));
    out.insert("success".into(), json!(true));
    out.insert("transactionId".into(), json!(&*result.transaction_id));
    out.insert("messageId".into(), json!(result.message_id));
    out.insert("queueName".into(), json!(&*result.queue));
    out.insert("partition".into(), json!(&*result.partition));
    out.insert("offset".into(), json!(result.offset));
    if result.duplicate {
        out.insert("duplicate".into(), json!(true));
    }
    Value::Object(out)
}

/// A KV or timer result in the transaction's flat result list.
fn rider(index: usize, op_index: usize, kind: &str, result: Value) -> Value {
    let mut out = match result {
        Value::Object(fields) => fields,
        other => Map::from_iter([("result".to_owned(), other)]),
    };
    out.insert("index".into(), json!(index));
    out.insert("opIndex".into(), json!(op_index));
    out.insert("type".into(), json!(kind));
    Value::Object(out)
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
