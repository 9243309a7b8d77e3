//! The PostgreSQL half of stile: schema migrations, the push function and the
//! reads, hydration, configure and retention calls around it.
//!
//! Every verdict is computed by `stile.push` in PostgreSQL, under the
//! partition row lock, before an offset is allocated (see `host/sql/`). This
//! module only moves arrays in and typed results out, one round trip per
//! call.

mod error;
mod migrate;
mod packed;
mod tls;
mod url;

use std::time::Duration;

use bytestring::ByteString;
use deadpool_postgres::{GenericClient, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use stile_guest::OwnedRow;
use uuid::Uuid;

use crate::payload::Payload;
pub use error::{ANSWER_TOO_LARGE, DbError};
pub use migrate::{MIGRATIONS, Migration};
use packed::{JsonStrings, JsonTexts, PackedFloors, PackedIds};
pub use tls::{Connected, RootCert, SslMode, TlsConnector, TlsSettings};
pub use url::DbConfig;

/// A pool of connections to the database stile keeps its logs in. Cheap to
/// clone; all clones share the pool.
#[derive(Clone)]
pub struct Db {
    pool: Pool,
    config: DbConfig,
    /// What opens every connection of this pool and of the pools made from
    /// it ([`Db::with_own_pool`]).
    connector: TlsConnector,
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Db").field("url", &self.redacted_url()).field("pool", &self.pool.status()).finish()
    }
}

/// A partition as the gateway memoises it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionMeta {
    /// `stile.partitions.id`.
    pub id: i64,
    /// The queue's dedup window in seconds (0: deduplication off).
    pub window_seconds: i32,
    /// The allocator: the last offset handed out, -1 while empty.
    pub last_offset: i64,
    /// The purge watermark: offsets below it have no log row any more.
    pub txns_start: i64,
}

/// One segment of a bundle: consecutive messages of one partition.
#[derive(Debug, Clone, PartialEq)]
pub struct SegmentPush {
    /// The partition (from [`Db::resolve_partition`]).
    pub partition_id: i64,
    /// The offset at or below which the cache vouches that none of the
    /// segment's hashes occurs; -1 when it cannot vouch.
    pub p_verified: i64,
    /// The window (seconds) the cache planned under. If the queue's window is
    /// now larger, `p_verified` is ignored and the whole window is probed.
    pub planned_window_seconds: i32,
    /// The messages' [`txn_hash`](crate::hash::txn_hash)es, 16 bytes each,
    /// concatenated in message order.
    pub hashes: Vec<u8>,
    /// The messages' ids (UUIDv7, minted by the gateway).
    pub message_ids: Vec<Uuid>,
    /// The messages' transactionIds.
    pub transaction_ids: Vec<ByteString>,
    /// The messages' payloads, stored as `json`, as sent.
    pub payloads: Vec<Payload>,
    /// For a segment of replays only: each hash's own offset at or below
    /// which the cache vouches that that hash does not occur, one per
    /// message, each at or above `p_verified`. The push function then looks
    /// for each original in the log row just above its floor, rather than in
    /// every row above `p_verified`. `None`: the segment is probed from
    /// `p_verified`.
    pub hash_floors: Option<Vec<i64>>,
    /// Whether every hash of the segment is one the cache has seen (likely
    /// all duplicates): the push function then first looks for every
    /// original among committed rows without the partition's row lock, and
    /// takes the lock only when one is not found there.
    pub replays: bool,
}

impl SegmentPush {
    /// The number of messages.
    pub fn len(&self) -> usize {
        self.message_ids.len()
    }

    /// True for a segment without messages (refused by [`Db::push_bundle`]).
    pub fn is_empty(&self) -> bool {
        self.message_ids.is_empty()
    }
}

/// What the cache assumed of PostgreSQL's clock when it planned a bundle: its
/// `now` less its skew slack, in ms since the Unix epoch. It judged which
/// hashes are older than the window by that time, so the push function
/// honours the bundle's `p_verified`s only while its clock is at or past it,
/// and otherwise probes the whole window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ClockFloor(pub i64);

