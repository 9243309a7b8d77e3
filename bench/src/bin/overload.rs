//! Overload: bursts of far more connections than PostgreSQL can serve, each
//! against a few connections of the same requests in the same run. For each
//! shape (connections × messages per request) it prints accepted messages
//! per second against the baseline's, the latency of accepted requests, how
//! attempts were answered (201, 503, anything else), the gateway's peak
//! resident memory and what its intake held, how long the gateway takes to
//! answer a fresh push and to hold nothing once the burst ends, how long it
//! takes to exit after a SIGTERM sent during a second burst, and, read back
//! from `stile.messages`, whether every acknowledged id is stored exactly
//! once.
//!
//! ```text
//! cargo build --release -p stile -p stile-bench --bin stile --bin overload
//! target/release/overload [--shapes 2048x1000,8192x100] [--baseline-conns 32] [--secs 30] [--honor-retry-after]
//! ```
//!
//! Every phase runs against a gateway process of its own, with its defaults
//! (flags through the `STILE_*` environment, e.g. `STILE_MAX_HELD_MB`), and
//! a queue of its own, on a fresh database dropped at the end. Every
//! connection pushes a shape's messages to one random partition per request
//! and re-sends, byte for byte, `--retry-percent` of its earlier requests.
//! A request not answered 201 is sent again until it is: at once by default
//! (the harshest load, as wrk gives), or after the 503's `Retry-After` with
//! `--honor-retry-after`. When a burst's time is up the clients stop and
//! drop the attempts they have in flight, closing their connections, as a
//! load generator that exits does; an id whose request was never answered
//! 201 may or may not be stored, but never twice.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt as _, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{CONTENT_TYPE, HOST, RETRY_AFTER};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use rand::rngs::SmallRng;
use rand::{Rng as _, SeedableRng as _};
use stile_bench::{count, load_average, machine, percentile_ms, run_to_end, seconds, server_version, write_push_body};
use stile_tests::gateway::{Client, Gateway, fresh_database, metric, metric_total};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::task::JoinHandle;

#[derive(Debug, Parser)]
#[command(
    name = "overload",
    about = "The gateway under bursts: accepted throughput against few connections, 503s, memory, recovery, exit on SIGTERM and exactness",
    after_help = "Environment: STILE_TEST_DATABASE_URL names the PostgreSQL server (default: libpq's defaults); \
                  STILE_BIN the stile binary; STILE_* variables reach the gateway as its flags."
)]
struct Args {
    /// The bursts, comma-separated, each as CONNECTIONSxMESSAGES (messages per request).
    #[arg(long, value_delimiter = ',', default_value = "2048x1000,8192x100", value_parser = shape)]
    shapes: Vec<Shape>,
    /// Connections of the baseline each burst is compared with: the same requests, measured just before it.
    #[arg(long, default_value = "32", value_parser = count::<usize>)]
    baseline_conns: usize,
    /// Seconds each phase pushes.
    #[arg(long, default_value = "30", value_parser = seconds)]
    secs: f64,
    /// Partitions each phase's queue spreads its requests over.
    #[arg(long, default_value = "64", value_parser = count::<usize>)]
    partitions: usize,
    /// Percent of requests that re-send an earlier request of the same connection.
    #[arg(long, default_value = "10", value_parser = count::<u32>)]
    retry_percent: u32,
    /// Clients sleep for a 503's Retry-After before they send again, instead of retrying at once.
    #[arg(long)]
    honor_retry_after: bool,
    /// Seconds the second burst of each shape pushes before the gateway is sent SIGTERM.
    #[arg(long, default_value = "3", value_parser = seconds)]
    term_after: f64,
    /// Seconds to wait, after a burst, for a push to answer 201 and for the intake to hold nothing.
    #[arg(long, default_value = "60", value_parser = seconds)]
    recovery_limit: f64,
}

/// A burst's shape: how many connections, and messages per request.
#[derive(Clone, Copy, Debug)]
struct Shape {
    conns: usize,
    items: usize,
}

/// Parses `2048x1000`.
fn shape(text: &str) -> Result<Shape, String> {
    let (conns, items) = text.split_once(['x', 'X']).ok_or_else(|| format!("not CONNECTIONSxMESSAGES: {text:?}"))?;
    Ok(Shape { conns: count(conns)?, items: count(items)? })
}

