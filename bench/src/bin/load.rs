//! HTTP load generator for the `stile` gateway: many connections pushing
//! batches to many partitions, with retries, into a window that already
//! holds a million hashes; several gateway configurations side by side.
//!
//! ```text
//! cargo build --release -p stile -p stile-bench --bin stile --bin load
//! target/release/load [--conns 32] [--partitions 64] [--prefill 1000000] [--prefill-batch 10000] \
//!     [--sizes 1,10,100] [--warmup 1] [--secs 4] [--retry-percent 10] \
//!     [--configs warm,native,off,cold] [--rounds 7] [--sync off|on] \
//!     [--client-threads 1] [--fresh-gateways off|on] [--peer-clients 16,64] \
//!     [--pg-set NAME=VALUE ...]
//! ```
//!
//! The database is a fresh `stile_t_<random>` on the server named by
//! `STILE_TEST_DATABASE_URL` (default: libpq's defaults), dropped at the end;
//! the gateway binary (found as the tests find it, or `$STILE_BIN`) creates
//! its schema. Each configuration has its own queue, `load-<config>`, with
//! `--partitions` partitions holding `--prefill` messages between them, all
//! inside the window of an hour, and its own gateway process, all started
//! at once and primed (the warm ones hydrate) before anything is measured:
//!
//! * `warm`:   dedup on, wasm engine, default cache (512 MiB);
//! * `native`: dedup on, native engine;
//! * `off`:    the queue's window set to 0 (no probe; txns still written);
//! * `cold`:   dedup on, wasm engine, `--cache-mb 0`: no partition is
//!   admitted to the cache, so every segment is probed in full.
//!
//! The configurations take turns: for each batch size, `--rounds` rounds in
//! which every configuration is measured once, each round starting one
//! configuration further along the list. Only the measured gateway has
//! load; the others idle. The machine's speed drifts by tens of percent over
//! minutes, so the comparisons printed at the end are medians over the
//! rounds of each round's own ratio (two configurations measured seconds
//! apart), beside the ratio of the medians.
//!
//! For every batch size, `--conns` connections push for `--warmup` seconds
//! and then for `--secs` measured seconds. Each request goes to one random
//! partition. `--retry-percent` of the requests re-send an earlier request of
//! the same connection byte for byte (same partition, ids and payloads): with
//! dedup on, every item of a retry must answer `duplicate` and every item of
//! a fresh request `queued`; anything else is counted as a wrong answer.
//! Throughput counts every answered item (retries included); latency is per
//! request, from sending it to the end of its response body.
//!
//! In every round, after the gateways, PostgreSQL alone is measured on the
//! same database (`stile_bench::pgbench`): pgbench with `--peer-clients`
//! clients each, running the prepared `INSERT … ON CONFLICT DO NOTHING
//! RETURNING` a team would write instead, on a table prefilled as large as a
//! window, with the same batches and retries. The best client count of each
//! round is what every configuration is compared with.
//!
//! Ctrl-C or SIGTERM stops a run cleanly: its gateways are stopped, its
//! database is dropped, and it exits 130 (`bench/tests/interrupt.rs`).

use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{CommandFactory as _, Parser};
use hyper::Method;
use rand::rngs::SmallRng;
use rand::{Rng as _, SeedableRng as _};
use serde_json::json;
use stile_bench::pgbench::{PeerFigures, Pgbench};
use stile_bench::{
    Switch, count, load_average, machine, median, percentile_ms, pg_setting, run_to_end, seconds, server_version,
    write_push_body, write_replay_body,
};
use stile_tests::cpu::{context_switches, cpu_seconds, postgres_cpu_seconds};
use stile_tests::gateway::{Client, Gateway, GatewayOptions, fresh_database, metric};
use stile_tests::pg::{TestDb, backend_pids};

