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
//! | `GET /api/v1/openapi.json` | the OpenAPI document of every route (`host/openapi.json`) |
//!
//! The routes are one table, `crate::router::ROUTES`.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt as _;
use hyper::body::{Body as _, Incoming};
use hyper::header::{
    ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS, ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_MAX_AGE,
    ACCESS_CONTROL_REQUEST_METHOD, ALLOW, AUTHORIZATION, CONTENT_ENCODING, CONTENT_TYPE, ETAG, HOST, HeaderValue, ORIGIN,
    RETRY_AFTER, VARY,
};
use hyper::{Method, Request, Response, StatusCode};
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::api::{self, BadRequest};
use crate::conn::{ConnectionLimits, ConnectionPhase};
use crate::db::{ConfigureError, DbError, PageBound, StoredMessage};
use crate::gateway::{Gateway, PushFailure};
use crate::hash::txn_hash;
use crate::intake::{Held, HeldBody, Intake, Shed, UNDECLARED_FIRST_SLICE_BYTES};
use crate::router::{self, Endpoint, Matched, Unrouted};
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
    /// Origins other than the gateway's own whose browser requests are
    /// served (with CORS headers); `*` allows every origin. Empty: a request
    /// that carries another origin is refused.
    pub cors_origins: Vec<String>,
    /// The names besides IP addresses and `localhost` that a browser's
    /// request may carry in `Host` (see [`allowed_host`]).
    pub allowed_hosts: crate::allowed_hosts::AllowedHosts,
    /// The largest answer one read may return, in bytes.
    pub answer_limit: usize,
    /// How long the gateway waits for a client.
    pub limits: ConnectionLimits,
}

impl Default for HttpConfig {
    fn default() -> HttpConfig {
        HttpConfig {
            body_limit: 16 << 20,
            max_items: 10_000,
            bearer_token: None,
            cors_origins: Vec::new(),
            allowed_hosts: crate::allowed_hosts::AllowedHosts::default(),
            answer_limit: 32 << 20,
            limits: ConnectionLimits::default(),
        }
    }
}

/// Shared state of every connection.
#[derive(Debug)]
pub struct App {
    pub gateway: Arc<Gateway>,
    /// Woken when a timer scheduled through this gateway has committed.
    pub firer: Arc<timers::FirerWake>,
    pub config: HttpConfig,
    /// The bound on the bytes requests in progress hold.
    pub intake: Intake,
}

/// An answer as a handler builds it; [`handle`] holds its bytes against the
/// intake until they are sent.
type Reply = Response<Bytes>;

