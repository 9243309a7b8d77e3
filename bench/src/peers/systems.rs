//! The systems the `peers` benchmark puts side by side, each started on
//! this machine with processes of its own: how to reach it, which processes
//! to charge, and how to read back what it stored.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt as _, pin_mut};
use stile_tests::gateway::{Client, Gateway, GatewayOptions, Process, beside_this_program, listening_addr, metric_total};
use stile_tests::pg::TestDb;

use super::jetstream::JetStream;
use super::workload::Transport;
use crate::peer_http::Design;

/// A system under comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum System {
    /// stile, wasm engine, warm cache.
    StileWasm,
    /// stile, native engine, warm cache.
    StileNative,
    /// stile with `--cache-mb 0`: every segment's probe runs in SQL.
    StileCold,
    /// PostgreSQL alone over HTTP: `INSERT … ON CONFLICT DO NOTHING`.
    Postgres,
    /// Redis `SET NX EX`, then a PostgreSQL insert, over HTTP.
    RedisPostgres,
    /// NATS JetStream, duplicate window of two minutes.
    Nats2m,
    /// NATS JetStream, duplicate window of an hour.
    Nats1h,
}

impl System {
    pub fn name(self) -> &'static str {
        match self {
            System::StileWasm => "stile (wasm)",
            System::StileNative => "stile (native)",
            System::StileCold => "stile, probe forced (--cache-mb 0)",
            System::Postgres => "PostgreSQL alone (HTTP)",
            System::RedisPostgres => "Redis + PostgreSQL (HTTP)",
            System::Nats2m => "NATS JetStream, 2 min window",
            System::Nats1h => "NATS JetStream, 1 h window",
        }
    }

    /// A short label, for charts.
    pub fn label(self) -> &'static str {
        match self {
            System::StileWasm => "stile wasm",
            System::StileNative => "stile native",
            System::StileCold => "stile probe forced",
            System::Postgres => "PG alone",
            System::RedisPostgres => "Redis+PG",
            System::Nats2m => "JetStream 2m",
            System::Nats1h => "JetStream 1h",
        }
    }

    /// Whether it keeps its window in PostgreSQL, whose
    /// `synchronous_commit` then matters.
    pub fn uses_postgres(self) -> bool {
        !matches!(self, System::Nats2m | System::Nats1h)
    }

    fn queue(self) -> &'static str {
        match self {
            System::StileWasm => "peers-wasm",
            System::StileNative => "peers-native",
            System::StileCold => "peers-cold",
            _ => "peers",
        }
    }
}

/// A started system.
#[derive(Debug)]
pub struct Running {
    pub system: System,
    /// Partitions (subjects) its connections spread their requests over.
    partitions: usize,
    kind: Kind,
}

#[derive(Debug)]
enum Kind {
    Stile(Gateway),
    Endpoint { design: Design, endpoint: Process, addr: SocketAddr, redis: Option<Process> },
    Nats(JetStream),
}

/// The bytes PostgreSQL keeps for a system's check, and the ids in them.
#[derive(Clone, Copy, Debug, Default)]
pub struct HeldInPostgres {
    pub bytes: i64,
    pub ids: i64,
}

/// A stile gateway's cache, by its own accounting.
#[derive(Clone, Copy, Debug, Default)]
pub struct CacheAccounting {
    pub bytes: u64,
    pub hashes: u64,
}

/// What every system is started with.
#[derive(Clone, Debug)]
pub struct StartConfig {
    pub partitions: usize,
    pub pool_size: usize,
    pub window: Duration,
}

impl Running {
    /// Starts `system` on the benchmark database `t`.
    pub async fn start(system: System, t: &TestDb, config: &StartConfig) -> Running {
        let kind = match system {
            System::StileWasm | System::StileNative | System::StileCold => {
                let mut named = t.config().clone();
                named.pg.application_name(format!("stile-{}", system.queue()));
                let options = GatewayOptions {
                    engine: Some(if system == System::StileNative { "native" } else { "wasm" }),
                    cache_mb: (system == System::StileCold).then_some(0),
                    pool_size: Some(config.pool_size),
                    ..Default::default()
                };
                Kind::Stile(Gateway::start_with(&named.to_url(true), &options).await)
            }
            System::Postgres => start_endpoint(Design::Postgres, t, config, None).await,
            System::RedisPostgres => {
                let (redis, url) = start_redis().await;
                start_endpoint(Design::RedisPostgres, t, config, Some((redis, url))).await
            }
            System::Nats2m => Kind::Nats(JetStream::start("peers2m", Duration::from_secs(120)).await),
            System::Nats1h => Kind::Nats(JetStream::start("peers1h", config.window).await),
        };
        Running { system, partitions: config.partitions, kind }
    }

    /// A connection of its own.
    pub async fn transport(&self) -> Transport {
        match &self.kind {
            Kind::Stile(gateway) => Transport::Http { client: gateway.client().await, queue: Arc::from(self.system.queue()) },
            Kind::Endpoint { addr, .. } => Transport::Http {
                client: Client::connect(*addr).await.unwrap_or_else(|e| panic!("connect to {addr}: {e:#}")),
                queue: Arc::from(self.system.queue()),
            },
            Kind::Nats(js) => {
                Transport::Nats { context: js.context().await, subjects: (0..self.partitions).map(|p| js.subject(p)).collect() }
            }
        }
    }

