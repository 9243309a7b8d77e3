//! Drives a [`Scenario`] through a [`Cache`] the way the gateway would, next
//! to the model database, and checks every answer.
//!
//! The invariant that matters: whenever the cache answers `p_verified = v`
//! with `v >= 0` for a segment and the push function honours it, none of the
//! segment's hashes is stored at an offset at or below `v` within the window,
//! as PostgreSQL would see it at that moment. The push function honours a
//! vouch only while its clock is at or past the cache's `now` less the skew
//! slack (the cache judged age by that `now`), and the host derives `now`
//! from PostgreSQL's clock readings with [`DbClock`], never from its own
//! wall clock, so clock offsets and steps of either clock may cost probes
//! and never a verdict. Around it, checks that the cache is not trivially
//! sound (a vouching entry that has been told every commit vouches for the
//! allocator; fresh hashes are never hits; a fresh hydration vouches at once;
//! a brand-new partition is always admitted; a vouch is refused only after
//! PostgreSQL's clock stepped back unseen) and that its answers are well
//! formed.

use std::boxed::Box;
use std::fmt;
use std::format;
use std::string::String;
use std::vec;
use std::vec::Vec;

use super::model::{Database, Read, Row};
use super::strategy::{Estimate, MalformedInput, Op, PARTITIONS, PushSegment, Scenario};
use crate::DedupCache;
use crate::api::*;
use crate::clock::{DbClock, Reading};
use crate::hash::{Hash, encode};

/// A broken property: which step, and what was wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The index of the operation in the scenario.
    pub step: usize,
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "step {}: {}", self.step, self.message)
    }
}

impl std::error::Error for Violation {}

/// Runs a scenario against caches made by `make` from the scenario's
/// configuration: one at the start, and a fresh one whenever the host
/// replaces its cache (after PostgreSQL's clock stepped back).
pub fn run<C: DedupCache>(scenario: &Scenario, make: impl FnMut(ShardConfig) -> C) -> Result<(), Violation> {
    let clock = DbClock::new(START_MS, 0, scenario.config.skew_slack_ms);
    run_as(scenario, make, Host { clock: Box::new(clock), push_guard: true })
}

/// How the host and the push function treat time: the gateway's rules in
/// [`run`], broken ones in the tests below.
struct Host {
    clock: Box<dyn HostClock>,
    /// Whether the push function refuses a vouch when its clock is behind
    /// the cache's `now` less the skew slack.
    push_guard: bool,
}

/// How a host derives the cache's `now` from the clocks it has.
trait HostClock {
    /// A reading of PostgreSQL's clock, received at these readings of the
    /// host's monotonic and wall clocks.
    fn observe(&mut self, db_ms: Millis, mono_ms: Millis, wall_ms: Millis) -> Reading;
    fn now(&mut self, mono_ms: Millis, wall_ms: Millis) -> Millis;
}

impl HostClock for DbClock {
    fn observe(&mut self, db_ms: Millis, mono_ms: Millis, _wall_ms: Millis) -> Reading {
        DbClock::observe(self, db_ms, mono_ms)
    }

    fn now(&mut self, mono_ms: Millis, _wall_ms: Millis) -> Millis {
        DbClock::now(self, mono_ms)
    }
}

fn run_as<C: DedupCache, M: FnMut(ShardConfig) -> C>(scenario: &Scenario, make: M, host: Host) -> Result<(), Violation> {
    let mut driver = Driver::new(scenario, make, host);
    driver.check_stats().map_err(|message| Violation { step: 0, message })?;
    for (step, op) in scenario.ops.iter().enumerate() {
        driver
            .apply(op)
            .and_then(|()| driver.check_stats())
            .map_err(|message| Violation { step, message: format!("{message}\n  during {op:?}") })?;
    }
    Ok(())
}

type Checked = Result<(), String>;

macro_rules! ensure {
    ($condition:expr, $($message:tt)+) => {
        if !$condition {
            return Err(format!($($message)+));
        }
    };
}

/// What the host knows about one partition.
#[derive(Clone, Debug, Default)]
struct HostView {
    /// The cache has been hydrated fresh and told every commit since, so a
    /// vouching answer must be the allocator itself.
    in_sync: bool,
    /// The gate cannot hold a footprint hint or a cooldown for it: never
    /// hydrated, never asked with an estimate, since the start or a forget.
    pristine: bool,
    snapshot: Option<Snapshot>,
    last_commit: Option<Row>,
}