fn main() {
    let args = Args::parse();
    let (soft, hard) = raise_open_files_limit();
    eprintln!("overload: open files limit {soft} (hard {hard})");
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a tokio runtime");
    run_to_end("overload", "its gateway is stopped and its database dropped", runtime, run(args));
}

/// Raises this process's soft limit on open files to its hard limit and
/// returns both. A burst of 8,192 connections needs a descriptor for each
/// in this process and in the gateway, which inherits the limit; the usual
/// soft default is 1,024.
fn raise_open_files_limit() -> (std::ffi::c_ulong, std::ffi::c_ulong) {
    /// `struct rlimit` of Linux, whose `rlim_t` is an unsigned long.
    #[repr(C)]
    struct Rlimit {
        current: std::ffi::c_ulong,
        max: std::ffi::c_ulong,
    }
    /// `RLIMIT_NOFILE` on Linux.
    const RLIMIT_NOFILE: std::ffi::c_int = 7;
    // The two calls of the C library are declared here rather than taken from
    // the libc crate, which this package has only among its test dependencies.
    unsafe extern "C" {
        fn getrlimit(resource: std::ffi::c_int, limit: *mut Rlimit) -> std::ffi::c_int;
        fn setrlimit(resource: std::ffi::c_int, limit: *const Rlimit) -> std::ffi::c_int;
    }
    let mut limit = Rlimit { current: 0, max: 0 };
    // SAFETY: getrlimit(2) writes one `struct rlimit` into memory this
    // function owns, laid out as the C library's.
    if unsafe { getrlimit(RLIMIT_NOFILE, &mut limit) } != 0 {
        eprintln!("overload: getrlimit(RLIMIT_NOFILE): {}", std::io::Error::last_os_error());
        return (0, 0);
    }
    if limit.current < limit.max {
        let raised = Rlimit { current: limit.max, max: limit.max };
        // SAFETY: setrlimit(2) reads one `struct rlimit` this function owns.
        if unsafe { setrlimit(RLIMIT_NOFILE, &raised) } == 0 {
            limit.current = limit.max;
        } else {
            eprintln!("overload: setrlimit(RLIMIT_NOFILE): {}", std::io::Error::last_os_error());
        }
    }
    (limit.current, limit.max)
}

/// What one phase measured.
#[derive(Debug, Default)]
struct Phase {
    name: String,
    conns: usize,
    items: usize,
    accepted_per_sec: f64,
    p50_ms: f64,
    p99_ms: f64,
    outcomes: Outcomes,
    peak_rss_mib: f64,
    peak_held_mib: f64,
    /// What the cache accounts for, at its peak: most of the resident set
    /// that is not the intake's.
    peak_cache_mib: f64,
    peak_waiting: f64,
    /// Requests the gateway counted as waited for room and as shed.
    waited: f64,
    shed: f64,
    /// Requests whose clients hung up while they waited, dropped unread.
    abandoned: f64,
    after: Option<After>,
    exactness: Exactness,
}

/// What a burst left behind, and how the gateway ended.
#[derive(Debug, Default)]
struct After {
    /// From the end of the burst to a fresh push's 201, if one came: to a
    /// partition the burst pushed to (behind that partition's backlog), and
    /// to one it did not.
    first_201_s: Option<f64>,
    idle_201_s: Option<f64>,
    /// From the end of the burst to the first scrape with nothing held.
    held_zero_s: Option<f64>,
    /// The gateway's resident memory once both were measured, and
    /// [`SETTLE`] after the burst ended.
    rss_after_mib: f64,
    rss_settled_mib: f64,
    /// From SIGTERM to the process's exit, if it exited within the limit.
    exit_s: Option<f64>,
    exit_limit_s: f64,
    exit_status: String,
    /// How the second burst's attempts were answered.
    second: Outcomes,
}

/// How the attempts of a phase were answered.
#[derive(Clone, Debug, Default)]
struct Outcomes {
    attempts: u64,
    created: u64,
    shed: u64,
    /// The 503s by the reason their body gives, numbers written `#`.
    shed_reasons: BTreeMap<String, u64>,
    /// Every other answer or error, by kind (`status 500`, `exchange: …`).
    other: BTreeMap<String, u64>,
    /// The longest attempt answered 201, answered 503, and cut short when
    /// the phase ended, from its first byte sent to its answer's last.
    longest_created: Duration,
    longest_shed: Duration,
    longest_cut: Duration,
}