/// HTTP throughput and latency of the stile gateway, in several
/// configurations measured in turns against a window of a million hashes.
#[derive(Debug, Parser)]
#[command(
    name = "load",
    about = "HTTP throughput and latency of the stile gateway: warm cache (wasm and native), dedup off, cache off",
    after_help = "Environment: STILE_TEST_DATABASE_URL names the PostgreSQL server the run creates its database on \
                  (default: libpq's defaults and the PG* variables); STILE_BIN the stile binary to run (default: the \
                  one beside this program). Ctrl-C or SIGTERM stops a run, drops its database and exits 130."
)]
struct Args {
    /// Connections pushing at once, one task each.
    #[arg(long, default_value = "32", value_parser = count::<usize>)]
    conns: usize,
    /// Partitions of each configuration's queue; each request goes to one of them at random.
    #[arg(long, default_value = "64", value_parser = count::<usize>)]
    partitions: usize,
    /// Messages (hashes) in each queue's window before anything is measured, spread over its partitions.
    #[arg(long, default_value = "1000000", value_parser = count::<usize>)]
    prefill: usize,
    /// Items per prefill request (each partition's are stored in rows of at most this many, which a storm then reads).
    #[arg(long, default_value = "10000", value_parser = count::<usize>)]
    prefill_batch: usize,
    /// Items per request, comma-separated: every batch size is measured in turn.
    #[arg(long, value_delimiter = ',', default_value = "1,10,100", value_parser = count::<usize>)]
    sizes: Vec<usize>,
    /// Seconds each measurement pushes before its figures count.
    #[arg(long, default_value = "1", value_parser = seconds)]
    warmup: f64,
    /// Seconds each measurement counts.
    #[arg(long, default_value = "4", value_parser = seconds)]
    secs: f64,
    /// Percent of the requests that re-send an earlier request of the same connection, byte for byte.
    #[arg(long, default_value = "10", value_parser = count::<u32>)]
    retry_percent: u32,
    /// Gateway configurations, comma-separated: warm (wasm engine), native (native engine), off (window 0), cold (--cache-mb 0),
    /// storm (the warm gateway answering replays of ids stored before the run, at random: a redelivery storm).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "warm,native,off,cold")]
    configs: Vec<Config>,
    /// Turns per batch size (at least 1): in round r every configuration is measured once, starting at the list's
    /// r-th, so that none always runs first or last. The comparisons use the medians of each round's ratios.
    #[arg(long, default_value = "7", value_parser = count::<usize>)]
    rounds: usize,
    /// `synchronous_commit` of the benchmark database: on, PostgreSQL's default and the durability users run.
    #[arg(long, value_enum, default_value = "on")]
    sync: Switch,
    /// Worker threads of the generator's tokio runtime.
    #[arg(long, default_value = "1", value_parser = count::<usize>)]
    client_threads: usize,
    /// Whether every round starts (and primes) new gateway processes, so that whatever state one process settles
    /// into is not carried through every round of a run.
    #[arg(long, value_enum, default_value = "off")]
    fresh_gateways: Switch,
    /// PostgreSQL alone, measured in every round beside the gateways: pgbench running the prepared
    /// `INSERT … ON CONFLICT DO NOTHING RETURNING` a team would write instead, on a table of the same size, with
    /// the same batches and retries, at each of these client counts (the best of them counts); 0 for none.
    #[arg(long, value_delimiter = ',', default_value = "16,64", value_parser = count::<usize>)]
    peer_clients: Vec<usize>,
    /// A further setting of the benchmark database (`ALTER DATABASE ... SET NAME = 'VALUE'`); repeatable.
    #[arg(long = "pg-set", value_name = "NAME=VALUE", value_parser = pg_setting)]
    pg_settings: Vec<(String, String)>,
}

fn main() {
    let mut args = Args::parse();
    if args.conns == 0 || args.partitions == 0 || args.secs == 0.0 {
        Args::command()
            .error(clap::error::ErrorKind::ValueValidation, "nothing to run: --conns, --partitions and --secs must be above 0")
            .exit();
    }
    args.rounds = args.rounds.max(1);
    args.peer_clients.retain(|&clients| clients > 0);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.client_threads.max(1))
        .enable_all()
        .build()
        .expect("a tokio runtime");
    run_to_end("load", "its gateways are stopped and its database dropped", runtime, run(args));
}

/// Connections pushing the prefill.
const PREFILL_CONNECTIONS: usize = 8;
/// Requests a connection remembers for retries.
const HISTORY: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Config {
    Warm,
    Native,
    Off,
    Cold,
    /// A redelivery storm: the warm (wasm) gateway answering requests that
    /// replay ids stored long ago (the prefill, inside the window), chosen
    /// at random; every item must answer `duplicate`.
    Storm,
}

impl Config {
    fn name(self) -> &'static str {
        match self {
            Config::Warm => "warm (wasm)",
            Config::Native => "warm (native)",
            Config::Off => "dedup off (window 0)",
            Config::Cold => "cache off (--cache-mb 0)",
            Config::Storm => "redelivery storm (wasm)",
        }
    }

    /// The `application_name` of its gateway's connections, by which its
    /// backends are told from the rest of the server.
    fn application_name(self) -> String {
        format!("stile-{}", self.queue())
    }

    /// The configuration's own queue: gateways pushing to one queue would
    /// see each other's writes as gaps.
    fn queue(self) -> &'static str {
        match self {
            Config::Warm => "load-warm",
            Config::Native => "load-native",
            Config::Off => "load-off",
            Config::Cold => "load-cold",
            Config::Storm => "load-storm",
        }
    }

    fn dedup(self) -> bool {
        self != Config::Off
    }

    fn options(self) -> GatewayOptions {
        GatewayOptions {
            engine: Some(if self == Config::Native { "native" } else { "wasm" }),
            cache_mb: (self == Config::Cold).then_some(0),
            pool_size: Some(16),
            ..Default::default()
        }
    }
}

