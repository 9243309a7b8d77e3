//! The cache's cross-host trace: one recorded scenario of calls on one shard,
//! with the answers the native core gave, that every host of the component
//! (Rust through wasmtime, Node through jco, Python through wasmtime-py)
//! replays and must answer identically.
//!
//! The scenario is [`record`]: a small PostgreSQL model ([`Pg`]) allocates
//! offsets and stores commits, and a [`Recorder`] runs every call on a native
//! [`Shard`] and writes down the call and its answer. [`to_json`] renders it
//! as `tests/trace/cache-trace.json` byte for byte the same on every run, so
//! that a stale file shows up as a difference ([`REGENERATE`] rewrites it).
//!
//! The file's format (version 1), in the WIT's own kebab-case names:
//!
//! ```text
//! { "format": "stile-dedup-trace", "version": 1,
//!   "interface": "stile:dedup/cache@0.1.0",
//!   "config": { "budget-bytes": u64, "skew-slack-ms": u32 },
//!   "calls": [ { "note"?: string, "call": name, ...arguments, "expect"?: answer } ] }
//! ```
//!
//! | `call` | arguments | `expect` |
//! |---|---|---|
//! | `plan` | `now-ms`, `segments: [{partition, window-ms, hashes}]` | `[{p-verified, local-hits, state}]` |
//! | `record-commits` | `now-ms`, `commits: [{partition, base-offset, created-ms, hashes}]` | none |
//! | `admit` | `now-ms`, `partition`, `window-ms`, `estimate-hashes` | `"hydrate"` or `"suppressed"` |
//! | `hydrate` | `now-ms`, `hydration: {partition, window-ms, last-offset, rows: [{base-offset, end-offset, created-ms, hashes}]}` | `{"ok": null}` or `{"err": "malformed" \| "window-off"}` |
//! | `expire` | `now-ms` | none |
//! | `forget` | `partition` | none |
//! | `stats` | none | the `stats` record |
//!
//! `hashes` is a list of 32-digit hex strings, one per 16-byte big-endian
//! xxh3-128 hash; a host concatenates them into the flat `list<u8>` the WIT
//! takes. Every number fits in 53 bits, so that any JSON parser reads it
//! exactly.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::path::PathBuf;

use serde_json::Value;
use stile_guest::{
    Admission, Commit, DedupCache, EntryState, HASH_LEN, HydrateError, Hydration, Millis, Offset, PartitionId, Plan, Segment,
    Shard, ShardConfig, Stats, TxnsRow,
};

/// The command that rewrites the checked-in trace.
pub const REGENERATE: &str = "cargo run --release -p stile-tests --bin trace -- write";

/// The value of the file's `format` key.
pub const FORMAT: &str = "stile-dedup-trace";

/// The version of the file format this module reads and writes.
pub const VERSION: u64 = 1;

/// The interface the trace exercises.
pub const INTERFACE: &str = "stile:dedup/cache@0.1.0";

/// Where the trace lives in the repository.
pub fn path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("trace").join("cache-trace.json")
}

/// A recorded scenario: the shard's settings and every call in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trace {
    pub config: ShardConfig,
    pub calls: Vec<Step>,
}

/// One call, with an optional note saying what it exercises.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub note: Option<String>,
    pub call: Call,
}

/// One call on the shard and, where the call answers, the expected answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    Plan { now_ms: Millis, segments: Vec<OwnedSegment>, expect: Vec<Plan> },
    RecordCommits { now_ms: Millis, commits: Vec<OwnedCommit> },
    Admit { now_ms: Millis, partition: PartitionId, window_ms: u64, estimate_hashes: u64, expect: Admission },
    Hydrate { now_ms: Millis, hydration: OwnedHydration, expect: Result<(), HydrateError> },
    Expire { now_ms: Millis },
    Forget { partition: PartitionId },
    Stats { expect: Stats },
}

impl Call {
    /// The call's name in the file (the WIT's method name).
    pub fn name(&self) -> &'static str {
        match self {
            Call::Plan { .. } => "plan",
            Call::RecordCommits { .. } => "record-commits",
            Call::Admit { .. } => "admit",
            Call::Hydrate { .. } => "hydrate",
            Call::Expire { .. } => "expire",
            Call::Forget { .. } => "forget",
            Call::Stats { .. } => "stats",
        }
    }
}

/// A `segment` that owns its hashes (16 bytes each, concatenated).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnedSegment {
    pub partition: PartitionId,
    pub window_ms: u64,
    pub hashes: Vec<u8>,
}

/// A `commit` that owns its hashes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnedCommit {
    pub partition: PartitionId,
    pub base_offset: Offset,
    pub created_ms: Millis,
    pub hashes: Vec<u8>,
}

/// A `txns-row` that owns its hashes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnedRow {
    pub base_offset: Offset,
    pub end_offset: Offset,
    pub created_ms: Millis,
    pub hashes: Vec<u8>,
}

/// A `hydration` that owns its rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnedHydration {
    pub partition: PartitionId,
    pub window_ms: u64,
    pub last_offset: Offset,
    pub rows: Vec<OwnedRow>,
}

impl OwnedSegment {
    pub fn borrow(&self) -> Segment<'_> {
        Segment { partition: self.partition, window_ms: self.window_ms, hashes: &self.hashes }
    }
}

impl OwnedCommit {
    pub fn borrow(&self) -> Commit<'_> {
        Commit { partition: self.partition, base_offset: self.base_offset, created_ms: self.created_ms, hashes: &self.hashes }
    }
}

impl OwnedRow {
    pub fn borrow(&self) -> TxnsRow<'_> {
        TxnsRow { base_offset: self.base_offset, end_offset: self.end_offset, created_ms: self.created_ms, hashes: &self.hashes }
    }
}

