//! Shared harness of stile's integration tests: fresh PostgreSQL databases,
//! PostgreSQL servers of a test's own, the built component, gateway
//! processes, and certificates for TLS.

pub mod checker;
pub mod clock;
pub mod component;
pub mod cpu;
pub mod gateway;
pub mod pg;
pub mod proxy;
pub mod scratch;
pub(crate) mod servers;
pub mod tls_pki;
pub mod trace;