/// One gateway process per configuration, each primed: its pool opens its
/// connections and, dedup on, its cache hydrates every partition.
async fn start_gateways(
    t: &TestDb,
    pg: &tokio_postgres::Client,
    args: &Args,
    size: usize,
    prefilled: usize,
) -> Vec<(Config, Gateway)> {
    let mut gateways = Vec::with_capacity(args.configs.len());
    for &config in &args.configs {
        let mut named = t.config().clone();
        named.pg.application_name(config.application_name());
        gateways.push((config, Gateway::start_with(&named.to_url(true), &config.options()).await));
    }
    for (config, gw) in &gateways {
        let primed =
            measure(gw, pg, args, Slice { warmup: 1.0, secs: 2.0 }, Turn { config: *config, label: "prime", size, prefilled })
                .await;
        eprintln!("  primed {:<26} {} hydrations, {:.0} msg/s", config.name(), primed.hydrations, primed.rate);
    }
    gateways
}

/// Prepares the database: settings, the schema (the binary under test
/// creates it), and every configuration's queue prefilled through a gateway
/// in requests of 10,000 items (the default --max-items). Returns the
/// messages each partition holds.
async fn prepare(t: &TestDb, args: &Args) -> i64 {
    let c = t.client().await;
    let sync = args.sync.name();
    c.batch_execute(&format!("ALTER DATABASE \"{}\" SET synchronous_commit = {sync}", t.name()))
        .await
        .expect("set synchronous_commit");
    for (name, value) in &args.pg_settings {
        let value = value.replace('\'', "''");
        c.batch_execute(&format!("ALTER DATABASE \"{}\" SET {name} = '{value}'", t.name()))
            .await
            .unwrap_or_else(|e| panic!("set {name}: {e}"));
    }
    let gw = Gateway::start(&t.url()).await;
    let per_partition = args.prefill.div_ceil(args.partitions);
    let mut batches: Vec<(&'static str, usize, usize, usize)> = Vec::new();
    for config in &args.configs {
        for p in 0..args.partitions {
            for from in (0..per_partition).step_by(args.prefill_batch) {
                batches.push((config.queue(), p, from, (from + args.prefill_batch).min(per_partition)));
            }
        }
    }
    let mut tasks = Vec::new();
    for k in 0..PREFILL_CONNECTIONS {
        let mut client = gw.client().await;
        let mine: Vec<_> = batches.iter().copied().skip(k).step_by(PREFILL_CONNECTIONS).collect();
        tasks.push(tokio::spawn(async move {
            for (queue, p, from, to) in mine {
                let items = (from..to)
                    .map(|i| {
                        json!({"queue": queue, "partition": format!("p{p}"), "transactionId": format!("prefill-p{p}-{i}"),
                               "payload": {"order": i, "amount": 99.5, "currency": "EUR"}})
                    })
                    .collect();
                let answers = client.push(items).await;
                assert!(answers.iter().all(|a| a.queued()), "the prefill ids are new");
            }
        }));
    }
    for task in tasks {
        task.await.expect("a prefill connection");
    }
    drop(gw);
    for config in &args.configs {
        let rows = c
            .query("SELECT last_offset FROM stile.partitions WHERE queue = $1", &[&config.queue()])
            .await
            .expect("read the partitions");
        assert_eq!(rows.len(), args.partitions);
        assert!(
            rows.iter().all(|r| r.get::<_, i64>("last_offset") + 1 == per_partition as i64),
            "every partition holds the prefill"
        );
    }
    if args.configs.contains(&Config::Off) {
        let mut options = serde_json::Map::new();
        options.insert("dedupWindowSeconds".into(), json!(0));
        t.db.configure(Config::Off.queue(), &options, stile::configure::ConfigureMode::Merge)
            .await
            .expect("configure the window");
    }
    // Every table of the schema, whichever layout the gateway under test made.
    let tables = c
        .query("SELECT format('%I.%I', schemaname, tablename) AS name FROM pg_tables WHERE schemaname = 'stile'", &[])
        .await
        .expect("list the tables");
    for table in tables {
        c.batch_execute(&format!("VACUUM ANALYZE {}", table.get::<_, String>("name"))).await.expect("vacuum");
    }
    per_partition as i64
}

/// What one connection saw in the measured interval.
#[derive(Debug, Default)]
struct Tally {
    requests: u64,
    items: u64,
    retries: u64,
    queued: u64,
    duplicates: u64,
    wrong: u64,
    errors: u64,
    latencies_us: Vec<u32>,
    /// The latencies of the retries alone.
    retry_latencies_us: Vec<u32>,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.requests += other.requests;
        self.items += other.items;
        self.retries += other.retries;
        self.queued += other.queued;
        self.duplicates += other.duplicates;
        self.wrong += other.wrong;
        self.errors += other.errors;
        self.latencies_us.extend(other.latencies_us);
        self.retry_latencies_us.extend(other.retry_latencies_us);
    }
}