impl OwnedHydration {
    /// Calls `f` with the borrowed form the core and [`Cache`] take.
    pub fn with<R>(&self, f: impl FnOnce(&Hydration<'_>) -> R) -> R {
        let rows: Vec<TxnsRow<'_>> = self.rows.iter().map(OwnedRow::borrow).collect();
        f(&Hydration { partition: self.partition, window_ms: self.window_ms, last_offset: self.last_offset, rows: &rows })
    }
}

// ---------------------------------------------------------------------------
// Replay
// ---------------------------------------------------------------------------

/// The first call on which a cache answered differently from the trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Divergence {
    /// The call's index in `calls`.
    pub index: usize,
    pub call: &'static str,
    pub note: Option<String>,
    pub expected: String,
    pub actual: String,
}

impl fmt::Display for Divergence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "call #{} ({})", self.index, self.call)?;
        if let Some(note) = &self.note {
            write!(f, " [{note}]")?;
        }
        write!(f, " answered differently\n  expected: {}\n  actual:   {}", self.expected, self.actual)
    }
}

impl std::error::Error for Divergence {}

/// Replays every call of `trace` on `cache` (constructed with
/// `trace.config`) and answers how many calls ran, or the first divergence.
pub fn replay(trace: &Trace, cache: &mut impl DedupCache) -> Result<usize, Divergence> {
    for (index, step) in trace.calls.iter().enumerate() {
        let diverged = |expected: String, actual: String| Divergence {
            index,
            call: step.call.name(),
            note: step.note.clone(),
            expected,
            actual,
        };
        match &step.call {
            Call::Plan { now_ms, segments, expect } => {
                let segments: Vec<Segment<'_>> = segments.iter().map(OwnedSegment::borrow).collect();
                let actual = cache.plan(*now_ms, &segments);
                if &actual != expect {
                    return Err(diverged(format!("{expect:?}"), format!("{actual:?}")));
                }
            }
            Call::RecordCommits { now_ms, commits } => {
                let commits: Vec<Commit<'_>> = commits.iter().map(OwnedCommit::borrow).collect();
                cache.record_commits(*now_ms, &commits);
            }
            Call::Admit { now_ms, partition, window_ms, estimate_hashes, expect } => {
                let actual = cache.admit(*now_ms, *partition, *window_ms, *estimate_hashes);
                if &actual != expect {
                    return Err(diverged(format!("{expect:?}"), format!("{actual:?}")));
                }
            }
            Call::Hydrate { now_ms, hydration, expect } => {
                let actual = hydration.with(|hydration| cache.hydrate(*now_ms, hydration));
                if &actual != expect {
                    return Err(diverged(format!("{expect:?}"), format!("{actual:?}")));
                }
            }
            Call::Expire { now_ms } => cache.expire(*now_ms),
            Call::Forget { partition } => cache.forget(*partition),
            Call::Stats { expect } => {
                let actual = cache.stats();
                if &actual != expect {
                    return Err(diverged(format!("{expect:?}"), format!("{actual:?}")));
                }
            }
        }
    }
    Ok(trace.calls.len())
}

// ---------------------------------------------------------------------------
// Recording
// ---------------------------------------------------------------------------

/// Runs calls on a native [`Shard`] and writes each down with its answer.
#[derive(Debug)]
pub struct Recorder {
    shard: Shard,
    trace: Trace,
    note: Option<String>,
}

impl Recorder {
    pub fn new(config: ShardConfig) -> Recorder {
        Recorder { shard: Shard::new(config), trace: Trace { config, calls: Vec::new() }, note: None }
    }

    /// Attaches a note to the next recorded call.
    pub fn note(&mut self, note: impl Into<String>) {
        self.note = Some(note.into());
    }

    pub fn finish(self) -> Trace {
        self.trace
    }

    fn push(&mut self, call: Call) {
        let note = self.note.take();
        self.trace.calls.push(Step { note, call });
    }

    pub fn plan(&mut self, now_ms: Millis, segments: Vec<OwnedSegment>) -> Vec<Plan> {
        let borrowed: Vec<Segment<'_>> = segments.iter().map(OwnedSegment::borrow).collect();
        let expect = self.shard.plan(now_ms, &borrowed);
        self.push(Call::Plan { now_ms, segments, expect: expect.clone() });
        expect
    }

    pub fn record_commits(&mut self, now_ms: Millis, commits: Vec<OwnedCommit>) {
        let borrowed: Vec<Commit<'_>> = commits.iter().map(OwnedCommit::borrow).collect();
        self.shard.record_commits(now_ms, &borrowed);
        self.push(Call::RecordCommits { now_ms, commits });
    }

    pub fn admit(&mut self, now_ms: Millis, partition: PartitionId, window_ms: u64, estimate_hashes: u64) -> Admission {
        let expect = self.shard.admit(now_ms, partition, window_ms, estimate_hashes);
        self.push(Call::Admit { now_ms, partition, window_ms, estimate_hashes, expect });
        expect
    }

    pub fn hydrate(&mut self, now_ms: Millis, hydration: OwnedHydration) -> Result<(), HydrateError> {
        let expect = hydration.with(|borrowed| self.shard.hydrate(now_ms, borrowed));
        self.push(Call::Hydrate { now_ms, hydration, expect });
        expect
    }

    pub fn expire(&mut self, now_ms: Millis) {
        self.shard.expire(now_ms);
        self.push(Call::Expire { now_ms });
    }

    pub fn forget(&mut self, partition: PartitionId) {
        self.shard.forget(partition);
        self.push(Call::Forget { partition });
    }

    pub fn stats(&mut self) -> Stats {
        let expect = self.shard.stats();
        self.push(Call::Stats { expect });
        expect
    }
}

/// What PostgreSQL holds, as far as the cache's calls can see it: per
/// partition the allocator watermark and the txns rows. Hashes are xxh3-128
/// of made-up transaction ids, so that the trace carries real hashes.
#[derive(Debug, Default)]
pub struct Pg {
    partitions: BTreeMap<PartitionId, Log>,
    next_txn: u64,
}

