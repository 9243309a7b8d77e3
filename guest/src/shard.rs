//! One shard's cache: every partition entry the shard holds, the budget they
//! share, and the counters behind [`Stats`].
//!
//! The shard does no I/O and reads no clock; the host passes `now` in
//! milliseconds with every call. Its one load-bearing output is each plan's
//! `p_verified`, and -1 is always a sound answer: every path that is unsure
//! (no entry, a gap, a rebuild, a suppressed partition, malformed input)
//! takes it. A local hit narrows the answer to just below the oldest place
//! in the ring that holds one of the segment's hashes.

use alloc::collections::BTreeMap;
use alloc::vec::Vec;

use crate::api::*;
use crate::budget::{Budget, Gate};
use crate::cache::DedupCache;
use crate::entry::{Condition, Entry, Workspace};

/// One shard's cache.
#[derive(Debug)]
pub struct Shard {
    config: ShardConfig,
    entries: BTreeMap<PartitionId, Entry>,
    budget: Budget,
    counters: Counters,
    /// The latest `now` seen, for gauges that depend on time.
    now_ms: Millis,
    workspace: Workspace,
}

/// The monotone counters of [`Stats`].
#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    segments_planned: u64,
    segments_vouched: u64,
    hashes_checked: u64,
    bloom_maybes: u64,
    local_hits: u64,
    hydrations: u64,
    evictions: u64,
    expired_generations: u64,
}

impl Shard {
    pub fn new(config: ShardConfig) -> Shard {
        Shard {
            config,
            entries: BTreeMap::new(),
            budget: Budget::new(config.budget_bytes),
            counters: Counters::default(),
            now_ms: Millis::MIN,
            workspace: Workspace::default(),
        }
    }

    /// The configuration the shard was made with.
    pub fn config(&self) -> ShardConfig {
        self.config
    }

    /// Whether the partition has an entry (in any state). A read only: it
    /// neither marks the partition used nor expires anything.
    pub fn is_resident(&self, partition: PartitionId) -> bool {
        self.entries.contains_key(&partition)
    }
}

