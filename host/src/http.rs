//! The HTTP API on hyper 1.x.
//!
//! | route | what |
//! |---|---|
//! | `POST /api/v1/push` | push items; 201 with one entry per item |
//! | `POST /api/v1/configure` | set a queue's options (merge or replace) |
//! | `GET /api/v1/messages?queue=&partition=&fromOffset=&limit=` | a partition's messages from an offset |
//! | `GET /api/v1/messages/by-transaction-id?queue=&partition=&transactionId=` | one message by transactionId |
//! | `POST /api/v1/kv` | KV operations (and `once`), in one transaction |
//! | `GET`, `PUT`, `DELETE /api/v1/kv/{ns}/{key}` | one key |
//! | `POST /api/v1/transaction` | pushes with KV and timer riders, all or nothing |
//! | `POST /api/v1/timers` | schedule, reschedule, cancel |
//! | `GET /api/v1/timers/{queue}` | a page of a queue's pending timers |
//! | `GET`, `DELETE /api/v1/timers/{queue}/{timerKey}` | peek, cancel |
//! | `GET /health` | 200 when the database answers, else 503 |
//! | `GET /metrics` | Prometheus text |
//!
//! The routes are one table, `crate::router::ROUTES`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::{Body as _, Incoming};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, ETAG, HeaderValue, RETRY_AFTER};
use hyper::{Request, Response, StatusCode};
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::api::{self, BadRequest};
use crate::db::{ConfigureError, DbError, StoredMessage};
use crate::gateway::{Gateway, PushResult};
use crate::hash::txn_hash;
use crate::intake::{Held, Intake};
use crate::router::{self, Endpoint, Matched, Unrouted};
use crate::shard::PushFailure;
use crate::{kv, timers, transaction};

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
    pub gateway: Arc<Gateway>,
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
    let reply = match router::route(&method, &path) {
        Ok(matched) => serve(&app, matched, request).await,
        Err(Unrouted::NotFound) => Err(Failure::Status(StatusCode::NOT_FOUND, format!("no route for {path}"))),
        Err(Unrouted::MethodNotAllowed) => {
            Err(Failure::Status(StatusCode::METHOD_NOT_ALLOWED, format!("{method} is not allowed on {path}")))
        }
        Err(Unrouted::BadParameter(name)) => Err(BadRequest::new(format!("{name}: not percent-encoded UTF-8")).into()),
    };
    Ok(reply.unwrap_or_else(Failure::into_response))
}

