//! A shard: one long-lived worker that owns one cache and the pending pushes
//! of the partitions that map to it.
//!
//! The worker is the only code that touches its cache, so a partition's
//! flushes are single-flight by construction: a partition with a segment (or
//! a hydration) in flight is busy, and what arrives for it meanwhile waits in
//! its queue and is coalesced into the next segment. Every ready partition of
//! the shard goes to PostgreSQL in one bundle.
//!
//! The cache only chooses `p_verified`. Every verdict comes back from the push
//! function; the worker merely delivers it to each waiter.
//!
//! The cache judges age by the `now` the worker gives it, and that is never
//! this host's wall clock: it is a lower bound of PostgreSQL's clock
//! ([`DbClock`]), from the readings every push and hydration returns and the
//! monotonic clock since. Each bundle carries that `now` less the skew slack
//! ([`ClockFloor`]), and the push function refuses the vouches of a bundle
//! whose floor its clock has not reached. A reading that shows PostgreSQL's
//! clock stepped back replaces the cache.
//!
//! This module holds the worker, its queues and its handle; the worker's
//! jobs each have a file: [`plan`] (what the cache vouches for, and the cuts
//! that let it vouch for more), [`flush`] (bundles out, their outcomes back
//! to the requests and the cache), [`push`] (one bundle's call, a refused
//! segment isolated, locked partitions left out), [`contended`] (partitions
//! another session holds), [`hydrate`] and [`clock`].

mod clock;
mod contended;
mod flush;
mod hydrate;
mod plan;
mod push;

use clock::{wall_clock_ms, warn_clock_offset};
use contended::CONTENDED_CONNECTIONS;
use hydrate::needs_hydration;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use foldhash::{HashMap, HashMapExt as _};
use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt as _};
use stile_guest::{
    Admission, Commit, DbClock, EntryState, Hydration, Millis, Offset, OwnedCommit, OwnedRow, Plan, Reading,
    Segment as CacheSegment, TxnsRow,
};
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use crate::cache::ShardCache;
use crate::db::{ClockFloor, Db, DbError, HydrationRows, MessageOutcome, OwnPool, SegmentOutcome, SegmentPush};
use crate::fusion::{CoalescedSegment, Message, PartitionQueue, Slot};
use crate::log_limit::{self, Limited};
use crate::metrics::Metrics;
use crate::payload::Payload;

/// The final result of one message of a push.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Stored at `offset` with its own id.
    Queued { message_id: Uuid, offset: i64 },
    /// Already stored (or led by an earlier equal id): the original's id and
    /// offset.
    Duplicate { message_id: Uuid, offset: i64 },
}

/// Why a push could not be answered.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PushFailure {
    /// The database is unreachable; a retry is safe.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    #[error("database error: {0}")]
    Database(String),
    /// The gateway is shutting down.
    #[error("the gateway is shutting down")]
    ShuttingDown,
}

/// A request's messages for one partition, as the HTTP layer hands them over.
#[derive(Debug)]
pub struct PartitionPush {
    pub partition_id: i64,
    pub window_seconds: i32,
    /// When `window_seconds` was read from PostgreSQL.
    pub window_read_at: Instant,
    pub messages: Vec<Message>,
    pub reply: oneshot::Sender<Result<Vec<Outcome>, PushFailure>>,
}

/// Tunables of a shard worker.
#[derive(Clone, Copy, Debug)]
pub struct WorkerConfig {
    /// Most messages in one segment.
    pub max_segment: usize,
    /// Most bundles one shard keeps in flight. What arrives meanwhile waits
    /// and joins the next bundle: one bundle in flight makes the fullest
    /// bundles (each a transaction and a commit), which is what PostgreSQL's
    /// CPU per message depends on (bench/load/RESULTS.md).
    pub max_in_flight: usize,
    /// How often idle partitions are expired and gauges published.
    pub housekeeping: Duration,
    /// Whether partitions are hydrated into the cache. Off (`--cache-mb 0`),
    /// no cache entry is ever born: the cache never vouches, and every
    /// segment is probed in full.
    pub hydrate: bool,
    /// The longest a push waits for a partition's row lock (PostgreSQL's
    /// `lock_timeout` on the shard's connections). Only a session other
    /// than a stile push holds one for long (a stile bundle holds its rows
    /// for one round trip and a commit); past it, the partitions found
    /// locked are set aside so that their shard-mates flow.
    pub lock_timeout: Duration,
    /// Where the worker runs.
    pub placement: ShardPlacement,
}

