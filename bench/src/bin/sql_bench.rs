//! Throughput of `stile.push` (through `stile::db::Db::push_bundle`) against
//! the plain alternative, at several segment sizes and window sizes.
//!
//! ```text
//! cargo build --release -p stile-bench --bin sql_bench
//! target/release/sql_bench [--sizes 1,10,100] [--windows 0,100000,1000000] [--conns 2] \
//!     [--secs 1.5] [--reps 3] [--sync off|on] [--modes forced,vouched,retry,window0,plain]
//! ```
//!
//! For every window size W it makes a fresh set of `conns` partitions whose
//! window holds W hashes (prefilled as txns rows of 4,096 hashes), and a
//! plain table whose unique index holds W keys per partition. Then, for every
//! segment size and repetition, each mode runs for `secs` seconds with one
//! connection per partition, every push one bundle of one segment:
//!
//! * forced:  `p_verified = -1`, the full-window probe;
//! * vouched: `p_verified = last_offset`, as a warm cache sends: no probe;
//! * retry:   every vouched push is sent again at once with `p_verified`
//!   at the start of its base offset's step of 16 (one below the base
//!   offset rounded down to a multiple of 16), as a warm cache floors a local
//!   hit in a sealed block: the probe reads the segment's row and up to 15
//!   offsets of the row below, finds every message a duplicate and writes
//!   nothing (both pushes count as messages);
//! * window0: the queue's window set to 0: no probe, txns still written;
//! * plain:   one row per message in a table with a unique index on
//!   `(partition_id, transaction_id)`, `INSERT ... ON CONFLICT DO NOTHING`.
//!
//! Rows pushed by a repetition are deleted after it (and the tables
//! vacuumed), so the window holds W hashes when each repetition starts. The
//! figures are medians over the repetitions, in messages per second.
//!
//! The database is a fresh `stile_t_<random>` on the server named by
//! `STILE_TEST_DATABASE_URL` (default: libpq's defaults), dropped at the end,
//! also when Ctrl-C or SIGTERM stops the run (which then exits 130).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::{Value, json};
use stile::configure::ConfigureMode;
use stile::db::{ClockFloor, Db, ProbeMode, SegmentOutcome, SegmentPush};
use stile::payload::Payload;
use stile_bench::{Switch, count, load_average, machine, median, run_to_end, seconds, server_version};
use stile_tests::cpu::cpu_seconds;
use stile_tests::pg::{TestDb, backend_pids, connect};

/// The push function's throughput and server CPU per message, by probe
/// mode, segment size and window size, against a plain unique index.
#[derive(Debug, Parser)]
#[command(
    name = "sql_bench",
    about = "Throughput of stile's push function (probe forced, vouched, a retry, window 0) against a plain unique index",
    after_help = "Environment: STILE_TEST_DATABASE_URL names the PostgreSQL server the run creates its database on \
                  (default: libpq's defaults and the PG* variables). Ctrl-C or SIGTERM stops a run, drops its \
                  database and exits 130."
)]
struct Args {
    /// Messages per segment, comma-separated: every size is measured in turn.
    #[arg(long, value_delimiter = ',', default_value = "1,10,100", value_parser = count::<usize>)]
    sizes: Vec<usize>,
    /// Hashes each partition's window holds before a run, comma-separated (and keys per partition in the plain
    /// table's unique index).
    #[arg(long, value_delimiter = ',', default_value = "0,100000,1000000", value_parser = count::<usize>)]
    windows: Vec<usize>,
    /// Connections, each pushing to a partition of its own.
    #[arg(long, default_value = "2", value_parser = count::<usize>)]
    conns: usize,
    /// Seconds each mode runs per repetition.
    #[arg(long, default_value = "1.5", value_parser = seconds)]
    secs: f64,
    /// Repetitions of every mode at every window and segment size; the figures are their medians.
    #[arg(long, default_value = "3", value_parser = count::<usize>)]
    reps: usize,
    /// `synchronous_commit` of the benchmark's sessions.
    #[arg(long, value_enum, default_value = "off")]
    sync: Switch,
    /// What to run, comma-separated: forced (p_verified -1: the full-window probe), vouched (p_verified at the
    /// allocator: no probe), retry (each vouched push sent again, floored as a warm cache floors a local hit),
    /// window0 (the queue's window 0), plain (a table with a unique index).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "forced,vouched,retry,window0,plain")]
    modes: Vec<Mode>,
}

