//! stile beside what a team would run instead, on this machine, in the same
//! run, with one workload and one load generator: PostgreSQL alone
//! (`INSERT … ON CONFLICT DO NOTHING` behind HTTP, and pgbench on the same
//! statement as that design's upper bound), Redis in front of PostgreSQL,
//! and NATS JetStream with a two-minute and an hour's duplicate window.
//!
//! ```text
//! cargo build --release -p stile -p stile-bench
//! target/release/peers [--systems stile-wasm,stile-native,stile-cold,postgres,redis-postgres,nats2m,nats1h] \
//!     [--sizes 1,100] [--rounds 3] [--secs 4] [--fills 100000,1000000] [--sync on,off] [--charts bench/peers]
//! ```
//!
//! For each `--sync` setting, a fresh database (`synchronous_commit` set on
//! it) and fresh processes for every system: stile gateways, the peer
//! endpoints (`peer_endpoint`), a `redis-server` and `nats-server -js` of the
//! run's own on free ports. Every system's window is filled to each
//! `--fills` level in turn (messages spread over `--partitions`); at each
//! level the run records each system's resident memory and one short
//! measurement at the largest batch size (the charts of memory and of
//! throughput by window). Then, for each batch size, `--rounds` rounds in
//! which every system is measured once, each round starting one system
//! further along. The tables give medians over the rounds.
//!
//! Every answered request's messages count as acknowledged. At the end each
//! system's stored messages are read back: duplicates stored, and
//! acknowledged messages missing, are counted.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{CommandFactory as _, Parser};
use stile_bench::peers::chart::{self, Series};
use stile_bench::peers::systems::{CacheAccounting, HeldInPostgres, Running, StartConfig, System, rss_bytes};
use stile_bench::peers::workload::{self, Plan, Slice, Tally, Transport};
use stile_bench::pgbench::{PeerFigures, Pgbench};
use stile_bench::{Switch, build, count, load_average, machine, median, run_to_end, seconds, server_version, today};
use stile_tests::cpu::{cpu_seconds, postgres_cpu_seconds};
use stile_tests::gateway::fresh_database;

#[derive(Debug, Parser)]
#[command(
    name = "peers",
    about = "stile beside PostgreSQL alone, Redis + PostgreSQL and NATS JetStream: throughput, latency, memory, CPU, exactness",
    after_help = "Environment: STILE_TEST_DATABASE_URL names the PostgreSQL server (default: libpq's defaults); STILE_BIN \
                  the stile binary; STILE_REDIS_SERVER and STILE_NATS_SERVER the servers' programs (default: from PATH); \
                  STILE_CHART_FONT a TrueType font for the charts. Ctrl-C or SIGTERM stops a run, stops its processes, \
                  drops its database and exits 130."
)]
struct Args {
    /// The systems, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "stile-wasm,stile-native,stile-cold,postgres,redis-postgres,nats2m,nats1h"
    )]
    systems: Vec<System>,
    /// Messages per request, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,100", value_parser = count::<u32>)]
    sizes: Vec<u32>,
    /// Rounds per batch size; in each, every system is measured once.
    #[arg(long, default_value = "3", value_parser = count::<usize>)]
    rounds: usize,
    /// Connections pushing at once, each with a connection of its own.
    #[arg(long, default_value = "32", value_parser = count::<usize>)]
    conns: usize,
    /// Partitions (subjects, for JetStream).
    #[arg(long, default_value = "64", value_parser = count::<usize>)]
    partitions: usize,
    /// Percent of the requests that redeliver an earlier request of the same connection.
    #[arg(long, default_value = "10", value_parser = count::<u32>)]
    redelivery_percent: u32,
    /// Seconds each measurement runs before its figures count.
    #[arg(long, default_value = "1", value_parser = seconds)]
    warmup: f64,
    /// Seconds each measurement counts.
    #[arg(long, default_value = "4", value_parser = seconds)]
    secs: f64,
    /// The messages in each system's window, filled in turn before anything is measured; the last is the window
    /// the rounds run against.
    #[arg(long, value_delimiter = ',', default_value = "100000,300000,1000000", value_parser = count::<usize>)]
    fills: Vec<usize>,
    /// Seconds of each measurement at a fill level (the throughput-by-window chart).
    #[arg(long, default_value = "3", value_parser = seconds)]
    fill_secs: f64,
    /// `synchronous_commit` of the benchmark database, one pass each, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "on,off")]
    sync: Vec<Switch>,
    /// pgbench clients for PostgreSQL alone without HTTP (the best counts); 0 for none.
    #[arg(long, value_delimiter = ',', default_value = "16,64", value_parser = count::<usize>)]
    pgbench_clients: Vec<usize>,
    /// PostgreSQL connections of each gateway and endpoint.
    #[arg(long, default_value = "16", value_parser = count::<usize>)]
    pool_size: usize,
    /// The directory the charts are written to (PNG); none if empty.
    #[arg(long, default_value = "bench/peers")]
    charts: PathBuf,
}

