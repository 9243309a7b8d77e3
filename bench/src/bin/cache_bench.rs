//! The deduplication cache on the event-window workload of seed 004, against
//! the seed's textbook bucket ring.
//!
//! ```text
//! cargo build --release -p stile-bench --bin cache_bench
//! target/release/cache_bench [all]
//! target/release/cache_bench baseline|baseline128|native|wasm [--flush 1024] [--runs 3] [--events 10000000]
//! ```
//!
//! The workload: 10 M events at 100 k events per second of simulated time
//! (100 s), a 60 s window, 10 % redeliveries (an event re-sends a random id
//! first seen 1 to 31 s earlier), so about 5.4 M distinct ids are in the
//! window at the peak. Every redelivery is a duplicate and every other event
//! a first sighting, for every mode; each mode counts how many of its
//! verdicts disagree with that.
//!
//! - `baseline`: the seed's `DedupWindow` (a `VecDeque` of one-second buckets
//!   over a SipHash `HashSet<u64>`), ids as u64.
//! - `baseline128`: the same ring over the ids' 16-byte hashes (`u128`), the
//!   key the cache holds, hashed outside the timed part as for the cache.
//! - `native`: `stile_guest::Shard`, one partition hydrated empty, a 60 s
//!   window with the gateway's 5 s of slack. Events go in flushes of F: the
//!   ids are hashed (xxh3-128 of the decimal id), the flush is planned, the
//!   local hits are the duplicates, and the rest is recorded as one commit at
//!   `verified_upto + 1`.
//! - `wasm`: the same through the embedded component in wasmtime.
//! - `all`: runs each mode (the cache's with F = 64 and 1,024) in its own process, so that
//!   peak RSS is per mode, and prints one table.
//!
//! Times are the median of the runs; only the dedup work is timed (the seed
//! structure's calls; the cache's plan and record calls), the workload
//! generator is not. Hashing the ids, which the gateway does for SQL anyway,
//! is timed separately. The machine may be shared: each run reads how much of
//! its wall time its thread spent on a CPU (`/proc/thread-self/schedstat`)
//! and scales the timed wall-clock figures by that share ("ns on CPU"); the
//! raw wall-clock figures are printed too. Other processes still compete for
//! caches and memory bandwidth, which no scaling removes.

use std::collections::{HashSet, VecDeque};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::{Value, json};
use stile_bench::{count, load_average, machine, median};
use stile_guest::{
    Admission, Commit, DedupCache, EntryState, HASH_LEN, Hydration, Millis, NO_VOUCH, Offset, PartitionId, Segment, Shard,
    ShardConfig, Stats,
};
use stile_tests::component::{self, HealthyShard};

/// The deduplication cache, native and as the component, against the seed's
/// bucket ring, on the event-window workload of seed 004.
#[derive(Debug, Parser)]
#[command(
    name = "cache_bench",
    about = "The dedup cache (native and wasm) against seed 004's bucket ring, on its event-window workload"
)]
struct Args {
    /// What to run: `all` runs every mode in a process of its own (so that peak RSS is per mode, and the cache's
    /// modes at flushes of 64 and 1,024) and prints one table; any other mode runs alone, in this process.
    #[arg(value_enum, default_value = "all")]
    mode: Mode,
    /// Events per flush, planned and recorded by one call each (the cache's modes, run alone).
    #[arg(long, default_value = "1024", value_parser = count::<usize>)]
    flush: usize,
    /// Runs per mode; the times reported are their median.
    #[arg(long, default_value = "3", value_parser = count::<usize>)]
    runs: usize,
    /// Events in the workload, at 100,000 per second of simulated time.
    #[arg(long, default_value = "10000000", value_parser = count::<u64>)]
    events: u64,
}

fn main() {
    let Args { mode, flush, runs, events } = Args::parse();
    if mode == Mode::All {
        all(runs, events);
    } else {
        let row = measure(mode, flush, runs, events);
        // The line `all` reads back from the process it started.
        println!("RESULT {row}");
        print_table(std::slice::from_ref(&row), runs, events);
    }
}

