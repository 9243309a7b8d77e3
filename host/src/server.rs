//! Start-up, serving and graceful shutdown of the gateway.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

use crate::cache::{EngineKind, ShardCache};
use crate::conn::TimedIo;
use crate::db::Db;
use crate::gateway::Gateway;
use crate::http::{App, HttpConfig};
use crate::intake::{Intake, IntakeConfig};
use crate::metrics::Metrics;
use crate::shard::{self, DbReading, ShardPlacement, WorkerConfig};
use crate::wasm::WasmEngine;

/// Everything `stile serve` is told.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    pub listen: SocketAddr,
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
    /// Bundles each shard keeps in flight at once.
    pub bundles_in_flight: usize,
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
}

/// Runs the gateway until `shutdown` resolves, then stops accepting, lets
/// in-flight requests and flushes finish, and returns.
pub async fn serve(config: ServeConfig, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let db = Db::connect(&config.database_url, config.pool_size)
        .await
        .with_context(|| format!("connect to the database {}", redacted_url(&config.database_url)))?;
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
    let mut handles = Vec::with_capacity(shards);
    let mut workers = Vec::with_capacity(shards);
    for id in 0..shards {
        let cache = ShardCache::new(config.engine, engine.as_ref(), cache_config)?;
        // A budget of 0 disables the cache: the guest's recent-use guard
        // would otherwise keep every busy partition's entry past it.
        let shard_config = WorkerConfig {
            hydrate: config.cache_mb > 0,
            max_in_flight: config.bundles_in_flight.max(1),
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
    tracing::info!(
        "stile listening on http://{local} (database {}, {shards} shards, engine {:?})",
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
    accept_until(listener, app, shutdown).await;
    purge.abort();
    kv_purge.abort();
    // The firer holds the gateway, and with it the shard handles: it must be
    // gone before the workers can finish. A fire cut short here rolls back
    // and its timers stay pending for the next gateway.
    firer.abort();
    let _ = firer.await;
    // The App (and with it every shard handle) is gone once the connections
    // have closed; the workers then finish their in-flight flushes and stop.
    for worker in workers {
        worker.join().await;
    }
    tracing::info!("stile stopped");
    Ok(())
}

/// The connection string as the gateway resolves it, password hidden, for
/// error messages (an unparsable one is already redacted by the error itself).
fn redacted_url(url: &str) -> String {
    match crate::db::pg_config(url) {
        Ok(config) => crate::db::config_to_url(&config, false),
        Err(_) => "(unparsable connection string)".to_owned(),
    }
}

/// The most a connection reads ahead of its handler. hyper's buffer grows
/// to 400 KiB on a connection that carries large bodies, and holds its
/// capacity (filled with the next body's first bytes) while the request
/// waits for the intake: thousands of waiting connections would hold
/// gigabytes outside the intake's bound. At 16 KiB, 4,096 waiting
/// connections hold 64 MiB; a body is read in 16 KiB steps, and no header
/// section may be larger.
const READ_BUFFER_BYTES: usize = 16 << 10;

async fn accept_until(listener: TcpListener, app: Arc<App>, shutdown: impl Future<Output = ()>) {
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        tracing::warn!(error = %error, "accept failed");
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let app = app.clone();
                let (io, phase) = TimedIo::new(stream, app.config.limits);
                let service = service_fn(move |request| crate::http::handle(app.clone(), request, peer, phase.clone()));
                let connection =
                    http1::Builder::new().max_buf_size(READ_BUFFER_BYTES).serve_connection(TokioIo::new(io), service);
                let connection = graceful.watch(connection);
                tokio::spawn(async move {
                    if let Err(error) = connection.await {
                        tracing::debug!(error = %error, "connection ended with an error");
                    }
                });
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    drop(app);
    if tokio::time::timeout(Duration::from_secs(30), graceful.shutdown()).await.is_err() {
        tracing::warn!("connections still open after 30 s; stopping anyway");
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
