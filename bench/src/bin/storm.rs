//! Retry storm: what a duplicate costs the gateway and PostgreSQL against a
//! new message, with the replayed ids recent (each connection re-sending its
//! own requests in the order sent), random within the window, and mixed into
//! new traffic; one or several builds of the gateway, taking turns.
//!
//! ```text
//! cargo build --release -p stile -p stile-bench --bin stile --bin storm
//! target/release/storm [--shapes 1x32,1x256,100x32] [--mixed 128+128|none] [--partitions 64] \
//!     [--warmup 1] [--secs 5] [--rounds 2] [--sync on|off] [--bins A,B] [--retry-percent 0] \
//!     [--client-threads 1] [--pg-set NAME=VALUE ...]
//! ```
//!
//! Every build (`--bins`, default the `stile` beside this program or
//! `$STILE_BIN`) has a fresh database of its own, `stile_t_<random>` on the
//! server `STILE_TEST_DATABASE_URL` names, with the chosen
//! `synchronous_commit`, dropped at the end (also on Ctrl-C or SIGTERM): the
//! gateway creates its schema and functions at start, and two builds on one
//! database would run whichever functions were applied last.
//!
//! For every round, shape (items per request × connections) and build, in
//! an order that moves by one build per shape and per round so that no build
//! always goes first, a fresh gateway process with its default flags serves
//! a queue of its own (`--partitions` partitions) through four phases of
//! `--warmup` + `--secs` seconds each:
//!
//! * `new`: every connection pushes fresh ids to a random partition per
//!   request and remembers every request it sent and the answer's offset
//!   and messageId of each item;
//! * `replay-recent`: every connection re-sends its own requests of `new`,
//!   byte for byte, in the order sent (from the first again when it has
//!   sent them all);
//! * `replay-random`: requests of the shape's size made of ids drawn at
//!   random from everything `new` stored, each request's ids from one
//!   partition (that of a stored request drawn at random), each item as
//!   first sent;
//! * `new-again`: fresh ids again.
//!
//! Then, at 1 item per request, the mixed load: `--mixed M+N` connections,
//! M re-sending, in the order sent, the requests `new-again` stored (cycling
//! through them) beside N pushing fresh ids, on the gateway of the
//! 1 × (M+N) shape once its phases are done, compared with that shape's
//! `new` (if the shape is not measured, a gateway of its own measures `new`
//! at M+N connections first).
//!
//! Every answer is checked, the warm-ups' too: a fresh id must answer
//! `queued`, a replayed one `duplicate` with the offset and messageId its
//! first answer gave. A wrong answer is printed as it comes and at the end,
//! and makes the program exit 1. Rates count the items answered inside the
//! measured seconds, latency is per request (send to last byte), and CPU per
//! 1,000 messages is what the gateway process, every PostgreSQL process
//! (those that exited included) and the gateway's own backends (by their
//! `application_name`) used over the same seconds, per item answered in
//! them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{CommandFactory as _, Parser};
use hyper::Method;
use rand::rngs::SmallRng;
use rand::{Rng as _, SeedableRng as _};
use serde::Deserialize;
use stile_bench::{
    Switch, build, count, load_average, machine, median, percentile_ms, pg_setting, run_to_end, seconds, server_version, today,
    write_push_body, write_pushed_items,
};
use stile_tests::cpu::{cpu_seconds, postgres_cpu_seconds};
use stile_tests::gateway::{Client, Process, fresh_database, listening_addr, stile_binary};
use stile_tests::pg::{TestDb, backend_pids};

/// A retry storm against new traffic: replayed ids (recent, random, mixed
/// into new ones) against fresh ones, per build of the gateway.
#[derive(Debug, Parser)]
#[command(
    name = "storm",
    about = "What a duplicate costs against a new message: replays of stored ids (recent, random, mixed into new traffic) \
             against fresh ids, rate and CPU of the gateway and PostgreSQL, builds alternated",
    after_help = "Environment: STILE_TEST_DATABASE_URL names the PostgreSQL server the run creates its databases on \
                  (default: libpq's defaults and the PG* variables); STILE_BIN the stile binary when --bins is not given \
                  (default: the one beside this program). Ctrl-C or SIGTERM stops a run, stops its gateway, drops its \
                  databases and exits 130. A wrong answer makes it exit 1."
)]
struct Args {
    /// Shapes, comma-separated, each ITEMSxCONNECTIONS: items per request × connections pushing at once.
    #[arg(long, value_delimiter = ',', default_value = "1x32,1x256,100x32", value_parser = shape)]
    shapes: Vec<Shape>,
    /// The mixed load at 1 item per request, REPLAYING+NEW connections side by side, or `none`.
    #[arg(long, default_value = "128+128", value_parser = mixed)]
    mixed: Mixed,
    /// Partitions of every queue; each fresh request goes to one of them at random.
    #[arg(long, default_value = "64", value_parser = count::<usize>)]
    partitions: usize,
    /// Seconds each phase pushes before its figures count.
    #[arg(long, default_value = "1", value_parser = seconds)]
    warmup: f64,
    /// Seconds each phase counts.
    #[arg(long, default_value = "5", value_parser = seconds)]
    secs: f64,
    /// Rounds (at least 1): in each, every shape is measured once per build.
    #[arg(long, default_value = "2", value_parser = count::<usize>)]
    rounds: usize,
    /// `synchronous_commit` of the benchmark databases: on, PostgreSQL's default and the durability users run.
    #[arg(long, value_enum, default_value = "on")]
    sync: Switch,
    /// Paths of the stile binaries to alternate, comma-separated, called A, B, … in this order
    /// (default: $STILE_BIN, or the stile beside this program).
    #[arg(long, value_delimiter = ',')]
    bins: Vec<PathBuf>,
    /// Percent of the requests of the phases pushing fresh ids that re-send an earlier request of the same
    /// connection instead (byte for byte; every item must answer `duplicate` with its first answer).
    #[arg(long, default_value = "0", value_parser = count::<u32>)]
    retry_percent: u32,
    /// Worker threads of the generator's tokio runtime.
    #[arg(long, default_value = "1", value_parser = count::<usize>)]
    client_threads: usize,
    /// A further setting of the benchmark databases (`ALTER DATABASE ... SET NAME = 'VALUE'`); repeatable.
    #[arg(long = "pg-set", value_name = "NAME=VALUE", value_parser = pg_setting)]
    pg_settings: Vec<(String, String)>,
    /// A round trip between each gateway and PostgreSQL, in milliseconds, added by a userspace proxy
    /// (`stile_tests::proxy`, half of it each way) on a thread of its own: a far database.
    #[arg(long, default_value = "0", value_parser = seconds)]
    db_rtt_ms: f64,
}

/// Items per request and connections pushing at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Shape {
    items: usize,
    conns: usize,
}

impl Shape {
    fn name(self) -> String {
        format!("{}x{}", self.items, self.conns)
    }
}

/// Parses `100x32`: 100 items per request, 32 connections.
fn shape(text: &str) -> Result<Shape, String> {
    let (items, conns) = text.split_once(['x', 'X']).ok_or_else(|| format!("not ITEMSxCONNECTIONS: {text:?}"))?;
    let shape = Shape { items: count(items)?, conns: count(conns)? };
    if shape.items == 0 || shape.conns == 0 {
        return Err(format!("nothing to push in {text:?}"));
    }
    Ok(shape)
}

/// The mixed load: connections replaying and connections pushing fresh ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mixed {
    None,
    Load { replaying: usize, new: usize },
}