/// What a run measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Mode {
    /// Every other mode, each in a process of its own.
    All,
    /// The seed's ring over u64 ids.
    Baseline,
    /// The seed's ring over the ids' 16-byte hashes.
    #[value(name = "baseline128")]
    Baseline128,
    /// `stile_guest::Shard`.
    Native,
    /// The embedded component in wasmtime.
    Wasm,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::All => "all",
            Mode::Baseline => "baseline",
            Mode::Baseline128 => "baseline128",
            Mode::Native => "native",
            Mode::Wasm => "wasm",
        }
    }

    fn is_cache(self) -> bool {
        matches!(self, Mode::Native | Mode::Wasm)
    }
}

/// Events per second of simulated time.
const RATE: u64 = 100_000;
const WINDOW_SECS: u64 = 60;
const REDELIVERY_PERCENT: u64 = 10;
/// Redeliveries re-send an id first seen in the seconds `[s - SPAN, s - 2]`.
const REDELIVERY_SPAN_SECS: u64 = 30;
const T0_MS: Millis = 1_700_000_000_000;
const PARTITION: PartitionId = 1;
const CONFIG: ShardConfig = ShardConfig { budget_bytes: 1 << 34, skew_slack_ms: ShardConfig::DEFAULT_SKEW_SLACK_MS };
/// The steady state: by then the small generations the cache made while its
/// window filled (in the first ~11 s) have expired (window + slack later),
/// and the ring holds only full-size generations.
const STEADY_FROM_MS: u64 = 80_000;
/// Events per timed slice of the baseline.
const BASELINE_SLICE: usize = 1_024;

// ---------------------------------------------------------------------------
// The seed's structure, as the seed writes it.

/// Remembers every accepted id for at least (buckets-1) * bucket_secs and at most buckets * bucket_secs.
///
/// Generic over the id only so that the same code also runs on the
/// gateway's 16-byte hashes (`baseline128`); the seed's is `DedupWindow<u64>`.
struct DedupWindow<Id> {
    bucket_secs: u64,
    max_buckets: usize,
    head: u64,                  // index (time / bucket_secs) of the newest bucket
    buckets: VecDeque<Vec<Id>>, // ids per time bucket, newest at the front
    seen: HashSet<Id>,          // union of all buckets: one lookup per event
}

impl<Id: Copy + Eq + std::hash::Hash> DedupWindow<Id> {
    fn new(bucket_secs: u64, max_buckets: usize) -> Self {
        let mut buckets = VecDeque::new();
        buckets.push_front(Vec::new());
        DedupWindow { bucket_secs, max_buckets, head: 0, buckets, seen: HashSet::new() }
    }

    fn advance(&mut self, now: u64) {
        let idx = now / self.bucket_secs;
        if idx.saturating_sub(self.head) >= self.max_buckets as u64 {
            self.seen.clear(); // idle longer than the window
            self.buckets.clear();
            self.buckets.push_front(Vec::new());
            self.head = idx;
        }
        while self.head < idx {
            self.buckets.push_front(Vec::new());
            self.head += 1;
            if self.buckets.len() > self.max_buckets {
                for id in self.buckets.pop_back().unwrap() {
                    self.seen.remove(&id);
                }
            }
        }
    }

    /// true = first sighting, process it; false = duplicate, drop and ack it.
    fn first_seen(&mut self, id: Id, now: u64) -> bool {
        self.advance(now);
        if !self.seen.insert(id) {
            return false;
        }
        self.buckets[0].push(id);
        true
    }

    fn held(&self) -> usize {
        self.seen.len()
    }
}

// ---------------------------------------------------------------------------
// The workload.

#[derive(Clone, Copy, Debug)]
struct Event {
    id: u64,
    /// Simulated time since the start.
    ms: u64,
    /// Whether this event re-sends an id seen before (the truth every mode's
    /// verdicts are checked against).
    redelivery: bool,
}

/// The event stream, generated on the fly so that it costs no memory.
struct Workload {
    total: u64,
    next: u64,
    /// Distinct ids issued so far; id `k` is `splitmix(k)`.
    fresh: u64,
    /// `fresh` at the start of each simulated second.
    fresh_at_second: Vec<u64>,
    rng: u64,
}

