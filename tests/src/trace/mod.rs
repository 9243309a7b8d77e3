//! The cache's cross-host trace: one recorded scenario of calls on one shard,
//! with the answers the native core gave, that every host of the component
//! (Rust through wasmtime, Node through jco, Python through wasmtime-py)
//! replays and must answer identically.
//!
//! The scenario is [`record`]: a small PostgreSQL model ([`Pg`]) allocates
//! offsets and stores commits, and a [`Recorder`] runs every call on a native
//! [`Shard`](stile_guest::Shard) and writes down the call and its answer, a
//! [`Trace`]. [`replay`] runs a trace on any
//! [`DedupCache`](stile_guest::DedupCache) and reports the first answer that
//! differs. [`to_json`] renders a trace as `tests/trace/cache-trace.json`
//! byte for byte the same on every run, so that a stale file shows up as a
//! difference ([`REGENERATE`] rewrites it, [`staleness`] finds it), and
//! [`from_json`] reads it back.
//!
//! The file's format (version 1), in the WIT's own kebab-case names:
//!
//! ```text
//! { "format": "stile-dedup-trace", "version": 1,
//!   "interface": "stile:dedup/cache@0.1.0",
//!   "config": { "budget-bytes": u64, "skew-slack-ms": u32 },
//!   "calls": [ { "note"?: string, "call": name, ...arguments, "expect"?: answer } ] }
//! ```
//!
//! | `call` | arguments | `expect` |
//! |---|---|---|
//! | `plan` | `now-ms`, `segments: [{partition, window-ms, hashes}]` | `[{p-verified, local-hits, state}]` |
//! | `record-commits` | `now-ms`, `commits: [{partition, base-offset, created-ms, hashes}]` | none |
//! | `admit` | `now-ms`, `partition`, `window-ms`, `estimate-hashes` | `"hydrate"` or `"suppressed"` |
//! | `hydrate` | `now-ms`, `hydration: {partition, window-ms, last-offset, rows: [{base-offset, end-offset, created-ms, hashes}]}` | `{"ok": null}` or `{"err": "malformed" \| "window-off"}` |
//! | `expire` | `now-ms` | none |
//! | `forget` | `partition` | none |
//! | `stats` | none | the `stats` record |
//!
//! `hashes` is a list of 32-digit hex strings, one per 16-byte big-endian
//! xxh3-128 hash; a host concatenates them into the flat `list<u8>` the WIT
//! takes. Every number fits in 53 bits, so that any JSON parser reads it
//! exactly.

mod json;
mod model;
mod pg;
mod recorder;
mod replay;
mod scenario;
mod wire;

use std::path::PathBuf;

pub use json::{FORMAT, INTERFACE, ParseError, VERSION, from_json, to_json};
pub use model::{Call, NotedCall, OwnedCommit, OwnedHydration, OwnedRow, OwnedSegment, Trace};
pub use pg::Pg;
pub use recorder::Recorder;
pub use replay::{Divergence, replay};
pub use scenario::{concat, pick, record};

/// The command that rewrites the checked-in trace.
pub const REGENERATE: &str = "cargo run --release -p stile-tests --bin trace -- write";

/// Where the trace lives in the repository.
pub fn path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("trace").join("cache-trace.json")
}

/// Compares the checked-in file with a freshly recorded trace: `None` when
/// they are the same text, else where they first differ.
pub fn staleness(checked_in: &str, fresh: &str) -> Option<String> {
    let checked_in = checked_in.replace("\r\n", "\n");
    if checked_in == fresh {
        return None;
    }
    let mut old_lines = checked_in.lines();
    let mut new_lines = fresh.lines();
    let mut line = 1;
    loop {
        match (old_lines.next(), new_lines.next()) {
            (Some(old), Some(new)) if old == new => line += 1,
            (old, new) => {
                return Some(format!(
                    "first difference at line {line}:\n  checked in: {}\n  recorded:   {}",
                    old.unwrap_or("<end of file>"),
                    new.unwrap_or("<end of file>")
                ));
            }
        }
    }
}