/// A read kept for a later, stale hydration, with the reading of
/// PostgreSQL's clock it brings.
#[derive(Clone, Debug)]
struct Snapshot {
    read: Read,
    db_ms: Millis,
    /// [`Clocks::db_steps_back`] when it was taken.
    db_steps_back: u64,
}

/// The three clocks: the host's monotonic clock, and PostgreSQL's and the
/// host's wall clock as offsets from it, each stepped on its own.
#[derive(Clone, Copy, Debug)]
struct Clocks {
    mono_ms: Millis,
    db_offset_ms: Millis,
    wall_offset_ms: Millis,
    /// PostgreSQL's clock stepped back since the host last read it (or the
    /// host took a reading from before a step back): until the host reads
    /// it again, the host's bound may be ahead of it, and the push function
    /// refuses the cache's vouches.
    db_stepped_back_unseen: bool,
    /// How many times PostgreSQL's clock stepped back.
    db_steps_back: u64,
}

struct Driver<'s, C, M> {
    scenario: &'s Scenario,
    make: M,
    cache: C,
    host: Host,
    database: Database,
    hosts: Vec<HostView>,
    clocks: Clocks,
    /// The `now` of the latest plan call.
    planned_at: Millis,
    fresh_ids: u64,
    segments_planned: u64,
    hydrations: u64,
    last_stats: Stats,
}

/// PostgreSQL's clock (and the monotonic clock's origin) at the start.
const START_MS: Millis = 1_700_000_000_000;

/// Fresh ids live above every id of a hash space.
const FRESH_BASE: u64 = 1 << 62;

impl<'s, C: DedupCache, M: FnMut(ShardConfig) -> C> Driver<'s, C, M> {
    fn new(scenario: &'s Scenario, mut make: M, host: Host) -> Self {
        let mut database = Database::default();
        for (&partition, &window_ms) in PARTITIONS.iter().zip(&scenario.windows_ms) {
            database.create(partition, window_ms);
        }
        let cache = make(scenario.config);
        Driver {
            scenario,
            make,
            cache,
            host,
            database,
            hosts: vec![HostView { pristine: true, ..HostView::default() }; PARTITIONS.len()],
            clocks: Clocks {
                mono_ms: 0,
                db_offset_ms: START_MS,
                wall_offset_ms: START_MS + scenario.wall_skew_ms,
                db_stepped_back_unseen: false,
                db_steps_back: 0,
            },
            planned_at: Millis::MIN,
            fresh_ids: 0,
            segments_planned: 0,
            hydrations: 0,
            last_stats: Stats::default(),
        }
    }

    fn pg_now(&self) -> Millis {
        self.clocks.mono_ms + self.clocks.db_offset_ms
    }

    fn wall_now(&self) -> Millis {
        self.clocks.mono_ms + self.clocks.wall_offset_ms
    }

    /// The `now` the host gives the cache.
    fn now(&mut self) -> Millis {
        let (mono_ms, wall_ms) = (self.clocks.mono_ms, self.wall_now());
        self.host.clock.now(mono_ms, wall_ms)
    }

    /// The host receives a reading of PostgreSQL's clock taken now (every
    /// push and every hydration read returns one).
    fn read_db_clock(&mut self) {
        self.clocks.db_stepped_back_unseen = false;
        self.receive_db_reading(self.pg_now());
    }

    /// The host receives a reading `db_ms` of PostgreSQL's clock and, if it
    /// reveals a step back, replaces its cache.
    fn receive_db_reading(&mut self, db_ms: Millis) {
        let (mono_ms, wall_ms) = (self.clocks.mono_ms, self.wall_now());
        let reading = self.host.clock.observe(db_ms, mono_ms, wall_ms);
        if let Reading::SteppedBack { .. } = reading {
            self.cache = (self.make)(self.scenario.config);
            self.segments_planned = 0;
            self.hydrations = 0;
            self.last_stats = Stats::default();
            for host in &mut self.hosts {
                host.pristine = true;
                host.in_sync = false;
            }
        }
    }