/// Where a shard's worker runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ShardPlacement {
    /// A task of the runtime that serves HTTP (when that runtime is
    /// multi-threaded; on a single-threaded one, a thread of its own): a
    /// request's way to its shard and back wakes a task, usually on the same
    /// thread, not another thread.
    #[default]
    Serving,
    /// A thread of its own, with a single-threaded runtime: every request
    /// crosses to it and back.
    Thread,
}

impl Default for WorkerConfig {
    fn default() -> WorkerConfig {
        WorkerConfig {
            max_segment: 4096,
            max_in_flight: 1,
            housekeeping: Duration::from_secs(1),
            hydrate: true,
            lock_timeout: Duration::from_secs(1),
            placement: ShardPlacement::Serving,
        }
    }
}

/// How long partition metadata is trusted: the gateway memoises a
/// partition's window this long, and a shard forgets a partition idle this
/// long. It bounds how long a configure can go unnoticed by the cache; the
/// push function guards exactness meanwhile.
pub const METADATA_TTL: Duration = Duration::from_secs(30);

/// Connections of a shard's pool beyond one per bundle in flight and the
/// contended partitions' one: hydrations do not wait for pushes.
pub const HYDRATION_CONNECTIONS: usize = 2;

/// The most connections a shard's pool opens, with `max_in_flight` bundles
/// in flight: one per bundle, the contended partitions' one and the
/// hydrations'.
pub fn connections_per_shard(max_in_flight: usize) -> usize {
    max_in_flight + CONTENDED_CONNECTIONS + HYDRATION_CONNECTIONS
}

/// A reading of PostgreSQL's clock: what it said, and when the answer
/// arrived.
#[derive(Clone, Copy, Debug)]
pub struct DbReading {
    pub db_ms: Millis,
    pub received: Instant,
}

/// The sending side of a shard's queue.
#[derive(Clone, Debug)]
pub struct ShardHandle {
    tx: mpsc::Sender<Work>,
}

impl ShardHandle {
    /// Hands a partition's messages to the shard and waits for their outcomes.
    pub async fn push(&self, push: PartitionPushRequest) -> Result<Vec<Outcome>, PushFailure> {
        let (reply, answer) = oneshot::channel();
        let push = PartitionPush {
            partition_id: push.partition_id,
            window_seconds: push.window_seconds,
            window_read_at: push.window_read_at,
            messages: push.messages,
            reply,
        };
        self.tx.send(Work::Push(push)).await.map_err(|_| PushFailure::ShuttingDown)?;
        answer.await.map_err(|_| PushFailure::ShuttingDown)?
    }

    /// Asks the cache what it vouches for a segment that will be pushed
    /// outside the shard's bundles. The vouch stays sound however late the
    /// push runs: it covers offsets already committed, the push function
    /// probes everything above it (it clamps `p_verified` to the allocator
    /// under the row lock), and it honours it only once its clock has
    /// reached the floor. A shard that is gone vouches for nothing.
    pub async fn vouch(&self, request: VouchRequest) -> Vouch {
        let (reply, answer) = oneshot::channel();
        if self.tx.send(Work::Vouch(request, reply)).await.is_err() {
            return Vouch::NONE;
        }
        answer.await.unwrap_or(Vouch::NONE)
    }

