//! A replicated PostgreSQL of the checker's own, for the failover fault: a
//! primary and a standby streaming from it, each a server in one temporary
//! directory on a free port, with the primary's commits waiting for the
//! standby (`synchronous_standby_names` names it, `synchronous_commit=on`).
//!
//! The shared server the other tests use cannot be made a primary without
//! changing its configuration, so the checker makes its own pair, in a
//! [`Home`] of its own (see `servers.rs`: the user they run as, and how
//! nothing is left behind).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use super::now_us;
use crate::servers::{DATABASE, Home, READY_WITHIN, Server, free_ports};

/// The standby's `cluster_name`, which its WAL receiver gives the primary as
/// its application name, and so the name `synchronous_standby_names` waits
/// for.
const STANDBY_NAME: &str = "stile_standby";

/// A primary and its synchronous standby, stopped and removed on drop.
#[derive(Debug)]
pub(super) struct ReplicatedPair {
    pub(super) primary: Server,
    pub(super) standby: Server,
    /// Set once the standby has been promoted: it is the primary from then on.
    promoted: std::sync::atomic::AtomicBool,
    /// Declared last: dropped (its directory removed) after the servers
    /// have been stopped.
    home: Home,
}

/// When the failover fault stopped the primary and when the standby was
/// promoted, and how the standby stood just before.
#[derive(Clone, Debug)]
pub(super) struct FailoverTimes {
    /// The standby's `sync_state` in the primary's `pg_stat_replication`.
    pub(super) sync_state: String,
    /// How the primary's process ended.
    pub(super) primary_exit: String,
    pub(super) stopped_us: i64,
    pub(super) promoted_us: i64,
}

impl ReplicatedPair {
    /// Makes the primary, its database and the standby, and waits until the
    /// standby is synchronous. Spawns the servers from the calling thread
    /// (they die with it): call it from a thread that lasts the run, such as
    /// a runtime's worker.
    pub(super) async fn start() -> anyhow::Result<ReplicatedPair> {
        let home = Home::new("failover", None)?;
        let ports = free_ports::<2>()?;
        // From here on, a failure drops the pair, which stops its servers.
        let pair = ReplicatedPair {
            primary: Server::new(&home, "primary", ports[0]),
            standby: Server::new(&home, "standby", ports[1]),
            promoted: std::sync::atomic::AtomicBool::new(false),
            home,
        };

        pair.home.initdb(&pair.primary, &[]).await?;
        let synchronous = [format!("synchronous_standby_names={STANDBY_NAME}"), "synchronous_commit=on".to_owned()];
        pair.home.serve(&pair.primary, &synchronous)?;
        pair.home.ready(&pair.primary).await?;

        // The standby: a copy of the primary that streams from it
        // (`-R` writes `primary_conninfo` and `standby.signal`). Its own
        // settings name no synchronous standby, so that once promoted it
        // commits alone.
        let data = pair.standby.data().display().to_string();
        let port = pair.primary.port.to_string();
        pair.home
            .tool(
                "pg_basebackup",
                &["-D", &data, "-h", "127.0.0.1", "-p", &port, "-U", "postgres", "-R", "-c", "fast", "--no-sync"],
            )
            .await?;
        pair.home.serve(&pair.standby, &[format!("cluster_name={STANDBY_NAME}")])?;
        pair.home.ready(&pair.standby).await?;

        let deadline = Instant::now() + READY_WITHIN;
        loop {
            match pair.sync_state().await {
                Ok(state) if state == "sync" => break,
                outcome if Instant::now() >= deadline => {
                    bail!("the standby did not become synchronous within {READY_WITHIN:?} ({outcome:?})")
                }
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        let admin = crate::pg::connect(&pair.primary.config("postgres")).await?;
        admin.batch_execute(&format!("CREATE DATABASE {DATABASE}")).await.context("create the gateways' database")?;
        Ok(pair)
    }

    /// Both servers, the primary first, for the gateways: libpq's multi-host
    /// form, which connects to the first that accepts writes.
    pub(super) fn url(&self) -> String {
        format!(
            "postgresql://postgres@{},{}/{DATABASE}?target_session_attrs=read-write",
            self.primary.address(),
            self.standby.address()
        )
    }

    /// The server that is the primary now: the standby once promoted.
    pub(super) fn current_primary(&self) -> &Server {
        if self.promoted.load(std::sync::atomic::Ordering::SeqCst) { &self.standby } else { &self.primary }
    }

    /// The gateways' database on the current primary only.
    pub(super) fn current_primary_url(&self) -> String {
        format!("postgresql://postgres@{}/{DATABASE}", self.current_primary().address())
    }

    /// Whether the current primary is still in recovery (a standby).
    pub(super) async fn current_primary_in_recovery(&self) -> anyhow::Result<bool> {
        let client = crate::pg::connect(&self.current_primary().config(DATABASE)).await?;
        Ok(client.query_one("SELECT pg_is_in_recovery() AS in_recovery", &[]).await?.get("in_recovery"))
    }

    /// The standby's `sync_state` as the primary sees it (`sync` when commits
    /// wait for it), or why there is none.
    async fn sync_state(&self) -> anyhow::Result<String> {
        let client = crate::pg::connect(&self.primary.config("postgres")).await?;
        let rows =
            client.query("SELECT sync_state FROM pg_stat_replication WHERE application_name = $1", &[&STANDBY_NAME]).await?;
        match rows.first() {
            Some(row) => Ok(row.get("sync_state")),
            None => bail!("the standby is not streaming"),
        }
    }

    /// Stops the primary at once (`pg_ctl stop -m immediate`: no shutdown
    /// checkpoint, connections cut mid-transaction, as a crash would) and
    /// promotes the standby (`pg_ctl promote`), waiting until it accepts
    /// writes.
    pub(super) async fn fail_over(self: &Arc<Self>) -> anyhow::Result<FailoverTimes> {
        let sync_state = self.sync_state().await.unwrap_or_else(|error| format!("unknown ({error:#})"));
        let primary = self.primary.data().display().to_string();
        self.home.tool("pg_ctl", &["stop", "-D", &primary, "-m", "immediate", "-w", "-t", "30"]).await?;
        let stopped_us = now_us();
        let pair = self.clone();
        let primary_exit = tokio::task::spawn_blocking(move || pair.primary.reap()).await?;
        let standby = self.standby.data().display().to_string();
        self.home.tool("pg_ctl", &["promote", "-D", &standby, "-w", "-t", "60"]).await?;
        let promoted_us = now_us();
        self.promoted.store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(FailoverTimes { sync_state, primary_exit, stopped_us, promoted_us })
    }
}

impl Drop for ReplicatedPair {
    fn drop(&mut self) {
        self.primary.stop_now();
        self.standby.stop_now();
    }
}