    fn apply(&mut self, op: &Op) -> Checked {
        match op {
            Op::Tick { ms } => self.clocks.mono_ms += Millis::from(*ms),
            Op::StepDatabaseClock { ms } => {
                self.clocks.db_offset_ms += ms;
                if *ms < 0 {
                    self.clocks.db_stepped_back_unseen = true;
                    self.clocks.db_steps_back += 1;
                }
            }
            Op::StepWallClock { ms } => self.clocks.wall_offset_ms += ms,
            Op::Push { segments } => self.push(segments)?,
            Op::Foreign { partition, ids } => {
                let hashes: Vec<Hash> = ids.iter().map(|&id| self.hash_of(id)).collect();
                let pg_now = self.pg_now();
                let log = self.database.log_mut(PARTITIONS[*partition]);
                let written = log.to_write(&hashes, pg_now);
                if !written.is_empty() {
                    log.commit(written, pg_now);
                    self.hosts[*partition].in_sync = false;
                }
            }
            Op::Replay { partition } => {
                if let Some(row) = self.hosts[*partition].last_commit.clone() {
                    let bytes = encode(&row.hashes);
                    let commit = commit_of(PARTITIONS[*partition], &row, &bytes);
                    let now = self.now();
                    self.cache.record_commits(now, &[commit]);
                }
            }
            Op::Snapshot { partition } => {
                let (db_ms, db_steps_back) = (self.pg_now(), self.clocks.db_steps_back);
                let read = self.read(*partition, 0);
                self.hosts[*partition].snapshot = Some(Snapshot { read, db_ms, db_steps_back });
            }
            Op::Rebuild { partition, stale, estimate, extra_slack_ms, shuffle } => {
                self.rebuild(*partition, *stale, *estimate, *extra_slack_ms, *shuffle)?;
            }
            Op::SetWindow { partition, window_ms } => {
                self.database.log_mut(PARTITIONS[*partition]).window_ms = *window_ms;
            }
            Op::Expire => {
                let now = self.now();
                self.cache.expire(now);
            }
            Op::Forget { partition } => self.forget(*partition)?,
            Op::Malformed { partition, input } => self.malformed(*partition, *input)?,
        }
        Ok(())
    }

    /// A full-window read of one partition (window plus skew slack plus
    /// `extra_slack_ms`), which brings the host a reading of PostgreSQL's
    /// clock.
    fn read(&mut self, index: usize, extra_slack_ms: u32) -> Read {
        let slack_ms = self.scenario.config.skew_slack_ms.saturating_add(extra_slack_ms);
        let read = self.database.log(PARTITIONS[index]).read(self.pg_now(), slack_ms);
        self.read_db_clock();
        read
    }

    /// One flush: plan every segment, check the plans, commit what the push
    /// function would write, and report the commits in one call.
    fn push(&mut self, segments: &[PushSegment]) -> Checked {
        // One segment per partition per flush: flushes are single-flight.
        let mut chosen: Vec<&PushSegment> = Vec::new();
        for segment in segments {
            if chosen.iter().all(|c| c.partition != segment.partition) {
                chosen.push(segment);
            }
        }
        let hashes: Vec<(Vec<Hash>, bool)> = chosen.iter().map(|segment| self.hashes_of(segment)).collect();
        let bytes: Vec<Vec<u8>> = hashes.iter().map(|(h, _)| encode(h)).collect();
        let windows: Vec<u64> = chosen.iter().map(|s| self.database.log(PARTITIONS[s.partition]).window_ms).collect();
        let planned: Vec<Segment<'_>> = chosen
            .iter()
            .zip(&bytes)
            .zip(&windows)
            .map(|((segment, bytes), &window_ms)| Segment { partition: PARTITIONS[segment.partition], window_ms, hashes: bytes })
            .collect();
        let plans = self.plan(&planned)?;
        for ((segment, (hashes, fresh_only)), plan) in chosen.iter().zip(&hashes).zip(&plans) {
            self.check_plan(segment.partition, Some(hashes), *fresh_only, plan)?;
        }
        let pg_now = self.pg_now();
        let mut rows = Vec::new();
        for (segment, (hashes, _)) in chosen.iter().zip(&hashes) {
            let log = self.database.log_mut(PARTITIONS[segment.partition]);
            let written = log.to_write(hashes, pg_now);
            if written.is_empty() {
                continue;
            }
            let row = log.commit(written, pg_now);
            let host = &mut self.hosts[segment.partition];
            host.last_commit = Some(row.clone());
            if segment.reported {
                rows.push((segment.partition, row));
            } else {
                host.in_sync = false;
            }
        }
        self.read_db_clock();
        let encoded: Vec<Vec<u8>> = rows.iter().map(|(_, row)| encode(&row.hashes)).collect();
        let commits: Vec<Commit<'_>> =
            rows.iter().zip(&encoded).map(|((partition, row), bytes)| commit_of(PARTITIONS[*partition], row, bytes)).collect();
        let now = self.now();
        self.cache.record_commits(now, &commits);
        Ok(())
    }

