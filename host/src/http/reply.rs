//! What a handler answers: a [`Reply`], or a [`Failure`] that becomes one.
//!
//! Every error answer is `{"error": "<what is wrong>"}` with its status; a
//! failure the client should retry is a 503 with `Retry-After`.

use bytes::Bytes;
use hyper::header::{CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use hyper::{Response, StatusCode};
use serde::Serialize;
use serde_json::json;

use crate::api::BadRequest;
use crate::db::DbError;

/// An answer as a handler builds it; [`super::handle`] holds its bytes
/// against the intake until they are sent.
pub type Reply = Response<Bytes>;

/// Why a request was not served.
#[derive(Debug)]
pub enum Failure {
    /// Answered with this status and message.
    Status(StatusCode, String),
    /// Answered 503 with `Retry-After`: the same request may succeed later.
    Unavailable(String),
}

impl Failure {
    pub fn into_response(self) -> Reply {
        match self {
            Failure::Status(status, message) => error(status, &message),
            Failure::Unavailable(message) => {
                let mut reply = error(StatusCode::SERVICE_UNAVAILABLE, &message);
                reply.headers_mut().insert(RETRY_AFTER, HeaderValue::from_static("1"));
                reply
            }
        }
    }
}

impl From<BadRequest> for Failure {
    fn from(bad: BadRequest) -> Failure {
        Failure::Status(StatusCode::from_u16(bad.status).unwrap_or(StatusCode::BAD_REQUEST), bad.message)
    }
}

impl From<DbError> for Failure {
    fn from(error: DbError) -> Failure {
        // The error's own text says what it is ("database unavailable: …",
        // "database error 42P01: …"), except for the few that are not the
        // database's words.
        if error.is_unavailable() {
            Failure::Unavailable(error.to_string())
        } else if let DbError::TooLarge(message) = error {
            Failure::Status(StatusCode::PAYLOAD_TOO_LARGE, message)
        } else if let (true, DbError::Postgres { message, .. }) = (error.is_answer_too_large(), &error) {
            Failure::Status(StatusCode::PAYLOAD_TOO_LARGE, message.clone())
        } else {
            tracing::error!(error = %error, "database error");
            let message = match error {
                DbError::Postgres { .. } => error.to_string(),
                other => format!("database error: {other}"),
            };
            Failure::Status(StatusCode::INTERNAL_SERVER_ERROR, message)
        }
    }
}

/// `value` as JSON, with `status`.
pub fn json_reply(status: StatusCode, value: &impl Serialize) -> Reply {
    json_bytes_reply(status, serde_json::to_vec(value).expect("a reply always serialises"))
}

/// A JSON text already written, with `status`.
pub fn json_bytes_reply(status: StatusCode, body: Vec<u8>) -> Reply {
    let mut reply = Response::new(Bytes::from(body));
    *reply.status_mut() = status;
    reply.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    reply
}

/// `{"error": message}` with `status`.
pub fn error(status: StatusCode, message: &str) -> Reply {
    json_reply(status, &json!({ "error": message }))
}