impl Outcomes {
    fn add(&mut self, other: &Outcomes) {
        self.attempts += other.attempts;
        self.created += other.created;
        self.shed += other.shed;
        for (kind, n) in &other.other {
            *self.other.entry(kind.clone()).or_default() += n;
        }
        for (reason, n) in &other.shed_reasons {
            *self.shed_reasons.entry(reason.clone()).or_default() += n;
        }
        self.longest_created = self.longest_created.max(other.longest_created);
        self.longest_shed = self.longest_shed.max(other.longest_shed);
        self.longest_cut = self.longest_cut.max(other.longest_cut);
    }

    fn others(&self) -> u64 {
        self.other.values().sum()
    }

    fn record(&mut self, outcome: &Outcome, took: Duration) {
        self.attempts += 1;
        match outcome {
            Outcome::Created => {
                self.created += 1;
                self.longest_created = self.longest_created.max(took);
            }
            Outcome::Shed(_, reason) => {
                self.shed += 1;
                self.longest_shed = self.longest_shed.max(took);
                *self.shed_reasons.entry(reason.clone()).or_default() += 1;
            }
            Outcome::Other(kind) => *self.other.entry(kind.clone()).or_default() += 1,
        }
    }
}

/// What the phase's queue holds against what its clients sent.
#[derive(Debug, Default)]
struct Exactness {
    acked_requests: u64,
    acked_ids: u64,
    /// Acknowledged ids not stored.
    lost: u64,
    /// Rows beyond the first of an id.
    stored_twice: u64,
    unacked_ids: u64,
    unacked_stored: u64,
    /// Of them, ids of requests cut when the first burst ended (or by the
    /// end of a baseline): requests the gateway took on for clients that
    /// had already gone.
    unacked_stored_first: u64,
    /// Stored ids no client of the phase sent.
    unknown: u64,
}

/// Every request a phase's clients sent: (tag, seq) → (messages, answered 201).
type Ledger = HashMap<(String, u64), (u64, bool)>;

async fn run(args: Args) {
    let t = fresh_database().await;
    let pg = t.client().await;
    pg.batch_execute("SET work_mem = '1GB'").await.expect("raise work_mem for the read-back");
    let version = server_version(&pg).await;
    let load_before = load_average();
    let mut phases = Vec::new();
    for (index, &shape) in args.shapes.iter().enumerate() {
        for burst in [false, true] {
            let conns = if burst { shape.conns } else { args.baseline_conns };
            let name = format!("{}-{conns}x{}", if burst { "burst" } else { "baseline" }, shape.items);
            // A gateway and a queue of their own for each phase: every phase
            // starts from an empty cache and a fresh process, so that what
            // one phase left (a full cache budget, the allocator's
            // high-water mark) does not weigh on the next.
            let mut gw = Gateway::start(&t.url()).await;
            let queue = format!("overload-{index}-{name}");
            eprintln!("overload: {name} (load average {})", load_average());
            let (phase, ledger) = phase(&mut gw, &args, &queue, name, Shape { conns, items: shape.items }, burst).await;
            drop(gw);
            let exactness = read_back(&pg, &queue, &ledger).await;
            let phase = Phase { exactness, ..phase };
            eprintln!("  {phase:?}");
            phases.push(phase);
        }
    }
    print(&args, &phases, &version, &load_before);
    drop(pg);
    drop(t);
}