    /// The processes that are this system, PostgreSQL's aside, by role.
    pub fn processes(&self) -> Vec<(&'static str, i32)> {
        match &self.kind {
            Kind::Stile(gateway) => vec![("stile", gateway.pid())],
            Kind::Endpoint { endpoint, redis, .. } => {
                let mut processes = vec![("endpoint", pid(endpoint))];
                processes.extend(redis.as_ref().map(|redis| ("redis-server", pid(redis))));
                processes
            }
            Kind::Nats(js) => vec![("nats-server", js.pid())],
        }
    }

    /// What PostgreSQL keeps for this system's check: the relations the
    /// verdict reads (stile's log, which holds the messages beside the
    /// hashes; the peer's unique index) and the ids they hold, or `None`
    /// for a system that keeps nothing there. The stile gateways share one
    /// log, so each is charged the log's size in proportion to the messages
    /// of its own queue.
    pub async fn held_in_postgres(&self, pg: &tokio_postgres::Client) -> Option<HeldInPostgres> {
        let row = match &self.kind {
            Kind::Stile(_) => {
                let sql = "SELECT (pg_total_relation_size('stile.log') * coalesce(sum(n) FILTER (WHERE mine), 0) \
                                   / greatest(coalesce(sum(n), 0), 1))::bigint AS bytes, \
                                  coalesce(sum(n) FILTER (WHERE mine), 0)::bigint AS ids \
                           FROM (SELECT l.end_offset - l.base_offset + 1 AS n, p.queue = $1 AS mine \
                                 FROM stile.log l JOIN stile.partitions p ON p.id = l.partition_id) AS segments";
                pg.query_one(sql, &[&self.system.queue()]).await
            }
            Kind::Endpoint { design: Design::Postgres, .. } => {
                let sql = "SELECT pg_relation_size('peer_http.messages_partition_transaction_id_key') AS bytes, \
                                  (SELECT count(*) FROM peer_http.messages) AS ids";
                pg.query_one(sql, &[]).await
            }
            _ => return None,
        };
        let row = row.expect("a relation's size");
        Some(HeldInPostgres { bytes: row.get("bytes"), ids: row.get("ids") })
    }

    /// What the cache of a stile gateway accounts for itself: its bytes and
    /// the hashes it holds, summed over its shards; `None` for the others.
    pub async fn cache_accounting(&self) -> Option<CacheAccounting> {
        let Kind::Stile(gateway) = &self.kind else { return None };
        let text = gateway.client().await.metrics().await;
        Some(CacheAccounting {
            bytes: metric_total(&text, "stile_cache_bytes") as u64,
            hashes: metric_total(&text, "stile_cache_hashes") as u64,
        })
    }

    /// Every stored message's transactionId, counted.
    pub async fn stored_ids(&self, pg: &tokio_postgres::Client) -> HashMap<String, u32> {
        let sql = match &self.kind {
            Kind::Nats(js) => return js.stored_ids().await,
            Kind::Stile(_) => format!("SELECT transaction_id FROM stile.messages WHERE queue = '{}'", self.system.queue()),
            Kind::Endpoint { design, .. } => format!("SELECT transaction_id FROM {}.messages", design.schema()),
        };
        let rows = pg.query_raw(&sql, std::iter::empty::<i32>()).await.expect("read the stored messages back");
        pin_mut!(rows);
        let mut ids: HashMap<String, u32> = HashMap::new();
        while let Some(row) = rows.next().await {
            let row = row.expect("a stored message");
            *ids.entry(row.get::<_, String>("transaction_id")).or_default() += 1;
        }
        ids
    }
}

fn pid(process: &Process) -> i32 {
    i32::try_from(process.pid()).expect("a pid fits i32")
}

async fn start_endpoint(design: Design, t: &TestDb, config: &StartConfig, redis: Option<(Process, String)>) -> Kind {
    let pg = t.client().await;
    pg.batch_execute(&design.ddl()).await.expect("create the peer's table");
    let mut named = t.config().clone();
    named.pg.application_name(format!("peer-{}", design.schema()));
    let mut command = Command::new(beside_this_program("peer_endpoint"));
    command
        .args(["--design", if design == Design::Postgres { "postgres" } else { "redis-postgres" }])
        .args(["--database-url", &named.to_url(true)])
        .args(["--pool-size", &config.pool_size.to_string()])
        .args(["--window-seconds", &config.window.as_secs().to_string()]);
    let (redis, url) = match redis {
        Some((process, url)) => (Some(process), Some(url)),
        None => (None, None),
    };
    if let Some(url) = &url {
        command.args(["--redis-url", url]);
    }
    let (endpoint, addr) = Process::start_until(command, listening_addr).await;
    Kind::Endpoint { design, endpoint, addr, redis }
}

/// A `redis-server` of the benchmark's own on a free port, keeping nothing
/// on disk (as the machine's own Redis is set up).
async fn start_redis() -> (Process, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
    let mut command = Command::new(std::env::var("STILE_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into()));
    command.args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]);
    let (process, ()) = Process::start_until(command, |line| line.contains("Ready to accept connections").then_some(())).await;
    (process, format!("redis://127.0.0.1:{port}/"))
}

/// Resident memory of a process, in bytes (`VmRSS`; Linux).
pub fn rss_bytes(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:")?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}
