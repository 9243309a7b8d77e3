//! The handler of `POST /api/v1/configure`.

use hyper::StatusCode;
use serde_json::json;

use super::{ConfigureError, parse_configure};
use crate::http::call::Call;
use crate::http::reply::{Failure, Reply, json_reply};

/// Stores a queue's options and answers them as stored; the gateway forgets
/// what it remembered of the queue, so that the next push reads them.
pub async fn configure(mut call: Call<'_>) -> Result<Reply, Failure> {
    let body = call.body().await?;
    let request = parse_configure(&body)?;
    let gateway = &call.app.gateway;
    let stored = match gateway.db().configure(&request.queue, &request.options, request.mode).await {
        Ok(stored) => stored,
        Err(ConfigureError::Invalid(message)) => return Err(Failure::Status(StatusCode::BAD_REQUEST, message)),
        Err(ConfigureError::Db(error)) => return Err(error.into()),
    };
    gateway.forget_queue(&request.queue);
    Ok(json_reply(StatusCode::OK, &json!({ "configured": true, "queue": request.queue, "options": stored })))
}