#[derive(Debug)]
struct Log {
    last_offset: Offset,
    rows: Vec<OwnedRow>,
}

impl Default for Log {
    fn default() -> Log {
        Log { last_offset: -1, rows: Vec::new() }
    }
}

/// The 16 big-endian bytes of xxh3-128 of a transaction id, as the WIT wants.
pub fn hash_of(transaction_id: &str) -> [u8; HASH_LEN] {
    xxhash_rust::xxh3::xxh3_128(transaction_id.as_bytes()).to_be_bytes()
}

impl Pg {
    /// `count` hashes of transaction ids never used before.
    pub fn fresh(&mut self, count: usize) -> Vec<u8> {
        let mut hashes = Vec::with_capacity(count * HASH_LEN);
        for _ in 0..count {
            self.next_txn += 1;
            hashes.extend_from_slice(&hash_of(&format!("order-{}", self.next_txn)));
        }
        hashes
    }

    /// Allocates offsets for `hashes` (one message each) and stores the row.
    pub fn commit(&mut self, partition: PartitionId, created_ms: Millis, hashes: Vec<u8>) -> OwnedCommit {
        assert!(!hashes.is_empty() && hashes.len().is_multiple_of(HASH_LEN));
        let log = self.partitions.entry(partition).or_default();
        let base_offset = log.last_offset + 1;
        let end_offset = base_offset + (hashes.len() / HASH_LEN) as Offset - 1;
        log.last_offset = end_offset;
        log.rows.push(OwnedRow { base_offset, end_offset, created_ms, hashes: hashes.clone() });
        OwnedCommit { partition, base_offset, created_ms, hashes }
    }

    /// The partition's allocator watermark.
    pub fn last_offset(&self, partition: PartitionId) -> Offset {
        self.partitions.get(&partition).map_or(-1, |log| log.last_offset)
    }

    /// A full-window read at `now_ms`: every row created within the window
    /// plus `slack_ms`, newest first (the cache takes rows in any order).
    pub fn read(&self, partition: PartitionId, window_ms: u64, slack_ms: u32, now_ms: Millis) -> OwnedHydration {
        let cutoff = now_ms - window_ms as Millis - Millis::from(slack_ms);
        let log = self.partitions.get(&partition);
        let rows =
            log.map_or_else(Vec::new, |log| log.rows.iter().rev().filter(|row| row.created_ms >= cutoff).cloned().collect());
        OwnedHydration { partition, window_ms, last_offset: self.last_offset(partition), rows }
    }

    /// Every row of the partition, however old (older rows only widen the
    /// cache's coverage).
    pub fn read_all(&self, partition: PartitionId, window_ms: u64) -> OwnedHydration {
        let rows = self.partitions.get(&partition).map_or_else(Vec::new, |log| log.rows.clone());
        OwnedHydration { partition, window_ms, last_offset: self.last_offset(partition), rows }
    }
}

/// The hashes at `indexes` (counted in hashes) of a flat hash list.
pub fn pick(hashes: &[u8], indexes: &[usize]) -> Vec<u8> {
    indexes.iter().flat_map(|&i| hashes[i * HASH_LEN..(i + 1) * HASH_LEN].iter().copied()).collect()
}

