//! Shared harness of stile's integration tests: fresh PostgreSQL databases,
//! the built component, and gateway processes.

pub mod checker;
pub mod clock;
pub mod component;
pub mod cpu;
pub mod gateway;
pub mod pg;
pub mod proxy;
pub(crate) mod servers;
pub mod trace;
