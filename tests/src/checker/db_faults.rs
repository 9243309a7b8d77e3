//! Faults between the gateways and PostgreSQL, and inside PostgreSQL, each
//! for a spell of the run: through a [`FaultProxy`] the gateways reach the
//! database by, latency with jitter, packet loss, a partition and
//! connection resets mid-bundle; on the server itself, every free
//! connection taken by another client, a lock held on one partition's row or
//! on a table, and its disk full.
//!
//! The connection and disk faults run on a server of the checker's own
//! ([`OwnServer`]), so that they do not reach anyone else's tests on the
//! shared server; the disk is then a tmpfs of a fixed size holding its data
//! and WAL.
//!
//! Once the producers are done, each spell is summed up from the attempts:
//! what was answered while it lasted, what failed and how, and how long after
//! its end the first push was answered (its time to recover). For the row
//! lock, how much the other partitions kept flowing.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use stile::db::{DbConfig, TlsConnector};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::truth::Stored;
use super::{Config, FaultLog, Faults, Outcome, Request, micros_of, now_us};
use crate::proxy::{FaultProxy, ProxyStats, Upstream};
use crate::servers::{OwnServer, OwnServerSpec};

/// The application name of the checker's own connections to the gateways'
/// database, so that the connection fault can tell the gateways' apart
/// (they keep `stile`).
const CHECKER_APPLICATION: &str = "stile-checker";

/// The gateways' application name, `stile::db::DbConfig::parse`'s default.
const GATEWAY_APPLICATION: &str = "stile";

/// A server of the checker's own: room for three gateways' pools
/// (`--pool-size 8` and three connections per shard, a few shards each) and
/// the truth reader, small enough for the connection fault to fill quickly.
const OWN_MAX_CONNECTIONS: u32 = 100;

/// The filesystem of a server whose disk is filled: its data, WAL and logs,
/// with room for a few minutes of the checker's traffic.
const OWN_TMPFS_MB: u64 = 512;

/// How long after a spell ends its failures are still counted as its own.
const SETTLE: Duration = Duration::from_secs(1);

/// A fault's time in the run: from `at` (after the producers start) for
/// `lasting`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spell {
    pub at: Duration,
    pub lasting: Duration,
}

impl Spell {
    pub fn new(at_s: f64, lasting_s: f64) -> Spell {
        Spell { at: Duration::from_secs_f64(at_s), lasting: Duration::from_secs_f64(lasting_s) }
    }
}

/// Every chunk between the gateways and PostgreSQL delayed by `delay` ±
/// `jitter`, each way.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LatencyFault {
    pub spell: Spell,
    pub delay: Duration,
    pub jitter: Duration,
}

/// `percent` of the chunks between the gateways and PostgreSQL lost once
/// (or more) and retransmitted (see [`crate::proxy`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossFault {
    pub spell: Spell,
    pub percent: f64,
}

/// Which fault a spell is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum DbFault {
    Latency,
    Loss,
    Partition,
    Reset,
    Connections,
    RowLock,
    TableLock,
    DiskFull,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Edge {
    Begin,
    End,
}

impl Faults {
    /// Whether the gateways reach PostgreSQL through the fault proxy.
    pub(super) fn needs_proxy(&self) -> bool {
        self.latency.is_some() || self.packet_loss.is_some() || self.network_partition.is_some() || !self.resets_at.is_empty()
    }

    /// Whether the run needs a server of its own, and of what kind.
    pub(super) fn own_server(&self) -> Option<OwnServerSpec> {
        (self.connections_taken.is_some() || self.disk_full.is_some())
            .then_some(OwnServerSpec { max_connections: OWN_MAX_CONNECTIONS, tmpfs_mb: self.disk_full.map(|_| OWN_TMPFS_MB) })
    }

    /// The spells as edges of the schedule.
    pub(super) fn db_fault_edges(&self) -> Vec<(Duration, DbFault, Edge)> {
        let spells = [
            (DbFault::Latency, self.latency.map(|f| f.spell)),
            (DbFault::Loss, self.packet_loss.map(|f| f.spell)),
            (DbFault::Partition, self.network_partition),
            (DbFault::Connections, self.connections_taken),
            (DbFault::RowLock, self.row_lock),
            (DbFault::TableLock, self.table_lock),
            (DbFault::DiskFull, self.disk_full),
        ];
        let mut edges = Vec::new();
        for (fault, spell) in spells {
            if let Some(spell) = spell {
                edges.push((spell.at, fault, Edge::Begin));
                edges.push((spell.at + spell.lasting, fault, Edge::End));
            }
        }
        edges.extend(self.resets_at.iter().map(|&at| (at, DbFault::Reset, Edge::Begin)));
        edges
    }