    /// Tells the shard's cache of segments committed outside its bundles
    /// (by a transaction or a timer's fire), once they have committed. An
    /// entry that knows every offset below them extends over them, so that
    /// a partition written by transactions is not rebuilt after each one; in
    /// any other order they leave a gap or force a rebuild, never a wrong
    /// vouch (invariant 3).
    pub async fn committed_elsewhere(&self, commits: Vec<OwnedCommit>) {
        if !commits.is_empty() {
            // A shard that is shutting down has no cache left to tell.
            let _ = self.tx.send(Work::CommittedElsewhere(commits)).await;
        }
    }
}

/// What [`ShardHandle::push`] takes.
#[derive(Debug)]
pub struct PartitionPushRequest {
    pub partition_id: i64,
    pub window_seconds: i32,
    pub window_read_at: Instant,
    pub messages: Vec<Message>,
}

/// Starts a shard worker where `config.placement` says; it runs until every
/// handle is dropped and its in-flight work is done.
///
/// Its round trips to PostgreSQL go through a pool of its own: a connection
/// for each bundle in flight, the contended partitions' one and
/// [`HYDRATION_CONNECTIONS`] more, so that hydrations do not wait for
/// bundles. A connection's I/O is driven by the runtime it was opened on,
/// the worker's.
///
/// `first` is a reading of PostgreSQL's clock to start the cache's clock from.
pub fn spawn(
    id: usize,
    cache: ShardCache,
    db: &Db,
    metrics: Arc<Metrics>,
    config: WorkerConfig,
    first: DbReading,
) -> anyhow::Result<(ShardHandle, ShardWorker)> {
    let (tx, rx) = mpsc::channel(1024);
    let clock = DbClock::new(first.db_ms, 0, cache.config().skew_slack_ms);
    // `block_in_place` needs a multi-threaded runtime.
    let serving = match tokio::runtime::Handle::try_current() {
        Ok(handle) if config.placement == ShardPlacement::Serving => {
            (handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread).then_some(handle)
        }
        _ => None,
    };
    let worker = Worker {
        id,
        long_calls: if serving.is_some() { LongCalls::InPlace } else { LongCalls::Inline },
        cache,
        db: db.with_own_pool(OwnPool { size: connections_per_shard(config.max_in_flight), lock_timeout: config.lock_timeout })?,
        metrics,
        config,
        partitions: HashMap::new(),
        queued: BTreeSet::new(),
        requests: HashMap::new(),
        next_request: 0,
        clock,
        mono_origin: first.received,
        in_flight: FuturesUnordered::new(),
        bundles_in_flight: 0,
        contended_in_flight: false,
    };
    match serving {
        Some(handle) => Ok((ShardHandle { tx }, ShardWorker::Task(handle.spawn(worker.run(rx))))),
        None => {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            let thread =
                std::thread::Builder::new().name(format!("stile-shard-{id}")).spawn(move || runtime.block_on(worker.run(rx)))?;
            Ok((ShardHandle { tx }, ShardWorker::Thread(thread)))
        }
    }
}

/// A running shard worker: a task of the serving runtime, or a thread.
#[derive(Debug)]
pub enum ShardWorker {
    Task(tokio::task::JoinHandle<()>),
    Thread(std::thread::JoinHandle<()>),
}

impl ShardWorker {
    /// Waits for the worker to finish (once every handle is dropped).
    pub async fn join(self) {
        let finished = match self {
            ShardWorker::Task(task) => task.await.map_err(|error| format!("{error}")),
            ShardWorker::Thread(thread) => match tokio::task::spawn_blocking(move || thread.join()).await {
                Ok(Err(panic)) => Err(format!("{panic:?}")),
                _ => Ok(()),
            },
        };
        if let Err(panic) = finished {
            tracing::error!(panic, "a shard worker panicked");
        }
    }
}

/// How the worker makes a guest call that may run long (a hydration of a
/// large window takes milliseconds, a runaway guest up to its deadline).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LongCalls {
    /// On the worker's own thread: nothing else runs there.
    Inline,
    /// On a worker of the serving runtime, with `block_in_place`: the
    /// requests that worker thread was serving move to the others meanwhile.
    InPlace,
}