impl DedupCache for Shard {
    /// Plans one flush: a `p_verified` per segment, in order. Planning
    /// expires each touched entry first and marks it used.
    fn plan(&mut self, now_ms: Millis, segments: &[Segment<'_>]) -> Vec<Plan> {
        self.observe(now_ms);
        segments.iter().map(|segment| self.plan_segment(now_ms, segment)).collect()
    }

    /// Records committed segments in allocation order. Commits to partitions
    /// without an entry are ignored: entries are born only by hydration.
    fn record_commits(&mut self, now_ms: Millis, commits: &[Commit<'_>]) {
        self.observe(now_ms);
        for commit in commits {
            let Some(entry) = self.entries.get_mut(&commit.partition) else {
                continue;
            };
            entry.record(commit.base_offset, commit.created_ms, commit.hashes, &mut self.workspace);
            self.budget.account(commit.partition, entry.bytes() as u64, now_ms);
            self.budget.touch(commit.partition, now_ms);
        }
        self.evict_over_budget(now_ms);
        self.check();
    }

    /// The admission gate before a hydration.
    fn admit(&mut self, now_ms: Millis, partition: PartitionId, window_ms: u64, estimate_hashes: u64) -> Admission {
        self.observe(now_ms);
        if window_ms == 0 {
            // Nothing would be held; `hydrate` answers `WindowOff`.
            return Admission::Hydrate;
        }
        if self.budget.cooling(partition, now_ms) {
            return Admission::Suppressed;
        }
        if let Some(entry) = self.entries.get(&partition) {
            let cheap = match entry.condition() {
                Condition::Vouching => entry.window_ms() == window_ms,
                Condition::Gap => true,
                Condition::Rebuild => false,
            };
            if cheap {
                return Admission::Hydrate;
            }
        }
        if estimate_hashes == 0 && !self.budget.has_hint(partition) {
            // A partition new to PostgreSQL has an empty window.
            return Admission::Hydrate;
        }
        let estimate = self.budget.estimate(partition, estimate_hashes);
        match self.budget.gate(partition, estimate, now_ms) {
            Gate::Fits => Admission::Hydrate,
            Gate::FitsAfterEvicting(victims) => {
                for victim in victims {
                    self.evict(victim, now_ms);
                }
                self.check();
                Admission::Hydrate
            }
            Gate::Refused => {
                // A resident entry here needs a rebuild it cannot have: it is
                // dead weight until the cooldown ends.
                if self.entries.contains_key(&partition) {
                    self.evict(partition, now_ms);
                }
                self.budget.suppress(partition, now_ms);
                self.check();
                Admission::Suppressed
            }
        }
    }

    /// Installs a full-window read as the partition's entry, replacing any
    /// old one. A refused hydration leaves the old entry as it was.
    fn hydrate(&mut self, now_ms: Millis, hydration: &Hydration<'_>) -> Result<(), HydrateError> {
        self.observe(now_ms);
        let partition = hydration.partition;
        if hydration.window_ms == 0 {
            self.drop_entry(partition);
            return Err(HydrateError::WindowOff);
        }
        let mut entry = Entry::hydrate(hydration.window_ms, hydration.last_offset, hydration.rows, &mut self.workspace)?;
        // Rows older than the window plus slack only widen coverage; drop
        // them now rather than carry them until the first plan.
        self.counters.expired_generations += entry.expire(now_ms, self.config.skew_slack_ms) as u64;
        self.budget.account(partition, entry.bytes() as u64, now_ms);
        self.budget.touch(partition, now_ms);
        self.budget.clear_memory(partition);
        self.entries.insert(partition, entry);
        self.counters.hydrations += 1;
        self.evict_over_budget(now_ms);
        self.check();
        Ok(())
    }

    /// Expires every entry and ends finished cooldowns.
    fn expire(&mut self, now_ms: Millis) {
        self.observe(now_ms);
        for (&partition, entry) in &mut self.entries {
            let expired = entry.expire(now_ms, self.config.skew_slack_ms);
            if expired > 0 {
                self.counters.expired_generations += expired as u64;
                self.budget.account(partition, entry.bytes() as u64, now_ms);
            }
        }
        self.budget.end_cooldowns(now_ms);
        self.check();
    }

    /// Forgets a partition entirely: entry, footprint hint and cooldown.
    fn forget(&mut self, partition: PartitionId) {
        self.drop_entry(partition);
        self.budget.clear_memory(partition);
        self.check();
    }

    /// `segments_vouched` counts the segments answered with the entry's
    /// `verified_upto`, which for an empty partition is -1 (PostgreSQL then
    /// has nothing to probe either).
    fn stats(&mut self) -> Stats {
        let counters = self.counters;
        let entries = self.entries.values();
        Stats {
            entries: self.entries.len() as u64,
            vouching: entries.clone().filter(|entry| entry.condition() == Condition::Vouching).count() as u64,
            bytes: self.budget.total(),
            hashes: entries.clone().map(|entry| entry.held() as u64).sum(),
            generations: entries.map(|entry| entry.generation_count() as u64).sum(),
            suppressed: self.budget.suppressed_count(self.now_ms) as u64,
            segments_planned: counters.segments_planned,
            segments_vouched: counters.segments_vouched,
            hashes_checked: counters.hashes_checked,
            bloom_maybes: counters.bloom_maybes,
            local_hits: counters.local_hits,
            hydrations: counters.hydrations,
            evictions: counters.evictions,
            expired_generations: counters.expired_generations,
        }
    }
}

impl Shard {
    fn plan_segment(&mut self, now_ms: Millis, segment: &Segment<'_>) -> Plan {
        self.counters.segments_planned += 1;
        let partition = segment.partition;
        if segment.window_ms == 0 {
            self.drop_entry(partition);
            return Plan { p_verified: NO_VOUCH, local_hits: Vec::new(), state: EntryState::Cold };
        }
        let Some(entry) = self.entries.get_mut(&partition) else {
            let state = if self.budget.cooling(partition, now_ms) { EntryState::Suppressed } else { EntryState::Cold };
            return Plan { p_verified: NO_VOUCH, local_hits: Vec::new(), state };
        };
        let expired = entry.expire(now_ms, self.config.skew_slack_ms);
        self.counters.expired_generations += expired as u64;
        let mut local_hits = Vec::new();
        let answer = entry.plan(segment.window_ms, segment.hashes, &mut self.workspace, &mut local_hits);
        self.counters.segments_vouched += u64::from(answer.vouched);
        self.counters.hashes_checked += answer.checked as u64;
        self.counters.bloom_maybes += answer.maybes as u64;
        self.counters.local_hits += local_hits.len() as u64;
        let state = entry.condition().state();
        // Planning reads the ring; only an expiry changes its footprint.
        if expired > 0 {
            self.budget.account(partition, entry.bytes() as u64, now_ms);
        }
        self.budget.touch(partition, now_ms);
        debug_assert!(local_hits.is_empty() || answer.p_verified < entry.verified_upto());
        Plan { p_verified: answer.p_verified, local_hits, state }
    }

    /// Evicts idle entries, least recently used first, while the cache is
    /// over its budget.
    fn evict_over_budget(&mut self, now_ms: Millis) {
        for victim in self.budget.over_budget_victims(now_ms) {
            self.evict(victim, now_ms);
        }
    }

    /// Drops an entry for the budget's sake, remembering its footprint so
    /// that its next admission is tested against what it really cost.
    fn evict(&mut self, partition: PartitionId, now_ms: Millis) {
        let removed = self.entries.remove(&partition);
        debug_assert!(removed.is_some());
        let bytes = self.budget.release(partition);
        self.budget.remember_footprint(partition, bytes, now_ms);
        self.counters.evictions += 1;
    }

    /// Drops an entry without remembering anything about it.
    fn drop_entry(&mut self, partition: PartitionId) {
        if self.entries.remove(&partition).is_some() {
            self.budget.release(partition);
        }
    }

    fn observe(&mut self, now_ms: Millis) {
        self.now_ms = self.now_ms.max(now_ms);
    }

    fn check(&self) {
        debug_assert!(
            self.entries
                .values()
                .all(|entry| entry.condition() != Condition::Vouching || entry.hydrated_from() <= entry.verified_upto())
        );
        debug_assert!(self.entries.iter().all(|(&p, entry)| self.budget.resident_bytes(p) == entry.bytes() as u64));
        debug_assert_eq!(self.budget.total(), self.entries.values().map(|entry| entry.bytes() as u64).sum::<u64>());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::{COOLDOWN_MS, RECENT_USE_MS, USE_SLOT_MS};
    use crate::hash::{Hash, encode};
    use alloc::vec;

    const WINDOW: u64 = 60_000;
    const BIG: u64 = 1 << 32;

    fn shard(budget_bytes: u64) -> Shard {
        Shard::new(ShardConfig { budget_bytes, skew_slack_ms: ShardConfig::DEFAULT_SKEW_SLACK_MS })
    }

    fn plan_one(shard: &mut Shard, now: Millis, partition: PartitionId, hashes: &[Hash]) -> Plan {
        let bytes = encode(hashes);
        let segment = Segment { partition, window_ms: WINDOW, hashes: &bytes };
        shard.plan(now, &[segment]).pop().unwrap()
    }

    fn commit(shard: &mut Shard, now: Millis, partition: PartitionId, base_offset: Offset, hashes: &[Hash]) {
        let bytes = encode(hashes);
        shard.record_commits(now, &[Commit { partition, base_offset, created_ms: now, hashes: &bytes }]);
    }

    fn hydrate_empty(shard: &mut Shard, now: Millis, partition: PartitionId, last_offset: Offset) {
        let hydration = Hydration { partition, window_ms: WINDOW, last_offset, rows: &[] };
        shard.hydrate(now, &hydration).unwrap();
    }

    /// An entry holding `hashes` distinct hashes committed at `now`.
    fn hydrate_with(shard: &mut Shard, now: Millis, partition: PartitionId, hashes: u64) {
        let all: Vec<Hash> = (0..hashes).map(|i| u128::from(i) << 64 | u128::from(i) | 1 << 127).collect();
        let bytes = encode(&all);
        let rows = [TxnsRow { base_offset: 0, end_offset: hashes as Offset - 1, created_ms: now, hashes: &bytes }];
        let hydration = Hydration { partition, window_ms: WINDOW, last_offset: hashes as Offset - 1, rows: &rows };
        shard.hydrate(now, &hydration).unwrap();
    }

    fn vouching(p_verified: Offset) -> Plan {
        Plan { p_verified, local_hits: vec![], state: EntryState::Vouching }
    }

    #[test]
    fn the_steady_state_vouches_for_the_allocator() {
        let mut shard = shard(BIG);
        let cold = plan_one(&mut shard, 0, 1, &[10]);
        assert_eq!((cold.p_verified, cold.state), (NO_VOUCH, EntryState::Cold));
        assert_eq!(shard.admit(0, 1, WINDOW, 0), Admission::Hydrate);
        hydrate_empty(&mut shard, 0, 1, 4);
        assert_eq!(plan_one(&mut shard, 1, 1, &[10, 11]), vouching(4));
        commit(&mut shard, 1, 1, 5, &[10, 11]);
        assert_eq!(plan_one(&mut shard, 2, 1, &[12]), vouching(6));
        let hit = plan_one(&mut shard, 3, 1, &[12, 11]);
        // 11 was committed at 6: the probe starts there.
        assert_eq!((hit.p_verified, hit.local_hits, hit.state), (5, vec![1], EntryState::Vouching));
        let stats = shard.stats();
        assert_eq!((stats.segments_planned, stats.segments_vouched, stats.local_hits), (4, 2, 1));
        assert_eq!((stats.entries, stats.vouching, stats.hashes, stats.generations, stats.hydrations), (1, 1, 2, 1, 1));
        assert_eq!(stats.hashes_checked, 5);
        assert!(stats.bloom_maybes >= 1);
        // Two hashes and no filter yet: a generation allocates its filter
        // only once it holds `FILTER_FROM` hashes.
        assert!(stats.bytes >= 2 * 16 && stats.bytes < 2 * 1024, "{stats:?}");
    }

    #[test]
    fn one_flush_plans_many_partitions_in_order() {
        let mut shard = shard(BIG);
        hydrate_empty(&mut shard, 0, 1, 10);
        hydrate_empty(&mut shard, 0, 2, 20);
        let (a, b) = (encode(&[1]), encode(&[2]));
        let segments = [
            Segment { partition: 2, window_ms: WINDOW, hashes: &b },
            Segment { partition: 3, window_ms: WINDOW, hashes: &a },
            Segment { partition: 1, window_ms: WINDOW, hashes: &a },
        ];
        let plans: Vec<(Offset, EntryState)> = shard.plan(1, &segments).into_iter().map(|p| (p.p_verified, p.state)).collect();
        assert_eq!(plans, [(20, EntryState::Vouching), (NO_VOUCH, EntryState::Cold), (10, EntryState::Vouching)]);
    }

    #[test]
    fn commits_without_an_entry_are_ignored_and_gaps_are_reported() {
        let mut shard = shard(BIG);
        commit(&mut shard, 0, 1, 0, &[1]);
        assert_eq!(shard.stats().entries, 0);
        hydrate_empty(&mut shard, 0, 1, 0);
        commit(&mut shard, 1, 1, 3, &[2]);
        assert_eq!(plan_one(&mut shard, 2, 1, &[9]).state, EntryState::Gap);
        assert_eq!(shard.admit(2, 1, WINDOW, 1_000_000_000), Admission::Hydrate, "a gap is a cheap admission");
    }

    #[test]
    fn window_zero_holds_nothing() {
        let mut shard = shard(BIG);
        hydrate_empty(&mut shard, 0, 1, 3);
        let bytes = encode(&[1]);
        let plan = shard.plan(1, &[Segment { partition: 1, window_ms: 0, hashes: &bytes }]).pop().unwrap();
        assert_eq!((plan.p_verified, plan.state), (NO_VOUCH, EntryState::Cold));
        assert_eq!((shard.stats().entries, shard.stats().bytes), (0, 0));
        let off = Hydration { partition: 1, window_ms: 0, last_offset: 3, rows: &[] };
        assert_eq!(shard.hydrate(1, &off), Err(HydrateError::WindowOff));
        assert_eq!(shard.admit(1, 1, 0, 1 << 40), Admission::Hydrate);
    }

    #[test]
    fn a_window_change_is_sticky_until_rehydrated_under_the_new_window() {
        let mut shard = shard(BIG);
        hydrate_empty(&mut shard, 0, 1, 3);
        let bytes = encode(&[1]);
        let wider = Segment { partition: 1, window_ms: 2 * WINDOW, hashes: &bytes };
        assert_eq!(shard.plan(1, &[wider]).pop().unwrap().state, EntryState::Rebuild);
        assert_eq!(plan_one(&mut shard, 2, 1, &[1]).state, EntryState::Rebuild);
        let rehydration = Hydration { partition: 1, window_ms: 2 * WINDOW, last_offset: 3, rows: &[] };
        shard.hydrate(3, &rehydration).unwrap();
        let plan = shard.plan(4, &[wider]).pop().unwrap();
        assert_eq!((plan.p_verified, plan.state), (3, EntryState::Vouching));
    }

    #[test]
    fn a_malformed_hydration_keeps_the_old_entry() {
        let mut shard = shard(BIG);
        hydrate_empty(&mut shard, 0, 1, 3);
        let bytes = encode(&[1, 2]);
        let rows = [TxnsRow { base_offset: 4, end_offset: 4, created_ms: 0, hashes: &bytes }];
        let bad = Hydration { partition: 1, window_ms: WINDOW, last_offset: 9, rows: &rows };
        assert_eq!(shard.hydrate(1, &bad), Err(HydrateError::Malformed));
        assert_eq!(plan_one(&mut shard, 2, 1, &[1]), vouching(3));
        assert_eq!(shard.stats().hydrations, 1);
    }

    #[test]
    fn malformed_segments_answer_minus_one_without_hits() {
        let mut shard = shard(BIG);
        hydrate_empty(&mut shard, 0, 1, 3);
        let torn = [0u8; 24];
        let plan = shard.plan(1, &[Segment { partition: 1, window_ms: WINDOW, hashes: &torn }]).pop().unwrap();
        assert_eq!((plan.p_verified, plan.local_hits.len(), plan.state), (NO_VOUCH, 0, EntryState::Vouching));
        shard.record_commits(1, &[Commit { partition: 1, base_offset: 4, created_ms: 1, hashes: &torn }]);
        assert_eq!(plan_one(&mut shard, 2, 1, &[5]).state, EntryState::Rebuild);
    }

    #[test]
    fn brand_new_partitions_always_pass_and_big_ones_are_suppressed_with_a_cooldown() {
        // Room for about one 8 KiB filter and a few thousand hashes.
        let mut shard = shard(100_000);
        hydrate_with(&mut shard, 0, 1, 4_000);
        assert_eq!(shard.admit(1, 2, WINDOW, 0), Admission::Hydrate);
        // Partition 1 was used a moment ago, so nothing can be evicted.
        assert_eq!(shard.admit(1, 3, WINDOW, 3_000), Admission::Suppressed);
        let plan = plan_one(&mut shard, 2, 3, &[1]);
        assert_eq!((plan.p_verified, plan.state), (NO_VOUCH, EntryState::Suppressed));
        assert_eq!(shard.stats().suppressed, 1);
        // During the cooldown the gate is not re-tested, even with room.
        shard.forget(1);
        assert_eq!(shard.admit(COOLDOWN_MS, 3, WINDOW, 3_000), Admission::Suppressed);
        assert_eq!(shard.admit(COOLDOWN_MS + 1, 3, WINDOW, 3_000), Admission::Hydrate);
        assert_eq!(shard.stats().suppressed, 0);
    }

    #[test]
    fn admission_evicts_idle_partitions_and_remembers_their_footprint() {
        let mut shard = shard(200_000);
        hydrate_with(&mut shard, 0, 1, 4_000);
        hydrate_with(&mut shard, 0, 2, 4_000);
        let footprint = shard.budget.resident_bytes(1);
        // The first moment a use at 0 counts as idle.
        let now = RECENT_USE_MS + USE_SLOT_MS - 1;
        plan_one(&mut shard, now, 2, &[1]);
        // Needs the room of one idle partition: 1 goes, 2 (just used) stays.
        assert_eq!(shard.admit(now, 3, WINDOW, 5_000), Admission::Hydrate);
        assert_eq!(plan_one(&mut shard, now, 1, &[1]).state, EntryState::Cold);
        assert_eq!(plan_one(&mut shard, now, 2, &[1]).state, EntryState::Vouching);
        assert_eq!(shard.stats().evictions, 1);
        // The hint now overrides the host's estimate, either way.
        assert_eq!(shard.budget.estimate(1, 0), footprint);
        assert_eq!(shard.budget.estimate(1, 1 << 30), footprint);
    }

    #[test]
    fn a_refused_rebuild_drops_the_stale_entry() {
        let mut shard = shard(100_000);
        hydrate_with(&mut shard, 0, 1, 4_000);
        hydrate_with(&mut shard, 0, 2, 1_000);
        commit(&mut shard, 1, 2, 0, &[1]);
        assert_eq!(plan_one(&mut shard, 1, 2, &[1]).state, EntryState::Rebuild);
        assert_eq!(shard.admit(1, 2, WINDOW, 4_000), Admission::Suppressed);
        assert_eq!(shard.stats().entries, 1);
        assert_eq!(plan_one(&mut shard, 2, 2, &[1]).state, EntryState::Suppressed);
    }

    #[test]
    fn commits_past_the_budget_evict_idle_partitions() {
        // 3,000 hashes hold a hot buffer of 4,096 (64 KiB) and an 8 KiB
        // filter: alone they fit, beside partition 1 they do not.
        let mut shard = shard(90_000);
        hydrate_with(&mut shard, 0, 1, 1_000);
        hydrate_with(&mut shard, 0, 2, 1_000);
        let now = 10_000;
        plan_one(&mut shard, now, 2, &[0]);
        let fresh: Vec<Hash> = (0..2_000).map(|i| i << 100 | 7).collect();
        commit(&mut shard, now, 2, 1_000, &fresh);
        assert!(shard.stats().bytes <= 90_000);
        assert_eq!((shard.stats().entries, shard.stats().evictions), (1, 1));
        assert_eq!(plan_one(&mut shard, now, 2, &[5]), vouching(2_999));
    }

    #[test]
    fn expiry_frees_idle_partitions_and_keeps_accounts_straight() {
        let mut shard = shard(BIG);
        hydrate_with(&mut shard, 0, 1, 100);
        let full = shard.stats().bytes;
        shard.expire(WINDOW as Millis + 5_000);
        assert_eq!(shard.stats().generations, 1, "the slack keeps more, not less");
        shard.expire(WINDOW as Millis + 5_001);
        let stats = shard.stats();
        assert_eq!((stats.generations, stats.hashes, stats.expired_generations), (0, 0, 1));
        assert!(stats.bytes < full);
        assert_eq!(plan_one(&mut shard, WINDOW as Millis + 5_002, 1, &[1 << 127]), vouching(99));
    }

    #[test]
    fn forget_clears_entry_hint_and_cooldown() {
        let mut shard = shard(100_000);
        hydrate_with(&mut shard, 0, 1, 4_000);
        assert_eq!(shard.admit(0, 2, WINDOW, 10_000), Admission::Suppressed);
        shard.forget(2);
        shard.forget(1);
        assert_eq!(plan_one(&mut shard, 1, 2, &[1]).state, EntryState::Cold);
        assert_eq!(shard.stats(), Stats { segments_planned: 1, hydrations: 1, ..Stats::default() });
    }
}