    /// Adds the spells of a list such as
    /// `latency@30+20,loss@60+20,partition@90+20,reset@120,connections@130+20,row-lock@160+20,table-lock@190+10,disk-full@210+20`
    /// (seconds into the run, `+` how long); latency, jitter and loss take
    /// the amounts given.
    pub fn add_db_faults(&mut self, list: &str, latency: Duration, jitter: Duration, loss_percent: f64) -> anyhow::Result<()> {
        for item in list.split(',').map(str::trim).filter(|item| !item.is_empty()) {
            let (name, when) = item.split_once('@').ok_or_else(|| anyhow!("{item}: expected NAME@SECONDS[+SECONDS]"))?;
            let (at, lasting) = when.split_once('+').unwrap_or((when, "0"));
            let number = |text: &str| text.parse::<f64>().with_context(|| format!("{item}: {text:?} is not a number of seconds"));
            let spell = Spell::new(number(at)?, number(lasting)?);
            if name != "reset" && spell.lasting.is_zero() {
                bail!("{item}: a {name} fault needs a duration (NAME@AT+SECONDS)");
            }
            match name {
                "latency" => self.latency = Some(LatencyFault { spell, delay: latency, jitter }),
                "loss" => self.packet_loss = Some(LossFault { spell, percent: loss_percent }),
                "partition" => self.network_partition = Some(spell),
                "reset" => self.resets_at.push(spell.at),
                "connections" => self.connections_taken = Some(spell),
                "row-lock" => self.row_lock = Some(spell),
                "table-lock" => self.table_lock = Some(spell),
                "disk-full" => self.disk_full = Some(spell),
                other => {
                    bail!("{other}: not a fault (latency, loss, partition, reset, connections, row-lock, table-lock, disk-full)")
                }
            }
        }
        Ok(())
    }
}

/// What the faults act on.
#[derive(Debug, Default)]
pub(super) struct DbRig {
    pub(super) proxy: Option<Arc<FaultProxy>>,
    pub(super) own: Option<Arc<OwnServer>>,
    /// The gateways' database, reached directly (not through the proxy).
    pub(super) direct_url: String,
}

impl DbRig {
    /// The server of the run's own, if it needs one, and the proxy in front
    /// of `direct_url` (or of that server), if it needs one. Spawns the
    /// server from the calling thread (see `servers.rs`).
    pub(super) async fn start(config: &Config, direct_url: String) -> anyhow::Result<DbRig> {
        let own = match config.faults.own_server() {
            Some(spec) => Some(Arc::new(OwnServer::start(spec).await.context("start a PostgreSQL server of the checker's own")?)),
            None => None,
        };
        let direct_url = own.as_ref().map_or(direct_url, |own| own.url());
        let proxy = if config.faults.needs_proxy() {
            let upstream = Upstream::of_postgres(&db_config(&direct_url)?.pg).await.context("find the server to proxy")?;
            Some(Arc::new(FaultProxy::start(upstream).await.context("start the fault proxy")?))
        } else {
            None
        };
        Ok(DbRig { proxy, own, direct_url })
    }

    /// The database as the gateways are given it: through the proxy when
    /// there is one (with the same TLS settings: the proxy relays bytes).
    pub(super) fn gateway_url(&self) -> anyhow::Result<String> {
        let Some(proxy) = &self.proxy else { return Ok(self.direct_url.clone()) };
        Ok(crate::proxy::proxied(&db_config(&self.direct_url)?, proxy.addr()).to_url(true))
    }

    /// A describing line for the report's summary.
    pub(super) fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(own) = &self.own {
            let disk = own.spec.tmpfs_mb.map_or(String::new(), |mb| format!(", on a {mb} MiB tmpfs (data and WAL)"));
            parts.push(format!(
                "on a server of the checker's own at {} (max_connections {}{disk})",
                own.server.address(),
                own.spec.max_connections
            ));
        }
        if let Some(proxy) = &self.proxy {
            parts.push(format!("through a fault proxy on {}", proxy.addr()));
        }
        parts.join(", ")
    }
}

fn db_config(url: &str) -> anyhow::Result<DbConfig> {
    DbConfig::parse(url).map_err(|e| anyhow!("{e}"))
}

/// A spell as it happened.
#[derive(Clone, Debug)]
pub(super) struct SpellTimes {
    pub(super) fault: DbFault,
    pub(super) label: String,
    /// When the fault was in force (a lock taken, the disk full), and when
    /// it was lifted; equal for a reset.
    pub(super) started_us: i64,
    pub(super) ended_us: Option<i64>,
    pub(super) notes: Vec<String>,
    /// The partition whose row the row lock held.
    pub(super) locked_partition: Option<String>,
    proxy_at_start: Option<ProxyStats>,
}

