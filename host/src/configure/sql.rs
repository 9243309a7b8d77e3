//! Configure's calls: `stile.configure` and `stile.queue_options_of`
//! (`host/sql/functions/configure.sql`).

use serde_json::Value;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Json;

use crate::db::{Db, DbError};

/// How [`Db::configure`] treats the options a call leaves out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ConfigureMode {
    /// Omitted options keep their stored values.
    #[default]
    Merge,
    /// Omitted options are reset to their defaults.
    Replace,
}

/// An error of [`Db::configure`].
#[derive(Debug, thiserror::Error)]
pub enum ConfigureError {
    /// A refused key or value; nothing was written. The message starts with
    /// the offending key (`options` when the options are not an object,
    /// `queue` for a bad queue name): `"dedupWindowSeconds: must not be
    /// negative, got -1"`.
    #[error("{0}")]
    Invalid(String),
    /// The database failed.
    #[error(transparent)]
    Db(#[from] DbError),
}

impl ConfigureError {
    pub(crate) fn from_pg(e: tokio_postgres::Error) -> Self {
        if let Some(db) = e.as_db_error() {
            if *db.code() == SqlState::INVALID_PARAMETER_VALUE {
                // stile.check_option's messages start with the key.
                return ConfigureError::Invalid(db.message().to_string());
            }
            if *db.code() == SqlState::CHECK_VIOLATION && db.constraint().is_some_and(|c| c.starts_with("queues_name")) {
                return ConfigureError::Invalid("queue: a queue name is 1 to 255 bytes without control characters".into());
            }
        }
        ConfigureError::Db(DbError::from(e))
    }
}

impl Db {
    /// Configures a queue (creating it from defaults if needed) and returns
    /// its stored options, camelCase: `dedupWindowSeconds`,
    /// `retentionSeconds` and Queen's `leaseTime`, `retryLimit`, `priority`,
    /// `delayedProcessing`, `windowBuffer`, `maxSize`,
    /// `completedRetentionSeconds`, `encryptionEnabled`, `namespace`, `task`.
    /// An explicit `null` restores a key's default; [`ConfigureMode::Replace`]
    /// resets every omitted key. An unknown key or a bad value is refused,
    /// naming the key, and nothing is written.
    pub async fn configure(
        &self,
        queue: &str,
        options: &serde_json::Map<String, Value>,
        mode: ConfigureMode,
    ) -> Result<Value, ConfigureError> {
        let client = self.pool().get().await.map_err(DbError::from)?;
        let stmt = client.prepare_cached("SELECT stile.configure($1, $2, $3) AS options").await.map_err(DbError::from)?;
        let replace = mode == ConfigureMode::Replace;
        let row = client.query_one(&stmt, &[&queue, &Json(options), &replace]).await.map_err(ConfigureError::from_pg)?;
        let Json(v): Json<Value> = row.try_get("options").map_err(DbError::from)?;
        Ok(v)
    }

    /// A queue's stored options, or `None` if the queue does not exist.
    pub async fn queue_options(&self, queue: &str) -> Result<Option<Value>, DbError> {
        let client = self.pool().get().await?;
        let stmt = client.prepare_cached("SELECT stile.queue_options_of($1)").await?;
        let options: Option<Json<Value>> = client.query_one(&stmt, &[&queue]).await?.try_get(0)?;
        Ok(options.map(|Json(options)| options))
    }
}
