//! The `stile` command.
// One declaration is allowed unsafe code, in `allocator` below.
#![deny(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use stile::cache::EngineKind;
use stile::http::HttpConfig;
use stile::http::conn::ConnectionLimits;
use stile::server::tls::ListenerTls;
use stile::server::{RUNTIME_GRACE, ServeConfig, serve};
use stile::shard::{ShardPlacement, WorkerConfig};

/// Every request allocates and frees small buffers (bodies, names,
/// transactionIds, per-message outcomes) on whichever tokio worker runs it. With glibc's
/// allocator that churn took about a third of the gateway's CPU at batches
/// of ten (`malloc_consolidate` and arena locking under `perf`); mimalloc
/// keeps per-thread free lists and does not pay it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// How often the allocator is asked to give back memory freed for longer
/// than its purge delay.
const COLLECT_EVERY: Duration = Duration::from_secs(1);

/// mimalloc gives memory back to the system a delay (a second) after it is
/// freed, but only when a later allocation or free of its own gets round to
/// it: a gateway that goes quiet after a burst of large answers (readers that
/// do not read pages of 32 MB, cut by the send limit) would keep what they
/// held, gigabytes, for good. Asked once a second, the allocator gives back
/// what has been free for longer than its delay, busy or quiet; the memory a
/// busy gateway reuses within the delay stays with it.
async fn collect_freed_memory() {
    let mut ticks = tokio::time::interval(COLLECT_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        allocator::collect();
    }
}

/// The allocator's own call, which the `mimalloc` crate does not expose.
#[allow(unsafe_code)]
mod allocator {
    // SAFETY: `mi_collect` is the C function of the mimalloc linked as the
    // global allocator above (mimalloc.h: `void mi_collect(bool force)`). It
    // takes a flag, returns nothing, and may be called from any thread at any
    // time; nothing the caller holds is touched.
    unsafe extern "C" {
        safe fn mi_collect(force: bool);
    }

    /// Frees the calling thread's empty pages and purges the memory freed
    /// for longer than the purge delay (not forced: what was freed just now
    /// stays for reuse).
    pub fn collect() {
        mi_collect(false);
    }
}

#[derive(Debug, Parser)]
#[command(name = "stile", version, about = "An exact, windowed deduplication gateway for message logs kept in PostgreSQL")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the HTTP API.
    Serve(Box<ServeArgs>),
    /// Migrate the database's schema to this build's and exit (`serve` does
    /// the same when it starts): before distributing the tables with Citus
    /// (scripts/citus/distribute.sql), or ahead of a rolling upgrade.
    Migrate(MigrateArgs),
}

#[derive(Debug, clap::Args)]
struct MigrateArgs {
    /// PostgreSQL connection (URI or keyword form). Unset: the PG* variables,
    /// then libpq's defaults.
    #[arg(long, env = "DATABASE_URL", default_value = "", hide_default_value = true)]
    database_url: String,
}

