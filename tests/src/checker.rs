//! The exactness checker: a workload of producers pushing through several
//! `stile` gateway processes on one database while faults are injected, and a
//! checker that reads the truth from PostgreSQL afterwards and holds every
//! answer the producers got against it.
//!
//! # The workload
//!
//! Several producers (tokio tasks) push batches of 1 to `max_batch` items to
//! one queue. Every transactionId is deterministic: `p{producer}-{n}` for a
//! producer's own ids, `s-{slot}-{k}` for ids shared between producers (they
//! race the same id through different gateways). A producer re-sends earlier
//! ids on purpose (`repeat_percent` of the items), sometimes twice in one
//! request. An id always goes to the same partition (`part-{xxh3 % N}`).
//! Each request goes to a gateway chosen at random; on a timeout, a
//! connection error or a 5xx it is retried, to a gateway chosen at random
//! again (so sometimes to another one), with a backoff, at most
//! `max_attempts` times and within `request_deadline`. Each attempt's payloads
//! carry `{"c": [producer, request, attempt]}`, so the checker knows which
//! attempt wrote each stored message.
//!
//! # The faults
//!
//! On a schedule: `kill -9` of a gateway and its restart on the same address
//! and database; a PostgreSQL restart (`pg_ctlcluster restart`); the queue's
//! window shortened and lengthened again by `/api/v1/configure`. Per gateway:
//! guest traps (`--inject-guest-traps-per-million`), a tiny cache budget
//! (`--cache-mb 1`, so partitions are suppressed and evicted), a wall clock
//! ahead of or behind PostgreSQL's by more than the window that jumps mid-run
//! (libfaketime, [`ClockSkew`]). A gateway that exits without being killed is
//! reported and restarted.
//!
//! # The checks (every result, none sampled)
//!
//! From SQL afterwards:
//! - storage: every partition's segments tile `0..=last_offset`, each with its
//!   txns row (same offsets and time, hashes = xxh3-128 of the ids);
//! - every stored message was written by an attempt the workload made, with
//!   that id in that partition, after the attempt was sent; if that attempt
//!   was answered, the answer said `queued` with that message id;
//! - every `queued` answer: the answered offset holds that transactionId with
//!   that message id, written between sending and answering;
//! - every `duplicate` answer: the answered offset holds that transactionId
//!   with that message id, written before the answer, plausibly inside the
//!   window, and no earlier copy of the id was certainly inside the window
//!   (the push function's MIN picks the original);
//! - at most one stored message per partition and transactionId inside the
//!   window: two consecutive copies are legal only if the later one was
//!   written more than the window apart, for every window that may have been
//!   in force while its attempt ran (configure times are recorded, each as
//!   the interval from sending it to its answer);
//! - no id answered `queued` twice (two message ids) inside the window.
//!
//! On a violation the report prints the history of that id: every attempt
//! that carried it (gateway, incarnation, times, answer) and its stored
//! copies.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fmt::{self, Write as _};
use std::io::Read;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, anyhow, bail};
use hyper::Method;
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use serde_json::{Value, json};
use tokio::sync::oneshot;
use uuid::Uuid;

use crate::gateway::{Client, each_line, stile_binary};

mod vitals;

pub use crate::clock::ClockSkew;
pub use vitals::{Latency, Sample};

/// Slack for comparing our clock readings with PostgreSQL's (both read the
/// same system clock; this only covers rounding).
const CLOCK_TOLERANCE_US: i64 = 1_000;

/// What a gateway prints when a guest call trapped and its instance is rebuilt.
const TRAP_LINE: &str = "cache instance failed; rebuilding it";

// ---------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------

/// One run of the checker.
#[derive(Clone, Debug)]
pub struct Config {
    /// The database every gateway fronts (keyword/value or URI).
    pub database_url: String,
    pub seed: u64,
    /// How long producers start new requests.
    pub duration: Duration,
    pub producers: usize,
    /// Requests per second per producer (0: as fast as answers come).
    pub rate: f64,
    /// At most this many requests per producer.
    pub max_requests: usize,
    pub partitions: usize,
    /// New ids go to a hot group of this many partitions, which moves on to
    /// the next group every `hot_phase` (0: ids spread over every partition).
    /// Partitions left behind go idle and come back with repeats, so that a
    /// small cache budget evicts and suppresses them.
    pub hot_partitions: usize,
    pub hot_phase: Duration,
    pub max_batch: usize,
    /// Items that re-send an earlier id of the same producer, in percent.
    pub repeat_percent: u32,
    /// Items with an id shared between producers, in percent.
    pub shared_percent: u32,
    pub gateways: Vec<GatewaySpec>,
    pub faults: Faults,
    /// One HTTP attempt, connecting included.
    pub attempt_timeout: Duration,
    /// A request is given up after this long or `max_attempts` attempts.
    pub request_deadline: Duration,
    pub max_attempts: u32,
    pub queue: String,
    /// The window outside the short period. Shorter than the run, ids leave
    /// it and may be stored again; the checks allow for that.
    pub long_window_seconds: i32,
}

impl Config {
    /// Defaults for a run of `duration` on `database_url`, without faults and
    /// with two plain gateways.
    pub fn new(database_url: &str, duration: Duration) -> Config {
        Config {
            database_url: database_url.to_owned(),
            seed: 0x0571_7e00_0c4e_c4e5,
            duration,
            producers: 6,
            rate: 40.0,
            max_requests: 1_000_000,
            partitions: 96,
            hot_partitions: 8,
            hot_phase: Duration::from_secs(2),
            max_batch: 8,
            repeat_percent: 15,
            shared_percent: 4,
            gateways: vec![GatewaySpec::plain("g0"), GatewaySpec::plain("g1")],
            faults: Faults::default(),
            attempt_timeout: Duration::from_secs(5),
            request_deadline: Duration::from_secs(45),
            max_attempts: 25,
            queue: "checker".to_owned(),
            long_window_seconds: 3600,
        }
    }
}

/// A gateway process: a label and the flags beyond `--listen` and
/// `--database-url`.
#[derive(Clone, Debug)]
pub struct GatewaySpec {
    pub label: String,
    pub args: Vec<String>,
    /// Its wall clock against PostgreSQL's; `None` for the machine's.
    pub clock: Option<ClockSkew>,
}

impl GatewaySpec {
    pub fn plain(label: &str) -> GatewaySpec {
        GatewaySpec { label: label.to_owned(), args: Vec::new(), clock: None }
    }

    /// Runs the gateway with its wall clock off PostgreSQL's.
    pub fn clock(mut self, skew: ClockSkew) -> GatewaySpec {
        self.clock = Some(skew);
        self
    }

    /// Adds `--flag value`.
    pub fn flag(mut self, flag: &str, value: impl ToString) -> GatewaySpec {
        self.args.push(format!("--{flag}"));
        self.args.push(value.to_string());
        self
    }

    /// A gateway whose guest calls trap `per_million` times in a million.
    pub fn traps(label: &str, per_million: u32) -> GatewaySpec {
        GatewaySpec::plain(label).flag("inject-guest-traps-per-million", per_million)
    }

    /// A gateway with a cache budget of `mb` MiB over `shards` shards.
    pub fn tiny_cache(label: &str, mb: u64, shards: usize) -> GatewaySpec {
        GatewaySpec::plain(label).flag("cache-mb", mb).flag("shards", shards)
    }
}

/// The fault schedule, relative to the start of the push phase.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    /// `kill -9` one gateway (round robin) this often, restarting it after
    /// `kill_downtime`.
    pub kill_every: Option<Duration>,
    pub kill_downtime: Duration,
    /// Restart PostgreSQL this often (first at this offset).
    pub pg_restart_every: Option<Duration>,
    /// Or at these offsets.
    pub pg_restart_at: Vec<Duration>,
    /// The cluster to restart; found from the database's port when `None`.
    pub pg_cluster: Option<PgCluster>,
    /// Shorten the window to `seconds` from `from` to `to` (fractions of the
    /// run), then lengthen it back to the long window.
    pub short_window: Option<ShortWindow>,
}

#[derive(Clone, Copy, Debug)]
pub struct ShortWindow {
    pub seconds: i32,
    pub from: f64,
    pub to: f64,
}

/// A PostgreSQL cluster as `pg_ctlcluster` names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PgCluster {
    pub version: String,
    pub name: String,
}

impl PgCluster {
    /// The cluster listening on the port of `database_url` (5432 if it names
    /// none), from `pg_lsclusters`.
    pub fn for_url(database_url: &str) -> anyhow::Result<PgCluster> {
        let config = stile::db::pg_config(database_url).map_err(|e| anyhow!("{e}"))?;
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let output = Command::new("pg_lsclusters").arg("--no-header").output().context("run pg_lsclusters")?;
        let text = String::from_utf8_lossy(&output.stdout);
        for line in text.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() >= 3 && fields[2] == port.to_string() {
                return Ok(PgCluster { version: fields[0].to_owned(), name: fields[1].to_owned() });
            }
        }
        bail!("no cluster listens on port {port} (pg_lsclusters: {text:?})")
    }

    /// `pg_ctlcluster --skip-systemctl-redirect VERSION NAME restart`.
    pub fn restart(&self) -> anyhow::Result<()> {
        let output = Command::new("pg_ctlcluster")
            .args(["--skip-systemctl-redirect", &self.version, &self.name, "restart"])
            .output()
            .context("run pg_ctlcluster")?;
        if !output.status.success() {
            bail!(
                "pg_ctlcluster {} {} restart: {}: {}{}",
                self.version,
                self.name,
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(())
    }
}

impl fmt::Display for PgCluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.version, self.name)
    }
}