/// What is held while a spell lasts.
#[derive(Debug, Default)]
pub(super) struct InForce {
    hog: Option<Hog>,
    lock: Option<tokio_postgres::Client>,
    ballast: Option<PathBuf>,
}

/// Begins or ends one spell; a failure is logged, never fatal to the run.
/// `gateway_pids` are the gateway processes running now.
pub(super) async fn apply(
    (fault, edge): (DbFault, Edge),
    rig: &DbRig,
    in_force: &mut InForce,
    config: &Config,
    gateway_pids: &[u32],
    log: &mut FaultLog,
) {
    let outcome = match edge {
        Edge::Begin => begin(fault, rig, in_force, config, gateway_pids).await.map(|spell| log.spells.push(spell)),
        Edge::End => match log.spells.iter_mut().rev().find(|s| s.fault == fault && s.ended_us.is_none()) {
            Some(spell) => end(spell, rig, in_force).await,
            None => Ok(()),
        },
    };
    if let Err(error) = outcome {
        log.errors.push(format!("{fault:?} {edge:?}: {error:#}"));
    }
}

/// Lifts whatever is still in force (a spell that outlasted the run).
pub(super) async fn release_all(rig: &DbRig, in_force: &mut InForce, log: &mut FaultLog) {
    let open: Vec<DbFault> = log.spells.iter().filter(|s| s.ended_us.is_none()).map(|s| s.fault).collect();
    for fault in open {
        if let Some(spell) = log.spells.iter_mut().rev().find(|s| s.fault == fault && s.ended_us.is_none())
            && let Err(error) = end(spell, rig, in_force).await
        {
            log.errors.push(format!("{fault:?} End: {error:#}"));
        }
    }
}

fn proxy(rig: &DbRig) -> anyhow::Result<&FaultProxy> {
    rig.proxy.as_deref().ok_or_else(|| anyhow!("a network fault without the proxy"))
}

fn own(rig: &DbRig) -> anyhow::Result<&OwnServer> {
    rig.own.as_deref().ok_or_else(|| anyhow!("a server fault without a server of the checker's own"))
}

async fn begin(
    fault: DbFault,
    rig: &DbRig,
    in_force: &mut InForce,
    config: &Config,
    gateway_pids: &[u32],
) -> anyhow::Result<SpellTimes> {
    let faults = &config.faults;
    let mut notes = Vec::new();
    let mut locked_partition = None;
    let proxy_at_start = rig.proxy.as_ref().map(|p| p.stats());
    let label = match fault {
        DbFault::Latency => {
            let latency = faults.latency.ok_or_else(|| anyhow!("no latency configured"))?;
            proxy(rig)?.update(|t| {
                t.latency = latency.delay;
                t.jitter = latency.jitter;
            });
            format!("latency {} ms ± {} ms each way", latency.delay.as_millis(), latency.jitter.as_millis())
        }
        DbFault::Loss => {
            let loss = faults.packet_loss.ok_or_else(|| anyhow!("no loss configured"))?;
            proxy(rig)?.update(|t| t.loss = loss.percent / 100.0);
            format!("{}% packet loss (a lost chunk waits 200 ms, doubling while lost again)", loss.percent)
        }
        DbFault::Partition => {
            proxy(rig)?.update(|t| t.partitioned = true);
            "network partition (nothing forwarded, connections kept open)".to_owned()
        }
        DbFault::Reset => {
            let armed = proxy(rig)?.reset_after_next_request();
            notes.push(format!("{armed} open connections armed"));
            "connection reset (each open connection aborted right after its next request reached PostgreSQL)".to_owned()
        }
        DbFault::Connections => {
            let (hog, full) = Hog::start(own(rig)?, gateway_pids).await?;
            notes.push(format!("the other client held {full} connections once the gateways' were gone"));
            in_force.hog = Some(hog);
            "PostgreSQL out of connections (another client holds every free one)".to_owned()
        }
        DbFault::RowLock => {
            let (client, partition) = lock_row(&rig.direct_url, &config.queue).await?;
            in_force.lock = Some(client);
            let label = format!("row lock on partition {partition} (SELECT … FOR UPDATE by another transaction)");
            locked_partition = Some(partition);
            label
        }
        DbFault::TableLock => {
            let client = connect_checker(&rig.direct_url).await?;
            client.batch_execute("BEGIN; LOCK TABLE stile.segments IN SHARE MODE").await.context("lock stile.segments")?;
            in_force.lock = Some(client);
            "table lock on stile.segments (SHARE, as CREATE INDEX takes)".to_owned()
        }
        DbFault::DiskFull => {
            let own = own(rig)?;
            let path = own.home.dir.join("ballast");
            let written = fill(path.clone()).await?;
            in_force.ballast = Some(path);
            notes.push(format!("{} MiB of ballast filled the rest of the filesystem", written >> 20));
            format!("PostgreSQL's disk full ({} MiB tmpfs holding data and WAL)", own.spec.tmpfs_mb.unwrap_or(0))
        }
    };
    let started_us = now_us();
    let ended_us = (fault == DbFault::Reset).then_some(started_us);
    Ok(SpellTimes { fault, label, started_us, ended_us, notes, locked_partition, proxy_at_start })
}