#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "STILE_LISTEN", default_value = "127.0.0.1:6632")]
    listen: SocketAddr,
    /// PostgreSQL connection (URI or keyword form). Unset: the PG* variables,
    /// then libpq's defaults.
    #[arg(long, env = "DATABASE_URL", default_value = "", hide_default_value = true)]
    database_url: String,
    /// Cache shards (each one worker and one component instance). Default: the cores.
    #[arg(long, env = "STILE_SHARDS")]
    shards: Option<usize>,
    /// Cache budget in MiB, shared across shards; 0 disables the cache (every
    /// segment is then probed in full).
    #[arg(long, env = "STILE_DEDUP_CACHE_MB", default_value_t = 512)]
    cache_mb: u64,
    /// Which engine runs the cache.
    #[arg(long, env = "STILE_ENGINE", value_enum, default_value = "wasm")]
    engine: EngineKind,
    /// Largest request body in bytes.
    #[arg(long, env = "STILE_BODY_LIMIT", default_value_t = 16 << 20)]
    body_limit: usize,
    /// Most items in one push.
    #[arg(long, env = "STILE_MAX_ITEMS", default_value_t = 10_000)]
    max_items: usize,
    /// Require `Authorization: Bearer <token>` on /api/*.
    #[arg(long, env = "STILE_BEARER_TOKEN")]
    bearer_token: Option<String>,
    /// HTTPS: the gateway's certificate, PEM (any intermediates after it).
    /// With `--tls-key`, the listener speaks only HTTPS, HTTP/2 and
    /// HTTP/1.1 by ALPN.
    #[arg(long, env = "STILE_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// HTTPS: the certificate's private key, PEM (PKCS#8, PKCS#1 or SEC1).
    #[arg(long, env = "STILE_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// An origin (`https://app.example`) whose browser requests are served,
    /// with CORS headers; repeat it, or give a comma-separated list; `*` for
    /// any. Unset: a request whose `Origin` is not the gateway's own is
    /// refused with 403.
    #[arg(long = "cors-origin", env = "STILE_CORS_ORIGINS", value_delimiter = ',')]
    cors_origins: Vec<String>,
    /// A name browsers may reach the gateway by (`stile.example.com`),
    /// besides IP addresses and `localhost`; repeat it, or give a
    /// comma-separated list; `*` for any. A request that carries `Origin` or
    /// `Sec-Fetch-*` with a `Host` of another name is refused with 403 (a page
    /// whose own name was pointed at the gateway: DNS rebinding).
    #[arg(long = "allowed-hosts", env = "STILE_ALLOWED_HOSTS", value_delimiter = ',')]
    allowed_hosts: Vec<String>,
    /// Largest answer one read may return (messages, KV reads), in bytes;
    /// past it a read answers 413, or a shorter page of messages.
    #[arg(long, env = "STILE_ANSWER_LIMIT", default_value_t = HttpConfig::default().answer_limit)]
    answer_limit: usize,
    /// Seconds a connection may wait, between requests, for the next one's
    /// first byte.
    #[arg(long, env = "STILE_IDLE_TIMEOUT", allow_negative_numbers = true, default_value_t = ConnectionLimits::default().idle.as_secs_f64())]
    idle_timeout: f64,
    /// Seconds from a request's first byte to the end of its header.
    #[arg(long, env = "STILE_HEADER_TIMEOUT", allow_negative_numbers = true, default_value_t = ConnectionLimits::default().header.as_secs_f64())]
    header_timeout: f64,
    /// Seconds a request's body may take to arrive (only the time spent
    /// waiting for the client counts); past it, 408.
    #[arg(long, env = "STILE_BODY_TIMEOUT", allow_negative_numbers = true, default_value_t = ConnectionLimits::default().body.as_secs_f64())]
    body_timeout: f64,
    /// Seconds a write of an answer may make no progress (a client that does
    /// not read) before the connection is closed.
    #[arg(long, env = "STILE_SEND_TIMEOUT", allow_negative_numbers = true, default_value_t = ConnectionLimits::default().send.as_secs_f64())]
    send_timeout: f64,
    /// Seconds a request may wait for room among the requests in progress
    /// (`--max-held-mb`) before its body is read; past it, or when the
    /// requests already waiting would not all be let in within four fifths
    /// of it at the last second's rate, it is answered 503 with
    /// `Retry-After`.
    #[arg(long, env = "STILE_QUEUE_TIMEOUT", allow_negative_numbers = true, default_value_t = ConnectionLimits::default().queue.as_secs_f64())]
    queue_timeout: f64,
    /// Connections in the PostgreSQL pool of reads, configures and partition
    /// lookups (each shard has a pool of its own for its bundles).
    #[arg(long, env = "STILE_POOL_SIZE", default_value_t = 16)]
    pool_size: usize,
    /// Bundles each shard keeps in flight at once. Pushes that arrive
    /// meanwhile join the next bundle, so fewer, fuller bundles commit.
    /// Default: 1 when PostgreSQL answers within 2 ms at start, else 4 (a
    /// far database, where a bundle's round trip, not its commit, is the
    /// wait).
    #[arg(long, env = "STILE_BUNDLES_IN_FLIGHT")]
    bundles_in_flight: Option<usize>,
    /// Seconds a push waits for a partition's row lock that another session
    /// holds (PostgreSQL's `lock_timeout` on the shards' connections). Past
    /// it, that partition's pushes answer 503 and go to PostgreSQL on their
    /// own, one at a time, until one gets through, so that the other
    /// partitions of its shard keep flowing.
    #[arg(long, env = "STILE_LOCK_TIMEOUT", allow_negative_numbers = true, default_value_t = WorkerConfig::default().lock_timeout.as_secs_f64())]
    lock_timeout: f64,
    /// Where each shard's worker runs: `serving`, a task of the runtime that
    /// serves HTTP (a request reaches its shard without waking another
    /// thread), or `thread`, a thread of its own.
    #[arg(long, env = "STILE_SHARD_PLACEMENT", value_enum, default_value = "serving")]
    shard_placement: ShardPlacement,
    /// Most MiB that requests in progress may hold; past it, new requests
    /// wait with their bodies unread. Default: a quarter of the cache budget,
    /// and at least 64.
    #[arg(long, env = "STILE_MAX_HELD_MB")]
    max_held_mb: Option<u64>,
    /// Seconds in-flight requests may take to finish once SIGTERM or SIGINT
    /// has stopped the gateway accepting; past them, the connections still
    /// open are closed. A second signal exits at once.
    #[arg(long, env = "STILE_SHUTDOWN_TIMEOUT", allow_negative_numbers = true, default_value_t = 30.0)]
    shutdown_timeout: f64,
    /// Seconds between retention purges.
    #[arg(long, env = "STILE_PURGE_SECONDS", default_value_t = 60)]
    purge_seconds: u64,
    /// Fault injection for tests: guest calls per million that trap.
    #[arg(long, env = "STILE_INJECT_GUEST_TRAPS_PER_MILLION", default_value_t = 0, hide = true)]
    inject_guest_traps_per_million: u32,
    /// Fault injection for tests: once the shards have started, no cache
    /// instance can be made again.
    #[arg(long, env = "STILE_INJECT_INSTANCE_REFUSALS", default_value_t = false, hide = true)]
    inject_instance_refusals: bool,
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_target(false)
        .init();
    let args = match Cli::parse().command {
        Command::Serve(args) => *args,
        Command::Migrate(args) => return migrate(&args.database_url),
    };
    let config = ServeConfig {
        listen: args.listen,
        tls: args.tls_cert.zip(args.tls_key).map(|(cert, key)| ListenerTls { cert, key }),
        database_url: args.database_url,
        shards: args.shards.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        cache_mb: args.cache_mb,
        engine: args.engine,
        http: HttpConfig {
            body_limit: args.body_limit,
            max_items: args.max_items,
            bearer_token: args.bearer_token,
            cors_origins: args.cors_origins.into_iter().map(|o| o.trim().to_owned()).filter(|o| !o.is_empty()).collect(),
            allowed_hosts: stile::http::allowed_hosts::AllowedHosts::new(args.allowed_hosts),
            answer_limit: args.answer_limit,
            limits: ConnectionLimits {
                idle: seconds("--idle-timeout", args.idle_timeout),
                header: seconds("--header-timeout", args.header_timeout),
                body: seconds("--body-timeout", args.body_timeout),
                send: seconds("--send-timeout", args.send_timeout),
                queue: seconds("--queue-timeout", args.queue_timeout),
            },
        },
        pool_size: args.pool_size,
        bundles_in_flight: args.bundles_in_flight,
        lock_timeout: seconds("--lock-timeout", args.lock_timeout),
        shard_placement: args.shard_placement,
        max_held_bytes: args.max_held_mb.unwrap_or((args.cache_mb / 4).max(64)).saturating_mul(1 << 20),
        purge_every: Duration::from_secs(args.purge_seconds.max(1)),
        inject_guest_traps_per_million: args.inject_guest_traps_per_million,
        inject_instance_refusals: args.inject_instance_refusals,
        shutdown_timeout: seconds("--shutdown-timeout", args.shutdown_timeout),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("start the tokio runtime");
    runtime.spawn(collect_freed_memory());
    let served = runtime.block_on(serve(config, shutdown_signal()));
    // What is left (a shard worker's thread that outlived the shutdown's
    // bounds, a connection's last drop) must not hold the exit.
    runtime.shutdown_timeout(RUNTIME_GRACE);
    match served {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("stile: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// `stile migrate`: the schema migrated, and its version printed.
fn migrate(database_url: &str) -> std::process::ExitCode {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("start the tokio runtime");
    match runtime.block_on(stile::server::migrate(database_url)) {
        Ok(version) => {
            println!("schema version {version}");
            std::process::ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("stile: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// A time limit given in seconds; one that is not a positive number of
/// seconds ends the program with a message naming the flag.
fn seconds(flag: &str, value: f64) -> Duration {
    match Duration::try_from_secs_f64(value) {
        Ok(limit) if !limit.is_zero() => limit,
        _ => {
            eprintln!("stile: {flag}: expected a positive number of seconds, got {value}");
            std::process::exit(2);
        }
    }
}

/// A signal that stops the gateway.
#[derive(Clone, Copy, Debug)]
enum Stop {
    Terminate,
    Interrupt,
}

impl Stop {
    fn name(self) -> &'static str {
        match self {
            Stop::Terminate => "SIGTERM",
            Stop::Interrupt => "SIGINT",
        }
    }

    /// The exit status of a program this signal ended: 128 and the
    /// signal's number, as shells report it.
    fn exit_code(self) -> i32 {
        match self {
            Stop::Terminate => 128 + 15,
            Stop::Interrupt => 128 + 2,
        }
    }
}

/// SIGTERM and SIGINT (Ctrl-C). Once listened for, they no longer end the
/// process by themselves; both stay listened for until the exit, so that a
/// second one is caught however soon it follows the first. A signal that
/// cannot be listened for never arrives.
#[derive(Debug)]
struct Signals {
    #[cfg(unix)]
    terminate: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    interrupt: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    #[cfg(unix)]
    fn listen() -> Signals {
        use tokio::signal::unix::{SignalKind, signal};
        Signals { terminate: signal(SignalKind::terminate()).ok(), interrupt: signal(SignalKind::interrupt()).ok() }
    }

    #[cfg(not(unix))]
    fn listen() -> Signals {
        Signals {}
    }

    /// Waits for the next signal.
    #[cfg(unix)]
    async fn next(&mut self) -> Stop {
        async fn recv(signal: &mut Option<tokio::signal::unix::Signal>) {
            if let Some(signal) = signal
                && signal.recv().await.is_some()
            {
                return;
            }
            std::future::pending().await
        }
        tokio::select! {
            () = recv(&mut self.terminate) => Stop::Terminate,
            () = recv(&mut self.interrupt) => Stop::Interrupt,
        }
    }

    /// Waits for the next signal.
    #[cfg(not(unix))]
    async fn next(&mut self) -> Stop {
        match tokio::signal::ctrl_c().await {
            Ok(()) => Stop::Interrupt,
            Err(_) => std::future::pending().await,
        }
    }
}

/// Resolves on SIGTERM or SIGINT; from then on, a second one ends the
/// process at once. The signals are listened for from the first poll, when
/// the gateway starts serving: until then (connecting to the database,
/// migrating) a signal ends the process as it would any other.
async fn shutdown_signal() {
    let mut signals = Signals::listen();
    signals.next().await;
    tokio::spawn(async move {
        let second = signals.next().await;
        tracing::warn!("{} during the shutdown: exiting at once, with status {}", second.name(), second.exit_code());
        std::process::exit(second.exit_code());
    });
}