fn print(args: &Args, phases: &[Phase], version: &str, load_before: &str) {
    let retry = if args.honor_retry_after {
        "clients sleep for a 503's Retry-After, and retry an error at once"
    } else {
        "clients retry a 503 or an error at once"
    };
    println!();
    println!(
        "Overload: {} s per phase, {} partitions, {} % byte-for-byte retries, {retry}; a fresh gateway with its \
         defaults (STILE_* as set) for each phase; PostgreSQL {version}; {}; load average {load_before} before, {} after",
        args.secs,
        args.partitions,
        args.retry_percent,
        machine(),
        load_average()
    );
    println!();
    println!(
        "| phase | connections | msgs/request | accepted msg/s | vs {} connections | p50 ms | p99 ms \
         | longest attempt s: 201 / 503 / cut | attempts | 503 | other outcomes | peak RSS MiB | peak cache MiB | peak held MiB | peak waiting | waited | shed | abandoned |",
        args.baseline_conns
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut baseline = f64::NAN;
    for p in phases {
        if p.after.is_none() {
            baseline = p.accepted_per_sec;
        }
        let o = &p.outcomes;
        println!(
            "| {} | {} | {} | {:.0} | {:.2}x | {:.0} | {:.0} | {:.1} / {:.1} / {:.1} | {} | {:.1} % | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |",
            p.name,
            p.conns,
            p.items,
            p.accepted_per_sec,
            p.accepted_per_sec / baseline,
            p.p50_ms,
            p.p99_ms,
            o.longest_created.as_secs_f64(),
            o.longest_shed.as_secs_f64(),
            o.longest_cut.as_secs_f64(),
            o.attempts,
            100.0 * o.shed as f64 / o.attempts.max(1) as f64,
            o.others(),
            p.peak_rss_mib,
            p.peak_cache_mib,
            p.peak_held_mib,
            p.peak_waiting,
            p.waited,
            p.shed,
            p.abandoned
        );
    }
    let secs = |s: Option<f64>, limit: f64| s.map_or_else(|| format!("> {limit:.0}"), |s| format!("{s:.2}"));
    println!();
    println!(
        "| burst | 201 after the burst s: busy / idle partition | held 0 after s | RSS then MiB | RSS {} s after MiB | exit after SIGTERM s (limit) \
         | 2nd burst attempts: 201 / 503 / other |",
        SETTLE.as_secs()
    );
    println!("|---|---:|---:|---:|---:|---:|---|");
    for p in phases {
        let Some(a) = &p.after else { continue };
        println!(
            "| {} | {} / {} | {} | {:.0} | {:.0} | {} ({:.0}, {}) | {} / {} / {} |",
            p.name,
            secs(a.first_201_s, args.recovery_limit),
            secs(a.idle_201_s, args.recovery_limit),
            secs(a.held_zero_s, args.recovery_limit),
            a.rss_after_mib,
            a.rss_settled_mib,
            secs(a.exit_s, a.exit_limit_s),
            a.exit_limit_s,
            a.exit_status,
            a.second.created,
            a.second.shed,
            a.second.others()
        );
    }
    println!();
    println!(
        "| phase | requests acknowledged | ids acknowledged | acknowledged ids lost | stored twice \
         | unacknowledged ids | of them stored | of those, cut when the first burst ended | stored ids never sent |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for p in phases {
        let e = &p.exactness;
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            p.name,
            e.acked_requests,
            e.acked_ids,
            e.lost,
            e.stored_twice,
            e.unacked_ids,
            e.unacked_stored,
            e.unacked_stored_first,
            e.unknown
        );
    }
    let others: Vec<String> = phases
        .iter()
        .flat_map(|p| {
            let second = p.after.as_ref().map(|a| &a.second.other);
            let second = second.into_iter().flatten().map(move |(kind, n)| format!("{} (2nd burst): {kind}: {n}", p.name));
            p.outcomes.other.iter().map(move |(kind, n)| format!("{}: {kind}: {n}", p.name)).chain(second)
        })
        .collect();
    if !others.is_empty() {
        println!();
        println!("Other outcomes: {}", others.join("; "));
    }
    let reasons: Vec<String> = phases
        .iter()
        .flat_map(|p| p.outcomes.shed_reasons.iter().map(move |(reason, n)| format!("{}: \"{reason}\": {n}", p.name)))
        .collect();
    if !reasons.is_empty() {
        println!();
        println!("503s by reason: {}", reasons.join("; "));
    }
}

