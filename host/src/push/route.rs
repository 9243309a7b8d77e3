//! The handler of `POST /api/v1/push`.

use hyper::StatusCode;

use super::{answer, parse_push};
use crate::gateway::PushFailure;
use crate::http::call::Call;
use crate::http::reply::{Failure, Reply, json_bytes_reply};

/// Reads the items, pushes them and answers 201 with one entry per item.
pub async fn push(mut call: Call<'_>) -> Result<Reply, Failure> {
    let body = call.body().await?;
    let items = parse_push(&body, call.app.config.max_items)?;
    drop(body);
    let results = call.app.gateway.push(items).await?;
    Ok(json_bytes_reply(StatusCode::CREATED, answer::render(&results)))
}

impl From<PushFailure> for Failure {
    fn from(failure: PushFailure) -> Failure {
        match failure {
            PushFailure::Unavailable(message) => Failure::Unavailable(message),
            PushFailure::ShuttingDown => Failure::Unavailable(failure.to_string()),
            PushFailure::Database(message) => Failure::Status(StatusCode::INTERNAL_SERVER_ERROR, message),
        }
    }
}
