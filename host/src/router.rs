//! The route table: one declarative list of methods, path patterns and the
//! endpoint each names, matched segment by segment.
//!
//! A pattern's segment is a literal, `{name}` (one segment) or, last,
//! `{*name}` (the rest of the path, one segment or more, so that a KV key or
//! a timer key may contain `/`). Parameters are percent-decoded segment by
//! segment and must be UTF-8.

use hyper::Method;

/// What a request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Push,
    Configure,
    Messages,
    MessageByTransactionId,
    KvBatch,
    KvGet,
    KvPut,
    KvDelete,
    Transaction,
    TimersBatch,
    TimersList,
    TimerPeek,
    TimerCancel,
    Health,
    Metrics,
    OpenApi,
}

/// Every route, in the order they are tried. A literal route comes before a
/// pattern that would also match it.
pub const ROUTES: &[Route] = &[
    Route::new(Method::POST, "/api/v1/push", Endpoint::Push),
    Route::new(Method::POST, "/api/v1/configure", Endpoint::Configure),
    Route::new(Method::GET, "/api/v1/messages/by-transaction-id", Endpoint::MessageByTransactionId),
    Route::new(Method::GET, "/api/v1/messages", Endpoint::Messages),
    Route::new(Method::POST, "/api/v1/kv", Endpoint::KvBatch),
    Route::new(Method::GET, "/api/v1/kv/{ns}/{*key}", Endpoint::KvGet),
    Route::new(Method::PUT, "/api/v1/kv/{ns}/{*key}", Endpoint::KvPut),
    Route::new(Method::DELETE, "/api/v1/kv/{ns}/{*key}", Endpoint::KvDelete),
    Route::new(Method::POST, "/api/v1/transaction", Endpoint::Transaction),
    Route::new(Method::POST, "/api/v1/timers", Endpoint::TimersBatch),
    Route::new(Method::GET, "/api/v1/timers/{queue}", Endpoint::TimersList),
    Route::new(Method::GET, "/api/v1/timers/{queue}/{*timerKey}", Endpoint::TimerPeek),
    Route::new(Method::DELETE, "/api/v1/timers/{queue}/{*timerKey}", Endpoint::TimerCancel),
    Route::new(Method::GET, "/api/v1/openapi.json", Endpoint::OpenApi),
    Route::new(Method::GET, "/health", Endpoint::Health),
    Route::new(Method::GET, "/metrics", Endpoint::Metrics),
];

/// One entry of [`ROUTES`].
#[derive(Debug)]
pub struct Route {
    pub method: Method,
    pub pattern: &'static str,
    pub endpoint: Endpoint,
}

impl Route {
    const fn new(method: Method, pattern: &'static str, endpoint: Endpoint) -> Route {
        Route { method, pattern, endpoint }
    }
}

/// A matched route and its path parameters, by name.
#[derive(Debug, PartialEq, Eq)]
pub struct Matched {
    pub endpoint: Endpoint,
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
            return Ok(Matched { endpoint: route.endpoint, params });
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

    #[test]
    fn literal_routes_win_over_patterns_and_methods_are_told_apart() {
        assert_eq!(route(&Method::POST, "/api/v1/push").unwrap().endpoint, Endpoint::Push);
        assert_eq!(route(&Method::GET, "/api/v1/messages/by-transaction-id").unwrap().endpoint, Endpoint::MessageByTransactionId);
        assert_eq!(route(&Method::GET, "/api/v1/push"), Err(Unrouted::MethodNotAllowed(vec![Method::POST])));
        assert_eq!(route(&Method::GET, "/api/v1/nothing"), Err(Unrouted::NotFound));
        assert_eq!(route(&Method::GET, "/api/v1/push/extra"), Err(Unrouted::NotFound));
    }

    #[test]
    fn a_rest_parameter_keeps_slashes_and_decodes_each_segment() {
        let matched = route(&Method::GET, "/api/v1/kv/orders/a/b%2Fc%20d").unwrap();
        assert_eq!(matched.endpoint, Endpoint::KvGet);
        assert_eq!(matched.param("ns"), "orders");
        assert_eq!(matched.param("key"), "a/b/c d");
        let matched = route(&Method::DELETE, "/api/v1/timers/q/k1").unwrap();
        assert_eq!((matched.endpoint, matched.param("queue"), matched.param("timerKey")), (Endpoint::TimerCancel, "q", "k1"));
        assert_eq!(route(&Method::GET, "/api/v1/timers/q").unwrap().endpoint, Endpoint::TimersList);
    }

    #[test]
    fn empty_parameters_and_bad_encodings_do_not_match() {
        assert_eq!(route(&Method::GET, "/api/v1/kv/orders/"), Err(Unrouted::NotFound));
        assert_eq!(route(&Method::GET, "/api/v1/kv//key"), Err(Unrouted::NotFound));
        assert_eq!(route(&Method::GET, "/api/v1/kv/orders/%FF"), Err(Unrouted::BadParameter("key")));
        let kv_key = vec![Method::GET, Method::HEAD, Method::PUT, Method::DELETE];
        assert_eq!(route(&Method::PATCH, "/api/v1/kv/orders/k"), Err(Unrouted::MethodNotAllowed(kv_key)));
    }

    #[test]
    fn head_is_served_where_get_is() {
        assert_eq!(route(&Method::HEAD, "/health").unwrap().endpoint, Endpoint::Health);
        assert_eq!(route(&Method::HEAD, "/api/v1/kv/orders/k").unwrap().endpoint, Endpoint::KvGet);
        assert_eq!(route(&Method::HEAD, "/api/v1/push"), Err(Unrouted::MethodNotAllowed(vec![Method::POST])));
    }
}