async fn end(spell: &mut SpellTimes, rig: &DbRig, in_force: &mut InForce) -> anyhow::Result<()> {
    // The spell ends when its lifting begins: time to recover counts from
    // there.
    let lifted_us = now_us();
    match spell.fault {
        DbFault::Latency => proxy(rig)?.update(|t| {
            t.latency = Duration::ZERO;
            t.jitter = Duration::ZERO;
        }),
        DbFault::Loss => proxy(rig)?.update(|t| t.loss = 0.0),
        DbFault::Partition => proxy(rig)?.update(|t| t.partitioned = false),
        DbFault::Reset => {}
        DbFault::Connections => {
            if let Some(hog) = in_force.hog.take() {
                spell.notes.push(hog.stop().await?);
            }
        }
        DbFault::RowLock | DbFault::TableLock => {
            if let Some(client) = in_force.lock.take() {
                client.batch_execute("ROLLBACK").await.context("release the lock")?;
            }
        }
        DbFault::DiskFull => {
            if let Some(path) = in_force.ballast.take() {
                std::fs::remove_file(&path).with_context(|| format!("remove {}", path.display()))?;
            }
            if let Some(ended) = own(rig)?.ensure_running().await? {
                spell.notes.push(format!("PostgreSQL had stopped ({ended}) and was started again"));
            }
        }
    }
    if let (Some(before), Some(proxy)) = (spell.proxy_at_start, &rig.proxy) {
        let now = proxy.stats();
        match spell.fault {
            DbFault::Loss => spell.notes.push(format!("{} chunks lost", now.chunks_lost - before.chunks_lost)),
            DbFault::Partition => {
                spell.notes.push(format!("{} connections opened meanwhile", now.connections - before.connections))
            }
            _ => {}
        }
    }
    spell.ended_us = Some(spell.ended_us.unwrap_or(lifted_us));
    Ok(())
}

/// A connection of the checker's own to the gateways' database.
async fn connect_checker(url: &str) -> anyhow::Result<tokio_postgres::Client> {
    let mut config = db_config(url)?;
    config.pg.application_name(CHECKER_APPLICATION);
    crate::pg::connect(&config).await.map_err(|e| anyhow!("connect to the gateways' database: {e}"))
}

/// Takes the row lock of the queue's partition written most in the last
/// two seconds (a hot one, which pushes keep reaching), in a transaction
/// left open, and answers its name.
async fn lock_row(url: &str, queue: &str) -> anyhow::Result<(tokio_postgres::Client, String)> {
    let client = connect_checker(url).await?;
    let row = client
        .query_opt(
            "SELECT p.id, p.name FROM stile.txns t JOIN stile.partitions p ON p.id = t.partition_id \
              WHERE p.queue = $1 AND t.created_at > now() - interval '2 s' \
              GROUP BY p.id, p.name ORDER BY sum(t.end_offset - t.base_offset + 1) DESC LIMIT 1",
            &[&queue],
        )
        .await?
        .ok_or_else(|| anyhow!("no partition of the queue {queue} was written in the last two seconds"))?;
    let (id, name): (i64, String) = (row.get("id"), row.get("name"));
    client.batch_execute("BEGIN").await?;
    client.query_one("SELECT 1 FROM stile.partitions WHERE id = $1 FOR UPDATE", &[&id]).await.context("lock the row")?;
    Ok((client, name))
}

/// Writes zeros to `path` until the filesystem is full, and answers how
/// many bytes it took.
async fn fill(path: PathBuf) -> anyhow::Result<u64> {
    tokio::task::spawn_blocking(move || -> anyhow::Result<u64> {
        use std::io::Write as _;
        let mut file = std::fs::File::create(&path).with_context(|| format!("create {}", path.display()))?;
        let block = vec![0u8; 1 << 20];
        let mut written = 0u64;
        loop {
            match file.write(&block) {
                Ok(0) => return Ok(written),
                Ok(n) => written += n as u64,
                Err(error) if error.kind() == std::io::ErrorKind::StorageFull => return Ok(written),
                Err(error) => return Err(error).with_context(|| format!("write {}", path.display())),
            }
        }
    })
    .await?
}