impl LongCalls {
    fn run<R>(self, call: impl FnOnce() -> R) -> R {
        match self {
            LongCalls::Inline => call(),
            LongCalls::InPlace => tokio::task::block_in_place(call),
        }
    }
}

struct Worker {
    id: usize,
    long_calls: LongCalls,
    cache: ShardCache,
    db: Db,
    metrics: Arc<Metrics>,
    config: WorkerConfig,
    partitions: HashMap<i64, PartitionState>,
    /// The partitions whose queue holds messages, in ascending id order:
    /// all a flush looks at, so that its cost follows the work waiting and
    /// not the partitions the shard has seen. Each has a state.
    queued: BTreeSet<i64>,
    requests: HashMap<u64, RequestState>,
    next_request: u64,
    /// The cache's clock: a lower bound of PostgreSQL's, held monotone.
    clock: DbClock,
    /// Where the monotonic milliseconds the clock counts start.
    mono_origin: Instant,
    /// Bundles and hydrations in flight.
    in_flight: FuturesUnordered<BoxFuture<'static, Done>>,
    /// The bundles among them.
    bundles_in_flight: usize,
    /// A contended partition's segment is among them.
    contended_in_flight: bool,
}

#[derive(Debug)]
struct PartitionState {
    /// The partition's window, as last read from PostgreSQL: by the metadata
    /// memo or, fresher, in the outcome of a push.
    window_seconds: i32,
    window_read_at: Instant,
    queue: PartitionQueue,
    /// A segment or a hydration of this partition is in flight.
    busy: bool,
    last_used: Instant,
    /// Set when a push of this partition waited past the lock timeout and
    /// its row was then found locked by another session: from then on its
    /// segments go to PostgreSQL on their own, outside the bundles, one
    /// contended partition at a time per shard, so that the bundles of its
    /// shard-mates never wait on its lock. The first of them to get through
    /// clears it. The instant is when it last went out, which picks the
    /// contended partition whose turn it is.
    contended: Option<Instant>,
}

impl PartitionState {
    fn new(window_seconds: i32, window_read_at: Instant) -> PartitionState {
        PartitionState {
            window_seconds,
            window_read_at,
            queue: PartitionQueue::default(),
            busy: false,
            last_used: Instant::now(),
            contended: None,
        }
    }

    /// Marks the partition busy and takes its next segment, not yet planned.
    fn take_in_flight(&mut self, partition_id: i64, max_segment: usize) -> InFlight {
        self.busy = true;
        InFlight {
            partition_id,
            window_seconds: self.window_seconds,
            state: EntryState::Cold,
            p_verified: stile_guest::NO_VOUCH,
            segment: self.queue.take_segment(max_segment),
        }
    }

    /// Adopts a window reading if it is newer than the one held, so that a
    /// memo up to 30 s old cannot undo what a push just reported.
    fn observe_window(&mut self, window_seconds: i32, read_at: Instant) {
        if read_at >= self.window_read_at {
            self.window_seconds = window_seconds;
            self.window_read_at = read_at;
        }
    }
}

struct RequestState {
    outcomes: Vec<Option<Outcome>>,
    remaining: usize,
    reply: oneshot::Sender<Result<Vec<Outcome>, PushFailure>>,
}

/// A segment in flight, with what the cache said about it.
struct InFlight {
    partition_id: i64,
    window_seconds: i32,
    state: EntryState,
    p_verified: Offset,
    segment: CoalescedSegment,
}

/// What the cache vouches for a segment pushed outside the shard's bundles
/// (inside a transaction, or by a timer's fire): push it with this
/// `p_verified`, and with a clock floor at or after `clock_floor`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Vouch {
    pub p_verified: i64,
    pub clock_floor: ClockFloor,
}

