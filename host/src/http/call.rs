//! What a handler receives and what the route table holds: the gateway's
//! state ([`App`]), one routed request ([`Call`]), and a row of the table
//! ([`Route`]) with the request it matched ([`Matched`]). Features import
//! this file, `reply` and `query` of `http/`, and nothing else of it.

use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use hyper::Method;
use hyper::body::Incoming;
use hyper::http::request::Parts;

use super::body;
use super::config::HttpConfig;
use super::query::Query;
use super::reply::{Failure, Reply};
use super::socket::ClientWatch;
use crate::api::BadRequest;
use crate::db::DbError;
use crate::gateway::{FirerWake, Gateway};
use crate::intake::{Held, Intake};

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
    client: ClientWatch,
    held: &'a mut Held,
}

impl<'a> Call<'a> {
    /// The request `parts` with `body` from `client`, matched to a route,
    /// holding `held`.
    pub fn new(app: &'a App, request: Arrived, matched: Matched, held: &'a mut Held) -> Call<'a> {
        let Arrived { parts, body, client } = request;
        Call { app, parts, matched, body: Some(body), client, held }
    }

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
        body::read_body(&self.app.config, &self.app.intake, &self.client, body, self.held).await
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

/// A request as it arrived: its header, its body unread, and the watch of
/// the client that sent it.
#[derive(Debug)]
pub struct Arrived {
    pub parts: Parts,
    pub body: Incoming,
    pub client: ClientWatch,
}

/// One row of the route table ([`super::routes::ROUTES`]).
pub struct Route {
    pub method: Method,
    pub pattern: &'static str,
    pub handler: Handler,
}

/// A feature's handler of a route: runs the request and answers it.
pub type Handler = for<'a> fn(Call<'a>) -> BoxFuture<'a, Result<Reply, Failure>>;

impl Route {
    pub const fn new(method: Method, pattern: &'static str, handler: Handler) -> Route {
        Route { method, pattern, handler }
    }
}

impl std::fmt::Debug for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.method, self.pattern)
    }
}

/// A matched route and its path parameters, by name.
#[derive(Debug)]
pub struct Matched {
    pub route: &'static Route,
    pub params: Vec<(&'static str, String)>,
}

impl Matched {
    /// A parameter the pattern names (every one is present once matched).
    pub fn param(&self, name: &str) -> &str {
        self.params.iter().find(|(n, _)| *n == name).map_or("", |(_, v)| v.as_str())
    }
}