/// Parses `128+128`, or `none`.
fn mixed(text: &str) -> Result<Mixed, String> {
    if text.trim().eq_ignore_ascii_case("none") {
        return Ok(Mixed::None);
    }
    let (replaying, new) = text.split_once('+').ok_or_else(|| format!("not REPLAYING+NEW or none: {text:?}"))?;
    let (replaying, new) = (count(replaying)?, count(new)?);
    if replaying == 0 || new == 0 {
        return Err(format!("both sides of the mixed load need connections: {text:?}"));
    }
    Ok(Mixed::Load { replaying, new })
}

/// Wrong answers seen so far, the warm-ups' included: any makes the run exit 1.
static WRONG_ANSWERS: AtomicU64 = AtomicU64::new(0);

fn main() {
    let mut args = Args::parse();
    if args.shapes.is_empty() || args.partitions == 0 || args.secs == 0.0 {
        Args::command()
            .error(clap::error::ErrorKind::ValueValidation, "nothing to run: --shapes, --partitions and --secs must be set")
            .exit();
    }
    args.rounds = args.rounds.max(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.client_threads.max(1))
        .enable_all()
        .build()
        .expect("a tokio runtime");
    run_to_end("storm", "its gateway is stopped and its databases dropped", runtime, run(args));
    let wrong = WRONG_ANSWERS.load(Ordering::Relaxed);
    if wrong > 0 {
        eprintln!();
        eprintln!("storm: !!! {wrong} WRONG ANSWERS: a fresh id answered duplicate, or a replayed one queued or with another");
        eprintln!("storm: !!! offset or messageId than its first answer, or answers missing; see the WRONG ANSWER lines above");
        std::process::exit(1);
    }
}

/// The phases every shape goes through on one gateway, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    New,
    ReplayRecent,
    ReplayRandom,
    NewAgain,
}

const PHASES: [Phase; 4] = [Phase::New, Phase::ReplayRecent, Phase::ReplayRandom, Phase::NewAgain];

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::New => "new",
            Phase::ReplayRecent => "replay-recent",
            Phase::ReplayRandom => "replay-random",
            Phase::NewAgain => "new-again",
        }
    }

    fn replays(self) -> bool {
        matches!(self, Phase::ReplayRecent | Phase::ReplayRandom)
    }
}

/// One build of the gateway under test, with a database of its own.
struct Build {
    label: String,
    path: PathBuf,
    /// Flags its gateways are started with, beyond the defaults.
    flags: Vec<String>,
    db: TestDb,
    pg: tokio_postgres::Client,
    /// The proxy between its gateways and PostgreSQL, when the database is far.
    far: Option<FarDatabase>,
}

/// A delay proxy in front of PostgreSQL, on a runtime of its own so that the
/// load's generator does not delay what it relays.
struct FarDatabase {
    proxy: stile_tests::proxy::FaultProxy,
    runtime: Option<tokio::runtime::Runtime>,
}

impl FarDatabase {
    async fn start(db: &TestDb, rtt: Duration) -> FarDatabase {
        let upstream = stile_tests::proxy::Upstream::of_postgres(&db.config().pg).await.expect("PostgreSQL's address");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("far-database")
            .enable_all()
            .build()
            .expect("the proxy's runtime");
        let proxy = runtime
            .spawn(stile_tests::proxy::FaultProxy::start(upstream))
            .await
            .expect("the proxy starts")
            .expect("the proxy listens");
        proxy.update(|toxics| toxics.latency = rtt / 2);
        FarDatabase { proxy, runtime: Some(runtime) }
    }
}

impl Drop for FarDatabase {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// A `--bins` entry: `PATH`, or `PATH@FLAGS` with the gateway's flags after
/// the `@`, separated by spaces (`target/release/stile@--bundles-in-flight 4`).
fn bin_and_flags(entry: &std::path::Path) -> (PathBuf, Vec<String>) {
    let text = entry.to_string_lossy();
    match text.split_once('@') {
        Some((path, flags)) => (PathBuf::from(path), flags.split_whitespace().map(str::to_owned).collect()),
        None => (entry.to_path_buf(), Vec::new()),
    }
}

/// A fresh database with the run's settings.
async fn database(args: &Args) -> TestDb {
    let t = fresh_database().await;
    let c = t.client().await;
    c.batch_execute(&format!("ALTER DATABASE \"{}\" SET synchronous_commit = {}", t.name(), args.sync.name()))
        .await
        .expect("set synchronous_commit");
    for (name, value) in &args.pg_settings {
        let value = value.replace('\'', "''");
        c.batch_execute(&format!("ALTER DATABASE \"{}\" SET {name} = '{value}'", t.name()))
            .await
            .unwrap_or_else(|e| panic!("set {name}: {e}"));
    }
    t
}

/// A gateway process of one build, with its default flags, whose database
/// connections carry an `application_name` of their own.
struct Gateway {
    process: Process,
    addr: SocketAddr,
    application_name: String,
}

impl Gateway {
    async fn start(build: &Build, queue: &str) -> Gateway {
        let application_name = format!("stile-{queue}");
        let mut named = build.db.config().clone();
        named.pg.application_name(&application_name);
        let url = match &build.far {
            None => named.to_url(true),
            Some(far) => stile_tests::proxy::proxied(&named, far.proxy.addr()).to_url(true),
        };
        let mut command = Command::new(&build.path);
        command.args(["serve", "--listen", "127.0.0.1:0", "--database-url", &url]);
        command.args(&build.flags);
        // Its defaults: none of the STILE_* variables that stand for its flags.
        for (name, _) in std::env::vars_os() {
            if name.to_str().is_some_and(|name| name.starts_with("STILE_") || name == "DATABASE_URL") {
                command.env_remove(name);
            }
        }
        command.env("NO_COLOR", "1").env("RUST_LOG", std::env::var("STILE_TEST_LOG").unwrap_or_else(|_| "info".into()));
        let (process, addr) = Process::start_until(command, listening_addr).await;
        Gateway { process, addr, application_name }
    }

    fn pid(&self) -> i32 {
        i32::try_from(self.process.pid()).expect("a pid fits i32")
    }

    /// Its last lines of warnings and errors, for a phase that had answers other than 201.
    fn complaints(&self) -> String {
        let logs = self.process.logs();
        let lines: Vec<&str> = logs.lines().filter(|line| line.contains("WARN") || line.contains("ERROR")).collect();
        lines[lines.len().saturating_sub(5)..].join("\n    ")
    }
}

/// What one item was first answered: its offset and messageId.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stored {
    offset: i64,
    message_id: u128,
}

/// A fresh request a connection sent and had answered 201.
#[derive(Debug)]
struct Sent {
    body: Bytes,
    partition: u32,
    seq: u64,
    /// Its items' answers in the connection's [`Log::answers`], from here on.
    first: usize,
    items: usize,
}

/// Every fresh request one connection had answered, in the order sent.
#[derive(Debug, Default)]
struct Log {
    /// Its transactionIds are `{tag}-{seq}-{i}`.
    tag: String,
    sent: Vec<Sent>,
    answers: Vec<Stored>,
}

impl Log {
    fn answers_of(&self, sent: &Sent) -> &[Stored] {
        &self.answers[sent.first..sent.first + sent.items]
    }
}

/// One stored item: item `item` of request `request` of connection `conn`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ItemRef {
    conn: u32,
    request: u32,
    item: u32,
}

/// Everything a phase stored, to draw from at random: its requests, and
/// its items by partition.
#[derive(Debug)]
struct Drawn {
    requests: Vec<(u32, u32)>,
    by_partition: Vec<Vec<ItemRef>>,
}

