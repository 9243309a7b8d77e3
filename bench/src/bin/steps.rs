//! `once`, transactions and timers beside plain pushes, through one gateway
//! on one database, rounds interleaved, synchronous_commit as the server has
//! it (on by default).
//!
//! Each round runs, for `--secs` each, with `--conns` connections in closed
//! loops (each sends its next request when the last is answered):
//!
//! - `push`: one message per request, a new transactionId each;
//! - `once`: `POST /api/v1/kv` with one `putIfAbsent … required` of a new key;
//! - `transaction`: a `once` and a push of one message, all or nothing;
//! - `timers`: `--timers` timers scheduled due at once (in requests of 100),
//!   timed from the first schedule to the last fire (read back in SQL).
//!
//! It prints requests per second, p50 and p99 per kind and round, and the
//! medians with each kind's ratio to plain pushes.
//!
//! ```sh
//! cargo run --release -p stile-bench --bin steps -- --secs 10 --rounds 3
//! ```

use std::time::{Duration, Instant};

use base64::Engine as _;
use clap::Parser;
use serde_json::json;
use stile_bench::{count, machine, median, run_to_end, seconds, server_version};
use stile_tests::gateway::{Client, Gateway, fresh_database};

#[derive(Parser, Debug)]
#[command(about = "once, transactions and timers beside plain pushes")]
struct Args {
    /// Seconds each kind runs per round.
    #[arg(long, default_value = "10", value_parser = seconds)]
    secs: f64,
    /// Rounds, each running every kind once.
    #[arg(long, default_value = "3", value_parser = count::<usize>)]
    rounds: usize,
    /// Connections in closed loops.
    #[arg(long, default_value = "32", value_parser = count::<usize>)]
    conns: usize,
    /// Timers scheduled per round.
    #[arg(long, default_value = "20000", value_parser = count::<usize>)]
    timers: usize,
    /// Partitions the pushes spread over.
    #[arg(long, default_value = "64", value_parser = count::<usize>)]
    partitions: usize,
}

fn main() {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a tokio runtime");
    run_to_end("steps", "its gateway is stopped and its database dropped", runtime, run(args));
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Push,
    Once,
    Transaction,
}

const KINDS: [Kind; 3] = [Kind::Push, Kind::Once, Kind::Transaction];

/// What one kind measured in one round.
#[derive(Clone, Copy, Debug)]
struct Figure {
    per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
}

async fn run(args: Args) {
    let t = fresh_database().await;
    let pg = t.client().await;
    let version = server_version(&pg).await;
    let sync: String =
        pg.query_one("SHOW synchronous_commit", &[]).await.expect("read synchronous_commit").get("synchronous_commit");
    let gw = Gateway::start(&t.url()).await;
    let mut figures: Vec<(Kind, Figure)> = Vec::new();
    let mut timer_rates = Vec::new();
    for round in 0..args.rounds {
        for kind in KINDS {
            let figure = closed_loops(&gw, &args, kind, round).await;
            eprintln!("round {round} {kind:?}: {figure:?}");
            figures.push((kind, figure));
        }
        let rate = timers(&gw, &t, &args, round).await;
        eprintln!("round {round} timers: {rate:.0} fired/s");
        timer_rates.push(rate);
    }
    drop(gw);
    println!();
    println!(
        "Steps: {} connections in closed loops, {} s per kind and round, {} rounds interleaved, one gateway with its \
         defaults, PostgreSQL {version} (synchronous_commit={sync}), {}",
        args.conns,
        args.secs,
        args.rounds,
        machine()
    );
    println!();
    println!("| kind | requests/s (median) | vs plain pushes | p50 ms | p99 ms | rounds |");
    println!("|---|---:|---:|---:|---:|---|");
    let of = |kind: Kind| figures.iter().filter(move |(k, _)| *k == kind).map(|(_, f)| *f);
    let push_rate = median(of(Kind::Push).map(|f| f.per_sec));
    for kind in KINDS {
        let rate = median(of(kind).map(|f| f.per_sec));
        let rounds: Vec<String> = of(kind).map(|f| format!("{:.0}", f.per_sec)).collect();
        println!(
            "| {} | {rate:.0} | {:.2} | {:.1} | {:.1} | {} |",
            match kind {
                Kind::Push => "push (1 message)",
                Kind::Once => "once (kv putIfAbsent, required)",
                Kind::Transaction => "transaction (once + 1 push)",
            },
            rate / push_rate,
            median(of(kind).map(|f| f.p50_ms)),
            median(of(kind).map(|f| f.p99_ms)),
            rounds.join(" / ")
        );
    }
    let rounds: Vec<String> = timer_rates.iter().map(|r| format!("{r:.0}")).collect();
    println!(
        "| timers fired ({} per round, scheduled due) | {:.0} | | | | {} |",
        args.timers,
        median(timer_rates.iter().copied()),
        rounds.join(" / ")
    );
}

