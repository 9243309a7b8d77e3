//! The HTTP API on hyper 1.x: connections and their time limits, the checks
//! made before a request is routed, what a request holds against the
//! intake ([`crate::intake`]), and the dispatch of a request to its feature's handler through the route table
//! ([`routes::ROUTES`]).
//!
//! Only [`routes`] names a feature: each feature's folder (`push/`, `kv/`,
//! `timers/`, `transaction/`, `reads/`, `configure/`, `service/`) holds its
//! parse, run and answer, and its handler takes a [`Call`]. A route is one
//! row of [`routes::ROUTES`] plus its feature's handler and its description
//! in `host/openapi.json`.

pub mod allowed_hosts;
mod body;
pub mod conn;
pub mod query;
pub mod reply;
pub mod router;
pub mod routes;
mod screen;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::{ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_REQUEST_METHOD, ALLOW, HeaderValue, VARY};
use hyper::http::request::Parts;
use hyper::{Method, Request, Response, StatusCode};

use crate::api::BadRequest;
use crate::db::DbError;
use crate::gateway::{FirerWake, Gateway};
use crate::intake::{Held, HeldBody, Intake};
use allowed_hosts::AllowedHosts;
use conn::{ConnectionLimits, ConnectionPhase};
use query::Query;
use reply::{Failure, Reply, error};
use router::{Matched, Unrouted};

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
    /// request may carry in `Host`.
    pub allowed_hosts: AllowedHosts,
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
            allowed_hosts: AllowedHosts::default(),
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
    pub firer: Arc<FirerWake>,
    pub config: HttpConfig,
    /// The bound on the bytes requests in progress hold.
    pub intake: Intake,
}

/// One routed request, as its handler receives it: the gateway's state, the
/// request's header and path parameters, its body (read at most once,
/// through [`Call::body`]) and what it holds against the intake.
#[derive(Debug)]
pub struct Call<'a> {
    pub app: &'a App,
    pub parts: Parts,
    matched: Matched,
    body: Option<Incoming>,
    held: &'a mut Held,
}

impl Call<'_> {
    /// A path parameter the route's pattern names.
    pub fn param(&self, name: &str) -> &str {
        self.matched.param(name)
    }

    /// The request's query parameters.
    pub fn query(&self) -> Result<Query, BadRequest> {
        Query::parse(self.parts.uri.query().unwrap_or(""))
    }

    /// Reads the whole body within the limits, once the intake has admitted
    /// it (see [`body::read_body`]).
    pub async fn body(&mut self) -> Result<Bytes, Failure> {
        let body = self.body.take().expect("a request's body is read once");
        body::read_body(self.app, &self.parts.headers, body, self.held).await
    }

    /// Reserves room for a read's answer (the answer limit, or what is free
    /// of it now) and returns its size; with no room free at all, the read
    /// is refused with 503 before PostgreSQL is asked. The request keeps the
    /// room until its answer is sent.
    pub fn answer_room(&mut self) -> Result<usize, Failure> {
        let reserved = self.app.intake.reserve_answer(self.app.config.answer_limit);
        if reserved.bytes() == 0 {
            return Err(Failure::Unavailable("the gateway has no room for an answer now; retry".into()));
        }
        self.held.absorb(reserved);
        Ok(self.held.bytes())
    }

    /// A read's failure, where an answer too large for the room reserved is
    /// a 413 only when that room was the whole answer limit; under a smaller
    /// reservation the same answer may fit later, so it is a 503.
    pub fn read_failure(&self, room: usize, error: DbError) -> Failure {
        let too_large = matches!(error, DbError::TooLarge(_)) || error.is_answer_too_large();
        if too_large && room < self.app.config.answer_limit {
            return Failure::Unavailable("the gateway has no room for an answer this large now; retry".into());
        }
        error.into()
    }
}

/// Serves one request of the connection whose phase is `phase`.
pub async fn handle(
    app: Arc<App>,
    request: Request<Incoming>,
    _peer: SocketAddr,
    phase: ConnectionPhase,
) -> Result<Response<HeldBody>, Infallible> {
    let _serving = phase.serving();
    let origin = match screen::screened(&app.config, &request) {
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

/// Finds the request's route and runs its handler.
async fn route(app: &App, request: Request<Incoming>, held: &mut Held) -> Reply {
    let path = request.uri().path().to_owned();
    let method = request.method().clone();
    if method == Method::OPTIONS && request.headers().contains_key(ACCESS_CONTROL_REQUEST_METHOD) {
        return screen::preflight(&path);
    }
    if path.starts_with("/api/") && !screen::authorized(&app.config, &request) {
        return error(StatusCode::UNAUTHORIZED, "authorization: a valid bearer token is required");
    }
    let reply = match router::route(&method, &path) {
        Ok(matched) => {
            let handler = matched.route.handler;
            let (parts, body) = request.into_parts();
            handler(Call { app, parts, matched, body: Some(body), held }).await
        }
        Err(Unrouted::NotFound) => Err(Failure::Status(StatusCode::NOT_FOUND, format!("no route for {path}"))),
        Err(Unrouted::MethodNotAllowed(allowed)) => {
            let mut reply = error(StatusCode::METHOD_NOT_ALLOWED, &format!("{method} is not allowed on {path}"));
            reply.headers_mut().insert(ALLOW, screen::method_list(&allowed));
            Ok(reply)
        }
        Err(Unrouted::BadParameter(name)) => Err(BadRequest::new(format!("{name}: not percent-encoded UTF-8")).into()),
    };
    reply.unwrap_or_else(Failure::into_response)
}
