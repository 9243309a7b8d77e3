//! Versioned, idempotent migrations of the `stile` schema.

use super::DbError;

/// One migration: a version, a name and the SQL applied in one transaction.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// Applied in ascending order; recorded in `stile.schema_migrations`.
    pub version: i32,
    /// A short name, recorded beside the version.
    pub name: &'static str,
    /// The SQL, as in `host/sql/`.
    pub sql: &'static str,
}

/// The migrations this build knows, in order.
pub const MIGRATIONS: &[Migration] = &[
    Migration { version: 1, name: "schema", sql: include_str!("../../sql/0001_schema.sql") },
    Migration { version: 2, name: "functions", sql: include_str!("../../sql/0002_functions.sql") },
];

/// The key of the transaction-scoped advisory lock that serialises
/// migrators ("stile" in ASCII).
const LOCK_KEY: i64 = 0x0073_7469_6c65;

const BOOTSTRAP: &str = "CREATE SCHEMA IF NOT EXISTS stile; \
     CREATE TABLE IF NOT EXISTS stile.schema_migrations ( \
         version integer PRIMARY KEY, \
         name text NOT NULL, \
         applied_at timestamptz NOT NULL DEFAULT now())";

pub(super) async fn run(client: &mut deadpool_postgres::Client) -> Result<(), DbError> {
    // Up to date already: nothing to lock (and no CREATE privilege needed).
    let latest = MIGRATIONS.last().map_or(0, |m| m.version);
    if version(client).await? >= latest {
        return Ok(());
    }
    for m in MIGRATIONS {
        let tx = client.transaction().await?;
        // Waits for any other migrator; released by COMMIT or ROLLBACK.
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK_KEY]).await?;
        tx.batch_execute(BOOTSTRAP).await?;
        let done = tx.query_opt("SELECT 1 FROM stile.schema_migrations WHERE version = $1", &[&m.version]).await?.is_some();
        if !done {
            tx.batch_execute(m.sql).await.map_err(|e| {
                let e = DbError::from(e);
                match e {
                    DbError::Postgres { code, message } => {
                        DbError::Postgres { code, message: format!("migration {} ({}): {message}", m.version, m.name) }
                    }
                    other => other,
                }
            })?;
            tx.execute("INSERT INTO stile.schema_migrations (version, name) VALUES ($1, $2)", &[&m.version, &m.name]).await?;
        }
        tx.commit().await?;
    }
    Ok(())
}

pub(super) async fn version(client: &tokio_postgres::Client) -> Result<i32, DbError> {
    let exists: bool = client.query_one("SELECT to_regclass('stile.schema_migrations') IS NOT NULL", &[]).await?.try_get(0)?;
    if !exists {
        return Ok(0);
    }
    Ok(client.query_one("SELECT coalesce(max(version), 0) FROM stile.schema_migrations", &[]).await?.try_get(0)?)
}
