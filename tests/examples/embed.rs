//! A minimal Rust host for stile's cache component: wasmtime, the WIT file
//! (`wit/dedup.wit`) and the component file, nothing of stile's own crates.
//!
//! ```text
//! cargo build --release -p stile                               # writes target/stile_dedup.wasm
//! cargo run --release -p stile-tests --example embed           # the walk-through, then the benchmark
//! cargo run --release -p stile-tests --example embed -- PATH [--no-bench]
//! ```
//!
//! The walk-through makes one shard, hydrates an empty partition, plans a
//! segment (it vouches), records the commit, and plans the same segment again
//! (every hash is a local hit). The benchmark times a `stats` call (the
//! floor of a call's cost) and `plan` calls of one segment of 64 and of
//! 1,024 fresh hashes, against an empty partition (the cost of crossing into
//! the component) and against one holding 65,536 hashes.
//!
//! In your own crate: `wasmtime = { version = "48", features = ["component-model"] }`
//! and a copy of `wit/dedup.wit`.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use wasmtime::component::{Component, Linker, ResourceAny};
use wasmtime::{Engine, Store};

// Generates `Dedup` (the world) and the typed records of `stile:dedup/cache`.
wasmtime::component::bindgen!({
    path: "../wit",
    world: "dedup",
});

use exports::stile::dedup::cache::{Hydration, Segment, ShardConfig, TxnsRow};

/// Concatenated 16-byte big-endian xxh3-128 hashes of the transaction ids,
/// the one format the component takes.
fn hashes(transaction_ids: impl IntoIterator<Item = String>) -> Vec<u8> {
    transaction_ids.into_iter().flat_map(|id| xxhash_rust::xxh3::xxh3_128(id.as_bytes()).to_be_bytes()).collect()
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970").as_millis() as i64
}

fn main() -> wasmtime::Result<()> {
    let mut args = std::env::args().skip(1);
    let mut path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/stile_dedup.wasm");
    let mut bench = true;
    for arg in args.by_ref() {
        match arg.as_str() {
            "--no-bench" => bench = false,
            _ => path = PathBuf::from(arg),
        }
    }

    // Load: the component imports nothing, so the linker stays empty.
    let engine = Engine::default();
    let component = Component::from_file(&engine, &path)?;
    let linker = Linker::new(&engine);
    let mut store = Store::new(&engine, ());
    let dedup = Dedup::instantiate(&mut store, &component, &linker)?;
    let cache = dedup.stile_dedup_cache();
    println!("loaded {} ({} bytes)", path.display(), std::fs::metadata(&path)?.len());

    // One shard: a 64 MiB budget and the gateway's 5 s clock-skew slack.
    let config = ShardConfig { budget_bytes: 64 << 20, skew_slack_ms: 5_000 };
    let shard: ResourceAny = cache.shard().call_constructor(&mut store, config)?;

    let (partition, window_ms) = (7, 3_600_000);
    let now = now_ms();
    // A partition new to PostgreSQL: admit, then hydrate it from an empty
    // read (no rows, allocator at -1).
    let admission = cache.shard().call_admit(&mut store, shard, now, partition, window_ms, 0)?;
    println!("admit partition {partition}: {admission:?}");
    let empty = Hydration { partition, window_ms, last_offset: -1, rows: Vec::new() };
    let hydrated = cache.shard().call_hydrate(&mut store, shard, now, &empty)?;
    println!("hydrate (empty): {hydrated:?}");

    // Plan a flush of one segment of three messages.
    let batch = hashes(["order-1", "order-2", "order-3"].map(String::from));
    let segment = Segment { partition, window_ms, hashes: batch.clone() };
    let plan = cache.shard().call_plan(&mut store, shard, now, std::slice::from_ref(&segment))?;
    println!("plan: p-verified {} (push with it), local hits {:?}, {:?}", plan[0].p_verified, plan[0].local_hits, plan[0].state);

    // PostgreSQL stored them at offsets 0..2; report the commit.
    let commit = exports::stile::dedup::cache::Commit { partition, base_offset: 0, created_ms: now, hashes: batch };
    cache.shard().call_record_commits(&mut store, shard, now + 1, &[commit])?;

    // The same segment again (a producer retry): every hash is a local hit,
    // and the answer is just below the first one's offset (-1 here, as it
    // is 0), so that PostgreSQL's probe finds the originals.
    let plan = cache.shard().call_plan(&mut store, shard, now + 2, &[segment])?;
    println!("plan again: p-verified {}, local hits {:?}, {:?}", plan[0].p_verified, plan[0].local_hits, plan[0].state);
    let stats = cache.shard().call_stats(&mut store, shard)?;
    println!(
        "stats: {} entry, {} hashes, {} bytes, {} segments planned, {} vouched, {} local hits",
        stats.entries, stats.hashes, stats.bytes, stats.segments_planned, stats.segments_vouched, stats.local_hits
    );

    if bench {
        benchmark(&mut store, &dedup, shard, now + 3)?;
    }
    Ok(())
}