/// What one connection pushes, and when its answers count.
#[derive(Debug)]
struct Connection {
    queue: &'static str,
    /// Names the connection: it seeds its random choices and prefixes its
    /// transactionIds, so that no two connections or runs share an id.
    tag: String,
    partitions: usize,
    size: usize,
    retry_percent: u32,
    /// Whether the queue deduplicates: a retry must then answer
    /// `duplicate` for every item, and otherwise `queued`.
    dedup: bool,
    /// Set for a redelivery storm: every request replays ids of the
    /// prefill, of which each partition holds this many.
    replays_of: Option<usize>,
    measure_from: Instant,
    end: Instant,
}

/// One connection's loop: fresh batches and retries until `end`; only
/// requests sent at or after `measure_from` and answered by `end` count.
async fn connection(mut client: Client, plan: Connection) -> Tally {
    let Connection { queue, tag, partitions, size, retry_percent, dedup, replays_of, measure_from, end } = plan;
    let mut rng = SmallRng::seed_from_u64(tag.bytes().fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b))));
    let mut history: Vec<Bytes> = Vec::with_capacity(HISTORY);
    let mut tally = Tally::default();
    let mut seq = 0u64;
    let mut body = String::new();
    loop {
        let sent = Instant::now();
        if sent >= end {
            return tally;
        }
        let retry = replays_of.is_some() || (!history.is_empty() && rng.random_range(0..100) < retry_percent);
        let request = if let Some(prefilled) = replays_of {
            let partition = rng.random_range(0..partitions);
            let ids: Vec<usize> = (0..size).map(|_| rng.random_range(0..prefilled)).collect();
            write_replay_body(&mut body, queue, partition, &ids);
            Bytes::from(body.clone())
        } else if retry {
            history[rng.random_range(0..history.len())].clone()
        } else {
            let partition = rng.random_range(0..partitions);
            write_push_body(&mut body, queue, partition, &tag, seq, size);
            seq += 1;
            Bytes::from(body.clone())
        };
        let reply = client.send(Method::POST, "/api/v1/push", request.clone(), &[("content-type", "application/json")]).await;
        let done = Instant::now();
        if !retry {
            if history.len() < HISTORY {
                history.push(request);
            } else {
                let slot = rng.random_range(0..HISTORY);
                history[slot] = request;
            }
        }
        // Every answer is checked, the warm-up's too; only the measured
        // slice counts towards the rate and the latencies.
        let measured = sent >= measure_from && done <= end;
        match reply {
            Ok(reply) if reply.status == 201 => {
                let text = std::str::from_utf8(&reply.body).unwrap_or("");
                let queued = text.matches(r#""status":"queued""#).count() as u64;
                let duplicates = text.matches(r#""status":"duplicate""#).count() as u64;
                let expected_duplicates = if retry && dedup { size as u64 } else { 0 };
                tally.wrong += u64::from(queued + duplicates != size as u64 || duplicates != expected_duplicates);
                if !measured {
                    continue;
                }
                tally.requests += 1;
                tally.retries += u64::from(retry);
                tally.items += queued + duplicates;
                tally.queued += queued;
                tally.duplicates += duplicates;
                let micros = u32::try_from(done.duration_since(sent).as_micros()).unwrap_or(u32::MAX);
                tally.latencies_us.push(micros);
                if retry {
                    tally.retry_latencies_us.push(micros);
                }
            }
            Ok(reply) => {
                tally.errors += 1;
                if tally.errors <= 3 {
                    eprintln!("  {tag}: HTTP {}: {}", reply.status, reply.text());
                }
            }
            Err(error) => {
                tally.errors += 1;
                if tally.errors <= 3 {
                    eprintln!("  {tag}: {error:#}");
                }
            }
        }
    }
}

/// One configuration's figures at one batch size in one round.
struct Measured {
    config: Config,
    size: usize,
    round: usize,
    figures: Figures,
}

/// One measured run's figures.
#[derive(Debug, Default, Clone)]
struct Figures {
    rate: f64,
    p50_ms: f64,
    p99_ms: f64,
    retry_p50_ms: f64,
    retry_p99_ms: f64,
    requests: u64,
    retries: u64,
    duplicates: u64,
    wrong: u64,
    errors: u64,
    /// Segments by probe mode, during the measured interval.
    probes: [f64; 4],
    /// Cache hydrations during the measured interval.
    hydrations: f64,
    /// Mean time of one bundle's push function call.
    sql_ms_per_bundle: f64,
    /// Segments per bundle: how many partitions one transaction served.
    segments_per_bundle: f64,
    /// CPU milliseconds per 1,000 messages answered, of the gateway, of
    /// PostgreSQL (every server process), of this generator, and of the
    /// part of PostgreSQL's that the gateway's own backends used (the rest
    /// is the WAL writer, the checkpointer, autovacuum and the idle
    /// gateways' connections: work this configuration may not have caused).
    cpu_ms_per_k: [f64; 4],
    /// Context switches on the whole machine per message answered.
    switches_per_message: f64,
    /// Per message answered: WAL bytes (the server's insert position, every
    /// process), WAL records (`pg_stat_wal`) and index entries written to
    /// stile's tables (`pg_stat_user_tables`: each insert and each update
    /// that is not HOT adds one per index). The two statistics views lag by
    /// up to a second (backends report them when idle, at most once a
    /// second): under steady load that shifts the interval they cover, not
    /// its length.
    wal_bytes_per_message: f64,
    wal_records_per_message: f64,
    index_entries_per_message: f64,
}

/// The server's WAL position in bytes, its WAL records and the index entries
/// written to stile's tables, so far.
struct PgCounters {
    wal_bytes: f64,
    wal_records: f64,
    index_entries: f64,
}

impl PgCounters {
    /// What each of `items` messages added to the counters since `before`.
    fn per_message_since(&self, before: &Self, items: u64) -> Self {
        let items = items.max(1) as f64;
        Self {
            wal_bytes: (self.wal_bytes - before.wal_bytes) / items,
            wal_records: (self.wal_records - before.wal_records) / items,
            index_entries: (self.index_entries - before.index_entries) / items,
        }
    }
}

/// Reads the server's counters now.
async fn pg_counters(pg: &tokio_postgres::Client) -> PgCounters {
    let row = pg
        .query_one(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::float8 AS wal_bytes, \
                    (SELECT wal_records::float8 FROM pg_stat_wal) AS wal_records, \
                    (SELECT coalesce(sum((t.n_tup_ins + t.n_tup_upd - t.n_tup_hot_upd) \
                                         * (SELECT count(*) FROM pg_index i WHERE i.indrelid = t.relid)), 0)::float8 \
                       FROM pg_stat_user_tables t WHERE t.schemaname = 'stile') AS index_entries",
            &[],
        )
        .await
        .expect("read the WAL and index counters");
    PgCounters { wal_bytes: row.get("wal_bytes"), wal_records: row.get("wal_records"), index_entries: row.get("index_entries") }
}

/// CPU seconds used so far by the gateway, PostgreSQL (every server process,
/// those that have exited included: the backends of a gateway that has just
/// stopped end during a measurement), this process and the gateway's
/// backends.
fn cpu_now(gateway: i32, backends: &[i32]) -> [f64; 4] {
    [cpu_seconds(&[gateway]), postgres_cpu_seconds(), cpu_seconds(&[std::process::id() as i32]), cpu_seconds(backends)]
}

/// Series read from /metrics before and after a measured run: the segments
/// by probe mode, then hydrations and the SQL time of bundles.
const SERIES: [&str; 8] = [
    "stile_segments_total{probe=\"skipped\"}",
    "stile_segments_total{probe=\"narrowed\"}",
    "stile_segments_total{probe=\"full\"}",
    "stile_segments_total{probe=\"off\"}",
    "stile_hydrations_total{outcome=\"installed\"}",
    "stile_hydrations_total{outcome=\"refused\"}",
    "stile_sql_push_seconds_sum",
    "stile_sql_push_seconds_count",
];

async fn series(client: &mut Client) -> [f64; 8] {
    let text = client.metrics().await;
    SERIES.map(|series| metric(&text, series))
}

/// How long one measurement runs: unmeasured warm-up, then measured seconds.
#[derive(Clone, Copy, Debug)]
struct Slice {
    warmup: f64,
    secs: f64,
}

/// What one measurement pushes: a configuration's queue, at a batch size,
/// under a label that keeps its ids apart from every other measurement's.
#[derive(Clone, Copy, Debug)]
struct Turn<'a> {
    config: Config,
    label: &'a str,
    size: usize,
    /// Messages each partition held after the prefill (a storm replays them).
    prefilled: usize,
}