    /// The host's rebuild path: the gate, then a fresh or stale read. (The
    /// model reads before asking the gate: no time passes in between, and so
    /// a reading that replaces the cache comes before the gate is asked.)
    fn rebuild(&mut self, index: usize, stale: bool, estimate: Estimate, extra_slack_ms: u32, shuffle: u64) -> Checked {
        let partition = PARTITIONS[index];
        let read = match (&self.hosts[index].snapshot, stale) {
            (Some(snapshot), true) => {
                let snapshot = snapshot.clone();
                // Its reading arrives now; if the clock stepped back since
                // it was taken, it may lift the host's bound above the
                // database's clock until the next reading.
                self.clocks.db_stepped_back_unseen |= snapshot.db_steps_back < self.clocks.db_steps_back;
                self.receive_db_reading(snapshot.db_ms);
                snapshot.read
            }
            _ => self.read(index, extra_slack_ms),
        };
        let log = self.database.log(partition);
        let window_ms = log.window_ms;
        let estimate_hashes = match estimate {
            Estimate::Zero => 0,
            Estimate::Model => log.in_window_count(self.pg_now()),
            Estimate::Huge => 1 << 40,
        };
        let pristine = self.hosts[index].pristine;
        let now = self.now();
        let admission = self.cache.admit(now, partition, window_ms, estimate_hashes);
        if estimate_hashes > 0 {
            self.hosts[index].pristine = false;
        }
        if pristine && estimate_hashes == 0 && window_ms > 0 {
            ensure!(admission == Admission::Hydrate, "a brand-new partition was refused: {admission:?}");
        }
        if admission == Admission::Suppressed {
            return Ok(());
        }
        let mut rows = read.rows.clone();
        shuffle_rows(&mut rows, shuffle);
        let encoded: Vec<Vec<u8>> = rows.iter().map(|row| encode(&row.hashes)).collect();
        let txns: Vec<TxnsRow<'_>> = rows
            .iter()
            .zip(&encoded)
            .map(|(row, bytes)| TxnsRow {
                base_offset: row.base_offset,
                end_offset: row.end_offset(),
                created_ms: row.created_ms,
                hashes: bytes,
            })
            .collect();
        let hydration = Hydration { partition, window_ms: read.window_ms, last_offset: read.last_offset, rows: &txns };
        let now = self.now();
        let result = self.cache.hydrate(now, &hydration);
        if read.window_ms == 0 {
            ensure!(result == Err(HydrateError::WindowOff), "a window-0 hydration answered {result:?}");
            return Ok(());
        }
        ensure!(result == Ok(()), "a well-formed hydration answered {result:?}");
        self.hydrations += 1;
        let host = &mut self.hosts[index];
        host.pristine = false;
        host.in_sync = read.last_offset == self.database.log(partition).last_offset;
        if read.window_ms == window_ms {
            // A hydration under the current window vouches for its snapshot
            // at once.
            let (plan, hashes) = self.plan_fresh(index, window_ms)?;
            self.check_plan(index, Some(&hashes), true, &plan)?;
            ensure!(
                plan.state == EntryState::Vouching && plan.p_verified == read.last_offset,
                "right after hydrating up to {} the cache answered {plan:?}",
                read.last_offset
            );
        }
        Ok(())
    }

    fn forget(&mut self, index: usize) -> Checked {
        self.cache.forget(PARTITIONS[index]);
        let host = &mut self.hosts[index];
        host.pristine = true;
        host.in_sync = false;
        let window_ms = self.database.log(PARTITIONS[index]).window_ms;
        let (plan, hashes) = self.plan_fresh(index, window_ms)?;
        self.check_plan(index, Some(&hashes), true, &plan)?;
        ensure!(plan.state == EntryState::Cold, "a forgotten partition planned as {:?}", plan.state);
        Ok(())
    }