async fn serve(app: &App, matched: Matched, request: Request<Incoming>) -> Result<Reply, Failure> {
    match matched.endpoint {
        Endpoint::Push => push(app, request).await,
        Endpoint::Configure => configure(app, request).await,
        Endpoint::Messages => messages(app, &request).await,
        Endpoint::MessageByTransactionId => by_transaction_id(app, &request).await,
        Endpoint::KvBatch => kv_batch(app, request).await,
        Endpoint::KvGet => kv_get(app, &matched).await,
        Endpoint::KvPut => kv_put(app, &matched, request).await,
        Endpoint::KvDelete => kv_delete(app, &matched).await,
        Endpoint::Transaction => transaction(app, request).await,
        Endpoint::TimersBatch => timers_batch(app, request).await,
        Endpoint::TimersList => timers_list(app, &matched, &request).await,
        Endpoint::TimerPeek => timer_peek(app, &matched).await,
        Endpoint::TimerCancel => timer_cancel(app, &matched, &request).await,
        Endpoint::Health => health(app).await,
        Endpoint::Metrics => Ok(metrics(app)),
    }
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

async fn kv_batch(app: &App, request: Request<Incoming>) -> Result<Reply, Failure> {
    let (body, _held) = read_body(app, request).await?;
    let ops = kv::parse_batch(&body)?;
    kv_reply(app, &ops).await
}

async fn kv_get(app: &App, matched: &Matched) -> Result<Reply, Failure> {
    let op = kv::path_op(kv::OpKind::Get, matched.param("ns"), matched.param("key"))?;
    let applied = kv::apply(app.gateway.db(), std::slice::from_ref(&op)).await?;
    count_kv(app, &applied);
    let result = &applied.results[0];
    if result.get("found") != Some(&Value::Bool(true)) {
        return Ok(json_reply(StatusCode::NOT_FOUND, result));
    }
    let mut reply = json_reply(StatusCode::OK, result);
    if let Some(version) = result.get("version").and_then(Value::as_i64)
        && let Ok(etag) = HeaderValue::from_str(&format!("\"{version}\""))
    {
        reply.headers_mut().insert(ETAG, etag);
    }
    Ok(reply)
}

async fn kv_put(app: &App, matched: &Matched, request: Request<Incoming>) -> Result<Reply, Failure> {
    let (body, _held) = read_body(app, request).await?;
    let op = kv::parse_put(matched.param("ns"), matched.param("key"), &body)?;
    kv_reply(app, std::slice::from_ref(&op)).await
}

async fn kv_delete(app: &App, matched: &Matched) -> Result<Reply, Failure> {
    let op = kv::path_op(kv::OpKind::Delete, matched.param("ns"), matched.param("key"))?;
    kv_reply(app, std::slice::from_ref(&op)).await
}

/// Applies KV operations and answers 200 with their results, or, when a
/// `required` one did not apply, with the lost precondition (nothing written).
async fn kv_reply(app: &App, ops: &[kv::KvOp]) -> Result<Reply, Failure> {
    let applied = kv::apply(app.gateway.db(), ops).await?;
    count_kv(app, &applied);
    match applied.failed {
        Some(failed) => Ok(json_reply(StatusCode::OK, &Value::Object(applied.precondition_failure(failed, failed)))),
        None => Ok(json_reply(StatusCode::OK, &json!({ "results": applied.results }))),
    }
}

/// Counts answered KV operations by outcome: `read` (no verdict),
/// `applied` or `refused`.
fn count_kv(app: &App, applied: &kv::Applied) {
    let metrics = app.gateway.metrics();
    for result in &applied.results {
        let outcome = match result.get("applied") {
            None => "read",
            Some(Value::Bool(true)) => "applied",
            Some(_) => "refused",
        };
        metrics.kv_operations(outcome, 1);
    }
}

async fn transaction(app: &App, request: Request<Incoming>) -> Result<Reply, Failure> {
    let (body, _held) = read_body(app, request).await?;
    let request = transaction::parse(&body, app.config.max_items)?;
    drop(body);
    let answer = transaction::run(&app.gateway, request).await?;
    Ok(json_reply(StatusCode::OK, &answer))
}

async fn timers_batch(app: &App, request: Request<Incoming>) -> Result<Reply, Failure> {
    let (body, _held) = read_body(app, request).await?;
    let ops = timers::parse_batch(&body)?;
    let results = timers::apply(&app.gateway, &ops).await?;
    Ok(json_reply(StatusCode::OK, &json!({ "results": results })))
}

async fn timers_list(app: &App, matched: &Matched, request: &Request<Incoming>) -> Result<Reply, Failure> {
    let queue = matched.param("queue");
    api::validate_name("queue", queue)?;
    let (after, limit) = timers::page_query(&query(request))?;
    let page = timers::list(&app.gateway, queue, after.as_deref(), limit).await?;
    Ok(json_reply(StatusCode::OK, &page))
}

async fn timer_peek(app: &App, matched: &Matched) -> Result<Reply, Failure> {
    match timers::peek(&app.gateway, matched.param("queue"), matched.param("timerKey")).await? {
        Some(timer) => Ok(json_reply(StatusCode::OK, &timer)),
        None => Ok(json_reply(StatusCode::OK, &json!({ "found": false }))),
    }
}

async fn timer_cancel(app: &App, matched: &Matched, request: &Request<Incoming>) -> Result<Reply, Failure> {
    let txn = query(request).remove("txn").filter(|t| !t.is_empty());
    let op = timers::cancel_op(matched.param("queue"), matched.param("timerKey"), txn)?;
    let mut results = timers::apply(&app.gateway, std::slice::from_ref(&op)).await?;
    let mut result = results.pop().expect("one result per operation");
    if let Value::Object(fields) = &mut result {
        fields.remove("index");
    }
    Ok(json_reply(StatusCode::OK, &result))
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