impl Vouch {
    /// No vouch: probe the whole window.
    pub const NONE: Vouch = Vouch { p_verified: -1, clock_floor: ClockFloor::EPOCH };
}

/// A request for a [`Vouch`].
#[derive(Debug)]
pub struct VouchRequest {
    pub partition_id: i64,
    pub window_seconds: i32,
    pub window_read_at: Instant,
    /// The segment's hashes, 16 bytes each, distinct.
    pub hashes: Vec<u8>,
}

/// What a shard's queue carries.
#[derive(Debug)]
enum Work {
    Push(PartitionPush),
    Vouch(VouchRequest, oneshot::Sender<Vouch>),
    /// Segments committed by a transaction or a timer's fire, not by this
    /// shard's bundles.
    CommittedElsewhere(Vec<OwnedCommit>),
}

/// A partition whose cache entry must be (re)built, and under which window.
struct WantsHydration {
    partition_id: i64,
    window_seconds: i32,
}

/// Which way a bundle went to PostgreSQL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lane {
    /// With every ready partition that is not contended, within
    /// `max_in_flight`.
    Shared,
    /// One contended partition's segment on its own.
    Contended,
}

/// A bundle's answer, or a hydration's rows, with the instant they arrived.
enum Done {
    Bundle {
        lane: Lane,
        segments: Vec<InFlight>,
        clock_floor: ClockFloor,
        /// One per segment, in order.
        results: Vec<Result<SegmentOutcome, PushFailure>>,
        /// The bundle's partitions whose rows another session held.
        locked_elsewhere: Vec<i64>,
        sql: Duration,
        received: Instant,
    },
    Hydration {
        partition_id: i64,
        window_seconds: i32,
        result: Result<HydrationRows, DbError>,
        received: Instant,
    },
}

impl Worker {
    async fn run(mut self, mut rx: mpsc::Receiver<Work>) {
        let mut housekeeping = tokio::time::interval(self.config.housekeeping);
        housekeeping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut open = true;
        loop {
            tokio::select! {
                work = rx.recv(), if open => match work {
                    Some(work) => {
                        self.take(work);
                        // Take everything already waiting, so that it joins this flush.
                        while let Ok(work) = rx.try_recv() {
                            self.take(work);
                        }
                    }
                    None => open = false,
                },
                Some(done) = self.in_flight.next(), if !self.in_flight.is_empty() => self.complete(done),
                _ = housekeeping.tick() => self.housekeeping(),
            }
            if !open && self.in_flight.is_empty() && self.queued.is_empty() {
                break;
            }
            self.flush_ready();
        }
        tracing::debug!(shard = self.id, "shard worker stopped");
    }

    fn take(&mut self, work: Work) {
        match work {
            Work::Push(push) => self.accept(push),
            Work::Vouch(request, reply) => self.vouch(request, reply),
            Work::CommittedElsewhere(commits) => {
                let now = self.now();
                self.record(now, &commits);
            }
        }
    }

    /// Plans one segment pushed elsewhere. A partition the cache cannot
    /// vouch for is hydrated, as for the shard's own segments, so that a
    /// partition written only by transactions or fires is vouched for too.
    fn vouch(&mut self, request: VouchRequest, reply: oneshot::Sender<Vouch>) {
        let VouchRequest { partition_id, window_seconds, window_read_at, hashes } = request;
        let now = self.now();
        self.touch(partition_id, window_seconds, window_read_at);
        let query = [CacheSegment { partition: partition_id, window_ms: window_ms(window_seconds), hashes: &hashes }];
        let plan = self.cache_plan(now, &query).pop().expect("the cache answers every segment");
        let _ = reply.send(Vouch { p_verified: plan.p_verified, clock_floor: self.clock_floor(now) });
        if window_seconds > 0 && needs_hydration(plan.state) {
            self.maybe_hydrate(now, partition_id, window_seconds);
        }
    }