fn main() {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a tokio runtime");
    run_to_end("sql_bench", "its database is dropped", runtime, run(args));
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
enum Mode {
    Forced,
    Vouched,
    Retry,
    Window0,
    Plain,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Forced => "forced",
            Mode::Vouched => "vouched",
            Mode::Retry => "retry",
            Mode::Window0 => "window0",
            Mode::Plain => "plain",
        }
    }
}

const PREFILL_ROW: i64 = 4096;

fn payload(n: u64) -> Value {
    json!({"orderId": n, "amount": 99.5, "currency": "EUR", "customer": "customer-42", "paid": true})
}

/// One level of the window dimension: its partitions and plain table.
struct Level {
    window: usize,
    queue: String,
    ids: Vec<i64>,
    plain_table: String,
}

async fn setup_level(t: &TestDb, db: &Db, window: usize, conns: usize) -> Level {
    let c = t.client().await;
    let queue = format!("bench_w{window}");
    let mut ids = Vec::new();
    for i in 0..conns {
        let p = db.resolve_partition(&queue, &format!("p{i}")).await.unwrap();
        ids.push(p.id);
        if window > 0 {
            c.execute(
                "WITH a AS (SELECT $1::bigint AS pid, $2::bigint AS chunk, $3::bigint AS w) \
                 INSERT INTO stile.log (partition_id, base_offset, end_offset, created_at, hashes) \
                 SELECT a.pid, b * a.chunk, least((b + 1) * a.chunk, a.w) - 1, clock_timestamp(), \
                        (SELECT string_agg(decode(md5(a.pid::text || ':' || i::text), 'hex'), ''::bytea ORDER BY i) \
                           FROM generate_series(b * a.chunk, least((b + 1) * a.chunk, a.w) - 1) AS i) \
                   FROM a, generate_series(0, (a.w - 1) / a.chunk) AS b",
                &[&p.id, &PREFILL_ROW, &(window as i64)],
            )
            .await
            .unwrap();
            c.execute("UPDATE stile.partitions SET last_offset = $2::bigint - 1 WHERE id = $1", &[&p.id, &(window as i64)])
                .await
                .unwrap();
        }
    }
    let plain_table = format!("bench.plain_w{window}");
    c.batch_execute(&format!(
        "CREATE SCHEMA IF NOT EXISTS bench; \
         CREATE TABLE {plain_table} (partition_id bigint NOT NULL, transaction_id text NOT NULL, \
             message_id uuid NOT NULL, payload json NOT NULL, \
             created_at timestamptz NOT NULL DEFAULT clock_timestamp());"
    ))
    .await
    .unwrap();
    for &id in &ids {
        c.execute(
            &format!(
                "INSERT INTO {plain_table} (partition_id, transaction_id, message_id, payload) \
                 SELECT $1, 'prefill-' || i, gen_random_uuid(), '{{}}'::json \
                   FROM generate_series(1, $2::bigint) AS i"
            ),
            &[&id, &(window as i64)],
        )
        .await
        .unwrap();
    }
    c.batch_execute(&format!("CREATE UNIQUE INDEX ON {plain_table} (partition_id, transaction_id)")).await.unwrap();
    // One statement per call: VACUUM refuses to run in a transaction block.
    for table in [plain_table.as_str(), "stile.log", "stile.partitions"] {
        c.batch_execute(&format!("VACUUM ANALYZE {table}")).await.unwrap();
    }
    Level { window, queue, ids, plain_table }
}

/// Deletes what a repetition pushed, so the window holds W hashes again.
async fn reset_level(t: &TestDb, level: &Level) {
    let c = t.client().await;
    c.execute("DELETE FROM stile.log WHERE partition_id = ANY ($1) AND base_offset >= $2", &[&level.ids, &(level.window as i64)])
        .await
        .unwrap();
    c.batch_execute("VACUUM stile.log").await.unwrap();
}

async fn set_window(db: &Db, queue: &str, seconds: i64) {
    let mut o = serde_json::Map::new();
    o.insert("dedupWindowSeconds".into(), json!(seconds));
    db.configure(queue, &o, ConfigureMode::Merge).await.unwrap();
}