async fn measure(gw: &Gateway, pg: &tokio_postgres::Client, args: &Args, slice: Slice, turn: Turn<'_>) -> Figures {
    let Turn { config, label, size, prefilled } = turn;
    let mut clients = Vec::with_capacity(args.conns);
    for _ in 0..args.conns {
        clients.push(gw.client().await);
    }
    let mut observer = gw.client().await;
    let start = Instant::now();
    let measure_from = start + Duration::from_secs_f64(slice.warmup);
    let end = measure_from + Duration::from_secs_f64(slice.secs);
    let mut tasks = Vec::with_capacity(args.conns);
    for (c, client) in clients.into_iter().enumerate() {
        let tag = format!("{label}-s{size}-c{c}");
        let plan = Connection {
            queue: config.queue(),
            tag,
            partitions: args.partitions,
            size,
            retry_percent: args.retry_percent,
            dedup: config.dedup(),
            replays_of: (config == Config::Storm).then_some(prefilled),
            measure_from,
            end,
        };
        tasks.push(tokio::spawn(connection(client, plan)));
    }
    tokio::time::sleep_until(measure_from.into()).await;
    // After the warm-up: the gateway's pool has opened its connections.
    let backends = backend_pids(pg, &config.application_name()).await;
    let before = series(&mut observer).await;
    let counters_before = pg_counters(pg).await;
    let cpu_before = cpu_now(gw.pid(), &backends);
    let switches_before = context_switches();
    let mut tally = Tally::default();
    for task in tasks {
        tally.merge(task.await.expect("a connection task"));
    }
    let cpu_after = cpu_now(gw.pid(), &backends);
    let switches = context_switches() - switches_before;
    let counters_after = pg_counters(pg).await;
    let counters = counters_after.per_message_since(&counters_before, tally.items);
    let after = series(&mut observer).await;
    let delta: [f64; 8] = std::array::from_fn(|i| after[i] - before[i]);
    tally.latencies_us.sort_unstable();
    tally.retry_latencies_us.sort_unstable();
    Figures {
        rate: tally.items as f64 / slice.secs,
        p50_ms: percentile_ms(&tally.latencies_us, 50.0),
        p99_ms: percentile_ms(&tally.latencies_us, 99.0),
        retry_p50_ms: percentile_ms(&tally.retry_latencies_us, 50.0),
        retry_p99_ms: percentile_ms(&tally.retry_latencies_us, 99.0),
        requests: tally.requests,
        retries: tally.retries,
        duplicates: tally.duplicates,
        wrong: tally.wrong,
        errors: tally.errors,
        probes: [delta[0], delta[1], delta[2], delta[3]],
        hydrations: delta[4] + delta[5],
        sql_ms_per_bundle: 1000.0 * delta[6] / delta[7].max(1.0),
        segments_per_bundle: delta[..4].iter().sum::<f64>() / delta[7].max(1.0),
        cpu_ms_per_k: std::array::from_fn(|i| 1e6 * (cpu_after[i] - cpu_before[i]) / tally.items.max(1) as f64),
        switches_per_message: switches as f64 / tally.items.max(1) as f64,
        wal_bytes_per_message: counters.wal_bytes,
        wal_records_per_message: counters.wal_records,
        index_entries_per_message: counters.index_entries,
    }
}

