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

/// The connection of a shard's pool that pushes contended partitions, one
/// segment at a time (see [`PartitionState::contended`]).
const CONTENDED_CONNECTIONS: usize = 1;

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
        db: db.with_own_pool(OwnPool {
            size: config.max_in_flight + CONTENDED_CONNECTIONS + HYDRATION_CONNECTIONS,
            lock_timeout: config.lock_timeout,
        })?,
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

/// Replays a segment holds at most for its floors to be left unasked: the
/// push function looks for up to 4 hashes in the first row of the span that
/// holds any of them, which is the row just above the floor of the lowest.
const FEW_REPLAYS: usize = 4;

/// How far from its length the floors of a segment's first and last hashes
/// may lie apart for the segment to be taken for one run of the log: two
/// arrival steps of a sealed run of one block (`guest/src/ring/run.rs`), so
/// that a recent retry is taken for one, while ids picked at random from a
/// window of thousands rarely are.
const RUN_SLACK: i64 = 32;

/// A bundle as planned: its segments, what is sent for each, and the clock
/// floor its vouches hold from.
struct PlannedBundle {
    segments: Vec<InFlight>,
    pushes: Vec<SegmentPush>,
    clock_floor: ClockFloor,
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

    /// Sends every ready partition's next segment as one bundle, and a
    /// contended partition's on its own.
    fn flush_ready(&mut self) {
        self.flush_shared();
        self.flush_contended();
    }

    /// Sends every ready partition that is not contended as one bundle, in
    /// ascending partition order: bundles stay deterministic, and the push
    /// function takes its locks in that order anyway.
    fn flush_shared(&mut self) {
        if self.bundles_in_flight >= self.config.max_in_flight {
            return;
        }
        let mut segments: Vec<InFlight> = Vec::new();
        let partitions = &mut self.partitions;
        let max_segment = self.config.max_segment;
        self.queued.retain(|&partition_id| {
            let partition = partitions.get_mut(&partition_id).expect("a queued partition has a state");
            if partition.busy || partition.contended.is_some() {
                return true;
            }
            segments.push(partition.take_in_flight(partition_id, max_segment));
            !partition.queue.is_empty()
        });
        if segments.is_empty() {
            return;
        }
        debug_assert!(segments.is_sorted_by_key(|s| s.partition_id));
        self.bundles_in_flight += 1;
        self.send(Lane::Shared, segments);
    }

    /// Sends the next segment of the contended partition whose turn it is,
    /// alone, unless one is in flight already.
    fn flush_contended(&mut self) {
        if self.contended_in_flight {
            return;
        }
        let next = self
            .queued
            .iter()
            .map(|id| (*id, &self.partitions[id]))
            .filter(|(_, p)| !p.busy)
            .filter_map(|(id, p)| Some((p.contended?, id)))
            .min();
        let Some((_, partition_id)) = next else { return };
        let partition = self.partitions.get_mut(&partition_id).expect("a queued partition has a state");
        partition.contended = Some(Instant::now());
        let segment = partition.take_in_flight(partition_id, self.config.max_segment);
        if partition.queue.is_empty() {
            self.queued.remove(&partition_id);
        }
        self.contended_in_flight = true;
        self.send(Lane::Contended, vec![segment]);
    }

    /// Plans `segments` and puts their push in flight.
    fn send(&mut self, lane: Lane, segments: Vec<InFlight>) {
        let PlannedBundle { segments, pushes, clock_floor } = self.plan(segments);
        let db = self.db.clone();
        let metrics = self.metrics.clone();
        self.in_flight.push(Box::pin(async move {
            let started = Instant::now();
            let Pushed { results, locked_elsewhere } = push_isolating(&db, &metrics, clock_floor, &pushes).await;
            let received = Instant::now();
            Done::Bundle { lane, segments, clock_floor, results, locked_elsewhere, sql: received - started, received }
        }));
    }