impl ClockFloor {
    /// No assumption beyond the Unix epoch: for pushes whose vouches do not
    /// depend on the age of what is stored (tools and tests).
    pub const EPOCH: ClockFloor = ClockFloor(0);
}

/// How much of the window the push function compared a segment against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProbeMode {
    /// The cache's `p_verified` covered every stored offset: no probe.
    Skipped,
    /// Probed only above `p_verified`.
    Narrowed,
    /// Probed the whole window (above the purge watermark).
    Full,
    /// A segment of replays whose every hash was found among committed rows,
    /// without the partition's row lock: all duplicates, nothing locked.
    Committed,
    /// The window is 0: no probe (the hashes were still written).
    Off,
}

impl ProbeMode {
    /// The name `stile.push` returns, and a metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeMode::Skipped => "skipped",
            ProbeMode::Narrowed => "narrowed",
            ProbeMode::Full => "full",
            ProbeMode::Committed => "committed",
            ProbeMode::Off => "off",
        }
    }

    fn parse(s: &str) -> Result<Self, DbError> {
        Ok(match s {
            "skipped" => ProbeMode::Skipped,
            "narrowed" => ProbeMode::Narrowed,
            "full" => ProbeMode::Full,
            "committed" => ProbeMode::Committed,
            "off" => ProbeMode::Off,
            other => return Err(DbError::Protocol(format!("unknown probe mode {other:?}"))),
        })
    }
}

/// The original of a duplicate message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Duplicate {
    /// The duplicate's index in its segment.
    pub index: u32,
    /// The original's offset: the first occurrence inside the window.
    pub offset: i64,
    /// The original's message id. The nil UUID only when retention already
    /// removed the original's segment (a retention shorter than the window
    /// keeps the hashes for the window but not the messages).
    pub message_id: Uuid,
}

/// What became of one segment of a bundle.
///
/// Its duplicates wrote nothing; its other messages, in their order, were
/// stored at consecutive offsets from `stored.base_offset`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentOutcome {
    /// The window in force, in seconds.
    pub window_seconds: i32,
    /// What the probe did (`Skipped` and `Off` only for a segment without
    /// duplicates).
    pub probe: ProbeMode,
    /// The messages already stored, by ascending index.
    pub duplicates: Vec<Duplicate>,
    /// Where the others went; `None` when every message was a duplicate.
    pub stored: Option<Stored>,
    /// PostgreSQL's clock when it probed the segment, in ms since the epoch,
    /// rounded down: a reading to bound that clock by.
    pub clock_ms: i64,
}

/// Where the messages of a segment that are not duplicates were stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stored {
    /// The offset of the first of them.
    pub base_offset: i64,
    /// The rows' `created_at` (database clock) in ms since the epoch,
    /// rounded up.
    pub created_ms: i64,
}

impl SegmentOutcome {
    /// The outcome of each of the segment's `len` messages, by index: the
    /// duplicates' originals, and the others' offsets in order from
    /// `stored.base_offset`.
    pub fn per_message(&self, len: usize) -> Vec<MessageOutcome> {
        let mut out = Vec::with_capacity(len);
        let mut duplicates = self.duplicates.iter().peekable();
        let mut next_offset = self.stored.map(|s| s.base_offset);
        for index in 0..len {
            match duplicates.next_if(|d| d.index as usize == index) {
                Some(d) => out.push(MessageOutcome::Duplicate(*d)),
                None => {
                    let offset = next_offset.expect("a message that is not a duplicate was stored");
                    out.push(MessageOutcome::Stored { offset });
                    next_offset = Some(offset + 1);
                }
            }
        }
        assert!(duplicates.next().is_none(), "every duplicate names a message of the segment");
        out
    }
}

/// What became of one message of a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageOutcome {
    Stored { offset: i64 },
    Duplicate(Duplicate),
}

/// A partition's recent log rows' hashes and its watermarks, read in one
/// snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HydrationRows {
    /// The allocator at the snapshot: every row at or below it is in `rows`
    /// if it was created inside the requested window plus slack.
    pub last_offset: i64,
    /// The purge watermark at the snapshot.
    pub txns_start: i64,
    /// The rows, by ascending `base_offset`.
    pub rows: Vec<OwnedRow>,
    /// PostgreSQL's clock that the window's cutoff was taken from, in ms
    /// since the epoch, rounded down: a reading to bound that clock by.
    pub clock_ms: i64,
}

