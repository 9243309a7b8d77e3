//! Matching a request to a row of the route table ([`super::routes::ROUTES`]),
//! segment by segment.
//!
//! A pattern's segment is a literal, `{name}` (one segment) or, last,
//! `{*name}` (the rest of the path, one segment or more, so that a KV key or
//! a timer key may contain `/`). Parameters are percent-decoded segment by
//! segment and must be UTF-8.

use futures::future::BoxFuture;
use hyper::Method;

use super::Call;
use super::reply::{Failure, Reply};
use super::routes::ROUTES;

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
pub fn route(method: &Method, path: &str) -> Result<Matched, Unrouted> {
    let wanted = if method == Method::HEAD { &Method::GET } else { method };
    let mut allowed = Vec::new();
    for route in ROUTES {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The pattern of the route `method` and `path` reach.
    fn reached(method: Method, path: &str) -> Result<&'static str, Unrouted> {
        route(&method, path).map(|matched| matched.route.pattern)
    }

    #[test]
    fn literal_routes_win_over_patterns_and_methods_are_told_apart() {
        assert_eq!(reached(Method::POST, "/api/v1/push"), Ok("/api/v1/push"));
        assert_eq!(reached(Method::GET, "/api/v1/messages/by-transaction-id"), Ok("/api/v1/messages/by-transaction-id"));
        assert_eq!(reached(Method::GET, "/api/v1/push"), Err(Unrouted::MethodNotAllowed(vec![Method::POST])));
        assert_eq!(reached(Method::GET, "/api/v1/nothing"), Err(Unrouted::NotFound));
        assert_eq!(reached(Method::GET, "/api/v1/push/extra"), Err(Unrouted::NotFound));
    }

    #[test]
    fn a_rest_parameter_keeps_slashes_and_decodes_each_segment() {
        let matched = route(&Method::GET, "/api/v1/kv/orders/a/b%2Fc%20d").unwrap();
        assert_eq!((&matched.route.method, matched.route.pattern), (&Method::GET, "/api/v1/kv/{ns}/{*key}"));
        assert_eq!(matched.param("ns"), "orders");
        assert_eq!(matched.param("key"), "a/b/c d");
        let matched = route(&Method::DELETE, "/api/v1/timers/q/k1").unwrap();
        assert_eq!(matched.route.method, Method::DELETE);
        assert_eq!(
            (matched.route.pattern, matched.param("queue"), matched.param("timerKey")),
            ("/api/v1/timers/{queue}/{*timerKey}", "q", "k1")
        );
        assert_eq!(reached(Method::GET, "/api/v1/timers/q"), Ok("/api/v1/timers/{queue}"));
    }

    #[test]
    fn empty_parameters_and_bad_encodings_do_not_match() {
        assert_eq!(reached(Method::GET, "/api/v1/kv/orders/"), Err(Unrouted::NotFound));
        assert_eq!(reached(Method::GET, "/api/v1/kv//key"), Err(Unrouted::NotFound));
        assert_eq!(reached(Method::GET, "/api/v1/kv/orders/%FF"), Err(Unrouted::BadParameter("key")));
        let kv_key = vec![Method::GET, Method::HEAD, Method::PUT, Method::DELETE];
        assert_eq!(reached(Method::PATCH, "/api/v1/kv/orders/k"), Err(Unrouted::MethodNotAllowed(kv_key)));
    }

    #[test]
    fn head_is_served_where_get_is() {
        assert_eq!(route(&Method::HEAD, "/health").unwrap().route.method, Method::GET);
        assert_eq!(reached(Method::HEAD, "/api/v1/kv/orders/k"), Ok("/api/v1/kv/{ns}/{*key}"));
        assert_eq!(reached(Method::HEAD, "/api/v1/push"), Err(Unrouted::MethodNotAllowed(vec![Method::POST])));
    }
}