/// Another client that takes every free connection of the server and holds
/// them until it is stopped, polling for any that frees up.
///
/// A gateway keeps the connections it has, and the fault bites when it needs
/// new ones, as after a restart or a network blip: so once the hog holds
/// every free slot, it terminates the gateways' backends and takes the slots
/// they leave. The gateways are paused (SIGSTOP) meanwhile, for the few
/// hundred milliseconds that takes, so that they cannot win those slots back
/// in the race; the spell starts once they run again.
#[derive(Debug)]
struct Hog {
    stop: oneshot::Sender<()>,
    task: JoinHandle<HogTally>,
}

#[derive(Debug, Default)]
struct HogTally {
    held: Vec<tokio_postgres::Client>,
    held_most: usize,
    refusals: u64,
    gateway_backends_terminated: u64,
    other_errors: Vec<String>,
}

/// The most connections the hog opens, whatever the server allows.
const HOG_LIMIT: usize = 2_000;

/// How long the gateways' terminated backends may take to be gone.
const BACKENDS_GONE_WITHIN: Duration = Duration::from_secs(5);

impl Hog {
    /// Takes every connection of `own`'s server (its `postgres` database:
    /// the limit is the server's), the gateways' included, and answers how
    /// many it holds then.
    async fn start(own: &OwnServer, gateway_pids: &[u32]) -> anyhow::Result<(Hog, usize)> {
        let mut config = own.server.config("postgres");
        config.pg.application_name(CHECKER_APPLICATION);
        let mut tally = HogTally::default();
        take_free_connections(&config, &mut tally).await;
        if tally.held.is_empty() {
            bail!("the server refused the hog's first connection: {:?}", tally.other_errors);
        }
        {
            let _paused = Paused::new(gateway_pids);
            tally.gateway_backends_terminated = terminate_gateways(&tally.held[0]).await?;
            let deadline = Instant::now() + BACKENDS_GONE_WITHIN;
            while gateway_backends(&tally.held[0]).await? > 0 && Instant::now() < deadline {
                take_free_connections(&config, &mut tally).await;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            take_free_connections(&config, &mut tally).await;
        }
        let full = tally.held.len();
        let (stop, stop_rx) = oneshot::channel();
        let task = tokio::spawn(hold(config, tally, stop_rx));
        Ok((Hog { stop, task }, full))
    }

    /// Releases every connection and answers what it did.
    async fn stop(self) -> anyhow::Result<String> {
        let _ = self.stop.send(());
        let tally = self.task.await?;
        Ok(format!(
            "held at most {} connections, refused {} times, terminated {} gateway backends{}",
            tally.held_most,
            tally.refusals,
            tally.gateway_backends_terminated,
            if tally.other_errors.is_empty() { String::new() } else { format!("; errors: {}", tally.other_errors.join("; ")) }
        ))
    }
}

/// Holds the connections, taking any that frees up, until stopped; then
/// closes them all.
async fn hold(config: DbConfig, mut tally: HogTally, mut stop: oneshot::Receiver<()>) -> HogTally {
    loop {
        tokio::select! {
            _ = &mut stop => break,
            () = tokio::time::sleep(Duration::from_millis(50)) => take_free_connections(&config, &mut tally).await,
        }
    }
    tally.held.clear();
    tally
}

/// Terminates the gateways' backends and answers how many.
async fn terminate_gateways(client: &tokio_postgres::Client) -> anyhow::Result<u64> {
    let row = client
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) AS terminated FROM pg_stat_activity WHERE application_name = $1",
            &[&GATEWAY_APPLICATION],
        )
        .await
        .context("terminate the gateways' backends")?;
    Ok(u64::try_from(row.get::<_, i64>("terminated")).unwrap_or(0))
}

async fn gateway_backends(client: &tokio_postgres::Client) -> anyhow::Result<i64> {
    let row = client
        .query_one("SELECT count(*) AS backends FROM pg_stat_activity WHERE application_name = $1", &[&GATEWAY_APPLICATION])
        .await
        .context("count the gateways' backends")?;
    Ok(row.get("backends"))
}

/// Opens connections until the server refuses one.
async fn take_free_connections(config: &DbConfig, tally: &mut HogTally) {
    let connector = match TlsConnector::new(&config.tls) {
        Ok(connector) => connector,
        Err(error) => {
            if tally.other_errors.len() < 5 {
                tally.other_errors.push(error.to_string());
            }
            return;
        }
    };
    while tally.held.len() < HOG_LIMIT {
        match connector.open(&config.pg).await {
            Ok(connected) => {
                tally.held.push(connected.client);
                tally.held_most = tally.held_most.max(tally.held.len());
            }
            Err(error) if error.code() == Some(&tokio_postgres::error::SqlState::TOO_MANY_CONNECTIONS) => {
                tally.refusals += 1;
                return;
            }
            Err(error) => {
                if tally.other_errors.len() < 5 {
                    tally.other_errors.push(error.to_string());
                }
                return;
            }
        }
    }
}