impl Drawn {
    fn of(logs: &[Log], partitions: usize) -> Drawn {
        let mut requests = Vec::new();
        let mut by_partition = vec![Vec::new(); partitions];
        for (c, log) in logs.iter().enumerate() {
            for (r, sent) in log.sent.iter().enumerate() {
                let (conn, request) = (c as u32, r as u32);
                requests.push((conn, request));
                by_partition[sent.partition as usize].extend((0..sent.items as u32).map(|item| ItemRef { conn, request, item }));
            }
        }
        Drawn { requests, by_partition }
    }
}

/// What one connection pushes.
#[derive(Debug)]
enum Work {
    /// Fresh ids `{tag}-{seq}-{i}` (and, `retry_percent` of the time, one of
    /// its earlier requests again), each request answered kept in a log.
    New { tag: String, retry_percent: u32 },
    /// Requests of `logs`, byte for byte, in this order (connection,
    /// request), from the first again once all are sent.
    Replay { logs: Arc<Vec<Log>>, order: Vec<(u32, u32)> },
    /// Requests of ids of `logs` drawn at random.
    Random { logs: Arc<Vec<Log>>, drawn: Arc<Drawn> },
}

/// When a phase's answers count, and where it pushes.
#[derive(Clone, Debug)]
struct Plan {
    queue: Arc<str>,
    /// Names the phase (and the connection) in what is printed.
    label: String,
    partitions: usize,
    size: usize,
    measure_from: Instant,
    end: Instant,
}

/// Items answered wrongly, by kind.
#[derive(Clone, Copy, Debug, Default)]
struct Wrong {
    /// A fresh id answered `duplicate`.
    new_as_duplicate: u64,
    /// A replayed id answered `queued`.
    replay_as_queued: u64,
    /// A replayed id answered `duplicate` with another offset or messageId than its first answer.
    replay_other_original: u64,
    /// Answers missing, extra, or unreadable (a 201 whose body is not the answer array, an unknown status).
    malformed: u64,
}

impl Wrong {
    fn total(&self) -> u64 {
        self.new_as_duplicate + self.replay_as_queued + self.replay_other_original + self.malformed
    }

    fn add(&mut self, other: &Wrong) {
        self.new_as_duplicate += other.new_as_duplicate;
        self.replay_as_queued += other.replay_as_queued;
        self.replay_other_original += other.replay_other_original;
        self.malformed += other.malformed;
    }
}

/// What one connection saw: counts of the measured seconds, and every
/// wrong answer and error of the phase.
#[derive(Debug, Default)]
struct Tally {
    requests: u64,
    items: u64,
    latencies_us: Vec<u32>,
    wrong: Wrong,
    errors: u64,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.requests += other.requests;
        self.items += other.items;
        self.latencies_us.extend(other.latencies_us);
        self.wrong.add(&other.wrong);
        self.errors += other.errors;
    }
}

/// What the items of a request must be answered.
#[derive(Clone, Copy, Debug)]
enum Expect<'a> {
    /// `n` fresh ids: `queued`.
    New(usize),
    /// Ids stored before: `duplicate`, with these offsets and messageIds.
    Duplicates(&'a [Stored]),
}

/// One answer of a push's 201 body, the fields checked.
#[derive(Debug, Deserialize)]
struct Entry<'a> {
    message_id: &'a str,
    offset: i64,
    status: &'a str,
}

/// How a 201 was answered: items answered, those answered wrongly, and the
/// first of them, described.
#[derive(Debug, Default)]
struct Verdict {
    answered: u64,
    wrong: Wrong,
    first_wrong: Option<String>,
}

/// Checks a 201's body against what it must say; each item's answer is
/// added to `record`, if given, when the answers are as many as the items.
fn check(body: &[u8], expect: Expect<'_>, record: Option<&mut Vec<Stored>>) -> Verdict {
    let mut verdict = Verdict::default();
    let wanted = match expect {
        Expect::New(n) => n,
        Expect::Duplicates(originals) => originals.len(),
    };
    let entries: Vec<Entry<'_>> = match serde_json::from_slice(body) {
        Ok(entries) => entries,
        Err(e) => {
            verdict.wrong.malformed = wanted as u64;
            let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
            verdict.first_wrong = Some(format!("a 201 whose body is not the answers ({e}): {text}"));
            return verdict;
        }
    };
    verdict.answered = entries.len() as u64;
    let note = |verdict: &mut Verdict, what: String| {
        verdict.first_wrong.get_or_insert(what);
    };
    if entries.len() != wanted {
        verdict.wrong.malformed += wanted.abs_diff(entries.len()) as u64;
        note(&mut verdict, format!("{} answers to {wanted} items", entries.len()));
    }
    let mut answers = Vec::with_capacity(entries.len());
    for (k, entry) in entries.iter().enumerate() {
        let Ok(id) = uuid::Uuid::try_parse(entry.message_id) else {
            verdict.wrong.malformed += 1;
            note(&mut verdict, format!("item {k}: messageId {:?} is not a UUID", entry.message_id));
            continue;
        };
        let got = Stored { offset: entry.offset, message_id: id.as_u128() };
        answers.push(got);
        let said = || format!("{} at offset {} as {id}", entry.status, entry.offset);
        match (expect, entry.status) {
            (Expect::New(_), "queued") => {}
            (Expect::New(_), "duplicate") => {
                verdict.wrong.new_as_duplicate += 1;
                note(&mut verdict, format!("item {k}, a fresh id, answered {}", said()));
            }
            (Expect::Duplicates(originals), "queued") => {
                verdict.wrong.replay_as_queued += 1;
                let original = originals.get(k).copied();
                note(&mut verdict, format!("item {k}, a replay of {}, answered {}", stored_text(original), said()));
            }
            (Expect::Duplicates(originals), "duplicate") => {
                if let Some(&original) = originals.get(k)
                    && original != got
                {
                    verdict.wrong.replay_other_original += 1;
                    note(&mut verdict, format!("item {k}, a replay of {}, answered {}", stored_text(Some(original)), said()));
                }
            }
            (_, status) => {
                verdict.wrong.malformed += 1;
                note(&mut verdict, format!("item {k}: unknown status {status:?}"));
            }
        }
    }
    if let Some(record) = record
        && answers.len() == wanted
    {
        record.extend(answers);
    }
    verdict
}

fn stored_text(stored: Option<Stored>) -> String {
    match stored {
        Some(s) => format!("offset {} as {}", s.offset, uuid::Uuid::from_u128(s.message_id)),
        None => "nothing (more answers than items)".to_owned(),
    }
}

/// Wrong answers and errors a connection prints; the rest are counted.
const PRINTED_PER_CONNECTION: u32 = 3;

