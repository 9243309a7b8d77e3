//! The handlers of the KV routes: a batch, and one key by its path.

use hyper::StatusCode;
use hyper::header::{ETAG, HeaderValue};
use serde_json::{Map, Value, json};

use super::{AnswerLimit, Applied, KvCall, PathVerb, apply, parse_batch, parse_put, path_op};
use crate::http::call::Call;
use crate::http::reply::{Failure, Reply, json_reply};

/// `POST /api/v1/kv`: operations in one transaction.
pub async fn batch(mut call: Call<'_>) -> Result<Reply, Failure> {
    let body = call.body().await?;
    let calls = parse_batch(&body)?;
    drop(body);
    answer(call, &calls).await
}

/// `GET /api/v1/kv/{ns}/{key}`: one key, 404 when absent, its version as
/// the `ETag`.
pub async fn get(mut call: Call<'_>) -> Result<Reply, Failure> {
    let op = path_op(PathVerb::Get, call.param("ns"), call.param("key"))?;
    let room = call.answer_room()?;
    let applied = apply(call.app.gateway.db(), std::slice::from_ref(&op), answer_limit(room))
        .await
        .map_err(|e| call.read_failure(room, e))?;
    count(&call, &applied);
    let result = &applied.results[0];
    if result.found != Some(true) {
        return Ok(json_reply(StatusCode::NOT_FOUND, &result.wire));
    }
    let mut reply = json_reply(StatusCode::OK, &result.wire);
    if let Some(version) = result.version
        && let Ok(etag) = HeaderValue::from_str(&format!("\"{version}\""))
    {
        reply.headers_mut().insert(ETAG, etag);
    }
    Ok(reply)
}

/// `PUT /api/v1/kv/{ns}/{key}`: sets one key from the body.
pub async fn put(mut call: Call<'_>) -> Result<Reply, Failure> {
    let body = call.body().await?;
    let op = parse_put(call.param("ns"), call.param("key"), &body)?;
    drop(body);
    answer(call, std::slice::from_ref(&op)).await
}

/// `DELETE /api/v1/kv/{ns}/{key}`.
pub async fn delete(call: Call<'_>) -> Result<Reply, Failure> {
    let op = path_op(PathVerb::Delete, call.param("ns"), call.param("key"))?;
    answer(call, std::slice::from_ref(&op)).await
}

/// What KV results one answer may hold: the room reserved for it, less
/// room for the JSON around them.
pub fn answer_limit(room: usize) -> AnswerLimit {
    AnswerLimit::bytes(room.saturating_sub(4096))
}

/// Applies KV operations and answers 200 with their results, or, when a
/// `required` one did not apply, with the lost precondition (nothing written).
async fn answer(mut call: Call<'_>, calls: &[KvCall]) -> Result<Reply, Failure> {
    let room = call.answer_room()?;
    let applied = apply(call.app.gateway.db(), calls, answer_limit(room)).await.map_err(|e| call.read_failure(room, e))?;
    count(&call, &applied);
    match applied.failed {
        Some(failed) => Ok(json_reply(StatusCode::OK, &applied.precondition_lost(failed, failed))),
        None => {
            let results: Vec<&Map<String, Value>> = applied.results.iter().map(|r| &r.wire).collect();
            Ok(json_reply(StatusCode::OK, &json!({ "results": results })))
        }
    }
}

/// Counts answered KV operations by outcome: `read` (no verdict),
/// `applied` or `refused`.
fn count(call: &Call<'_>, applied: &Applied) {
    let metrics = call.app.gateway.metrics();
    for result in &applied.results {
        let outcome = match result.applied {
            None => "read",
            Some(true) => "applied",
            Some(false) => "refused",
        };
        metrics.kv_operations(outcome, 1);
    }
}
