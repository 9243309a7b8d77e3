//! The exactness checker, long form: see [`Args`], which is also what
//! `checker --help` prints.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use clap::{Parser, ValueEnum};
use stile_tests::checker::{self, ClockSkew, Config, Faults, GatewaySpec, OverloadFault, ShortWindow, Spell};
use stile_tests::pg::TestDb;

/// The exactness checker, long form: producers push through several gateway
/// processes on one database while gateways are killed with `kill -9` and
/// restarted, PostgreSQL is restarted, one gateway traps guest calls, one has
/// a tiny cache budget, two have wall clocks two windows ahead of and behind
/// PostgreSQL's that swap halfway (libfaketime: `apt-get install faketime`),
/// the window is shortened and lengthened, and for a spell a flood of 256
/// connections pushes large batches to every gateway, which then shed it and
/// the producers with 503s (the gateways run with `--max-held-mb 8`); then
/// every answer is checked against PostgreSQL. Exits 1 on any violation (or
/// on an overload finding: a flood push answered other than 201 or 503), 2
/// when it could not run.
///
/// ```text
/// cargo build --release --workspace
/// cargo run --release -p stile-tests --bin checker -- --seconds 300
/// ```
///
/// The runs recorded in bench/checker/RESULTS.md. Churn: 100,000
/// partitions, each id's partition chosen from a hot group of 2,000 that
/// moves on every 2 s, through one gateway with a 64 MiB cache:
///
/// ```text
/// checker --roles plain --gateways 1 --cache-mb 64 --partitions 100000 \
///     --hot-partitions 2000 --seconds 300 --rate 0 --producers 32 \
///     --kill-every 0 --pg-restart-every 0 --short-window 0 --overload off
/// ```
///
/// Soak: the highest rate the machine sustains (closed loop), no faults, a
/// 60 s window so that the cache reaches its steady state a minute in:
///
/// ```text
/// checker --roles plain --gateways 1 --seconds 300 --window 60 --rate 0 \
///     --producers 32 --kill-every 0 --pg-restart-every 0 --short-window 0 \
///     --overload off
/// ```
///
/// The PostgreSQL restart is `pg_ctlcluster --skip-systemctl-redirect VERSION
/// NAME restart` of the cluster that listens on the database's port: it
/// disturbs everything else that uses that cluster. The failover leaves that
/// cluster alone: the checker makes a primary and a synchronous standby of
/// its own in a temporary directory and removes them at the end
/// (`checker --seconds 120 --failover-at 60`).
///
/// The faults between the gateways and PostgreSQL, one after another, with
/// the gateways' other faults off so that each one's time to recover is its
/// own:
///
/// ```text
/// checker --seconds 150 --kill-every 0 --pg-restart-every 0 --short-window 0 \
///     --overload off \
///     --db-faults latency@10+20,loss@40+20,partition@70+20,reset@100,reset@110,reset@120
/// checker --seconds 150 --kill-every 0 --pg-restart-every 0 --short-window 0 \
///     --overload off \
///     --db-faults connections@10+20,row-lock@40+20,table-lock@70+20,disk-full@100+20
/// ```
///
/// The overload alone, its flood from 20 s to 50 s:
///
/// ```text
/// checker --seconds 80 --kill-every 0 --pg-restart-every 0 --short-window 0 \
///     --overload 20+30
/// ```
#[derive(Debug, Parser)]
#[command(name = "checker", verbatim_doc_comment)]
struct Args {
    /// How long producers push, in seconds.
    #[arg(long, default_value_t = 300.0)]
    seconds: f64,
    /// The workload's seed (a fixed one by default).
    #[arg(long)]
    seed: Option<u64>,
    /// Producer tasks.
    #[arg(long, default_value_t = 8)]
    producers: usize,
    /// Producers of transactions and timers (checker/steps.rs).
    #[arg(long, default_value_t = 1)]
    steps_producers: usize,
    /// Producers of a retry storm: new ids for a third of the run, then
    /// replays of them, in order and at random, as fast as they are answered.
    #[arg(long, default_value_t = 2)]
    storm_producers: usize,
    /// Requests per second per producer; 0 for as fast as answers come.
    #[arg(long, default_value_t = 40.0)]
    rate: f64,
    /// Partitions of the queue.
    #[arg(long, default_value_t = 128)]
    partitions: usize,
    /// New ids go to a group of this many partitions; 0 for all.
    #[arg(long, default_value_t = 8)]
    hot_partitions: usize,
    /// The hot group moves on this often, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    hot_phase_ms: u64,
    /// Items per request, at most.
    #[arg(long, default_value_t = 8)]
    max_batch: usize,
    /// Percent of items re-sending an earlier id.
    #[arg(long, default_value_t = 15)]
    repeat_percent: u32,
    /// Percent of items with ids shared between producers.
    #[arg(long, default_value_t = 4)]
    shared_percent: u32,
    /// Gateways: with `--roles faults`, 2 or 3 (g0 traps guest calls, g1 has
    /// a tiny cache, g2 is plain); with `--roles plain`, 1 to 3.
    #[arg(long, default_value_t = 3)]
    gateways: usize,
    /// What the gateways are.
    #[arg(long, value_enum, default_value_t = Roles::Faults)]
    roles: Roles,
    /// Plain gateways' cache budget, in MiB.
    #[arg(long, default_value_t = 512)]
    cache_mb: u64,
    /// Plain gateways' shards (the gateway's default: the cores).
    #[arg(long)]
    shards: Option<usize>,
    /// Plain gateways' cache engine, `wasm` or `native` (the gateway's
    /// default: wasm).
    #[arg(long)]
    engine: Option<String>,
    /// g0's injected guest traps, per million guest calls.
    #[arg(long, default_value_t = 20_000)]
    traps_per_million: u32,
    /// g1's cache budget, in MiB.
    #[arg(long, default_value_t = 1)]
    tiny_cache_mb: u64,
    /// g1's shards, sharing that budget.
    #[arg(long, default_value_t = 32)]
    tiny_shards: usize,
    /// kill -9 a gateway this often, in seconds; 0 for never.
    #[arg(long, default_value_t = 20.0)]
    kill_every: f64,
    /// How long a killed gateway stays down, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    kill_downtime_ms: u64,
    /// Restart PostgreSQL this often, in seconds; 0 for never (default: 60,
    /// or 0 with --failover-at).
    #[arg(long)]
    pg_restart_every: Option<f64>,
    /// Run on a primary and a synchronous standby of the checker's own
    /// (PostgreSQL's server programs, and as root the user `postgres`), stop
    /// the primary immediately this far into the run (seconds) and promote
    /// the standby; 0 for no failover.
    #[arg(long, default_value_t = 0.0, conflicts_with = "database_url")]
    failover_at: f64,
    /// The short window in seconds, in force from 40 % to 60 % of the run;
    /// 0 for no window change.
    #[arg(long, default_value_t = 3.0)]
    short_window: f64,
    /// The queue's window outside the short period, in seconds (default:
    /// 3600, or twice the run if longer).
    #[arg(long)]
    window: Option<f64>,
    /// Each gateway's wall clock against PostgreSQL's, in gateway order,
    /// comma-separated: seconds, with `:` between offsets the clock jumps
    /// through at equal shares of the run (`+150`, `+7200:-7200`), `-` for
    /// the machine's clock, `off` for none at all (default: with `--roles
    /// faults`, `-,+2W:-2W,-2W:+2W` for a window W; otherwise off).
    #[arg(long, allow_hyphen_values = true)]
    clocks: Option<String>,
    /// Use this database (default: a fresh one on STILE_TEST_DATABASE_URL's
    /// server, dropped at the end).
    #[arg(long)]
    database_url: Option<String>,
    /// Faults between the gateways and PostgreSQL, or in it, each
    /// NAME@SECONDS+SECONDS (when into the run, how long), comma-separated:
    /// `latency`, `loss`, `partition` (through a fault proxy of the
    /// checker's own), `reset@SECONDS` (every open connection aborted right
    /// after its next request), `connections` (another client takes every
    /// free connection), `row-lock` (of the partition written most in the
    /// last 2 s), `table-lock` (stile.segments in SHARE mode), `disk-full` (a
    /// tmpfs, which takes root); the connection and disk faults run on a
    /// server of the checker's own.
    #[arg(long)]
    db_faults: Option<String>,
    /// The latency fault's delay, each way, in milliseconds.
    #[arg(long, default_value_t = 50)]
    latency_ms: u64,
    /// The latency fault's jitter, either side, in milliseconds.
    #[arg(long, default_value_t = 10)]
    jitter_ms: u64,
    /// The loss fault's share of chunks lost, in percent.
    #[arg(long, default_value_t = 5.0)]
    loss_percent: f64,
    /// Single-item pushes a second, open-loop, round robin over every
    /// partition, which show what kept flowing through a row lock (default:
    /// 20 with --db-faults, else 0).
    #[arg(long)]
    probe_rate: Option<f64>,
    /// The overload's spell, AT+SECONDS (when into the run, how long), or
    /// `off`: a flood of connections pushing large batches to every gateway
    /// as fast as answers come, a 503 sent again at once, to a queue of its
    /// own (default: from 70 % of the run for a tenth of it, at most 20 s).
    #[arg(long)]
    overload: Option<String>,
    /// The flood's connections, spread over the gateways.
    #[arg(long, default_value_t = 256)]
    overload_connections: usize,
    /// Items per flood push, comma-separated, one size per connection in
    /// turn. 1,000 items of 100 bytes are a large request to the gateway,
    /// 250 a small one, which also takes the room it keeps for small pushes
    /// such as the producers'.
    #[arg(long, default_value = "1000,250")]
    overload_items: String,
    /// Bytes of each flood item's payload.
    #[arg(long, default_value_t = 100)]
    overload_payload_bytes: usize,
    /// Every gateway's `--max-held-mb` with an overload spell (without one,
    /// the gateway's default). The flood's default connections ask about
    /// 30 MB of each of three gateways at once: 8 MiB holds and queues 16 MiB
    /// and sheds the rest, 16 MiB would take them all in.
    #[arg(long, default_value_t = 8)]
    max_held_mb: u64,
}