/// One connection's loop until `end`. Every answer is checked; those
/// answered inside the measured seconds count.
async fn drive(mut client: Client, work: Work, plan: Plan, seed: u64) -> (Tally, Option<Log>) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut tally = Tally::default();
    let mut log = match &work {
        Work::New { tag, .. } => Some(Log { tag: tag.clone(), ..Log::default() }),
        _ => None,
    };
    let mut expected: Vec<Stored> = Vec::with_capacity(plan.size);
    let mut picked: Vec<ItemRef> = Vec::with_capacity(plan.size);
    let mut cursor = 0usize;
    let mut seq = 0u64;
    let mut printed = 0u32;
    loop {
        let sent = Instant::now();
        if sent >= plan.end {
            break;
        }
        // A fresh request's partition and seq; `None` for one re-sent.
        let mut fresh: Option<(u32, u64)> = None;
        expected.clear();
        let request = match &work {
            Work::New { tag, retry_percent } => {
                let log = log.as_ref().expect("a connection pushing fresh ids keeps a log");
                if !log.sent.is_empty() && rng.random_range(0..100) < *retry_percent {
                    let earlier = &log.sent[rng.random_range(0..log.sent.len())];
                    expected.extend_from_slice(log.answers_of(earlier));
                    earlier.body.clone()
                } else {
                    let partition = rng.random_range(0..plan.partitions);
                    let mut text = String::with_capacity(16 + 150 * plan.size);
                    write_push_body(&mut text, &plan.queue, partition, tag, seq, plan.size);
                    fresh = Some((partition as u32, seq));
                    seq += 1;
                    Bytes::from(text)
                }
            }
            Work::Replay { logs, order } => {
                let Some(&(c, r)) = order.get(cursor % order.len().max(1)) else { break };
                cursor += 1;
                let log = &logs[c as usize];
                let earlier = &log.sent[r as usize];
                expected.extend_from_slice(log.answers_of(earlier));
                earlier.body.clone()
            }
            Work::Random { logs, drawn } => {
                if drawn.requests.is_empty() {
                    break;
                }
                let (c, r) = drawn.requests[rng.random_range(0..drawn.requests.len())];
                let partition = logs[c as usize].sent[r as usize].partition;
                let stored = &drawn.by_partition[partition as usize];
                picked.clear();
                // Distinct ids: the same id twice in one request is another test.
                while picked.len() < plan.size.min(stored.len()) {
                    let item = stored[rng.random_range(0..stored.len())];
                    if !picked.contains(&item) {
                        picked.push(item);
                    }
                }
                let items: Vec<(&str, u64, usize)> = picked
                    .iter()
                    .map(|at| {
                        let log = &logs[at.conn as usize];
                        let sent = &log.sent[at.request as usize];
                        expected.push(log.answers_of(sent)[at.item as usize]);
                        (log.tag.as_str(), sent.seq, at.item as usize)
                    })
                    .collect();
                let mut text = String::with_capacity(16 + 150 * items.len());
                write_pushed_items(&mut text, &plan.queue, partition as usize, &items);
                Bytes::from(text)
            }
        };
        let reply = client.send(Method::POST, "/api/v1/push", request.clone(), &[("content-type", "application/json")]).await;
        let done = Instant::now();
        let counted = done >= plan.measure_from && done <= plan.end;
        match reply {
            Ok(reply) if reply.status == 201 => {
                let verdict = match (fresh, log.as_mut()) {
                    (Some((partition, seq)), Some(log)) => {
                        let first = log.answers.len();
                        let verdict = check(&reply.body, Expect::New(plan.size), Some(&mut log.answers));
                        let items = log.answers.len() - first;
                        if items == plan.size {
                            log.sent.push(Sent { body: request, partition, seq, first, items });
                        }
                        verdict
                    }
                    _ => check(&reply.body, Expect::Duplicates(&expected), None),
                };
                let wrong = verdict.wrong.total();
                if wrong > 0 {
                    WRONG_ANSWERS.fetch_add(wrong, Ordering::Relaxed);
                    tally.wrong.add(&verdict.wrong);
                    if printed < PRINTED_PER_CONNECTION {
                        printed += 1;
                        eprintln!(
                            "  WRONG ANSWER ({}, {wrong} item(s) of this request): {}",
                            plan.label,
                            verdict.first_wrong.unwrap_or_default()
                        );
                    }
                }
                if counted {
                    tally.requests += 1;
                    tally.items += verdict.answered;
                    tally.latencies_us.push(u32::try_from(done.duration_since(sent).as_micros()).unwrap_or(u32::MAX));
                }
            }
            Ok(reply) => {
                tally.errors += 1;
                if printed < PRINTED_PER_CONNECTION {
                    printed += 1;
                    eprintln!("  {}: HTTP {}: {}", plan.label, reply.status, reply.text());
                }
            }
            Err(error) => {
                tally.errors += 1;
                if printed < PRINTED_PER_CONNECTION {
                    printed += 1;
                    eprintln!("  {}: {error:#}", plan.label);
                }
            }
        }
    }
    (tally, log)
}

/// One phase's figures (of one side of the mixed load, or all of it).
#[derive(Clone, Copy, Debug, Default)]
struct Figures {
    rate: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// CPU milliseconds per 1,000 items answered (both sides' items, in the
    /// mixed load): the gateway, PostgreSQL (every server process), this
    /// generator, and the gateway's own backends.
    cpu_ms_per_k: [f64; 4],
    requests: u64,
    items: u64,
    wrong: u64,
    errors: u64,
}

impl Figures {
    fn of(tally: &mut Tally, secs: f64, cpu: [f64; 4], cpu_items: u64) -> Figures {
        tally.latencies_us.sort_unstable();
        Figures {
            rate: tally.items as f64 / secs,
            p50_ms: percentile_ms(&tally.latencies_us, 50.0),
            p99_ms: percentile_ms(&tally.latencies_us, 99.0),
            cpu_ms_per_k: cpu.map(|seconds| 1e6 * seconds / cpu_items.max(1) as f64),
            requests: tally.requests,
            items: tally.items,
            wrong: tally.wrong.total(),
            errors: tally.errors,
        }
    }

    fn gateway_cpu(&self) -> f64 {
        self.cpu_ms_per_k[0]
    }

    fn postgres_cpu(&self) -> f64 {
        self.cpu_ms_per_k[1]
    }

    fn generator_cpu(&self) -> f64 {
        self.cpu_ms_per_k[2]
    }

    fn backends_cpu(&self) -> f64 {
        self.cpu_ms_per_k[3]
    }
}

/// CPU seconds used so far by the gateway, PostgreSQL (every server process,
/// those that have exited included), this process and the gateway's backends.
fn cpu_now(gateway: i32, backends: &[i32]) -> [f64; 4] {
    [cpu_seconds(&[gateway]), postgres_cpu_seconds(), cpu_seconds(&[std::process::id() as i32]), cpu_seconds(backends)]
}

/// What one phase measured: per side, its tally, the CPU used over the
/// measured seconds, and the logs of the connections that pushed fresh ids.
struct Measured {
    sides: Vec<Tally>,
    cpu: [f64; 4],
    logs: Vec<Log>,
}

/// Runs one phase on `gw`: every connection, one task each, pushes its
/// `works` (each tagged with its side) for `--warmup` + `--secs` seconds.
async fn measure(
    args: &Args,
    build: &Build,
    gw: &Gateway,
    queue: &Arc<str>,
    size: usize,
    label: &str,
    works: Vec<(usize, Work)>,
) -> Measured {
    let mut clients = Vec::with_capacity(works.len());
    for _ in 0..works.len() {
        clients.push(Client::connect(gw.addr).await.unwrap_or_else(|e| panic!("connect to the gateway at {}: {e:#}", gw.addr)));
    }
    let start = Instant::now();
    let measure_from = start + Duration::from_secs_f64(args.warmup);
    let end = measure_from + Duration::from_secs_f64(args.secs);
    let sides = works.iter().map(|(side, _)| side + 1).max().unwrap_or(0);
    let mut tasks = Vec::with_capacity(works.len());
    for (c, (client, (side, work))) in clients.into_iter().zip(works).enumerate() {
        let plan = Plan {
            queue: queue.clone(),
            label: format!("{queue} {label} c{c}"),
            partitions: args.partitions,
            size,
            measure_from,
            end,
        };
        let seed = plan.label.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
        tasks.push((side, tokio::spawn(drive(client, work, plan, seed))));
    }
    tokio::time::sleep_until(measure_from.into()).await;
    // After the warm-up: the gateway's pool has opened its connections.
    let backends = backend_pids(&build.pg, &gw.application_name).await;
    let before = cpu_now(gw.pid(), &backends);
    tokio::time::sleep_until(end.into()).await;
    let after = cpu_now(gw.pid(), &backends);
    let mut measured = Measured {
        sides: (0..sides).map(|_| Tally::default()).collect(),
        cpu: std::array::from_fn(|i| after[i] - before[i]),
        logs: Vec::new(),
    };
    for (side, task) in tasks {
        let (tally, log) = task.await.expect("a connection task");
        measured.sides[side].merge(tally);
        measured.logs.extend(log);
    }
    measured
}

