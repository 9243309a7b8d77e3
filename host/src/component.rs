//! The embedded cache component (built from `guest/` by `host/build.rs`).

/// The component's bytes: `wit/dedup.wit`'s `dedup` world, importing nothing.
pub static COMPONENT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/stile_dedup.wasm"));