/// Concatenates flat hash lists.
pub fn concat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// The recorded scenario. Every phase is one paragraph of calls; the notes
/// in the file say what each call exercises.
pub fn record() -> Trace {
    use Admission::{Hydrate, Suppressed};
    use EntryState::{Cold, Gap, Rebuild, Vouching};

    /// The window of every partition but the one whose window changes.
    const W: u64 = 60_000;
    const SLACK: u32 = ShardConfig::DEFAULT_SKEW_SLACK_MS;
    /// Small enough that a few partitions with one bloom generation each
    /// (about 8.5 KiB apiece) crowd it, so that the gate refuses and evicts
    /// within a few hundred hashes.
    const BUDGET: u64 = 47 * 1024;

    /// One plan's answer, for the checks that keep the notes true.
    fn answer(plans: &[Plan]) -> (Offset, Vec<u32>, EntryState) {
        assert_eq!(plans.len(), 1);
        (plans[0].p_verified, plans[0].local_hits.clone(), plans[0].state)
    }

    let config = ShardConfig { budget_bytes: BUDGET, skew_slack_ms: SLACK };
    let mut r = Recorder::new(config);
    let mut pg = Pg::default();
    let seg =
        |partition: PartitionId, window_ms: u64, hashes: &[u8]| OwnedSegment { partition, window_ms, hashes: hashes.to_vec() };
    // 2023-11-14T22:13:20Z; `now` only moves forward from here.
    let mut now: Millis = 1_700_000_000_000;

    // -- A new partition: cold, admitted, hydrated empty, then vouching. ----
    r.note("a fresh shard holds nothing");
    assert_eq!(r.stats(), Stats::default());
    let a = pg.fresh(3);
    r.note("partition 1 is new to the shard: cold, -1");
    assert_eq!(answer(&r.plan(now, vec![seg(1, W, &a)])), (-1, vec![], Cold));
    r.note("a partition new in PostgreSQL (estimate 0) is always admitted");
    assert_eq!(r.admit(now, 1, W, 0), Hydrate);
    r.note("an empty partition: no rows, last-offset -1");
    assert_eq!(r.hydrate(now, pg.read(1, W, SLACK, now)), Ok(()));
    now += 10;
    r.note("vouching for an empty partition: p-verified is its allocator, -1");
    assert_eq!(answer(&r.plan(now, vec![seg(1, W, &a)])), (-1, vec![], Vouching));
    now += 10;
    let commit = pg.commit(1, now, a.clone());
    r.note("offsets 0..2 committed right after the vouched allocator: the entry extends");
    r.record_commits(now, vec![commit]);
    now += 10;
    let b = pg.fresh(4);
    r.note("fresh hashes: vouches up to offset 2");
    assert_eq!(answer(&r.plan(now, vec![seg(1, W, &b)])), (2, vec![], Vouching));
    let commit = pg.commit(1, now, b.clone());
    r.record_commits(now, vec![commit]);
    now += 10;
    let c = concat(&[&pg.fresh(2), &pick(&a, &[1]), &pg.fresh(1), &pick(&b, &[3])]);
    r.note("hashes 2 and 4 of this segment were committed before, the older at offset 1: local hits, probe from there");
    assert_eq!(answer(&r.plan(now, vec![seg(1, W, &c)])), (0, vec![2, 4], Vouching));
    // PostgreSQL finds the two duplicates; the other three are stored.
    let commit = pg.commit(1, now, pick(&c, &[0, 1, 3]));
    r.record_commits(now, vec![commit]);
    r.stats();

    // -- A partition with history: hydration from rows. --------------------
    now += 1_000;
    // Partition 2's history, written by other gateways before this shard saw
    // the partition: a row older than the window, then two recent ones.
    let old = pg.fresh(5);
    pg.commit(2, now - W as Millis - 20_000, old.clone());
    let d1 = pg.fresh(6);
    pg.commit(2, now - 30_000, d1.clone());
    let d2 = pg.fresh(3);
    pg.commit(2, now - 1_000, d2.clone());
    let e = pg.fresh(2);
    r.note("one flush, two partitions, answered in order: 2 is cold, 1 vouches");
    let plans = r.plan(now, vec![seg(2, W, &e), seg(1, W, &e)]);
    assert_eq!((plans[0].state, plans[1].state), (Cold, Vouching));
    r.note("partition 2 has about 9 hashes in its window");
    assert_eq!(r.admit(now, 2, W, 9), Hydrate);
    let mut bad = pg.read(2, W, SLACK, now);
    bad.rows[0].end_offset += 1;
    r.note("a row whose hash count does not match its offsets: malformed, nothing installed");
    assert_eq!(r.hydrate(now, bad), Err(HydrateError::Malformed));
    let mut bad = pg.read(2, W, SLACK, now);
    bad.last_offset -= 1;
    r.note("a row ending past last-offset: malformed");
    assert_eq!(r.hydrate(now, bad), Err(HydrateError::Malformed));
    let mut overlapping = pg.read(2, W, SLACK, now);
    let mut twin = overlapping.rows[0].clone();
    twin.base_offset = twin.end_offset;
    twin.hashes.truncate(HASH_LEN);
    overlapping.rows.push(twin);
    r.note("rows that overlap: malformed");
    assert_eq!(r.hydrate(now, overlapping), Err(HydrateError::Malformed));
    r.note("still cold after three refused hydrations");
    assert_eq!(answer(&r.plan(now, vec![seg(2, W, &e)])).2, Cold);
    r.note("every row, oldest first, including one older than the window plus slack (it only widens coverage)");
    assert_eq!(r.hydrate(now, pg.read_all(2, W)), Ok(()));
    r.note("a hash from the 30-second-old row, committed at offset 10: local hit, probe from there");
    assert_eq!(answer(&r.plan(now, vec![seg(2, W, &concat(&[&e, &pick(&d1, &[5])]))])), (9, vec![2], Vouching));
    r.note("fresh hashes vouch up to partition 2's allocator, 13");
    assert_eq!(answer(&r.plan(now, vec![seg(2, W, &e)])), (13, vec![], Vouching));
    let commit = pg.commit(2, now, e.clone());
    r.record_commits(now, vec![commit]);
    r.stats();

    // -- Gaps, overlaps and ignored commits. --------------------------------
    now += 1_000;
    // Another gateway commits to partition 1; this shard never sees it.
    let foreign = pg.fresh(2);
    pg.commit(1, now, foreign.clone());
    let f = pg.fresh(2);
    let mine = pg.commit(1, now, f);
    let other = pg.fresh(1);
    let unknown = pg.commit(9, now, other);
    r.note("one report, two commits: partition 9 has no entry (ignored); partition 1's starts 2 past verified-upto + 1 (a gap)");
    r.record_commits(now, vec![unknown, mine]);
    now += 10;
    let g = pg.fresh(1);
    r.note("a gap answers -1 until rehydrated");
    assert_eq!(answer(&r.plan(now, vec![seg(1, W, &g)])), (-1, vec![], Gap));
    r.note("a gap is a cheap admission whatever the estimate");
    assert_eq!(r.admit(now, 1, W, 1_000_000), Hydrate);
    r.note("a full-window read, newest row first");
    assert_eq!(r.hydrate(now, pg.read(1, W, SLACK, now)), Ok(()));
    r.note("rehydrated: the other gateway's hashes are known (this one was committed at offset 11)");
    assert_eq!(answer(&r.plan(now, vec![seg(1, W, &concat(&[&g, &pick(&foreign, &[1])]))])), (10, vec![1], Vouching));
    assert_eq!(answer(&r.plan(now, vec![seg(1, W, &g)])), (13, vec![], Vouching));
    let commit = pg.commit(1, now, g.clone());
    r.record_commits(now, vec![commit.clone()]);
    now += 10;
    r.note("the same commit reported twice: it overlaps verified-upto, the entry needs a rebuild");
    r.record_commits(now, vec![commit]);
    let h = pg.fresh(1);
    r.note("rebuild answers -1");
    assert_eq!(answer(&r.plan(now, vec![seg(1, W, &h)])), (-1, vec![], Rebuild));
    let commit = pg.commit(1, now, h.clone());
    r.note("commits while a rebuild is pending change nothing");
    r.record_commits(now, vec![commit]);
    assert_eq!(answer(&r.plan(now, vec![seg(1, W, &h)])), (-1, vec![], Rebuild));
    r.stats();
    r.note("a rebuild with room in the budget is admitted");
    assert_eq!(r.admit(now, 1, W, 20), Hydrate);
    assert_eq!(r.hydrate(now, pg.read(1, W, SLACK, now)), Ok(()));
    assert_eq!(answer(&r.plan(now, vec![seg(1, W, &pg.fresh(1))])), (15, vec![], Vouching));
    r.stats();
    // Partition 1's newest commit is the one just recorded.
    let newest = now;

    // -- Expiry: `now` moves past the window plus slack. ---------------------
    now = newest + W as Millis + Millis::from(SLACK);
    r.note("exactly window plus slack after partition 1's newest commit: nothing expires yet");
    r.note("partition 1's first commit, at offset 0: local hits, nothing below to vouch for");
    assert_eq!(answer(&r.plan(now, vec![seg(1, W, &a)])), (-1, vec![0, 1, 2], Vouching));
    assert_eq!(r.stats().expired_generations, 0);
    now += 1;
    r.note("one millisecond later partition 1's only generation is older than window plus slack: planning expires it, no hits");
    assert_eq!(answer(&r.plan(now, vec![seg(1, W, &a)])), (15, vec![], Vouching));
    assert_eq!(r.stats().expired_generations, 1);
    now += 40_000;
    r.note("expire frees the idle partition 2 as well");
    r.expire(now);
    assert_eq!(r.stats().expired_generations, 2);

    // -- Window changes, and window 0. ---------------------------------------
    now += 1_000;
    let k = pg.fresh(72);
    r.note("partition 1's window doubled: rebuild");
    assert_eq!(answer(&r.plan(now, vec![seg(1, 2 * W, &k)])), (-1, vec![], Rebuild));
    r.note("sticky: the old window does not bring it back");
    assert_eq!(answer(&r.plan(now, vec![seg(1, W, &k)])), (-1, vec![], Rebuild));
    r.note("a window change on a resident entry is no cheap admission, but it fits");
    assert_eq!(r.admit(now, 1, 2 * W, 30), Hydrate);
    assert_eq!(r.hydrate(now, pg.read(1, 2 * W, SLACK, now)), Ok(()));
    r.note("under the doubled window the expired hashes are held again");
    assert_eq!(answer(&r.plan(now, vec![seg(1, 2 * W, &concat(&[&k, &pick(&a, &[0])]))])), (-1, vec![72], Vouching));
    assert_eq!(answer(&r.plan(now, vec![seg(1, 2 * W, &k)])), (15, vec![], Vouching));
    let commit = pg.commit(1, now, k);
    r.note("72 hashes committed at once: the generation passes 64 and builds its bloom filter");
    r.record_commits(now, vec![commit]);
    r.note("window 0 turns deduplication off: -1, cold, and partition 2's entry is dropped");
    assert_eq!(answer(&r.plan(now, vec![seg(2, 0, &pg.fresh(1))])), (-1, vec![], Cold));
    r.note("admitting with window 0 always answers hydrate");
    assert_eq!(r.admit(now, 2, 0, 1_000_000), Hydrate);
    r.note("and hydrating with window 0 answers window-off");
    assert_eq!(r.hydrate(now, pg.read(2, 0, SLACK, now)), Err(HydrateError::WindowOff));
    assert_eq!(r.stats().entries, 1);

    // -- Budget pressure: suppression, cooldown, eviction. -------------------
    now += 1_000;
    let history = pg.fresh(100);
    pg.commit(3, now - 10_000, history);
    r.note("partition 3 has history: admitted and hydrated with 100 hashes");
    assert_eq!(r.admit(now, 3, W, 100), Hydrate);
    assert_eq!(r.hydrate(now, pg.read(3, W, SLACK, now)), Ok(()));
    assert_eq!(answer(&r.plan(now, vec![seg(3, W, &pg.fresh(1))])), (99, vec![], Vouching));
    r.stats();
    let history = pg.fresh(1000);
    pg.commit(4, now - 10_000, history);
    r.note(
        "partition 4 holds 1,000 hashes, which the host estimates at 1,200 (18 bytes each): \
         they fit only by evicting 1 or 3, both used within 5 s: suppressed",
    );
    assert_eq!(r.admit(now, 4, W, 1200), Suppressed);
    r.note("a suppressed partition answers -1");
    assert_eq!(answer(&r.plan(now, vec![seg(4, W, &pg.fresh(1))])), (-1, vec![], EntryState::Suppressed));
    assert_eq!(r.stats().suppressed, 1);
    now += 10_000;
    r.note("during the 30 s cooldown the gate is not re-tested, though 1 and 3 are idle now");
    assert_eq!(r.admit(now, 4, W, 1200), Suppressed);
    assert_eq!(answer(&r.plan(now, vec![seg(3, W, &pg.fresh(1))])), (99, vec![], Vouching));
    now += 21_000;
    r.note("the cooldown is over: it fits once the least recently used idle partition, 1, is evicted");
    assert_eq!(r.admit(now, 4, W, 1200), Hydrate);
    assert_eq!(r.hydrate(now, pg.read(4, W, SLACK, now)), Ok(()));
    let stats = r.stats();
    assert_eq!((stats.entries, stats.evictions, stats.suppressed), (2, 1, 0));
    r.note("the evicted partition is cold again");
    assert_eq!(answer(&r.plan(now, vec![seg(1, 2 * W, &pg.fresh(1))])), (-1, vec![], Cold));
    let more = pg.fresh(300);
    let commit = pg.commit(4, now, more);
    r.note("300 more hashes for partition 4 take the shard over its budget: the idle partition 3 is evicted");
    r.record_commits(now, vec![commit]);
    let stats = r.stats();
    assert_eq!((stats.entries, stats.evictions), (1, 2));
    assert!(stats.bytes <= BUDGET);
    r.note(
        "partition 1's remembered footprint overrides the host's estimate of 1 hash; partition 4 was used just now: suppressed",
    );
    assert_eq!(r.admit(now, 1, 2 * W, 1), Suppressed);

    // -- Forget. -------------------------------------------------------------
    now += 1_000;
    r.note("forget clears partition 1's cooldown and footprint");
    r.forget(1);
    assert_eq!(answer(&r.plan(now, vec![seg(1, 2 * W, &pg.fresh(1))])), (-1, vec![], Cold));
    r.note("so the host's estimate counts again, and it fits");
    assert_eq!(r.admit(now, 1, 2 * W, 1), Hydrate);
    assert_eq!(r.hydrate(now, pg.read(1, 2 * W, SLACK, now)), Ok(()));
    r.note("forget drops an entry");
    r.forget(4);
    assert_eq!(answer(&r.plan(now, vec![seg(4, W, &pg.fresh(1))])), (-1, vec![], Cold));
    r.note("forgetting an unknown partition is harmless");
    r.forget(77);
    now += W as Millis * 3;
    r.expire(now);
    let stats = r.stats();
    assert_eq!((stats.entries, stats.generations, stats.hashes), (1, 0, 0));
    r.finish()
}