/// One phase: `shape.conns` connections for `--secs`, the gateway's intake
/// sampled every 100 ms; for a burst, then, the recovery, a second burst
/// and SIGTERM.
async fn phase(gw: &mut Gateway, args: &Args, queue: &str, name: String, shape: Shape, burst: bool) -> (Phase, Ledger) {
    let addr = gw.addr();
    let pid = gw.pid();
    let mut observer = gw.client().await;
    // Its own connection, so that the recovery is watched from the instant
    // the burst ends, while the sampler may still be in a scrape.
    let mut watcher = gw.client().await;
    let before = observer.metrics().await;
    let mut ledger = Ledger::new();
    let tags = Tags { queue: queue.to_owned(), prefix: FIRST_BURST, shape };
    let (stop, stopped) = watch::channel(false);
    let tasks = spawn_pushers(addr, args, &tags, &stopped).await;
    let start = Instant::now();
    let sampler = {
        let stopped = stopped.clone();
        tokio::spawn(async move {
            let (mut held, mut waiting, mut cache) = (0f64, 0f64, 0f64);
            let mut ticker = tokio::time::interval(Duration::from_millis(100));
            while !*stopped.borrow() {
                ticker.tick().await;
                let text = observer.metrics().await;
                held = held.max(metric(&text, "stile_held_request_bytes"));
                waiting = waiting.max(metric(&text, "stile_requests_waiting_for_room"));
                cache = cache.max(metric_total(&text, "stile_cache_bytes"));
            }
            (held, waiting, cache, observer)
        })
    };
    tokio::time::sleep_until((start + Duration::from_secs_f64(args.secs)).into()).await;
    let _ = stop.send(true);
    let ended = Instant::now();
    let limit = Duration::from_secs_f64(args.recovery_limit);
    // The probes' ids, `probe-0-0` in partition 0 (one the burst pushed
    // to) and `idle-0-0` in a partition past the burst's, in the phase's
    // own queue.
    let probe_tag = "probe".to_owned();
    let idle_tag = "idle".to_owned();
    let recovery = async {
        if burst {
            let (first_201, idle_201, held_zero) = tokio::join!(
                probe(addr, queue, 0, &probe_tag, ended, limit),
                probe(addr, queue, args.partitions, &idle_tag, ended, limit),
                held_zero(&mut watcher, ended, limit)
            );
            (Some((first_201, idle_201)), Some(held_zero))
        } else {
            (None, None)
        }
    };
    let (sampled, tallies, (first_201, held_zero)) = tokio::join!(sampler, futures::future::join_all(tasks), recovery);
    let (peak_held, peak_waiting, peak_cache, mut observer) = sampled.expect("the sampler");
    let mut outcomes = Outcomes::default();
    let mut accepted = 0u64;
    let mut latencies: Vec<u32> = Vec::new();
    for tally in tallies {
        let tally = tally.expect("a connection task");
        accepted += tally.accepted_items;
        outcomes.add(&tally.outcomes);
        latencies.extend(tally.latencies_us.iter());
        tally.enter(&mut ledger, shape.items);
    }
    if let Some((first_201, idle_201)) = first_201 {
        ledger.insert((probe_tag, 0), (1, first_201.is_some()));
        ledger.insert((idle_tag, 0), (1, idle_201.is_some()));
    }
    latencies.sort_unstable();
    let now = observer.metrics().await;
    let counter = |name: &str| metric(&now, name) - metric(&before, name);
    let mib = f64::from(1 << 20);
    let mut phase = Phase {
        name,
        conns: shape.conns,
        items: shape.items,
        accepted_per_sec: accepted as f64 / ended.duration_since(start).as_secs_f64(),
        p50_ms: percentile_ms(&latencies, 50.0),
        p99_ms: percentile_ms(&latencies, 99.0),
        outcomes,
        // The kernel's high-water mark of the process's resident set: exact,
        // where sampling could miss a short peak.
        peak_rss_mib: proc_status_kib(pid, "VmHWM:") / 1024.0,
        peak_held_mib: peak_held / mib,
        peak_cache_mib: peak_cache / mib,
        peak_waiting,
        waited: counter("stile_requests_waited_for_room_total"),
        shed: counter("stile_requests_shed_total"),
        abandoned: counter("stile_requests_abandoned_total"),
        ..Phase::default()
    };
    if burst {
        let rss_after_mib = proc_status_kib(pid, "VmRSS:") / 1024.0;
        tokio::time::sleep_until((ended + SETTLE).into()).await;
        let rss_settled_mib = proc_status_kib(pid, "VmRSS:") / 1024.0;
        drop(observer);
        drop(watcher);
        let (exit_s, exit_limit_s, exit_status, second) = terminate_during_burst(gw, args, queue, shape, &mut ledger).await;
        phase.after = Some(After {
            first_201_s: first_201.and_then(|(busy, _)| busy),
            idle_201_s: first_201.and_then(|(_, idle)| idle),
            held_zero_s: held_zero.flatten(),
            rss_after_mib,
            rss_settled_mib,
            exit_s,
            exit_limit_s,
            exit_status,
            second,
        });
    }
    (phase, ledger)
}

/// How long after a burst its gateway's memory is read again, before the
/// second burst: the allocator gives back what was freed a second ago, once
/// a second.
const SETTLE: Duration = Duration::from_secs(10);