impl Workload {
    fn new(total: u64) -> Workload {
        Workload { total, next: 0, fresh: 0, fresh_at_second: Vec::new(), rng: 0x5eed_0004 }
    }

    fn random(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.rng)
    }

    /// Replaces `out` with the next `n` events; false when none are left.
    fn fill(&mut self, out: &mut Vec<Event>, n: usize) -> bool {
        out.clear();
        while out.len() < n && self.next < self.total {
            let index = self.next;
            self.next += 1;
            let second = index / RATE;
            if index.is_multiple_of(RATE) {
                self.fresh_at_second.push(self.fresh);
            }
            let ms = index * 1_000 / RATE;
            let roll = self.random();
            if second >= 2 && roll % 100 < REDELIVERY_PERCENT {
                let lo = self.fresh_at_second[second.saturating_sub(REDELIVERY_SPAN_SECS) as usize];
                let hi = self.fresh_at_second[second as usize - 1];
                let seq = lo + self.random() % (hi - lo);
                out.push(Event { id: mix(seq), ms, redelivery: true });
            } else {
                out.push(Event { id: mix(self.fresh), ms, redelivery: false });
                self.fresh += 1;
            }
        }
        !out.is_empty()
    }
}

/// splitmix64's finalizer: a bijection, so distinct sequence numbers give
/// distinct ids.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The gateway's dedup key of an id: xxh3-128 of its decimal string,
/// big-endian.
fn hash_id(id: u64, out: &mut Vec<u8>) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = id;
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    out.extend_from_slice(&xxhash_rust::xxh3::xxh3_128(&digits[at..]).to_be_bytes());
}

// ---------------------------------------------------------------------------
// One run.

/// What one run measured. Every field but the times is deterministic.
#[derive(Clone, Debug, Default)]
struct Run {
    timed: Duration,
    /// The cache's share of `timed`: plan calls, and building plus
    /// recording the commits.
    planning: Duration,
    hashing: Duration,
    events: u64,
    duplicates: u64,
    /// Verdicts that disagree with the workload's truth.
    mismatches: u64,
    /// The most ids (hashes) held at once.
    held_peak: u64,
    /// The cache's own accounting at its peak, and the hashes it held then.
    cache_bytes_peak: u64,
    cache_hashes_at_bytes_peak: u64,
    /// Bloom probes: one per hash per live generation.
    probes: u64,
    generations_max: u64,
    stats: Stats,
    flushes: u64,
    vouched_flushes: u64,
    /// `timed` and the event count from [`STEADY_FROM_MS`] on.
    steady: Duration,
    steady_events: u64,
    /// The share of the run's wall time this thread spent on a CPU.
    cpu_share: f64,
}

impl Run {
    /// Nanoseconds per event of a wall-clock duration, scaled by the share
    /// of the run's wall time this thread was on a CPU: on a shared machine
    /// the timed parts lose the same share to other processes as the rest.
    fn per_event(&self, duration: Duration) -> f64 {
        duration.as_nanos() as f64 * self.cpu_share / self.events as f64
    }

    /// Adds the time a slice of events took.
    fn account(&mut self, slice: &[Event], elapsed: Duration) {
        self.timed += elapsed;
        if slice.first().is_some_and(|event| event.ms >= STEADY_FROM_MS) {
            self.steady += elapsed;
            self.steady_events += slice.len() as u64;
        }
    }
}

/// The ids the seed's ring holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BaselineIds {
    /// The workload's u64 ids, as the seed holds them.
    U64,
    /// The ids' 16-byte hashes, the key the cache holds: hashed outside the
    /// timed part, as for the cache.
    Hashes,
}

