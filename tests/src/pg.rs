//! Fresh PostgreSQL databases for tests.
//!
//! [`TestDb::new`] creates a database `stile_t_<random>` on the server named
//! by `STILE_TEST_DATABASE_URL` (libpq keyword/value or URI form; empty or
//! unset: libpq's defaults and `PG*` variables, as the gateway reads them),
//! applies the migrations, and drops the database (`WITH (FORCE)`) when the
//! `TestDb` is dropped, even if the test panicked.

use std::future::Future;
use std::time::Duration;

use stile::db::{Db, DbConfig, DbError};
use stile::payload::Payload;

/// The environment variable naming the server tests create databases on.
pub const URL_VAR: &str = "STILE_TEST_DATABASE_URL";

/// Connection settings of the test server's `postgres` database.
pub fn admin_config() -> DbConfig {
    let url = std::env::var(URL_VAR).unwrap_or_default();
    let mut cfg = DbConfig::parse(&url).unwrap_or_else(|e| panic!("{URL_VAR}: {e}"));
    cfg.pg.dbname("postgres");
    cfg.pg.connect_timeout(Duration::from_secs(10));
    cfg
}

/// Opens a connection outside any pool, as the gateway opens its own (TLS as
/// `cfg` says; its driver runs on a spawned task).
pub async fn connect(cfg: &DbConfig) -> Result<tokio_postgres::Client, DbError> {
    cfg.connect().await
}

/// A database of its own for one test, dropped with it.
#[derive(Debug)]
pub struct TestDb {
    /// A pool on the database (10 connections unless asked otherwise).
    pub db: Db,
    name: String,
    config: DbConfig,
}

impl TestDb {
    /// A fresh database with the schema migrated.
    pub async fn new() -> TestDb {
        TestDb::with_pool(10).await
    }

    /// A fresh, migrated database with a pool of `pool_size` connections.
    pub async fn with_pool(pool_size: usize) -> TestDb {
        let t = TestDb::unmigrated(pool_size).await;
        t.db.migrate().await.expect("migrate a fresh database");
        t
    }

