//! Versioned, idempotent migrations of the `stile` schema.

use deadpool_postgres::GenericClient;

use super::DbError;

/// One migration: a version, a name and the SQL applied in one transaction.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// Applied in ascending order; recorded in `stile.schema_migrations`.
    pub version: i32,
    /// A short name, recorded beside the version.
    pub name: &'static str,
    /// The SQL, as in `host/sql/migrations/`.
    pub sql: &'static str,
}

/// The migrations this build knows, in order.
pub const MIGRATIONS: &[Migration] = &[
    Migration { version: 1, name: "schema", sql: include_str!("../../sql/migrations/0001_schema.sql") },
    // Version 2 applied the functions once; they are now their own step,
    // after every versioned migration. The version stays, so that the
    // numbering of databases migrated before and after agrees.
    Migration { version: 2, name: "functions", sql: "" },
    Migration { version: 3, name: "kv and timers", sql: include_str!("../../sql/migrations/0003_kv_timers.sql") },
    Migration { version: 4, name: "log", sql: include_str!("../../sql/migrations/0004_log.sql") },
    Migration { version: 5, name: "partition window", sql: include_str!("../../sql/migrations/0005_partition_window.sql") },
    Migration { version: 6, name: "timer sizes", sql: include_str!("../../sql/migrations/0006_timer_sizes.sql") },
    Migration { version: 7, name: "bounded reads", sql: include_str!("../../sql/migrations/0007_bounded_reads.sql") },
    Migration { version: 8, name: "committed verdict", sql: include_str!("../../sql/migrations/0008_committed_verdict.sql") },
    Migration { version: 9, name: "distributable", sql: include_str!("../../sql/migrations/0009_distributable.sql") },
];

/// The functions (and views) the gateway and its readers use. Unlike the
/// schema they are applied after every versioned migration, whenever their
/// text changes: a database migrated by an older build gets this build's
/// push function, not just the tables it lacks, and a function a later
/// migration drops is back on a fresh database too. Each applied text is
/// recorded by its checksum in `stile.function_sets`. (On a fresh database
/// the versioned migrations run before any function exists: one that drops
/// a function says `IF EXISTS`.)
pub const FUNCTIONS: &str = concat!(
    include_str!("../../sql/functions/partitions.sql"),
    include_str!("../../sql/functions/push.sql"),
    include_str!("../../sql/functions/configure.sql"),
    include_str!("../../sql/functions/reads.sql"),
    include_str!("../../sql/functions/retention.sql"),
    include_str!("../../sql/functions/kv.sql"),
    include_str!("../../sql/functions/timers.sql"),
);

/// The key of the transaction-scoped advisory lock that serialises
/// migrators ("stile" in ASCII).
const LOCK_KEY: i64 = 0x0073_7469_6c65;

const BOOTSTRAP: &str = "CREATE SCHEMA IF NOT EXISTS stile; \
     CREATE TABLE IF NOT EXISTS stile.schema_migrations ( \
         version integer PRIMARY KEY, \
         name text NOT NULL, \
         applied_at timestamptz NOT NULL DEFAULT now()); \
     CREATE TABLE IF NOT EXISTS stile.function_sets ( \
         checksum text PRIMARY KEY, \
         applied_at timestamptz NOT NULL DEFAULT now())";