/// The seed's ring over `ids`.
fn run_baseline(events: u64, ids: BaselineIds) -> Run {
    let mut narrow = DedupWindow::<u64>::new(1, WINDOW_SECS as usize);
    let mut wide_window = DedupWindow::<u128>::new(1, WINDOW_SECS as usize);
    let mut workload = Workload::new(events);
    let mut slice = Vec::with_capacity(BASELINE_SLICE);
    let mut hashes = Vec::with_capacity(BASELINE_SLICE * HASH_LEN);
    let mut verdicts = Vec::with_capacity(BASELINE_SLICE);
    let mut run = Run::default();
    while workload.fill(&mut slice, BASELINE_SLICE) {
        verdicts.clear();
        if ids == BaselineIds::Hashes {
            let start = Instant::now();
            hashes.clear();
            for event in &slice {
                hash_id(event.id, &mut hashes);
            }
            run.hashing += start.elapsed();
            let start = Instant::now();
            for (event, hash) in slice.iter().zip(hashes.chunks_exact(HASH_LEN)) {
                let hash = u128::from_be_bytes(hash.try_into().expect("16 bytes"));
                verdicts.push(wide_window.first_seen(hash, event.ms / 1_000));
            }
            run.account(&slice, start.elapsed());
        } else {
            let start = Instant::now();
            for event in &slice {
                verdicts.push(narrow.first_seen(event.id, event.ms / 1_000));
            }
            run.account(&slice, start.elapsed());
        }
        for (event, &first) in slice.iter().zip(&verdicts) {
            run.events += 1;
            run.duplicates += u64::from(!first);
            run.mismatches += u64::from(first == event.redelivery);
        }
        run.held_peak = run.held_peak.max(narrow.held().max(wide_window.held()) as u64);
    }
    run
}

fn run_cache(cache: &mut impl DedupCache, events: u64, flush: usize) -> Run {
    let window_ms = WINDOW_SECS * 1_000;
    assert_eq!(cache.admit(T0_MS, PARTITION, window_ms, 0), Admission::Hydrate);
    let empty = Hydration { partition: PARTITION, window_ms, last_offset: NO_VOUCH, rows: &[] };
    assert_eq!(cache.hydrate(T0_MS, &empty), Ok(()));
    let mut last_offset: Offset = NO_VOUCH;
    let mut workload = Workload::new(events);
    let mut slice = Vec::with_capacity(flush);
    let mut hashes = Vec::with_capacity(flush * HASH_LEN);
    let mut fresh = Vec::with_capacity(flush * HASH_LEN);
    let mut run = Run::default();
    while workload.fill(&mut slice, flush) {
        let start = Instant::now();
        hashes.clear();
        for event in &slice {
            hash_id(event.id, &mut hashes);
        }
        run.hashing += start.elapsed();
        let now_ms = T0_MS + slice.last().expect("a non-empty flush").ms as Millis;

        let start = Instant::now();
        let plan = cache.plan(now_ms, &[Segment { partition: PARTITION, window_ms, hashes: &hashes }]).pop().expect("one plan");
        let planning = start.elapsed();
        run.planning += planning;

        // The generations this plan probed (planning expires first, and
        // nothing is added before the commit below).
        let stats = cache.stats();
        run.probes += slice.len() as u64 * stats.generations;
        run.generations_max = run.generations_max.max(stats.generations);

        let start = Instant::now();
        fresh.clear();
        let mut hits = plan.local_hits.iter().peekable();
        for (index, hash) in hashes.chunks_exact(HASH_LEN).enumerate() {
            if hits.next_if_eq(&&(index as u32)).is_none() {
                fresh.extend_from_slice(hash);
            }
        }
        if !fresh.is_empty() {
            let commit = Commit { partition: PARTITION, base_offset: last_offset + 1, created_ms: now_ms, hashes: &fresh };
            cache.record_commits(now_ms, &[commit]);
        }
        run.account(&slice, planning + start.elapsed());

        assert_eq!(plan.state, EntryState::Vouching, "the partition stays hydrated");
        if plan.local_hits.is_empty() {
            assert_eq!(plan.p_verified, last_offset, "a complete entry vouches for the allocator");
            run.vouched_flushes += 1;
        } else {
            assert!((NO_VOUCH..last_offset).contains(&plan.p_verified), "a hit narrows below the allocator");
        }
        last_offset += (fresh.len() / HASH_LEN) as Offset;
        run.flushes += 1;
        let mut hits = plan.local_hits.iter().peekable();
        for (index, event) in slice.iter().enumerate() {
            let hit = hits.next_if_eq(&&(index as u32)).is_some();
            run.events += 1;
            run.duplicates += u64::from(hit);
            run.mismatches += u64::from(hit != event.redelivery);
        }
        let stats = cache.stats();
        run.held_peak = run.held_peak.max(stats.hashes);
        if stats.bytes > run.cache_bytes_peak {
            run.cache_bytes_peak = stats.bytes;
            run.cache_hashes_at_bytes_peak = stats.hashes;
        }
    }
    run.stats = cache.stats();
    run
}