/// Connections pushing fresh ids, tagged `{prefix}{c}`.
fn new_works(prefix: &str, conns: usize, retry_percent: u32, side: usize) -> Vec<(usize, Work)> {
    (0..conns).map(|c| (side, Work::New { tag: format!("{prefix}{c}"), retry_percent })).collect()
}

/// `replaying` connections re-sending the requests of `logs` in the order
/// sent: connection `m` those of the connections `m`, `m + replaying`, …
fn replay_works(logs: &Arc<Vec<Log>>, replaying: usize, side: usize) -> Vec<(usize, Work)> {
    (0..replaying)
        .map(|m| {
            let order = (m..logs.len())
                .step_by(replaying)
                .flat_map(|c| (0..logs[c].sent.len()).map(move |r| (c as u32, r as u32)))
                .collect();
            (side, Work::Replay { logs: logs.clone(), order })
        })
        .collect()
}

/// One phase's figures for a shape of one build in one round.
#[derive(Debug)]
struct Row {
    round: usize,
    build: usize,
    shape: Shape,
    phase: Phase,
    figures: Figures,
}

/// The mixed load of one build in one round, beside the rate of fresh ids
/// alone at as many connections.
#[derive(Debug)]
struct MixedRow {
    round: usize,
    build: usize,
    alone: Figures,
    replay: Figures,
    new: Figures,
    together: Figures,
}

/// Everything measured so far, and how a phase's figures are announced.
struct Results {
    rows: Vec<Row>,
    mixed: Vec<MixedRow>,
}

fn announce(round: usize, build: &Build, what: &str, f: &Figures) {
    eprintln!(
        "  r{round} {} {what:<28} {:>8.0} msg/s  p50 {:>7.2} ms  p99 {:>7.2} ms  CPU ms per 1,000: gateway {:.1}, PostgreSQL {:.1} \
         (its backends {:.1}), generator {:.1}; {} items in {} requests, {} wrong, {} non-201 (load average {})",
        build.label,
        f.rate,
        f.p50_ms,
        f.p99_ms,
        f.gateway_cpu(),
        f.postgres_cpu(),
        f.backends_cpu(),
        f.generator_cpu(),
        f.items,
        f.requests,
        f.wrong,
        f.errors,
        load_average()
    );
}

/// Runs a phase and returns its figures (one side) and its logs.
async fn single(
    args: &Args,
    build: &Build,
    gw: &Gateway,
    queue: &Arc<str>,
    shape: Shape,
    phase: &str,
    works: Vec<(usize, Work)>,
) -> (Figures, Vec<Log>) {
    let mut measured = measure(args, build, gw, queue, shape.items, phase, works).await;
    let mut tally = Tally::default();
    for side in measured.sides.drain(..) {
        tally.merge(side);
    }
    let items = tally.items;
    let figures = Figures::of(&mut tally, args.secs, measured.cpu, items);
    if figures.errors > 0 {
        eprintln!("  the gateway's last warnings and errors:\n    {}", gw.complaints());
    }
    (figures, measured.logs)
}

/// The mixed load on `gw`, whose queue `logs` were stored in: `replaying`
/// connections re-sending them beside `new` pushing fresh ids.
async fn mixed_load(
    args: &Args,
    build: &Build,
    gw: &Gateway,
    queue: &Arc<str>,
    logs: Arc<Vec<Log>>,
    (replaying, new): (usize, usize),
) -> (Figures, Figures, Figures) {
    let mut works = replay_works(&logs, replaying, 0);
    works.extend(new_works("m", new, args.retry_percent, 1));
    let mut measured = measure(args, build, gw, queue, 1, "mixed", works).await;
    drop(logs);
    let items = measured.sides.iter().map(|side| side.items).sum();
    let mut together = Tally::default();
    let mut sides = measured.sides.drain(..);
    let (mut replay, mut fresh) = (sides.next().unwrap_or_default(), sides.next().unwrap_or_default());
    let replay_figures = Figures::of(&mut replay, args.secs, measured.cpu, items);
    let new_figures = Figures::of(&mut fresh, args.secs, measured.cpu, items);
    together.merge(replay);
    together.merge(fresh);
    let together = Figures::of(&mut together, args.secs, measured.cpu, items);
    if together.errors > 0 {
        eprintln!("  the gateway's last warnings and errors:\n    {}", gw.complaints());
    }
    (replay_figures, new_figures, together)
}

/// One shape of one build in one round: a fresh gateway and queue, the four
/// phases, and the mixed load if this is the shape it is compared with.
async fn shape_turn(
    args: &Args,
    build: &Build,
    b: usize,
    round: usize,
    shape: Shape,
    mixed_here: Option<(usize, usize)>,
    results: &mut Results,
) {
    let queue: Arc<str> = Arc::from(format!("storm-r{round}-{}-{}", build.label, shape.name()));
    let gw = Gateway::start(build, &queue).await;
    let mut new_logs = Arc::new(Vec::new());
    let mut new_figures = Figures::default();
    for phase in PHASES {
        let works = match phase {
            Phase::New => new_works("n", shape.conns, args.retry_percent, 0),
            Phase::ReplayRecent => replay_works(&new_logs, shape.conns, 0),
            Phase::ReplayRandom => {
                let drawn = Arc::new(Drawn::of(&new_logs, args.partitions));
                (0..shape.conns).map(|_| (0, Work::Random { logs: new_logs.clone(), drawn: drawn.clone() })).collect()
            }
            Phase::NewAgain => new_works("a", shape.conns, args.retry_percent, 0),
        };
        let (figures, logs) = single(args, build, &gw, &queue, shape, phase.name(), works).await;
        announce(round, build, &format!("{} {}", shape.name(), phase.name()), &figures);
        results.rows.push(Row { round, build: b, shape, phase, figures });
        match phase {
            Phase::New => {
                new_logs = Arc::new(logs);
                new_figures = figures;
            }
            Phase::NewAgain => {
                if let Some(sides) = mixed_here {
                    // The replaying side re-sends what was stored last, in the order sent.
                    let (replay, new, together) = mixed_load(args, build, &gw, &queue, Arc::new(logs), sides).await;
                    announce_mixed(round, build, sides, &new_figures, &replay, &new, &together);
                    results.mixed.push(MixedRow { round, build: b, alone: new_figures, replay, new, together });
                }
            }
            _ => {}
        }
    }
}