async fn run(args: Args) {
    let started = Instant::now();
    eprintln!("load: {args:?}");
    let load_at_start = load_average();
    let t = fresh_database().await;
    eprintln!("load: database {}", t.name());
    let prepare_started = Instant::now();
    let per_partition = prepare(&t, &args).await;
    eprintln!(
        "prepared {} queue(s) of {} partitions x {per_partition} messages ({} hashes in each window) in {:.1} s",
        args.configs.len(),
        args.partitions,
        per_partition * args.partitions as i64,
        prepare_started.elapsed().as_secs_f64()
    );
    let c = t.client().await;
    let version = server_version(&c).await;

    let peer = if args.peer_clients.is_empty() {
        None
    } else {
        Some(Pgbench::prepare(&c, &t.config().pg, args.partitions, per_partition as usize).await)
    };
    let mut peer_results: Vec<(usize, usize, PeerFigures)> = Vec::new();
    let mut gateways = start_gateways(&t, &c, &args, args.sizes[0], per_partition as usize).await;
    let slice = Slice { warmup: args.warmup, secs: args.secs };
    let mut results: Vec<Measured> = Vec::new();
    for (s, &size) in args.sizes.iter().enumerate() {
        for round in 0..args.rounds {
            if args.fresh_gateways.is_on() && (s, round) != (0, 0) {
                drop(gateways);
                gateways = start_gateways(&t, &c, &args, size, per_partition as usize).await;
            }
            for k in 0..gateways.len() {
                let (config, gw) = &gateways[(round + k) % gateways.len()];
                let figures = measure(
                    gw,
                    &c,
                    &args,
                    slice,
                    Turn { config: *config, label: &format!("r{round}"), size, prefilled: per_partition as usize },
                )
                .await;
                eprintln!(
                    "  {:<26} batch {size:>3} round {round}: {:>8.0} msg/s  p50 {:>7.2} ms  p99 {:>7.2} ms  (retries: p50 {:.2} ms, p99 {:.2} ms; {} requests, {} retries, {} duplicates, {} wrong, {} errors; segments skipped/narrowed/full/off {:?}; {} hydrations; {:.2} ms SQL per bundle, {:.2} segments per bundle; CPU ms per 1,000 messages: gateway {:.1}, PostgreSQL {:.1} (its backends {:.1}), generator {:.1}; {:.2} context switches per message; per message: {:.0} WAL bytes, {:.2} WAL records, {:.2} index entries)",
                    config.name(),
                    figures.rate,
                    figures.p50_ms,
                    figures.p99_ms,
                    figures.retry_p50_ms,
                    figures.retry_p99_ms,
                    figures.requests,
                    figures.retries,
                    figures.duplicates,
                    figures.wrong,
                    figures.errors,
                    figures.probes,
                    figures.hydrations,
                    figures.sql_ms_per_bundle,
                    figures.segments_per_bundle,
                    figures.cpu_ms_per_k[0],
                    figures.cpu_ms_per_k[1],
                    figures.cpu_ms_per_k[3],
                    figures.cpu_ms_per_k[2],
                    figures.switches_per_message,
                    figures.wal_bytes_per_message,
                    figures.wal_records_per_message,
                    figures.index_entries_per_message
                );
                results.push(Measured { config: *config, size, round, figures });
            }
            if let Some(peer) = &peer {
                let room = stile_bench::pgbench::room(&c).await;
                for &wanted in &args.peer_clients {
                    let clients = wanted.min(room).max(1);
                    if clients < wanted {
                        eprintln!("  PostgreSQL alone: {clients} clients instead of {wanted} (max_connections leaves no more)");
                    }
                    let figures = peer.run(clients, size, args.retry_percent, args.secs);
                    eprintln!(
                        "  {:<26} batch {size:>3} round {round}: {:>8.0} msg/s  mean latency {:.2} ms  ({clients} clients; CPU ms per 1,000 messages: PostgreSQL {:.1})",
                        "PostgreSQL alone (pgbench)", figures.rate, figures.latency_ms, figures.postgres_cpu_ms_per_k
                    );
                    peer_results.push((size, round, figures));
                }
            }
        }
    }
    drop(gateways);

    println!();
    println!(
        "stile over HTTP: {} connections, {} partitions, {} % retries, window prefilled with {} hashes \
         in requests of {}, {} s warm-up + {} s measured per row, synchronous_commit={}, PostgreSQL {version}, {}, \
         load average {load_at_start} at the start and {} at the end{}",
        args.conns,
        args.partitions,
        args.retry_percent,
        per_partition * args.partitions as i64,
        args.prefill_batch,
        args.warmup,
        args.secs,
        args.sync.name(),
        machine(),
        load_average(),
        args.pg_settings.iter().map(|(name, value)| format!(", {name}={value}")).collect::<String>(),
    );
    println!();
    println!(
        "| configuration | batch | round | messages/s | p50 ms | p99 ms | requests | wrong answers | errors \
         | segments skipped / narrowed / full / off | hydrations | SQL ms per bundle | segments per bundle \
         | CPU ms per 1,000 messages: gateway / PostgreSQL (its backends) / generator \
         | per message: WAL bytes / WAL records / index entries |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|---|");
    for Measured { config, size, round, figures: f } in &results {
        let [s, n, full, off] = f.probes;
        println!(
            "| {} | {size} | {round} | {:.0} | {:.2} | {:.2} | {} | {} | {} | {s:.0} / {n:.0} / {full:.0} / {off:.0} | {:.0} | {:.2} | {:.2} | {:.1} / {:.1} ({:.1}) / {:.1} | {:.0} / {:.2} / {:.2} |",
            config.name(),
            f.rate,
            f.p50_ms,
            f.p99_ms,
            f.requests,
            f.wrong,
            f.errors,
            f.hydrations,
            f.sql_ms_per_bundle,
            f.segments_per_bundle,
            f.cpu_ms_per_k[0],
            f.cpu_ms_per_k[1],
            f.cpu_ms_per_k[3],
            f.cpu_ms_per_k[2],
            f.wal_bytes_per_message,
            f.wal_records_per_message,
            f.index_entries_per_message
        );
    }
    let rate = |config: Config, size: usize, round: usize| {
        results.iter().find(|m| m.config == config && m.size == size && m.round == round).map_or(f64::NAN, |m| m.figures.rate)
    };
    let median_rate = |config: Config, size: usize| median((0..args.rounds).map(|r| rate(config, size, r)));
    // Each round's own ratio: the two configurations measured seconds apart.
    let paired = |a: Config, b: Config, size: usize| median((0..args.rounds).map(|r| rate(a, size, r) / rate(b, size, r)));
    println!();
    println!("Median messages/s over {} round(s):", args.rounds);
    println!();
    println!("| configuration | {} |", args.sizes.iter().map(|size| format!("batch {size}")).collect::<Vec<_>>().join(" | "));
    println!("|---|{}", "---:|".repeat(args.sizes.len()));
    for &config in &args.configs {
        let rates: Vec<String> = args.sizes.iter().map(|&size| format!("{:.0}", median_rate(config, size))).collect();
        println!("| {} | {} |", config.name(), rates.join(" | "));
    }
    println!();
    println!("Ratios: the median of the rounds' own ratios (in brackets: the ratio of the medians above).");
    println!();
    println!("| batch | warm / off (target >= 0.9) | warm / cache off (target >= 2) | wasm / native (target 0.9 - 1.1) |");
    println!("|---:|---:|---:|---:|");
    for &size in &args.sizes {
        let cell = |other: Config| {
            format!(
                "{:.2} ({:.2})",
                paired(Config::Warm, other, size),
                median_rate(Config::Warm, size) / median_rate(other, size)
            )
        };
        println!("| {size} | {} | {} | {} |", cell(Config::Off), cell(Config::Cold), cell(Config::Native));
    }
    if args.configs.contains(&Config::Storm) {
        println!();
        println!("A redelivery storm against new messages (target >= 0.9), the same gateway configuration:");
        println!();
        println!("| batch | storm / warm |");
        println!("|---:|---:|");
        for &size in &args.sizes {
            println!(
                "| {size} | {:.2} ({:.2}) |",
                paired(Config::Storm, Config::Warm, size),
                median_rate(Config::Storm, size) / median_rate(Config::Warm, size)
            );
        }
    }
    if peer.is_some() {
        print_peer(&args, &results, &peer_results);
    }
    let wrong: u64 = results.iter().map(|m| m.figures.wrong).sum();
    let errors: u64 = results.iter().map(|m| m.figures.errors).sum();
    println!();
    println!(
        "{wrong} wrong answers, {errors} errors (dedup on: fresh items queued, retried items duplicate; off: all queued); \
         total run time {:.0} s",
        started.elapsed().as_secs_f64()
    );
    drop(c);
    drop(t);
}