/// Gateway processes stopped (SIGSTOP) while it lives, continued (SIGCONT)
/// when dropped, whatever happened meanwhile.
struct Paused<'a>(&'a [u32]);

impl<'a> Paused<'a> {
    fn new(pids: &'a [u32]) -> Paused<'a> {
        signal_all(pids, libc::SIGSTOP);
        Paused(pids)
    }
}

impl Drop for Paused<'_> {
    fn drop(&mut self) {
        signal_all(self.0, libc::SIGCONT);
    }
}

fn signal_all(pids: &[u32], signal: libc::c_int) {
    for &pid in pids {
        if let Ok(pid) = i32::try_from(pid) {
            // SAFETY: a plain system call on the pid of a child not yet reaped.
            unsafe { libc::kill(pid, signal) };
        }
    }
}

// ---------------------------------------------------------------------------
// The report
// ---------------------------------------------------------------------------

/// How the gateways fared through one spell.
#[derive(Clone, Debug, Default)]
pub struct DbFaultReport {
    pub fault: String,
    /// From the start of the push phase.
    pub from: Duration,
    pub to: Duration,
    pub notes: Vec<String>,
    /// Attempts answered while it lasted.
    pub answered_during: u64,
    /// Attempts that failed while it lasted or in the second after, by how
    /// (`503`, `500`, `timeout`, `connection`).
    pub failed: BTreeMap<String, u64>,
    /// From its end to the first push answered after it.
    pub served_again_after: Option<Duration>,
    /// For a row lock: how the other partitions flowed.
    pub flow: Option<LockFlow>,
}

/// How requests flowed while one partition's row was locked.
#[derive(Clone, Debug, Default)]
pub struct LockFlow {
    pub partition: String,
    /// Requests carrying no item of the locked partition, answered per
    /// second in the span before the lock as long as the lock, and while it
    /// was held.
    pub others_per_s_before: f64,
    pub others_per_s_during: f64,
    /// Requests carrying an item of it answered while it was held, and the
    /// first answered after its release.
    pub locked_answered_during: u64,
    pub locked_served_again_after: Option<Duration>,
    /// Messages committed per second (read back from PostgreSQL) in the
    /// other partitions, before the lock and while it was held: those on
    /// the locked partition's shard, and those on the other shards (by the
    /// gateways' shard count, when they all have the same).
    pub committed: Option<CommittedFlow>,
    /// The probes sent while the lock was held (see `workload::probe`), by
    /// where their partition lies, when there were probes.
    pub probes: Option<ProbeFlow>,
}

/// Probes sent during a lock at least [`PROBE_PATIENCE`] before its end, and
/// those of them answered within it: to the locked partition, to the other
/// partitions of its shard, to the other shards.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProbeFlow {
    pub locked: ProbeCount,
    pub same_shard: ProbeCount,
    pub other_shards: ProbeCount,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProbeCount {
    pub sent: u64,
    pub answered: u64,
}

impl fmt::Display for ProbeCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} of {}", self.answered, self.sent)
    }
}

/// How soon a probe must be answered to count as flowing.
pub const PROBE_PATIENCE: Duration = Duration::from_secs(1);

/// Messages committed per second around a lock, by where they went.
#[derive(Clone, Copy, Debug, Default)]
pub struct CommittedFlow {
    pub shards: usize,
    pub same_shard_before: f64,
    pub same_shard_during: f64,
    pub other_shards_before: f64,
    pub other_shards_during: f64,
    /// Messages committed in the locked partition while it was held.
    pub locked_during: u64,
}

impl fmt::Display for DbFaultReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let failed: Vec<String> = self.failed.iter().map(|(how, n)| format!("{n}x{how}")).collect();
        write!(
            f,
            "{} from {:.1} s to {:.1} s: {} attempts answered during it, failed [{}]; served again {} after its end",
            self.fault,
            self.from.as_secs_f64(),
            self.to.as_secs_f64(),
            self.answered_during,
            failed.join(", "),
            seconds(self.served_again_after)
        )?;
        if let Some(flow) = &self.flow {
            write!(
                f,
                "; requests without {} answered {:.1}/s during the lock against {:.1}/s before it, requests with it: {} answered during it, the first after it {} after the release",
                flow.partition,
                flow.others_per_s_during,
                flow.others_per_s_before,
                flow.locked_answered_during,
                seconds(flow.locked_served_again_after)
            )?;
            if let Some(p) = &flow.probes {
                write!(
                    f,
                    "; probes answered within {:?} while it was held: to it {}, to the other partitions of its shard {}, to the other shards {}",
                    PROBE_PATIENCE, p.locked, p.same_shard, p.other_shards
                )?;
            }
            if let Some(c) = &flow.committed {
                write!(
                    f,
                    "; messages committed per second in the other partitions of its shard (of {}) {:.1} during the lock against {:.1} before, in the other shards' {:.1} against {:.1}, in the locked one {} during it",
                    c.shards,
                    c.same_shard_during,
                    c.same_shard_before,
                    c.other_shards_during,
                    c.other_shards_before,
                    c.locked_during
                )?;
            }
        }
        for note in &self.notes {
            write!(f, "; {note}")?;
        }
        Ok(())
    }
}