/// Serves one request of the connection whose phase is `phase`.
pub async fn handle(
    app: Arc<App>,
    request: Request<Incoming>,
    _peer: SocketAddr,
    phase: ConnectionPhase,
) -> Result<Response<HeldBody>, Infallible> {
    let _serving = phase.serving();
    let origin = match screened(&app.config, &request) {
        Ok(origin) => origin,
        Err(refused) => return Ok(answer(&app, refused.into_response(), Held::default())),
    };
    let mut held = Held::default();
    let mut reply = route(&app, request, &mut held).await;
    if let Some(origin) = origin {
        reply.headers_mut().insert(ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        reply.headers_mut().insert(VARY, HeaderValue::from_static("Origin"));
    }
    Ok(answer(&app, reply, held))
}

/// Holds the answer's bytes against the intake (giving back what the
/// request held for its body beyond them) until the connection has sent
/// them.
fn answer(app: &App, reply: Reply, held: Held) -> Response<HeldBody> {
    let (parts, bytes) = reply.into_parts();
    let held = app.intake.hold_answer(held, bytes.len());
    Response::from_parts(parts, HeldBody::new(bytes, held))
}

async fn route(app: &App, request: Request<Incoming>, held: &mut Held) -> Reply {
    let path = request.uri().path().to_owned();
    let method = request.method().clone();
    if method == Method::OPTIONS && request.headers().contains_key(ACCESS_CONTROL_REQUEST_METHOD) {
        return preflight(&path);
    }
    if path.starts_with("/api/") && !authorized(&app.config, &request) {
        return error(StatusCode::UNAUTHORIZED, "authorization: a valid bearer token is required");
    }
    let reply = match router::route(&method, &path) {
        Ok(matched) => serve(app, matched, request, held).await,
        Err(Unrouted::NotFound) => Err(Failure::Status(StatusCode::NOT_FOUND, format!("no route for {path}"))),
        Err(Unrouted::MethodNotAllowed(allowed)) => {
            let mut reply = error(StatusCode::METHOD_NOT_ALLOWED, &format!("{method} is not allowed on {path}"));
            reply.headers_mut().insert(ALLOW, method_list(&allowed));
            Ok(reply)
        }
        Err(Unrouted::BadParameter(name)) => Err(BadRequest::new(format!("{name}: not percent-encoded UTF-8")).into()),
    };
    reply.unwrap_or_else(Failure::into_response)
}

async fn serve(app: &App, matched: Matched, request: Request<Incoming>, held: &mut Held) -> Result<Reply, Failure> {
    match matched.endpoint {
        Endpoint::Push => push(app, request, held).await,
        Endpoint::Configure => configure(app, request, held).await,
        Endpoint::Messages => messages(app, &request, held).await,
        Endpoint::MessageByTransactionId => by_transaction_id(app, &request, held).await,
        Endpoint::KvBatch => kv_batch(app, request, held).await,
        Endpoint::KvGet => kv_get(app, &matched, held).await,
        Endpoint::KvPut => kv_put(app, &matched, request, held).await,
        Endpoint::KvDelete => kv_delete(app, &matched, held).await,
        Endpoint::Transaction => transaction(app, request, held).await,
        Endpoint::TimersBatch => timers_batch(app, request, held).await,
        Endpoint::TimersList => timers_list(app, &matched, &request, held).await,
        Endpoint::TimerPeek => timer_peek(app, &matched, held).await,
        Endpoint::TimerCancel => timer_cancel(app, &matched, &request).await,
        Endpoint::Health => health(app).await,
        Endpoint::Metrics => Ok(metrics(app)),
        Endpoint::OpenApi => Ok(openapi()),
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
        } else if let DbError::TooLarge(message) = error {
            Failure::Status(StatusCode::PAYLOAD_TOO_LARGE, message)
        } else if let (Some(kv::ANSWER_TOO_LARGE), DbError::Postgres { message, .. }) = (error.sqlstate(), &error) {
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

impl From<PushFailure> for Failure {
    fn from(failure: PushFailure) -> Failure {
        match failure {
            PushFailure::Unavailable(message) => Failure::Unavailable(message),
            PushFailure::ShuttingDown => Failure::Unavailable(failure.to_string()),
            PushFailure::Database(message) => Failure::Status(StatusCode::INTERNAL_SERVER_ERROR, message),
        }
    }
}

async fn push(app: &App, request: Request<Incoming>, held: &mut Held) -> Result<Reply, Failure> {
    let body = read_body(app, request, held).await?;
    let items = api::parse_push(&body, app.config.max_items)?;
    drop(body);
    let results = app.gateway.push(items).await?;
    Ok(json_bytes_reply(StatusCode::CREATED, crate::push_answer::render(&results)))
}

async fn configure(app: &App, request: Request<Incoming>, held: &mut Held) -> Result<Reply, Failure> {
    let body = read_body(app, request, held).await?;
    let request = crate::configure::parse_configure(&body)?;
    let stored = match app.gateway.db().configure(&request.queue, &request.options, request.mode).await {
        Ok(stored) => stored,
        Err(ConfigureError::Invalid(message)) => return Err(Failure::Status(StatusCode::BAD_REQUEST, message)),
        Err(ConfigureError::Db(error)) => return Err(error.into()),
    };
    app.gateway.forget_queue(&request.queue);
    Ok(json_reply(StatusCode::OK, &json!({ "configured": true, "queue": request.queue, "options": stored })))
}

async fn messages(app: &App, request: &Request<Incoming>, held: &mut Held) -> Result<Reply, Failure> {
    let query = query(request)?;
    let (queue, partition) = queue_and_partition(&query)?;
    let from = integer(&query, "fromOffset", 0)?;
    if from < 0 {
        return Err(BadRequest::new(format!("fromOffset: must be 0 or more, got {from}")).into());
    }
    let limit = integer(&query, "limit", 100)?;
    if !(1..=10_000).contains(&limit) {
        return Err(BadRequest::new("limit: must be between 1 and 10000").into());
    }
    let room = answer_room(app, held)?;
    let bound = PageBound { messages: limit, bytes: room.saturating_sub(1024) };
    let page = app.gateway.db().read_messages(&queue, &partition, from, bound).await.map_err(|e| read_failure(app, room, e))?;
    let messages: Vec<MessageReply<'_>> = page.messages.iter().map(MessageReply::from).collect();
    let reply = MessagesReply { messages, partition: &partition, queue: &queue, truncated: page.truncated };
    Ok(json_reply(StatusCode::OK, &reply))
}

async fn by_transaction_id(app: &App, request: &Request<Incoming>, held: &mut Held) -> Result<Reply, Failure> {
    let query = query(request)?;
    let (queue, partition) = queue_and_partition(&query)?;
    let Some(transaction_id) = query.get("transactionId").filter(|id| !id.is_empty()) else {
        return Err(BadRequest::new("transactionId: missing").into());
    };
    api::validate_transaction_id("transactionId", transaction_id)?;
    let hash = txn_hash(transaction_id);
    answer_room(app, held)?;
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
    /// Present when the page ended at the answer limit, before `limit`
    /// messages: more may follow its last offset.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    truncated: bool,
}

async fn kv_batch(app: &App, request: Request<Incoming>, held: &mut Held) -> Result<Reply, Failure> {
    let body = read_body(app, request, held).await?;
    let calls = kv::parse_batch(&body)?;
    drop(body);
    kv_reply(app, &calls, held).await
}

async fn kv_get(app: &App, matched: &Matched, held: &mut Held) -> Result<Reply, Failure> {
    let call = kv::path_op(kv::PathVerb::Get, matched.param("ns"), matched.param("key"))?;
    let room = answer_room(app, held)?;
    let applied =
        kv::apply(app.gateway.db(), std::slice::from_ref(&call), kv_limit(room)).await.map_err(|e| read_failure(app, room, e))?;
    count_kv(app, &applied);
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

async fn kv_put(app: &App, matched: &Matched, request: Request<Incoming>, held: &mut Held) -> Result<Reply, Failure> {
    let body = read_body(app, request, held).await?;
    let call = kv::parse_put(matched.param("ns"), matched.param("key"), &body)?;
    drop(body);
    kv_reply(app, std::slice::from_ref(&call), held).await
}

async fn kv_delete(app: &App, matched: &Matched, held: &mut Held) -> Result<Reply, Failure> {
    let call = kv::path_op(kv::PathVerb::Delete, matched.param("ns"), matched.param("key"))?;
    kv_reply(app, std::slice::from_ref(&call), held).await
}

/// Applies KV operations and answers 200 with their results, or, when a
/// `required` one did not apply, with the lost precondition (nothing written).
async fn kv_reply(app: &App, calls: &[kv::KvCall], held: &mut Held) -> Result<Reply, Failure> {
    let room = answer_room(app, held)?;
    let applied = kv::apply(app.gateway.db(), calls, kv_limit(room)).await.map_err(|e| read_failure(app, room, e))?;
    count_kv(app, &applied);
    match applied.failed {
        Some(failed) => Ok(json_reply(StatusCode::OK, &applied.precondition_lost(failed, failed))),
        None => {
            let results: Vec<&serde_json::Map<String, Value>> = applied.results.iter().map(|r| &r.wire).collect();
            Ok(json_reply(StatusCode::OK, &json!({ "results": results })))
        }
    }
}

/// What KV results one answer may hold: the room reserved for it, less
/// room for the JSON around them.
fn kv_limit(room: usize) -> kv::AnswerLimit {
    kv::AnswerLimit::bytes(room.saturating_sub(4096))
}

/// Reserves room for a read's answer (the answer limit, or what is free of
/// it now) and returns its size; with no room free at all, the read is
/// refused with 503 before PostgreSQL is asked. The request keeps the room
/// in `held` until its answer is sent.
fn answer_room(app: &App, held: &mut Held) -> Result<usize, Failure> {
    let reserved = app.intake.reserve_answer(app.config.answer_limit);
    if reserved.bytes() == 0 {
        return Err(Failure::Unavailable("the gateway has no room for an answer now; retry".into()));
    }
    held.absorb(reserved);
    Ok(held.bytes())
}

/// A read's failure, where an answer too large for the room reserved is a
/// 413 only when that room was the whole answer limit; under a smaller
/// reservation the same answer may fit later, so it is a 503.
fn read_failure(app: &App, room: usize, error: DbError) -> Failure {
    let too_large = matches!(error, DbError::TooLarge(_)) || error.sqlstate() == Some(kv::ANSWER_TOO_LARGE);
    if too_large && room < app.config.answer_limit {
        return Failure::Unavailable("the gateway has no room for an answer this large now; retry".into());
    }
    error.into()
}

/// Counts answered KV operations by outcome: `read` (no verdict),
/// `applied` or `refused`.
fn count_kv(app: &App, applied: &kv::Applied) {
    let metrics = app.gateway.metrics();
    for result in &applied.results {
        let outcome = match result.applied {
            None => "read",
            Some(true) => "applied",
            Some(false) => "refused",
        };
        metrics.kv_operations(outcome, 1);
    }
}

async fn transaction(app: &App, request: Request<Incoming>, held: &mut Held) -> Result<Reply, Failure> {
    let body = read_body(app, request, held).await?;
    let request = transaction::parse(&body, app.config.max_items)?;
    drop(body);
    let room = answer_room(app, held)?;
    let answer =
        transaction::run(&app.gateway, &app.firer, request, kv_limit(room)).await.map_err(|e| read_failure(app, room, e))?;
    Ok(json_reply(StatusCode::OK, &answer))
}

async fn timers_batch(app: &App, request: Request<Incoming>, held: &mut Held) -> Result<Reply, Failure> {
    let body = read_body(app, request, held).await?;
    let calls = timers::parse_batch(&body)?;
    let results = timers::apply(&app.gateway, &app.firer, &calls).await?;
    Ok(json_reply(StatusCode::OK, &json!({ "results": results })))
}

async fn timers_list(app: &App, matched: &Matched, request: &Request<Incoming>, held: &mut Held) -> Result<Reply, Failure> {
    let queue = api::checked_name("queue", matched.param("queue").to_owned())?;
    let page = timers::PageQuery::parse(&query(request)?)?;
    let room = answer_room(app, held)?;
    let page = timers::list(&app.gateway, &queue, &page, room).await.map_err(|e| read_failure(app, room, e))?;
    Ok(json_reply(StatusCode::OK, &page))
}

async fn timer_peek(app: &App, matched: &Matched, held: &mut Held) -> Result<Reply, Failure> {
    let queue = api::checked_name("queue", matched.param("queue").to_owned())?;
    let timer_key = kv::Key::named("timerKey", matched.param("timerKey"))?;
    answer_room(app, held)?;
    match timers::peek(&app.gateway, &queue, &timer_key).await? {
        Some(timer) => Ok(json_reply(StatusCode::OK, &timer)),
        None => Ok(json_reply(StatusCode::OK, &json!({ "found": false }))),
    }
}

async fn timer_cancel(app: &App, matched: &Matched, request: &Request<Incoming>) -> Result<Reply, Failure> {
    let txn = query(request)?.remove("txn").filter(|t| !t.is_empty());
    let call = timers::cancel_op(matched.param("queue"), matched.param("timerKey"), txn)?;
    let mut results = timers::apply(&app.gateway, &app.firer, std::slice::from_ref(&call)).await?;
    let mut result = results.pop().expect("one result per operation");
    result.index = None;
    Ok(json_reply(StatusCode::OK, &result))
}

/// 200 while the database answers, else 503; either way with the intake's
/// state, so that a balancer or an operator sees a gateway shedding load.
async fn health(app: &App) -> Result<Reply, Failure> {
    app.gateway.db().schema_version().await?;
    let intake = app.intake.state();
    let reply = json!({
        "status": "ok",
        "database": "up",
        "intake": {
            "saturated": intake.saturated,
            "heldBytes": intake.held_bytes,
            "limitBytes": intake.limit_bytes,
            "waitingRequests": intake.waiting_requests,
        },
    });
    Ok(json_reply(StatusCode::OK, &reply))
}

fn metrics(app: &App) -> Reply {
    app.gateway.metrics().publish_intake(&app.intake.state());
    let mut reply = Response::new(Bytes::from(app.gateway.metrics().render()));
    reply.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"));
    reply
}

/// The OpenAPI document of every route, as kept in `host/openapi.json`.
fn openapi() -> Reply {
    let mut reply = Response::new(Bytes::from_static(crate::openapi::DOCUMENT.as_bytes()));
    reply.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    reply
}

/// Reads a body within the size limit and the body's time limit, once the
/// intake has admitted the request (`crate::intake`): a body that declares
/// its length takes its whole charge once its first piece has arrived and
/// before more is read; one sent without a length is admitted for a first
/// slice and grows into free room.
/// A body whose declared length is over the limit is refused before
/// anything is read.
///
/// A request refused room is answered 503 with `Retry-After`, holding
/// nothing, once its body has been read and thrown away: a connection
/// closed with a body unread would reset, and the client might lose the
/// answer that tells it to retry.
async fn read_body(app: &App, request: Request<Incoming>, held: &mut Held) -> Result<Bytes, Failure> {
    if let Some(coding) = request.headers().get(CONTENT_ENCODING).filter(|coding| !is_identity(coding)) {
        return Err(Failure::Status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("content-encoding: {coding:?} is not supported; send the body uncompressed"),
        ));
    }
    let limit = app.config.body_limit;
    let too_large = || Failure::from(BadRequest::too_large(format!("body: exceeds the limit of {limit} bytes")));
    let hint = request.body().size_hint();
    if hint.lower() > limit as u64 {
        return Err(too_large());
    }
    let declared = hint.exact().map(|length| usize::try_from(length).expect("at most the body limit"));
    let mut body =
        BodyReader { body: request.into_body(), time_limit: app.config.limits.body, client_time_left: app.config.limits.body };
    // The first piece is awaited before admission: a client that declares a
    // body and sends none holds no room, only its connection's buffer.
    let first = if declared == Some(0) { None } else { body.next_chunk().await? };
    if first.is_some()
        && let Err(shed) = app.intake.admit(held, declared.unwrap_or(UNDECLARED_FIRST_SLICE_BYTES)).await
    {
        drop(first);
        return Err(body.refuse(shed, limit).await);
    }
    let mut chunks: Vec<Bytes> = Vec::new();
    let mut total = 0usize;
    let mut next = first;
    while let Some(chunk) = next.take() {
        total += chunk.len();
        if total > limit {
            return Err(too_large());
        }
        if declared.is_none()
            && let Err(shed) = app.intake.grow(held, total)
        {
            drop(chunks);
            *held = Held::default();
            return Err(body.refuse(shed, limit).await);
        }
        chunks.push(chunk);
        next = body.next_chunk().await?;
    }
    Ok(without_byte_order_mark(concat(chunks, total)))
}

/// A request's body, read within its time limit, which counts only the
/// waits for the client's bytes.
struct BodyReader {
    body: Incoming,
    time_limit: std::time::Duration,
    client_time_left: std::time::Duration,
}

impl BodyReader {
    /// The next piece of the body, `None` at its end; 408 once the client's
    /// time is spent.
    async fn next_chunk(&mut self) -> Result<Option<Bytes>, Failure> {
        loop {
            let waited_from = tokio::time::Instant::now();
            let frame = match tokio::time::timeout(self.client_time_left, self.body.frame()).await {
                Err(_) => {
                    return Err(Failure::Status(
                        StatusCode::REQUEST_TIMEOUT,
                        format!("body: not received within {} s", self.time_limit.as_secs_f64()),
                    ));
                }
                Ok(None) => return Ok(None),
                Ok(Some(Err(error))) => return Err(BadRequest::new(format!("body: could not be read ({error})")).into()),
                Ok(Some(Ok(frame))) => frame,
            };
            self.client_time_left = self.client_time_left.saturating_sub(waited_from.elapsed());
            if let Ok(chunk) = frame.into_data() {
                return Ok(Some(chunk));
            }
        }
    }

    /// The answer to a request refused room, once the rest of its body (at
    /// most `limit` bytes, within its time limit) has been read and thrown
    /// away. A body that does not end in time closes the connection instead.
    async fn refuse(mut self, shed: Shed, limit: usize) -> Failure {
        let mut total = 0usize;
        while let Ok(Some(chunk)) = self.next_chunk().await {
            total += chunk.len();
            if total > limit {
                break;
            }
        }
        Failure::Unavailable(format!("body: {shed}"))
    }
}

/// Whether a `Content-Encoding` says the body is as sent (`identity`), the
/// only coding the gateway reads: a compressed body read as JSON would be
/// refused as malformed, which names the wrong cause.
fn is_identity(coding: &HeaderValue) -> bool {
    coding.to_str().is_ok_and(|coding| coding.trim().eq_ignore_ascii_case("identity"))
}

/// A body less the UTF-8 byte order mark it may start with. JSON sent over a
/// network must not carry one, but some clients' encoders write it, and RFC
/// 8259 lets a parser ignore it; refusing it would refuse their every request.
fn without_byte_order_mark(body: Bytes) -> Bytes {
    const BOM: &[u8] = b"\xEF\xBB\xBF";
    if body.starts_with(BOM) { body.slice(BOM.len()..) } else { body }
}

/// One buffer of a body's pieces: the piece itself when there is one.
fn concat(mut chunks: Vec<Bytes>, total: usize) -> Bytes {
    if chunks.len() == 1 {
        return chunks.pop().expect("one chunk");
    }
    let mut joined = BytesMut::with_capacity(total);
    for chunk in chunks {
        joined.extend_from_slice(&chunk);
    }
    joined.freeze()
}

/// The checks of a request's header made before it is routed: answers the
/// origin to serve it with CORS headers, as [`browser_origin`] does.
fn screened(config: &HttpConfig, request: &Request<Incoming>) -> Result<Option<HeaderValue>, Failure> {
    for name in [HOST, ORIGIN, CONTENT_ENCODING] {
        sent_once(request, &name)?;
    }
    content_coding(request)?;
    allowed_host(config, request)?;
    browser_origin(config, request)
}

/// Refuses a header a request may carry once, sent more than once: the
/// checks here read one of its values, and whatever reads it next might take
/// another.
fn sent_once(request: &Request<Incoming>, name: &hyper::header::HeaderName) -> Result<(), Failure> {
    let count = request.headers().get_all(name).iter().count();
    if count > 1 {
        return Err(BadRequest::new(format!("{name}: sent {count} times; send it once")).into());
    }
    Ok(())
}

/// Refuses a request whose `Content-Encoding` is not `identity`, the only
/// coding the gateway reads: a compressed body read as JSON would be refused
/// as malformed, which names the wrong cause.
fn content_coding(request: &Request<Incoming>) -> Result<(), Failure> {
    match request.headers().get(CONTENT_ENCODING) {
        Some(coding) if !is_identity(coding) => Err(Failure::Status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("content-encoding: {coding:?} is not supported; send the body uncompressed"),
        )),
        _ => Ok(()),
    }
}

/// Refuses a browser's request (one that carries `Origin` or a
/// `Sec-Fetch-*` header, which browsers add and other clients do not) whose
/// `Host` is not a name the gateway is known by: a page that rebinds its own
/// name to the gateway's address sends its own name there, and its origin
/// then matches `Host`. Tools that send neither header are unaffected,
/// whatever name they use.
fn allowed_host(config: &HttpConfig, request: &Request<Incoming>) -> Result<(), Failure> {
    let headers = request.headers();
    let browser = headers.contains_key(ORIGIN)
        || ["sec-fetch-site", "sec-fetch-mode", "sec-fetch-dest"].iter().any(|name| headers.contains_key(*name));
    let Some(host) = headers.get(HOST).filter(|_| browser) else { return Ok(()) };
    let text = host.to_str().unwrap_or("");
    if config.allowed_hosts.allows(text) {
        return Ok(());
    }
    Err(Failure::Status(
        StatusCode::FORBIDDEN,
        format!(
            "host: {host:?} is not a name browsers may reach this gateway by (a page whose name points at it); \
             allow it with --allowed-hosts"
        ),
    ))
}

/// The origin of a browser's request, when it is one the gateway serves
/// with CORS headers (`None` for a request without `Origin`, or from the
/// gateway's own origin). A browser sends `Origin` with every cross-site
/// POST, and a page on any site may send one (a form, or `fetch` with
/// `text/plain`) without asking first; without this check, any page a user
/// of the gateway opens could write to it.
fn browser_origin(config: &HttpConfig, request: &Request<Incoming>) -> Result<Option<HeaderValue>, Failure> {
    let Some(origin) = request.headers().get(ORIGIN) else { return Ok(None) };
    let host = request.headers().get(HOST).and_then(|h| h.to_str().ok());
    let text = origin.to_str().unwrap_or("");
    let own = host.is_some_and(|host| {
        let rest = text.strip_prefix("http://").or_else(|| text.strip_prefix("https://"));
        rest.is_some_and(|rest| rest.eq_ignore_ascii_case(host))
    });
    if own {
        return Ok(None);
    }
    if config.cors_origins.iter().any(|allowed| allowed == "*" || allowed.eq_ignore_ascii_case(text)) {
        return Ok(Some(origin.clone()));
    }
    Err(Failure::Status(
        StatusCode::FORBIDDEN,
        format!("origin: requests from {text:?} are refused (a browser on another site); allow it with --cors-origin"),
    ))
}

/// The answer to a browser's CORS preflight from an allowed origin: the
/// path's methods, as the router names them for a method it has none of
/// (`HEAD` left out: a browser sends it without asking).
fn preflight(path: &str) -> Reply {
    let Err(Unrouted::MethodNotAllowed(allowed)) = router::route(&Method::OPTIONS, path) else {
        return error(StatusCode::NOT_FOUND, &format!("no route for {path}"));
    };
    let methods: Vec<Method> = allowed.into_iter().filter(|method| method != Method::HEAD).collect();
    let mut reply = Response::new(Bytes::new());
    *reply.status_mut() = StatusCode::NO_CONTENT;
    let headers = reply.headers_mut();
    headers.insert(ACCESS_CONTROL_ALLOW_METHODS, method_list(&methods));
    headers.insert(ACCESS_CONTROL_ALLOW_HEADERS, HeaderValue::from_static("authorization, content-type"));
    headers.insert(ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
    reply
}

/// Methods as a header's comma-separated list.
fn method_list(methods: &[Method]) -> HeaderValue {
    let names: Vec<&str> = methods.iter().map(Method::as_str).collect();
    HeaderValue::from_str(&names.join(", ")).expect("method names are ASCII")
}

/// A request's query parameters, decoded as a form's (`+` is a space). A
/// parameter given twice, or one that is not UTF-8 once decoded, is refused:
/// read loosely (the last one kept, a byte replaced by U+FFFD), either would
/// name another queue or bound than the one the client sent.
fn query(request: &Request<Incoming>) -> Result<HashMap<String, String>, Failure> {
    let raw = request.uri().query().unwrap_or("");
    let mut parameters = HashMap::new();
    for pair in raw.split('&').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let key = form_decoded(key).ok_or_else(|| BadRequest::new("query: a parameter's name is not percent-encoded UTF-8"))?;
        let value = form_decoded(value).ok_or_else(|| BadRequest::new(format!("{key}: not percent-encoded UTF-8")))?;
        if parameters.contains_key(&key) {
            return Err(BadRequest::new(format!("{key}: given more than once")).into());
        }
        parameters.insert(key, value);
    }
    Ok(parameters)
}

fn form_decoded(text: &str) -> Option<String> {
    let spaced = text.replace('+', " ");
    percent_encoding::percent_decode_str(&spaced).decode_utf8().ok().map(|decoded| decoded.into_owned())
}

fn queue_and_partition(query: &HashMap<String, String>) -> Result<(String, String), Failure> {
    let queue = api::checked_name("queue", query.get("queue").cloned().unwrap_or_default())?;
    let partition = query.get("partition").cloned().unwrap_or_else(|| api::DEFAULT_PARTITION.to_owned());
    let partition = api::checked_name("partition", partition)?;
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
    json_bytes_reply(status, serde_json::to_vec(value).expect("a reply always serialises"))
}

fn json_bytes_reply(status: StatusCode, body: Vec<u8>) -> Reply {
    let mut reply = Response::new(Bytes::from(body));
    *reply.status_mut() = status;
    reply.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    reply
}

fn error(status: StatusCode, message: &str) -> Reply {
    json_reply(status, &json!({ "error": message }))
}
