//! The handlers of the timers' routes.

use hyper::StatusCode;
use serde_json::json;

use super::{PageQuery, apply, cancel_op, list as list_page, parse_batch, peek as peek_one};
use crate::api;
use crate::http::call::Call;
use crate::http::reply::{Failure, Reply, json_reply};
use crate::kv::Key;

/// `POST /api/v1/timers`: schedule, reschedule and cancel.
pub async fn batch(mut call: Call<'_>) -> Result<Reply, Failure> {
    let body = call.body().await?;
    let calls = parse_batch(&body)?;
    let results = apply(&call.app.gateway, &call.app.firer, &calls).await?;
    Ok(json_reply(StatusCode::OK, &json!({ "results": results })))
}

/// `GET /api/v1/timers/{queue}`: a page of a queue's pending timers, within
/// the answer limit.
pub async fn list(mut call: Call<'_>) -> Result<Reply, Failure> {
    let queue = api::checked_name("queue", call.param("queue").to_owned())?;
    let page = PageQuery::parse(&call.query()?)?;
    let room = call.answer_room()?;
    let page = list_page(&call.app.gateway, &queue, &page, room).await.map_err(|e| call.read_failure(room, e))?;
    Ok(json_reply(StatusCode::OK, &page))
}

/// `GET /api/v1/timers/{queue}/{timerKey}`: one timer, or `found: false`.
pub async fn peek(mut call: Call<'_>) -> Result<Reply, Failure> {
    let queue = api::checked_name("queue", call.param("queue").to_owned())?;
    let timer_key = Key::named("timerKey", call.param("timerKey"))?;
    call.answer_room()?;
    match peek_one(&call.app.gateway, &queue, &timer_key).await? {
        Some(timer) => Ok(json_reply(StatusCode::OK, &timer)),
        None => Ok(json_reply(StatusCode::OK, &json!({ "found": false }))),
    }
}

/// `DELETE /api/v1/timers/{queue}/{timerKey}`: cancels one timer (when its
/// `txn` matches, if given).
pub async fn cancel(call: Call<'_>) -> Result<Reply, Failure> {
    let txn = call.query()?.remove("txn").filter(|t| !t.is_empty());
    let op = cancel_op(call.param("queue"), call.param("timerKey"), txn)?;
    let mut results = apply(&call.app.gateway, &call.app.firer, std::slice::from_ref(&op)).await?;
    let mut result = results.pop().expect("one result per operation");
    result.index = None;
    Ok(json_reply(StatusCode::OK, &result))
}