/// The gateways against PostgreSQL alone: per batch size, pgbench's best
/// client count in each round, and each configuration's ratio to it (the
/// median of the rounds' own ratios).
fn print_peer(args: &Args, results: &[Measured], peer: &[(usize, usize, PeerFigures)]) {
    let best = |size: usize, round: usize| {
        peer.iter().filter(|(s, r, _)| *s == size && *r == round).map(|(_, _, f)| *f).max_by(|a, b| a.rate.total_cmp(&b.rate))
    };
    println!();
    println!(
        "Against PostgreSQL alone (pgbench, prepared INSERT … ON CONFLICT DO NOTHING RETURNING, no HTTP, the best of {:?} \
         clients in each round; the median of the rounds' own ratios):",
        args.peer_clients
    );
    println!();
    println!(
        "| batch | PostgreSQL alone msg/s | its CPU ms per 1,000 | {} |",
        args.configs.iter().map(|c| format!("{} / alone", c.name())).collect::<Vec<_>>().join(" | ")
    );
    println!("|---:|---:|---:|{}", "---:|".repeat(args.configs.len()));
    for &size in &args.sizes {
        let alone = median((0..args.rounds).map(|r| best(size, r).map_or(f64::NAN, |f| f.rate)));
        let cpu = median((0..args.rounds).map(|r| best(size, r).map_or(f64::NAN, |f| f.postgres_cpu_ms_per_k)));
        let ratios: Vec<String> = args
            .configs
            .iter()
            .map(|&config| {
                let ratio = median((0..args.rounds).map(|r| {
                    let rate = results
                        .iter()
                        .find(|m| m.config == config && m.size == size && m.round == r)
                        .map_or(f64::NAN, |m| m.figures.rate);
                    rate / best(size, r).map_or(f64::NAN, |f| f.rate)
                }));
                format!("{ratio:.2}")
            })
            .collect();
        println!("| {size} | {alone:.0} | {cpu:.1} | {} |", ratios.join(" | "));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flags_are_well_formed() {
        Args::command().debug_assert();
    }

    #[test]
    fn lists_are_comma_separated_and_settings_repeat() {
        let args = Args::try_parse_from([
            "load",
            "--sizes",
            "1,1_0,1e2",
            "--configs",
            "off,warm",
            "--pg-set",
            "work_mem=8MB",
            "--pg-set",
            "jit=off",
        ])
        .unwrap();
        assert_eq!(args.sizes, [1, 10, 100]);
        assert_eq!(args.configs, [Config::Off, Config::Warm]);
        assert_eq!(args.pg_settings, [("work_mem".to_owned(), "8MB".to_owned()), ("jit".to_owned(), "off".to_owned())]);
        let defaults = Args::try_parse_from(["load"]).unwrap();
        assert_eq!(defaults.sizes, [1, 10, 100]);
        assert_eq!(defaults.configs, [Config::Warm, Config::Native, Config::Off, Config::Cold]);
        assert_eq!((defaults.conns, defaults.partitions, defaults.prefill, defaults.rounds), (32, 64, 1_000_000, 7));
    }
}