/// What one [`Db::purge`] pass removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PurgeReport {
    /// Partitions visited (those whose queue has a retention).
    pub partitions: u64,
    /// Log rows whose messages were removed (their hashes stay while the
    /// window holds them).
    pub segments_deleted: u64,
    /// Log rows deleted.
    pub txns_deleted: u64,
}

/// The call of the push function, its arguments named: a bundle's segments
/// as parallel arrays, one element per segment, in the order the partitions'
/// locks are taken (see `host/sql/functions/push.sql`).
const PUSH_SQL: &str = "SELECT seg, base_offset, created_ms, window_seconds, probe, dup_idx, dup_off, dup_ids, clock_ms \
     FROM stile.push(p_route => $1, p_partition_ids => $2, p_verified => $3, p_planned_windows => $4, p_counts => $5, \
                     p_hashes => $6, p_message_ids => $7, p_transaction_ids => $8, p_payloads => $9, \
                     p_clock_floor_ms => $10, p_hash_floors => $11, p_replays => $12)";

impl Db {
    /// Opens a pool of at most `pool_size` connections to `url` (libpq
    /// keyword/value or URI form; empty: libpq's defaults and `PG*`
    /// variables, see [`DbConfig::parse`]) and checks that one connection
    /// can be made.
    pub async fn connect(url: &str, pool_size: usize) -> Result<Db, DbError> {
        let config = DbConfig::parse(url)?;
        Db::from_config(config, pool_size).await
    }

    /// Like [`Db::connect`], from a parsed configuration used as is. Reads
    /// the files its TLS settings name here, once.
    pub async fn from_config(config: DbConfig, pool_size: usize) -> Result<Db, DbError> {
        let connector = TlsConnector::new(&config.tls)?;
        let db = Db { pool: build_pool(&config.pg, &connector, pool_size)?, config, connector };
        drop(db.pool.get().await?);
        Ok(db)
    }

    /// A pool of its own, of `pool_size` connections to the same database,
    /// opened on first use, for a shard's bundles and hydrations: every
    /// statement on them is a transaction of its own. A connection's I/O runs
    /// on the runtime that opened it.
    ///
    /// Its sessions set `stile.autocommit_push`, which tells `stile.push`
    /// that its call is the whole transaction: a call that stored nothing
    /// (every message a duplicate) then commits without waiting for the WAL
    /// flush, since it wrote only row locks. Connections that run
    /// transactions of several statements (the main pool's) never set it.
    pub fn with_own_pool(&self, pool: OwnPool) -> Result<Db, DbError> {
        let mut pg = self.config.pg.clone();
        // A zero `lock_timeout` would mean no limit: the shortest is 1 ms.
        let ms = pool.lock_timeout.as_millis().max(1);
        let own = format!("-c lock_timeout={ms} -c stile.autocommit_push=on");
        let options = match self.config.pg.get_options() {
            Some(given) if !given.trim().is_empty() => format!("{given} {own}"),
            _ => own,
        };
        pg.options(&options);
        Ok(Db {
            pool: build_pool(&pg, &self.connector, pool.size)?,
            config: self.config.clone(),
            connector: self.connector.clone(),
        })
    }

    /// Which of `partition_ids` have their row locked by another session
    /// right now: those `FOR UPDATE SKIP LOCKED` passes over. The rows it
    /// does lock are let go when the statement ends. After a lock wait timed
    /// out, this tells a row held elsewhere (whose segments can be set
    /// aside) from a table lock or a passing wait (none found).
    pub async fn partitions_locked_elsewhere(&self, partition_ids: &[i64]) -> Result<Vec<i64>, DbError> {
        let client = self.pool.get().await?;
        let stmt = client.prepare_cached("SELECT id FROM stile.partitions_locked_elsewhere($1) AS id").await?;
        let held: Vec<i64> =
            client.query(&stmt, &[&partition_ids]).await?.iter().map(|row| row.try_get("id")).collect::<Result<_, _>>()?;
        Ok(partition_ids.iter().copied().filter(|id| held.contains(id)).collect())
    }