// ---------------------------------------------------------------------------
// One mode, in this process.

/// The time this thread has spent on a CPU (the first field of its
/// schedstat, in nanoseconds).
fn on_cpu() -> Duration {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|stat| stat.split_whitespace().next().and_then(|ns| ns.parse().ok()))
        .map_or(Duration::ZERO, Duration::from_nanos)
}

/// `VmHWM` and `VmRSS` of this process, in bytes.
fn memory() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1_024)
    };
    (field("VmHWM:"), field("VmRSS:"))
}

/// Runs one mode (not `all`) `runs` times in this process, and answers its
/// figures as the JSON object `all` reads back.
fn measure(mode: Mode, flush: usize, runs: usize, events: u64) -> Value {
    let (_, rss_start) = memory();
    if mode == Mode::Wasm {
        // Compiled before `rss_ready`, so that the runtime's own memory is
        // measured apart from the cache's.
        component::engine();
    }
    let (_, rss_ready) = memory();
    let mut results: Vec<Run> = Vec::new();
    let mut peaks = Vec::new();
    for _ in 0..runs {
        let (wall_start, cpu_start) = (Instant::now(), on_cpu());
        let mut run = match mode {
            Mode::Baseline => run_baseline(events, BaselineIds::U64),
            Mode::Baseline128 => run_baseline(events, BaselineIds::Hashes),
            Mode::Native => run_cache(&mut Shard::new(CONFIG), events, flush),
            // Checked after every call: a trapped instance answers like an
            // empty cache, which would make the figures lie.
            Mode::Wasm => run_cache(&mut HealthyShard::new(CONFIG), events, flush),
            Mode::All => unreachable!("`all` runs each mode in a process of its own"),
        };
        let cpu = on_cpu().saturating_sub(cpu_start);
        // Without schedstat (no such file), wall time is all there is.
        run.cpu_share = if cpu.is_zero() { 1.0 } else { (cpu.as_secs_f64() / wall_start.elapsed().as_secs_f64()).min(1.0) };
        peaks.push(memory().0);
        eprintln!(
            "  {}{}: {:.1} ns/event on CPU ({:.1} wall, {:.0} % of the wall time on CPU), +{:.1} hashing, peak RSS {:.1} MB",
            mode.name(),
            if mode.is_cache() { format!(" F={flush}") } else { String::new() },
            run.per_event(run.timed),
            run.timed.as_nanos() as f64 / run.events as f64,
            run.cpu_share * 100.0,
            run.per_event(run.hashing),
            memory().0 as f64 / 1e6
        );
        if let Some(first) = results.first() {
            assert_eq!(
                (first.duplicates, first.mismatches, first.held_peak, first.stats.bloom_maybes),
                (run.duplicates, run.mismatches, run.held_peak, run.stats.bloom_maybes),
                "runs are deterministic"
            );
        }
        results.push(run);
    }
    let ns = median(results.iter().map(|run| run.per_event(run.timed)));
    let wall_ns = median(results.iter().map(|run| run.timed.as_nanos() as f64 / run.events as f64));
    let hash_ns = median(results.iter().map(|run| run.per_event(run.hashing)));
    let steady_ns =
        median(results.iter().map(|run| run.steady.as_nanos() as f64 * run.cpu_share / run.steady_events.max(1) as f64));
    let plan_ns = median(results.iter().map(|run| run.per_event(run.planning)));
    let run = &results[0];
    // The peak of the first run: later runs reuse memory the allocator kept.
    let peak = peaks[0];
    let s = run.stats;
    let cache = mode.is_cache();
    let negatives = s.hashes_checked.saturating_sub(s.local_hits);
    json!({
        "mode": mode.name(),
        "flush": if cache { json!(flush) } else { Value::Null },
        "runs": runs,
        "events": run.events,
        "ns_per_event": ns,
        "steady_ns_per_event": if run.steady_events > 0 { json!(steady_ns) } else { Value::Null },
        "ns_all_runs": results.iter().map(|run| run.per_event(run.timed)).collect::<Vec<_>>(),
        "wall_ns_per_event": wall_ns,
        "cpu_shares": results.iter().map(|run| run.cpu_share).collect::<Vec<_>>(),
        "hash_ns_per_event": if mode == Mode::Baseline { Value::Null } else { json!(hash_ns) },
        "plan_ns_per_event": if cache { json!(plan_ns) } else { Value::Null },
        "record_ns_per_event": if cache { json!(ns - plan_ns) } else { Value::Null },
        "duplicates": run.duplicates,
        "accepted": run.events - run.duplicates,
        "mismatches": run.mismatches,
        "held_peak": run.held_peak,
        "rss_start": rss_start,
        "rss_ready": rss_ready,
        "rss_peak": peak,
        "rss_peaks": peaks,
        "rss_bytes_per_held": peak as f64 / run.held_peak as f64,
        "rss_net_bytes_per_held": peak.saturating_sub(rss_ready) as f64 / run.held_peak as f64,
        "cache_bytes_peak": run.cache_bytes_peak,
        "cache_bytes_per_hash": if run.cache_hashes_at_bytes_peak == 0 { Value::Null }
            else { json!(run.cache_bytes_peak as f64 / run.cache_hashes_at_bytes_peak as f64) },
        "hashes_checked": s.hashes_checked,
        "bloom_maybes": s.bloom_maybes,
        "local_hits": s.local_hits,
        "probes": run.probes,
        // False "maybe"s per bloom probe of a hash its generation does not
        // hold, and per fresh hash (any generation).
        "fpr_per_probe": if !cache { Value::Null }
            else { json!((s.bloom_maybes - s.local_hits) as f64 / (run.probes - s.local_hits) as f64) },
        "exact_checks_per_fresh": if !cache { Value::Null }
            else { json!((s.bloom_maybes - s.local_hits) as f64 / negatives as f64) },
        "generations_max": run.generations_max,
        "probes_per_hash": if cache { json!(run.probes as f64 / run.events as f64) } else { Value::Null },
        "generations_end": s.generations,
        "expired_generations": s.expired_generations,
        "flushes": run.flushes,
        "vouched_flushes": run.vouched_flushes,
    })
}

