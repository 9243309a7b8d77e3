//! The deduplication a team would write instead of stile, served over HTTP
//! for the `peers` benchmark with the gateway's own stack: hyper's HTTP/1.1
//! server, a task per connection, and a deadpool-postgres pool. It takes
//! the gateway's push body (`{"items":[{queue, partition, transactionId,
//! payload}]}`) and answers each item `queued` or `duplicate` as the gateway
//! does, so that one load generator drives both.
//!
//! Two designs, each as it is usually written:
//!
//! * [`Design::Postgres`]: one table with a unique index on
//!   (partition, transaction_id) and, per request, one
//!   `INSERT … ON CONFLICT DO NOTHING RETURNING`; the rows it returns are
//!   the new items. The index never forgets: there is no window unless a
//!   job deletes old rows.
//! * [`Design::RedisPostgres`]: `SET key 1 NX EX window` for every item (one
//!   pipelined round trip), then a plain insert of the items Redis had not
//!   seen. The check and the write are two systems: if the insert fails
//!   the keys are deleted again (best effort), and a Redis restart forgets
//!   the window, after which a redelivery is stored twice.

use std::collections::HashSet;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use bytes::Bytes;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use serde_json::value::RawValue;
use stile::db::{DbConfig, TlsConnector};
use tokio::net::TcpListener;

/// Which design the endpoint serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Design {
    /// `INSERT … ON CONFLICT DO NOTHING RETURNING` on a unique index.
    Postgres,
    /// `SET NX EX` in Redis, then a plain insert.
    RedisPostgres,
}

impl Design {
    /// The schema holding the design's table in the benchmark database.
    pub fn schema(self) -> &'static str {
        match self {
            Design::Postgres => "peer_http",
            Design::RedisPostgres => "peer_redis",
        }
    }

    /// The design's table: pgbench's peer's, with the unique index only
    /// where it is the check.
    pub fn ddl(self) -> String {
        crate::pgbench::messages_table(self.schema(), self == Design::Postgres)
    }
}

/// How an endpoint is started.
#[derive(Clone, Debug)]
pub struct EndpointConfig {
    pub design: Design,
    pub listen: SocketAddr,
    /// A libpq connection string (or URL) of the benchmark database.
    pub database_url: String,
    /// `redis://…` for [`Design::RedisPostgres`].
    pub redis_url: Option<String>,
    pub pool_size: usize,
    /// The Redis keys' time to live: the window.
    pub window_seconds: u64,
}

/// Serves `config` until the process is stopped. Prints
/// `peer listening on http://ADDR` once it accepts connections.
pub async fn serve(config: EndpointConfig) -> anyhow::Result<()> {
    // The gateway's own connector, so that the peer and the gateway reach
    // PostgreSQL alike (TLS included).
    let db = DbConfig::parse(&config.database_url).context("parse the database URL")?;
    let connector = TlsConnector::new(&db.tls).context("read the TLS settings' files")?;
    let manager = Manager::from_connect(db.pg, connector, ManagerConfig { recycling_method: RecyclingMethod::Fast });
    let pool = Pool::builder(manager).max_size(config.pool_size).build().context("build the pool")?;
    drop(pool.get().await.context("connect to PostgreSQL")?);
    let redis = match (config.design, &config.redis_url) {
        (Design::RedisPostgres, Some(url)) => {
            let client = redis::Client::open(url.as_str()).context("parse the Redis URL")?;
            Some(client.get_multiplexed_async_connection().await.context("connect to Redis")?)
        }
        (Design::RedisPostgres, None) => anyhow::bail!("the redis-postgres design needs --redis-url"),
        (Design::Postgres, _) => None,
    };
    let endpoint = Arc::new(Endpoint { design: config.design, pool, redis, window_seconds: config.window_seconds });
    let listener = TcpListener::bind(config.listen).await.with_context(|| format!("listen on {}", config.listen))?;
    println!("peer listening on http://{} ({:?})", listener.local_addr()?, config.design);
    loop {
        let (stream, _) = listener.accept().await.context("accept")?;
        let _ = stream.set_nodelay(true);
        let endpoint = endpoint.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let endpoint = endpoint.clone();
                async move { Ok::<_, Infallible>(endpoint.handle(request).await) }
            });
            let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

/// The largest body taken, as the gateway's default.
const BODY_LIMIT: usize = 16 << 20;

struct Endpoint {
    design: Design,
    pool: Pool,
    redis: Option<redis::aio::MultiplexedConnection>,
    window_seconds: u64,
}

#[derive(Deserialize)]
struct Push<'a> {
    #[serde(borrow)]
    items: Vec<Item<'a>>,
}

#[derive(Deserialize)]
struct Item<'a> {
    queue: &'a str,
    partition: &'a str,
    #[serde(rename = "transactionId")]
    transaction_id: &'a str,
    #[serde(borrow)]
    payload: &'a RawValue,
}

/// The rows of one request, as the insert's arrays take them.
struct Rows {
    partitions: Vec<String>,
    transaction_ids: Vec<String>,
    payloads: Vec<String>,
}

impl Rows {
    fn of<'a>(items: impl Iterator<Item = &'a Item<'a>>) -> Rows {
        let mut rows = Rows { partitions: Vec::new(), transaction_ids: Vec::new(), payloads: Vec::new() };
        for item in items {
            rows.partitions.push(partition_key(item));
            rows.transaction_ids.push(item.transaction_id.to_owned());
            rows.payloads.push(item.payload.get().to_owned());
        }
        rows
    }
}