/// The mixed load of one build in one round when no shape measured fresh
/// ids alone at as many connections: a gateway of its own measures that
/// first.
async fn mixed_turn(args: &Args, build: &Build, b: usize, round: usize, sides: (usize, usize), results: &mut Results) {
    let queue: Arc<str> = Arc::from(format!("storm-r{round}-{}-mixed", build.label));
    let gw = Gateway::start(build, &queue).await;
    let shape = Shape { items: 1, conns: sides.0 + sides.1 };
    let (alone, logs) = single(args, build, &gw, &queue, shape, "new", new_works("n", shape.conns, args.retry_percent, 0)).await;
    announce(round, build, &format!("{} new (alone)", shape.name()), &alone);
    results.rows.push(Row { round, build: b, shape, phase: Phase::New, figures: alone });
    let (replay, new, together) = mixed_load(args, build, &gw, &queue, Arc::new(logs), sides).await;
    announce_mixed(round, build, sides, &alone, &replay, &new, &together);
    results.mixed.push(MixedRow { round, build: b, alone, replay, new, together });
}

fn announce_mixed(
    round: usize,
    build: &Build,
    (m, n): (usize, usize),
    alone: &Figures,
    replay: &Figures,
    new: &Figures,
    together: &Figures,
) {
    announce(round, build, &format!("mixed {m}+{n}: replaying"), replay);
    announce(round, build, &format!("mixed {m}+{n}: new"), new);
    announce(round, build, &format!("mixed {m}+{n}: together"), together);
    eprintln!(
        "  r{round} {} mixed: together {:.2}x and new {:.2}x of new alone on {} connections",
        build.label,
        together.rate / alone.rate,
        new.rate / alone.rate,
        m + n
    );
}

/// The label of the `k`-th build: A, B, …
fn label(k: usize) -> String {
    match u8::try_from(k) {
        Ok(k) if k < 26 => char::from(b'A' + k).to_string(),
        _ => format!("B{k}"),
    }
}

async fn run(args: Args) {
    let started = Instant::now();
    eprintln!("storm: {args:?}");
    let load_before = load_average();
    let paths = if args.bins.is_empty() { vec![stile_binary()] } else { args.bins.clone() };
    let mut builds = Vec::with_capacity(paths.len());
    for (k, entry) in paths.into_iter().enumerate() {
        let (path, flags) = bin_and_flags(&entry);
        assert!(path.is_file(), "no stile binary at {}", path.display());
        let db = database(&args).await;
        let pg = db.client().await;
        let far = if args.db_rtt_ms > 0.0 {
            Some(FarDatabase::start(&db, Duration::from_secs_f64(args.db_rtt_ms / 1000.0)).await)
        } else {
            None
        };
        eprintln!("storm: build {} is {} {}, on database {}", label(k), path.display(), flags.join(" "), db.name());
        builds.push(Build { label: label(k), path, flags, db, pg, far });
    }
    let version = server_version(&builds[0].pg).await;
    let mixed_sides = match args.mixed {
        Mixed::Load { replaying, new } => Some((replaying, new)),
        Mixed::None => None,
    };
    // The shape the mixed load is compared with, if it is measured.
    let alone_shape = mixed_sides.map(|(m, n)| Shape { items: 1, conns: m + n });
    let mixed_on_shape = alone_shape.filter(|shape| args.shapes.contains(shape));
    let mut results = Results { rows: Vec::new(), mixed: Vec::new() };
    for round in 0..args.rounds {
        for (s, &shape) in args.shapes.iter().enumerate() {
            // The builds' order moves by one per shape and per round.
            for k in 0..builds.len() {
                let b = (round + s + k) % builds.len();
                let here = mixed_sides.filter(|_| Some(shape) == mixed_on_shape);
                shape_turn(&args, &builds[b], b, round, shape, here, &mut results).await;
            }
        }
        if let (Some(sides), None) = (mixed_sides, mixed_on_shape) {
            for k in 0..builds.len() {
                let b = (round + args.shapes.len() + k) % builds.len();
                mixed_turn(&args, &builds[b], b, round, sides, &mut results).await;
            }
        }
    }
    print(&args, &builds, &results, &version, &load_before, alone_shape);
    println!();
    println!("total run time {:.0} s", started.elapsed().as_secs_f64());
    drop(builds);
}

/// A ratio as the tables write it.
fn times(x: f64) -> String {
    if x.is_nan() { "–".to_owned() } else { format!("{x:.2}x") }
}