    /// Asks the cache for each segment's `p_verified`. A segment whose local
    /// hits form one run among hashes the cache has not seen (a retry
    /// coalesced with fresh pushes) is cut around that run, and the pieces
    /// are planned again: the hits then narrow the probe of their own piece
    /// only, and the other pieces stay vouched instead of being read for
    /// over the whole span. The push function probes a later segment of a
    /// partition against the earlier ones of its bundle, so the cut changes
    /// no verdict, and the pieces keep the messages' order. A segment of
    /// hits only may be cut per request (see [`Worker::cut_replays`]). Where
    /// hits are scattered among fresh messages, the requests that replay
    /// only are taken apart, a piece each, after the rest
    /// ([`CoalescedSegment::part_replaying_requests`]): they are judged
    /// without the partition's lock, and do not hold the fresh messages'
    /// segment to the locked probe. Hits scattered within requests leave
    /// the segment whole (one probe and one log row, not many small
    /// segments).
    ///
    /// The bundle carries its clock floor: the cache judged age by `now`, so
    /// its vouches hold only once PostgreSQL's clock is past `now` less the
    /// slack.
    ///
    /// The slots' transactionIds and payloads move into the pushes (they are
    /// views of request bodies, and a copy touches a body's reference count):
    /// once planned, a slot is answered from its message id and hash only.
    fn plan(&mut self, segments: Vec<InFlight>) -> PlannedBundle {
        let now = self.now();
        let first = self.ask(now, &segments);
        let mut planned: Vec<(InFlight, Option<Plan>)> = Vec::with_capacity(segments.len());
        for (in_flight, plan) in segments.into_iter().zip(first) {
            let InFlight { partition_id, window_seconds, state, p_verified, segment } = in_flight;
            match segment.cut_around(&plan.local_hits) {
                Ok(pieces) => {
                    for segment in pieces {
                        planned.push((InFlight { partition_id, window_seconds, state, p_verified, segment }, None));
                    }
                }
                Err(segment) => match segment.part_replaying_requests(&plan.local_hits) {
                    Ok(pieces) => {
                        for segment in pieces {
                            planned.push((InFlight { partition_id, window_seconds, state, p_verified, segment }, None));
                        }
                    }
                    Err(segment) => {
                        for (segment, plan) in self.cut_replays(now, partition_id, window_seconds, segment, plan) {
                            planned.push((InFlight { partition_id, window_seconds, state, p_verified, segment }, Some(plan)));
                        }
                    }
                },
            }
        }
        let cut: Vec<&InFlight> = planned.iter().filter(|(_, plan)| plan.is_none()).map(|(s, _)| s).collect();
        if !cut.is_empty() {
            let mut again = self.ask(now, &cut).into_iter();
            for (_, plan) in planned.iter_mut().filter(|(_, plan)| plan.is_none()) {
                *plan = again.next();
            }
        }
        let planned: Vec<(InFlight, Plan)> =
            planned.into_iter().map(|(s, plan)| (s, plan.expect("every segment and run is planned"))).collect();
        let floors = self.hash_floors(now, &planned);
        let mut pushes = Vec::with_capacity(planned.len());
        let mut segments = Vec::with_capacity(planned.len());
        for ((mut in_flight, plan), hash_floors) in planned.into_iter().zip(floors) {
            in_flight.state = plan.state;
            in_flight.p_verified = plan.p_verified;
            self.metrics.flush_size(in_flight.segment.slots.len());
            let replays = in_flight.segment.all_named(&plan.local_hits);
            let slots = &mut in_flight.segment.slots;
            pushes.push(SegmentPush {
                partition_id: in_flight.partition_id,
                p_verified: plan.p_verified,
                planned_window_seconds: in_flight.window_seconds,
                hashes: in_flight.segment.hashes.clone(),
                message_ids: slots.iter().map(|s| s.message.message_id).collect(),
                transaction_ids: slots.iter_mut().map(|s| std::mem::take(&mut s.message.transaction_id)).collect(),
                payloads: slots.iter_mut().map(|s| std::mem::replace(&mut s.message.payload, Payload::null())).collect(),
                hash_floors,
                replays,
            });
            segments.push(in_flight);
        }
        PlannedBundle { segments, pushes, clock_floor: self.clock_floor(now) }
    }