fn seconds(duration: Option<Duration>) -> String {
    duration.map_or_else(|| "never".to_owned(), |d| format!("{:.2} s", d.as_secs_f64()))
}

/// Sums each spell up from the attempts, and a row lock's also from what
/// was stored and what its probes met.
pub(super) fn reports(
    spells: &[SpellTimes],
    requests: &[Request],
    stored: &Stored,
    config: &Config,
    t0: Instant,
) -> Vec<DbFaultReport> {
    let shards = shared_shard_count(config);
    spells
        .iter()
        .map(|spell| {
            let mut report = report(spell, requests, t0);
            if let (Some(flow), Some(shards)) = (report.flow.as_mut(), shards) {
                let lock =
                    Lock { partition: &flow.partition, start: spell.started_us, end: spell.ended_us.unwrap_or(i64::MAX), shards };
                flow.committed = Some(committed_flow(&lock, stored));
                flow.probes = (config.probe_rate > 0.0).then(|| probe_flow(&lock, config.producers, requests, stored));
            }
            report
        })
        .collect()
}

/// The gateways' shard count when they all run with the default (one per
/// core, as `stile serve` counts them); `None` when one is given its own.
fn shared_shard_count(config: &Config) -> Option<usize> {
    let default = config.gateways.iter().all(|g| !g.args.iter().any(|arg| arg == "--shards"));
    default.then(|| std::thread::available_parallelism().map_or(1, usize::from))
}

/// A row lock as the flow figures see it.
struct Lock<'a> {
    partition: &'a str,
    start: i64,
    end: i64,
    shards: usize,
}

impl Lock<'_> {
    /// Where a partition lies against the lock: 0 the locked one, 1 another
    /// on its shard, 2 another shard.
    fn place(&self, partition: &str, stored: &Stored) -> usize {
        let shard = |name: &str| stored.ids.get(name).map(|&id| stile::gateway::shard_of(id, self.shards));
        if partition == self.partition {
            0
        } else if shard(partition) == shard(self.partition) {
            1
        } else {
            2
        }
    }
}

fn report(spell: &SpellTimes, requests: &[Request], t0: Instant) -> DbFaultReport {
    let t0_us = micros_of(t0);
    let (start, end) = (spell.started_us, spell.ended_us.unwrap_or(i64::MAX));
    let since_t0 = |us: i64| Duration::from_micros(u64::try_from(us - t0_us).unwrap_or(0));
    let settled = end.saturating_add(i64::try_from(SETTLE.as_micros()).unwrap_or(0));
    let mut report = DbFaultReport {
        fault: spell.label.clone(),
        from: since_t0(start),
        to: since_t0(end.min(now_us())),
        notes: spell.notes.clone(),
        ..DbFaultReport::default()
    };
    let mut first_after: Option<i64> = None;
    for attempt in requests.iter().flat_map(|r| &r.attempts) {
        match &attempt.outcome {
            Outcome::Answered(_) => {
                if (start..=end).contains(&attempt.done_us) {
                    report.answered_during += 1;
                }
                if attempt.done_us >= end {
                    first_after = Some(first_after.map_or(attempt.done_us, |us| us.min(attempt.done_us)));
                }
            }
            failed if (start..=settled).contains(&attempt.done_us) => {
                let kind = failure_kind(failed);
                // The first answer of each unexpected status, to show what
                // the gateway said.
                if let Outcome::Status(status, body) = failed
                    && *status != 503
                    && !report.failed.contains_key(&kind)
                {
                    report.notes.push(format!("the first {status} said: {}", body.chars().take(300).collect::<String>()));
                }
                *report.failed.entry(kind).or_insert(0) += 1;
            }
            _ => {}
        }
    }
    report.served_again_after = first_after.map(|us| Duration::from_micros(u64::try_from(us - end).unwrap_or(0)));
    report.flow = spell.locked_partition.as_ref().map(|partition| lock_flow(partition, start, end, requests));
    report
}

fn failure_kind(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Status(status, _) => status.to_string(),
        Outcome::Timeout => "timeout".to_owned(),
        Outcome::Connection(_) => "connection".to_owned(),
        Outcome::Malformed(_) => "malformed".to_owned(),
        Outcome::Answered(_) => "answered".to_owned(),
    }
}