/// A command-line argument as a shell takes it back.
fn quoted(arg: &str) -> String {
    if !arg.is_empty() && arg.chars().all(|c| c.is_ascii_alphanumeric() || "-_./,=+:".contains(c)) {
        arg.to_owned()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

fn print(args: &Args, builds: &[Build], results: &Results, version: &str, load_before: &str, alone_shape: Option<Shape>) {
    let rounds = args.rounds;
    println!();
    println!(
        "Retry storm: replays of stored ids against fresh ids, {} partitions, {} s warm-up + {} s measured per phase, \
         {} % retries in the phases pushing fresh ids, synchronous_commit={}{}, a fresh gateway with its default flags \
         for every shape of every build in every round; PostgreSQL {version}; {}; {}; load average {load_before} before, \
         {} after",
        args.partitions,
        args.warmup,
        args.secs,
        args.retry_percent,
        args.sync.name(),
        args.pg_settings.iter().map(|(name, value)| format!(", {name}={value}")).collect::<String>(),
        machine(),
        today(),
        load_average()
    );
    println!();
    for build in builds {
        let hash = std::fs::read(&build.path)
            .map_or_else(|_| "unreadable".to_owned(), |bytes| format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&bytes)));
        let flags = if build.flags.is_empty() { String::new() } else { format!(" with `{}`", build.flags.join(" ")) };
        let far = if args.db_rtt_ms > 0.0 {
            format!(", PostgreSQL {} ms away (round trip, through a userspace proxy)", args.db_rtt_ms)
        } else {
            String::new()
        };
        println!("* build {}: `{}`{flags} (xxh3 {hash}){far}", build.label, build.path.display());
    }
    println!();
    println!("Reproduce (the source tree, when this ran: {}):", build());
    println!();
    println!("```");
    println!("cargo build --release -p stile -p stile-bench --bin stile --bin storm");
    println!("{}", std::env::args().map(|arg| quoted(&arg)).collect::<Vec<_>>().join(" "));
    println!("```");

    println!();
    println!("Every round, shape and build (`x new`: the phase's rate over `new`'s on the same gateway):");
    println!();
    println!(
        "| round | build | shape | phase | msg/s | x new | p50 ms | p99 ms | gateway CPU ms/1000 \
         | PostgreSQL CPU ms/1000 (its backends) | generator CPU ms/1000 | wrong | non-201 |"
    );
    println!("|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let find = |round: usize, build: usize, shape: Shape, phase: Phase| {
        results
            .rows
            .iter()
            .find(|r| r.round == round && r.build == build && r.shape == shape && r.phase == phase)
            .map(|r| r.figures)
    };
    for row in &results.rows {
        let f = &row.figures;
        let new = find(row.round, row.build, row.shape, Phase::New).map_or(f64::NAN, |n| n.rate);
        println!(
            "| {} | {} | {} | {} | {:.0} | {} | {:.2} | {:.2} | {:.1} | {:.1} ({:.1}) | {:.1} | {} | {} |",
            row.round,
            builds[row.build].label,
            row.shape.name(),
            row.phase.name(),
            f.rate,
            times(f.rate / new),
            f.p50_ms,
            f.p99_ms,
            f.gateway_cpu(),
            f.postgres_cpu(),
            f.backends_cpu(),
            f.generator_cpu(),
            loud(f.wrong),
            f.errors
        );
    }
    let alone_name = alone_shape.map_or_else(String::new, |shape| shape.name());
    if !results.mixed.is_empty() {
        println!();
        println!(
            "The mixed load at 1 per request (`x alone`: over fresh ids alone on {} connections, the `new` phase of shape {alone_name} \
             of the same build and round); CPU per 1,000 messages of both sides:",
            alone_shape.map_or(0, |shape| shape.conns)
        );
        println!();
        println!(
            "| round | build | side | msg/s | x alone | p50 ms | p99 ms | gateway CPU ms/1000 | PostgreSQL CPU ms/1000 (its backends) | wrong | non-201 |"
        );
        println!("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        let (m, n) = match args.mixed {
            Mixed::Load { replaying, new } => (replaying, new),
            Mixed::None => (0, 0),
        };
        for row in &results.mixed {
            let label = &builds[row.build].label;
            for (side, f, cpu) in [
                (format!("new alone ({alone_name})"), &row.alone, true),
                (format!("replaying ({m})"), &row.replay, false),
                (format!("new ({n})"), &row.new, false),
                ("together".to_owned(), &row.together, true),
            ] {
                let cpu = if cpu {
                    format!("{:.1} | {:.1} ({:.1})", f.gateway_cpu(), f.postgres_cpu(), f.backends_cpu())
                } else {
                    "– | –".to_owned()
                };
                println!(
                    "| {} | {label} | {side} | {:.0} | {} | {:.2} | {:.2} | {cpu} | {} | {} |",
                    row.round,
                    f.rate,
                    times(f.rate / row.alone.rate),
                    f.p50_ms,
                    f.p99_ms,
                    loud(f.wrong),
                    f.errors
                );
            }
        }
    }

    // Medians over the rounds, per build.
    let ratio_median = |build: usize, shape: Shape, phase: Phase, of: fn(&Figures) -> f64| {
        median((0..rounds).map(|r| match (find(r, build, shape, phase), find(r, build, shape, Phase::New)) {
            (Some(f), Some(new)) => of(&f) / of(&new),
            _ => f64::NAN,
        }))
    };
    let value_median = |build: usize, shape: Shape, phase: Phase, of: fn(&Figures) -> f64| {
        median((0..rounds).map(|r| find(r, build, shape, phase).map_or(f64::NAN, |f| of(&f))))
    };
    println!();
    println!(
        "Medians over {rounds} round(s), per build (`x new`: the median of each round's own ratio to `new`; CPU ms per 1,000 messages):"
    );
    println!();
    println!(
        "| build | shape | phase | msg/s | x new | p50 ms | p99 ms | gateway CPU | x new | PostgreSQL CPU | x new | its backends | x new |"
    );
    println!("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (b, build) in builds.iter().enumerate() {
        for &shape in &args.shapes {
            for phase in PHASES {
                println!(
                    "| {} | {} | {} | {:.0} | {} | {:.2} | {:.2} | {:.1} | {} | {:.1} | {} | {:.1} | {} |",
                    build.label,
                    shape.name(),
                    phase.name(),
                    value_median(b, shape, phase, |f| f.rate),
                    times(ratio_median(b, shape, phase, |f| f.rate)),
                    value_median(b, shape, phase, |f| f.p50_ms),
                    value_median(b, shape, phase, |f| f.p99_ms),
                    value_median(b, shape, phase, Figures::gateway_cpu),
                    times(ratio_median(b, shape, phase, Figures::gateway_cpu)),
                    value_median(b, shape, phase, Figures::postgres_cpu),
                    times(ratio_median(b, shape, phase, Figures::postgres_cpu)),
                    value_median(b, shape, phase, Figures::backends_cpu),
                    times(ratio_median(b, shape, phase, Figures::backends_cpu)),
                );
            }
        }
    }
    let mixed_median =
        |build: usize, of: &dyn Fn(&MixedRow) -> f64| median(results.mixed.iter().filter(|row| row.build == build).map(of));
    if !results.mixed.is_empty() {
        println!();
        println!(
            "| build | mixed: new alone msg/s | replaying msg/s | new msg/s | together msg/s | together x alone | new x alone | gateway CPU together / alone | PostgreSQL CPU together / alone |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        for (b, build) in builds.iter().enumerate() {
            println!(
                "| {} | {:.0} | {:.0} | {:.0} | {:.0} | {} | {} | {:.1} / {:.1} | {:.1} / {:.1} |",
                build.label,
                mixed_median(b, &|row| row.alone.rate),
                mixed_median(b, &|row| row.replay.rate),
                mixed_median(b, &|row| row.new.rate),
                mixed_median(b, &|row| row.together.rate),
                times(mixed_median(b, &|row| row.together.rate / row.alone.rate)),
                times(mixed_median(b, &|row| row.new.rate / row.alone.rate)),
                mixed_median(b, &|row| row.together.gateway_cpu()),
                mixed_median(b, &|row| row.alone.gateway_cpu()),
                mixed_median(b, &|row| row.together.postgres_cpu()),
                mixed_median(b, &|row| row.alone.postgres_cpu()),
            );
        }
    }

    // The goals, per build, on the medians of the rounds' own ratios.
    println!();
    println!(
        "Against the goals, per build (medians of the rounds' own ratios): a replay's rate at least `new`'s, its CPU per \
         1,000 (gateway, PostgreSQL) at most `new`'s; the mixed load together at least fresh ids alone, its new side at \
         least 0.45 of it:"
    );
    println!();
    println!(
        "| build | shape | phase | rate x new (>= 1.0) | gateway CPU x new (<= 1.0) | PostgreSQL CPU x new (<= 1.0) | met |"
    );
    println!("|---|---|---|---:|---:|---:|---|");
    for (b, build) in builds.iter().enumerate() {
        for &shape in &args.shapes {
            for phase in PHASES.into_iter().filter(|phase| phase.replays()) {
                let rate = ratio_median(b, shape, phase, |f| f.rate);
                let gateway = ratio_median(b, shape, phase, Figures::gateway_cpu);
                let postgres = ratio_median(b, shape, phase, Figures::postgres_cpu);
                let met = rate >= 1.0 && gateway <= 1.0 && postgres <= 1.0;
                println!(
                    "| {} | {} | {} | {} | {} | {} | {} |",
                    build.label,
                    shape.name(),
                    phase.name(),
                    times(rate),
                    times(gateway),
                    times(postgres),
                    if met { "yes" } else { "**no**" }
                );
            }
        }
        if results.mixed.iter().any(|row| row.build == b) {
            let together = mixed_median(b, &|row| row.together.rate / row.alone.rate);
            let new = mixed_median(b, &|row| row.new.rate / row.alone.rate);
            println!(
                "| {} | mixed {} | together x alone (>= 1.0), new x alone (>= 0.45) | {} / {} | | | {} |",
                build.label,
                match args.mixed {
                    Mixed::Load { replaying, new } => format!("{replaying}+{new}"),
                    Mixed::None => String::new(),
                },
                times(together),
                times(new),
                if together >= 1.0 && new >= 0.45 { "yes" } else { "**no**" }
            );
        }
    }

    // Each later build against the first, round by round.
    if builds.len() > 1 {
        println!();
        println!(
            "Each build against {} (its figure over {}'s, measured in the same round; the median of the rounds' ratios):",
            builds[0].label, builds[0].label
        );
        println!();
        let header: Vec<String> = (0..rounds).map(|r| format!("msg/s r{r}")).collect();
        println!(
            "| builds | shape | phase | {} | msg/s median | gateway CPU median | PostgreSQL CPU median |",
            header.join(" | ")
        );
        println!("|---|---|---|{}---:|---:|---:|", "---:|".repeat(rounds));
        let against = |b: usize, shape: Shape, phase: Phase, round: usize, of: fn(&Figures) -> f64| match (
            find(round, b, shape, phase),
            find(round, 0, shape, phase),
        ) {
            (Some(f), Some(a)) => of(&f) / of(&a),
            _ => f64::NAN,
        };
        for (b, build) in builds.iter().enumerate().skip(1) {
            for &shape in &args.shapes {
                for phase in PHASES {
                    let per_round: Vec<String> = (0..rounds).map(|r| times(against(b, shape, phase, r, |f| f.rate))).collect();
                    let median_of = |of: fn(&Figures) -> f64| times(median((0..rounds).map(|r| against(b, shape, phase, r, of))));
                    println!(
                        "| {} / {} | {} | {} | {} | {} | {} | {} |",
                        build.label,
                        builds[0].label,
                        shape.name(),
                        phase.name(),
                        per_round.join(" | "),
                        median_of(|f| f.rate),
                        median_of(Figures::gateway_cpu),
                        median_of(Figures::postgres_cpu)
                    );
                }
            }
            if !results.mixed.is_empty() {
                let mixed_against = |round: usize, of: &dyn Fn(&MixedRow) -> f64| {
                    let row = |build: usize| results.mixed.iter().find(|row| row.round == round && row.build == build);
                    match (row(b), row(0)) {
                        (Some(x), Some(a)) => of(x) / of(a),
                        _ => f64::NAN,
                    }
                };
                let per_round: Vec<String> = (0..rounds).map(|r| times(mixed_against(r, &|row| row.together.rate))).collect();
                println!(
                    "| {} / {} | mixed | together | {} | {} | {} | {} |",
                    build.label,
                    builds[0].label,
                    per_round.join(" | "),
                    times(median((0..rounds).map(|r| mixed_against(r, &|row| row.together.rate)))),
                    times(median((0..rounds).map(|r| mixed_against(r, &|row| row.together.gateway_cpu())))),
                    times(median((0..rounds).map(|r| mixed_against(r, &|row| row.together.postgres_cpu())))),
                );
            }
        }
    }

    let wrong: u64 =
        results.rows.iter().map(|r| r.figures.wrong).sum::<u64>() + results.mixed.iter().map(|r| r.together.wrong).sum::<u64>();
    let errors: u64 =
        results.rows.iter().map(|r| r.figures.errors).sum::<u64>() + results.mixed.iter().map(|r| r.together.errors).sum::<u64>();
    println!();
    println!(
        "{} wrong answers in the tables, {} in all (warm-ups included), {errors} answers other than 201 (fresh ids must answer \
         queued; replayed ones duplicate, with their first answer's offset and messageId)",
        loud(wrong),
        loud(WRONG_ANSWERS.load(Ordering::Relaxed))
    );
}

