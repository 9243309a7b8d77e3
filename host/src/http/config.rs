//! The HTTP layer's limits and access control, as the command line sets them.

use super::allowed_hosts::AllowedHosts;
use super::conn::ConnectionLimits;

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
