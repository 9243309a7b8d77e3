//! Start-up, serving and graceful shutdown of the gateway.

mod streams;
pub mod tls;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use self::streams::StreamTasks;
use self::tls::{Acceptor, ListenerTls};

use crate::cache::{EngineKind, ShardCache};
use crate::db::{Db, DbConfig};
use crate::gateway::Gateway;
use crate::http::conn::TimedIo;
use crate::http::socket::{self, ClientWatch};
use crate::http::{App, HttpConfig};
use crate::intake::{Intake, IntakeConfig};
use crate::metrics::Metrics;
use crate::shard::{self, DbReading, ShardPlacement, ShardWorker, WorkerConfig};
use crate::wasm::WasmEngine;

/// Everything `stile serve` is told.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    pub listen: SocketAddr,
    /// HTTPS on the listener; `None` serves plain HTTP.
    pub tls: Option<ListenerTls>,
    /// A libpq URI or keyword string; empty for the PG* variables and libpq's
    /// defaults.
    pub database_url: String,
    pub shards: usize,
    /// The cache budget shared across shards, in MiB.
    pub cache_mb: u64,
    pub engine: EngineKind,
    pub http: HttpConfig,
    /// Connections in the pool of reads, configures and partition lookups.
    pub pool_size: usize,
    /// Bundles each shard keeps in flight at once; `None` chooses by the
    /// round trip to PostgreSQL at start ([`bundles_in_flight_for`]).
    pub bundles_in_flight: Option<usize>,
    /// The longest a push waits for a partition's row lock held elsewhere.
    pub lock_timeout: Duration,
    /// Where each shard's worker runs.
    pub shard_placement: ShardPlacement,
    /// The most bytes requests in progress may hold.
    pub max_held_bytes: u64,
    /// How often retention runs.
    pub purge_every: Duration,
    /// Guest calls per million that trap (fault tests only).
    pub inject_guest_traps_per_million: u32,
    /// Once the shards have started, no cache instance can be made again
    /// (fault tests only).
    pub inject_instance_refusals: bool,
    /// How long requests in flight may take to finish once shutdown starts;
    /// the connections still open then are closed.
    pub shutdown_timeout: Duration,
}

/// A round trip to PostgreSQL at or under this is near: one bundle in flight
/// per shard lets the next fill while it commits, and fewer, fuller bundles
/// cost PostgreSQL less per message.
const NEAR_ROUND_TRIP: Duration = Duration::from_millis(2);

/// Bundles in flight per shard in front of a far database, where a bundle's
/// round trip, not its commit, is what a push waits for: with one, a push
/// that arrives just after a bundle left waits for it to come back, and
/// then for its own (at 20 ms, 5,276 against 6,425 msg/s at one message per
/// request × 256 connections; bench/far/RESULTS.md).
const FAR_BUNDLES_IN_FLIGHT: usize = 4;

/// The bundles in flight per shard when none are configured, for PostgreSQL
/// `round_trip` away.
pub fn bundles_in_flight_for(round_trip: Duration) -> usize {
    if round_trip <= NEAR_ROUND_TRIP { WorkerConfig::default().max_in_flight } else { FAR_BUNDLES_IN_FLIGHT }
}

/// The shortest of a few round trips to PostgreSQL.
async fn round_trip(db: &Db) -> anyhow::Result<Duration> {
    let mut shortest = Duration::MAX;
    for _ in 0..3 {
        let asked = Instant::now();
        db.ping().await.context("reach PostgreSQL")?;
        shortest = shortest.min(asked.elapsed());
    }
    Ok(shortest)
}

/// Warns when the connections this gateway may open (its pool, and each
/// shard's own) outnumber those PostgreSQL has room for: under load, the
/// ones past it are refused ("too many clients"), and the pushes, reads and
/// hydrations that wanted them answer 503 or wait. A warning, not a
/// refusal: the pools open connections only as load asks for them, and
/// another client may close its own meanwhile.
async fn warn_if_past_connection_room(db: &Db, pool_size: usize, shards: usize, bundles_in_flight: usize) {
    let per_shard = shard::connections_per_shard(bundles_in_flight);
    let most = pool_size + shards * per_shard;
    let room = match db.connection_room().await {
        Ok(room) => room,
        Err(error) => {
            tracing::warn!(error = %error, "cannot read how many connections PostgreSQL has room for");
            return;
        }
    };
    // This gateway's own connections open now are among `room.open`.
    let free = room.free() + db.pool().status().size;
    if most > free {
        tracing::warn!(
            "this gateway may open up to {most} connections to PostgreSQL (--pool-size {pool_size} and {shards} shards × \
             {per_shard}), but the server has room for {free} (max_connections {}, {} reserved, {} open): under load the \
             connections past it are refused and their requests answered 503; lower --shards or --pool-size, or raise \
             max_connections",
            room.max_connections,
            room.reserved,
            room.open,
        );
    }
}