/// Requests of a fill, and its connections per system.
const FILL_BATCH: u32 = 1_000;
const FILL_CONNECTIONS: usize = 8;
/// The window of every system but the two-minute JetStream.
const WINDOW: Duration = Duration::from_secs(3600);

fn main() {
    let mut args = Args::parse();
    if args.conns == 0 || args.partitions == 0 || args.secs == 0.0 || args.fills.is_empty() || args.sizes.is_empty() {
        Args::command()
            .error(clap::error::ErrorKind::ValueValidation, "nothing to run: --conns, --partitions, --secs, --fills, --sizes")
            .exit();
    }
    args.rounds = args.rounds.max(1);
    args.fills.sort_unstable();
    args.pgbench_clients.retain(|&c| c > 0);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a tokio runtime");
    run_to_end("peers", "its processes are stopped and its database dropped", runtime, run(args));
}

/// One system's figures in one measurement.
#[derive(Clone, Debug, Default)]
struct Figures {
    rate: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// CPU milliseconds per 1,000 messages: the system's own processes,
    /// PostgreSQL's, this generator's.
    cpu_ms_per_k: [f64; 3],
    wrong: u64,
    errors: u64,
}

/// What one pass (one `synchronous_commit`) measured.
#[derive(Debug, Default)]
struct Pass {
    sync: &'static str,
    /// (system, batch, round) → figures.
    rounds: HashMap<(System, u32, usize), Figures>,
    /// (batch, round) → pgbench's best.
    pgbench: HashMap<(u32, usize), PeerFigures>,
    /// (system, fill) → figures at the largest batch.
    by_window: HashMap<(System, usize), Figures>,
    memory: HashMap<(System, usize), Memory>,
    exactness: HashMap<System, Exactness>,
}