/// What the gateways of a run are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Roles {
    /// g0 traps guest calls, g1 has a tiny cache, g2 is plain.
    Faults,
    /// Every gateway alike, with --cache-mb, --shards and --engine.
    Plain,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.failover_at > 0.0 && args.pg_restart_every.is_some_and(|every| every > 0.0) {
        eprintln!("checker: --failover-at runs on servers of its own: it takes no --pg-restart-every");
        return ExitCode::from(2);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
    runtime.block_on(async {
        let test_db = match (&args.database_url, args.failover_at > 0.0) {
            (None, false) => Some(TestDb::new().await),
            _ => None,
        };
        let url = args.database_url.clone().or_else(|| test_db.as_ref().map(TestDb::url)).unwrap_or_default();
        let config = match config(&args, &url) {
            Ok(config) => config,
            Err(error) => {
                eprintln!("checker: {error:#}");
                return ExitCode::from(2);
            }
        };
        let report = match checker::run(&config).await {
            Ok(report) => report,
            Err(error) => {
                eprintln!("checker: {error:#}");
                return ExitCode::from(2);
            }
        };
        println!("{report}");
        drop(test_db);
        let overload_findings = report.overload.as_ref().map_or(0, |overload| overload.findings);
        if report.violations.is_empty()
            && report.unexpected_exits.is_empty()
            && report.fault_errors.is_empty()
            && overload_findings == 0
        {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    })
}

/// The run the flags describe, on the database at `url`.
fn config(args: &Args, url: &str) -> anyhow::Result<Config> {
    let mut config = Config::new(url, Duration::from_secs_f64(args.seconds));
    if let Some(seed) = args.seed {
        config.seed = seed;
    }
    config.producers = args.producers;
    config.steps_producers = args.steps_producers;
    config.storm_producers = args.storm_producers;
    config.rate = args.rate;
    config.partitions = args.partitions;
    config.hot_partitions = args.hot_partitions;
    config.hot_phase = Duration::from_millis(args.hot_phase_ms);
    config.max_batch = args.max_batch;
    config.repeat_percent = args.repeat_percent;
    config.shared_percent = args.shared_percent;
    config.long_window_seconds = args.window.unwrap_or(3600.0_f64.max(args.seconds * 2.0)) as i32;
    config.gateways = gateways(args);
    set_clocks(args, &mut config)?;
    let pg_every = args.pg_restart_every.unwrap_or(if args.failover_at > 0.0 { 0.0 } else { 60.0 });
    let seconds = |s: f64| (s > 0.0).then(|| Duration::from_secs_f64(s));
    config.faults = Faults {
        kill_every: seconds(args.kill_every),
        kill_downtime: Duration::from_millis(args.kill_downtime_ms),
        pg_restart_every: seconds(pg_every),
        short_window: (args.short_window > 0.0).then_some(ShortWindow { seconds: args.short_window as i32, from: 0.4, to: 0.6 }),
        failover_at: seconds(args.failover_at),
        ..Faults::default()
    };
    config.faults.overload = overload(args).context("--overload")?;
    config.probe_rate = args.probe_rate.unwrap_or(if args.db_faults.is_some() { 20.0 } else { 0.0 });
    if let Some(list) = &args.db_faults {
        let latency = Duration::from_millis(args.latency_ms);
        let jitter = Duration::from_millis(args.jitter_ms);
        config
            .faults
            .add_db_faults(list, latency, jitter, args.loss_percent)
            .map_err(|error| error.context(format!("--db-faults {list}")))?;
    }
    Ok(config)
}

/// The overload fault the flags describe, if any.
fn overload(args: &Args) -> anyhow::Result<Option<OverloadFault>> {
    let spell = match args.overload.as_deref().map(str::trim) {
        Some("off") => return Ok(None),
        Some(text) => {
            let (at, lasting) = text.split_once('+').ok_or_else(|| anyhow!("{text}: expected AT+SECONDS or off"))?;
            let number = |text: &str| text.trim().parse::<f64>().with_context(|| format!("{text:?} is not a number of seconds"));
            Spell::new(number(at)?, number(lasting)?)
        }
        None => Spell::new(args.seconds * 0.7, (args.seconds * 0.1).min(20.0)),
    };
    if spell.lasting.is_zero() {
        bail!("the overload needs a duration");
    }
    let items: Vec<usize> = args
        .overload_items
        .split(',')
        .map(|n| n.trim().parse::<usize>().with_context(|| format!("--overload-items: {n:?} is not a number")))
        .collect::<anyhow::Result<_>>()?;
    if items.is_empty() || items.contains(&0) || args.overload_connections == 0 {
        bail!("the flood needs connections and items in every push");
    }
    Ok(Some(OverloadFault {
        spell,
        connections: args.overload_connections,
        items,
        payload_bytes: args.overload_payload_bytes,
        max_held_mb: args.max_held_mb,
    }))
}

fn gateways(args: &Args) -> Vec<GatewaySpec> {
    match args.roles {
        Roles::Faults => {
            let mut gateways = vec![
                GatewaySpec::traps("g0-traps", args.traps_per_million),
                GatewaySpec::tiny_cache("g1-tiny", args.tiny_cache_mb, args.tiny_shards),
                GatewaySpec::plain("g2"),
            ];
            gateways.truncate(args.gateways.clamp(2, 3));
            gateways
        }
        Roles::Plain => (0..args.gateways.clamp(1, 3))
            .map(|g| {
                let mut spec = GatewaySpec::plain(&format!("g{g}")).flag("cache-mb", args.cache_mb);
                if let Some(shards) = args.shards {
                    spec = spec.flag("shards", shards);
                }
                if let Some(engine) = &args.engine {
                    spec = spec.flag("engine", engine);
                }
                spec
            })
            .collect(),
    }
}

/// Sets each gateway's clock from `--clocks` (or the roles' default).
fn set_clocks(args: &Args, config: &mut Config) -> anyhow::Result<()> {
    let window = i64::from(config.long_window_seconds);
    let clocks = match (&args.clocks, args.roles) {
        (Some(clocks), _) => clocks.clone(),
        (None, Roles::Faults) => format!("-,+{}:-{},-{}:+{}", 2 * window, 2 * window, 2 * window, 2 * window),
        (None, Roles::Plain) => "off".to_owned(),
    };
    if clocks == "off" {
        return Ok(());
    }
    for (spec, clock) in config.gateways.iter_mut().zip(clocks.split(',')) {
        if clock.trim() == "-" {
            continue;
        }
        let skew = ClockSkew::parse(clock).map_err(|error| error.context(format!("--clocks {clocks}")))?;
        *spec = spec.clone().clock(skew);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;

    #[test]
    fn the_flags_are_consistent_and_listed_by_help() {
        Args::command().debug_assert();
        let help = Args::command().render_long_help().to_string();
        for flag in ["--db-faults", "--failover-at", "--clocks", "--probe-rate", "--overload", "--max-held-mb"] {
            assert!(help.contains(flag), "--help does not list {flag}");
        }
    }

    #[test]
    fn the_roles_default_clocks_skew_two_gateways_by_two_windows() {
        let args = Args::parse_from(["checker", "--seconds", "10", "--window", "60"]);
        let config = config(&args, "postgres://x").expect("a config");
        assert_eq!(config.long_window_seconds, 60);
        assert_eq!(config.gateways.len(), 3);
        let skews: Vec<bool> = config.gateways.iter().map(|g| g.clock.is_some()).collect();
        assert_eq!(skews, [false, true, true]);
        let bad = Args::parse_from(["checker", "--clocks", "-,nonsense"]);
        assert!(config_error(&bad).contains("--clocks"), "{}", config_error(&bad));
    }

    #[test]
    fn the_overload_is_a_default_fault_that_can_be_moved_or_turned_off() {
        let args = Args::parse_from(["checker", "--seconds", "300"]);
        let overload = config(&args, "postgres://x").expect("a config").faults.overload.expect("on by default");
        assert_eq!(overload.spell, Spell::new(210.0, 20.0));
        assert_eq!((overload.connections, overload.items.as_slice(), overload.max_held_mb), (256, &[1_000, 250][..], 8));
        let args = Args::parse_from(["checker", "--overload", "20+30", "--overload-items", "500", "--max-held-mb", "8"]);
        let overload = config(&args, "postgres://x").expect("a config").faults.overload.expect("asked for");
        assert_eq!((overload.spell, overload.items.as_slice(), overload.max_held_mb), (Spell::new(20.0, 30.0), &[500][..], 8));
        let off = Args::parse_from(["checker", "--overload", "off"]);
        assert!(config(&off, "postgres://x").expect("a config").faults.overload.is_none());
        for bad in ["20", "20+0", "x+5"] {
            let args = Args::parse_from(["checker", "--overload", bad]);
            assert!(config_error(&args).contains("--overload"), "{bad}: {}", config_error(&args));
        }
    }

    fn config_error(args: &Args) -> String {
        format!("{:#}", config(args, "postgres://x").expect_err("refused"))
    }
}
