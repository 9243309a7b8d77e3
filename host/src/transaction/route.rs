//! The handler of `POST /api/v1/transaction`.

use hyper::StatusCode;

use super::{parse, run};
use crate::http::call::Call;
use crate::http::reply::{Failure, Reply, json_reply};
use crate::kv::route::answer_limit;

/// Runs the transaction and answers what committed, or why it rolled back.
pub async fn transaction(mut call: Call<'_>) -> Result<Reply, Failure> {
    let body = call.body().await?;
    let request = parse(&body, call.app.config.max_items)?;
    drop(body);
    let room = call.answer_room()?;
    let app = call.app;
    let answer = run(&app.gateway, &app.firer, request, answer_limit(room)).await.map_err(|e| call.read_failure(room, e))?;
    Ok(json_reply(StatusCode::OK, &answer))
}
