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
//! window shortened and lengthened again by `/api/v1/configure`; a failover:
//! the gateways run on a primary and a synchronous standby of the checker's
//! own (given both, libpq's multi-host form with
//! `target_session_attrs=read-write`), the primary is stopped immediately
//! and the standby promoted, and the truth is read from the promoted server
//! alone, so that what the old primary acknowledged must be there. Per gateway:
//! guest traps (`--inject-guest-traps-per-million`), a tiny cache budget
//! (`--cache-mb 1`, so partitions are suppressed and evicted), a wall clock
//! ahead of or behind PostgreSQL's by more than the window that jumps mid-run
//! (libfaketime, [`ClockSkew`]). An overload: for a spell, a flood of
//! connections of the checker's own pushes large batches to every gateway as
//! fast as answers come, against a small `--max-held-mb`, so that the
//! gateways shed the flood and the producers alike (`overload`). A gateway
//! that exits without being killed is reported and restarted.
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
//! - no id answered `queued` twice (two message ids) inside the window;
//! - nothing of a push the gateway shed (503 for want of room, its body
//!   unread) is stored.
//!
//! On a violation the report prints the history of that id: every attempt
//! that carried it (gateway, incarnation, times, answer) and its stored
//! copies.
//!
//! # Where each part lives
//!
//! This file: the configuration, the records of the workload, the report and
//! the run. `nodes` starts and kills gateway processes; `workload` is the
//! producers; `faults` the schedule and the faults; `replicated` the primary
//! and standby the failover acts on; `overload` the flood; `scrape` reads each
//! gateway's `/metrics` during the run (`vitals` summarises them); `truth`
//! reads what PostgreSQL stored; `checks` holds every answer against it. The
//! clock fault itself is `crate::clock`.

use std::collections::{BTreeMap, HashMap};
use std::fmt::{self, Write as _};
use std::process::Command;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, anyhow, bail};
use uuid::Uuid;

mod checks;
mod db_faults;
mod faults;
mod nodes;
mod overload;
mod replicated;
mod scrape;
mod steps;
mod truth;
mod vitals;
mod workload;

pub use crate::clock::ClockSkew;
use checks::check;
pub use db_faults::{
    CommittedFlow, DbFaultReport, LatencyFault, LockFlow, LossFault, PROBE_PATIENCE, ProbeCount, ProbeFlow, Spell,
};
use db_faults::{DbRig, InForce};
use faults::{Admin, FaultLog, PgTargets, failover_report, run_faults, schedule};
use nodes::{AddressBook, Node};
pub use overload::{OverloadFault, OverloadReport};
use replicated::{FailoverTimes, ReplicatedPair};
use scrape::{Scrape, scrape_all, scrape_loop, summarise_scrapes};
pub use steps::StepsReport;
use steps::{check_steps, produce_steps, wait_for_due_timers};
use truth::read_stored;
pub use vitals::{Latency, Sample};
use workload::{probe, produce, storm};

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
    /// The database every gateway fronts (keyword/value or URI). Unused with
    /// a failover fault, which runs the gateways on servers of its own.
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
    /// Producers of transactions and timers (see `checker/steps.rs`), beside
    /// the push producers.
    pub steps_producers: usize,
    /// Single-item pushes a second, sent open-loop round robin over every
    /// partition (see `workload::probe`); 0 for none.
    pub probe_rate: f64,
    /// Producers of a retry storm: new ids for a third of the run, then
    /// replays of them as fast as they are answered (see `workload::storm`).
    pub storm_producers: usize,
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
            steps_producers: 1,
            probe_rate: 0.0,
            storm_producers: 0,
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

    /// A gateway with a cache budget of `mb` MiB over `shards` shards. Each
    /// shard keeps up to its bundles in flight and three more connections to
    /// PostgreSQL of its own: a few shards keep a run of three gateways within
    /// PostgreSQL's default `max_connections` (100).
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
    /// Run the gateways on a primary and a synchronous standby the checker
    /// makes itself, instead of on `database_url`, and at this offset stop
    /// the primary immediately and promote the standby. PostgreSQL restarts
    /// cannot be asked for with it: they restart the shared cluster.
    pub failover_at: Option<Duration>,
    /// Between the gateways and PostgreSQL, through a fault proxy of the
    /// checker's own (`crate::proxy`): every chunk delayed, with jitter.
    pub latency: Option<LatencyFault>,
    /// Through the proxy: a share of the chunks lost and retransmitted.
    pub packet_loss: Option<LossFault>,
    /// Through the proxy: nothing forwarded, connections kept open.
    pub network_partition: Option<Spell>,
    /// Through the proxy: every open connection reset right after its next
    /// request reached PostgreSQL (mid-bundle), at these offsets.
    pub resets_at: Vec<Duration>,
    /// Another client holds every free connection of PostgreSQL, after
    /// terminating the gateways' own. Runs the gateways on a server of the
    /// checker's own.
    pub connections_taken: Option<Spell>,
    /// Another transaction holds the row lock of the partition written most
    /// in the last two seconds.
    pub row_lock: Option<Spell>,
    /// Another transaction holds `stile.segments` in SHARE mode (as a
    /// `CREATE INDEX` does): every push waits.
    pub table_lock: Option<Spell>,
    /// PostgreSQL's filesystem (data and WAL) full: the gateways run on a
    /// server of the checker's own on a tmpfs (which takes root), filled with
    /// ballast for the spell.
    pub disk_full: Option<Spell>,
    /// A flood of large pushes against every gateway, which then run with a
    /// small `--max-held-mb` for the whole run (see `checker/overload.rs`).
    pub overload: Option<OverloadFault>,
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
        let config = stile::db::DbConfig::parse(database_url).map_err(|e| anyhow!("{e}"))?;
        let port = config.pg.get_ports().first().copied().unwrap_or(5432);
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
    /// What the failover did, when there was one.
    pub failover: Option<FailoverReport>,
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
    /// What the transactions and timers did, when they ran.
    pub steps: Option<StepsReport>,
    /// How the gateways fared through each fault between them and
    /// PostgreSQL (or in it), in the order they happened.
    pub db_faults: Vec<DbFaultReport>,
    /// What the fault proxy relayed, when there was one.
    pub proxy: Option<crate::proxy::ProxyStats>,
    /// What the overload spell did, when there was one.
    pub overload: Option<OverloadReport>,
}