// ---------------------------------------------------------------------------
// All modes, one process each.

fn all(runs: usize, events: u64) {
    let exe = std::env::current_exe().expect("this binary's path");
    let modes: [(Mode, usize); 6] = [
        (Mode::Baseline, 0),
        (Mode::Baseline128, 0),
        (Mode::Native, 64),
        (Mode::Native, 1_024),
        (Mode::Wasm, 64),
        (Mode::Wasm, 1_024),
    ];
    let mut rows: Vec<Value> = Vec::new();
    let started = Instant::now();
    let load_before = load_average();
    for (mode, flush) in modes {
        let mode = mode.name();
        eprintln!("{mode} F={flush} ...");
        let output = Command::new(&exe)
            .args([mode, "--flush", &flush.max(1).to_string(), "--runs", &runs.to_string(), "--events", &events.to_string()])
            .stderr(Stdio::inherit())
            .output()
            .expect("run a mode");
        assert!(output.status.success(), "{mode} F={flush} failed");
        let stdout = String::from_utf8(output.stdout).expect("utf-8");
        let line = stdout.lines().find_map(|line| line.strip_prefix("RESULT ")).expect("a RESULT line");
        rows.push(serde_json::from_str(line).expect("a JSON result"));
    }
    print_table(&rows, runs, events);
    println!(
        "\ntotal wall time: {:.0} s; load average (1, 5, 15 min) before: {load_before}, after: {}",
        started.elapsed().as_secs_f64(),
        load_average()
    );
}

