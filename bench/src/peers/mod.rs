//! The `peers` benchmark's parts: the systems stile is compared with
//! ([`systems`], [`jetstream`], and the HTTP endpoints of
//! [`crate::peer_http`]), the one workload they all get ([`workload`]), and
//! the charts of the results page ([`chart`]).

pub mod chart;
pub mod jetstream;
pub mod systems;
pub mod workload;
