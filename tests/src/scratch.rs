//! A PostgreSQL server of a test's own, for what the shared server cannot be
//! made to do (TLS on or off, client certificates required): a fresh data
//! directory in a temporary directory, on a free port of 127.0.0.1, with its
//! unix socket in that directory. Dropping it stops the server and removes
//! the directory; a test killed outright takes the server with it (see
//! [`crate::servers`]).

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use stile::db::DbConfig;

use crate::servers::{Home, Server, free_ports};

/// A server of a test's own.
#[derive(Debug)]
pub struct ScratchServer {
    server: Server,
    /// Declared last: removed after the server has been stopped.
    home: Home,
}

impl ScratchServer {
    /// A new data directory (`initdb`: trust authentication, UTF8, C), for a
    /// server not started yet, in a directory named after `purpose`.
    pub async fn init(purpose: &str) -> anyhow::Result<ScratchServer> {
        let home = Home::new(purpose, None)?;
        let server = Server::new(&home, "server", free_ports::<1>()?[0]);
        home.initdb(&server, &[]).await?;
        Ok(ScratchServer { server, home })
    }

    /// Writes a file beside the data directory, readable by the server's
    /// user alone, and answers its path: certificates, keys, `pg_hba.conf`.
    pub fn write_file(&self, name: &str, contents: &[u8]) -> anyhow::Result<PathBuf> {
        self.home.write_file(name, contents)
    }

    /// Starts the server with `settings` (`name=value`, as `postgres -c`
    /// takes them) and waits until it accepts connections. Spawns it from
    /// the calling thread, which it dies with: call it from the test's own
    /// thread (a `#[tokio::test]`'s body), never from a blocking task.
    pub async fn start(&self, settings: &[String]) -> anyhow::Result<()> {
        self.home.serve(&self.server, settings)?;
        self.home.ready(&self.server).await
    }

    /// The TCP port it listens on, on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.server.port
    }

    /// The directory of its unix socket (`.s.PGSQL.<port>`).
    pub fn socket_dir(&self) -> &Path {
        &self.home.dir
    }

    /// A plain connection over TCP to its database `dbname`, as `postgres`.
    pub fn admin_config(&self, dbname: &str) -> DbConfig {
        self.server.config(dbname)
    }

    /// Creates the database `name`.
    pub async fn create_database(&self, name: &str) -> anyhow::Result<()> {
        let admin = self.admin_config("postgres").connect().await?;
        admin.batch_execute(&format!("CREATE DATABASE \"{name}\"")).await.with_context(|| format!("create the database {name}"))
    }

    /// The last lines of the server's log, for messages.
    pub fn log_tail(&self) -> String {
        self.server.log_tail()
    }
}

impl Drop for ScratchServer {
    fn drop(&mut self) {
        self.server.stop_now();
    }
}