    /// A fresh, empty database (no `stile` schema yet).
    pub async fn unmigrated(pool_size: usize) -> TestDb {
        let admin = admin_config();
        let name = format!("stile_t_{:016x}", rand::random::<u64>());
        let client = connect(&admin).await.unwrap_or_else(|e| panic!("connect to {}: {e}", admin.to_url(false)));
        client
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .await
            .unwrap_or_else(|e| panic!("create database {name}: {e}"));
        drop(client);
        let mut config = admin.clone();
        config.pg.dbname(&name);
        // From here on, a failure drops the database again.
        let guard = DropGuard { name: Some(name.clone()) };
        let db = Db::from_config(config.clone(), pool_size).await.unwrap_or_else(|e| panic!("connect to {name}: {e}"));
        std::mem::forget(guard);
        TestDb { db, name, config }
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A connection string for the database (keyword/value form, password
    /// included), e.g. for a gateway process.
    pub fn url(&self) -> String {
        self.config.to_url(true)
    }

    /// The connection settings of the database.
    pub fn config(&self) -> &DbConfig {
        &self.config
    }

    /// A connection of its own, outside the pool.
    pub async fn client(&self) -> tokio_postgres::Client {
        connect(&self.config).await.unwrap_or_else(|e| panic!("connect to {}: {e}", self.name))
    }

    /// Waits, polling `pg_stat_activity`, until at least `count` of the
    /// database's backends wait for a lock: the point a test that orders
    /// lock waits has reached. Panics naming `what` after 20 s.
    pub async fn wait_for_lock_waiters(&self, count: i64, what: &str) {
        let observer = self.client().await;
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let row = observer
                .query_one(
                    "SELECT count(*) AS waiting FROM pg_stat_activity \
                      WHERE datname = current_database() AND wait_event_type = 'Lock'",
                    &[],
                )
                .await
                .expect("read pg_stat_activity");
            if row.get::<_, i64>("waiting") >= count {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "{what}: fewer than {count} backends wait for a lock");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The server processes of the connections named `application_name`, for
/// benchmarks that charge CPU to the backends of one pool.
pub async fn backend_pids(client: &tokio_postgres::Client, application_name: &str) -> Vec<i32> {
    client
        .query("SELECT pid FROM pg_stat_activity WHERE application_name = $1", &[&application_name])
        .await
        .expect("read pg_stat_activity")
        .iter()
        .map(|row| row.get("pid"))
        .collect()
}

/// Runs `work` to its end, or until Ctrl-C or SIGTERM, and answers whether
/// it ended. Interrupted, `work` is dropped here, and with it what it owns:
/// a benchmark stopped by hand drops its database and stops its gateway
/// processes instead of leaving them behind.
pub async fn unless_interrupted(work: impl Future<Output = ()>) -> bool {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate()).expect("a SIGTERM handler");
    tokio::select! {
        () = work => true,
        _ = tokio::signal::ctrl_c() => false,
        _ = terminate.recv() => false,
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        self.db.pool().close();
        drop_database(&self.name);
    }
}

struct DropGuard {
    name: Option<String>,
}

impl Drop for DropGuard {
    fn drop(&mut self) {
        if let Some(name) = self.name.take() {
            drop_database(&name);
        }
    }
}

/// Drops a test database, terminating its connections, from a thread of its
/// own (so it works from inside or outside a runtime, and while unwinding).
fn drop_database(name: &str) {
    let name = name.to_string();
    let done = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime to drop the test database");
        rt.block_on(async {
            match connect(&admin_config()).await {
                Ok(client) => {
                    if let Err(e) = client.batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)")).await {
                        eprintln!("warning: could not drop test database {name}: {e}");
                    }
                }
                Err(e) => eprintln!("warning: could not drop test database {name}: {e}"),
            }
        });
    });
    let _ = done.join();
}

/// A segment for `partition_id` with one message per transactionId (payload
/// `{"txn": <id>}`, fresh UUIDv7 message ids).
pub fn segment(
    partition_id: i64,
    transaction_ids: &[&str],
    p_verified: i64,
    planned_window_seconds: i32,
) -> stile::db::SegmentPush {
    stile::db::SegmentPush {
        partition_id,
        p_verified,
        planned_window_seconds,
        hashes: transaction_ids.iter().flat_map(|t| stile::hash::txn_hash(t)).collect(),
        message_ids: transaction_ids.iter().map(|_| uuid::Uuid::now_v7()).collect(),
        transaction_ids: transaction_ids.iter().map(|&t| bytestring::ByteString::from(t)).collect(),
        payloads: transaction_ids.iter().map(|t| Payload::from(&serde_json::json!({ "txn": t }))).collect(),
        hash_floors: None,
        replays: false,
    }
}

/// A partition's stored state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartitionState {
    /// The partition's `last_offset`.
    pub last_offset: i64,
    /// The partition's `txns_start`.
    pub txns_start: i64,
    /// How many segment rows it holds.
    pub segments: i64,
    /// How many txns rows it holds.
    pub txns: i64,
}

/// A partition's stored state.
pub async fn partition_state(client: &tokio_postgres::Client, partition_id: i64) -> PartitionState {
    let row = client
        .query_one(
            "SELECT p.last_offset, p.txns_start, \
                    (SELECT count(*) FROM stile.segments s WHERE s.partition_id = p.id) AS segments, \
                    (SELECT count(*) FROM stile.txns t WHERE t.partition_id = p.id) AS txns \
             FROM stile.partitions p WHERE p.id = $1",
            &[&partition_id],
        )
        .await
        .expect("read a partition's state");
    PartitionState {
        last_offset: row.get("last_offset"),
        txns_start: row.get("txns_start"),
        segments: row.get("segments"),
        txns: row.get("txns"),
    }
}
