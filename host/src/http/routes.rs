//! The route table: every route's method, path pattern and handler, one row
//! each, in the order they are tried.
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
//! A pattern's segment is a literal, `{name}` (one segment) or, last,
//! `{*name}` (the rest of the path). This file is the one place of `http/`
//! that names a feature.

use hyper::Method;

use super::call::Route;
use crate::{configure, kv, push, reads, service, timers, transaction};

/// A handler of the table: a feature's `async fn(Call) -> Result<Reply,
/// Failure>`, its future boxed so that every row has one type.
macro_rules! handler {
    ($run:path) => {
        |call| Box::pin($run(call))
    };
}

/// Every route, in the order they are tried. A literal route comes before a
/// pattern that would also match it.
pub static ROUTES: &[Route] = &[
    Route::new(Method::POST, "/api/v1/push", handler!(push::route::push)),
    Route::new(Method::POST, "/api/v1/configure", handler!(configure::route::configure)),
    Route::new(Method::GET, "/api/v1/messages/by-transaction-id", handler!(reads::route::by_transaction_id)),
    Route::new(Method::GET, "/api/v1/messages", handler!(reads::route::messages)),
    Route::new(Method::POST, "/api/v1/kv", handler!(kv::route::batch)),
    Route::new(Method::GET, "/api/v1/kv/{ns}/{*key}", handler!(kv::route::get)),
    Route::new(Method::PUT, "/api/v1/kv/{ns}/{*key}", handler!(kv::route::put)),
    Route::new(Method::DELETE, "/api/v1/kv/{ns}/{*key}", handler!(kv::route::delete)),
    Route::new(Method::POST, "/api/v1/transaction", handler!(transaction::route::transaction)),
    Route::new(Method::POST, "/api/v1/timers", handler!(timers::route::batch)),
    Route::new(Method::GET, "/api/v1/timers/{queue}", handler!(timers::route::list)),
    Route::new(Method::GET, "/api/v1/timers/{queue}/{*timerKey}", handler!(timers::route::peek)),
    Route::new(Method::DELETE, "/api/v1/timers/{queue}/{*timerKey}", handler!(timers::route::cancel)),
    Route::new(Method::GET, "/api/v1/openapi.json", handler!(service::openapi_document)),
    Route::new(Method::GET, "/health", handler!(service::health)),
    Route::new(Method::GET, "/metrics", handler!(service::metrics)),
];

#[cfg(test)]
mod tests {
    use hyper::Method;

    use super::ROUTES;
    use crate::http::call::Matched;
    use crate::http::router::Unrouted;

    fn route(method: &Method, path: &str) -> Result<Matched, Unrouted> {
        crate::http::router::route(ROUTES, method, path)
    }

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