    /// A partition's state, made on first use, with the window as last read
    /// and marked used now.
    fn touch(&mut self, partition_id: i64, window_seconds: i32, window_read_at: Instant) -> &mut PartitionState {
        let partition =
            self.partitions.entry(partition_id).or_insert_with(|| PartitionState::new(window_seconds, window_read_at));
        partition.observe_window(window_seconds, window_read_at);
        partition.last_used = Instant::now();
        partition
    }

    fn accept(&mut self, push: PartitionPush) {
        let request = self.next_request;
        self.next_request += 1;
        let count = push.messages.len();
        if count == 0 {
            let _ = push.reply.send(Ok(Vec::new()));
            return;
        }
        self.requests.insert(request, RequestState { outcomes: vec![None; count], remaining: count, reply: push.reply });
        let partition = self.touch(push.partition_id, push.window_seconds, push.window_read_at);
        let indexed = push.messages.into_iter().enumerate().map(|(i, m)| (u32::try_from(i).expect("requests are bounded"), m));
        partition.queue.add(request, indexed);
        self.queued.insert(push.partition_id);
    }

    fn housekeeping(&mut self) {
        let now = self.now();
        let offset_ms = wall_clock_ms().saturating_sub(self.clock.estimate(self.mono_ms(Instant::now())));
        self.metrics.clock_offset(offset_ms);
        if offset_ms.unsigned_abs() > u64::from(self.skew_slack_ms()) {
            warn_clock_offset(offset_ms, self.skew_slack_ms());
        }
        let cache = &mut self.cache;
        self.long_calls.run(|| cache.expire(now));
        // Forget the state of partitions idle for as long as the metadata
        // memo lives; their cache entries stay.
        self.partitions.retain(|_, p| p.busy || !p.queue.is_empty() || p.last_used.elapsed() < METADATA_TTL);
        debug_assert!(self.queued.iter().all(|id| !self.partitions[id].queue.is_empty()));
        let stats = self.cache.stats();
        self.metrics.publish_shard(self.id, &stats, self.cache.rebuilds());
        if stats.suppressed > 0 {
            warn_suppressed(now, self.id, stats.suppressed);
        }
    }
}

/// One warning per interval for each cause a client's requests can repeat
/// at will (see [`crate::log_limit`]).
static HYDRATION_FAILED: Limited = Limited::new(log_limit::INTERVAL);
static PARTITION_LOCKED: Limited = Limited::new(log_limit::INTERVAL);
static LOCKS_UNKNOWN: Limited = Limited::new(log_limit::INTERVAL);
static LOCK_WAIT_TIMED_OUT: Limited = Limited::new(log_limit::INTERVAL);
static BUNDLE_FAILED: Limited = Limited::new(log_limit::INTERVAL);
static BUNDLE_REFUSED: Limited = Limited::new(log_limit::INTERVAL);
static SEGMENT_REFUSED: Limited = Limited::new(log_limit::INTERVAL);

impl From<&DbError> for PushFailure {
    fn from(error: &DbError) -> PushFailure {
        if error.is_unavailable() {
            PushFailure::Unavailable(error.to_string())
        } else {
            PushFailure::Database(error.to_string())
        }
    }
}

/// Warns that partitions are suppressed, at most once a minute across the
/// whole process.
fn warn_suppressed(now: Millis, shard: usize, suppressed: u64) {
    static LAST_WARNING_MS: AtomicI64 = AtomicI64::new(i64::MIN);
    let last = LAST_WARNING_MS.load(Ordering::Relaxed);
    if now.saturating_sub(last) < 60_000 {
        return;
    }
    if LAST_WARNING_MS.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
        tracing::warn!(
            shard,
            suppressed,
            "the dedup cache budget is full: partitions are suppressed and probed in full (raise STILE_DEDUP_CACHE_MB to cache them)"
        );
    }
}

fn window_ms(window_seconds: i32) -> u64 {
    u64::try_from(window_seconds).unwrap_or(0) * 1000
}