struct RunResult {
    messages: u64,
    elapsed: Duration,
    wrong_probe: u64,
}

async fn run_stile(db: &Db, level: &Level, mode: Mode, size: usize, secs: f64, salt: u64) -> RunResult {
    let planned = if mode == Mode::Window0 { 0 } else { 3600 };
    let expected = match mode {
        Mode::Forced => ProbeMode::Full,
        Mode::Vouched | Mode::Retry => ProbeMode::Skipped,
        _ => ProbeMode::Off,
    };
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for (conn, &pid) in level.ids.iter().enumerate() {
        let db = db.clone();
        let queue = level.queue.clone();
        tasks.push(tokio::spawn(async move {
            let mut last = db.resolve_partition(&queue, &format!("p{conn}")).await.unwrap().last_offset;
            let (mut messages, mut wrong) = (0u64, 0u64);
            let mut n = 0u64;
            // One segment, rewritten in place for every push: the client's
            // own work stays small beside the database's.
            let mut s = SegmentPush {
                partition_id: pid,
                p_verified: -1,
                planned_window_seconds: planned,
                hashes: vec![0; 16 * size],
                message_ids: vec![uuid::Uuid::nil(); size],
                transaction_ids: vec![bytestring::ByteString::new(); size],
                payloads: (0..size as u64).map(|n| Payload::from(&payload(n))).collect(),
                hash_floors: None,
                replays: false,
            };
            while Instant::now() < deadline {
                s.p_verified = if matches!(mode, Mode::Vouched | Mode::Retry) { last } else { -1 };
                for i in 0..size {
                    n += 1;
                    let txn = bytestring::ByteString::from(format!("order-{salt}-{conn}-{n}-paid"));
                    s.hashes[16 * i..16 * (i + 1)].copy_from_slice(&stile::hash::txn_hash(&txn));
                    s.transaction_ids[i] = txn;
                    s.message_ids[i] = fast_id();
                }
                let out = db.push_bundle(ClockFloor::EPOCH, std::slice::from_ref(&s)).await.unwrap();
                let SegmentOutcome { stored: Some(stored), probe, ref duplicates, .. } = out[0] else {
                    panic!("unexpected {:?}", out[0]);
                };
                assert!(duplicates.is_empty(), "fresh ids answered {duplicates:?}");
                let base_offset = stored.base_offset;
                // (An empty partition has nothing to probe.)
                let empty = last == -1 && probe == ProbeMode::Skipped;
                last = base_offset + size as i64 - 1;
                messages += size as u64;
                wrong += u64::from(probe != expected && !empty);
                if mode == Mode::Retry {
                    // Floored as the cache floors a hash of a sealed block:
                    // at the start of its step of 16 arrivals.
                    s.p_verified = base_offset - base_offset % 16 - 1;
                    let again = db.push_bundle(ClockFloor::EPOCH, std::slice::from_ref(&s)).await.unwrap();
                    let SegmentOutcome { stored: None, probe, ref duplicates, .. } = again[0] else {
                        panic!("a retry was stored: {again:?}");
                    };
                    let originals = duplicates.iter().enumerate().all(|(i, d)| d.offset == base_offset + i as i64);
                    assert!(duplicates.len() == size && originals, "a retry answered {duplicates:?}");
                    messages += size as u64;
                    wrong += u64::from(probe != ProbeMode::Narrowed);
                }
            }
            (messages, wrong)
        }));
    }
    let mut r = RunResult { messages: 0, elapsed: Duration::ZERO, wrong_probe: 0 };
    for task in tasks {
        let (m, w) = task.await.unwrap();
        r.messages += m;
        r.wrong_probe += w;
    }
    r.elapsed = start.elapsed();
    r
}