fn lock_flow(partition: &str, start: i64, end: i64, requests: &[Request]) -> LockFlow {
    let span = end - start;
    let before = start - span;
    let (mut others_before, mut others_during) = (0u64, 0u64);
    let mut flow = LockFlow { partition: partition.to_owned(), ..LockFlow::default() };
    let mut first_after: Option<i64> = None;
    for request in requests {
        let carries = request.items.iter().any(|item| item.partition == partition);
        for attempt in request.attempts.iter().filter(|a| matches!(a.outcome, Outcome::Answered(_))) {
            let done = attempt.done_us;
            match (carries, (before..start).contains(&done), (start..=end).contains(&done)) {
                (false, true, _) => others_before += 1,
                (false, _, true) => others_during += 1,
                (true, _, true) => flow.locked_answered_during += 1,
                (true, _, false) if done > end => first_after = Some(first_after.map_or(done, |us| us.min(done))),
                _ => {}
            }
        }
    }
    let per_s = |count: u64| count as f64 / (span.max(1) as f64 / 1e6);
    flow.others_per_s_before = per_s(others_before);
    flow.others_per_s_during = per_s(others_during);
    flow.locked_served_again_after = first_after.map(|us| Duration::from_micros(u64::try_from(us - end).unwrap_or(0)));
    flow
}

fn committed_flow(lock: &Lock<'_>, stored: &Stored) -> CommittedFlow {
    let span = lock.end - lock.start;
    let before = lock.start - span;
    // By place (see `Lock::place`), before and during.
    let mut counts = [[0u64; 2]; 3];
    for (partition, copies) in &stored.partitions {
        let place = lock.place(partition, stored);
        for copy in copies {
            if (before..lock.start).contains(&copy.created_us) {
                counts[place][0] += 1;
            } else if (lock.start..=lock.end).contains(&copy.created_us) {
                counts[place][1] += 1;
            }
        }
    }
    let per_s = |count: u64| count as f64 / (span.max(1) as f64 / 1e6);
    CommittedFlow {
        shards: lock.shards,
        same_shard_before: per_s(counts[1][0]),
        same_shard_during: per_s(counts[1][1]),
        other_shards_before: per_s(counts[2][0]),
        other_shards_during: per_s(counts[2][1]),
        locked_during: counts[0][1],
    }
}

fn probe_flow(lock: &Lock<'_>, prober: usize, requests: &[Request], stored: &Stored) -> ProbeFlow {
    let patience = i64::try_from(PROBE_PATIENCE.as_micros()).unwrap_or(i64::MAX);
    let mut counts = [ProbeCount::default(); 3];
    for request in requests.iter().filter(|r| r.producer == prober) {
        let (Some(first), Some(item)) = (request.attempts.first(), request.items.first()) else { continue };
        if !(lock.start..=lock.end - patience).contains(&first.sent_us) {
            continue;
        }
        let count = &mut counts[lock.place(&item.partition, stored)];
        count.sent += 1;
        if request.answers().is_some_and(|(last, _)| last.done_us - first.sent_us <= patience) {
            count.answered += 1;
        }
    }
    ProbeFlow { locked: counts[0], same_shard: counts[1], other_shards: counts[2] }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Faults, Spell};

    #[test]
    fn a_list_of_spells_parses_into_the_schedule() {
        let mut faults = Faults::default();
        faults
            .add_db_faults(
                "latency@30+20, loss@60+20,partition@90+20,reset@120,reset@125,connections@130+20,row-lock@160+20,disk-full@210+20",
                Duration::from_millis(50),
                Duration::from_millis(10),
                5.0,
            )
            .expect("a valid list");
        let latency = faults.latency.expect("latency");
        assert_eq!(
            (latency.spell, latency.delay, latency.jitter),
            (Spell::new(30.0, 20.0), Duration::from_millis(50), Duration::from_millis(10))
        );
        assert_eq!(faults.packet_loss.map(|l| l.percent), Some(5.0));
        assert_eq!(faults.resets_at, [Duration::from_secs(120), Duration::from_secs(125)]);
        assert_eq!(faults.row_lock, Some(Spell::new(160.0, 20.0)));
        assert!(faults.needs_proxy());
        let own = faults.own_server().expect("a server of its own");
        assert!(own.tmpfs_mb.is_some());
        assert_eq!(faults.db_fault_edges().len(), 2 * 6 + 2);
        assert!(faults.add_db_faults("partition@5", Duration::ZERO, Duration::ZERO, 0.0).is_err());
        assert!(faults.add_db_faults("flood@5+1", Duration::ZERO, Duration::ZERO, 0.0).is_err());
    }
}
