//! The checks of a request's header made before it is routed: headers sent
//! once, the body's coding, the `Host` and `Origin` of a browser's request,
//! CORS preflights and the bearer token.

use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::{
    ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS, ACCESS_CONTROL_MAX_AGE, AUTHORIZATION, CONTENT_ENCODING, HOST,
    HeaderName, HeaderValue, ORIGIN,
};
use hyper::{Method, Request, Response, StatusCode};

use super::config::HttpConfig;
use super::reply::{Failure, Reply, error};
use super::router::{self, Unrouted};
use super::routes::ROUTES;
use crate::api::BadRequest;

/// Screens a request's header: answers the origin to serve it with CORS
/// headers, as [`browser_origin`] does.
pub fn screened(config: &HttpConfig, request: &Request<Incoming>) -> Result<Option<HeaderValue>, Failure> {
    for name in [HOST, ORIGIN, CONTENT_ENCODING] {
        sent_once(request, &name)?;
    }
    content_coding(request)?;
    allowed_host(config, request)?;
    browser_origin(config, request)
}

/// The answer to a browser's CORS preflight from an allowed origin: the
/// path's methods, as the router names them for a method it has none of
/// (`HEAD` left out: a browser sends it without asking).
pub fn preflight(path: &str) -> Reply {
    let Err(Unrouted::MethodNotAllowed(allowed)) = router::route(ROUTES, &Method::OPTIONS, path) else {
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
pub fn method_list(methods: &[Method]) -> HeaderValue {
    let names: Vec<&str> = methods.iter().map(Method::as_str).collect();
    HeaderValue::from_str(&names.join(", ")).expect("method names are ASCII")
}

/// Whether the request carries the bearer token, when one is required.
pub fn authorized(config: &HttpConfig, request: &Request<Incoming>) -> bool {
    let Some(token) = &config.bearer_token else { return true };
    let presented = request.headers().get(AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    presented.is_some_and(|presented| constant_time_eq(presented.as_bytes(), token.as_bytes()))
}

/// Refuses a header a request may carry once, sent more than once: the
/// checks here read one of its values, and whatever reads it next might take
/// another.
fn sent_once(request: &Request<Incoming>, name: &HeaderName) -> Result<(), Failure> {
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

/// Compares without an early exit, so that response time does not reveal how
/// much of a guessed token was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether a `Content-Encoding` says the body is as sent (`identity`), the
/// only coding the gateway reads: a compressed body read as JSON would be
/// refused as malformed, which names the wrong cause.
fn is_identity(coding: &HeaderValue) -> bool {
    coding.to_str().is_ok_and(|coding| coding.trim().eq_ignore_ascii_case("identity"))
}