// ---------------------------------------------------------------------------
// JSON
// ---------------------------------------------------------------------------

/// The largest magnitude a JSON number in the trace may have, so that a
/// parser reading numbers as doubles (JavaScript's) reads it exactly.
const SAFE_INTEGER: i128 = (1 << 53) - 1;

/// A JSON value with its object keys in the order they were given.
enum J {
    Null,
    Num(i128),
    Str(String),
    Arr(Vec<J>),
    Obj(Vec<(&'static str, J)>),
}

fn num(n: impl Into<i128>) -> J {
    let n = n.into();
    assert!(n.abs() <= SAFE_INTEGER, "{n} does not fit a double exactly");
    J::Num(n)
}

fn hashes_json(hashes: &[u8]) -> J {
    assert_eq!(hashes.len() % HASH_LEN, 0, "the trace holds whole hashes only");
    J::Arr(hashes.chunks(HASH_LEN).map(|hash| J::Str(hex(hash))).collect())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn state_name(state: EntryState) -> &'static str {
    match state {
        EntryState::Vouching => "vouching",
        EntryState::Cold => "cold",
        EntryState::Gap => "gap",
        EntryState::Rebuild => "rebuild",
        EntryState::Suppressed => "suppressed",
    }
}

fn admission_name(admission: Admission) -> &'static str {
    match admission {
        Admission::Hydrate => "hydrate",
        Admission::Suppressed => "suppressed",
    }
}

fn hydrate_error_name(error: HydrateError) -> &'static str {
    match error {
        HydrateError::Malformed => "malformed",
        HydrateError::WindowOff => "window-off",
        HydrateError::Lost => "lost",
    }
}