/// A queue's partition, as one column.
fn partition_key(item: &Item<'_>) -> String {
    format!("{}/{}", item.queue, item.partition)
}

impl Endpoint {
    async fn handle(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
        if request.method() != Method::POST || request.uri().path() != "/api/v1/push" {
            return reply(StatusCode::NOT_FOUND, r#"{"error":"only POST /api/v1/push is served"}"#.into());
        }
        let body = match Limited::new(request.into_body(), BODY_LIMIT).collect().await {
            Ok(body) => body.to_bytes(),
            Err(e) => return reply(StatusCode::PAYLOAD_TOO_LARGE, format!(r#"{{"error":"the body: {e}"}}"#)),
        };
        let push: Push<'_> = match serde_json::from_slice(&body) {
            Ok(push) => push,
            Err(e) => return reply(StatusCode::BAD_REQUEST, serde_json::json!({ "error": e.to_string() }).to_string()),
        };
        if push.items.is_empty() {
            return reply(StatusCode::BAD_REQUEST, r#"{"error":"items is empty"}"#.into());
        }
        let verdicts = match self.design {
            Design::Postgres => self.insert_on_conflict(&push.items).await,
            Design::RedisPostgres => self.redis_then_insert(&push.items).await,
        };
        match verdicts {
            Ok(new) => reply(StatusCode::CREATED, answers(&push.items, &new)),
            Err(e) => reply(StatusCode::SERVICE_UNAVAILABLE, serde_json::json!({ "error": format!("{e:#}") }).to_string()),
        }
    }

    /// One `INSERT … ON CONFLICT DO NOTHING RETURNING`: an item is new when
    /// its row came back (the first of equal items in a request, since
    /// a statement's later rows conflict with its earlier ones).
    async fn insert_on_conflict(&self, items: &[Item<'_>]) -> anyhow::Result<Vec<bool>> {
        let rows = Rows::of(items.iter());
        let client = self.pool.get().await?;
        let statement = client
            .prepare_cached(
                "INSERT INTO peer_http.messages (partition, transaction_id, payload)
                 SELECT p, t, j::json FROM unnest($1::text[], $2::text[], $3::text[]) AS u(p, t, j)
                 ON CONFLICT (partition, transaction_id) DO NOTHING
                 RETURNING partition, transaction_id",
            )
            .await?;
        let returned = client.query(&statement, &[&rows.partitions, &rows.transaction_ids, &rows.payloads]).await?;
        let mut inserted: HashSet<(String, String)> =
            returned.iter().map(|row| (row.get::<_, String>("partition"), row.get::<_, String>("transaction_id"))).collect();
        Ok(items.iter().map(|item| inserted.remove(&(partition_key(item), item.transaction_id.to_owned()))).collect())
    }

    /// `SET NX EX` for every item in one pipeline, then one plain insert of
    /// those Redis set. If the insert fails, the keys it set are deleted so
    /// that the producer's retry is not taken for a duplicate.
    async fn redis_then_insert(&self, items: &[Item<'_>]) -> anyhow::Result<Vec<bool>> {
        let mut redis = self.redis.clone().expect("the redis design has a connection");
        let keys: Vec<String> =
            items.iter().map(|item| format!("dedup:{}:{}:{}", item.queue, item.partition, item.transaction_id)).collect();
        let mut pipe = redis::pipe();
        for key in &keys {
            pipe.cmd("SET").arg(key).arg(1).arg("NX").arg("EX").arg(self.window_seconds);
        }
        let set: Vec<Option<String>> = pipe.query_async(&mut redis).await.context("SET NX in Redis")?;
        let new: Vec<bool> = set.iter().map(Option::is_some).collect();
        if new.iter().any(|&n| n) {
            let rows = Rows::of(items.iter().zip(&new).filter(|(_, n)| **n).map(|(item, _)| item));
            if let Err(e) = self.insert_plain(&rows).await {
                let set_keys: Vec<&String> = keys.iter().zip(&new).filter(|(_, n)| **n).map(|(key, _)| key).collect();
                let _: Result<(), _> = redis::cmd("DEL").arg(&set_keys).query_async(&mut redis).await;
                return Err(e);
            }
        }
        Ok(new)
    }

    async fn insert_plain(&self, rows: &Rows) -> anyhow::Result<()> {
        let client = self.pool.get().await?;
        let statement = client
            .prepare_cached(
                "INSERT INTO peer_redis.messages (partition, transaction_id, payload)
                 SELECT p, t, j::json FROM unnest($1::text[], $2::text[], $3::text[]) AS u(p, t, j)",
            )
            .await?;
        client.execute(&statement, &[&rows.partitions, &rows.transaction_ids, &rows.payloads]).await?;
        Ok(())
    }
}

/// The gateway's answer shape, one result per item in order.
fn answers(items: &[Item<'_>], new: &[bool]) -> String {
    let results: Vec<serde_json::Value> = items
        .iter()
        .zip(new)
        .map(|(item, &new)| {
            serde_json::json!({ "transactionId": item.transaction_id, "status": if new { "queued" } else { "duplicate" } })
        })
        .collect();
    serde_json::json!({ "results": results }).to_string()
}

fn reply(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("a well-formed response")
}
