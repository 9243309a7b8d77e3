//! The HTTP API on hyper 1.x: connections and their time limits, the checks
//! made before a request is routed ([`screen`]), what a request holds
//! against the intake ([`crate::intake`]), and the dispatch of a request to
//! its feature's handler through the route table ([`routes::ROUTES`]).
//!
//! Only [`routes`] names a feature: each feature's folder (`push/`, `kv/`,
//! `timers/`, `transaction/`, `reads/`, `configure/`, `service/`) holds its
//! parse, run and answer, and its handler takes a [`Call`] ([`call`], which
//! with [`reply`] and [`query`] is all a feature knows of this module). A
//! route is one row of [`routes::ROUTES`] plus its feature's handler and its
//! description in `host/openapi.json`.

pub mod allowed_hosts;
mod body;
pub mod call;
mod config;
pub mod conn;
pub mod query;
pub mod reply;
pub mod router;
pub mod routes;
mod screen;
pub mod socket;

use std::convert::Infallible;
use std::sync::Arc;

use hyper::body::Incoming;
use hyper::header::{ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_REQUEST_METHOD, ALLOW, HeaderValue, VARY};
use hyper::{Method, Request, Response, StatusCode};

use crate::api::BadRequest;
use crate::intake::{Held, HeldBody};
use call::Arrived;
pub use call::{App, Call};
pub use config::HttpConfig;
use conn::ConnectionPhase;
use reply::{Failure, Reply, error};
use router::Unrouted;
use socket::ClientWatch;

/// Serves one request of the connection whose phase is `phase` and whose
/// client `client` watches.
pub async fn handle(
    app: Arc<App>,
    request: Request<Incoming>,
    phase: ConnectionPhase,
    client: ClientWatch,
) -> Result<Response<HeldBody>, Infallible> {
    let _serving = phase.serving();
    let origin = match screen::screened(&app.config, &request) {
        Ok(origin) => origin,
        Err(refused) => return Ok(answer(&app, refused.into_response(), Held::default())),
    };
    let mut held = Held::default();
    let mut reply = route(&app, request, client, &mut held).await;
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
async fn route(app: &App, request: Request<Incoming>, client: ClientWatch, held: &mut Held) -> Reply {
    let path = request.uri().path().to_owned();
    let method = request.method().clone();
    if method == Method::OPTIONS && request.headers().contains_key(ACCESS_CONTROL_REQUEST_METHOD) {
        return screen::preflight(&path);
    }
    if path.starts_with("/api/") && !screen::authorized(&app.config, &request) {
        return error(StatusCode::UNAUTHORIZED, "authorization: a valid bearer token is required");
    }
    let reply = match router::route(routes::ROUTES, &method, &path) {
        Ok(matched) => {
            let handler = matched.route.handler;
            let (parts, body) = request.into_parts();
            handler(Call::new(app, Arrived { parts, body, client }, matched, held)).await
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