async fn run_plain(clients: &[Arc<tokio_postgres::Client>], level: &Level, size: usize, secs: f64, salt: u64) -> RunResult {
    let sql = format!(
        "WITH ins AS (INSERT INTO {} (partition_id, transaction_id, message_id, payload) \
             SELECT $1, u.t, u.m, u.p FROM unnest($2::text[], $3::uuid[], $4::json[]) AS u(t, m, p) \
             ON CONFLICT DO NOTHING RETURNING 1) \
         SELECT count(*) AS inserted FROM ins",
        level.plain_table
    );
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for (conn, (client, &pid)) in clients.iter().zip(&level.ids).enumerate() {
        let sql = sql.clone();
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let stmt = client.prepare(&sql).await.unwrap();
            let mut messages = 0u64;
            let mut n = 0u64;
            let mut txns = vec![String::new(); size];
            let mut ids = vec![uuid::Uuid::nil(); size];
            let payloads: Vec<Value> = (0..size as u64).map(payload).collect();
            while Instant::now() < deadline {
                for i in 0..size {
                    n += 1;
                    txns[i].clear();
                    write!(txns[i], "order-{salt}-{conn}-{n}-paid").unwrap();
                    ids[i] = fast_id();
                }
                let row = client.query_one(&stmt, &[&pid, &txns, &ids, &payloads]).await.unwrap();
                let inserted: i64 = row.get("inserted");
                assert_eq!(inserted as usize, size, "all new");
                messages += size as u64;
            }
            messages
        }));
    }
    let mut messages = 0;
    for task in tasks {
        messages += task.await.unwrap();
    }
    RunResult { messages, elapsed: start.elapsed(), wrong_probe: 0 }
}

/// A random message id without a system call (`Uuid::now_v7` asks the
/// kernel for randomness on every call, which would bill the client's cost
/// to the comparison).
fn fast_id() -> uuid::Uuid {
    uuid::Uuid::from_u128(rand::random::<u128>())
}

fn fmt_rate(r: f64) -> String {
    if r.is_nan() { "-".into() } else { format!("{:.0}", r) }
}