fn stats_json(s: &Stats) -> J {
    J::Obj(vec![
        ("entries", num(s.entries)),
        ("vouching", num(s.vouching)),
        ("bytes", num(s.bytes)),
        ("hashes", num(s.hashes)),
        ("generations", num(s.generations)),
        ("suppressed", num(s.suppressed)),
        ("segments-planned", num(s.segments_planned)),
        ("segments-vouched", num(s.segments_vouched)),
        ("hashes-checked", num(s.hashes_checked)),
        ("bloom-maybes", num(s.bloom_maybes)),
        ("local-hits", num(s.local_hits)),
        ("hydrations", num(s.hydrations)),
        ("evictions", num(s.evictions)),
        ("expired-generations", num(s.expired_generations)),
    ])
}

fn call_json(step: &Step) -> J {
    let mut fields: Vec<(&'static str, J)> = Vec::new();
    if let Some(note) = &step.note {
        fields.push(("note", J::Str(note.clone())));
    }
    fields.push(("call", J::Str(step.call.name().to_owned())));
    match &step.call {
        Call::Plan { now_ms, segments, expect } => {
            fields.push(("now-ms", num(*now_ms)));
            let segments = segments
                .iter()
                .map(|s| {
                    J::Obj(vec![
                        ("partition", num(s.partition)),
                        ("window-ms", num(s.window_ms)),
                        ("hashes", hashes_json(&s.hashes)),
                    ])
                })
                .collect();
            fields.push(("segments", J::Arr(segments)));
            let plans = expect
                .iter()
                .map(|p| {
                    J::Obj(vec![
                        ("p-verified", num(p.p_verified)),
                        ("local-hits", J::Arr(p.local_hits.iter().map(|&i| num(i)).collect())),
                        ("state", J::Str(state_name(p.state).to_owned())),
                    ])
                })
                .collect();
            fields.push(("expect", J::Arr(plans)));
        }
        Call::RecordCommits { now_ms, commits } => {
            fields.push(("now-ms", num(*now_ms)));
            let commits = commits
                .iter()
                .map(|c| {
                    J::Obj(vec![
                        ("partition", num(c.partition)),
                        ("base-offset", num(c.base_offset)),
                        ("created-ms", num(c.created_ms)),
                        ("hashes", hashes_json(&c.hashes)),
                    ])
                })
                .collect();
            fields.push(("commits", J::Arr(commits)));
        }
        Call::Admit { now_ms, partition, window_ms, estimate_hashes, expect } => {
            fields.push(("now-ms", num(*now_ms)));
            fields.push(("partition", num(*partition)));
            fields.push(("window-ms", num(*window_ms)));
            fields.push(("estimate-hashes", num(*estimate_hashes)));
            fields.push(("expect", J::Str(admission_name(*expect).to_owned())));
        }
        Call::Hydrate { now_ms, hydration, expect } => {
            fields.push(("now-ms", num(*now_ms)));
            let rows = hydration
                .rows
                .iter()
                .map(|r| {
                    J::Obj(vec![
                        ("base-offset", num(r.base_offset)),
                        ("end-offset", num(r.end_offset)),
                        ("created-ms", num(r.created_ms)),
                        ("hashes", hashes_json(&r.hashes)),
                    ])
                })
                .collect();
            fields.push((
                "hydration",
                J::Obj(vec![
                    ("partition", num(hydration.partition)),
                    ("window-ms", num(hydration.window_ms)),
                    ("last-offset", num(hydration.last_offset)),
                    ("rows", J::Arr(rows)),
                ]),
            ));
            let expect = match expect {
                Ok(()) => J::Obj(vec![("ok", J::Null)]),
                Err(error) => J::Obj(vec![("err", J::Str(hydrate_error_name(*error).to_owned()))]),
            };
            fields.push(("expect", expect));
        }
        Call::Expire { now_ms } => fields.push(("now-ms", num(*now_ms))),
        Call::Forget { partition } => fields.push(("partition", num(*partition))),
        Call::Stats { expect } => fields.push(("expect", stats_json(expect))),
    }
    J::Obj(fields)
}

/// The trace as the checked-in file holds it: two-space indentation, keys
/// in a fixed order, lists of numbers on one line, one hash per line.
pub fn to_json(trace: &Trace) -> String {
    let root = J::Obj(vec![
        ("format", J::Str(FORMAT.to_owned())),
        ("version", num(VERSION)),
        ("interface", J::Str(INTERFACE.to_owned())),
        (
            "about",
            J::Str(
                "Calls on one shard of the stile dedup cache, with the answers the native core gave. \
                 Every host of the component must give the same answers."
                    .to_owned(),
            ),
        ),
        ("regenerate", J::Str(REGENERATE.to_owned())),
        (
            "config",
            J::Obj(vec![("budget-bytes", num(trace.config.budget_bytes)), ("skew-slack-ms", num(trace.config.skew_slack_ms))]),
        ),
        ("calls", J::Arr(trace.calls.iter().map(call_json).collect())),
    ]);
    let mut out = String::new();
    write_json(&mut out, &root, 0);
    out.push('\n');
    out
}

fn write_json(out: &mut String, value: &J, depth: usize) {
    let indent = |out: &mut String, depth: usize| out.extend(std::iter::repeat_n("  ", depth));
    match value {
        J::Null => out.push_str("null"),
        J::Num(n) => {
            let _ = write!(out, "{n}");
        }
        J::Str(s) => {
            // serde_json escapes exactly as JSON requires.
            out.push_str(&serde_json::to_string(s).expect("a string serializes"));
        }
        J::Arr(items) if items.is_empty() => out.push_str("[]"),
        J::Arr(items) if items.iter().all(|item| matches!(item, J::Num(_))) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_json(out, item, depth);
            }
            out.push(']');
        }
        J::Arr(items) => {
            out.push_str("[\n");
            for (i, item) in items.iter().enumerate() {
                indent(out, depth + 1);
                write_json(out, item, depth + 1);
                out.push_str(if i + 1 < items.len() { ",\n" } else { "\n" });
            }
            indent(out, depth);
            out.push(']');
        }
        J::Obj(fields) if fields.is_empty() => out.push_str("{}"),
        J::Obj(fields) => {
            out.push_str("{\n");
            for (i, (key, item)) in fields.iter().enumerate() {
                indent(out, depth + 1);
                let _ = write!(out, "\"{key}\": ");
                write_json(out, item, depth + 1);
                out.push_str(if i + 1 < fields.len() { ",\n" } else { "\n" });
            }
            indent(out, depth);
            out.push('}');
        }
    }
}