/// How long the shards may take, past the shutdown timeout, to finish the
/// bundles of the requests that were cut short. With [`RUNTIME_GRACE`] for
/// the runtime to stop, the gateway exits within 5 s of the shutdown timeout
/// whatever its clients and PostgreSQL do.
const FLUSH_GRACE: Duration = Duration::from_secs(3);

/// How long the runtime may take to stop its tasks once `serve` has
/// returned (see `main`).
pub const RUNTIME_GRACE: Duration = Duration::from_secs(1);

/// Migrates the schema of the database `database_url` names to this build's
/// and answers its version, as `serve` does before it listens.
pub async fn migrate(database_url: &str) -> anyhow::Result<i32> {
    let database = DbConfig::parse(database_url).context("the database URL")?;
    let shown = database.to_url(false);
    let db = Db::from_config(database, 1).await.with_context(|| format!("connect to the database {shown}"))?;
    db.migrate().await.with_context(|| format!("migrate the schema in {}", db.redacted_url()))?;
    Ok(db.schema_version().await?)
}

/// Runs the gateway until `shutdown` resolves, then stops accepting, lets
/// in-flight requests and flushes finish, and returns. Requests still in
/// flight after `config.shutdown_timeout` have their connections closed, and
/// the shards have [`FLUSH_GRACE`] more to finish their bundles.
pub async fn serve(config: ServeConfig, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let acceptor = config.tls.as_ref().map(Acceptor::from_files).transpose()?;
    let database = DbConfig::parse(&config.database_url).context("the database URL")?;
    let shown = database.to_url(false);
    let db = Db::from_config(database, config.pool_size).await.with_context(|| format!("connect to the database {shown}"))?;
    db.migrate().await.with_context(|| format!("migrate the schema in {}", db.redacted_url()))?;
    let metrics = Arc::new(Metrics::new());
    let engine = match config.engine {
        EngineKind::Wasm => {
            let engine = WasmEngine::new(crate::component::COMPONENT)?;
            engine.faults().trap_per_million.store(config.inject_guest_traps_per_million, std::sync::atomic::Ordering::Relaxed);
            Some(engine)
        }
        EngineKind::Native => None,
    };
    let shards = config.shards.max(1);
    let budget_bytes = config.cache_mb.saturating_mul(1 << 20) / shards as u64;
    let cache_config = stile_guest::ShardConfig { budget_bytes, skew_slack_ms: stile_guest::ShardConfig::DEFAULT_SKEW_SLACK_MS };
    // The caches judge age by PostgreSQL's clock, starting from this reading.
    let first = DbReading { db_ms: db.clock_ms().await.context("read PostgreSQL's clock")?, received: Instant::now() };
    let bundles_in_flight = match config.bundles_in_flight {
        Some(configured) => configured.max(1),
        None => {
            let round_trip = round_trip(&db).await?;
            let chosen = bundles_in_flight_for(round_trip);
            tracing::info!(
                "PostgreSQL is {:.1} ms away (round trip): {chosen} bundles in flight per shard",
                round_trip.as_secs_f64() * 1000.0
            );
            chosen
        }
    };
    warn_if_past_connection_room(&db, config.pool_size, shards, bundles_in_flight).await;
    let mut handles = Vec::with_capacity(shards);
    let mut workers = Vec::with_capacity(shards);
    for id in 0..shards {
        let cache = ShardCache::new(config.engine, engine.as_ref(), cache_config)?;
        // A budget of 0 disables the cache: the guest's recent-use guard
        // would otherwise keep every busy partition's entry past it.
        let shard_config = WorkerConfig {
            hydrate: config.cache_mb > 0,
            max_in_flight: bundles_in_flight,
            lock_timeout: config.lock_timeout,
            placement: config.shard_placement,
            ..WorkerConfig::default()
        };
        let (handle, worker) = shard::spawn(id, cache, &db, metrics.clone(), shard_config, first)?;
        handles.push(handle);
        workers.push(worker);
    }
    if let Some(engine) = &engine {
        engine.faults().refuse_instances.store(config.inject_instance_refusals, std::sync::atomic::Ordering::Relaxed);
    }
    let listener = TcpListener::bind(config.listen).await.with_context(|| format!("listen on {}", config.listen))?;
    let local = listener.local_addr()?;
    let scheme = if acceptor.is_some() { "https" } else { "http" };
    // Before the line that says the gateway listens: whoever waits for that
    // line has seen every warning of the start.
    if config.http.bearer_token.is_some() && acceptor.is_none() && !local.ip().is_loopback() {
        tracing::warn!(
            "the bearer token crosses the network in clear: the listener {local} is plain HTTP beyond loopback; give --tls-cert and --tls-key"
        );
    }
    tracing::info!(
        "stile listening on {scheme}://{local} (database {}, {shards} shards, engine {:?})",
        db.redacted_url(),
        config.engine
    );
    let purge = tokio::spawn(purge_loop(db.clone(), config.purge_every));
    let kv_purge = tokio::spawn(kv_purge_loop(db.clone(), metrics.clone()));
    let intake = Intake::new(
        IntakeConfig {
            limit_bytes: usize::try_from(config.max_held_bytes).unwrap_or(usize::MAX),
            queue_timeout: config.http.limits.queue,
        },
        metrics.intake_counters(),
    );
    let gateway = Arc::new(Gateway::new(db, handles, metrics));
    let wake = Arc::new(crate::timers::FirerWake::default());
    let firer = tokio::spawn(crate::timers::fire_loop(gateway.clone(), wake.clone()));
    let app = Arc::new(App { gateway, firer: wake, config: config.http.clone(), intake });
    let mut connections = accept_until(listener, app, acceptor, shutdown).await;
    let signalled = Instant::now();
    let drain_by = signalled + config.shutdown_timeout;
    let give_up_at = drain_by + FLUSH_GRACE;
    tracing::info!(
        "shutting down: no new connections; requests in flight have {} s to finish (connections open: {})",
        config.shutdown_timeout.as_secs_f64(),
        connections.open()
    );
    purge.abort();
    kv_purge.abort();
    connections.close(drain_by, give_up_at).await;
    // The firer holds the gateway, and with it the shard handles: it must be
    // gone before the workers can finish. A fire cut short here rolls back
    // and its timers stay pending for the next gateway.
    firer.abort();
    let _ = tokio::time::timeout_at(give_up_at.into(), firer).await;
    // Every shard handle is gone with the connections; the workers then
    // finish their in-flight flushes and stop. A flush that PostgreSQL holds
    // past the grace is abandoned: its transaction rolls back when the
    // process exits, and none of its requests was answered.
    let joined = futures::future::join_all(workers.into_iter().map(ShardWorker::join));
    if tokio::time::timeout_at(give_up_at.into(), joined).await.is_err() {
        tracing::warn!(
            "the shard workers had not finished their bundles {} s after the shutdown timeout; exiting without them",
            FLUSH_GRACE.as_secs_f64()
        );
    }
    tracing::info!("stile stopped, {:.1} s after the signal", signalled.elapsed().as_secs_f64());
    Ok(())
}