    /// The connection string in use, keyword/value form, password hidden.
    pub fn redacted_url(&self) -> String {
        self.config.to_url(false)
    }

    /// The underlying pool (for tests, tools and health checks).
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// One round trip on a pooled connection (for health checks).
    pub async fn ping(&self) -> Result<(), DbError> {
        let client = self.pool.get().await?;
        client.simple_query("SELECT 1").await?;
        Ok(())
    }

    /// Applies the migrations in `host/sql/` that the database lacks, each in
    /// its own transaction under a transaction-scoped advisory lock, so any
    /// number of gateways may start against one database at once.
    pub async fn migrate(&self) -> Result<(), DbError> {
        self.migrate_with(MIGRATIONS).await
    }

    /// Like [`Db::migrate`], with `migrations` in place of this build's
    /// [`MIGRATIONS`] (and this build's functions after them): for testing
    /// what a later migration does.
    pub async fn migrate_with(&self, migrations: &[Migration]) -> Result<(), DbError> {
        let mut client = self.pool.get().await?;
        migrate::run(&mut client, migrations).await
    }

    /// A reading of PostgreSQL's clock (`clock_timestamp()`), in ms since the
    /// epoch, rounded down.
    pub async fn clock_ms(&self) -> Result<i64, DbError> {
        let client = self.pool.get().await?;
        let row = client.query_one("SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS clock_ms", &[]).await?;
        Ok(row.try_get("clock_ms")?)
    }

    /// How many more connections the server takes from this gateway's
    /// role: its `max_connections`, less the slots it keeps for superusers
    /// (where this role is not one) and those open now.
    pub async fn connection_room(&self) -> Result<ConnectionRoom, DbError> {
        let client = self.pool.get().await?;
        let row = client
            .query_one(
                "SELECT current_setting('max_connections')::integer AS max_connections, \
                        CASE WHEN r.rolsuper THEN 0 \
                             ELSE current_setting('superuser_reserved_connections')::integer \
                                  + coalesce(nullif(current_setting('reserved_connections', true), '')::integer, 0) \
                        END AS reserved, \
                        (SELECT count(*)::integer FROM pg_stat_activity WHERE backend_type = 'client backend') AS open \
                   FROM pg_roles r WHERE r.rolname = current_user",
                &[],
            )
            .await?;
        let count = |column: &str| -> Result<usize, DbError> { Ok(usize::try_from(row.try_get::<_, i32>(column)?).unwrap_or(0)) };
        Ok(ConnectionRoom { max_connections: count("max_connections")?, reserved: count("reserved")?, open: count("open")? })
    }

    /// The schema version the database is at (0 before any migration).
    pub async fn schema_version(&self) -> Result<i32, DbError> {
        let client = self.pool.get().await?;
        migrate::version(&client).await
    }

    /// Returns a partition's id, window and watermarks, creating its queue
    /// (from defaults) and the partition on first use.
    pub async fn resolve_partition(&self, queue: &str, partition: &str) -> Result<PartitionMeta, DbError> {
        let client = self.pool.get().await?;
        let mut metas = resolve_partitions_on(&client, &[PartitionName { queue, partition }]).await?;
        Ok(metas.pop().expect("one meta per name"))
    }

    /// Pushes a bundle of segments in one round trip and one transaction.
    /// Returns one outcome per segment, in order. A duplicate writes nothing;
    /// every other message is stored, whatever became of its neighbours. The
    /// segments' `p_verified`s count only while PostgreSQL's clock is at or
    /// past `clock_floor`.
    pub async fn push_bundle(&self, clock_floor: ClockFloor, segments: &[SegmentPush]) -> Result<Vec<SegmentOutcome>, DbError> {
        if segments.is_empty() {
            return Ok(Vec::new());
        }
        let client = self.pool.get().await?;
        push_on(&client, clock_floor, segments).await
    }