async fn closed_loops(gw: &Gateway, args: &Args, kind: Kind, round: usize) -> Figure {
    let deadline = Instant::now() + Duration::from_secs_f64(args.secs);
    let mut tasks = Vec::new();
    for conn in 0..args.conns {
        let mut client = gw.client().await;
        let partitions = args.partitions;
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut seq = 0u64;
            while Instant::now() < deadline {
                let id = format!("r{round}-c{conn}-{seq}");
                let partition = format!("p{}", seq as usize % partitions);
                seq += 1;
                let started = Instant::now();
                request(&mut client, kind, &id, &partition).await;
                latencies.push(started.elapsed().as_secs_f64() * 1000.0);
            }
            latencies
        }));
    }
    let started = Instant::now();
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.expect("a load task"));
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort_by(f64::total_cmp);
    let at = |q: f64| latencies.get(((latencies.len() as f64 - 1.0) * q) as usize).copied().unwrap_or(f64::NAN);
    Figure { per_sec: latencies.len() as f64 / elapsed, p50_ms: at(0.5), p99_ms: at(0.99) }
}

async fn request(client: &mut Client, kind: Kind, id: &str, partition: &str) {
    let (path, body, expected) = match kind {
        Kind::Push => (
            "/api/v1/push",
            json!({"items": [{"queue": "steps", "partition": partition, "transactionId": id, "payload": {"id": id}}]}),
            201,
        ),
        Kind::Once => (
            "/api/v1/kv",
            json!({"operations": [{"op": "putIfAbsent", "ns": "steps", "key": id, "value": true, "ttlSeconds": 3600, "required": true}]}),
            200,
        ),
        Kind::Transaction => (
            "/api/v1/transaction",
            json!({"operations": [{"type": "push", "items": [{"queue": "steps-tx", "partition": partition, "transactionId": id,
                                                             "payload": {"id": id}}]}],
                   "kv": [{"op": "putIfAbsent", "ns": "steps-tx", "key": id, "value": true, "ttlSeconds": 3600, "required": true}]}),
            200,
        ),
    };
    let reply = client.post(path, body.to_string()).await;
    assert_eq!(reply.status, expected, "{path}: {}", reply.text());
    if kind != Kind::Push {
        let answer = reply.json();
        assert!(answer.get("results").is_some() && answer.get("reason").is_none(), "{path}: {answer}");
    }
}

/// Schedules `--timers` due timers and answers how many fired per second,
/// from the first schedule to the moment none is left.
async fn timers(gw: &Gateway, t: &stile_tests::pg::TestDb, args: &Args, round: usize) -> f64 {
    let pg = t.client().await;
    let mut client = gw.client().await;
    let payload = base64::engine::general_purpose::STANDARD.encode(r#"{"timer":true}"#);
    let started = Instant::now();
    for chunk in 0..args.timers.div_ceil(100) {
        let ops: Vec<_> = (chunk * 100..((chunk + 1) * 100).min(args.timers))
            .map(|n| {
                json!({"op": "schedule", "queue": "steps-timers", "timerKey": format!("r{round}-{n}"), "delayMs": 0,
                       "txn": format!("r{round}-t{n}"), "partition": format!("p{}", n % args.partitions), "payload": payload})
            })
            .collect();
        let reply = client.post("/api/v1/timers", json!({ "operations": ops }).to_string()).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    loop {
        let left: i64 = pg.query_one("SELECT count(*) AS left FROM stile.timers", &[]).await.expect("count timers").get("left");
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let fired: i64 = pg
        .query_one(
            "SELECT count(*) AS fired FROM stile.messages WHERE queue = 'steps-timers' AND transaction_id LIKE $1",
            &[&format!("r{round}-t%")],
        )
        .await
        .expect("count fired")
        .get("fired");
    assert_eq!(fired as usize, args.timers, "every timer fired once");
    args.timers as f64 / started.elapsed().as_secs_f64()
}
