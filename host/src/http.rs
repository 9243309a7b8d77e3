//! The HTTP API on hyper 1.x.
//!
//! | route | what |
//! |---|---|
//! | `POST /api/v1/push` | push items; 201 with one entry per item |
//! | `POST /api/v1/configure` | set a queue's options (merge or replace) |
//! | `GET /api/v1/messages?queue=&partition=&fromOffset=&limit=` | a partition's messages from an offset |
//! | `GET /api/v1/messages/by-transaction-id?queue=&partition=&transactionId=` | one message by transactionId |
//! | `GET /health` | 200 when the database answers, else 503 |
//! | `GET /metrics` | Prometheus text |

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::{Body as _, Incoming};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use hyper::{Method, Request, Response, StatusCode};
use serde::Serialize;
use serde_json::json;
use serde_json::value::RawValue;
use uuid::Uuid;

use crate::api::{self, BadRequest};
use crate::db::{ConfigureError, DbError, StoredMessage};
use crate::gateway::{Gateway, PushResult};
use crate::hash::txn_hash;
use crate::intake::{Held, Intake};
use crate::shard::PushFailure;

/// Limits and access control of the HTTP layer.
#[derive(Clone, Debug)]
pub struct HttpConfig {
    /// Largest request body, in bytes.
    pub body_limit: usize,
    /// Most items in one push.
    pub max_items: usize,
    /// When set, `/api/*` requires `Authorization: Bearer <token>`.
    pub bearer_token: Option<String>,
}

/// Shared state of every connection.
#[derive(Debug)]
pub struct App {
    pub gateway: Gateway,
    pub config: HttpConfig,
    /// The bound on the bytes requests in progress hold.
    pub intake: Intake,
}

type Reply = Response<Full<Bytes>>;

/// Serves one request.
pub async fn handle(app: Arc<App>, request: Request<Incoming>, _peer: SocketAddr) -> Result<Reply, Infallible> {
    let path = request.uri().path().to_owned();
    let method = request.method().clone();
    if path.starts_with("/api/") && !authorized(&app.config, &request) {
        return Ok(error(StatusCode::UNAUTHORIZED, "authorization: a valid bearer token is required"));
    }
    let reply = match (&method, path.as_str()) {
        (&Method::POST, "/api/v1/push") => push(&app, request).await,
        (&Method::POST, "/api/v1/configure") => configure(&app, request).await,
        (&Method::GET, "/api/v1/messages") => messages(&app, &request).await,
        (&Method::GET, "/api/v1/messages/by-transaction-id") => by_transaction_id(&app, &request).await,
        (&Method::GET, "/health") => health(&app).await,
        (&Method::GET, "/metrics") => Ok(metrics(&app)),
        (_, "/api/v1/push" | "/api/v1/configure" | "/api/v1/messages" | "/health" | "/metrics") => {
            Err(Failure::Status(StatusCode::METHOD_NOT_ALLOWED, format!("{method} is not allowed on {path}")))
        }
        _ => Err(Failure::Status(StatusCode::NOT_FOUND, format!("no route for {path}"))),
    };
    Ok(reply.unwrap_or_else(Failure::into_response))
}

/// Why a request was not served.
enum Failure {
    Status(StatusCode, String),
    Unavailable(String),
}

