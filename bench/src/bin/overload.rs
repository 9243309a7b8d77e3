//! Overload: far more connections of large pushes than PostgreSQL can take,
//! against a few connections of the same requests in the same run. Prints,
//! per phase, accepted messages per second, the latency of accepted
//! requests, the gateway's peak resident memory and what its intake held,
//! and then reads every phase's queue back: each id pushed must be stored
//! exactly once.
//!
//! ```text
//! cargo build --release -p stile -p stile-bench --bin stile --bin overload
//! target/release/overload [--conns 32,2048,4096] [--items 1000] [--secs 60]
//! ```
//!
//! A gateway process with its defaults (flags through the `STILE_*`
//! environment, e.g. `STILE_MAX_HELD_MB`) and a queue of its own for each
//! phase, on a fresh database dropped at the end. Every connection pushes `--items` messages to one random partition
//! per request and re-sends, byte for byte, `--retry-percent` of its earlier
//! requests. A request not answered 201 (an error, a 503, no answer) is sent
//! again until it is; when a phase's time is up, each connection finishes
//! the request it has under way, so that every id sent was acknowledged.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use hyper::Method;
use rand::rngs::SmallRng;
use rand::{Rng as _, SeedableRng as _};
use stile_bench::{count, machine, percentile_ms, run_to_end, seconds, server_version, write_push_body};
use stile_tests::gateway::{Client, Gateway, fresh_database, metric};

#[derive(Debug, Parser)]
#[command(
    name = "overload",
    about = "The gateway under overload: memory, accepted throughput and exactness, against few connections in the same run",
    after_help = "Environment: STILE_TEST_DATABASE_URL names the PostgreSQL server (default: libpq's defaults); \
                  STILE_BIN the stile binary; STILE_* variables reach the gateway as its flags."
)]
struct Args {
    /// Connections of each phase, comma-separated; the first is the baseline the others are compared with.
    #[arg(long, value_delimiter = ',', default_value = "32,2048,4096", value_parser = count::<usize>)]
    conns: Vec<usize>,
    /// Messages per request.
    #[arg(long, default_value = "1000", value_parser = count::<usize>)]
    items: usize,
    /// Seconds each phase pushes.
    #[arg(long, default_value = "60", value_parser = seconds)]
    secs: f64,
    /// Partitions each phase's queue spreads its requests over.
    #[arg(long, default_value = "64", value_parser = count::<usize>)]
    partitions: usize,
    /// Percent of requests that re-send an earlier request of the same connection.
    #[arg(long, default_value = "10", value_parser = count::<u32>)]
    retry_percent: u32,
}

fn main() {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a tokio runtime");
    run_to_end("overload", "its gateway is stopped and its database dropped", runtime, run(args));
}

/// What one phase measured.
#[derive(Debug, Default)]
struct Phase {
    conns: usize,
    accepted_per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    attempts_failed: u64,
    peak_rss_mb: f64,
    peak_held_mb: f64,
    waited: f64,
    /// Distinct ids the phase's connections sent (all acknowledged).
    ids_sent: u64,
    stored: i64,
    stored_distinct: i64,
}

async fn run(args: Args) {
    let t = fresh_database().await;
    let pg = t.client().await;
    let version = server_version(&pg).await;
    let mut phases = Vec::new();
    for (index, &conns) in args.conns.iter().enumerate() {
        // A gateway and a queue of its own for each phase: every phase starts
        // from an empty cache and a fresh process, so that what one phase
        // left (a full cache budget, the allocator's high-water mark) does
        // not weigh on the next.
        let gw = Gateway::start(&t.url()).await;
        let queue = format!("overload-{index}-{conns}");
        let phase = phase(&gw, &args, &queue, conns).await;
        drop(gw);
        let row = pg
            .query_one(
                "SELECT count(*) AS stored, count(DISTINCT (partition, transaction_id)) AS stored_distinct FROM stile.messages WHERE queue = $1",
                &[&queue],
            )
            .await
            .expect("read the phase's messages back");
        let phase = Phase { stored: row.get("stored"), stored_distinct: row.get("stored_distinct"), ..phase };
        eprintln!("  {phase:?}");
        phases.push(phase);
    }
    let baseline = phases.first().map_or(f64::NAN, |p| p.accepted_per_sec);
    println!();
    println!(
        "Overload: {} messages per request, {} partitions, {} % retries, {} s per phase, a fresh gateway with its \
         defaults (STILE_* as set) for each phase, PostgreSQL {version}, {}",
        args.items,
        args.partitions,
        args.retry_percent,
        args.secs,
        machine()
    );
    println!();
    println!(
        "| connections | accepted msg/s | vs the first | p50 ms | p99 ms | failed attempts (retried) | peak RSS MiB \
         | peak held MiB | requests that waited | ids sent | stored | stored twice | lost |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for p in &phases {
        println!(
            "| {} | {:.0} | {:.2} | {:.0} | {:.0} | {} | {:.0} | {:.0} | {:.0} | {} | {} | {} | {} |",
            p.conns,
            p.accepted_per_sec,
            p.accepted_per_sec / baseline,
            p.p50_ms,
            p.p99_ms,
            p.attempts_failed,
            p.peak_rss_mb,
            p.peak_held_mb,
            p.waited,
            p.ids_sent,
            p.stored,
            p.stored - p.stored_distinct,
            p.ids_sent as i64 - p.stored_distinct
        );
    }
    drop(pg);
    drop(t);
}