/// A second burst of the same shape; after `--term-after`, SIGTERM. Returns
/// the seconds from the signal to the process's exit (`None` if it had not
/// exited within the limit, and was killed), the limit, the exit status and
/// how the burst's attempts were answered.
async fn terminate_during_burst(
    gw: &mut Gateway,
    args: &Args,
    queue: &str,
    shape: Shape,
    ledger: &mut Ledger,
) -> (Option<f64>, f64, String, Outcomes) {
    let tags = Tags { queue: queue.to_owned(), prefix: SECOND_BURST, shape };
    let (stop, stopped) = watch::channel(false);
    let tasks = spawn_pushers(gw.addr(), args, &tags, &stopped).await;
    tokio::time::sleep(Duration::from_secs_f64(args.term_after)).await;
    // The README's bound: the shutdown timeout, then 5 s for the shards.
    let shutdown_timeout = std::env::var("STILE_SHUTDOWN_TIMEOUT").ok().and_then(|s| s.parse::<f64>().ok()).unwrap_or(30.0);
    let exit_limit_s = shutdown_timeout + 5.0;
    // Waited for past the bound, to tell a late exit from none.
    let patience = Duration::from_secs_f64(exit_limit_s + 30.0);
    let signalled = Instant::now();
    gw.process().terminate();
    let exited = tokio::time::timeout(patience, gw.process().wait_exit(patience + Duration::from_secs(1))).await;
    let exit_s = exited.is_ok().then(|| signalled.elapsed().as_secs_f64());
    let status = match exited {
        Ok(status) => status.to_string(),
        Err(_) => {
            gw.process().kill();
            format!("killed after {} s", patience.as_secs())
        }
    };
    let _ = stop.send(true);
    let mut outcomes = Outcomes::default();
    for tally in futures::future::join_all(tasks).await {
        let tally = tally.expect("a connection task");
        outcomes.add(&tally.outcomes);
        tally.enter(ledger, shape.items);
    }
    let logged: Vec<String> = gw
        .logs()
        .lines()
        .filter(|line| {
            ["shutting down", "shutdown timeout", "did not stop", "exiting without", "stile stopped"]
                .iter()
                .any(|s| line.contains(s))
        })
        .map(str::to_owned)
        .collect();
    eprintln!("  shutdown: {status}; the gateway logged:\n    {}", logged.join("\n    "));
    (exit_s, exit_limit_s, status, outcomes)
}

/// The `key` line of `/proc/<pid>/status` (`VmHWM:`, `VmRSS:`), in KiB; NaN
/// if it cannot be read.
fn proc_status_kib(pid: i32, key: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            let line = status.lines().find_map(|line| line.strip_prefix(key))?;
            line.trim().trim_end_matches("kB").trim().parse::<f64>().ok()
        })
        .unwrap_or(f64::NAN)
}