impl Failure {
    fn into_response(self) -> Reply {
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

impl From<PushFailure> for Failure {
    fn from(failure: PushFailure) -> Failure {
        match failure {
            PushFailure::Unavailable(message) => Failure::Unavailable(message),
            PushFailure::ShuttingDown => Failure::Unavailable(failure.to_string()),
            PushFailure::Database(message) => Failure::Status(StatusCode::INTERNAL_SERVER_ERROR, message),
        }
    }
}

async fn push(app: &App, request: Request<Incoming>) -> Result<Reply, Failure> {
    let (body, _held) = read_body(app, request).await?;
    let items = api::parse_push(&body, app.config.max_items)?;
    drop(body);
    let results = app.gateway.push(items).await?;
    let entries: Vec<PushEntry<'_>> = results.iter().enumerate().map(|(index, r)| PushEntry::new(index, r)).collect();
    Ok(json_reply(StatusCode::CREATED, &entries))
}

/// One item's answer to a push. Serialised directly, with no `Value` tree
/// built, cloned into and dropped per item. (Fields in alphabetical order,
/// as a `Value` would print them.)
#[derive(Serialize)]
struct PushEntry<'a> {
    index: usize,
    message_id: Uuid,
    offset: i64,
    partition: &'a str,
    #[serde(rename = "queueName")]
    queue: &'a str,
    status: &'static str,
    transaction_id: &'a str,
}

impl<'a> PushEntry<'a> {
    fn new(index: usize, result: &'a PushResult) -> PushEntry<'a> {
        PushEntry {
            index,
            message_id: result.message_id,
            offset: result.offset,
            partition: &result.partition,
            queue: &result.queue,
            status: if result.duplicate { "duplicate" } else { "queued" },
            transaction_id: &result.transaction_id,
        }
    }
}

async fn configure(app: &App, request: Request<Incoming>) -> Result<Reply, Failure> {
    let (body, _held) = read_body(app, request).await?;
    let request = api::parse_configure(&body)?;
    let mode = match request.mode {
        api::ConfigureMode::Merge => crate::db::ConfigureMode::Merge,
        api::ConfigureMode::Replace => crate::db::ConfigureMode::Replace,
    };
    let stored = match app.gateway.db().configure(&request.queue, &request.options, mode).await {
        Ok(stored) => stored,
        Err(ConfigureError::Invalid(message)) => return Err(Failure::Status(StatusCode::BAD_REQUEST, message)),
        Err(ConfigureError::Db(error)) => return Err(error.into()),
    };
    app.gateway.forget_queue(&request.queue);
    Ok(json_reply(StatusCode::OK, &json!({ "configured": true, "queue": request.queue, "options": stored })))
}

async fn messages(app: &App, request: &Request<Incoming>) -> Result<Reply, Failure> {
    let query = query(request);
    let (queue, partition) = queue_and_partition(&query)?;
    let from = integer(&query, "fromOffset", 0)?;
    let limit = integer(&query, "limit", 100)?;
    if !(1..=10_000).contains(&limit) {
        return Err(BadRequest::new("limit: must be between 1 and 10000").into());
    }
    let stored = app.gateway.db().read_messages(&queue, &partition, from, limit).await?;
    let messages: Vec<MessageReply<'_>> = stored.iter().map(MessageReply::from).collect();
    Ok(json_reply(StatusCode::OK, &MessagesReply { messages, partition: &partition, queue: &queue }))
}

async fn by_transaction_id(app: &App, request: &Request<Incoming>) -> Result<Reply, Failure> {
    let query = query(request);
    let (queue, partition) = queue_and_partition(&query)?;
    let Some(transaction_id) = query.get("transactionId").filter(|id| !id.is_empty()) else {
        return Err(BadRequest::new("transactionId: missing").into());
    };
    let hash = txn_hash(transaction_id);
    match app.gateway.db().message_by_transaction_id(&queue, &partition, hash, transaction_id).await? {
        Some(message) => Ok(json_reply(StatusCode::OK, &MessageReply::from(&message))),
        None => Err(Failure::Status(StatusCode::NOT_FOUND, format!("transactionId: no message with it in {queue}/{partition}"))),
    }
}

/// A stored message as the read endpoints answer it. Serialised directly
/// rather than through a `Value`, so that the payload goes out as the text
/// stored. (Fields in alphabetical order, as a `Value` would print them.)
#[derive(Serialize)]
struct MessageReply<'a> {
    created_at: i64,
    message_id: Uuid,
    offset: i64,
    payload: &'a RawValue,
    transaction_id: &'a str,
}

impl<'a> From<&'a StoredMessage> for MessageReply<'a> {
    fn from(message: &'a StoredMessage) -> MessageReply<'a> {
        MessageReply {
            created_at: message.created_ms,
            message_id: message.message_id,
            offset: message.offset,
            payload: message.payload.raw(),
            transaction_id: &message.transaction_id,
        }
    }
}

#[derive(Serialize)]
struct MessagesReply<'a> {
    messages: Vec<MessageReply<'a>>,
    partition: &'a str,
    queue: &'a str,
}

async fn health(app: &App) -> Result<Reply, Failure> {
    app.gateway.db().schema_version().await?;
    Ok(json_reply(StatusCode::OK, &json!({ "status": "ok", "database": "up" })))
}

fn metrics(app: &App) -> Reply {
    app.gateway.metrics().publish_intake(app.intake.held_bytes(), app.intake.limit_bytes());
    let mut reply = Response::new(Full::new(Bytes::from(app.gateway.metrics().render())));
    reply.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"));
    reply
}

/// Reads a body within the limit, once the intake has room for it. A body
/// whose declared length is over the limit is refused before anything waits
/// or is read.
async fn read_body(app: &App, request: Request<Incoming>) -> Result<(Bytes, Held), Failure> {
    let limit = app.config.body_limit;
    let too_large = || Failure::from(BadRequest::too_large(format!("body: exceeds the limit of {limit} bytes")));
    let declared = request.body().size_hint().exact().and_then(|n| usize::try_from(n).ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    let mut held = app.intake.admit(declared.unwrap_or(limit)).await;
    let body = match Limited::new(request.into_body(), limit).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => return Err(too_large()),
        Err(error) => return Err(BadRequest::new(format!("body: could not be read ({error})")).into()),
    };
    held.shrink_to(&app.intake, body.len());
    Ok((body, held))
}

fn query(request: &Request<Incoming>) -> HashMap<String, String> {
    let raw = request.uri().query().unwrap_or("");
    form_urlencoded::parse(raw.as_bytes()).into_owned().collect()
}

fn queue_and_partition(query: &HashMap<String, String>) -> Result<(String, String), Failure> {
    let queue = query.get("queue").cloned().unwrap_or_default();
    api::validate_name("queue", &queue)?;
    let partition = query.get("partition").cloned().unwrap_or_else(|| api::DEFAULT_PARTITION.to_owned());
    api::validate_name("partition", &partition)?;
    Ok((queue, partition))
}

fn integer(query: &HashMap<String, String>, key: &str, default: i64) -> Result<i64, Failure> {
    match query.get(key) {
        None => Ok(default),
        Some(raw) => raw.parse().map_err(|_| BadRequest::new(format!("{key}: expected an integer, got {raw:?}")).into()),
    }
}

fn authorized(config: &HttpConfig, request: &Request<Incoming>) -> bool {
    let Some(token) = &config.bearer_token else { return true };
    let presented = request.headers().get(AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    presented.is_some_and(|presented| constant_time_eq(presented.as_bytes(), token.as_bytes()))
}

/// Compares without an early exit, so that response time does not reveal how
/// much of a guessed token was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn json_reply(status: StatusCode, value: &impl Serialize) -> Reply {
    let body = serde_json::to_vec(value).expect("a reply always serialises");
    let mut reply = Response::new(Full::new(Bytes::from(body)));
    *reply.status_mut() = status;
    reply.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    reply
}

fn error(status: StatusCode, message: &str) -> Reply {
    json_reply(status, &json!({ "error": message }))
}