    fn malformed(&mut self, index: usize, input: MalformedInput) -> Checked {
        let partition = PARTITIONS[index];
        let torn = vec![0xa5u8; 16 * 2 + 7];
        let log = self.database.log(partition);
        match input {
            MalformedInput::Segment => {
                let segment = Segment { partition, window_ms: log.window_ms, hashes: &torn };
                let plan = self.plan(&[segment])?.pop().expect("one plan");
                self.check_plan(index, None, false, &plan)?;
            }
            MalformedInput::Commit => {
                let commit = Commit { partition, base_offset: log.last_offset + 1, created_ms: self.pg_now(), hashes: &torn };
                let now = self.now();
                self.cache.record_commits(now, &[commit]);
            }
            MalformedInput::Hydration => {
                let row = TxnsRow { base_offset: 0, end_offset: 2, created_ms: self.pg_now(), hashes: &torn };
                let last_offset = log.last_offset.max(2);
                let hydration = Hydration { partition, window_ms: log.window_ms.max(1), last_offset, rows: &[row] };
                let now = self.now();
                let result = self.cache.hydrate(now, &hydration);
                ensure!(result == Err(HydrateError::Malformed), "a torn hydration answered {result:?}");
            }
        }
        Ok(())
    }

    fn plan(&mut self, segments: &[Segment<'_>]) -> Result<Vec<Plan>, String> {
        self.planned_at = self.now();
        let plans = self.cache.plan(self.planned_at, segments);
        self.segments_planned += segments.len() as u64;
        ensure!(plans.len() == segments.len(), "{} plans for {} segments", plans.len(), segments.len());
        Ok(plans)
    }

    /// Plans one segment of fresh hashes without committing it.
    fn plan_fresh(&mut self, index: usize, window_ms: u64) -> Result<(Plan, Vec<Hash>), String> {
        let hashes = vec![self.fresh_hash(), self.fresh_hash()];
        let bytes = encode(&hashes);
        let segment = Segment { partition: PARTITIONS[index], window_ms, hashes: &bytes };
        let plan = self.plan(&[segment])?.pop().expect("one plan");
        Ok((plan, hashes))
    }

    /// Checks one plan against the model. `hashes` is `None` for a torn
    /// segment; `fresh_only` when every hash is new to every partition.
    fn check_plan(&self, index: usize, hashes: Option<&[Hash]>, fresh_only: bool, plan: &Plan) -> Checked {
        let log = self.database.log(PARTITIONS[index]);
        let p = plan.p_verified;
        ensure!(p >= NO_VOUCH, "p_verified {p} is below -1");
        // A hit narrows the answer below the allocator (the soundness check
        // below then proves it narrowed below every stored occurrence).
        ensure!(
            plan.local_hits.is_empty() || p < log.last_offset,
            "local hits {:?} with p_verified {p} at the allocator {}",
            plan.local_hits,
            log.last_offset
        );
        ensure!(plan.local_hits.is_sorted_by(|a, b| a < b), "local hits not ascending: {:?}", plan.local_hits);
        if plan.state != EntryState::Vouching {
            ensure!(p == NO_VOUCH, "state {:?} vouched for {p}", plan.state);
        }
        if log.window_ms == 0 {
            ensure!(p == NO_VOUCH && plan.state == EntryState::Cold, "window 0 planned as {plan:?}");
        }
        let Some(hashes) = hashes else {
            ensure!(p == NO_VOUCH && plan.local_hits.is_empty(), "a torn segment planned as {plan:?}");
            return Ok(());
        };
        for &hit in &plan.local_hits {
            let hash = hashes.get(hit as usize).copied();
            ensure!(hash.is_some_and(|h| log.ever_committed(h)), "local hit {hit} was never committed here");
        }
        if p >= 0 && !self.push_honours_vouches() {
            // The push function probes the whole window instead. Only a step
            // back of PostgreSQL's clock that the host has not read yet may
            // cost that: a host clock ahead of the database's would cost it
            // on every push.
            ensure!(
                self.clocks.db_stepped_back_unseen,
                "the cache planned at {} ({} ms ahead of PostgreSQL's clock, beyond the slack): the push function refuses its vouch",
                self.planned_at,
                self.planned_at - self.pg_now()
            );
            return Ok(());
        }
        if p >= 0 {
            // The soundness invariant.
            ensure!(p <= log.last_offset, "vouched for {p} past the allocator at {}", log.last_offset);
            let window_start = self.pg_now() - log.window_ms as Millis;
            for (i, &hash) in hashes.iter().enumerate() {
                ensure!(
                    !log.in_window_at_or_below(hash, p, window_start),
                    "UNSOUND: vouched for {p} but hash {i} ({hash:#x}) is stored in the window at or below it"
                );
            }
        }
        if plan.state == EntryState::Vouching {
            if fresh_only {
                ensure!(plan.local_hits.is_empty(), "fresh hashes reported as local hits: {:?}", plan.local_hits);
            }
            // Completeness holds only while the push function honours the
            // cache's judgement of age: after PostgreSQL's clock stepped back
            // beyond the slack, unseen, hashes the cache rightly expired are
            // inside the window again, and the push function probes them.
            let unseen_step_back = self.clocks.db_stepped_back_unseen && !self.push_honours_vouches();
            if self.hosts[index].in_sync && !unseen_step_back {
                if plan.local_hits.is_empty() {
                    ensure!(
                        p == log.last_offset,
                        "a vouching entry told every commit answered {p}, not the allocator {}",
                        log.last_offset
                    );
                }
                // An entry that vouches for the allocator holds every
                // in-window hash; one it did not report would be vouched for
                // in a segment of its own.
                let window_start = self.pg_now() - log.window_ms as Millis;
                for (i, &hash) in hashes.iter().enumerate() {
                    let stored = log.in_window_at_or_below(hash, log.last_offset, window_start);
                    ensure!(
                        !stored || plan.local_hits.binary_search(&(i as u32)).is_ok(),
                        "hash {i} ({hash:#x}) is stored in the window but was not a local hit"
                    );
                }
            }
        }
        Ok(())
    }

    /// Whether the push function would honour a vouch of the latest plan:
    /// its clock is at or past the plan's `now` less the skew slack (with the
    /// push guard on, as stile's push function has it).
    fn push_honours_vouches(&self) -> bool {
        let floor = self.planned_at.saturating_sub(Millis::from(self.scenario.config.skew_slack_ms));
        !self.host.push_guard || self.pg_now() >= floor
    }

    fn check_stats(&mut self) -> Checked {
        let stats = self.cache.stats();
        let last = self.last_stats;
        ensure!(
            stats.segments_planned == self.segments_planned,
            "segments_planned {} != {}",
            stats.segments_planned,
            self.segments_planned
        );
        ensure!(stats.hydrations == self.hydrations, "hydrations {} != {}", stats.hydrations, self.hydrations);
        ensure!(stats.vouching <= stats.entries, "{stats:?}");
        ensure!(stats.entries <= PARTITIONS.len() as u64 && stats.suppressed <= PARTITIONS.len() as u64, "{stats:?}");
        ensure!(stats.segments_vouched <= stats.segments_planned, "{stats:?}");
        ensure!(stats.local_hits <= stats.hashes_checked, "{stats:?}");
        ensure!(stats.entries > 0 || (stats.hashes == 0 && stats.generations == 0), "{stats:?}");
        let monotone = [
            (last.segments_vouched, stats.segments_vouched),
            (last.hashes_checked, stats.hashes_checked),
            (last.bloom_maybes, stats.bloom_maybes),
            (last.local_hits, stats.local_hits),
            (last.evictions, stats.evictions),
            (last.expired_generations, stats.expired_generations),
        ];
        ensure!(monotone.iter().all(|(before, after)| before <= after), "a counter went back: {last:?} -> {stats:?}");
        self.last_stats = stats;
        Ok(())
    }

    /// The hashes of a segment, and whether they are all fresh.
    fn hashes_of(&mut self, segment: &PushSegment) -> (Vec<Hash>, bool) {
        let mut hashes: Vec<Hash> = segment.ids.iter().map(|&id| self.hash_of(id)).collect();
        if let Some((start, length)) = segment.range {
            hashes.extend((0..u64::from(length)).map(|i| self.hash_of(start.wrapping_add(i))));
        }
        let fresh_only = hashes.is_empty() && segment.fresh > 0;
        for _ in 0..segment.fresh {
            let hash = self.fresh_hash();
            hashes.push(hash);
        }
        (hashes, fresh_only)
    }

    fn hash_of(&self, id: u64) -> Hash {
        self.mix(id % self.scenario.hash_space)
    }

    fn fresh_hash(&mut self) -> Hash {
        self.fresh_ids += 1;
        self.mix(FRESH_BASE + self.fresh_ids)
    }

    /// Ids to hashes: injective either way, uniformly spread when mixed.
    fn mix(&self, id: u64) -> Hash {
        if self.scenario.mix_hashes {
            u128::from(splitmix(id)) << 64 | u128::from(splitmix(id ^ 0x5bd1_e995_5bd1_e995))
        } else {
            u128::from(id)
        }
    }
}

fn commit_of<'a>(partition: PartitionId, row: &Row, bytes: &'a [u8]) -> Commit<'a> {
    Commit { partition, base_offset: row.base_offset, created_ms: row.created_ms, hashes: bytes }
}