async fn run(args: Args) {
    let started = Instant::now();
    let load_at_start = load_average();
    eprintln!("sql_bench: {args:?}");
    let t = TestDb::with_pool(args.conns).await;
    eprintln!("sql_bench: database {}", t.name());
    let mut cfg = t.config().clone();
    if !args.sync.is_on() {
        cfg.pg.options("-c synchronous_commit=off");
    }
    let mut push_cfg = cfg.clone();
    push_cfg.pg.application_name("stile_bench_push");
    let db = Db::from_config(push_cfg, args.conns).await.unwrap();
    // Open every pooled connection now, so their backends can be watched.
    {
        let mut held = Vec::new();
        for _ in 0..args.conns {
            held.push(db.pool().get().await.unwrap());
        }
    }
    cfg.pg.application_name("stile_bench_plain");
    let mut plain_clients = Vec::new();
    for _ in 0..args.conns {
        plain_clients.push(Arc::new(connect(&cfg).await.unwrap()));
    }
    let version = server_version(&plain_clients[0]).await;

    // (window, size, mode) -> rates
    let mut rates: BTreeMap<(usize, usize, Mode), Vec<f64>> = BTreeMap::new();
    // (window, size, mode) -> backend CPU µs per message
    let mut cpus: BTreeMap<(usize, usize, Mode), Vec<f64>> = BTreeMap::new();
    // The server processes of each side, whose CPU time a run is charged.
    let push_pids = backend_pids(&plain_clients[0], "stile_bench_push").await;
    let plain_pids = backend_pids(&plain_clients[0], "stile_bench_plain").await;
    assert_eq!((push_pids.len(), plain_pids.len()), (args.conns, args.conns), "one backend per connection");
    let mut wrong = 0u64;
    let mut salt = 0u64;
    for &window in &args.windows {
        let prefill = Instant::now();
        let level = setup_level(&t, &db, window, args.conns).await;
        eprintln!("window {window}: prefilled {} partitions in {:.1} s", args.conns, prefill.elapsed().as_secs_f64());
        for &size in &args.sizes {
            for rep in 0..args.reps {
                // A different mode goes first in every repetition, so that
                // no mode always follows another's cleanup.
                let mut order = args.modes.clone();
                let first = rep % order.len();
                order.rotate_left(first);
                for mode in order {
                    salt += 1;
                    let pids = if mode == Mode::Plain { &plain_pids } else { &push_pids };
                    let cpu_before = cpu_seconds(pids);
                    let r = match mode {
                        Mode::Plain => run_plain(&plain_clients, &level, size, args.secs, salt).await,
                        Mode::Window0 => {
                            set_window(&db, &level.queue, 0).await;
                            let r = run_stile(&db, &level, mode, size, args.secs, salt).await;
                            set_window(&db, &level.queue, 3600).await;
                            r
                        }
                        _ => run_stile(&db, &level, mode, size, args.secs, salt).await,
                    };
                    let cpu = cpu_seconds(pids) - cpu_before;
                    if mode != Mode::Plain {
                        reset_level(&t, &level).await;
                    }
                    wrong += r.wrong_probe;
                    let rate = r.messages as f64 / r.elapsed.as_secs_f64();
                    let cpu_us = cpu * 1e6 / r.messages.max(1) as f64;
                    eprintln!(
                        "  window {window:>8} size {size:>4} rep {rep} {:<8} {:>9.0} msg/s {:>8.2} backend-us/msg",
                        mode.name(),
                        rate,
                        cpu_us
                    );
                    rates.entry((window, size, mode)).or_default().push(rate);
                    cpus.entry((window, size, mode)).or_default().push(cpu_us);
                }
            }
        }
    }

    // The medians of one window and segment size, in the order of the
    // tables' columns: forced, vouched, retry, window 0, plain.
    let medians = |table: &BTreeMap<(usize, usize, Mode), Vec<f64>>, w: usize, s: usize| -> [f64; 5] {
        [Mode::Forced, Mode::Vouched, Mode::Retry, Mode::Window0, Mode::Plain]
            .map(|m| table.get(&(w, s, m)).map_or(f64::NAN, |v| median(v.iter().copied())))
    };
    println!();
    println!(
        "Throughput, messages/s: median of {} runs of {:.1} s, {} connections on distinct partitions, one segment per call, \
         synchronous_commit={}, PostgreSQL {version}, {}, load average {load_at_start} at the start and {} at the end.",
        args.reps,
        args.secs,
        args.conns,
        args.sync.name(),
        machine(),
        load_average()
    );
    println!();
    println!(
        "| window (hashes) | segment | forced (p_verified=-1) | vouched (p_verified=last) | retry (each push twice) | window 0 | plain (unique index) | vouched / window 0 | vouched / plain |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &w in &args.windows {
        for &s in &args.sizes {
            let [f, v, r, z, p] = medians(&rates, w, s);
            println!(
                "| {w} | {s} | {} | {} | {} | {} | {} | {:.2} | {:.2} |",
                fmt_rate(f),
                fmt_rate(v),
                fmt_rate(r),
                fmt_rate(z),
                fmt_rate(p),
                v / z,
                v / p
            );
        }
    }
    println!();
    println!(
        "Server CPU per message, µs (user + system time of the connections' backends, median; lower is better; \
         the client and the WAL writer are not counted):"
    );
    println!();
    println!("| window (hashes) | segment | forced | vouched | retry | window 0 | plain | plain / vouched |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for &w in &args.windows {
        for &s in &args.sizes {
            let [f, v, r, z, p] = medians(&cpus, w, s);
            println!("| {w} | {s} | {f:.1} | {v:.2} | {r:.2} | {z:.2} | {p:.2} | {:.2} |", p / v);
        }
    }
    println!();
    if wrong > 0 {
        println!("WARNING: {wrong} pushes reported an unexpected probe mode");
    } else {
        println!(
            "every push reported the expected probe mode (forced: full, vouched: skipped, retry: skipped then narrowed, window 0: off)"
        );
    }
    println!("total run time {:.0} s", started.elapsed().as_secs_f64());
    drop(plain_clients);
    drop(db);
    drop(t);
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;

    #[test]
    fn the_flags_are_well_formed() {
        Args::command().debug_assert();
    }

    #[test]
    fn lists_are_comma_separated() {
        let args =
            Args::try_parse_from(["sql_bench", "--windows", "0,100_000", "--modes", "vouched,retry", "--sync", "on"]).unwrap();
        assert_eq!(args.windows, [0, 100_000]);
        assert_eq!(args.modes, [Mode::Vouched, Mode::Retry]);
        assert!(args.sync.is_on());
        let defaults = Args::try_parse_from(["sql_bench"]).unwrap();
        assert_eq!((defaults.sizes, defaults.windows), (vec![1, 10, 100], vec![0, 100_000, 1_000_000]));
        assert_eq!(defaults.modes, [Mode::Forced, Mode::Vouched, Mode::Retry, Mode::Window0, Mode::Plain]);
    }
}
