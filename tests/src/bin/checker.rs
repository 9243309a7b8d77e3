//! The exactness checker, long form: producers push through several gateway
//! processes on one database while gateways are killed with `kill -9` and
//! restarted, PostgreSQL is restarted, one gateway traps guest calls, one has
//! a tiny cache budget, two have wall clocks two windows ahead of and behind
//! PostgreSQL's that swap halfway (libfaketime: `apt-get install faketime`),
//! and the window is shortened and lengthened; then every answer is checked
//! against PostgreSQL. Exits 1 on any violation.
//!
//! ```text
//! cargo build --release -p stile
//! cargo run --release -p stile-tests --bin checker -- --seconds 300
//! ```
//!
//! Options (defaults in brackets):
//!   --seconds N            how long producers push [300]
//!   --seed N               the workload's seed [fixed]
//!   --producers N          producer tasks [8]
//!   --steps-producers N    producers of transactions and timers (checker/steps.rs) [1]
//!   --rate R               requests per second per producer [40]
//!   --partitions N         partitions of the queue [128]
//!   --hot-partitions N     new ids go to a group of this many, 0 for all [8]
//!   --hot-phase-ms N       the group moves on this often [2000]
//!   --max-batch N          items per request, at most [8]
//!   --repeat-percent N     items re-sending an earlier id [15]
//!   --shared-percent N     items with ids shared between producers [4]
//!   --gateways N           with --roles faults, 2 or 3: g0 traps guest calls, g1 has a
//!                          tiny cache, g2 is plain; with --roles plain, 1 to 3 [3]
//!   --roles R              `faults` (as above) or `plain` (every gateway alike, with
//!                          --cache-mb and --shards) [faults]
//!   --cache-mb N           plain gateways' cache budget [512]
//!   --shards N             plain gateways' shards [the cores]
//!   --engine E             plain gateways' cache engine, wasm or native [wasm]
//!   --traps-per-million N  g0's injected guest traps [20000]
//!   --tiny-cache-mb N      g1's cache budget [1]
//!   --tiny-shards N        g1's shards, sharing that budget [32]
//!   --kill-every S         kill -9 a gateway this often, 0 for never [20]
//!   --kill-downtime-ms N   how long a killed gateway stays down [1000]
//!   --pg-restart-every S   restart PostgreSQL this often, 0 for never [60; 0 with
//!                          --failover-at]
//!   --failover-at S        run on a primary and a synchronous standby of the
//!                          checker's own (PostgreSQL's server programs, and as
//!                          root the user `postgres`), stop the primary
//!                          immediately this far into the run and promote the
//!                          standby; 0 for no failover [0]
//!   --short-window S       the short window, 0 for no window change [3]
//!   --window S             the queue's window outside the short period
//!                          [3600, or twice the run if longer]
//!   --clocks SPECS         each gateway's wall clock against PostgreSQL's, in
//!                          gateway order, comma-separated: seconds, with `:`
//!                          between offsets the clock jumps through at equal
//!                          shares of the run (`+150`, `+7200:-7200`), `-` for
//!                          the machine's clock, `off` for none at all
//!                          [with --roles faults: -,+2W:-2W,-2W:+2W for a
//!                          window W; otherwise off]
//!   --database-url URL     use this database (default: a fresh one on
//!                          STILE_TEST_DATABASE_URL's server, dropped at the end;
//!                          not with --failover-at)
//!   --db-faults LIST       faults between the gateways and PostgreSQL, or in
//!                          it, each NAME@SECONDS+SECONDS (when into the run,
//!                          how long), comma-separated: `latency`, `loss`,
//!                          `partition` (through a fault proxy of the
//!                          checker's own), `reset@SECONDS` (every open
//!                          connection aborted right after its next request),
//!                          `connections` (another client takes every free
//!                          connection), `row-lock` (of the partition written
//!                          most in the last 2 s), `table-lock`
//!                          (stile.segments in SHARE mode), `disk-full` (a
//!                          tmpfs, which takes root); the connection and disk
//!                          faults run on a server of the checker's own [none]
//!   --latency-ms N         the latency fault's delay, each way [50]
//!   --jitter-ms N          its jitter, either side [10]
//!   --loss-percent P       the loss fault's share of chunks lost [5]
//!   --probe-rate R         single-item pushes a second, open-loop, round robin
//!                          over every partition, which show what kept flowing
//!                          through a row lock [20 with --db-faults, else 0]
//!
//! Two further runs are recorded in bench/checker/RESULTS.md. Churn: 100,000
//! partitions, each id's partition chosen from a hot group of 2,000 that moves
//! on every 2 s, through one gateway with a 64 MiB cache (resident memory near
//! the budget, suppression rising, no verdict changed):
//!
//! ```text
//! checker --roles plain --gateways 1 --cache-mb 64 --partitions 100000 \
//!     --hot-partitions 2000 --seconds 300 --rate 0 --producers 32 \
//!     --kill-every 0 --pg-restart-every 0 --short-window 0
//! ```
//!
//! Soak: the highest rate the machine sustains (closed loop), no faults, a
//! 60 s window so that the cache reaches its steady state a minute in, memory
//! flat from then on and latency percentiles printed:
//!
//! ```text
//! checker --roles plain --gateways 1 --seconds 300 --window 60 --rate 0 \
//!     --producers 32 --kill-every 0 --pg-restart-every 0 --short-window 0
//! ```
//!
//! The PostgreSQL restart is `pg_ctlcluster --skip-systemctl-redirect VERSION
//! NAME restart` of the cluster that listens on the database's port: it
//! disturbs everything else that uses that cluster.
//!
//! The failover leaves that cluster alone: the checker makes a primary and a
//! synchronous standby of its own in a temporary directory, gives the
//! gateways both (`target_session_attrs=read-write`), and removes them at the
//! end:
//!
//! ```text
//! checker --seconds 120 --failover-at 60
//! ```
//!
//! The faults between the gateways and PostgreSQL, one after another, with
//! the gateways' other faults off so that each one's time to recover is its
//! own:
//!
//! ```text
//! checker --seconds 150 --kill-every 0 --pg-restart-every 0 --short-window 0 \
//!     --db-faults latency@10+20,loss@40+20,partition@70+20,reset@100,reset@110,reset@120
//! checker --seconds 150 --kill-every 0 --pg-restart-every 0 --short-window 0 \
//!     --db-faults connections@10+20,row-lock@40+20,table-lock@70+20,disk-full@100+20
//! ```