/// One phase: `conns` connections for `--secs`, the gateway's memory and
/// intake sampled every 100 ms.
async fn phase(gw: &Gateway, args: &Args, queue: &str, conns: usize) -> Phase {
    let mut observer = gw.client().await;
    let waited_before = metric(&observer.metrics().await, "stile_requests_waited_for_room_total");
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(args.secs);
    let stop = Arc::new(AtomicBool::new(false));
    let failed = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::with_capacity(conns);
    for c in 0..conns {
        let client = gw.client().await;
        let plan = Plan { queue: queue.to_owned(), tag: format!("c{c}"), end, failed: failed.clone() };
        tasks.push(tokio::spawn(connection(client, plan, args.items, args.partitions, args.retry_percent)));
    }
    let sampler = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let (mut rss, mut held) = (0f64, 0f64);
            let mut ticker = tokio::time::interval(Duration::from_millis(100));
            let mib = f64::from(1 << 20);
            while !stop.load(Ordering::Relaxed) {
                ticker.tick().await;
                // The gateway reads its own resident set at each scrape.
                let text = observer.metrics().await;
                rss = rss.max(metric(&text, "stile_process_resident_memory_bytes") / mib);
                held = held.max(metric(&text, "stile_held_request_bytes") / mib);
            }
            (rss, held, observer)
        })
    };
    let mut latencies: Vec<u32> = Vec::new();
    let mut accepted = 0u64;
    let mut ids_sent = 0u64;
    for task in tasks {
        let tally = task.await.expect("a connection task");
        accepted += tally.accepted_items;
        ids_sent += tally.ids_sent;
        latencies.extend(tally.latencies_us);
    }
    stop.store(true, Ordering::Relaxed);
    let (peak_rss_mb, peak_held_mb, mut observer) = sampler.await.expect("the sampler");
    let waited = metric(&observer.metrics().await, "stile_requests_waited_for_room_total") - waited_before;
    latencies.sort_unstable();
    let percentile = |p: f64| percentile_ms(&latencies, p);
    Phase {
        conns,
        accepted_per_sec: accepted as f64 / args.secs,
        p50_ms: percentile(50.0),
        p99_ms: percentile(99.0),
        attempts_failed: failed.load(Ordering::Relaxed),
        peak_rss_mb,
        peak_held_mb,
        waited,
        ids_sent,
        ..Phase::default()
    }
}

struct Plan {
    queue: String,
    tag: String,
    end: Instant,
    failed: Arc<AtomicU64>,
}

#[derive(Default)]
struct Tally {
    /// Items of requests answered 201 before the phase's end.
    accepted_items: u64,
    ids_sent: u64,
    /// Of every accepted request, from its first attempt to its answer.
    latencies_us: Vec<u32>,
}

async fn connection(mut client: Client, plan: Plan, items: usize, partitions: usize, retry_percent: u32) -> Tally {
    let Plan { queue, tag, end, failed } = plan;
    let mut rng = SmallRng::seed_from_u64(tag.bytes().fold(7u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b))));
    let mut tally = Tally::default();
    let mut history: Vec<Bytes> = Vec::new();
    let mut seq = 0u64;
    while Instant::now() < end {
        let body = if !history.is_empty() && rng.random_range(0..100) < retry_percent {
            history[rng.random_range(0..history.len())].clone()
        } else {
            let partition = rng.random_range(0..partitions);
            let mut text = String::with_capacity(items * 120);
            write_push_body(&mut text, &queue, partition, &tag, seq, items);
            seq += 1;
            tally.ids_sent += items as u64;
            let body = Bytes::from(text);
            if history.len() < 16 {
                history.push(body.clone());
            }
            body
        };
        let sent = Instant::now();
        // Sent again until answered 201: a retried push is safe by construction.
        loop {
            match client.send(Method::POST, "/api/v1/push", body.clone(), &[("content-type", "application/json")]).await {
                Ok(reply) if reply.status == 201 => break,
                _ => {
                    failed.fetch_add(1, Ordering::Relaxed);
                    tokio::task::yield_now().await;
                }
            }
        }
        let done = Instant::now();
        if done <= end {
            tally.accepted_items += items as u64;
            tally.latencies_us.push(u32::try_from(done.duration_since(sent).as_micros()).unwrap_or(u32::MAX));
        }
    }
    tally
}
