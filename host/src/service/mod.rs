//! The gateway's own routes: `/health`, `/metrics` and the OpenAPI document.

pub mod openapi;

use bytes::Bytes;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::{Response, StatusCode};
use serde_json::json;

use crate::http::call::Call;
use crate::http::reply::{Failure, Reply, json_reply};

/// `GET /health`: 200 while the database answers, else 503; either way with
/// the intake's state, so that a balancer or an operator sees a gateway
/// shedding load.
pub async fn health(call: Call<'_>) -> Result<Reply, Failure> {
    call.app.gateway.db().schema_version().await?;
    let intake = call.app.intake.state();
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

/// `GET /metrics`: Prometheus text.
pub async fn metrics(call: Call<'_>) -> Result<Reply, Failure> {
    let metrics = call.app.gateway.metrics();
    metrics.publish_intake(&call.app.intake.state());
    let mut reply = Response::new(Bytes::from(metrics.render()));
    reply.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"));
    Ok(reply)
}

/// `GET /api/v1/openapi.json`: the OpenAPI document of every route, as kept
/// in `host/openapi.json`.
pub async fn openapi_document(_call: Call<'_>) -> Result<Reply, Failure> {
    let mut reply = Response::new(Bytes::from_static(openapi::DOCUMENT.as_bytes()));
    reply.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(reply)
}