/// What the failover fault did, and how the gateways answered around it.
#[derive(Clone, Debug, Default)]
pub struct FailoverReport {
    /// The primary's address, and the standby's (the primary after it).
    pub primary: String,
    pub standby: String,
    /// The standby's `sync_state` in the primary's `pg_stat_replication`
    /// right before the stop: `sync` when the primary's commits waited for
    /// it.
    pub sync_state: String,
    /// How the primary's process ended.
    pub primary_exit: String,
    /// When the primary was stopped and when the standby accepted writes,
    /// from the start of the push phase.
    pub stopped_at: Duration,
    pub promoted_at: Duration,
    /// From the stop to the first answer to a push sent after it.
    pub served_again_after: Option<Duration>,
    /// Attempts sent after the stop that were answered 503, or failed
    /// otherwise (other statuses, timeouts, connection errors); the run's
    /// other faults add theirs.
    pub failed_after_503s: u64,
    pub failed_after_other: u64,
    /// Items answered `queued` before the stop: acknowledged by the old
    /// primary, so the checks find each on the promoted standby.
    pub queued_before: u64,
    /// Items answered to attempts sent after the stop, which only the
    /// promoted standby could serve, and those of them answered `queued`.
    pub answered_after: u64,
    pub queued_after: u64,
    /// The server the truth was read from, and whether it was still in
    /// recovery then (false once promoted).
    pub truth_from: String,
    pub truth_in_recovery: bool,
}