    /// A partition's log rows created in the last `window_seconds` plus
    /// `slack_ms`, with its `last_offset` and `txns_start` and a reading of
    /// PostgreSQL's clock, all in one snapshot.
    pub async fn hydration(&self, partition_id: i64, window_seconds: i32, slack_ms: u32) -> Result<HydrationRows, DbError> {
        let slack_ms = i32::try_from(slack_ms).unwrap_or(i32::MAX);
        let client = self.pool.get().await?;
        let stmt = client
            .prepare_cached(
                "SELECT last_offset, txns_start, base_offset, end_offset, created_ms, hashes, clock_ms \
                 FROM stile.hydration($1, $2, $3)",
            )
            .await?;
        let rows = client.query(&stmt, &[&partition_id, &window_seconds, &slack_ms]).await?;
        let Some(first) = rows.first() else {
            return Err(DbError::NotFound(format!("partition {partition_id}")));
        };
        let mut out = HydrationRows {
            last_offset: first.try_get("last_offset")?,
            txns_start: first.try_get("txns_start")?,
            rows: Vec::with_capacity(rows.len()),
            clock_ms: first.try_get("clock_ms")?,
        };
        for row in &rows {
            let Some(base_offset) = row.try_get::<_, Option<i64>>("base_offset")? else {
                continue;
            };
            out.rows.push(OwnedRow {
                base_offset,
                end_offset: row.try_get("end_offset")?,
                created_ms: row.try_get("created_ms")?,
                hashes: row.try_get("hashes")?,
            });
        }
        Ok(out)
    }

    /// Applies every queue's retention: for each partition of a queue with
    /// `retentionSeconds` > 0, in its own short transaction under its row
    /// lock, removes the messages older than the retention and deletes the
    /// log rows older than max(retention, window), raising `txns_start` past
    /// them. A queue with retention 0 keeps everything.
    pub async fn purge(&self) -> Result<PurgeReport, DbError> {
        let client = self.pool.get().await?;
        let ids: Vec<i64> = client
            .query("SELECT stile.purge_candidates() AS partition_id", &[])
            .await?
            .iter()
            .map(|r| r.try_get("partition_id"))
            .collect::<Result<_, _>>()?;
        let stmt = client.prepare_cached("SELECT segments_deleted, txns_deleted FROM stile.purge_partition($1)").await?;
        let mut report = PurgeReport::default();
        for id in ids {
            let row = client.query_one(&stmt, &[&id]).await?;
            report.partitions += 1;
            report.segments_deleted += row.try_get::<_, i64>("segments_deleted")? as u64;
            report.txns_deleted += row.try_get::<_, i64>("txns_deleted")? as u64;
        }
        Ok(report)
    }
}

/// A pool of a [`Db`]'s own, beside the one it was opened with.
#[derive(Clone, Copy, Debug)]
pub struct OwnPool {
    /// Most connections open at once.
    pub size: usize,
    /// The longest any statement on these connections waits for a lock
    /// (PostgreSQL's `lock_timeout`).
    pub lock_timeout: Duration,
}

/// What the server has room for, as [`Db::connection_room`] reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionRoom {
    pub max_connections: usize,
    /// Slots this role cannot take (kept for superusers).
    pub reserved: usize,
    /// Connections open now, this gateway's included.
    pub open: usize,
}

impl ConnectionRoom {
    /// Connections this role may still open.
    pub fn free(&self) -> usize {
        self.max_connections.saturating_sub(self.reserved).saturating_sub(self.open)
    }
}

/// A pool of up to `pool_size` connections, none opened yet, each opened by
/// `connector`.
fn build_pool(config: &tokio_postgres::Config, connector: &TlsConnector, pool_size: usize) -> Result<Pool, DbError> {
    if pool_size == 0 {
        return Err(DbError::Config("the pool size must be at least 1".into()));
    }
    let manager =
        Manager::from_connect(config.clone(), connector.clone(), ManagerConfig { recycling_method: RecyclingMethod::Fast });
    Pool::builder(manager)
        .max_size(pool_size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(Duration::from_secs(10)))
        .create_timeout(Some(Duration::from_secs(5)))
        .recycle_timeout(Some(Duration::from_secs(5)))
        .build()
        .map_err(|e| DbError::Config(e.to_string()))
}