/// The most a connection reads ahead of its handler. hyper's buffer grows
/// to 400 KiB on a connection that carries large bodies, and holds its
/// capacity (filled with the next body's first bytes) while the request
/// waits for the intake: thousands of waiting connections would hold
/// gigabytes outside the intake's bound. At 16 KiB, 4,096 waiting
/// connections hold 64 MiB; a body is read in 16 KiB steps, and no header
/// section may be larger.
const READ_BUFFER_BYTES: usize = 16 << 10;

/// How many streams an HTTP/2 connection carries at once.
const HTTP2_STREAMS: u32 = 128;

/// How much of one stream's body an HTTP/2 connection reads ahead of its
/// handler (the window it grants), and of all its streams' together: what
/// a request waiting for room in the intake leaves unread in the socket.
const HTTP2_STREAM_WINDOW_BYTES: u32 = 64 << 10;
const HTTP2_CONNECTION_WINDOW_BYTES: u32 = 256 << 10;

/// The connections being served: a task each, kept to be aborted; hyper's
/// graceful shutdown, which closes those between requests; and the tasks of
/// their HTTP/2 streams, ended with them.
struct Connections {
    tasks: JoinSet<()>,
    graceful: GracefulShutdown,
    streams: StreamTasks,
}

impl Connections {
    /// How many are open.
    fn open(&mut self) -> usize {
        while self.tasks.try_join_next().is_some() {}
        self.tasks.len()
    }