/// A bijection on u64 with good avalanche (splitmix64's finalizer).
fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Fisher-Yates with a seeded generator: hydration rows come in any order.
fn shuffle_rows(rows: &mut [Row], seed: u64) {
    let mut state = seed;
    for i in (1..rows.len()).rev() {
        state = splitmix(state);
        rows.swap(i, (state % (i as u64 + 1)) as usize);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Shard;
    use crate::testing::Forwarding;
    use crate::testing::strategy::Estimate;

    fn scenario(ops: Vec<Op>) -> Scenario {
        Scenario {
            config: ShardConfig { budget_bytes: 1 << 40, skew_slack_ms: 5_000 },
            wall_skew_ms: 0,
            hash_space: 1 << 40,
            mix_hashes: true,
            windows_ms: [60_000; 4],
            ops,
        }
    }

    fn push(partition: usize, ids: Vec<u64>) -> Op {
        Op::Push { segments: vec![PushSegment { partition, ids, range: None, fresh: 0, reported: true }] }
    }

    fn rebuild(partition: usize) -> Op {
        Op::Rebuild { partition, stale: false, estimate: Estimate::Model, extra_slack_ms: 0, shuffle: 1 }
    }

    /// A cache that vouches for everything it is asked about: the driver
    /// must catch it.
    struct Reckless(Shard);

    impl Forwarding for Reckless {
        fn inner(&mut self) -> &mut dyn DedupCache {
            &mut self.0
        }

        fn plan(&mut self, now_ms: Millis, segments: &[Segment<'_>]) -> Vec<Plan> {
            let mut plans = self.0.plan(now_ms, segments);
            for plan in &mut plans {
                if plan.state == EntryState::Vouching {
                    plan.local_hits.clear();
                    plan.p_verified = plan.p_verified.max(0);
                }
            }
            plans
        }
    }

    /// A cache that never vouches: sound, and caught by the liveness checks.
    struct Timid(Shard);

    impl Forwarding for Timid {
        fn inner(&mut self) -> &mut dyn DedupCache {
            &mut self.0
        }

        fn plan(&mut self, now_ms: Millis, segments: &[Segment<'_>]) -> Vec<Plan> {
            let mut plans = self.0.plan(now_ms, segments);
            plans.iter_mut().for_each(|plan| plan.p_verified = NO_VOUCH);
            plans
        }
    }

    #[test]
    fn the_shard_passes_a_simple_scenario() {
        let ops = vec![
            push(0, vec![1, 2]),
            rebuild(0),
            push(0, vec![3]),
            push(0, vec![1, 4]),
            Op::Tick { ms: 70_000 },
            push(0, vec![1]),
        ];
        assert_eq!(run(&scenario(ops), Shard::new), Ok(()));
    }

    /// The rule the gateway once had: its wall clock, less the lead over
    /// PostgreSQL's clock it last saw in a commit, held monotone.
    struct WallLessLead {
        lead_ms: Millis,
        held_ms: Millis,
    }

    impl HostClock for WallLessLead {
        fn observe(&mut self, db_ms: Millis, _mono_ms: Millis, wall_ms: Millis) -> Reading {
            self.lead_ms = (wall_ms - db_ms).max(0);
            Reading::Consistent
        }

        fn now(&mut self, _mono_ms: Millis, wall_ms: Millis) -> Millis {
            self.held_ms = self.held_ms.max(wall_ms - self.lead_ms);
            self.held_ms
        }
    }

    fn wall_less_lead(push_guard: bool) -> Host {
        Host { clock: Box::new(WallLessLead { lead_ms: 0, held_ms: Millis::MIN }), push_guard }
    }

    fn database_clock(push_guard: bool) -> Host {
        Host { clock: Box::new(DbClock::new(START_MS, 0, 5_000)), push_guard }
    }

    /// A gateway 150 s ahead of PostgreSQL, a 60 s window: the same id three
    /// times (the operator's report that opened this check).
    fn ahead_of_the_database() -> Scenario {
        let mut scenario = scenario(vec![push(0, vec![1]), rebuild(0), push(0, vec![1]), push(0, vec![1])]);
        scenario.wall_skew_ms = 150_000;
        scenario
    }

    #[test]
    fn a_host_that_judges_age_by_its_wall_clock_stores_duplicates() {
        let violation = run_as(&ahead_of_the_database(), Shard::new, wall_less_lead(false)).unwrap_err();
        assert_eq!(violation.step, 2);
        assert!(violation.message.contains("UNSOUND"), "{violation}");
        // With the push function's guard it stays exact, but every vouch is
        // refused: caught as well.
        let violation = run_as(&ahead_of_the_database(), Shard::new, wall_less_lead(true)).unwrap_err();
        assert_eq!(violation.step, 1, "the check right after hydrating: {violation}");
        assert!(violation.message.contains("refuses its vouch"), "{violation}");
        // PostgreSQL's clock, as the host bounds it, is exact and vouches.
        assert_eq!(run(&ahead_of_the_database(), Shard::new), Ok(()));
    }

    #[test]
    fn a_database_clock_stepping_back_is_covered_by_the_push_guard_until_the_host_reads_it() {
        // The hash is stored at T; at T + 70 s the cache expires it (60 s
        // window + 5 s slack); PostgreSQL's clock then steps back to
        // T + 40 s, where the hash is inside the window again.
        let ops = vec![
            push(0, vec![1]),
            rebuild(0),
            Op::Tick { ms: 70_000 },
            Op::Expire,
            Op::StepDatabaseClock { ms: -30_000 },
            push(0, vec![1]),
            push(0, vec![1]),
            push(0, vec![2]),
        ];
        let violation = run_as(&scenario(ops.clone()), Shard::new, database_clock(false)).unwrap_err();
        assert_eq!(violation.step, 5);
        assert!(violation.message.contains("UNSOUND"), "{violation}");
        // The guard refuses that vouch; the push's reading reveals the step,
        // the cache is replaced, and the host vouches again after rebuilding.
        let mut ops = ops;
        ops.extend([rebuild(0), push(0, vec![1]), push(0, vec![3])]);
        assert_eq!(run_as(&scenario(ops), Shard::new, database_clock(true)), Ok(()));
    }

    #[test]
    fn a_hash_expired_before_an_unseen_step_back_need_not_be_a_local_hit() {
        // With no slack, a hash stored at T - 224 ms leaves the cache's 1 s
        // window at T + 777 ms; PostgreSQL's clock then steps back 1 ms,
        // unseen, and the hash is inside its window again. The cache cannot
        // know; the push function refuses the plan's vouch, and a plan that
        // narrowed to -1 for another hit probes the whole window anyway.
        let range = |partition| Op::Push {
            segments: vec![PushSegment { partition, ids: vec![], range: Some((0, 2)), fresh: 0, reported: false }],
        };
        let ops = vec![
            push(2, vec![0]),
            Op::StepDatabaseClock { ms: -224 },
            rebuild(2),
            range(2),
            Op::Tick { ms: 1_001 },
            rebuild(2),
            Op::StepDatabaseClock { ms: -1 },
            range(2),
        ];
        let mut scenario = scenario(ops);
        scenario.config = ShardConfig { budget_bytes: 20_000, skew_slack_ms: 0 };
        scenario.hash_space = 64;
        scenario.mix_hashes = false;
        scenario.windows_ms = [0, 0, 1_000, 0];
        assert_eq!(run(&scenario, Shard::new), Ok(()));
    }

    #[test]
    fn a_cache_that_vouches_over_a_stored_duplicate_is_caught() {
        let ops = vec![push(0, vec![1, 2]), rebuild(0), push(0, vec![1])];
        let violation = run(&scenario(ops), |config| Reckless(Shard::new(config))).unwrap_err();
        assert_eq!(violation.step, 2);
        assert!(violation.message.contains("UNSOUND"), "{violation}");
    }

    #[test]
    fn a_cache_that_never_vouches_is_caught() {
        let ops = vec![push(0, vec![1, 2]), rebuild(0)];
        let violation = run(&scenario(ops), |config| Timid(Shard::new(config))).unwrap_err();
        assert_eq!(violation.step, 1);
    }

    #[test]
    fn a_cache_that_miscounts_is_caught() {
        struct Forgetful(Shard);
        impl Forwarding for Forgetful {
            fn inner(&mut self) -> &mut dyn DedupCache {
                &mut self.0
            }

            fn record_commits(&mut self, _: Millis, _: &[Commit<'_>]) {}
        }
        // Dropping commits on the floor leaves the entry vouching for an old
        // watermark: sound, but not what the contract promises.
        let ops = vec![rebuild(0), push(0, vec![1]), push(0, vec![2])];
        let violation = run(&scenario(ops), |config| Forgetful(Shard::new(config))).unwrap_err();
        assert_eq!(violation.step, 2);
        assert!(violation.message.contains("not the allocator"), "{violation}");
    }
}