/// A count of wrong answers, bold unless 0.
fn loud(n: u64) -> String {
    if n == 0 { "0".to_owned() } else { format!("**{n}**") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flags_are_well_formed() {
        Args::command().debug_assert();
    }

    #[test]
    fn shapes_and_the_mixed_load_parse() {
        let args = Args::try_parse_from(["storm", "--shapes", "1x32,100X8", "--mixed", "64+32", "--bins", "a,b"]).unwrap();
        assert_eq!(args.shapes, [Shape { items: 1, conns: 32 }, Shape { items: 100, conns: 8 }]);
        assert_eq!(args.mixed, Mixed::Load { replaying: 64, new: 32 });
        assert_eq!(args.bins, [PathBuf::from("a"), PathBuf::from("b")]);
        assert_eq!(Args::try_parse_from(["storm", "--mixed", "none"]).unwrap().mixed, Mixed::None);
        assert!(Args::try_parse_from(["storm", "--mixed", "0+4"]).is_err());
        assert!(Args::try_parse_from(["storm", "--shapes", "0x4"]).is_err());
        let defaults = Args::try_parse_from(["storm"]).unwrap();
        assert_eq!(defaults.shapes.iter().map(|s| s.name()).collect::<Vec<_>>(), ["1x32", "1x256", "100x32"]);
        assert_eq!(defaults.mixed, Mixed::Load { replaying: 128, new: 128 });
        assert_eq!((defaults.partitions, defaults.secs, defaults.warmup, defaults.rounds), (64, 5.0, 1.0, 2));
        assert_eq!(defaults.sync, Switch::On);
    }

    const ID: &str = "0190a2b4-0000-7000-8000-000000000001";

    fn answer(offset: i64, status: &str) -> String {
        format!(
            r#"{{"index":0,"message_id":"{ID}","offset":{offset},"partition":"p1","queueName":"q","status":"{status}","transaction_id":"t-0-0"}}"#
        )
    }

    #[test]
    fn answers_are_checked_item_by_item() {
        let id = uuid::Uuid::parse_str(ID).unwrap().as_u128();
        let body = format!("[{},{}]", answer(4, "queued"), answer(5, "queued"));
        let mut record = Vec::new();
        let verdict = check(body.as_bytes(), Expect::New(2), Some(&mut record));
        assert_eq!((verdict.answered, verdict.wrong.total()), (2, 0));
        assert_eq!(record, [Stored { offset: 4, message_id: id }, Stored { offset: 5, message_id: id }]);

        let verdict = check(body.as_bytes(), Expect::Duplicates(&record), None);
        assert_eq!(verdict.wrong.replay_as_queued, 2);

        let body = format!("[{},{}]", answer(4, "duplicate"), answer(6, "duplicate"));
        let verdict = check(body.as_bytes(), Expect::Duplicates(&record), None);
        assert_eq!((verdict.wrong.replay_other_original, verdict.wrong.total()), (1, 1));
        assert!(verdict.first_wrong.unwrap().contains("item 1"));

        let verdict = check(body.as_bytes(), Expect::New(2), None);
        assert_eq!(verdict.wrong.new_as_duplicate, 2);

        let verdict = check(format!("[{}]", answer(4, "duplicate")).as_bytes(), Expect::Duplicates(&record), None);
        assert_eq!(verdict.wrong.malformed, 1);

        let mut none = Vec::new();
        let verdict = check(b"{\"error\":\"x\"}", Expect::New(3), Some(&mut none));
        assert_eq!(verdict.wrong.malformed, 3);
        assert!(none.is_empty());
    }

    #[test]
    fn replayers_share_the_logs_in_the_order_sent() {
        let log = |tag: &str, n: usize| Log {
            tag: tag.to_owned(),
            sent: (0..n).map(|r| Sent { body: Bytes::new(), partition: 0, seq: r as u64, first: r, items: 1 }).collect(),
            answers: (0..n).map(|r| Stored { offset: r as i64, message_id: 0 }).collect(),
        };
        let logs = Arc::new(vec![log("a", 2), log("b", 1), log("c", 3)]);
        let works = replay_works(&logs, 2, 0);
        let orders: Vec<Vec<(u32, u32)>> = works
            .iter()
            .map(|(_, work)| match work {
                Work::Replay { order, .. } => order.clone(),
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(orders, [vec![(0, 0), (0, 1), (2, 0), (2, 1), (2, 2)], vec![(1, 0)]]);
        let drawn = Drawn::of(&logs, 2);
        assert_eq!(drawn.requests.len(), 6);
        assert_eq!(drawn.by_partition[0].len(), 6);
        assert!(drawn.by_partition[1].is_empty());
    }
}