    /// Closes the idle connections at once and lets the others finish their
    /// requests until `drain_by`; then aborts those still open, which drops
    /// their requests (and the shard handles they hold). Returns by
    /// `give_up_at` whatever the tasks do.
    async fn close(self, drain_by: Instant, give_up_at: Instant) {
        let Connections { mut tasks, graceful, streams } = self;
        let drained = tokio::time::timeout_at(drain_by.into(), async {
            graceful.shutdown().await;
            while tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            while tasks.try_join_next().is_some() {}
            tracing::warn!(
                "shutdown timeout: closing the connections whose requests did not finish (connections: {})",
                tasks.len()
            );
            tasks.abort_all();
            let aborted = async { while tasks.join_next().await.is_some() {} };
            if tokio::time::timeout_at(give_up_at.into(), aborted).await.is_err() {
                tracing::warn!("{} connection tasks did not stop when aborted; exiting without them", tasks.len());
            }
        }
        let left = streams.cancel(give_up_at).await;
        if left > 0 {
            tracing::warn!("{left} HTTP/2 stream tasks did not stop when cancelled; exiting without them");
        }
    }
}

/// How long the listener rests after a failed accept.
const ACCEPT_PAUSE: Duration = Duration::from_millis(50);

/// Accepts and serves connections until `shutdown` resolves: over TLS when
/// `acceptor` is given.
async fn accept_until(
    listener: TcpListener,
    app: Arc<App>,
    acceptor: Option<Acceptor>,
    shutdown: impl Future<Output = ()>,
) -> Connections {
    let mut connections =
        Connections { tasks: JoinSet::new(), graceful: GracefulShutdown::new(), streams: StreamTasks::default() };
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        // Out of file descriptors (or another resource), the
                        // next accept fails at once too: pausing keeps the
                        // loop from spinning and flooding the log while the
                        // open connections finish and free some.
                        tracing::warn!(error = %error, "accept failed; pausing accepts for {} ms", ACCEPT_PAUSE.as_millis());
                        tokio::time::sleep(ACCEPT_PAUSE).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let accepted = Accepted {
                    app: app.clone(),
                    peer,
                    watcher: connections.graceful.watcher(),
                    streams: connections.streams.clone(),
                };
                let acceptor = acceptor.clone();
                connections.tasks.spawn(accepted.serve(stream, acceptor));
            }
            // The tasks of closed connections are reaped as they end, so
            // that the set holds only the open ones.
            Some(_) = connections.tasks.join_next(), if !connections.tasks.is_empty() => {}
            () = &mut shutdown => break,
        }
    }
    connections
}

/// A connection accepted, with what serving it needs.
struct Accepted {
    app: Arc<App>,
    peer: SocketAddr,
    watcher: Watcher,
    streams: StreamTasks,
}

impl Accepted {
    /// Makes the TLS handshake, when there is one, and serves the
    /// connection's requests until it closes.
    async fn serve(self, stream: TcpStream, acceptor: Option<Acceptor>) {
        let (socket, client) = socket::share(stream);
        let Some(acceptor) = acceptor else {
            return self.serve_http(socket, client).await;
        };
        match acceptor.accept(socket, self.app.config.limits.header).await {
            Ok(tls) => self.serve_http(tls, client).await,
            Err(error) => tracing::debug!(peer = %self.peer, error = %error, "TLS handshake failed"),
        }
    }

    /// Serves HTTP/1.1, or HTTP/2 when the client's first bytes are its
    /// preface (chosen by ALPN, or by prior knowledge).
    async fn serve_http<T: AsyncRead + AsyncWrite + Unpin + Send + 'static>(self, io: T, client: ClientWatch) {
        let Accepted { app, peer: _, watcher, streams } = self;
        let (io, phase) = TimedIo::new(io, app.config.limits);
        let service = service_fn(move |request| crate::http::handle(app.clone(), request, phase.clone(), client.clone()));
        let mut builder = auto::Builder::new(streams);
        builder.http1().max_buf_size(READ_BUFFER_BYTES);
        builder
            .http2()
            .max_concurrent_streams(HTTP2_STREAMS)
            .initial_stream_window_size(HTTP2_STREAM_WINDOW_BYTES)
            .initial_connection_window_size(HTTP2_CONNECTION_WINDOW_BYTES)
            .max_header_list_size(READ_BUFFER_BYTES as u32);
        let connection = watcher.watch(builder.serve_connection(TokioIo::new(io), service));
        if let Err(error) = connection.await {
            tracing::debug!(error = %error, "connection ended with an error");
        }
    }
}

/// How often expired keys are deleted, and most deleted at once.
const KV_PURGE_EVERY: Duration = Duration::from_secs(5);
const KV_PURGE_BATCH: i32 = 10_000;

/// Deletes expired keys. They are never answered once expired; this only
/// reclaims their rows.
async fn kv_purge_loop(db: Db, metrics: Arc<Metrics>) {
    let mut ticker = tokio::time::interval(KV_PURGE_EVERY);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        loop {
            match crate::kv::purge(&db, KV_PURGE_BATCH).await {
                Ok(deleted) => {
                    metrics.kv_purged(deleted.max(0) as u64);
                    if deleted < i64::from(KV_PURGE_BATCH) {
                        break;
                    }
                }
                Err(error) => {
                    tracing::warn!(error = %error, "purging expired keys failed; retrying later");
                    break;
                }
            }
        }
    }
}

async fn purge_loop(db: Db, every: Duration) {
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if let Err(error) = db.purge().await {
            tracing::warn!(error = %error, "retention purge failed; retrying later");
        }
    }
}