    /// Cuts a segment of replays only (every slot a local hit: likely all
    /// duplicates, so no piece writes a log row) where its leading request
    /// changes, when the cache floors each piece apart from the others. A
    /// segment is probed from its lowest floor, and replays of different
    /// requests are rarely one run of the log, so the probe of the whole
    /// reads the span from the lowest original up; each piece is probed
    /// from its own floor instead, usually one slice of one row. Pieces that
    /// share a floor (old hits, floored at the start of a large run) would
    /// each read that span again: then the segment stays whole, with its
    /// own plan.
    fn cut_replays(
        &mut self,
        now: Millis,
        partition_id: i64,
        window_seconds: i32,
        segment: CoalescedSegment,
        plan: Plan,
    ) -> Vec<(CoalescedSegment, Plan)> {
        let changes = if segment.all_named(&plan.local_hits) { segment.request_changes() } else { Vec::new() };
        if changes.is_empty() {
            return vec![(segment, plan)];
        }
        let window_ms = window_ms(window_seconds);
        let bounds: Vec<usize> = std::iter::once(0).chain(changes.iter().copied()).chain([segment.slots.len()]).collect();
        let queries: Vec<CacheSegment<'_>> = bounds
            .windows(2)
            .map(|piece| CacheSegment {
                partition: partition_id,
                window_ms,
                hashes: &segment.hashes[16 * piece[0]..16 * piece[1]],
            })
            .collect();
        let plans = self.cache_plan(now, &queries);
        let mut floors: Vec<i64> = plans.iter().map(|plan| plan.p_verified).collect();
        floors.sort_unstable();
        floors.dedup();
        if floors.len() < plans.len() {
            return vec![(segment, plan)];
        }
        segment.cut_at(&changes).into_iter().zip(plans).collect()
    }

    /// Each hash's own floor, for every segment of replays only (every slot
    /// a local hit) of more than [`FEW_REPLAYS`] messages that does not look
    /// like one run of the log, from plan calls that ask for hashes alone: a
    /// lone hash's `p_verified` is its own floor. A segment is probed from
    /// its lowest floor, and replays of ids stored far apart (a redelivery
    /// storm) would read every row above it; with its hashes' floors the
    /// push function looks for each original in the 128 offsets above its
    /// own floor.
    ///
    /// A retry of one request stored whole is one run, which the probe finds
    /// in one slice above the lowest floor: its first and last hashes are
    /// asked for first, and a segment whose floors lie as far apart as its
    /// ends (within [`RUN_SLACK`]) is sent without floors. `None` too where
    /// a hash alone is not a hit (then nothing is claimed) or all the floors
    /// are one (old hits floored at the start of one large run: no floor
    /// narrows more than the segment's own).
    fn hash_floors(&mut self, now: Millis, planned: &[(InFlight, Plan)]) -> Vec<Option<Vec<i64>>> {
        let replays: Vec<bool> = planned
            .iter()
            .map(|(s, plan)| s.segment.slots.len() > FEW_REPLAYS && s.segment.all_named(&plan.local_hits))
            .collect();
        if !replays.contains(&true) {
            return vec![None; planned.len()];
        }
        let ends: Vec<Vec<u8>> = planned
            .iter()
            .zip(&replays)
            .filter(|(_, replay)| **replay)
            .map(|((s, _), _)| [&s.segment.hashes[..16], &s.segment.hashes[s.segment.hashes.len() - 16..]].concat())
            .collect();
        let mut end_floors =
            self.floors_alone(now, planned.iter().zip(&replays).filter(|(_, r)| **r).map(|(p, _)| &p.0).zip(&ends)).into_iter();
        let scattered: Vec<bool> = planned
            .iter()
            .zip(&replays)
            .map(|((s, _), &replay)| {
                let floors = if replay { end_floors.next().flatten() } else { None };
                floors.is_some_and(|floors| {
                    let spread = floors[1] - floors[0] - (s.segment.slots.len() as i64 - 1);
                    spread.abs() > RUN_SLACK
                })
            })
            .collect();
        let wanted =
            planned.iter().zip(&scattered).filter(|(_, scattered)| **scattered).map(|(p, _)| (&p.0, &p.0.segment.hashes));
        let mut floors = self.floors_alone(now, wanted).into_iter();
        scattered
            .iter()
            .map(|&scattered| {
                let floors = if scattered { floors.next().flatten() } else { None };
                floors.filter(|floors| floors.iter().any(|&floor| floor != floors[0]))
            })
            .collect()
    }