/// Why a trace file could not be read.
#[derive(Debug)]
pub struct ParseError(String);

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "malformed trace: {}", self.0)
    }
}

impl std::error::Error for ParseError {}

type Parsed<T> = Result<T, ParseError>;

fn bad<T>(what: impl fmt::Display) -> Parsed<T> {
    Err(ParseError(what.to_string()))
}

fn field<'v>(value: &'v Value, key: &str) -> Parsed<&'v Value> {
    value.get(key).map_or_else(|| bad(format!("missing \"{key}\" in {value}")), Ok)
}

fn int(value: &Value, key: &str) -> Parsed<i64> {
    field(value, key)?.as_i64().map_or_else(|| bad(format!("\"{key}\" is not an integer")), Ok)
}

fn uint(value: &Value, key: &str) -> Parsed<u64> {
    field(value, key)?.as_u64().map_or_else(|| bad(format!("\"{key}\" is not an unsigned integer")), Ok)
}

fn text<'v>(value: &'v Value, key: &str) -> Parsed<&'v str> {
    field(value, key)?.as_str().map_or_else(|| bad(format!("\"{key}\" is not a string")), Ok)
}

fn list<'v>(value: &'v Value, key: &str) -> Parsed<&'v [Value]> {
    field(value, key)?.as_array().map_or_else(|| bad(format!("\"{key}\" is not a list")), |items| Ok(items.as_slice()))
}

fn parse_hashes(value: &Value) -> Parsed<Vec<u8>> {
    let mut bytes = Vec::new();
    for hash in list(value, "hashes")? {
        let Some(hash) = hash.as_str().filter(|h| h.len() == 2 * HASH_LEN && h.is_ascii()) else {
            return bad(format!("{hash} is not a 32-digit hex hash"));
        };
        for pair in hash.as_bytes().chunks(2) {
            let pair = std::str::from_utf8(pair).expect("ascii");
            match u8::from_str_radix(pair, 16) {
                Ok(byte) => bytes.push(byte),
                Err(_) => return bad(format!("{hash} is not hex")),
            }
        }
    }
    Ok(bytes)
}

fn parse_state(name: &str) -> Parsed<EntryState> {
    Ok(match name {
        "vouching" => EntryState::Vouching,
        "cold" => EntryState::Cold,
        "gap" => EntryState::Gap,
        "rebuild" => EntryState::Rebuild,
        "suppressed" => EntryState::Suppressed,
        other => return bad(format!("unknown entry-state {other:?}")),
    })
}

