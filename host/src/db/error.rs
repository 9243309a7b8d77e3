//! Errors of the database layer, split by what the gateway does about them.

use std::error::Error as _;

use tokio_postgres::error::SqlState;

/// An error of [`Db`](super::Db).
///
/// [`DbError::is_unavailable`] tells the gateway's two cases apart: the
/// database could not be reached or gave up on the transaction (answer 503; a
/// retried push is safe, because nothing was committed or a retry is
/// deduplicated), or anything else (a bug, bad input that slipped through).
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// Connection refused, closed or timed out, pool exhausted or closed,
    /// server shutting down or out of resources, transaction aborted by a
    /// deadlock or serialization failure.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// A lock the statement needed was held elsewhere for longer than the
    /// connection's `lock_timeout` (55P03): nothing was committed, and the
    /// same call may be retried once the holder lets go.
    #[error("database unavailable: {0}")]
    LockTimeout(String),
    /// PostgreSQL refused the statement.
    #[error("database error{}: {message}", code.as_deref().map(|c| format!(" {c}")).unwrap_or_default())]
    Postgres {
        /// The SQLSTATE, when PostgreSQL sent one.
        code: Option<String>,
        /// The server's message (and detail/hint), or the client's.
        message: String,
    },
    /// The connection string could not be used.
    #[error("invalid database configuration: {0}")]
    Config(String),
    /// The caller passed something the layer refuses before any I/O.
    #[error("invalid input: {0}")]
    Invalid(String),
    /// A partition id or name the database does not know.
    #[error("not found: {0}")]
    NotFound(String),
    /// An answer would be larger than the caller allows.
    #[error("{0}")]
    TooLarge(String),
    /// The database answered in a shape this layer does not expect.
    #[error("unexpected answer from the database: {0}")]
    Protocol(String),
}

/// The SQLSTATE under which a read's SQL (`stile.kv_apply`, the timers'
/// page) refuses an answer past the bound it was given.
pub const ANSWER_TOO_LARGE: &str = "SK002";

impl DbError {
    /// True when the database is unreachable or aborted the transaction for a
    /// transient reason: answer 503, and retrying is safe.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, DbError::Unavailable(_) | DbError::LockTimeout(_))
    }

    /// True when a lock wait outlasted `lock_timeout`: someone else holds a
    /// row or a table the statement needed.
    pub fn is_lock_timeout(&self) -> bool {
        matches!(self, DbError::LockTimeout(_))
    }

    /// True when a read's answer would pass the bound its call was given:
    /// the SQL raised [`ANSWER_TOO_LARGE`].
    pub fn is_answer_too_large(&self) -> bool {
        self.sqlstate() == Some(ANSWER_TOO_LARGE)
    }

    /// The SQLSTATE of a PostgreSQL error, if any.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            DbError::Postgres { code, .. } => code.as_deref(),
            _ => None,
        }
    }
}

/// SQLSTATEs after which nothing was committed and the same call may simply
/// be retried later.
fn transient(code: &SqlState) -> bool {
    let c = code.code();
    c.starts_with("08") // connection exception
        || c.starts_with("53") // insufficient resources (too many connections, disk full, OOM)
        || c.starts_with("57P") // admin / crash shutdown, cannot connect now, database dropped
        || c.starts_with("58") // system error (I/O)
        || *code == SqlState::T_R_SERIALIZATION_FAILURE
        || *code == SqlState::T_R_DEADLOCK_DETECTED
        || *code == SqlState::QUERY_CANCELED
        || *code == SqlState::READ_ONLY_SQL_TRANSACTION // a standby after a failover
}

fn render_db_error(e: &tokio_postgres::error::DbError) -> String {
    let mut s = e.message().to_string();
    if let Some(d) = e.detail() {
        s.push_str(" (");
        s.push_str(d);
        s.push(')');
    }
    if let Some(h) = e.hint() {
        s.push_str("; hint: ");
        s.push_str(h);
    }
    s
}

fn render_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(inner) = cur {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        cur = inner.source();
    }
    s
}

impl From<tokio_postgres::Error> for DbError {
    fn from(e: tokio_postgres::Error) -> Self {
        if let Some(db) = e.as_db_error() {
            let message = render_db_error(db);
            return if *db.code() == SqlState::LOCK_NOT_AVAILABLE {
                DbError::LockTimeout(format!("{} ({})", message, db.code().code()))
            } else if transient(db.code()) {
                DbError::Unavailable(format!("{} ({})", message, db.code().code()))
            } else {
                DbError::Postgres { code: Some(db.code().code().to_string()), message }
            };
        }
        let io = e.source().is_some_and(|s| s.downcast_ref::<std::io::Error>().is_some());
        // tokio_postgres keeps its error kinds private; its Display names them.
        let head = e.to_string();
        let connection_level = matches!(
            head.as_str(),
            "error communicating with the server"
                | "connection closed"
                | "error connecting to server"
                | "timeout waiting for server"
                | "error performing TLS handshake"
                | "unexpected message from server"
                | "error parsing response from server"
        );
        if e.is_closed() || io || connection_level {
            DbError::Unavailable(render_chain(&e))
        } else {
            DbError::Postgres { code: None, message: render_chain(&e) }
        }
    }
}

impl From<deadpool_postgres::PoolError> for DbError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        use deadpool_postgres::PoolError;
        match e {
            PoolError::Backend(e) => DbError::from(e),
            PoolError::Timeout(t) => DbError::Unavailable(format!("timed out waiting for a connection ({t:?})")),
            PoolError::Closed => DbError::Unavailable("the connection pool is closed".into()),
            PoolError::NoRuntimeSpecified => DbError::Config("the connection pool has no runtime".into()),
            PoolError::PostCreateHook(e) => DbError::Unavailable(e.to_string()),
        }
    }
}

impl DbError {
    /// A short, stable label of the error's kind.
    pub fn kind(&self) -> &'static str {
        match self {
            DbError::Unavailable(_) => "unavailable",
            DbError::LockTimeout(_) => "lock_timeout",
            DbError::Postgres { .. } => "postgres",
            DbError::Config(_) => "config",
            DbError::Invalid(_) => "invalid",
            DbError::NotFound(_) => "not_found",
            DbError::TooLarge(_) => "too_large",
            DbError::Protocol(_) => "protocol",
        }
    }
}