    /// For each segment with some of its hashes, one plan call asking for
    /// each of those hashes alone: their floors, in order, or `None` for a
    /// segment one of whose hashes alone is not a hit.
    fn floors_alone<'a, B: AsRef<[u8]> + 'a>(
        &mut self,
        now: Millis,
        segments: impl Iterator<Item = (&'a InFlight, B)>,
    ) -> Vec<Option<Vec<i64>>> {
        let asked: Vec<(i64, u64, B)> =
            segments.map(|(s, hashes)| (s.partition_id, window_ms(s.window_seconds), hashes)).collect();
        if asked.is_empty() {
            return Vec::new();
        }
        let queries: Vec<CacheSegment<'_>> = asked
            .iter()
            .flat_map(|(partition, window_ms, hashes)| {
                hashes.as_ref().chunks_exact(16).map(|hash| CacheSegment {
                    partition: *partition,
                    window_ms: *window_ms,
                    hashes: hash,
                })
            })
            .collect();
        let mut alone = self.cache_plan(now, &queries).into_iter();
        asked
            .iter()
            .map(|(_, _, hashes)| {
                // Each segment takes exactly its own answers, whatever they say.
                let floors: Vec<Option<i64>> = (&mut alone)
                    .take(hashes.as_ref().len() / 16)
                    .map(|plan| (plan.local_hits == [0]).then_some(plan.p_verified))
                    .collect();
                floors.into_iter().collect()
            })
            .collect()
    }

    /// One plan call: the cache's answer for each segment, in order. A local
    /// hit is a hint, never a verdict: the cache has already narrowed
    /// `p_verified` below the hit's original, so the probe finds it (and the
    /// first occurrence of every hash).
    fn ask<S: std::borrow::Borrow<InFlight>>(&mut self, now: Millis, segments: &[S]) -> Vec<Plan> {
        let queries: Vec<CacheSegment<'_>> = segments
            .iter()
            .map(|s| {
                let s = s.borrow();
                CacheSegment { partition: s.partition_id, window_ms: window_ms(s.window_seconds), hashes: &s.segment.hashes }
            })
            .collect();
        self.cache_plan(now, &queries)
    }

    /// One plan call, timed.
    fn cache_plan(&mut self, now: Millis, queries: &[CacheSegment<'_>]) -> Vec<Plan> {
        let started = Instant::now();
        let plans = self.cache.plan(now, queries);
        self.metrics.guest_call(started.elapsed());
        assert_eq!(plans.len(), queries.len(), "the cache answers every segment");
        plans
    }

    /// What a bundle planned at `now` assumes of PostgreSQL's clock: the
    /// cache judged age by `now`, so its vouches hold once PostgreSQL's clock
    /// is past `now` less the slack.
    fn clock_floor(&self, now: Millis) -> ClockFloor {
        ClockFloor(now.saturating_sub(Millis::from(self.skew_slack_ms())))
    }

    fn complete(&mut self, done: Done) {
        match done {
            Done::Bundle { lane, segments, clock_floor, results, locked_elsewhere, sql, received } => {
                match lane {
                    Lane::Shared => self.bundles_in_flight -= 1,
                    Lane::Contended => self.contended_in_flight = false,
                }
                self.note_contention(lane, &segments, &results, &locked_elsewhere);
                self.metrics.sql_call(sql);
                assert_eq!(segments.len(), results.len(), "every segment has a result");
                if let Some(db_ms) = results.iter().flatten().map(|o| o.clock_ms).max() {
                    self.read_db_clock(DbReading { db_ms, received });
                }
                let mut stored = Vec::with_capacity(segments.len());
                for (segment, result) in segments.into_iter().zip(results) {
                    match result {
                        Ok(outcome) => stored.push((segment, outcome)),
                        Err(failure) => self.failed(segment, failure),
                    }
                }
                self.committed(stored, clock_floor);
            }
            Done::Hydration { partition_id, window_seconds, result, received } => {
                if let Ok(rows) = &result {
                    self.read_db_clock(DbReading { db_ms: rows.clock_ms, received });
                }
                self.hydrated(partition_id, window_seconds, result);
            }
        }
    }

    /// Marks the partitions found locked by another session contended, and
    /// clears a contended partition whose segment got through.
    fn note_contention(
        &mut self,
        lane: Lane,
        segments: &[InFlight],
        results: &[Result<SegmentOutcome, PushFailure>],
        locked_elsewhere: &[i64],
    ) {
        for id in locked_elsewhere {
            if let Some(partition) = self.partitions.get_mut(id) {
                if partition.contended.is_none()
                    && let Some(occurrences) = PARTITION_LOCKED.occurred()
                {
                    tracing::warn!(
                        shard = self.id,
                        partition_id = id,
                        occurrences,
                        "partition row locked by another session; pushing it on its own until it is free"
                    );
                }
                partition.contended.get_or_insert_with(Instant::now);
            }
        }
        if lane == Lane::Contended {
            for (segment, result) in segments.iter().zip(results) {
                if result.is_ok()
                    && let Some(partition) = self.partitions.get_mut(&segment.partition_id)
                {
                    partition.contended = None;
                }
            }
        }
    }

    fn committed(&mut self, stored: Vec<(InFlight, SegmentOutcome)>, clock_floor: ClockFloor) {
        if stored.is_empty() {
            return;
        }
        let now = self.now();
        let mut commits: Vec<OwnedCommit> = Vec::new();
        let mut wants_hydration: Vec<WantsHydration> = Vec::new();
        for (in_flight, outcome) in stored {
            let InFlight { partition_id, window_seconds: planned, state, p_verified, segment } = in_flight;
            self.metrics.segment(outcome.probe);
            if p_verified >= 0 && outcome.clock_ms < clock_floor.0 {
                self.metrics.vouch_refused();
            }
            let window_seconds = outcome.window_seconds;
            let partition = self.partitions.get_mut(&partition_id).expect("a partition in flight has a state");
            partition.busy = false;
            // The window in force wins over the memoised one; the next plan
            // carries it, and the cache rebuilds under it.
            partition.observe_window(window_seconds, Instant::now());
            let CoalescedSegment { slots, hashes } = segment;
            let per_message = outcome.per_message(slots.len());
            if let Some(stored) = outcome.stored {
                let hashes = if outcome.duplicates.is_empty() { hashes } else { stored_hashes(&slots, &per_message) };
                commits.push(OwnedCommit {
                    partition: partition_id,
                    base_offset: stored.base_offset,
                    created_ms: stored.created_ms,
                    hashes,
                });
            }
            for (slot, message) in slots.into_iter().zip(per_message) {
                let outcome = match message {
                    MessageOutcome::Stored { offset } => Outcome::Queued { message_id: slot.message.message_id, offset },
                    MessageOutcome::Duplicate(d) => Outcome::Duplicate { message_id: d.message_id, offset: d.offset },
                };
                self.deliver(slot, outcome);
            }
            if window_seconds > 0 && (needs_hydration(state) || window_seconds != planned) {
                wants_hydration.push(WantsHydration { partition_id, window_seconds });
            }
        }
        self.record(now, &commits);
        for WantsHydration { partition_id, window_seconds } in wants_hydration {
            self.maybe_hydrate(now, partition_id, window_seconds);
        }
    }

    fn record(&mut self, now: Millis, commits: &[OwnedCommit]) {
        if commits.is_empty() {
            return;
        }
        let commits: Vec<Commit<'_>> = commits.iter().map(OwnedCommit::borrow).collect();
        let started = Instant::now();
        self.cache.record_commits(now, &commits);
        self.metrics.guest_call(started.elapsed());
    }

    /// Runs the admission gate and, if it admits, a full-window hydration.
    fn maybe_hydrate(&mut self, now: Millis, partition_id: i64, window_seconds: i32) {
        let Some(partition) = self.partitions.get_mut(&partition_id) else { return };
        if partition.busy || !self.config.hydrate {
            return;
        }
        // The shard keeps its own footprint hints; with none, an unknown
        // partition is estimated empty, and the budget evicts or suppresses
        // if the rows prove it wrong.
        match self.cache.admit(now, partition_id, window_ms(window_seconds), 0) {
            Admission::Suppressed => return,
            Admission::Hydrate => {}
        }
        partition.busy = true;
        let db = self.db.clone();
        let slack_ms = self.skew_slack_ms();
        self.in_flight.push(Box::pin(async move {
            let result = db.hydration(partition_id, window_seconds, slack_ms).await;
            Done::Hydration { partition_id, window_seconds, result, received: Instant::now() }
        }));
    }

    fn hydrated(&mut self, partition_id: i64, window_seconds: i32, result: Result<HydrationRows, DbError>) {
        if let Some(partition) = self.partitions.get_mut(&partition_id) {
            partition.busy = false;
        }
        let rows = match result {
            Ok(rows) => rows,
            // A partition a transaction created is planned for before the
            // transaction commits, and its row is not visible here until
            // then (nor ever, if it rolls back): nothing is wrong, and the
            // next push hydrates it.
            Err(DbError::NotFound(_)) => return,
            Err(error) => {
                if let Some(occurrences) = HYDRATION_FAILED.occurred() {
                    tracing::warn!(
                        partition_id,
                        error = %error,
                        occurrences,
                        "hydration failed; the partition is probed in full until it succeeds"
                    );
                }
                return;
            }
        };
        // The gate again, with the window's real size: a window the budget
        // cannot hold is refused here rather than copied into the instance,
        // whose memory would keep that peak for its life.
        let now = self.now();
        let hashes = rows.rows.iter().map(|row| row.hashes.len() as u64 / 16).sum::<u64>();
        if let Admission::Suppressed = self.cache.admit(now, partition_id, window_ms(window_seconds), hashes) {
            self.metrics.hydration_suppressed();
            return;
        }
        let txns: Vec<TxnsRow<'_>> = rows.rows.iter().map(OwnedRow::borrow).collect();
        let hydration = Hydration {
            partition: partition_id,
            window_ms: window_ms(window_seconds),
            last_offset: rows.last_offset,
            rows: &txns,
        };
        let started = Instant::now();
        let cache = &mut self.cache;
        let installed = self.long_calls.run(|| cache.hydrate(now, &hydration));
        self.metrics.guest_call(started.elapsed());
        self.metrics.hydration(installed);
    }

    /// Answers every request with a message in `in_flight` with `failure`.
    fn failed(&mut self, in_flight: InFlight, failure: PushFailure) {
        if let Some(partition) = self.partitions.get_mut(&in_flight.partition_id) {
            partition.busy = false;
        }
        for slot in in_flight.segment.slots {
            for waiter in slot.waiters() {
                if let Some(request) = self.requests.remove(&waiter.request) {
                    let _ = request.reply.send(Err(failure.clone()));
                }
            }
        }
    }

    /// Delivers a slot's final outcome: the leader gets it as is, every other
    /// waiter inherits it as a duplicate of the leader's result.
    fn deliver(&mut self, slot: Slot, leader: Outcome) {
        let inherited = match leader {
            Outcome::Queued { message_id, offset } | Outcome::Duplicate { message_id, offset } => {
                Outcome::Duplicate { message_id, offset }
            }
        };
        for (position, waiter) in slot.waiters().enumerate() {
            let outcome = if position == 0 { leader } else { inherited };
            let Some(request) = self.requests.get_mut(&waiter.request) else { continue };
            let cell = &mut request.outcomes[waiter.index as usize];
            debug_assert!(cell.is_none(), "each message is answered once");
            *cell = Some(outcome);
            request.remaining -= 1;
            if request.remaining == 0 {
                let request = self.requests.remove(&waiter.request).expect("present");
                let outcomes = request.outcomes.into_iter().map(|o| o.expect("all answered")).collect();
                let _ = request.reply.send(Ok(outcomes));
            }
        }
    }

    /// The cache's clock-skew slack: hydrations read this much further back
    /// than the window, a bundle's vouches hold from its `now` less this on,
    /// and readings of PostgreSQL's clock may fall this far below the `now`
    /// already given before they count as a step back. The cache's own, so
    /// that the floor never assumes less than the cache's expiry did.
    fn skew_slack_ms(&self) -> u32 {
        self.cache.config().skew_slack_ms
    }

    /// The cache's `now`: PostgreSQL's clock as bounded from below, held
    /// monotone.
    fn now(&mut self) -> Millis {
        let mono_ms = self.mono_ms(Instant::now());
        self.clock.now(mono_ms)
    }

    /// Milliseconds of the monotonic clock at `instant`.
    fn mono_ms(&self, instant: Instant) -> Millis {
        Millis::try_from(instant.saturating_duration_since(self.mono_origin).as_millis()).unwrap_or(Millis::MAX)
    }

    /// Takes a reading of PostgreSQL's clock into the cache's clock. One that
    /// shows the clock stepped back replaces the cache: its `now` restarts
    /// lower, and the cache requires it monotone. Segments in flight are
    /// unaffected (their commits find no entry and are ignored).
    fn read_db_clock(&mut self, reading: DbReading) {
        let mono_ms = self.mono_ms(reading.received);
        if let Reading::SteppedBack { by_ms } = self.clock.observe(reading.db_ms, mono_ms) {
            tracing::warn!(
                shard = self.id,
                by_ms,
                "PostgreSQL's clock stepped back; this shard's dedup cache starts afresh (verdicts are unaffected)"
            );
            self.metrics.database_clock_stepped_back();
            self.cache.reset();
        }
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

/// What became of a bundle: one result per segment, in order, and the
/// partitions found locked by another session.
struct Pushed {
    results: Vec<Result<SegmentOutcome, PushFailure>>,
    locked_elsewhere: Vec<i64>,
}

/// Pushes a bundle and answers each of its segments, in order.
///
/// A bundle whose wait for a row lock outlasted the lock timeout goes to
/// [`push_around_locks`]. When PostgreSQL refuses the bundle for a reason
/// that may belong to one segment, [`push_one_by_one`] isolates it.
async fn push_isolating(db: &Db, metrics: &Metrics, clock_floor: ClockFloor, pushes: &[SegmentPush]) -> Pushed {
    match db.push_bundle(clock_floor, pushes).await {
        Ok(outcomes) => Pushed { results: outcomes.into_iter().map(Ok).collect(), locked_elsewhere: Vec::new() },
        Err(error) if error.is_lock_timeout() => push_around_locks(db, metrics, clock_floor, pushes, &error).await,
        Err(error) => {
            Pushed { results: push_one_by_one(db, metrics, clock_floor, pushes, &error).await, locked_elsewhere: Vec::new() }
        }
    }
}

/// After a bundle's lock wait timed out (it wrote nothing: it was one
/// transaction), asks PostgreSQL which of its partitions another session
/// holds, fails their segments (503, a retry is safe) and pushes the others
/// again without them, once. When none is found locked (a table lock, or a
/// wait that has passed), every segment fails as unavailable.
async fn push_around_locks(
    db: &Db,
    metrics: &Metrics,
    clock_floor: ClockFloor,
    pushes: &[SegmentPush],
    error: &DbError,
) -> Pushed {
    metrics.bundle_lock_timeout();
    let mut partition_ids: Vec<i64> = pushes.iter().map(|p| p.partition_id).collect();
    partition_ids.dedup();
    let locked_elsewhere = db.partitions_locked_elsewhere(&partition_ids).await.unwrap_or_else(|asking| {
        if let Some(occurrences) = LOCKS_UNKNOWN.occurred() {
            tracing::warn!(error = %asking, occurrences, "cannot tell which partitions are locked elsewhere");
        }
        Vec::new()
    });
    if let Some(occurrences) = LOCK_WAIT_TIMED_OUT.occurred() {
        tracing::warn!(error = %error, segments = pushes.len(), ?locked_elsewhere, occurrences, "a bundle's lock wait timed out");
    }
    if locked_elsewhere.is_empty() {
        return Pushed { results: vec![Err(PushFailure::from(error)); pushes.len()], locked_elsewhere };
    }
    let locked = |push: &SegmentPush| locked_elsewhere.contains(&push.partition_id);
    let free: Vec<SegmentPush> = pushes.iter().filter(|push| !locked(push)).cloned().collect();
    let free_results = if free.is_empty() {
        Vec::new()
    } else {
        match db.push_bundle(clock_floor, &free).await {
            Ok(outcomes) => outcomes.into_iter().map(Ok).collect(),
            Err(error) => push_one_by_one(db, metrics, clock_floor, &free, &error).await,
        }
    };
    let mut free_results = free_results.into_iter();
    let locked_failure = PushFailure::Unavailable(format!("the partition's row is locked by another session ({error})"));
    let results = pushes
        .iter()
        .map(|push| {
            if locked(push) {
                Err(locked_failure.clone())
            } else {
                free_results.next().expect("one result per segment pushed again")
            }
        })
        .collect();
    Pushed { results, locked_elsewhere }
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

/// After PostgreSQL refused a bundle with `error`: when the refusal may
/// belong to one segment (anything but the database being unavailable),
/// each segment is pushed again on its own, in order, so that a message
/// PostgreSQL cannot take fails its own segment's requests and no other.
/// The refused bundle wrote nothing (it was one transaction), and a segment
/// pushed alone keeps its plan: a later segment of a partition is probed
/// above `p_verified`, which covers whatever an earlier one stored or did
/// not.
async fn push_one_by_one(
    db: &Db,
    metrics: &Metrics,
    clock_floor: ClockFloor,
    pushes: &[SegmentPush],
    error: &DbError,
) -> Vec<Result<SegmentOutcome, PushFailure>> {
    if error.is_unavailable() || pushes.len() == 1 {
        if let Some(occurrences) = BUNDLE_FAILED.occurred() {
            tracing::warn!(error = %error, segments = pushes.len(), occurrences, "bundle failed");
        }
        return vec![Err(PushFailure::from(error)); pushes.len()];
    }
    if let Some(occurrences) = BUNDLE_REFUSED.occurred() {
        tracing::warn!(error = %error, segments = pushes.len(), occurrences, "bundle refused; pushing its segments one by one");
    }
    metrics.bundle_split();
    let mut results = Vec::with_capacity(pushes.len());
    for push in pushes {
        let result = match db.push_bundle(clock_floor, std::slice::from_ref(push)).await {
            Ok(mut outcomes) => Ok(outcomes.pop().expect("the push function answers its one segment")),
            Err(error) => {
                if let Some(occurrences) = SEGMENT_REFUSED.occurred() {
                    tracing::warn!(error = %error, partition_id = push.partition_id, occurrences, "segment refused");
                }
                Err(PushFailure::from(&error))
            }
        };
        results.push(result);
    }
    results
}

impl From<&DbError> for PushFailure {
    fn from(error: &DbError) -> PushFailure {
        if error.is_unavailable() {
            PushFailure::Unavailable(error.to_string())
        } else {
            PushFailure::Database(error.to_string())
        }
    }
}

/// Whether an entry in `state` can only be made to vouch by a hydration.
fn needs_hydration(state: EntryState) -> bool {
    matches!(state, EntryState::Cold | EntryState::Gap | EntryState::Rebuild)
}

/// The hashes of a segment's stored messages, in offset order: what the
/// cache records for the commit.
fn stored_hashes(slots: &[Slot], per_message: &[MessageOutcome]) -> Vec<u8> {
    let mut hashes = Vec::with_capacity(16 * slots.len());
    for (slot, message) in slots.iter().zip(per_message) {
        if let MessageOutcome::Stored { .. } = message {
            hashes.extend_from_slice(&slot.message.hash);
        }
    }
    hashes
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

/// Warns, once per process, that this host's wall clock is off PostgreSQL's
/// by more than the skew slack.
fn warn_clock_offset(offset_ms: i64, slack_ms: u32) {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if WARNED.swap(true, Ordering::Relaxed) {
        return;
    }
    let direction = if offset_ms > 0 { "ahead of" } else { "behind" };
    tracing::warn!(
        offset_ms,
        slack_ms,
        "this host's clock is {:.1} s {direction} PostgreSQL's; stile judges age by PostgreSQL's clock, so verdicts \
         are unaffected, but the host's time sync needs fixing",
        offset_ms.unsigned_abs() as f64 / 1000.0
    );
}

/// The host's wall clock, in milliseconds since the Unix epoch: only to
/// measure how far it is from PostgreSQL's.
fn wall_clock_ms() -> Millis {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    Millis::try_from(since.as_millis()).unwrap_or(Millis::MAX)
}

fn window_ms(window_seconds: i32) -> u64 {
    u64::try_from(window_seconds).unwrap_or(0) * 1000
}