impl fmt::Display for FailoverReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let served_again = self.served_again_after.map_or_else(|| "never".to_owned(), |d| format!("{:.1} s", d.as_secs_f64()));
        write!(
            f,
            "failover: primary {} stopped immediately at {:.1} s (its standby was {}; {}), standby {} promoted {:.1} s later; \
             pushes served again {served_again} after the stop; attempts sent after it: {} answered 503, {} failed otherwise; \
             {} items answered queued before the stop, {} answered after it ({} queued); the truth read from {} (in recovery: {})",
            self.primary,
            self.stopped_at.as_secs_f64(),
            self.sync_state,
            self.primary_exit,
            self.standby,
            self.promoted_at.saturating_sub(self.stopped_at).as_secs_f64(),
            self.failed_after_503s,
            self.failed_after_other,
            self.queued_before,
            self.answered_after,
            self.queued_after,
            self.truth_from,
            self.truth_in_recovery
        )
    }
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
            "faults: {} gateway kills (kill -9), {} restarts, {} postgres restarts, {} failovers, {} guest traps, {} clock jumps \
             (offsets up to {:.0} s measured), window changes [{}]",
            self.kills,
            self.restarts,
            self.pg_restarts,
            u64::from(self.failover.is_some()),
            self.guest_traps,
            self.clock_jumps,
            self.max_clock_offset_s,
            self.window_changes.join(", ")
        )?;
        if let Some(failover) = &self.failover {
            writeln!(f, "{failover}")?;
        }
        for fault in &self.db_faults {
            writeln!(f, "fault: {fault}")?;
        }
        if let Some(overload) = &self.overload {
            writeln!(f, "{overload}")?;
        }
        if let Some(proxy) = &self.proxy {
            writeln!(
                f,
                "proxy: {} connections, {:.1} MiB to PostgreSQL, {:.1} MiB back, {} chunks lost, {} connections reset",
                proxy.connections,
                proxy.bytes_up as f64 / 1048576.0,
                proxy.bytes_down as f64 / 1048576.0,
                proxy.chunks_lost,
                proxy.resets
            )?;
        }
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
        if let Some(steps) = &self.steps {
            writeln!(f, "{steps}")?;
        }
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
            "seed {:#x}, {} s, {} producers at {} req/s, {} partitions (hot groups of {} moving every {:?}), batches 1..={}, {}% repeats, {}% shared ids, {} probes/s, {} storm producers, gateways [{}]",
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
            config.probe_rate,
            config.storm_producers,
            config.gateways.iter().map(|g| format!("{} {}", g.label, g.args.join(" "))).collect::<Vec<_>>().join("; ")
        ),
        ..Report::default()
    };

    // The database: the one given, or a replicated pair of the checker's own
    // for a failover. Declared before the gateways, so that it outlives them.
    let pg_restarts = config.faults.pg_restart_every.is_some() || !config.faults.pg_restart_at.is_empty();
    let pair = match config.faults.failover_at {
        Some(_) if pg_restarts => {
            bail!("a failover runs the gateways on servers of its own, which PostgreSQL restarts do not reach")
        }
        Some(_) => Some(Arc::new(ReplicatedPair::start().await.context("start a primary and its synchronous standby")?)),
        None => None,
    };
    if pair.is_some() && (config.faults.needs_proxy() || config.faults.own_server().is_some()) {
        bail!("the faults between the gateways and PostgreSQL do not combine with a failover")
    }
    if pg_restarts && config.faults.own_server().is_some() {
        bail!("the connection and disk faults run the gateways on a server of their own, which PostgreSQL restarts do not reach")
    }
    // The server of the run's own and the fault proxy, when the faults need
    // them; declared before the gateways, so that they outlive them.
    let rig = DbRig::start(config, config.database_url.clone()).await?;
    let database_url = match &pair {
        Some(pair) => pair.url(),
        None => rig.gateway_url()?,
    };
    let described = rig.describe();
    if !described.is_empty() {
        let _ = write!(report.summary, ", {described}");
    }
    if let Some(overload) = &config.faults.overload {
        let _ = write!(report.summary, ", {}", overload.describe());
    }
    if let Some(pair) = &pair {
        let _ = write!(
            report.summary,
            ", on a primary {} with a synchronous standby {}",
            pair.primary.address(),
            pair.standby.address()
        );
    }

    // Gateways.
    let mut nodes: Vec<Node> =
        config.gateways.iter().map(|spec| Node::new(with_intake_budget(spec, &config.faults), &database_url)).collect();
    let book: AddressBook = Arc::new(RwLock::new(vec![None; nodes.len()]));
    for (index, node) in nodes.iter_mut().enumerate() {
        let addr = node.start().await?;
        book.write().expect("not poisoned")[index] = Some((addr, 0));
    }

    // The long window, certain before the first push.
    let mut admin = Admin { book: book.clone() };
    admin.configure(&config.queue, config.long_window_seconds).await.context("set the long window")?;
    let windows = Arc::new(Mutex::new(Windows { initial: config.long_window_seconds, changes: Vec::new() }));

    let pg = PgTargets {
        cluster: match (&config.faults.pg_cluster, pg_restarts) {
            (Some(cluster), _) => Some(cluster.clone()),
            (None, true) => Some(PgCluster::for_url(&config.database_url)?),
            (None, false) => None,
        },
        pair: pair.clone(),
        db: &rig,
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
    for storm_producer in 0..config.storm_producers {
        let config = config.clone();
        let book = book.clone();
        producers.push(tokio::spawn(async move { storm(storm_producer, &config, &book, t0, end).await }));
    }
    let prober = (config.probe_rate > 0.0).then(|| {
        let config = config.clone();
        let book = book.clone();
        tokio::spawn(async move { probe(&config, &book, end).await })
    });
    let mut steps_producers = Vec::new();
    for producer in 0..config.steps_producers {
        let config = config.clone();
        let book = book.clone();
        steps_producers.push(tokio::spawn(async move { produce_steps(producer, &config, &book, end).await }));
    }
    let scraped: Arc<Mutex<HashMap<(usize, u32), Scrape>>> = Arc::default();
    let stop_scraping = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let scraper = tokio::spawn(scrape_loop(book.clone(), scraped.clone(), stop_scraping.clone(), t0));
    let schedule = schedule(config);
    let mut faults = FaultLog::default();
    run_faults(&schedule, &mut nodes, &book, &mut admin, &windows, &pg, config, t0, end, &mut faults).await;
    drop(pg);

    let mut requests: Vec<Request> = Vec::new();
    for task in producers {
        requests.extend(task.await.context("a producer panicked")?);
    }
    if let Some(prober) = prober {
        requests.extend(prober.await.context("the prober panicked")?);
    }
    let mut steps = Vec::new();
    for task in steps_producers {
        steps.extend(task.await.context("a steps producer panicked")?);
    }
    if let Some(flood) = faults.flood.take() {
        let times = (flood.started_us, flood.ended_us.unwrap_or_else(now_us));
        let tally = flood.finish().await;
        let described = config.faults.overload.as_ref().map(OverloadFault::describe).unwrap_or_default();
        report.overload = Some(OverloadReport::of(described, tally, times, &requests, t0));
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
    report.proxy = rig.proxy.as_ref().map(|proxy| proxy.stats());
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
    if config.steps_producers > 0 {
        // The gateways' firers deliver what is due before they go.
        let url = pair.as_ref().map_or_else(|| rig.direct_url.clone(), |pair| pair.current_primary_url());
        wait_for_due_timers(&url, config).await?;
    }
    for node in &mut nodes {
        node.kill();
    }

    // The truth: after a failover, from the promoted standby alone.
    let truth_url = pair.as_ref().map_or_else(|| rig.direct_url.clone(), |pair| pair.current_primary_url());
    if let (Some(pair), Some(times)) = (&pair, &faults.failover) {
        let mut failover = failover_report(times, &requests, t0);
        failover.primary = pair.primary.address();
        failover.standby = pair.standby.address();
        failover.truth_from = pair.current_primary().address();
        failover.truth_in_recovery = pair.current_primary_in_recovery().await.context("ask the promoted standby")?;
        report.failover = Some(failover);
    }
    if config.steps_producers > 0 {
        check_steps(&truth_url, config, &steps, &mut report).await?;
    }
    let stored = read_stored(&truth_url, &config.queue).await?;
    report.db_faults = db_faults::reports(&faults.spells, &requests, &stored, config, t0);
    check(&requests, &stored, &windows, &mut report);
    if !report.violations.is_empty() && report.violations.iter().any(|v| v.kind == "storage") {
        let _ = writeln!(report.histories, "gateway logs (tails):\n{}", gateway_tails.join("\n"));
    }
    report.elapsed = started.elapsed();
    Ok(report)
}

/// A gateway's spec with the overload fault's `--max-held-mb`, unless it
/// names its own.
fn with_intake_budget(spec: &GatewaySpec, faults: &Faults) -> GatewaySpec {
    match &faults.overload {
        Some(overload) if !spec.args.iter().any(|arg| arg == "--max-held-mb") => {
            spec.clone().flag("max-held-mb", overload.max_held_mb)
        }
        _ => spec.clone(),
    }
}

/// Microseconds since the epoch of an `Instant`, by the wall clock now.
fn micros_of(instant: Instant) -> i64 {
    now_us() - i64::try_from(instant.elapsed().as_micros()).unwrap_or(0)
}