// ---------------------------------------------------------------------------
// Time
// ---------------------------------------------------------------------------

/// The wall clock in microseconds since the Unix epoch: the clock PostgreSQL's
/// `clock_timestamp()` reads on this machine.
fn now_us() -> i64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_micros()).unwrap_or(i64::MAX)
}

// ---------------------------------------------------------------------------
// Gateway processes
// ---------------------------------------------------------------------------

/// What a gateway printed: the last lines and the traps it reported.
#[derive(Debug, Default)]
struct NodeLog {
    tail: VecDeque<String>,
    traps: u64,
}

const TAIL_LINES: usize = 60;

/// One gateway process (and its successors after restarts).
#[derive(Debug)]
struct Node {
    spec: GatewaySpec,
    clock: Option<crate::clock::ClockFile>,
    database_url: String,
    addr: Option<SocketAddr>,
    child: Option<Child>,
    incarnation: u32,
    log: Arc<Mutex<NodeLog>>,
}

impl Node {
    fn new(spec: GatewaySpec, database_url: &str) -> Node {
        Node {
            spec,
            clock: None,
            database_url: database_url.to_owned(),
            addr: None,
            child: None,
            incarnation: 0,
            log: Arc::default(),
        }
    }

    /// Starts the process, on its previous address if it had one, and waits
    /// for its "listening on" line.
    async fn start(&mut self) -> anyhow::Result<SocketAddr> {
        assert!(self.child.is_none(), "a node runs one process at a time");
        let listen = self.addr.map_or_else(|| "127.0.0.1:0".to_owned(), |a| a.to_string());
        let mut command = Command::new(stile_binary());
        command
            .args(["serve", "--listen", &listen, "--database-url", &self.database_url])
            .args(["--pool-size", "8", "--purge-seconds", "3600"])
            .args(&self.spec.args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (var, _) in std::env::vars_os() {
            if var.to_string_lossy().starts_with("STILE_") || var == "DATABASE_URL" {
                command.env_remove(var);
            }
        }
        command.env("NO_COLOR", "1").env("RUST_LOG", "info");
        if let Some(skew) = &self.spec.clock
            && self.clock.is_none()
        {
            self.clock = Some(crate::clock::ClockFile::new(&self.spec.label, skew.offsets_s[0])?);
        }
        if let Some(file) = &self.clock {
            file.apply(&mut command);
        }
        crate::gateway::die_with_parent(&mut command);
        let mut child = command.spawn().context("start stile")?;
        let (ready_tx, ready_rx) = oneshot::channel::<SocketAddr>();
        let ready = Arc::new(Mutex::new(Some(ready_tx)));
        let label = format!("{}#{}", self.spec.label, self.incarnation);
        drain(child.stdout.take().expect("piped"), self.log.clone(), label.clone(), Some(ready.clone()));
        drain(child.stderr.take().expect("piped"), self.log.clone(), label, None);
        self.child = Some(child);
        match tokio::time::timeout(Duration::from_secs(60), ready_rx).await {
            Ok(Ok(addr)) => {
                self.addr = Some(addr);
                Ok(addr)
            }
            outcome => {
                self.kill();
                let why = if outcome.is_err() { "did not listen within 60 s" } else { "exited before listening" };
                bail!("gateway {} {why}:\n{}", self.spec.label, self.tail())
            }
        }
    }

    /// `kill -9` and reap.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Whether the process ended by itself (and its status).
    fn exited(&mut self) -> Option<String> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        self.child = None;
        Some(status.to_string())
    }

    fn tail(&self) -> String {
        let log = self.log.lock().expect("not poisoned");
        log.tail.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    fn traps(&self) -> u64 {
        self.log.lock().expect("not poisoned").traps
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Reads a child's stream on a thread of its own into the node's log,
/// counting trap lines and handing the "listening on" address to `ready`.
fn drain(
    stream: impl Read + Send + 'static,
    log: Arc<Mutex<NodeLog>>,
    label: String,
    ready: Option<Arc<Mutex<Option<oneshot::Sender<SocketAddr>>>>>,
) {
    let _closed = each_line(stream, move |line| {
        if let Some(ready) = &ready
            && let Some(addr) = listening_addr(line)
            && let Some(tx) = ready.lock().expect("not poisoned").take()
        {
            let _ = tx.send(addr);
        }
        let mut log = log.lock().expect("not poisoned");
        if line.contains(TRAP_LINE) {
            log.traps += 1;
        }
        if log.tail.len() == TAIL_LINES {
            log.tail.pop_front();
        }
        log.tail.push_back(format!("[{label}] {line}"));
    });
}

fn listening_addr(line: &str) -> Option<SocketAddr> {
    let (_, rest) = line.split_once("listening on http://")?;
    rest.split(|c: char| c.is_whitespace() || c == '/').next()?.parse().ok()
}

/// Where producers find each gateway: its address and incarnation, `None`
/// while it is down.
type AddressBook = Arc<RwLock<Vec<Option<(SocketAddr, u32)>>>>;

// ---------------------------------------------------------------------------
// The workload's records
// ---------------------------------------------------------------------------

/// How an item's id was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    New,
    Repeat,
    Shared,
}

#[derive(Clone, Debug)]
struct Item {
    txn: String,
    partition: String,
    kind: Kind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    Queued,
    Duplicate,
}

/// One item's answer.
#[derive(Clone, Copy, Debug)]
struct ItemAnswer {
    status: Status,
    message_id: Uuid,
    offset: i64,
}

#[derive(Clone, Debug)]
enum Outcome {
    /// 201 with one well-formed answer per item.
    Answered(Vec<ItemAnswer>),
    /// Any other status, with the body.
    Status(u16, String),
    Timeout,
    Connection(String),
    /// 201 whose body did not answer the request.
    Malformed(String),
}

#[derive(Clone, Debug)]
struct Attempt {
    gateway: usize,
    incarnation: u32,
    sent_us: i64,
    done_us: i64,
    outcome: Outcome,
}

/// One request of one producer and all its attempts.
#[derive(Clone, Debug)]
struct Request {
    producer: usize,
    seq: u64,
    items: Vec<Item>,
    attempts: Vec<Attempt>,
}

impl Request {
    fn answers(&self) -> Option<(&Attempt, &[ItemAnswer])> {
        let last = self.attempts.last()?;
        match &last.outcome {
            Outcome::Answered(answers) => Some((last, answers)),
            _ => None,
        }
    }
}

/// A configure the fault task made: the window may have changed at any time
/// from `sent_us` (its first attempt) to `acked_us` (its answer; `i64::MAX`
/// if none came).
#[derive(Clone, Copy, Debug)]
struct WindowChange {
    seconds: i32,
    sent_us: i64,
    acked_us: i64,
}

/// The windows that may have been in force over an interval.
#[derive(Clone, Debug)]
struct Windows {
    initial: i32,
    changes: Vec<WindowChange>,
}

impl Windows {
    /// The smallest and largest window possibly in force at some instant of
    /// `[from_us, to_us]`, in microseconds.
    fn range_us(&self, from_us: i64, to_us: i64) -> (i64, i64) {
        let mut current = self.initial;
        for change in &self.changes {
            if change.acked_us < from_us {
                current = change.seconds;
            }
        }
        let mut low = current;
        let mut high = current;
        for change in &self.changes {
            if change.sent_us <= to_us && change.acked_us >= from_us {
                low = low.min(change.seconds);
                high = high.max(change.seconds);
            }
        }
        (i64::from(low) * 1_000_000, i64::from(high) * 1_000_000)
    }
}

// ---------------------------------------------------------------------------
// The run
// ---------------------------------------------------------------------------

/// Everything a run counted and found.
#[derive(Debug, Default)]
pub struct Report {
    pub summary: String,
    pub requests: u64,
    pub items: u64,
    pub items_new: u64,
    pub items_repeat: u64,
    pub items_shared: u64,
    pub attempts: u64,
    pub retries: u64,
    pub retried_elsewhere: u64,
    pub timeouts: u64,
    pub connection_errors: u64,
    pub statuses: BTreeMap<u16, u64>,
    pub requests_answered: u64,
    pub requests_given_up: u64,
    pub queued: u64,
    pub duplicate: u64,
    pub kills: u64,
    pub restarts: u64,
    pub pg_restarts: u64,
    /// Jumps of a gateway's wall clock.
    pub clock_jumps: u64,
    /// The largest offset of a gateway's wall clock from PostgreSQL's that a
    /// gateway measured and reported (`stile_clock_offset_seconds`), in
    /// seconds, either way.
    pub max_clock_offset_s: f64,
    pub guest_traps: u64,
    pub window_changes: Vec<String>,
    pub fault_errors: Vec<String>,
    pub unexpected_exits: Vec<String>,
    pub gateway_lines: Vec<String>,
    /// Over all incarnations of all gateways, as scraped.
    pub max_suppressed: u64,
    pub max_evictions: u64,
    pub probes: BTreeMap<String, u64>,
    pub stored_messages: u64,
    pub stored_partitions: u64,
    pub ids_stored: u64,
    /// Ids stored again after their earlier copy left the (short) window.
    pub legal_restores: u64,
    pub violations: Vec<Violation>,
    pub histories: String,
    pub elapsed: Duration,
    /// Each gateway process's resident memory and cache gauges over time.
    pub vitals: Vec<String>,
    /// The samples of each gateway process (by gateway, then incarnation).
    pub samples: Vec<Vec<Sample>>,
    /// From a request's first send to its answer, over answered requests.
    pub latency: Latency,
    /// Of single attempts that were answered.
    pub attempt_latency: Latency,
}

/// A broken promise.
#[derive(Clone, Debug)]
pub struct Violation {
    pub kind: &'static str,
    pub partition: String,
    pub txn: String,
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {}/{}: {}", self.kind, self.partition, self.txn, self.detail)
    }
}

impl Report {
    /// Violations counted by kind.
    pub fn violations_by_kind(&self) -> BTreeMap<&'static str, u64> {
        let mut kinds = BTreeMap::new();
        for v in &self.violations {
            *kinds.entry(v.kind).or_insert(0) += 1;
        }
        kinds
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "checker: {}", self.summary)?;
        writeln!(
            f,
            "pushes: {} requests, {} items ({} new ids, {} repeats, {} shared), {} answered, {} given up",
            self.requests,
            self.items,
            self.items_new,
            self.items_repeat,
            self.items_shared,
            self.requests_answered,
            self.requests_given_up
        )?;
        let statuses: Vec<String> = self.statuses.iter().map(|(s, n)| format!("{n}x{s}")).collect();
        writeln!(
            f,
            "attempts: {}, retries {} ({} to another gateway); failed attempts: {} timeouts, {} connection errors, statuses [{}]",
            self.attempts,
            self.retries,
            self.retried_elsewhere,
            self.timeouts,
            self.connection_errors,
            statuses.join(", ")
        )?;
        writeln!(f, "answers: {} queued, {} duplicate", self.queued, self.duplicate)?;
        writeln!(
            f,
            "faults: {} gateway kills (kill -9), {} restarts, {} postgres restarts, {} guest traps, {} clock jumps \
             (offsets up to {:.0} s measured), window changes [{}]",
            self.kills,
            self.restarts,
            self.pg_restarts,
            self.guest_traps,
            self.clock_jumps,
            self.max_clock_offset_s,
            self.window_changes.join(", ")
        )?;
        let probes: Vec<String> = self.probes.iter().map(|(k, v)| format!("{k} {v}")).collect();
        writeln!(
            f,
            "cache (scraped): max suppressed partitions {}, max evictions {}, segments by probe [{}]",
            self.max_suppressed,
            self.max_evictions,
            probes.join(", ")
        )?;
        for line in &self.gateway_lines {
            writeln!(f, "  {line}")?;
        }
        writeln!(f, "latency, first send to answer: {}", self.latency)?;
        writeln!(f, "latency, one answered attempt: {}", self.attempt_latency)?;
        for line in &self.vitals {
            writeln!(f, "{line}")?;
        }
        for error in &self.fault_errors {
            writeln!(f, "fault error: {error}")?;
        }
        for exit in &self.unexpected_exits {
            writeln!(f, "UNEXPECTED GATEWAY EXIT: {exit}")?;
        }
        writeln!(
            f,
            "stored: {} messages in {} partitions, {} distinct ids, {} re-stored after leaving the window",
            self.stored_messages, self.stored_partitions, self.ids_stored, self.legal_restores
        )?;
        let kinds: Vec<String> = self.violations_by_kind().iter().map(|(k, n)| format!("{k} {n}")).collect();
        writeln!(f, "violations: {} [{}]", self.violations.len(), kinds.join(", "))?;
        for violation in self.violations.iter().take(50) {
            writeln!(f, "  {violation}")?;
        }
        if self.violations.len() > 50 {
            writeln!(f, "  ... and {} more", self.violations.len() - 50)?;
        }
        if !self.histories.is_empty() {
            write!(f, "{}", self.histories)?;
        }
        write!(f, "elapsed: {:.1} s", self.elapsed.as_secs_f64())
    }
}