/// Times calls for about half a second each and prints the cost per call
/// and per hash: against an empty partition (what crossing into the
/// component costs) and against one holding 65,536 hashes (plus the cache's
/// own work).
fn benchmark(store: &mut Store<()>, dedup: &Dedup, shard: ResourceAny, now: i64) -> wasmtime::Result<()> {
    let cache = dedup.stile_dedup_cache();
    let window_ms = 3_600_000;
    let (empty, held) = (8, 9);
    let hydration = Hydration { partition: empty, window_ms, last_offset: -1, rows: Vec::new() };
    cache.shard().call_hydrate(&mut *store, shard, now, &hydration)?.expect("a well-formed hydration");
    // 65,536 hashes, as 16 txns rows of 4,096.
    let rows: Vec<TxnsRow> = (0..16)
        .map(|row| TxnsRow {
            base_offset: row * 4_096,
            end_offset: row * 4_096 + 4_095,
            created_ms: now,
            hashes: hashes((row * 4_096..(row + 1) * 4_096).map(|i| format!("held-{i}"))),
        })
        .collect();
    let hydration = Hydration { partition: held, window_ms, last_offset: 65_535, rows };
    cache.shard().call_hydrate(&mut *store, shard, now, &hydration)?.expect("a well-formed hydration");

    println!("\nbenchmark: one shard in wasmtime");
    let stats = time(|| cache.shard().call_stats(&mut *store, shard).map(drop))?;
    println!("  stats()                                 {stats:>9.0} ns/call");
    let mut boundary = Vec::new();
    for (partition, what, p_verified) in [(empty, "empty partition", -1), (held, "65,536 held", 65_535)] {
        for size in [64, 1_024] {
            let segment = [Segment { partition, window_ms, hashes: hashes((0..size).map(|i| format!("fresh-{i}"))) }];
            let per_call = time(|| {
                let plans = cache.shard().call_plan(&mut *store, shard, now, &segment)?;
                assert_eq!(plans[0].p_verified, p_verified, "fresh hashes vouch");
                Ok(())
            })?;
            let label = format!("plan, {what}, 1 x {size:>5} hashes");
            println!("  {label:<40}{per_call:>9.0} ns/call {:>7.1} ns/hash", per_call / size as f64);
            if partition == empty {
                boundary.push((size as f64, per_call));
            }
        }
    }
    let [(n1, t1), (n2, t2)] = boundary[..] else { unreachable!() };
    let per_hash = (t2 - t1) / (n2 - n1);
    println!("  crossing (empty partition): {:.0} ns per plan call + {per_hash:.1} ns per hash", t1 - per_hash * n1);
    Ok(())
}

/// Nanoseconds per call of `f`, over about half a second after a warm-up.
fn time(mut f: impl FnMut() -> wasmtime::Result<()>) -> wasmtime::Result<f64> {
    for _ in 0..100 {
        f()?;
    }
    let budget = Duration::from_millis(500);
    let start = Instant::now();
    let mut calls = 0u64;
    while start.elapsed() < budget {
        for _ in 0..64 {
            f()?;
        }
        calls += 64;
    }
    Ok(start.elapsed().as_nanos() as f64 / calls as f64)
}