#[derive(Clone, Debug, Default)]
struct Memory {
    /// Resident bytes of the system's processes, by role.
    rss: Vec<(&'static str, u64)>,
    /// What PostgreSQL keeps for the check (relations on disk).
    in_postgres: Option<HeldInPostgres>,
    /// A stile gateway's cache, by its own accounting.
    cache: Option<CacheAccounting>,
}

#[derive(Clone, Debug, Default)]
struct Exactness {
    acknowledged: usize,
    stored: u64,
    duplicates_stored: u64,
    missing: usize,
}

async fn run(args: Args) {
    let started = Instant::now();
    eprintln!("peers: {args:?}");
    let load_at_start = load_average();
    let mut passes = Vec::new();
    let mut version = String::new();
    for &sync in &args.sync {
        let (pass, v) = pass(&args, sync).await;
        version = v;
        passes.push(pass);
    }
    println!();
    println!("peers: measured on {} by {}, on {}", today(), build(), machine());
    println!(
        "peers: {} connections, {} partitions, {} % redeliveries, messages of {} bytes, window filled to {} messages, \
         {} s warm-up + {} s measured per row, {} round(s), PostgreSQL {version}, {}, load average {load_at_start} at the \
         start and {} at the end; total {:.0} s",
        args.conns,
        args.partitions,
        args.redelivery_percent,
        workload::PAYLOAD.len(),
        args.fills.last().copied().unwrap_or(0),
        args.warmup,
        args.secs,
        args.rounds,
        machine(),
        load_average(),
        started.elapsed().as_secs_f64()
    );
    for pass in &passes {
        print_pass(&args, pass);
        if !args.charts.as_os_str().is_empty() {
            draw_charts(&args, pass);
        }
    }
}

/// One pass: a database, every system, the fills, the rounds, the read-back.
async fn pass(args: &Args, sync: Switch) -> (Pass, String) {
    let t = fresh_database().await;
    let pg = t.client().await;
    pg.batch_execute(&format!("ALTER DATABASE \"{}\" SET synchronous_commit = {}", t.name(), sync.name()))
        .await
        .expect("set synchronous_commit");
    let version = server_version(&pg).await;
    let config = StartConfig { partitions: args.partitions, pool_size: args.pool_size, window: WINDOW };
    let mut systems = Vec::new();
    for &system in &args.systems {
        systems.push(Running::start(system, &t, &config).await);
    }
    let mut pass = Pass { sync: sync.name(), ..Default::default() };
    let mut acked: HashMap<System, Tally> = HashMap::new();

    let mut filled = 0;
    for (level, &fill) in args.fills.iter().enumerate() {
        let per_partition = (fill - filled).div_ceil(args.partitions);
        for running in &systems {
            let begun = Instant::now();
            let mut transports = Vec::with_capacity(FILL_CONNECTIONS);
            for _ in 0..FILL_CONNECTIONS {
                transports.push(running.transport().await);
            }
            let tally = workload::fill(transports, &format!("fill{level}"), args.partitions, per_partition, FILL_BATCH).await;
            eprintln!(
                "  {:<36} filled to {fill} ({} messages in {:.1} s)",
                running.system.name(),
                tally.messages,
                begun.elapsed().as_secs_f64()
            );
            acked.entry(running.system).or_default().merge(tally);
        }
        filled += per_partition * args.partitions;
        pg.batch_execute("VACUUM ANALYZE").await.expect("vacuum");
        for running in &systems {
            let rss: Vec<(&'static str, u64)> = running.processes().iter().map(|&(role, pid)| (role, rss_bytes(pid))).collect();
            let memory =
                Memory { rss, in_postgres: running.held_in_postgres(&pg).await, cache: running.cache_accounting().await };
            pass.memory.insert((running.system, filled), memory);
        }
        let size = *args.sizes.iter().max().expect("a batch size");
        let slice = Slice { warmup: Duration::from_secs_f64(args.warmup), measured: Duration::from_secs_f64(args.fill_secs) };
        for running in &systems {
            let (figures, tally) = measure(running, args, slice, size, &format!("w{level}")).await;
            eprintln!("  {:<36} window {filled:>8}, batch {size}: {:>8.0} msg/s", running.system.name(), figures.rate);
            acked.entry(running.system).or_default().merge(tally);
            pass.by_window.insert((running.system, filled), figures);
        }
    }

    let pgbench = if args.pgbench_clients.is_empty() {
        None
    } else {
        Some(Pgbench::prepare(&pg, &t.config().pg, args.partitions, filled / args.partitions).await)
    };
    let slice = Slice { warmup: Duration::from_secs_f64(args.warmup), measured: Duration::from_secs_f64(args.secs) };
    for &size in &args.sizes {
        for round in 0..args.rounds {
            for k in 0..systems.len() {
                let running = &systems[(round + k) % systems.len()];
                let (figures, tally) = measure(running, args, slice, size, &format!("r{round}")).await;
                eprintln!(
                    "  {:<36} batch {size:>3} round {round}: {:>8.0} msg/s  p50 {:>7.2} ms  p99 {:>7.2} ms  CPU ms per 1,000: \
                     system {:.1}, PostgreSQL {:.1}, generator {:.1}; {} wrong, {} errors",
                    running.system.name(),
                    figures.rate,
                    figures.p50_ms,
                    figures.p99_ms,
                    figures.cpu_ms_per_k[0],
                    figures.cpu_ms_per_k[1],
                    figures.cpu_ms_per_k[2],
                    figures.wrong,
                    figures.errors
                );
                acked.entry(running.system).or_default().merge(tally);
                pass.rounds.insert((running.system, size, round), figures);
            }
            if let Some(pgbench) = &pgbench {
                let room = stile_bench::pgbench::room(&pg).await;
                let best = args
                    .pgbench_clients
                    .iter()
                    .map(|&clients| pgbench.run(clients.min(room).max(1), size as usize, args.redelivery_percent, args.secs))
                    .max_by(|a, b| a.rate.total_cmp(&b.rate))
                    .expect("a client count");
                eprintln!("  {:<36} batch {size:>3} round {round}: {:>8.0} msg/s", "PostgreSQL alone (pgbench)", best.rate);
                pass.pgbench.insert((size, round), best);
            }
        }
    }

    for running in &systems {
        let stored = running.stored_ids(&pg).await;
        let tally = acked.remove(&running.system).unwrap_or_default();
        let mut missing: std::collections::HashSet<String> = std::collections::HashSet::new();
        let mut acknowledged: std::collections::HashSet<String> = std::collections::HashSet::new();
        for request in &tally.acked {
            for id in request.ids() {
                if !stored.contains_key(&id) {
                    missing.insert(id.clone());
                }
                acknowledged.insert(id);
            }
        }
        let exactness = Exactness {
            acknowledged: acknowledged.len(),
            stored: stored.values().map(|&n| u64::from(n)).sum(),
            duplicates_stored: stored.values().map(|&n| u64::from(n.saturating_sub(1))).sum(),
            missing: missing.len(),
        };
        eprintln!("  {:<36} read back: {exactness:?}", running.system.name());
        pass.exactness.insert(running.system, exactness);
    }
    drop(systems);
    drop(pg);
    drop(t);
    (pass, version)
}

impl Memory {
    fn resident(&self) -> u64 {
        self.rss.iter().map(|(_, bytes)| bytes).sum()
    }
}

impl Pass {
    /// Resident bytes per id held at `fill`: what the system's processes
    /// grew by since the first fill level, per id added since. Measured from
    /// the first level, not from the start, so that what a process
    /// allocates once (pools, buffers, a first touch of its heap) is not
    /// charged to the ids.
    fn bytes_per_id(&self, system: System, fill: usize) -> f64 {
        let first = filled_levels(self)[0];
        match (self.memory.get(&(system, first)), self.memory.get(&(system, fill))) {
            (Some(a), Some(b)) if fill > first => (b.resident() as f64 - a.resident() as f64) / (fill - first) as f64,
            _ => f64::NAN,
        }
    }
}

/// One measurement of `running`: `args.conns` connections for `slice`.
/// Returns its figures and everything its connections had acknowledged.
async fn measure(running: &Running, args: &Args, slice: Slice, size: u32, label: &str) -> (Figures, Tally) {
    let mut transports: Vec<Transport> = Vec::with_capacity(args.conns);
    for _ in 0..args.conns {
        transports.push(running.transport().await);
    }
    let measure_from = Instant::now() + slice.warmup;
    let end = measure_from + slice.measured;
    let mut tasks = Vec::with_capacity(args.conns);
    for (c, transport) in transports.into_iter().enumerate() {
        let plan = Plan {
            tag: format!("{label}-s{size}-c{c}").into(),
            partitions: args.partitions,
            size,
            redelivery_percent: args.redelivery_percent,
            measure_from,
            end,
        };
        tasks.push(tokio::spawn(workload::connection(transport, plan)));
    }
    tokio::time::sleep_until(measure_from.into()).await;
    let pids: Vec<i32> = running.processes().iter().map(|&(_, pid)| pid).collect();
    let me = [std::process::id() as i32];
    let before = [cpu_seconds(&pids), postgres_cpu_seconds(), cpu_seconds(&me)];
    let mut tally = Tally::default();
    for task in tasks {
        tally.merge(task.await.expect("a connection task"));
    }
    let after = [cpu_seconds(&pids), postgres_cpu_seconds(), cpu_seconds(&me)];
    let messages = tally.messages.max(1) as f64;
    let figures = Figures {
        rate: tally.messages as f64 / slice.measured.as_secs_f64(),
        p50_ms: tally.percentile_ms(50.0),
        p99_ms: tally.percentile_ms(99.0),
        cpu_ms_per_k: std::array::from_fn(|i| 1e6 * (after[i] - before[i]) / messages),
        wrong: tally.wrong,
        errors: tally.errors,
    };
    (figures, tally)
}

fn print_pass(args: &Args, pass: &Pass) {
    let round_median = |system: System, size: u32, pick: fn(&Figures) -> f64| {
        median((0..args.rounds).map(|r| pass.rounds.get(&(system, size, r)).map_or(f64::NAN, pick)))
    };
    let pgbench_median = |size: u32| median((0..args.rounds).map(|r| pass.pgbench.get(&(size, r)).map_or(f64::NAN, |f| f.rate)));
    println!();
    println!("## synchronous_commit = {}", pass.sync);
    println!();
    println!(
        "| system | {} |",
        args.sizes
            .iter()
            .map(|s| format!("batch {s}: msg/s | p50 ms | p99 ms | CPU ms per 1,000 (system / PostgreSQL / generator)"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    println!("|---|{}", "---:|---:|---:|---|".repeat(args.sizes.len()));
    for &system in &args.systems {
        let cells: Vec<String> = args
            .sizes
            .iter()
            .map(|&size| {
                let cpu = |i: usize| {
                    median((0..args.rounds).map(|r| pass.rounds.get(&(system, size, r)).map_or(f64::NAN, |f| f.cpu_ms_per_k[i])))
                };
                format!(
                    "{:.0} | {:.2} | {:.2} | {:.1} / {:.1} / {:.1}",
                    round_median(system, size, |f| f.rate),
                    round_median(system, size, |f| f.p50_ms),
                    round_median(system, size, |f| f.p99_ms),
                    cpu(0),
                    cpu(1),
                    cpu(2)
                )
            })
            .collect();
        println!("| {} | {} |", system.name(), cells.join(" | "));
    }
    if !pass.pgbench.is_empty() {
        // The client count each round's best ran with: it is capped by the
        // server's free connections, so it is printed beside the figure.
        let clients = |size: u32| {
            let counts: Vec<String> =
                (0..args.rounds).filter_map(|r| pass.pgbench.get(&(size, r))).map(|f| f.clients.to_string()).collect();
            counts.join("/")
        };
        let cells: Vec<String> =
            args.sizes.iter().map(|&size| format!("{:.0} ({} clients) | | | ", pgbench_median(size), clients(size))).collect();
        println!("| PostgreSQL alone (pgbench, no HTTP) | {} |", cells.join(" | "));
    }

    println!();
    println!("stile (wasm) against each, the median of the rounds' own ratios of messages per second:");
    println!();
    println!("| against | {} |", args.sizes.iter().map(|s| format!("batch {s}")).collect::<Vec<_>>().join(" | "));
    println!("|---|{}", "---:|".repeat(args.sizes.len()));
    let rate = |system: System, size: u32, r: usize| pass.rounds.get(&(system, size, r)).map_or(f64::NAN, |f| f.rate);
    for &other in args.systems.iter().filter(|&&s| s != System::StileWasm) {
        let cells: Vec<String> = args
            .sizes
            .iter()
            .map(|&size| {
                format!("{:.2}x", median((0..args.rounds).map(|r| rate(System::StileWasm, size, r) / rate(other, size, r))))
            })
            .collect();
        println!("| {} | {} |", other.name(), cells.join(" | "));
    }
    if !pass.pgbench.is_empty() {
        let cells: Vec<String> = args
            .sizes
            .iter()
            .map(|&size| {
                let ratio = median(
                    (0..args.rounds)
                        .map(|r| rate(System::StileWasm, size, r) / pass.pgbench.get(&(size, r)).map_or(f64::NAN, |f| f.rate)),
                );
                format!("{ratio:.2}x")
            })
            .collect();
        println!("| PostgreSQL alone (pgbench, no HTTP) | {} |", cells.join(" | "));
    }

    println!();
    println!(
        "Memory: resident MiB of each system's processes at each fill level; per id held, what they grew by since the \
         first level per id added since (allocator slack included, so it moves between levels); for stile, the bytes its \
         cache accounts for per hash it holds; and the bytes PostgreSQL keeps for the check (the relations the verdict reads, \
         on disk; the stile gateways' shared log in proportion to each one's messages) per id it holds there:"
    );
    println!();
    let fills = filled_levels(pass);
    println!(
        "| system | processes | {} |",
        fills
            .iter()
            .map(|f| format!("{f} ids: RSS MiB | bytes per id | cache bytes per hash | PostgreSQL bytes per id"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    println!("|---|---|{}", "---:|---:|---:|---:|".repeat(fills.len()));
    for &system in &args.systems {
        let roles = pass
            .memory
            .get(&(system, fills[0]))
            .map_or(String::new(), |m| m.rss.iter().map(|(role, _)| *role).collect::<Vec<_>>().join(" + "));
        let cells: Vec<String> = fills
            .iter()
            .map(|&fill| match pass.memory.get(&(system, fill)) {
                Some(m) => format!(
                    "{:.0} | {:.1} | {} | {}",
                    m.resident() as f64 / (1 << 20) as f64,
                    pass.bytes_per_id(system, fill),
                    m.cache
                        .filter(|c| c.hashes > 0)
                        .map_or(String::new(), |c| format!("{:.1}", c.bytes as f64 / c.hashes as f64)),
                    m.in_postgres
                        .filter(|held| held.ids > 0)
                        .map_or(String::new(), |held| format!("{:.1}", held.bytes as f64 / held.ids as f64))
                ),
                None => " | | | ".to_owned(),
            })
            .collect();
        println!("| {} | {roles} | {} |", system.name(), cells.join(" | "));
    }

    if let Some(&last) = fills.last() {
        let stile = pass.bytes_per_id(System::StileWasm, last);
        for nats in [System::Nats2m, System::Nats1h].into_iter().filter(|s| args.systems.contains(s)) {
            println!();
            println!(
                "stile (wasm) holds an id in {stile:.1} bytes, {} in {:.1}: {:.2} of it (target <= 0.2).",
                nats.name(),
                pass.bytes_per_id(nats, last),
                stile / pass.bytes_per_id(nats, last)
            );
        }
    }
    println!();
    println!(
        "Throughput by window, batch {} ({} s each, one measurement per level):",
        args.sizes.iter().max().unwrap_or(&0),
        args.fill_secs
    );
    println!();
    println!("| system | {} |", fills.iter().map(|f| format!("{f} ids")).collect::<Vec<_>>().join(" | "));
    println!("|---|{}", "---:|".repeat(fills.len()));
    for &system in &args.systems {
        let cells: Vec<String> = fills
            .iter()
            .map(|&fill| pass.by_window.get(&(system, fill)).map_or(String::new(), |f| format!("{:.0}", f.rate)))
            .collect();
        println!("| {} | {} |", system.name(), cells.join(" | "));
    }

    println!();
    println!("{}", exactness_line(args, pass));
    println!();
    println!("| system | acknowledged ids | stored | duplicates stored | acknowledged but missing | wrong answers | errors |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for &system in &args.systems {
        let e = pass.exactness.get(&system).cloned().unwrap_or_default();
        let wrong: u64 = pass.rounds.iter().filter(|((s, _, _), _)| *s == system).map(|(_, f)| f.wrong).sum();
        let errors: u64 = pass.rounds.iter().filter(|((s, _, _), _)| *s == system).map(|(_, f)| f.errors).sum();
        println!(
            "| {} | {} | {} | {} | {} | {wrong} | {errors} |",
            system.name(),
            e.acknowledged,
            e.stored,
            e.duplicates_stored,
            e.missing
        );
    }
}

/// What the read-back found, said from its counts: every system's
/// acknowledged ids, and how many were stored twice, missing, answered
/// wrongly (warm-up included) or failed.
fn exactness_line(args: &Args, pass: &Pass) -> String {
    let found: Vec<Exactness> = args.systems.iter().map(|s| pass.exactness.get(s).cloned().unwrap_or_default()).collect();
    let acknowledged: usize = found.iter().map(|e| e.acknowledged).sum();
    let twice: u64 = found.iter().map(|e| e.duplicates_stored).sum();
    let missing: usize = found.iter().map(|e| e.missing).sum();
    let wrong: u64 = pass.rounds.values().map(|f| f.wrong).sum();
    let errors: u64 = pass.rounds.values().map(|f| f.errors).sum();
    let verdict = if twice == 0 && missing == 0 && wrong == 0 && errors == 0 { "exact" } else { "NOT EXACT" };
    format!(
        "Exactness ({verdict}): {acknowledged} acknowledged ids of {} systems read back: {twice} stored twice, {missing} \
         acknowledged but missing, {wrong} wrong answers, {errors} errors.",
        found.len()
    )
}

/// The fill levels a pass recorded, ascending.
fn filled_levels(pass: &Pass) -> Vec<usize> {
    let mut fills: Vec<usize> = pass.memory.keys().map(|&(_, fill)| fill).collect();
    fills.sort_unstable();
    fills.dedup();
    fills
}

fn draw_charts(args: &Args, pass: &Pass) {
    if let Err(e) = chart::load_font() {
        eprintln!("peers: no charts: {e:#}");
        return;
    }
    if let Err(e) = std::fs::create_dir_all(&args.charts) {
        eprintln!("peers: no charts: {}: {e}", args.charts.display());
        return;
    }
    let suffix = if pass.sync == "on" { String::new() } else { format!("-sync-{}", pass.sync) };
    let path = |name: &str| args.charts.join(format!("{name}{suffix}.png"));
    let labels: Vec<&str> = args.systems.iter().map(|s| s.label()).collect();
    let per_size = |pick: fn(&Figures) -> f64| -> Vec<Series<f64>> {
        args.sizes
            .iter()
            .map(|&size| Series {
                name: format!("{size} per request"),
                values: args
                    .systems
                    .iter()
                    .map(|&s| median((0..args.rounds).map(|r| pass.rounds.get(&(s, size, r)).map_or(f64::NAN, pick))))
                    .collect(),
            })
            .collect()
    };
    let fills = filled_levels(pass);
    let by_fill = |value: &dyn Fn(System, usize) -> f64| -> Vec<Series<(f64, f64)>> {
        args.systems
            .iter()
            .map(|&s| Series { name: s.label().to_owned(), values: fills.iter().map(|&f| (f as f64, value(s, f))).collect() })
            .collect()
    };
    let sync = format!("synchronous_commit={}", pass.sync);
    let drawn = [
        chart::grouped_bars(
            &path("throughput"),
            &format!("Messages per second ({sync})"),
            "messages/s",
            &labels,
            &per_size(|f| f.rate),
        ),
        chart::grouped_bars(&path("p99"), &format!("p99 latency per request ({sync})"), "ms", &labels, &per_size(|f| f.p99_ms)),
        chart::lines(
            &path("memory"),
            "Resident memory per id held",
            "ids held in the window",
            "bytes per id",
            &by_fill(&|s, f| pass.bytes_per_id(s, f)),
        ),
        chart::lines(
            &path("window"),
            &format!("Messages per second by window, {} per request ({sync})", args.sizes.iter().max().unwrap_or(&0)),
            "ids held in the window",
            "messages/s",
            &by_fill(&|s, f| pass.by_window.get(&(s, f)).map_or(f64::NAN, |x| x.rate)),
        ),
    ];
    for result in drawn {
        if let Err(e) = result {
            eprintln!("peers: a chart failed: {e:#}");
        }
    }
    eprintln!("peers: charts in {}", args.charts.display());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flags_are_well_formed() {
        Args::command().debug_assert();
        let args =
            Args::try_parse_from(["peers", "--systems", "stile-wasm,nats1h", "--sync", "on", "--fills", "1e6,1e5"]).unwrap();
        assert_eq!(args.systems, [System::StileWasm, System::Nats1h]);
        assert_eq!(args.sync, [Switch::On]);
        assert_eq!(args.fills, [1_000_000, 100_000]);
    }
}