pub(super) async fn run(client: &mut deadpool_postgres::Client, migrations: &[Migration]) -> Result<(), DbError> {
    // Up to date already: nothing to lock (and no CREATE privilege needed).
    let latest = migrations.last().map_or(0, |m| m.version);
    if version(client).await? >= latest && functions_current(client).await? {
        return Ok(());
    }
    for (i, m) in migrations.iter().enumerate() {
        let tx = migrating(client).await?;
        tx.batch_execute(BOOTSTRAP).await?;
        let done = tx.query_opt("SELECT 1 FROM stile.schema_migrations WHERE version = $1", &[&m.version]).await?.is_some();
        if !done {
            apply(&tx, &format!("{} ({})", m.version, m.name), m.sql).await?;
            tx.execute("INSERT INTO stile.schema_migrations (version, name) VALUES ($1, $2)", &[&m.version, &m.name]).await?;
            // The last migration commits together with this build's
            // functions: the previous build's functions, which gateways of
            // both builds call during an upgrade, never run against the
            // schema it changed (a column added to a table they read with
            // `*` would shift what they read).
            if i + 1 == migrations.len() {
                apply_functions(&tx).await?;
            }
        }
        tx.commit().await?;
    }
    let tx = migrating(client).await?;
    let migrated_to = version(&tx).await?;
    if migrated_to > latest {
        // A later build migrated this database, and its functions are in
        // place: they keep the signatures of the build before it, which
        // this one calls, and this build's would take back what that
        // build's schema relies on. An operator rolling gateways forward one
        // at a time, or back, leaves them alone.
        tracing::info!(migrated_to, latest, "the database was migrated by a later build; its functions stay in place");
        tx.commit().await?;
        return Ok(());
    }
    apply_functions(&tx).await?;
    tx.commit().await?;
    Ok(())
}

/// Applies this build's functions in `tx` unless they are on record already,
/// and records them.
async fn apply_functions(tx: &tokio_postgres::Transaction<'_>) -> Result<(), DbError> {
    let checksum = checksum(FUNCTIONS);
    let recorded = tx.query_opt("SELECT 1 FROM stile.function_sets WHERE checksum = $1", &[&checksum]).await?.is_some();
    if !recorded {
        apply(tx, "functions", FUNCTIONS).await?;
        tx.execute("INSERT INTO stile.function_sets (checksum) VALUES ($1)", &[&checksum]).await?;
    }
    Ok(())
}

/// A migration's transaction, once it holds the migrators' lock (waiting for
/// any other migrator; released by COMMIT or ROLLBACK). It keeps
/// PostgreSQL's notices to itself: every `IF NOT EXISTS` and `IF EXISTS`
/// that finds nothing to do says so, which on every start of a gateway is
/// noise in its log, not news.
async fn migrating(client: &mut deadpool_postgres::Client) -> Result<deadpool_postgres::Transaction<'_>, DbError> {
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK_KEY]).await?;
    tx.batch_execute("SET LOCAL client_min_messages = warning").await?;
    Ok(tx)
}

/// Runs one migration's SQL, naming it in the error.
async fn apply(tx: &tokio_postgres::Transaction<'_>, name: &str, sql: &str) -> Result<(), DbError> {
    tx.batch_execute(sql).await.map_err(|e| match DbError::from(e) {
        DbError::Postgres { code, message } => DbError::Postgres { code, message: format!("migration {name}: {message}") },
        other => other,
    })
}

/// Whether this build's functions are the ones installed.
async fn functions_current(client: &tokio_postgres::Client) -> Result<bool, DbError> {
    let exists: bool =
        client.query_one("SELECT to_regclass('stile.function_sets') IS NOT NULL AS exists", &[]).await?.try_get("exists")?;
    if !exists {
        return Ok(false);
    }
    let row = client.query_opt("SELECT 1 FROM stile.function_sets WHERE checksum = $1", &[&checksum(FUNCTIONS)]).await?;
    Ok(row.is_some())
}

/// The checksum recorded for an applied function set: xxh3-64 of its text.
fn checksum(sql: &str) -> String {
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(sql.as_bytes()))
}

pub(super) async fn version(client: &impl GenericClient) -> Result<i32, DbError> {
    let exists: bool =
        client.query_one("SELECT to_regclass('stile.schema_migrations') IS NOT NULL AS exists", &[]).await?.try_get("exists")?;
    if !exists {
        return Ok(0);
    }
    Ok(client
        .query_one("SELECT coalesce(max(version), 0) AS version FROM stile.schema_migrations", &[])
        .await?
        .try_get("version")?)
}