use std::time::Duration;

use stile_tests::checker::{self, Config, Faults, GatewaySpec, ShortWindow};
use stile_tests::pg::TestDb;

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut options = std::collections::HashMap::new();
    let mut i = 0;
    while i < args.len() {
        let Some(name) = args[i].strip_prefix("--") else {
            eprintln!("checker: unexpected argument {:?} (see the doc comment of tests/src/bin/checker.rs)", args[i]);
            return std::process::ExitCode::from(2);
        };
        let Some(value) = args.get(i + 1) else {
            eprintln!("checker: --{name} needs a value");
            return std::process::ExitCode::from(2);
        };
        options.insert(name.to_owned(), value.clone());
        i += 2;
    }
    let known = [
        "seconds",
        "seed",
        "producers",
        "steps-producers",
        "rate",
        "partitions",
        "hot-partitions",
        "hot-phase-ms",
        "tiny-shards",
        "max-batch",
        "repeat-percent",
        "shared-percent",
        "gateways",
        "traps-per-million",
        "tiny-cache-mb",
        "kill-every",
        "kill-downtime-ms",
        "pg-restart-every",
        "failover-at",
        "short-window",
        "database-url",
        "roles",
        "cache-mb",
        "shards",
        "engine",
        "window",
        "clocks",
        "db-faults",
        "latency-ms",
        "jitter-ms",
        "loss-percent",
        "probe-rate",
    ];
    if let Some(unknown) = options.keys().find(|k| !known.contains(&k.as_str())) {
        eprintln!("checker: unknown option --{unknown}");
        return std::process::ExitCode::from(2);
    }
    let number = |name: &str, default: f64| -> f64 {
        options.get(name).map_or(default, |v| v.parse().unwrap_or_else(|e| panic!("--{name} {v}: {e}")))
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
    let failover_at = number("failover-at", 0.0);
    if failover_at > 0.0 && (options.contains_key("database-url") || number("pg-restart-every", 0.0) > 0.0) {
        eprintln!("checker: --failover-at runs on servers of its own: it takes no --database-url nor --pg-restart-every");
        return std::process::ExitCode::from(2);
    }
    runtime.block_on(async {
        let test_db = match options.get("database-url") {
            Some(_) => None,
            None if failover_at > 0.0 => None,
            None => Some(TestDb::new().await),
        };
        let url = options.get("database-url").cloned().or_else(|| test_db.as_ref().map(TestDb::url)).unwrap_or_default();
        let seconds = number("seconds", 300.0);
        let mut config = Config::new(&url, Duration::from_secs_f64(seconds));
        if let Some(seed) = options.get("seed") {
            config.seed = seed.parse().unwrap_or_else(|e| panic!("--seed {seed}: {e}"));
        }
        config.producers = number("producers", 8.0) as usize;
        config.steps_producers = number("steps-producers", 1.0) as usize;
        config.rate = number("rate", 40.0);
        config.partitions = number("partitions", 128.0) as usize;
        config.hot_partitions = number("hot-partitions", 8.0) as usize;
        config.hot_phase = Duration::from_millis(number("hot-phase-ms", 2000.0) as u64);
        config.max_batch = number("max-batch", 8.0) as usize;
        config.repeat_percent = number("repeat-percent", 15.0) as u32;
        config.shared_percent = number("shared-percent", 4.0) as u32;
        config.long_window_seconds = number("window", 3600.0_f64.max(seconds * 2.0)) as i32;
        let count = number("gateways", 3.0) as usize;
        config.gateways = match options.get("roles").map_or("faults", String::as_str) {
            "faults" => {
                let mut gateways = vec![
                    GatewaySpec::traps("g0-traps", number("traps-per-million", 20_000.0) as u32),
                    GatewaySpec::tiny_cache("g1-tiny", number("tiny-cache-mb", 1.0) as u64, number("tiny-shards", 32.0) as usize),
                    GatewaySpec::plain("g2"),
                ];
                gateways.truncate(count.clamp(2, 3));
                gateways
            }
            "plain" => (0..count.clamp(1, 3))
                .map(|g| {
                    let mut spec = GatewaySpec::plain(&format!("g{g}")).flag("cache-mb", number("cache-mb", 512.0) as u64);
                    for flag in ["shards", "engine"] {
                        if let Some(value) = options.get(flag) {
                            spec = spec.flag(flag, value);
                        }
                    }
                    spec
                })
                .collect(),
            other => {
                eprintln!("checker: --roles {other}: expected `faults` or `plain`");
                return std::process::ExitCode::from(2);
            }
        };
        let window = i64::from(config.long_window_seconds);
        let default_clocks = match options.get("roles").map_or("faults", String::as_str) {
            "faults" => format!("-,+{}:-{},-{}:+{}", 2 * window, 2 * window, 2 * window, 2 * window),
            _ => "off".to_owned(),
        };
        let clocks = options.get("clocks").cloned().unwrap_or(default_clocks);
        if clocks != "off" {
            for (spec, clock) in config.gateways.iter_mut().zip(clocks.split(',')) {
                if clock.trim() == "-" {
                    continue;
                }
                match checker::ClockSkew::parse(clock) {
                    Ok(skew) => *spec = spec.clone().clock(skew),
                    Err(error) => {
                        eprintln!("checker: --clocks {clocks}: {error:#}");
                        return std::process::ExitCode::from(2);
                    }
                }
            }
        }
        let kill_every = number("kill-every", 20.0);
        let pg_every = number("pg-restart-every", if failover_at > 0.0 { 0.0 } else { 60.0 });
        let short = number("short-window", 3.0);
        config.faults = Faults {
            kill_every: (kill_every > 0.0).then(|| Duration::from_secs_f64(kill_every)),
            kill_downtime: Duration::from_millis(number("kill-downtime-ms", 1000.0) as u64),
            pg_restart_every: (pg_every > 0.0).then(|| Duration::from_secs_f64(pg_every)),
            short_window: (short > 0.0).then_some(ShortWindow { seconds: short as i32, from: 0.4, to: 0.6 }),
            failover_at: (failover_at > 0.0).then(|| Duration::from_secs_f64(failover_at)),
            ..Faults::default()
        };
        config.probe_rate = number("probe-rate", if options.contains_key("db-faults") { 20.0 } else { 0.0 });
        if let Some(list) = options.get("db-faults") {
            let latency = Duration::from_millis(number("latency-ms", 50.0) as u64);
            let jitter = Duration::from_millis(number("jitter-ms", 10.0) as u64);
            if let Err(error) = config.faults.add_db_faults(list, latency, jitter, number("loss-percent", 5.0)) {
                eprintln!("checker: --db-faults {list}: {error:#}");
                return std::process::ExitCode::from(2);
            }
        }
        let report = match checker::run(&config).await {
            Ok(report) => report,
            Err(error) => {
                eprintln!("checker: {error:#}");
                return std::process::ExitCode::from(2);
            }
        };
        println!("{report}");
        drop(test_db);
        if report.violations.is_empty() && report.unexpected_exits.is_empty() && report.fault_errors.is_empty() {
            std::process::ExitCode::SUCCESS
        } else {
            std::process::ExitCode::FAILURE
        }
    })
}