fn parse_stats(v: &Value) -> Parsed<Stats> {
    Ok(Stats {
        entries: uint(v, "entries")?,
        vouching: uint(v, "vouching")?,
        bytes: uint(v, "bytes")?,
        hashes: uint(v, "hashes")?,
        generations: uint(v, "generations")?,
        suppressed: uint(v, "suppressed")?,
        segments_planned: uint(v, "segments-planned")?,
        segments_vouched: uint(v, "segments-vouched")?,
        hashes_checked: uint(v, "hashes-checked")?,
        bloom_maybes: uint(v, "bloom-maybes")?,
        local_hits: uint(v, "local-hits")?,
        hydrations: uint(v, "hydrations")?,
        evictions: uint(v, "evictions")?,
        expired_generations: uint(v, "expired-generations")?,
    })
}

fn parse_call(v: &Value) -> Parsed<Step> {
    let note = v.get("note").and_then(Value::as_str).map(str::to_owned);
    let call = match text(v, "call")? {
        "plan" => Call::Plan {
            now_ms: int(v, "now-ms")?,
            segments: list(v, "segments")?
                .iter()
                .map(|s| {
                    Ok(OwnedSegment {
                        partition: int(s, "partition")?,
                        window_ms: uint(s, "window-ms")?,
                        hashes: parse_hashes(s)?,
                    })
                })
                .collect::<Parsed<_>>()?,
            expect: list(v, "expect")?
                .iter()
                .map(|p| {
                    let local_hits = list(p, "local-hits")?
                        .iter()
                        .map(|i| {
                            i.as_u64().and_then(|i| u32::try_from(i).ok()).map_or_else(|| bad("a local hit is not a u32"), Ok)
                        })
                        .collect::<Parsed<_>>()?;
                    Ok(Plan { p_verified: int(p, "p-verified")?, local_hits, state: parse_state(text(p, "state")?)? })
                })
                .collect::<Parsed<_>>()?,
        },
        "record-commits" => Call::RecordCommits {
            now_ms: int(v, "now-ms")?,
            commits: list(v, "commits")?
                .iter()
                .map(|c| {
                    Ok(OwnedCommit {
                        partition: int(c, "partition")?,
                        base_offset: int(c, "base-offset")?,
                        created_ms: int(c, "created-ms")?,
                        hashes: parse_hashes(c)?,
                    })
                })
                .collect::<Parsed<_>>()?,
        },
        "admit" => Call::Admit {
            now_ms: int(v, "now-ms")?,
            partition: int(v, "partition")?,
            window_ms: uint(v, "window-ms")?,
            estimate_hashes: uint(v, "estimate-hashes")?,
            expect: match text(v, "expect")? {
                "hydrate" => Admission::Hydrate,
                "suppressed" => Admission::Suppressed,
                other => return bad(format!("unknown admission {other:?}")),
            },
        },
        "hydrate" => {
            let h = field(v, "hydration")?;
            let rows = list(h, "rows")?
                .iter()
                .map(|r| {
                    Ok(OwnedRow {
                        base_offset: int(r, "base-offset")?,
                        end_offset: int(r, "end-offset")?,
                        created_ms: int(r, "created-ms")?,
                        hashes: parse_hashes(r)?,
                    })
                })
                .collect::<Parsed<_>>()?;
            let expect = field(v, "expect")?;
            let expect = if expect.get("ok").is_some() {
                Ok(())
            } else {
                Err(match text(expect, "err")? {
                    "malformed" => HydrateError::Malformed,
                    "window-off" => HydrateError::WindowOff,
                    other => return bad(format!("unknown hydrate-error {other:?}")),
                })
            };
            Call::Hydrate {
                now_ms: int(v, "now-ms")?,
                hydration: OwnedHydration {
                    partition: int(h, "partition")?,
                    window_ms: uint(h, "window-ms")?,
                    last_offset: int(h, "last-offset")?,
                    rows,
                },
                expect,
            }
        }
        "expire" => Call::Expire { now_ms: int(v, "now-ms")? },
        "forget" => Call::Forget { partition: int(v, "partition")? },
        "stats" => Call::Stats { expect: parse_stats(field(v, "expect")?)? },
        other => return bad(format!("unknown call {other:?}")),
    };
    Ok(Step { note, call })
}

/// Reads a trace file's text.
pub fn from_json(text_: &str) -> Parsed<Trace> {
    let root: Value = serde_json::from_str(text_).map_err(|e| ParseError(e.to_string()))?;
    if text(&root, "format")? != FORMAT || uint(&root, "version")? != VERSION {
        return bad(format!("not a {FORMAT} version {VERSION} file"));
    }
    let config = field(&root, "config")?;
    let skew_slack_ms = u32::try_from(uint(config, "skew-slack-ms")?).map_err(|e| ParseError(e.to_string()))?;
    let config = ShardConfig { budget_bytes: uint(config, "budget-bytes")?, skew_slack_ms };
    let calls = list(&root, "calls")?.iter().map(parse_call).collect::<Parsed<_>>()?;
    Ok(Trace { config, calls })
}

/// Compares the checked-in file with a freshly recorded trace: `None` when
/// they are the same text, else where they first differ.
pub fn staleness(checked_in: &str, fresh: &str) -> Option<String> {
    let checked_in = checked_in.replace("\r\n", "\n");
    if checked_in == fresh {
        return None;
    }
    let mut old_lines = checked_in.lines();
    let mut new_lines = fresh.lines();
    let mut line = 1;
    loop {
        match (old_lines.next(), new_lines.next()) {
            (Some(old), Some(new)) if old == new => line += 1,
            (old, new) => {
                return Some(format!(
                    "first difference at line {line}:\n  checked in: {}\n  recorded:   {}",
                    old.unwrap_or("<end of file>"),
                    new.unwrap_or("<end of file>")
                ));
            }
        }
    }
}