/// A partition by its names, as a request gives them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PartitionName<'a> {
    pub queue: &'a str,
    pub partition: &'a str,
}

/// Resolves partitions on `client`, creating those that do not exist yet,
/// and answers their metadata in the order of `names`. Inside an open
/// transaction the queues and partitions it creates are that transaction's:
/// gone if it rolls back. The lookups are pipelined (one round trip for
/// any number), and sent in the order of `names`: callers that may create
/// several in one transaction pass them sorted, so that two such
/// transactions take the names' index entries in one order and cannot
/// deadlock.
pub async fn resolve_partitions_on(
    client: &impl GenericClient,
    names: &[PartitionName<'_>],
) -> Result<Vec<PartitionMeta>, DbError> {
    // A transaction whose partitions are all memoised looks nothing up.
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let stmt = client
        .prepare_cached(
            "SELECT partition_id, window_seconds, last_offset, txns_start \
             FROM stile.resolve_partition($1, $2)",
        )
        .await?;
    let stmt = &stmt;
    let lookups = names.iter().map(|name| async move { client.query_one(stmt, &[&name.queue, &name.partition]).await });
    let rows = futures::future::try_join_all(lookups).await.map_err(|e| match e.as_db_error() {
        // A queue or partition name the schema refuses.
        Some(db) if *db.code() == tokio_postgres::error::SqlState::CHECK_VIOLATION => DbError::Invalid(db.message().to_string()),
        _ => DbError::from(e),
    })?;
    rows.iter()
        .map(|row| {
            Ok(PartitionMeta {
                id: row.try_get("partition_id")?,
                window_seconds: row.try_get("window_seconds")?,
                last_offset: row.try_get("last_offset")?,
                txns_start: row.try_get("txns_start")?,
            })
        })
        .collect()
}

/// Runs `stile.push` for a bundle on `client`: on a pooled connection it is
/// a transaction of its own; inside an open transaction (a transaction
/// request, a timer's fire) it is part of it. See [`Db::push_bundle`].
///
/// The segments are sent in ascending partition order (a partition's in
/// their order), the order the push function takes row locks in, and each
/// one's messages packed as the function stores them: ids as 16 bytes each,
/// transactionIds and payloads as one JSON array each. The outcomes come back
/// in the order of `segments`.
pub async fn push_on(
    client: &impl GenericClient,
    clock_floor: ClockFloor,
    segments: &[SegmentPush],
) -> Result<Vec<SegmentOutcome>, DbError> {
    // A transaction of KV operations or timers alone pushes nothing, and
    // the push function routes a bundle by its first segment.
    if segments.is_empty() {
        return Ok(Vec::new());
    }
    let mut order: Vec<usize> = (0..segments.len()).collect();
    order.sort_by_key(|&i| segments[i].partition_id);
    let mut partition_ids = Vec::with_capacity(segments.len());
    let mut verified = Vec::with_capacity(segments.len());
    let mut planned = Vec::with_capacity(segments.len());
    let mut counts = Vec::with_capacity(segments.len());
    let mut hashes: Vec<&[u8]> = Vec::with_capacity(segments.len());
    let mut message_ids = Vec::with_capacity(segments.len());
    let mut transaction_ids = Vec::with_capacity(segments.len());
    let mut payloads = Vec::with_capacity(segments.len());
    let mut hash_floors = Vec::with_capacity(segments.len());
    let mut replays = Vec::with_capacity(segments.len());
    for &i in &order {
        let s = &segments[i];
        let n = s.len();
        let floors = s.hash_floors.as_ref().map_or(n, Vec::len);
        if n == 0 || s.transaction_ids.len() != n || s.payloads.len() != n || s.hashes.len() != 16 * n || floors != n {
            return Err(DbError::Invalid(format!(
                "segment {i}: {} message ids, {} transaction ids, {} payloads, {} hash bytes, {floors} hash floors",
                n,
                s.transaction_ids.len(),
                s.payloads.len(),
                s.hashes.len()
            )));
        }
        let n = i32::try_from(n).map_err(|_| DbError::Invalid(format!("segment {i}: too many messages")))?;
        partition_ids.push(s.partition_id);
        verified.push(s.p_verified);
        planned.push(s.planned_window_seconds);
        counts.push(n);
        hashes.push(&s.hashes);
        message_ids.push(PackedIds(&s.message_ids));
        transaction_ids.push(JsonStrings(&s.transaction_ids));
        payloads.push(JsonTexts(&s.payloads));
        hash_floors.push(s.hash_floors.as_deref().map(PackedFloors));
        replays.push(s.replays);
    }
    // No floors at all: NULL, not an array of NULLs.
    let hash_floors = hash_floors.iter().any(Option::is_some).then_some(hash_floors);
    let replays = replays.contains(&true).then_some(replays);
    let route = partition_ids[0];
    let stmt = client.prepare_cached(PUSH_SQL).await?;
    let rows = client
        .query(
            &stmt,
            &[
                &route,
                &partition_ids,
                &verified,
                &planned,
                &counts,
                &hashes,
                &message_ids,
                &transaction_ids,
                &payloads,
                &clock_floor.0,
                &hash_floors,
                &replays,
            ],
        )
        .await?;
    if rows.len() != segments.len() {
        return Err(DbError::Protocol(format!("stile.push returned {} rows for {} segments", rows.len(), segments.len())));
    }
    let mut out: Vec<Option<SegmentOutcome>> = vec![None; segments.len()];
    for row in &rows {
        let seg: i32 = row.try_get("seg")?;
        let Some(&i) = usize::try_from(seg).ok().and_then(|seg| order.get(seg)) else {
            return Err(DbError::Protocol(format!("a row for segment {seg} of {}", segments.len())));
        };
        if out[i].is_some() {
            return Err(DbError::Protocol(format!("two rows for segment {seg}")));
        }
        out[i] = Some(segment_outcome(row, i, segments[i].len())?);
    }
    Ok(out.into_iter().map(|o| o.expect("every segment has its row: as many rows as segments, none twice")).collect())
}

/// One row of `stile.push`, for segment `i` of `len` messages.
fn segment_outcome(row: &tokio_postgres::Row, i: usize, len: usize) -> Result<SegmentOutcome, DbError> {
    let base: Option<i64> = row.try_get("base_offset")?;
    let stored = match base {
        Some(base_offset) => Some(Stored { base_offset, created_ms: row.try_get("created_ms")? }),
        None => None,
    };
    let idx: Option<Vec<i32>> = row.try_get("dup_idx")?;
    let off: Option<Vec<i64>> = row.try_get("dup_off")?;
    let ids: Option<Vec<Option<Uuid>>> = row.try_get("dup_ids")?;
    let (idx, off, ids) = (idx.unwrap_or_default(), off.unwrap_or_default(), ids.unwrap_or_default());
    let indexes_ascend = idx.windows(2).all(|w| w[0] < w[1]);
    let in_segment = idx.iter().all(|&x| usize::try_from(x).is_ok_and(|x| x < len));
    let accounted = stored.is_some() == (idx.len() < len);
    if idx.len() != off.len() || idx.len() != ids.len() || !indexes_ascend || !in_segment || !accounted {
        return Err(DbError::Protocol(format!(
            "segment {i}: {} duplicates of {len} messages, stored: {}",
            idx.len(),
            stored.is_some()
        )));
    }
    let duplicates = idx
        .into_iter()
        .zip(off)
        .zip(ids)
        .map(|((index, offset), message_id)| Duplicate {
            index: index as u32,
            offset,
            message_id: message_id.unwrap_or(Uuid::nil()),
        })
        .collect();
    let window_seconds: i32 = row.try_get("window_seconds")?;
    let probe = ProbeMode::parse(row.try_get("probe")?)?;
    let clock_ms: i64 = row.try_get("clock_ms")?;
    Ok(SegmentOutcome { window_seconds, probe, duplicates, stored, clock_ms })
}