/// From `since` until a single-item push on a new connection answers 201, at
/// most `limit`: the seconds it took, or `None`. An attempt answered
/// otherwise is sent again after 10 ms, on a new connection.
async fn probe(addr: SocketAddr, queue: &str, partition: usize, tag: &str, since: Instant, limit: Duration) -> Option<f64> {
    let mut text = String::new();
    write_push_body(&mut text, queue, partition, tag, 0, 1);
    let body = Bytes::from(text);
    let give_up = since + limit;
    while Instant::now() < give_up {
        let mut conn = None;
        let outcome = tokio::time::timeout_at(give_up.into(), attempt(&mut conn, addr, body.clone())).await;
        match outcome {
            Ok(Outcome::Created) => return Some(since.elapsed().as_secs_f64()),
            Ok(outcome) => eprintln!("  probe at {:.2} s: {outcome:?}", since.elapsed().as_secs_f64()),
            Err(_) => break,
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

/// From `since` until a scrape finds `stile_held_request_bytes` at 0, at
/// most `limit`, scraping every 10 ms: the seconds it took, or `None`.
async fn held_zero(observer: &mut Client, since: Instant, limit: Duration) -> Option<f64> {
    while since.elapsed() < limit {
        if metric(&observer.metrics().await, "stile_held_request_bytes") == 0.0 {
            return Some(since.elapsed().as_secs_f64());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

/// Reads the queue back and holds it against what its clients sent.
async fn read_back(pg: &tokio_postgres::Client, queue: &str, ledger: &Ledger) -> Exactness {
    let rows = pg
        .query(
            "SELECT split_part(transaction_id, '-', 1) AS tag, split_part(transaction_id, '-', 2) AS seq, \
                    count(*) AS stored, count(DISTINCT transaction_id) AS ids \
               FROM stile.messages WHERE queue = $1 GROUP BY 1, 2",
            &[&queue],
        )
        .await
        .expect("read the phase's messages back");
    let mut e = Exactness::default();
    for &(items, acked) in ledger.values() {
        if acked {
            e.acked_requests += 1;
            e.acked_ids += items;
        } else {
            e.unacked_ids += items;
        }
    }
    let mut acked_stored = 0u64;
    for row in rows {
        let stored = u64::try_from(row.get::<_, i64>("stored")).unwrap_or(0);
        let ids = u64::try_from(row.get::<_, i64>("ids")).unwrap_or(0);
        e.stored_twice += stored - ids;
        let tag: String = row.get("tag");
        let first = !tag.starts_with(SECOND_BURST);
        let seq = row.get::<_, String>("seq").parse::<u64>().ok();
        match seq.and_then(|seq| ledger.get(&(tag, seq))) {
            Some(&(items, true)) => acked_stored += ids.min(items),
            Some(&(_, false)) => {
                e.unacked_stored += ids;
                if first {
                    e.unacked_stored_first += ids;
                }
            }
            None => e.unknown += ids,
        }
    }
    e.lost = e.acked_ids - acked_stored;
    e
}

/// The tags' prefix of a phase's connections, and of the second burst's,
/// the one SIGTERM interrupts.
const FIRST_BURST: &str = "c";
const SECOND_BURST: &str = "t";

/// The tags a burst's clients write their ids with: connection `c` of a
/// burst whose prefix is `c` sends `c{c}-{seq}-{i}`.
struct Tags {
    queue: String,
    prefix: &'static str,
    shape: Shape,
}

/// Opens the connections of a burst, one after the other, then starts a
/// pusher on each: the burst starts with every connection open.
async fn spawn_pushers(addr: SocketAddr, args: &Args, tags: &Tags, stopped: &watch::Receiver<bool>) -> Vec<JoinHandle<Tally>> {
    let mut conns = Vec::with_capacity(tags.shape.conns);
    for _ in 0..tags.shape.conns {
        conns.push(Conn::open(addr).await.ok());
    }
    conns
        .into_iter()
        .enumerate()
        .map(|(c, conn)| {
            let pusher = Pusher {
                addr,
                queue: tags.queue.clone(),
                tag: format!("{}{c}", tags.prefix),
                items: tags.shape.items,
                partitions: args.partitions,
                retry_percent: args.retry_percent,
                honor_retry_after: args.honor_retry_after,
                stopped: stopped.clone(),
            };
            tokio::spawn(pusher.run(conn))
        })
        .collect()
}

/// One client connection of a burst.
struct Pusher {
    addr: SocketAddr,
    queue: String,
    tag: String,
    items: usize,
    partitions: usize,
    retry_percent: u32,
    honor_retry_after: bool,
    stopped: watch::Receiver<bool>,
}

/// What one connection did.
#[derive(Default)]
struct Tally {
    tag: String,
    /// Items of requests answered 201.
    accepted_items: u64,
    /// Fresh requests sent: seqs 0 to this, all answered 201 but `unacked`.
    fresh: u64,
    /// The fresh request under way when the phase ended.
    unacked: Option<u64>,
    outcomes: Outcomes,
    /// Of every accepted request, from its first attempt to its 201.
    latencies_us: Vec<u32>,
}

impl Tally {
    /// Enters the connection's requests in `ledger`.
    fn enter(&self, ledger: &mut Ledger, items: usize) {
        for seq in 0..self.fresh {
            ledger.insert((self.tag.clone(), seq), (items as u64, self.unacked != Some(seq)));
        }
    }
}

impl Pusher {
    async fn run(mut self, mut conn: Option<Conn>) -> Tally {
        let seed = self.tag.bytes().fold(7u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut tally = Tally { tag: self.tag.clone(), ..Tally::default() };
        let mut history: Vec<Bytes> = Vec::new();
        'requests: while !*self.stopped.borrow() {
            let (body, fresh) = if !history.is_empty() && rng.random_range(0..100) < self.retry_percent {
                (history[rng.random_range(0..history.len())].clone(), None)
            } else {
                let partition = rng.random_range(0..self.partitions);
                let mut text = String::with_capacity(self.items * 120);
                let seq = tally.fresh;
                write_push_body(&mut text, &self.queue, partition, &self.tag, seq, self.items);
                tally.fresh += 1;
                let body = Bytes::from(text);
                if history.len() < 16 {
                    history.push(body.clone());
                }
                (body, Some(seq))
            };
            let first = Instant::now();
            // Sent again until answered 201: a retried push is safe by construction.
            loop {
                let sent = Instant::now();
                let outcome = tokio::select! {
                    biased;
                    _ = self.stopped.wait_for(|stopped| *stopped) => {
                        tally.outcomes.longest_cut = tally.outcomes.longest_cut.max(sent.elapsed());
                        tally.unacked = fresh;
                        break 'requests;
                    }
                    outcome = attempt(&mut conn, self.addr, body.clone()) => outcome,
                };
                tally.outcomes.record(&outcome, sent.elapsed());
                match outcome {
                    Outcome::Created => {
                        tally.accepted_items += self.items as u64;
                        tally.latencies_us.push(u32::try_from(first.elapsed().as_micros()).unwrap_or(u32::MAX));
                        break;
                    }
                    Outcome::Shed(retry_after, _) if self.honor_retry_after => {
                        tokio::select! {
                            biased;
                            _ = self.stopped.wait_for(|stopped| *stopped) => {
                                tally.unacked = fresh;
                                break 'requests;
                            }
                            () = tokio::time::sleep(retry_after.unwrap_or(Duration::from_secs(1))) => {}
                        }
                    }
                    Outcome::Shed(..) => tokio::task::yield_now().await,
                    Outcome::Other(_) => {
                        // The connection may be broken: the next attempt opens another.
                        conn = None;
                        tokio::task::yield_now().await;
                    }
                }
            }
        }
        // Dropping the connection aborts whatever attempt it had under way.
        drop(conn);
        tally
    }
}

/// How an attempt was answered.
#[derive(Debug)]
enum Outcome {
    Created,
    /// A 503, with its Retry-After and the reason its body gives.
    Shed(Option<Duration>, String),
    /// Any other status, or a transport error, by kind.
    Other(String),
}

/// An HTTP/1.1 connection whose task is aborted when it is dropped, so that
/// a request under way ends with it, its socket closed.
struct Conn {
    sender: SendRequest<Full<Bytes>>,
    task: JoinHandle<()>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Conn {
    async fn open(addr: SocketAddr) -> anyhow::Result<Conn> {
        let stream = TcpStream::connect(addr).await.context("connect")?;
        stream.set_nodelay(true)?;
        let (sender, connection) = http1::handshake(TokioIo::new(stream)).await.context("HTTP/1.1 handshake")?;
        let task = tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Conn { sender, task })
    }
}

/// One push of `body` on `conn`, opened (again) first when it is closed.
async fn attempt(conn: &mut Option<Conn>, addr: SocketAddr, body: Bytes) -> Outcome {
    match exchange(conn, addr, body).await {
        Ok((201, _, _)) => Outcome::Created,
        Ok((503, retry_after, body)) => Outcome::Shed(retry_after, reason(&body)),
        Ok((status, _, body)) => Outcome::Other(format!("status {status}: {}", reason(&body))),
        Err(error) => {
            *conn = None;
            Outcome::Other(format!("{error:#}"))
        }
    }
}

/// The `"error"` of an answer's body, its numbers written `#` so that
/// reasons that differ only in them are counted together.
fn reason(body: &Bytes) -> String {
    let error = serde_json::from_slice::<serde_json::Value>(body).ok().and_then(|v| v["error"].as_str().map(str::to_owned));
    let error = error.unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(80)]).into_owned());
    let mut out = String::new();
    for c in error.chars().take(100) {
        if !(c.is_ascii_digit() && out.ends_with('#')) {
            out.push(if c.is_ascii_digit() { '#' } else { c });
        }
    }
    out
}

/// The status of the answer, its Retry-After and its body.
async fn exchange(conn: &mut Option<Conn>, addr: SocketAddr, body: Bytes) -> anyhow::Result<(u16, Option<Duration>, Bytes)> {
    let ready = match conn {
        Some(open) => open.sender.ready().await.is_ok(),
        None => false,
    };
    if !ready {
        // Never opened, or closed by the gateway since the last exchange.
        let mut fresh = Conn::open(addr).await?;
        fresh.sender.ready().await.context("a fresh connection is not ready")?;
        *conn = Some(fresh);
    }
    let open = conn.as_mut().expect("a connection is open");
    let request = Request::builder()
        .method(Method::POST)
        .uri("/api/v1/push")
        .header(HOST, addr.to_string())
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(body))
        .context("build the request")?;
    let response = open.sender.send_request(request).await.context("exchange")?;
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let body = response.into_body().collect().await.context("read the answer")?.to_bytes();
    Ok((status, retry_after, body))
}
