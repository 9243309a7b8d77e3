//! Matching a request to a row of a route table (the gateway's is
//! [`super::routes::ROUTES`]), segment by segment.
//!
//! A pattern's segment is a literal, `{name}` (one segment) or, last,
//! `{*name}` (the rest of the path, one segment or more, so that a KV key or
//! a timer key may contain `/`). Parameters are percent-decoded segment by
//! segment and must be UTF-8.

use hyper::Method;

use super::call::{Matched, Route};

/// Why no route serves a request.
#[derive(Debug, PartialEq, Eq)]
pub enum Unrouted {
    NotFound,
    /// The path exists, for these other methods (what a 405's `Allow` names).
    MethodNotAllowed(Vec<Method>),
    /// A parameter is not percent-encoded UTF-8.
    BadParameter(&'static str),
}

/// Finds the route for `method` and `path`. `HEAD` is served by the `GET`
/// route of the path (HTTP requires it of every server; hyper sends the
/// answer's headers only).
pub fn route(routes: &'static [Route], method: &Method, path: &str) -> Result<Matched, Unrouted> {
    let wanted = if method == Method::HEAD { &Method::GET } else { method };
    let mut allowed = Vec::new();
    for route in routes {
        let Some(params) = match_pattern(route.pattern, path)? else { continue };
        if route.method == wanted {
            return Ok(Matched { route, params });
        }
        allowed.push(route.method.clone());
        if route.method == Method::GET {
            allowed.push(Method::HEAD);
        }
    }
    Err(if allowed.is_empty() { Unrouted::NotFound } else { Unrouted::MethodNotAllowed(allowed) })
}

/// The parameters of `path` under `pattern`, or `None` when it does not match.
fn match_pattern(pattern: &'static str, path: &str) -> Result<Option<Vec<(&'static str, String)>>, Unrouted> {
    let mut params = Vec::new();
    let mut segments = path.split('/');
    for expected in pattern.split('/') {
        if let Some(name) = expected.strip_prefix("{*").and_then(|rest| rest.strip_suffix('}')) {
            let rest: Vec<&str> = segments.by_ref().collect();
            if rest.is_empty() || rest.iter().all(|s| s.is_empty()) {
                return Ok(None);
            }
            let decoded: Result<Vec<String>, Unrouted> = rest.iter().map(|s| decode(name, s)).collect();
            params.push((name, decoded?.join("/")));
            return Ok(Some(params));
        }
        let Some(segment) = segments.next() else { return Ok(None) };
        match expected.strip_prefix('{').and_then(|rest| rest.strip_suffix('}')) {
            Some(name) if !segment.is_empty() => params.push((name, decode(name, segment)?)),
            Some(_) => return Ok(None),
            None if expected == segment => {}
            None => return Ok(None),
        }
    }
    Ok(segments.next().is_none().then_some(params))
}

fn decode(name: &'static str, segment: &str) -> Result<String, Unrouted> {
    percent_encoding::percent_decode_str(segment)
        .decode_utf8()
        .map(|decoded| decoded.into_owned())
        .map_err(|_| Unrouted::BadParameter(name))
}