fn print_table(rows: &[Value], runs: usize, events: u64) {
    let f = |row: &Value, key: &str| row[key].as_f64().unwrap_or(f64::NAN);
    let u = |row: &Value, key: &str| row[key].as_u64().unwrap_or(0);
    let baseline = rows.iter().find(|row| row["mode"] == "baseline");
    let native = |flush: u64| rows.iter().find(|row| row["mode"] == "native" && row["flush"] == flush);
    println!(
        "\nseed 004 workload: {events} events, {RATE} events/s simulated, {WINDOW_SECS} s window, {REDELIVERY_PERCENT} % redeliveries \
         (ids first seen 1-{} s earlier); median of {runs} run(s); {}\n",
        REDELIVERY_SPAN_SECS + 1,
        machine()
    );
    println!(
        "| mode        |     F | ns/event | steady ns | +hash ns | vs baseline | vs native | peak RSS MB | held at peak | RSS B/held | cache B/hash | FPR/probe | exact checks/fresh | duplicates | mismatches |"
    );
    println!(
        "|-------------|------:|---------:|----------:|---------:|------------:|----------:|------------:|-------------:|-----------:|-------------:|----------:|-------------------:|-----------:|-----------:|"
    );
    for row in rows {
        let mode = row["mode"].as_str().unwrap_or("?");
        let flush = row["flush"].as_u64();
        let ns = f(row, "ns_per_event");
        let speedup = baseline.map_or("-".into(), |b| format!("{:.2}x", f(b, "ns_per_event") / ns));
        let vs_native = match (mode, flush.and_then(native)) {
            ("wasm", Some(n)) => format!("{:.2}x", ns / f(n, "ns_per_event")),
            _ => "-".into(),
        };
        let opt = |key: &str, fmt: &dyn Fn(f64) -> String| row[key].as_f64().map_or("-".into(), fmt);
        println!(
            "| {:<11} | {:>5} | {:>8.1} | {:>9} | {:>8} | {:>11} | {:>9} | {:>11.1} | {:>12} | {:>10.1} | {:>12} | {:>9} | {:>18} | {:>10} | {:>10} |",
            mode,
            flush.map_or("-".into(), |f| f.to_string()),
            ns,
            opt("steady_ns_per_event", &|v| format!("{v:.1}")),
            opt("hash_ns_per_event", &|v| format!("{v:.1}")),
            speedup,
            vs_native,
            f(row, "rss_peak") / 1e6,
            u(row, "held_peak"),
            f(row, "rss_bytes_per_held"),
            opt("cache_bytes_per_hash", &|v| format!("{v:.1}")),
            opt("fpr_per_probe", &|v| format!("{:.4} %", v * 100.0)),
            opt("exact_checks_per_fresh", &|v| format!("{:.4} %", v * 100.0)),
            u(row, "duplicates"),
            u(row, "mismatches"),
        );
    }
    println!();
    for row in rows {
        println!("{} F={}: {}", row["mode"].as_str().unwrap_or("?"), row["flush"], details(row));
    }
}

fn details(row: &Value) -> String {
    let keys = [
        "ns_all_runs",
        "wall_ns_per_event",
        "cpu_shares",
        "steady_ns_per_event",
        "plan_ns_per_event",
        "record_ns_per_event",
        "accepted",
        "rss_start",
        "rss_ready",
        "rss_peaks",
        "rss_net_bytes_per_held",
        "cache_bytes_peak",
        "hashes_checked",
        "bloom_maybes",
        "local_hits",
        "probes",
        "probes_per_hash",
        "generations_max",
        "generations_end",
        "expired_generations",
        "flushes",
        "vouched_flushes",
    ];
    keys.iter().filter(|key| !row[**key].is_null()).map(|key| format!("{key}={}", row[*key])).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;

    #[test]
    fn the_flags_are_well_formed() {
        Args::command().debug_assert();
    }

    /// `all` starts each mode as `cache_bench MODE --flush F --runs N --events N`.
    #[test]
    fn a_mode_takes_the_flags_all_passes_it() {
        let args =
            Args::try_parse_from(["cache_bench", "baseline128", "--flush", "64", "--runs", "1", "--events", "1000"]).unwrap();
        assert_eq!((args.mode, args.flush, args.runs, args.events), (Mode::Baseline128, 64, 1, 1_000));
        let defaults = Args::try_parse_from(["cache_bench"]).unwrap();
        assert_eq!((defaults.mode, defaults.flush, defaults.runs, defaults.events), (Mode::All, 1_024, 3, 10_000_000));
    }
}