/// Runs the workload with its faults, then checks everything against SQL.
pub async fn run(config: &Config) -> anyhow::Result<Report> {
    let started = Instant::now();
    let mut report = Report {
        summary: format!(
            "seed {:#x}, {} s, {} producers at {} req/s, {} partitions (hot groups of {} moving every {:?}), batches 1..={}, {}% repeats, {}% shared ids, gateways [{}]",
            config.seed,
            config.duration.as_secs(),
            config.producers,
            config.rate,
            config.partitions,
            config.hot_partitions,
            config.hot_phase,
            config.max_batch,
            config.repeat_percent,
            config.shared_percent,
            config.gateways.iter().map(|g| format!("{} {}", g.label, g.args.join(" "))).collect::<Vec<_>>().join("; ")
        ),
        ..Report::default()
    };

    // Gateways.
    let mut nodes: Vec<Node> = config.gateways.iter().map(|spec| Node::new(spec.clone(), &config.database_url)).collect();
    let book: AddressBook = Arc::new(RwLock::new(vec![None; nodes.len()]));
    for (index, node) in nodes.iter_mut().enumerate() {
        let addr = node.start().await?;
        book.write().expect("not poisoned")[index] = Some((addr, 0));
    }

    // The long window, certain before the first push.
    let mut admin = Admin { book: book.clone() };
    admin.configure(&config.queue, config.long_window_seconds).await.context("set the long window")?;
    let windows = Arc::new(Mutex::new(Windows { initial: config.long_window_seconds, changes: Vec::new() }));

    let pg_cluster =
        match (&config.faults.pg_cluster, config.faults.pg_restart_every.is_some() || !config.faults.pg_restart_at.is_empty()) {
            (Some(cluster), _) => Some(cluster.clone()),
            (None, true) => Some(PgCluster::for_url(&config.database_url)?),
            (None, false) => None,
        };

    // Producers, the metrics scraper and the fault schedule.
    let t0 = Instant::now();
    let end = t0 + config.duration;
    let mut producers = Vec::new();
    for producer in 0..config.producers {
        let config = config.clone();
        let book = book.clone();
        producers.push(tokio::spawn(async move { produce(producer, &config, &book, t0, end).await }));
    }
    let scraped: Arc<Mutex<HashMap<(usize, u32), Scrape>>> = Arc::default();
    let stop_scraping = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let scraper = tokio::spawn(scrape_loop(book.clone(), scraped.clone(), stop_scraping.clone(), t0));
    let schedule = schedule(config);
    let mut faults = FaultLog::default();
    run_faults(&schedule, &mut nodes, &book, &mut admin, &windows, pg_cluster.as_ref(), config, t0, end, &mut faults).await;

    let mut requests: Vec<Request> = Vec::new();
    for task in producers {
        requests.extend(task.await.context("a producer panicked")?);
    }
    // Every gateway up again for the last scrape.
    for (index, node) in nodes.iter_mut().enumerate() {
        if let Some(status) = node.exited() {
            faults.unexpected_exits.push(format!("{} exited ({status}):\n{}", node.spec.label, node.tail()));
            book.write().expect("not poisoned")[index] = None;
        }
    }
    stop_scraping.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = scraper.await;
    scrape_all(&book, &scraped, t0).await;

    report.kills = faults.kills;
    report.restarts = faults.restarts;
    report.pg_restarts = faults.pg_restarts;
    report.clock_jumps = faults.clock_jumps;
    report.fault_errors = faults.errors;
    report.unexpected_exits = faults.unexpected_exits;
    let windows = windows.lock().expect("not poisoned").clone();
    report.window_changes = windows
        .changes
        .iter()
        .map(|c| {
            let sent = (c.sent_us - micros_of(t0)) as f64 / 1e6;
            format!("{} s at {sent:.1} s", c.seconds)
        })
        .collect();
    for node in &nodes {
        report.guest_traps += node.traps();
    }
    summarise_scrapes(&scraped.lock().expect("not poisoned"), &nodes, &mut report);
    let gateway_tails: Vec<String> = nodes.iter().map(|n| n.tail()).collect();
    for node in &mut nodes {
        node.kill();
    }

    // The truth.
    let stored = read_stored(&config.database_url, &config.queue).await?;
    check(&requests, &stored, &windows, &mut report);
    if !report.violations.is_empty() && report.violations.iter().any(|v| v.kind == "storage") {
        let _ = writeln!(report.histories, "gateway logs (tails):\n{}", gateway_tails.join("\n"));
    }
    report.elapsed = started.elapsed();
    Ok(report)
}

/// Microseconds since the epoch of an `Instant`, by the wall clock now.
fn micros_of(instant: Instant) -> i64 {
    now_us() - i64::try_from(instant.elapsed().as_micros()).unwrap_or(0)
}

// ---------------------------------------------------------------------------
// Producers
// ---------------------------------------------------------------------------

async fn produce(producer: usize, config: &Config, book: &AddressBook, t0: Instant, end: Instant) -> Vec<Request> {
    let mut rng = StdRng::seed_from_u64(config.seed ^ (producer as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut clients: Vec<Option<(u32, Client)>> = (0..config.gateways.len()).map(|_| None).collect();
    let mut requests = Vec::new();
    let mut next_new: u64 = 0;
    // The partition of each of this producer's ids, fixed when it is minted.
    let mut own_partitions: Vec<String> = Vec::new();
    let interval = if config.rate > 0.0 { Duration::from_secs_f64(1.0 / config.rate) } else { Duration::ZERO };
    let mut next_at = Instant::now();
    for seq in 0..config.max_requests as u64 {
        if Instant::now() >= end {
            break;
        }
        if !interval.is_zero() {
            tokio::time::sleep_until(next_at.into()).await;
            // A stall (a retried request) is not made up for with a burst.
            next_at = (next_at + interval).max(Instant::now());
        }
        let count = rng.random_range(1..=config.max_batch);
        let mut items: Vec<Item> = Vec::with_capacity(count);
        for _ in 0..count {
            let roll = rng.random_range(0..100u32);
            let now = t0.elapsed();
            let (txn, kind) = if roll < config.repeat_percent && (next_new > 0 || !items.is_empty()) {
                if !items.is_empty() && (next_new == 0 || rng.random_bool(0.1)) {
                    // The same id twice in one request.
                    let earlier = items[rng.random_range(0..items.len())].clone();
                    items.push(Item { kind: Kind::Repeat, ..earlier });
                    continue;
                } else {
                    // Mostly recent ids (a producer's retry logic), sometimes any.
                    let n = if rng.random_bool(0.8) {
                        next_new - 1 - rng.random_range(0..next_new.min(64))
                    } else {
                        rng.random_range(0..next_new)
                    };
                    let partition = own_partitions[n as usize].clone();
                    items.push(Item { txn: format!("p{producer}-{n}"), partition, kind: Kind::Repeat });
                    continue;
                }
            } else if roll < config.repeat_percent + config.shared_percent {
                // Producers pushing at about the same time pick from the same few.
                let slot = now.as_millis() / 500;
                (format!("s-{slot}-{}", rng.random_range(0..4)), Kind::Shared)
            } else {
                next_new += 1;
                (format!("p{producer}-{}", next_new - 1), Kind::New)
            };
            // Shared ids are placed by the time their slot names, so that
            // every producer places one the same way.
            let minted_at = match kind {
                Kind::Shared => Duration::from_millis(500 * (now.as_millis() / 500) as u64),
                _ => now,
            };
            let partition = partition_of(&txn, minted_at, config);
            if kind == Kind::New {
                own_partitions.push(partition.clone());
            }
            items.push(Item { txn, partition, kind });
        }
        let mut request = Request { producer, seq, items, attempts: Vec::new() };
        send(&mut request, config, book, &mut clients, &mut rng).await;
        requests.push(request);
    }
    requests
}

/// A new id's partition, in the hot group of the time it is minted at; the
/// id keeps it for good.
fn partition_of(txn: &str, minted_at: Duration, config: &Config) -> String {
    let hash = xxhash_rust::xxh3::xxh3_64(txn.as_bytes()) as usize;
    let partitions = config.partitions.max(1);
    let hot = config.hot_partitions.min(partitions);
    if hot == 0 || config.hot_phase.is_zero() {
        return format!("part-{}", hash % partitions);
    }
    let groups = partitions / hot;
    let group = (minted_at.as_millis() / config.hot_phase.as_millis()) as usize % groups;
    format!("part-{}", group * hot + hash % hot)
}

/// Sends one request until it is answered, refused for good, or given up.
async fn send(
    request: &mut Request,
    config: &Config,
    book: &AddressBook,
    clients: &mut [Option<(u32, Client)>],
    rng: &mut StdRng,
) {
    let deadline = Instant::now() + config.request_deadline;
    let mut backoff = Duration::from_millis(50);
    for attempt in 0..config.max_attempts {
        let gateway = rng.random_range(0..clients.len());
        let body = json!({
            "items": request.items.iter().map(|item| json!({
                "queue": config.queue,
                "partition": item.partition,
                "transactionId": item.txn,
                "payload": { "c": [request.producer, request.seq, attempt] },
            })).collect::<Vec<_>>()
        })
        .to_string();
        let target = book.read().expect("not poisoned")[gateway];
        let sent_us = now_us();
        let (incarnation, outcome) = match target {
            None => (0, Outcome::Connection("the gateway is down".to_owned())),
            Some((addr, incarnation)) => {
                let outcome =
                    tokio::time::timeout(config.attempt_timeout, exchange(&mut clients[gateway], addr, incarnation, body)).await;
                let outcome = match outcome {
                    Ok(Ok((201, text))) => parse_answer(&text, &request.items, &config.queue),
                    Ok(Ok((status, text))) => Outcome::Status(status, text),
                    Ok(Err(error)) => Outcome::Connection(format!("{error:#}")),
                    Err(_) => Outcome::Timeout,
                };
                if !matches!(outcome, Outcome::Answered(_)) {
                    // A fresh connection next time.
                    clients[gateway] = None;
                }
                (incarnation, outcome)
            }
        };
        let done_us = now_us();
        let retry = match &outcome {
            Outcome::Answered(_) | Outcome::Malformed(_) => false,
            Outcome::Status(status, _) => *status >= 500,
            Outcome::Timeout | Outcome::Connection(_) => true,
        };
        request.attempts.push(Attempt { gateway, incarnation, sent_us, done_us, outcome });
        if !retry || Instant::now() >= deadline {
            return;
        }
        let jitter = Duration::from_millis(rng.random_range(0..=backoff.as_millis() as u64 / 2));
        tokio::time::sleep((backoff + jitter).min(deadline.saturating_duration_since(Instant::now()))).await;
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

async fn exchange(
    slot: &mut Option<(u32, Client)>,
    addr: SocketAddr,
    incarnation: u32,
    body: String,
) -> anyhow::Result<(u16, String)> {
    if slot.as_ref().is_none_or(|(i, _)| *i != incarnation) {
        *slot = Some((incarnation, Client::connect(addr).await?));
    }
    let (_, client) = slot.as_mut().expect("just connected");
    let reply = client.send(Method::POST, "/api/v1/push", body, &[("content-type", "application/json")]).await?;
    Ok((reply.status, reply.text()))
}

/// Parses a 201 body and checks its shape against the request.
fn parse_answer(text: &str, items: &[Item], queue: &str) -> Outcome {
    let Ok(Value::Array(entries)) = serde_json::from_str::<Value>(text) else {
        return Outcome::Malformed(format!("not a JSON array: {text}"));
    };
    if entries.len() != items.len() {
        return Outcome::Malformed(format!("{} answers for {} items: {text}", entries.len(), items.len()));
    }
    let mut answers = Vec::with_capacity(items.len());
    for (index, (entry, item)) in entries.iter().zip(items).enumerate() {
        let status = match entry.get("status").and_then(Value::as_str) {
            Some("queued") => Status::Queued,
            Some("duplicate") => Status::Duplicate,
            _ => return Outcome::Malformed(format!("answer {index} has no known status: {entry}")),
        };
        let message_id = entry.get("message_id").and_then(Value::as_str).and_then(|s| Uuid::parse_str(s).ok());
        let offset = entry.get("offset").and_then(Value::as_i64);
        let (Some(message_id), Some(offset)) = (message_id, offset) else {
            return Outcome::Malformed(format!("answer {index} lacks a message id or an offset: {entry}"));
        };
        let echoes = entry.get("index").and_then(Value::as_u64) == Some(index as u64)
            && entry.get("transaction_id").and_then(Value::as_str) == Some(item.txn.as_str())
            && entry.get("queueName").and_then(Value::as_str) == Some(queue)
            && entry.get("partition").and_then(Value::as_str) == Some(item.partition.as_str());
        if !echoes || offset < 0 {
            return Outcome::Malformed(format!("answer {index} does not echo item {index} ({}): {entry}", item.txn));
        }
        answers.push(ItemAnswer { status, message_id, offset });
    }
    Outcome::Answered(answers)
}

// ---------------------------------------------------------------------------
// Faults
// ---------------------------------------------------------------------------

#[derive(Clone, Debug)]
enum FaultEvent {
    Kill(usize),
    PgRestart,
    Window(i32),
    /// A gateway's wall clock jumps to this offset (seconds).
    Clock(usize, i64),
}

fn schedule(config: &Config) -> Vec<(Duration, FaultEvent)> {
    let mut events = Vec::new();
    let run = config.duration;
    if let Some(every) = config.faults.kill_every {
        let mut at = every;
        let mut k = 0;
        while at + config.faults.kill_downtime < run {
            events.push((at, FaultEvent::Kill(k % config.gateways.len())));
            k += 1;
            at += every;
        }
    }
    if let Some(every) = config.faults.pg_restart_every {
        let mut at = every;
        while at < run {
            events.push((at, FaultEvent::PgRestart));
            at += every;
        }
    }
    for &at in &config.faults.pg_restart_at {
        events.push((at, FaultEvent::PgRestart));
    }
    if let Some(short) = config.faults.short_window {
        events.push((run.mul_f64(short.from), FaultEvent::Window(short.seconds)));
        events.push((run.mul_f64(short.to), FaultEvent::Window(config.long_window_seconds)));
    }
    for (gateway, spec) in config.gateways.iter().enumerate() {
        for (at, offset_s) in spec.clock.iter().flat_map(|skew| skew.jumps(run)) {
            events.push((at, FaultEvent::Clock(gateway, offset_s)));
        }
    }
    events.sort_by_key(|(at, _)| *at);
    events
}

#[derive(Debug, Default)]
struct FaultLog {
    kills: u64,
    restarts: u64,
    pg_restarts: u64,
    clock_jumps: u64,
    errors: Vec<String>,
    unexpected_exits: Vec<String>,
}

/// Configures through whichever gateway answers.
struct Admin {
    book: AddressBook,
}

impl Admin {
    /// Sets the queue's window; the answer's time is when it surely holds.
    async fn configure(&mut self, queue: &str, seconds: i32) -> anyhow::Result<(i64, i64)> {
        let sent_us = now_us();
        let body = json!({ "queue": queue, "options": { "dedupWindowSeconds": seconds } }).to_string();
        let mut last_error = String::new();
        for _ in 0..120 {
            let targets: Vec<SocketAddr> = self.book.read().expect("not poisoned").iter().flatten().map(|(a, _)| *a).collect();
            for addr in targets {
                let attempt = async {
                    let mut client = Client::connect(addr).await?;
                    client.send(Method::POST, "/api/v1/configure", body.clone(), &[("content-type", "application/json")]).await
                };
                match tokio::time::timeout(Duration::from_secs(10), attempt).await {
                    Ok(Ok(reply)) if reply.status == 200 => {
                        let stored = reply.json()["options"]["dedupWindowSeconds"].as_i64();
                        if stored != Some(i64::from(seconds)) {
                            bail!("configure stored {stored:?}, not {seconds}: {}", reply.text());
                        }
                        return Ok((sent_us, now_us()));
                    }
                    Ok(Ok(reply)) => last_error = format!("HTTP {}: {}", reply.status, reply.text()),
                    Ok(Err(error)) => last_error = format!("{error:#}"),
                    Err(_) => last_error = "timed out".to_owned(),
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        bail!("configure {queue} to {seconds} s failed: {last_error}")
    }
}

#[allow(clippy::too_many_arguments)]
async fn run_faults(
    schedule: &[(Duration, FaultEvent)],
    nodes: &mut [Node],
    book: &AddressBook,
    admin: &mut Admin,
    windows: &Arc<Mutex<Windows>>,
    pg_cluster: Option<&PgCluster>,
    config: &Config,
    t0: Instant,
    end: Instant,
    log: &mut FaultLog,
) {
    let mut next = 0;
    loop {
        // A gateway that exited by itself is a finding: report and restart it.
        for (index, node) in nodes.iter_mut().enumerate() {
            if let Some(status) = node.exited() {
                log.unexpected_exits.push(format!("{} exited ({status}):\n{}", node.spec.label, node.tail()));
                restart(index, node, book, log).await;
            }
        }
        if next < schedule.len() && t0.elapsed() >= schedule[next].0 {
            match schedule[next].1 {
                FaultEvent::Kill(index) => {
                    let node = &mut nodes[index];
                    book.write().expect("not poisoned")[index] = None;
                    node.kill();
                    log.kills += 1;
                    tokio::time::sleep(config.faults.kill_downtime).await;
                    restart(index, node, book, log).await;
                }
                FaultEvent::PgRestart => {
                    if let Some(cluster) = pg_cluster {
                        let cluster = cluster.clone();
                        match tokio::task::spawn_blocking(move || cluster.restart()).await {
                            Ok(Ok(())) => log.pg_restarts += 1,
                            Ok(Err(error)) => log.errors.push(format!("{error:#}")),
                            Err(error) => log.errors.push(format!("pg restart task: {error}")),
                        }
                    }
                }
                FaultEvent::Window(seconds) => {
                    let sent_us = now_us();
                    let outcome = admin.configure(&config.queue, seconds).await;
                    let (sent_us, acked_us) = match outcome {
                        Ok(times) => times,
                        Err(error) => {
                            log.errors.push(format!("{error:#}"));
                            (sent_us, i64::MAX)
                        }
                    };
                    windows.lock().expect("not poisoned").changes.push(WindowChange { seconds, sent_us, acked_us });
                }
                FaultEvent::Clock(index, offset_s) => {
                    let node = &nodes[index];
                    match node.clock.as_ref().map(|file| file.set(offset_s)) {
                        Some(Ok(())) => log.clock_jumps += 1,
                        Some(Err(error)) => log.errors.push(format!("{}: {error:#}", node.spec.label)),
                        None => log.errors.push(format!("{}: a clock jump without a clock file", node.spec.label)),
                    }
                }
            }
            next += 1;
            continue;
        }
        if Instant::now() >= end && next >= schedule.len() {
            return;
        }
        if Instant::now() >= end + config.request_deadline {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn restart(index: usize, node: &mut Node, book: &AddressBook, log: &mut FaultLog) {
    node.kill();
    node.incarnation += 1;
    for attempt in 0..30 {
        match node.start().await {
            Ok(addr) => {
                book.write().expect("not poisoned")[index] = Some((addr, node.incarnation));
                log.restarts += 1;
                return;
            }
            Err(error) => {
                if attempt == 29 {
                    log.errors.push(format!("restart {}: {error:#}", node.spec.label));
                }
                // The address may still be taken, or the database down:
                // after a few tries, any free port will do.
                if attempt >= 3 {
                    node.addr = None;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Metrics
// ---------------------------------------------------------------------------

/// The last `/metrics` of one incarnation of one gateway.
#[derive(Clone, Debug, Default)]
struct Scrape {
    rebuilds: u64,
    /// The largest clock offset the gateway reported, either way (seconds).
    max_clock_offset_s: f64,
    probes: BTreeMap<String, u64>,
    unavailable: u64,
    samples: Vec<Sample>,
}

async fn scrape_loop(
    book: AddressBook,
    scraped: Arc<Mutex<HashMap<(usize, u32), Scrape>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    t0: Instant,
) {
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        scrape_all(&book, &scraped, t0).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn scrape_all(book: &AddressBook, scraped: &Mutex<HashMap<(usize, u32), Scrape>>, t0: Instant) {
    let targets: Vec<(usize, SocketAddr, u32)> =
        book.read().expect("not poisoned").iter().enumerate().filter_map(|(i, t)| t.map(|(a, n)| (i, a, n))).collect();
    for (index, addr, incarnation) in targets {
        let fetch = async {
            let mut client = Client::connect(addr).await?;
            client.send(Method::GET, "/metrics", bytes::Bytes::new(), &[]).await
        };
        let Ok(Ok(reply)) = tokio::time::timeout(Duration::from_secs(2), fetch).await else { continue };
        if reply.status != 200 {
            continue;
        }
        let text = reply.text();
        let mut scraped = scraped.lock().expect("not poisoned");
        let scrape = scraped.entry((index, incarnation)).or_default();
        scrape.samples.push(Sample::from_metrics(&text, t0.elapsed().as_secs_f64()));
        scrape.rebuilds = sum_series(&text, "stile_cache_instance_rebuilds");
        if let Some(offset_s) = gauge(&text, "stile_clock_offset_seconds") {
            scrape.max_clock_offset_s = scrape.max_clock_offset_s.max(offset_s.abs());
        }
        scrape.unavailable = sum_series(&text, "stile_database_unavailable_total");
        for probe in ["skipped", "narrowed", "full", "off"] {
            scrape.probes.insert(probe.to_owned(), sum_series(&text, &format!("stile_segments_total{{probe=\"{probe}\"}}")));
        }
    }
}

/// The sum of every series of a metric (or one series, given with labels).
pub(crate) fn sum_series(text: &str, name: &str) -> u64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            let value = if name.ends_with('}') {
                rest.strip_prefix(' ')?
            } else if rest.starts_with('{') {
                rest.split_once("} ")?.1
            } else {
                rest.strip_prefix(' ')?
            };
            value.trim().parse::<f64>().ok()
        })
        .sum::<f64>() as u64
}

/// The value of a gauge without labels, sign and all.
fn gauge(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

fn summarise_scrapes(scraped: &HashMap<(usize, u32), Scrape>, nodes: &[Node], report: &mut Report) {
    for (index, node) in nodes.iter().enumerate() {
        let mine: Vec<&Scrape> = scraped.iter().filter(|((i, _), _)| *i == index).map(|(_, s)| s).collect();
        let peak = |scrape: &Scrape, of: fn(&Sample) -> u64| scrape.samples.iter().map(of).max().unwrap_or(0);
        let suppressed = mine.iter().map(|s| peak(s, |x| x.suppressed)).max().unwrap_or(0);
        let evictions: u64 = mine.iter().map(|s| peak(s, |x| x.evictions)).sum();
        let rebuilds: u64 = mine.iter().map(|s| s.rebuilds).sum();
        let unavailable: u64 = mine.iter().map(|s| s.unavailable).sum();
        let max_bytes = mine.iter().map(|s| peak(s, |x| x.cache_bytes)).max().unwrap_or(0);
        let clock_offset_s = mine.iter().map(|s| s.max_clock_offset_s).fold(0.0, f64::max);
        report.max_clock_offset_s = report.max_clock_offset_s.max(clock_offset_s);
        report.max_suppressed = report.max_suppressed.max(suppressed);
        report.max_evictions += evictions;
        let mut probes: BTreeMap<String, u64> = BTreeMap::new();
        for scrape in &mine {
            for (probe, n) in &scrape.probes {
                *probes.entry(probe.clone()).or_insert(0) += n;
                *report.probes.entry(probe.clone()).or_insert(0) += n;
            }
        }
        let mut incarnations: Vec<(&(usize, u32), &Scrape)> = scraped.iter().filter(|((i, _), _)| *i == index).collect();
        incarnations.sort_by_key(|(key, _)| **key);
        for ((_, incarnation), scrape) in incarnations {
            let label = format!("{} incarnation {incarnation}", node.spec.label);
            report.vitals.extend(vitals::describe(&label, &scrape.samples));
            report.samples.push(scrape.samples.clone());
        }
        let probes: Vec<String> = probes.iter().map(|(k, v)| format!("{k} {v}")).collect();
        report.gateway_lines.push(format!(
            "{} ({}{}): {} incarnations, {} guest traps logged, {rebuilds} instance rebuilds, max {} KiB cached, max {suppressed} suppressed, {evictions} evictions, {unavailable} answered 503 for the database, clock off PostgreSQL's by up to {clock_offset_s:.0} s, segments [{}]",
            node.spec.label,
            if node.spec.args.is_empty() { "defaults".to_owned() } else { node.spec.args.join(" ") },
            node.spec.clock.as_ref().map_or(String::new(), |skew| format!(", clock {:?} s", skew.offsets_s)),
            node.incarnation + 1,
            node.traps(),
            max_bytes / 1024,
            probes.join(", ")
        ));
    }
}

// ---------------------------------------------------------------------------
// The truth, from SQL
// ---------------------------------------------------------------------------

/// One stored message.
#[derive(Clone, Debug)]
struct Copy {
    offset: i64,
    message_id: Uuid,
    txn: String,
    created_us: i64,
    /// `[producer, request, attempt]` from its payload.
    writer: Option<(usize, u64, u32)>,
    payload: Value,
}

#[derive(Debug, Default)]
struct Stored {
    /// partition → its messages in offset order.
    partitions: BTreeMap<String, Vec<Copy>>,
    /// Storage problems found while reading.
    problems: Vec<(String, String)>,
}

async fn read_stored(database_url: &str, queue: &str) -> anyhow::Result<Stored> {
    let mut config = stile::db::pg_config(database_url).map_err(|e| anyhow!("{e}"))?;
    config.connect_timeout(Duration::from_secs(10));
    let mut client = None;
    let mut last_error = String::new();
    for _ in 0..60 {
        match crate::pg::connect(&config).await {
            Ok(c) => {
                client = Some(c);
                break;
            }
            Err(e) => {
                last_error = e.to_string();
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
    let client = client.ok_or_else(|| anyhow!("connect to read the truth: {last_error}"))?;
    let partitions = client
        .query("SELECT id, name, last_offset, txns_start FROM stile.partitions WHERE queue = $1 ORDER BY id", &[&queue])
        .await?;
    let mut stored = Stored::default();
    for row in partitions {
        let id: i64 = row.get(0);
        let name: String = row.get(1);
        let last_offset: i64 = row.get(2);
        let txns_start: i64 = row.get(3);
        let segments = client
            .query(
                "SELECT base_offset, end_offset, (extract(epoch FROM created_at) * 1000000)::bigint, \
                        message_ids, transaction_ids, payloads \
                   FROM stile.segments WHERE partition_id = $1 ORDER BY base_offset",
                &[&id],
            )
            .await?;
        let txns = client
            .query(
                "SELECT base_offset, end_offset, (extract(epoch FROM created_at) * 1000000)::bigint, hashes \
                   FROM stile.txns WHERE partition_id = $1 ORDER BY base_offset",
                &[&id],
            )
            .await?;
        let mut problem = |what: String| stored.problems.push((name.clone(), what));
        if txns_start != 0 {
            problem(format!("txns_start is {txns_start} though nothing was purged"));
        }
        let mut txns_by_base: HashMap<i64, (i64, i64, Vec<u8>)> =
            txns.iter().map(|r| (r.get::<_, i64>(0), (r.get(1), r.get(2), r.get(3)))).collect();
        let mut copies = Vec::new();
        let mut expected_base = 0i64;
        for row in &segments {
            let base: i64 = row.get(0);
            let end: i64 = row.get(1);
            let created_us: i64 = row.get(2);
            let message_ids: Vec<Uuid> = row.get(3);
            let transaction_ids: Vec<String> = row.get(4);
            let payloads: Vec<Value> = row.get(5);
            if base != expected_base {
                problem(format!("segments do not tile the offsets: expected a segment at {expected_base}, found {base}"));
            }
            expected_base = end + 1;
            let count = usize::try_from(end - base + 1).unwrap_or(0);
            if message_ids.len() != count || transaction_ids.len() != count || payloads.len() != count {
                problem(format!(
                    "segment {base}..={end} holds {} ids, {} transactionIds, {} payloads",
                    message_ids.len(),
                    transaction_ids.len(),
                    payloads.len()
                ));
            }
            match txns_by_base.remove(&base) {
                None => problem(format!("segment {base}..={end} has no txns row")),
                Some((t_end, t_created, hashes)) => {
                    let expected: Vec<u8> = transaction_ids.iter().flat_map(|t| stile::hash::txn_hash(t)).collect();
                    if t_end != end || t_created != created_us || hashes != expected {
                        problem(format!(
                            "txns row {base} (end {t_end}, created {t_created}, {} hash bytes) does not match its segment (end {end}, created {created_us}, {} ids)",
                            hashes.len(),
                            transaction_ids.len()
                        ));
                    }
                }
            }
            for (i, ((message_id, txn), payload)) in message_ids.into_iter().zip(transaction_ids).zip(payloads).enumerate() {
                let writer = payload.get("c").and_then(Value::as_array).and_then(|c| match c.as_slice() {
                    [p, r, a] => Some((usize::try_from(p.as_u64()?).ok()?, r.as_u64()?, u32::try_from(a.as_u64()?).ok()?)),
                    _ => None,
                });
                copies.push(Copy { offset: base + i as i64, message_id, txn, created_us, writer, payload });
            }
        }
        if expected_base != last_offset + 1 {
            problem(format!("the allocator is at {last_offset} but the segments end at {}", expected_base - 1));
        }
        for base in txns_by_base.keys() {
            problem(format!("txns row {base} has no segment"));
        }
        stored.partitions.insert(name, copies);
    }
    Ok(stored)
}

// ---------------------------------------------------------------------------
// The checks
// ---------------------------------------------------------------------------

type Key = (String, String);

fn check(requests: &[Request], stored: &Stored, windows: &Windows, report: &mut Report) {
    let mut violations: Vec<Violation> = Vec::new();
    let mut violate = |kind: &'static str, partition: &str, txn: &str, detail: String| {
        violations.push(Violation { kind, partition: partition.to_owned(), txn: txn.to_owned(), detail });
    };

    // Counts.
    let (mut latencies, mut attempt_latencies) = (Vec::new(), Vec::new());
    for request in requests {
        report.requests += 1;
        report.items += request.items.len() as u64;
        for item in &request.items {
            match item.kind {
                Kind::New => report.items_new += 1,
                Kind::Repeat => report.items_repeat += 1,
                Kind::Shared => report.items_shared += 1,
            }
        }
        report.attempts += request.attempts.len() as u64;
        report.retries += request.attempts.len().saturating_sub(1) as u64;
        for pair in request.attempts.windows(2) {
            if pair[0].gateway != pair[1].gateway {
                report.retried_elsewhere += 1;
            }
        }
        for attempt in &request.attempts {
            match &attempt.outcome {
                Outcome::Answered(_) => {}
                Outcome::Status(status, _) => *report.statuses.entry(*status).or_insert(0) += 1,
                Outcome::Timeout => report.timeouts += 1,
                Outcome::Connection(_) => report.connection_errors += 1,
                Outcome::Malformed(why) => {
                    let item = &request.items[0];
                    violate("protocol", &item.partition, &item.txn, format!("a 201 that does not answer the request: {why}"));
                }
            }
            if let Outcome::Status(status, body) = &attempt.outcome
                && *status < 500
            {
                let item = &request.items[0];
                violate("protocol", &item.partition, &item.txn, format!("a valid push answered {status}: {body}"));
            }
        }
        for attempt in request.attempts.iter().filter(|a| matches!(a.outcome, Outcome::Answered(_))) {
            attempt_latencies.push(attempt.done_us - attempt.sent_us);
        }
        match request.answers() {
            Some((last, answers)) => {
                report.requests_answered += 1;
                latencies.push(last.done_us - request.attempts[0].sent_us);
                for answer in answers {
                    match answer.status {
                        Status::Queued => report.queued += 1,
                        Status::Duplicate => report.duplicate += 1,
                    }
                }
            }
            None => report.requests_given_up += 1,
        }
    }
    report.latency = Latency::of(latencies);
    report.attempt_latency = Latency::of(attempt_latencies);

    for (partition, what) in &stored.problems {
        violate("storage", partition, "-", what.clone());
    }

    // Indexes.
    let by_request: HashMap<(usize, u64), &Request> = requests.iter().map(|r| ((r.producer, r.seq), r)).collect();
    let mut at_offset: HashMap<(&str, i64), &Copy> = HashMap::new();
    let mut copies_of: HashMap<Key, Vec<&Copy>> = HashMap::new();
    for (partition, copies) in &stored.partitions {
        report.stored_partitions += 1;
        for copy in copies {
            report.stored_messages += 1;
            at_offset.insert((partition.as_str(), copy.offset), copy);
            copies_of.entry((partition.clone(), copy.txn.clone())).or_default().push(copy);
        }
    }
    report.ids_stored = copies_of.len() as u64;

    // Every stored message was written by an attempt that carried it, after it
    // was sent; an answered attempt said queued with its message id.
    for (partition, copies) in &stored.partitions {
        for copy in copies {
            let Some((producer, seq, attempt_no)) = copy.writer else {
                violate(
                    "unknown-write",
                    partition,
                    &copy.txn,
                    format!("offset {}: payload {} names no attempt", copy.offset, copy.payload),
                );
                continue;
            };
            let Some(request) = by_request.get(&(producer, seq)) else {
                violate("unknown-write", partition, &copy.txn, format!("offset {}: no request p{producer} #{seq}", copy.offset));
                continue;
            };
            if !request.items.iter().any(|i| i.txn == copy.txn && &i.partition == partition) {
                violate(
                    "unknown-write",
                    partition,
                    &copy.txn,
                    format!("offset {}: request p{producer} #{seq} did not carry this id here", copy.offset),
                );
                continue;
            }
            let Some(attempt) = request.attempts.get(attempt_no as usize) else {
                violate(
                    "unknown-write",
                    partition,
                    &copy.txn,
                    format!("offset {}: request p{producer} #{seq} made no attempt {attempt_no}", copy.offset),
                );
                continue;
            };
            if copy.created_us + CLOCK_TOLERANCE_US < attempt.sent_us {
                violate(
                    "unknown-write",
                    partition,
                    &copy.txn,
                    format!(
                        "offset {}: written {} us before its attempt was sent",
                        copy.offset,
                        attempt.sent_us - copy.created_us
                    ),
                );
            }
            if let Outcome::Answered(answers) = &attempt.outcome {
                let answered_queued = request.items.iter().zip(answers).any(|(i, a)| {
                    i.txn == copy.txn
                        && &i.partition == partition
                        && a.status == Status::Queued
                        && a.message_id == copy.message_id
                });
                if !answered_queued {
                    violate(
                        "stored-not-answered-queued",
                        partition,
                        &copy.txn,
                        format!(
                            "offset {} ({}) was written by p{producer} #{seq} attempt {attempt_no}, which was answered without it",
                            copy.offset, copy.message_id
                        ),
                    );
                }
            }
        }
    }

    // Every answer against the stored messages.
    let mut queued_ids: HashMap<Key, Vec<(i64, Uuid)>> = HashMap::new();
    for request in requests {
        let Some((attempt, answers)) = request.answers() else { continue };
        for (item, answer) in request.items.iter().zip(answers) {
            let partition = item.partition.as_str();
            let txn = item.txn.as_str();
            let Some(copy) = at_offset.get(&(partition, answer.offset)) else {
                violate(
                    "answer-not-stored",
                    partition,
                    txn,
                    format!("answered {:?} at offset {}, which holds nothing", answer.status, answer.offset),
                );
                continue;
            };
            if copy.txn != item.txn || copy.message_id != answer.message_id {
                violate(
                    "answer-not-stored",
                    partition,
                    txn,
                    format!(
                        "answered {:?} ({}) at offset {}, which holds {} ({})",
                        answer.status, answer.message_id, answer.offset, copy.txn, copy.message_id
                    ),
                );
                continue;
            }
            if copy.created_us > attempt.done_us + CLOCK_TOLERANCE_US {
                violate("answer-not-stored", partition, txn, format!("offset {} was written after the answer", answer.offset));
            }
            match answer.status {
                Status::Queued => {
                    if copy.created_us + CLOCK_TOLERANCE_US < attempt.sent_us {
                        violate(
                            "queued-but-old",
                            partition,
                            txn,
                            format!("answered queued at offset {}, written before the request was sent", answer.offset),
                        );
                    }
                    queued_ids
                        .entry((item.partition.clone(), item.txn.clone()))
                        .or_default()
                        .push((answer.offset, answer.message_id));
                }
                Status::Duplicate => {
                    let (w_min, w_max) = windows.range_us(attempt.sent_us, attempt.done_us);
                    if copy.created_us + w_max + CLOCK_TOLERANCE_US < attempt.sent_us {
                        violate(
                            "duplicate-outside-window",
                            partition,
                            txn,
                            format!("answered duplicate of offset {}, which was outside every window in force", answer.offset),
                        );
                    }
                    // MIN picks the original: no earlier copy was surely in the window.
                    let earlier = copies_of
                        .get(&(item.partition.clone(), item.txn.clone()))
                        .into_iter()
                        .flatten()
                        .find(|c| c.offset < answer.offset && c.created_us >= attempt.done_us - w_min + CLOCK_TOLERANCE_US);
                    if let Some(earlier) = earlier {
                        violate(
                            "duplicate-wrong-original",
                            partition,
                            txn,
                            format!(
                                "answered duplicate of offset {}, but offset {} holds an earlier copy inside the window",
                                answer.offset, earlier.offset
                            ),
                        );
                    }
                }
            }
        }
    }

    // The smallest window that may have been in force while the attempt that
    // wrote a copy ran: its push read the window at some instant between the
    // attempt's sending and the copy's creation.
    let smallest_window_us = |copy: &Copy| {
        let sent_us = copy
            .writer
            .and_then(|(p, r, a)| by_request.get(&(p, r)).and_then(|req| req.attempts.get(a as usize)).map(|at| at.sent_us))
            .unwrap_or(copy.created_us - 60_000_000);
        windows.range_us(sent_us.min(copy.created_us), copy.created_us).0
    };

    // At most one stored copy inside the window.
    for ((partition, txn), copies) in &copies_of {
        for pair in copies.windows(2) {
            let (previous, next) = (pair[0], pair[1]);
            let w_min = smallest_window_us(next);
            let apart = next.created_us - previous.created_us;
            if apart <= w_min {
                violate(
                    "stored-twice-in-window",
                    partition,
                    txn,
                    format!(
                        "offsets {} and {} were written {:.3} s apart, inside the window of at least {} s",
                        previous.offset,
                        next.offset,
                        apart as f64 / 1e6,
                        w_min / 1_000_000
                    ),
                );
            } else {
                report.legal_restores += 1;
            }
        }
    }

    // No id answered queued twice inside the window.
    for ((partition, txn), answers) in &queued_ids {
        let mut distinct: Vec<(i64, Uuid)> = answers.clone();
        distinct.sort();
        distinct.dedup();
        for pair in distinct.windows(2) {
            let (Some(first), Some(second)) =
                (at_offset.get(&(partition.as_str(), pair[0].0)), at_offset.get(&(partition.as_str(), pair[1].0)))
            else {
                continue; // already reported as not stored
            };
            if second.created_us - first.created_us <= smallest_window_us(second) {
                violate(
                    "queued-twice",
                    partition,
                    txn,
                    format!(
                        "answered queued as {} (offset {}) and as {} (offset {}) inside the window",
                        pair[0].1, pair[0].0, pair[1].1, pair[1].0
                    ),
                );
            }
        }
    }

    // Histories of the violating ids.
    let mut shown: HashSet<Key> = HashSet::new();
    let mut histories = String::new();
    for violation in &violations {
        if violation.txn == "-" || shown.len() >= 20 || !shown.insert((violation.partition.clone(), violation.txn.clone())) {
            continue;
        }
        history(
            &mut histories,
            &violation.partition,
            &violation.txn,
            requests,
            copies_of.get(&(violation.partition.clone(), violation.txn.clone())),
        );
    }
    report.histories = histories;
    report.violations = violations;
}

/// Every attempt that carried an id, and its stored copies.
fn history(out: &mut String, partition: &str, txn: &str, requests: &[Request], copies: Option<&Vec<&Copy>>) {
    let _ = writeln!(out, "history of {partition}/{txn}:");
    let mut lines: Vec<(i64, String)> = Vec::new();
    for request in requests {
        let positions: Vec<usize> =
            request.items.iter().enumerate().filter(|(_, i)| i.txn == txn && i.partition == partition).map(|(k, _)| k).collect();
        if positions.is_empty() {
            continue;
        }
        for (n, attempt) in request.attempts.iter().enumerate() {
            let answer = match &attempt.outcome {
                Outcome::Answered(answers) => positions
                    .iter()
                    .map(|&k| format!("item {k}: {:?} {} at {}", answers[k].status, answers[k].message_id, answers[k].offset))
                    .collect::<Vec<_>>()
                    .join("; "),
                Outcome::Status(status, body) => format!("HTTP {status} {}", body.chars().take(160).collect::<String>()),
                Outcome::Timeout => "timed out".to_owned(),
                Outcome::Connection(error) => format!("connection error: {}", error.chars().take(160).collect::<String>()),
                Outcome::Malformed(why) => format!("malformed 201: {}", why.chars().take(160).collect::<String>()),
            };
            lines.push((
                attempt.sent_us,
                format!(
                    "  attempt p{} #{} try {n} via gateway {}#{}: sent {} done {} (+{} ms): {answer}",
                    request.producer,
                    request.seq,
                    attempt.gateway,
                    attempt.incarnation,
                    attempt.sent_us,
                    attempt.done_us,
                    (attempt.done_us - attempt.sent_us) / 1000
                ),
            ));
        }
    }
    for copy in copies.into_iter().flatten() {
        lines.push((
            copy.created_us,
            format!(
                "  stored at offset {}: {} written {} payload {}",
                copy.offset, copy.message_id, copy.created_us, copy.payload
            ),
        ));
    }
    lines.sort_by_key(|(at, _)| *at);
    for (_, line) in lines {
        let _ = writeln!(out, "{line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_ranges_cover_the_uncertain_interval() {
        let windows = Windows {
            initial: 3600,
            changes: vec![
                WindowChange { seconds: 2, sent_us: 100, acked_us: 200 },
                WindowChange { seconds: 3600, sent_us: 1_000, acked_us: 1_100 },
            ],
        };
        assert_eq!(windows.range_us(0, 50), (3_600_000_000, 3_600_000_000));
        assert_eq!(windows.range_us(0, 150), (2_000_000, 3_600_000_000));
        assert_eq!(windows.range_us(300, 400), (2_000_000, 2_000_000));
        assert_eq!(windows.range_us(300, 1_050), (2_000_000, 3_600_000_000));
        assert_eq!(windows.range_us(1_200, 1_300), (3_600_000_000, 3_600_000_000));
    }

    fn request(producer: usize, seq: u64, txn: &str, sent_us: i64, answer: Option<(Status, Uuid, i64)>) -> Request {
        let outcome = match answer {
            Some((status, message_id, offset)) => Outcome::Answered(vec![ItemAnswer { status, message_id, offset }]),
            None => Outcome::Timeout,
        };
        Request {
            producer,
            seq,
            items: vec![Item { txn: txn.to_owned(), partition: "part-0".to_owned(), kind: Kind::New }],
            attempts: vec![Attempt { gateway: 0, incarnation: 0, sent_us, done_us: sent_us + 1_000, outcome }],
        }
    }

    fn copy(offset: i64, message_id: Uuid, txn: &str, created_us: i64, writer: (usize, u64, u32)) -> Copy {
        Copy { offset, message_id, txn: txn.to_owned(), created_us, writer: Some(writer), payload: Value::Null }
    }

    fn checked(requests: &[Request], copies: Vec<Copy>, windows: &Windows) -> Report {
        let mut stored = Stored::default();
        stored.partitions.insert("part-0".to_owned(), copies);
        let mut report = Report::default();
        check(requests, &stored, windows, &mut report);
        report
    }

    fn kinds(report: &Report) -> Vec<&'static str> {
        report.violations_by_kind().into_keys().collect()
    }

    const S: i64 = 1_000_000;

    #[test]
    fn a_clean_history_passes_and_a_restore_after_a_short_window_is_legal() {
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let long = Windows { initial: 3600, changes: Vec::new() };
        let requests = [
            request(0, 0, "x", 10 * S, Some((Status::Queued, a, 0))),
            request(0, 1, "x", 20 * S, Some((Status::Duplicate, a, 0))),
        ];
        let report = checked(&requests, vec![copy(0, a, "x", 10 * S + 500, (0, 0, 0))], &long);
        assert!(report.violations.is_empty(), "{report}");
        // Stored again 10 s later while the window was 2 s: legal.
        let short = Windows { initial: 3600, changes: vec![WindowChange { seconds: 2, sent_us: 5 * S, acked_us: 5 * S + 10 }] };
        let requests =
            [request(0, 0, "x", 10 * S, Some((Status::Queued, a, 0))), request(0, 1, "x", 20 * S, Some((Status::Queued, b, 1)))];
        let copies = vec![copy(0, a, "x", 10 * S + 500, (0, 0, 0)), copy(1, b, "x", 20 * S + 500, (0, 1, 0))];
        let report = checked(&requests, copies, &short);
        assert!(report.violations.is_empty(), "{report}");
        assert_eq!(report.legal_restores, 1);
    }

    #[test]
    fn a_second_copy_inside_the_window_is_caught_with_its_history() {
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let long = Windows { initial: 3600, changes: Vec::new() };
        let requests =
            [request(0, 0, "x", 10 * S, Some((Status::Queued, a, 0))), request(1, 7, "x", 20 * S, Some((Status::Queued, b, 1)))];
        let copies = vec![copy(0, a, "x", 10 * S + 500, (0, 0, 0)), copy(1, b, "x", 20 * S + 500, (1, 7, 0))];
        let report = checked(&requests, copies, &long);
        assert_eq!(kinds(&report), ["queued-twice", "stored-twice-in-window"], "{report}");
        assert!(report.histories.contains("history of part-0/x"), "{report}");
        assert!(report.histories.contains("attempt p1 #7 try 0"), "{report}");
        // The window was lengthened back before the second push: still caught,
        // though the first copy was written under the short window.
        let changes = vec![
            WindowChange { seconds: 2, sent_us: 5 * S, acked_us: 5 * S + 10 },
            WindowChange { seconds: 3600, sent_us: 15 * S, acked_us: 15 * S + 10 },
        ];
        let copies = vec![copy(0, a, "x", 10 * S + 500, (0, 0, 0)), copy(1, b, "x", 20 * S + 500, (1, 7, 0))];
        let report = checked(&requests, copies, &Windows { initial: 3600, changes });
        assert!(kinds(&report).contains(&"stored-twice-in-window"), "{report}");
    }

    #[test]
    fn wrong_answers_are_caught() {
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        let long = Windows { initial: 3600, changes: Vec::new() };
        // A queued answer whose offset holds another message.
        let requests = [request(0, 0, "x", 10 * S, Some((Status::Queued, b, 0)))];
        let report = checked(&requests, vec![copy(0, a, "x", 10 * S + 500, (0, 0, 0))], &long);
        assert!(kinds(&report).contains(&"answer-not-stored"), "{report}");
        assert!(kinds(&report).contains(&"stored-not-answered-queued"), "{report}");
        // A duplicate that names a later copy while an earlier one is in the window.
        let short = Windows {
            initial: 3600,
            changes: vec![
                WindowChange { seconds: 2, sent_us: 5 * S, acked_us: 5 * S + 10 },
                WindowChange { seconds: 3600, sent_us: 25 * S, acked_us: 25 * S + 10 },
            ],
        };
        let requests = [
            request(0, 0, "x", 10 * S, Some((Status::Queued, a, 0))),
            request(0, 1, "x", 20 * S, Some((Status::Queued, b, 1))),
            request(0, 2, "x", 30 * S, Some((Status::Duplicate, b, 1))),
        ];
        let copies = vec![copy(0, a, "x", 10 * S + 500, (0, 0, 0)), copy(1, b, "x", 20 * S + 500, (0, 1, 0))];
        let report = checked(&requests, copies, &short);
        assert_eq!(kinds(&report), ["duplicate-wrong-original"], "{report}");
        // A write by an attempt that never carried the id.
        let requests = [request(0, 0, "y", 10 * S, None)];
        let report = checked(&requests, vec![copy(0, a, "x", 10 * S + 500, (0, 0, 0))], &long);
        assert_eq!(kinds(&report), ["unknown-write"], "{report}");
    }

    #[test]
    fn sums_series() {
        let text = "# HELP x\nstile_cache_evictions{shard=\"0\"} 3\nstile_cache_evictions{shard=\"1\"} 4\nstile_segments_total{probe=\"full\"} 9\n";
        assert_eq!(sum_series(text, "stile_cache_evictions"), 7);
        assert_eq!(sum_series(text, "stile_segments_total{probe=\"full\"}"), 9);
        assert_eq!(sum_series(text, "stile_cache_suppressed_partitions"), 0);
    }
}
