//! The memory budget of one shard: what every resident partition costs, which
//! were used least recently, and the admission gate that keeps full-window
//! rehydrations from thrashing the cache at its cap.
//!
//! The gate has three parts, each against one failure seen at the cap:
//!
//! - A fit test with hysteresis: a rebuild is admitted only if everything but
//!   the partition's own resident bytes, plus its estimated footprint, stays
//!   under [`FIT_PERCENT`] of the budget. The headroom stops an admission from
//!   forcing out the set it has just joined.
//! - A cooldown: a refused partition answers "suppressed" for
//!   [`COOLDOWN_MS`] without being re-tested.
//! - A recent-use guard: a partition used within [`RECENT_USE_MS`] is never
//!   evicted, neither to admit another nor to get back under the budget.
//!
//! The budget decides; the shard carries out evictions, because it owns the
//! entries. The auxiliary maps (cooldowns, footprint hints) are soft-capped
//! at [`AUX_SOFT_CAP`], so a workload churning through unboundedly many
//! partitions cannot grow them without bound.

use alloc::collections::{BTreeMap, BTreeSet};
use alloc::vec::Vec;

use crate::api::{Millis, PartitionId};

/// Admissions must leave the cache under this share of the budget.
pub const FIT_PERCENT: u64 = 90;

/// How long a refused partition stays suppressed.
pub const COOLDOWN_MS: Millis = 30_000;

/// A partition used this recently is never evicted.
pub const RECENT_USE_MS: Millis = 5_000;

/// Entries each auxiliary map may hold before it is pruned.
pub const AUX_SOFT_CAP: usize = 100_000;

/// The resolution of the least-recently-used order: partitions last used
/// within one slot are ordered by id. A use moves a partition in that order
/// only when it falls in a later slot, so that the order costs nothing on
/// most plans and commits (two tree updates each, otherwise). A partition
/// counts as idle once its whole slot lies [`RECENT_USE_MS`] in the past:
/// the recent-use guard lasts that long at least and one slot more at most,
/// and a walk for victims stops at the first slot that is not idle.
pub const USE_SLOT_MS: Millis = 1_000;

/// The estimated cost of one hash of a host's window estimate: 16 exact bytes
/// and 2 bytes of bloom filter.
pub const ESTIMATED_BYTES_PER_HASH: u64 = 18;

/// What the fit test allows for one admission.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Gate {
    /// It fits as things are.
    Fits,
    /// It fits once these idle partitions, least recently used first, are
    /// evicted.
    FitsAfterEvicting(Vec<PartitionId>),
    /// It cannot fit without evicting a recently used partition.
    Refused,
}

#[derive(Debug)]
pub struct Budget {
    limit: u64,
    total: u64,
    resident: BTreeMap<PartitionId, Resident>,
    /// Resident partitions ordered by the slot of their last use (see
    /// [`USE_SLOT_MS`]), oldest first.
    by_last_use: BTreeSet<(Millis, PartitionId)>,
    /// Deadline of each partition's cooldown.
    cooldowns: BTreeMap<PartitionId, Millis>,
    hints: BTreeMap<PartitionId, Hint>,
}

#[derive(Clone, Copy, Debug)]
struct Resident {
    bytes: u64,
    last_used_ms: Millis,
}

/// The bytes a partition had when the budget last let it go.
#[derive(Clone, Copy, Debug)]
struct Hint {
    bytes: u64,
    recorded_ms: Millis,
}

impl Budget {
    pub fn new(limit: u64) -> Budget {
        Budget {
            limit,
            total: 0,
            resident: BTreeMap::new(),
            by_last_use: BTreeSet::new(),
            cooldowns: BTreeMap::new(),
            hints: BTreeMap::new(),
        }
    }

    /// Accounted bytes of every resident partition.
    pub fn total(&self) -> u64 {
        self.total
    }

    pub fn resident_bytes(&self, partition: PartitionId) -> u64 {
        self.resident.get(&partition).map_or(0, |resident| resident.bytes)
    }

    /// Sets a partition's resident footprint, making it resident (and used
    /// now) if it was not.
    pub fn account(&mut self, partition: PartitionId, bytes: u64, now_ms: Millis) {
        match self.resident.get_mut(&partition) {
            Some(resident) => {
                self.total = self.total - resident.bytes + bytes;
                resident.bytes = bytes;
            }
            None => {
                self.resident.insert(partition, Resident { bytes, last_used_ms: now_ms });
                self.by_last_use.insert((use_slot(now_ms), partition));
                self.total += bytes;
            }
        }
        self.check();
    }

    /// Marks a resident partition used at `now_ms`.
    pub fn touch(&mut self, partition: PartitionId, now_ms: Millis) {
        if let Some(resident) = self.resident.get_mut(&partition) {
            // `now` is monotone, but a host that breaks that must not make the
            // order lie: last use only moves forward.
            let slot = use_slot(resident.last_used_ms);
            resident.last_used_ms = resident.last_used_ms.max(now_ms);
            if use_slot(resident.last_used_ms) != slot {
                let removed = self.by_last_use.remove(&(slot, partition));
                debug_assert!(removed);
                self.by_last_use.insert((use_slot(resident.last_used_ms), partition));
            }
        }
    }

    /// Stops accounting for a partition and answers the bytes it had.
    pub fn release(&mut self, partition: PartitionId) -> u64 {
        let Some(resident) = self.resident.remove(&partition) else {
            return 0;
        };
        let removed = self.by_last_use.remove(&(use_slot(resident.last_used_ms), partition));
        debug_assert!(removed);
        self.total -= resident.bytes;
        self.check();
        resident.bytes
    }

    /// The footprint to expect from hydrating a partition: the bytes it had
    /// when the budget last let it go, else the host's estimate in hashes.
    pub fn estimate(&self, partition: PartitionId, estimate_hashes: u64) -> u64 {
        match self.hints.get(&partition) {
            Some(hint) => hint.bytes,
            None => estimate_hashes.saturating_mul(ESTIMATED_BYTES_PER_HASH),
        }
    }

    pub fn has_hint(&self, partition: PartitionId) -> bool {
        self.hints.contains_key(&partition)
    }

    /// The fit test for admitting `partition` with `estimate` bytes.
    pub fn gate(&self, partition: PartitionId, estimate: u64, now_ms: Millis) -> Gate {
        let threshold = u128::from(self.limit) * u128::from(FIT_PERCENT) / 100;
        let others = u128::from(self.total - self.resident_bytes(partition));
        let fits = |freed: u128| others - freed + u128::from(estimate) < threshold;
        if fits(0) {
            return Gate::Fits;
        }
        let mut victims = Vec::new();
        let mut freed = 0u128;
        for victim in self.idle(now_ms).filter(|&victim| victim != partition) {
            victims.push(victim);
            freed += u128::from(self.resident_bytes(victim));
            if fits(freed) {
                return Gate::FitsAfterEvicting(victims);
            }
        }
        Gate::Refused
    }

    /// Idle partitions, least recently used first, whose eviction brings the
    /// total back within the budget (as far as idle ones can).
    pub fn over_budget_victims(&self, now_ms: Millis) -> Vec<PartitionId> {
        let mut excess = self.total.saturating_sub(self.limit);
        let mut victims = Vec::new();
        for victim in self.idle(now_ms) {
            if excess == 0 {
                break;
            }
            victims.push(victim);
            excess = excess.saturating_sub(self.resident_bytes(victim));
        }
        victims
    }

    /// Whether a partition is serving a cooldown at `now_ms`.
    pub fn cooling(&self, partition: PartitionId, now_ms: Millis) -> bool {
        self.cooldowns.get(&partition).is_some_and(|&deadline| now_ms < deadline)
    }

    /// Starts a partition's cooldown.
    pub fn suppress(&mut self, partition: PartitionId, now_ms: Millis) {
        self.cooldowns.insert(partition, now_ms.saturating_add(COOLDOWN_MS));
        if self.cooldowns.len() > AUX_SOFT_CAP {
            self.prune_cooldowns(now_ms);
        }
    }

    /// Remembers the bytes a partition had when the budget let it go.
    pub fn remember_footprint(&mut self, partition: PartitionId, bytes: u64, now_ms: Millis) {
        self.hints.insert(partition, Hint { bytes, recorded_ms: now_ms });
        if self.hints.len() > AUX_SOFT_CAP {
            self.prune_hints();
        }
    }

    /// Clears what the gate remembered about a partition that is now
    /// resident again (or forgotten).
    pub fn clear_memory(&mut self, partition: PartitionId) {
        self.cooldowns.remove(&partition);
        self.hints.remove(&partition);
    }

    /// Partitions serving a cooldown at `now_ms`.
    pub fn suppressed_count(&self, now_ms: Millis) -> usize {
        self.cooldowns.values().filter(|&&deadline| now_ms < deadline).count()
    }

    /// Drops cooldowns that have ended.
    pub fn end_cooldowns(&mut self, now_ms: Millis) {
        self.cooldowns.retain(|_, &mut deadline| now_ms < deadline);
    }

    /// Partitions whose last use lies in a slot that ended at least
    /// [`RECENT_USE_MS`] before `now_ms`, least recently used first (to the
    /// slot). The walk stops at the first slot that is not idle.
    fn idle(&self, now_ms: Millis) -> impl Iterator<Item = PartitionId> {
        self.by_last_use
            .iter()
            .take_while(move |&&(slot, _)| {
                let slot_last_ms = slot.saturating_mul(USE_SLOT_MS).saturating_add(USE_SLOT_MS - 1);
                now_ms.saturating_sub(slot_last_ms) >= RECENT_USE_MS
            })
            .map(|&(_, partition)| partition)
    }

    /// Ended cooldowns go first, then those ending soonest, down to nine
    /// tenths of the cap so that pruning is rare. Losing a cooldown only
    /// re-tests a partition early.
    fn prune_cooldowns(&mut self, now_ms: Millis) {
        self.end_cooldowns(now_ms);
        let keep = AUX_SOFT_CAP * 9 / 10;
        if self.cooldowns.len() > keep {
            let mut deadlines: Vec<(Millis, PartitionId)> = self.cooldowns.iter().map(|(&p, &d)| (d, p)).collect();
            deadlines.sort_unstable();
            for &(_, partition) in &deadlines[..deadlines.len() - keep] {
                self.cooldowns.remove(&partition);
            }
        }
        debug_assert!(self.cooldowns.len() <= AUX_SOFT_CAP);
    }

    /// The oldest hints go, down to nine tenths of the cap. Losing a hint only
    /// means trusting the host's estimate once more.
    fn prune_hints(&mut self) {
        let keep = AUX_SOFT_CAP * 9 / 10;
        let mut ages: Vec<(Millis, PartitionId)> = self.hints.iter().map(|(&p, h)| (h.recorded_ms, p)).collect();
        ages.sort_unstable();
        for &(_, partition) in &ages[..ages.len().saturating_sub(keep)] {
            self.hints.remove(&partition);
        }
        debug_assert!(self.hints.len() <= AUX_SOFT_CAP);
    }

    fn check(&self) {
        debug_assert_eq!(self.resident.len(), self.by_last_use.len());
        debug_assert!(self.resident.iter().all(|(&p, r)| self.by_last_use.contains(&(use_slot(r.last_used_ms), p))));
        debug_assert_eq!(self.total, self.resident.values().map(|r| r.bytes).sum::<u64>());
    }
}

/// The slot of the least-recently-used order that `ms` falls in.
fn use_slot(ms: Millis) -> Millis {
    ms.div_euclid(USE_SLOT_MS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    /// A budget of 1,000 bytes: admissions must stay under 900.
    fn budget_with(resident: &[(PartitionId, u64, Millis)]) -> Budget {
        let mut budget = Budget::new(1_000);
        for &(partition, bytes, used_ms) in resident {
            budget.account(partition, bytes, used_ms);
        }
        budget
    }

    #[test]
    fn accounting_follows_every_change() {
        let mut budget = budget_with(&[(1, 100, 0), (2, 50, 0)]);
        budget.account(1, 300, 10);
        assert_eq!((budget.total(), budget.resident_bytes(1)), (350, 300));
        assert_eq!(budget.release(1), 300);
        assert_eq!(budget.release(1), 0);
        assert_eq!(budget.total(), 50);
    }

    #[test]
    fn the_fit_test_keeps_ten_percent_headroom_and_ignores_own_bytes() {
        let budget = budget_with(&[(1, 500, 0), (2, 300, 0)]);
        let now = 1_000;
        assert_eq!(budget.gate(3, 99, now), Gate::Fits);
        // 800 + 100 is not under 900, and both others were used recently.
        assert_eq!(budget.gate(3, 100, now), Gate::Refused);
        // Partition 2's own 300 bytes do not count against it.
        assert_eq!(budget.gate(2, 399, now), Gate::Fits);
    }

    #[test]
    fn admission_evicts_idle_partitions_oldest_first_and_only_if_that_suffices() {
        let budget = budget_with(&[(1, 400, 0), (2, 300, 1_000), (3, 200, 9_000)]);
        let now = 10_000;
        // Needs 200 freed: the oldest idle partition is enough.
        assert_eq!(budget.gate(4, 100, now), Gate::FitsAfterEvicting(vec![1]));
        assert_eq!(budget.gate(4, 500, now), Gate::FitsAfterEvicting(vec![1, 2]));
        // Partition 3 was used 1 s ago: not even a full eviction of the idle
        // ones would make room, so nobody is evicted.
        assert_eq!(budget.gate(4, 800, now), Gate::Refused);
        // The partition being admitted is never its own victim.
        assert_eq!(budget.gate(1, 600, now), Gate::FitsAfterEvicting(vec![2]));
    }

    #[test]
    fn the_recent_use_guard_lasts_five_seconds_past_the_slot_of_the_use() {
        let mut budget = budget_with(&[(1, 900, 0)]);
        assert_eq!(budget.gate(2, 50, RECENT_USE_MS - 1), Gate::Refused);
        // Used at 0, in the slot that ends at USE_SLOT_MS - 1.
        assert_eq!(budget.gate(2, 50, RECENT_USE_MS + USE_SLOT_MS - 2), Gate::Refused);
        assert_eq!(budget.gate(2, 50, RECENT_USE_MS + USE_SLOT_MS - 1), Gate::FitsAfterEvicting(vec![1]));
        budget.touch(1, 3_000);
        assert_eq!(budget.gate(2, 50, 5_999), Gate::Refused);
        assert_eq!(budget.over_budget_victims(8_000), vec![] as Vec<PartitionId>, "not over the budget");
    }

    #[test]
    fn over_budget_victims_free_just_enough() {
        let mut budget = budget_with(&[(1, 400, 0), (2, 400, 100), (3, 400, 200)]);
        assert_eq!(budget.over_budget_victims(10_000), vec![1]);
        budget.account(3, 1_000, 0);
        assert_eq!(budget.over_budget_victims(10_000), vec![1, 2]);
        // Only idle ones qualify.
        budget.touch(1, 9_000);
        assert_eq!(budget.over_budget_victims(10_000), vec![2, 3]);
        budget.touch(3, 9_000);
        assert_eq!(budget.over_budget_victims(10_000), vec![2]);
    }

    #[test]
    fn the_eviction_order_is_least_recently_used_to_the_slot() {
        // 2 and 1 were last used in the first slot, 3 in the next; far over
        // the budget, every idle partition is a victim.
        let mut budget = budget_with(&[(3, 2_000, USE_SLOT_MS), (2, 2_000, 0), (1, 2_000, 1)]);
        assert_eq!(budget.over_budget_victims(10_000), vec![1, 2, 3]);
        // A use in the same slot leaves the order; one in a later slot moves
        // the partition behind the others.
        budget.touch(1, USE_SLOT_MS - 1);
        assert_eq!(budget.over_budget_victims(10_000), vec![1, 2, 3]);
        budget.touch(1, 2 * USE_SLOT_MS);
        assert_eq!(budget.over_budget_victims(10_000), vec![2, 3, 1]);
        // A partition is idle once its slot ended five seconds ago: 2's slot
        // ends at 999, 3's at 1,999, 1's at 2,999.
        assert_eq!(budget.over_budget_victims(RECENT_USE_MS + USE_SLOT_MS - 2), vec![] as Vec<PartitionId>);
        assert_eq!(budget.over_budget_victims(RECENT_USE_MS + USE_SLOT_MS - 1), vec![2]);
        assert_eq!(budget.over_budget_victims(RECENT_USE_MS + 2 * USE_SLOT_MS - 1), vec![2, 3]);
        assert_eq!(budget.over_budget_victims(RECENT_USE_MS + 3 * USE_SLOT_MS - 1), vec![2, 3, 1]);
    }

    #[test]
    fn estimates_prefer_the_remembered_footprint() {
        let mut budget = Budget::new(1_000);
        assert_eq!(budget.estimate(1, 10), 10 * ESTIMATED_BYTES_PER_HASH);
        assert_eq!(budget.estimate(1, u64::MAX), u64::MAX);
        budget.remember_footprint(1, 77, 0);
        assert!(budget.has_hint(1));
        assert_eq!(budget.estimate(1, 10), 77);
        budget.clear_memory(1);
        assert_eq!(budget.estimate(1, 0), 0);
    }

    #[test]
    fn cooldowns_last_thirty_seconds() {
        let mut budget = Budget::new(1_000);
        budget.suppress(5, 1_000);
        assert!(budget.cooling(5, 1_000) && budget.cooling(5, 30_999));
        assert!(!budget.cooling(5, 31_000));
        assert_eq!((budget.suppressed_count(30_999), budget.suppressed_count(31_000)), (1, 0));
        budget.end_cooldowns(31_000);
        assert!(budget.cooldowns.is_empty());
    }

    #[test]
    fn footprint_hints_are_soft_capped_oldest_first() {
        let mut budget = Budget::new(1_000);
        let partitions = AUX_SOFT_CAP as PartitionId + 1;
        for partition in 0..partitions {
            budget.remember_footprint(partition, 1, partition);
        }
        assert_eq!(budget.hints.len(), AUX_SOFT_CAP * 9 / 10);
        assert!(budget.has_hint(partitions - 1) && !budget.has_hint(0));
    }

    #[test]
    fn cooldowns_are_soft_capped_ended_ones_first() {
        let mut budget = Budget::new(1_000);
        for partition in 0..AUX_SOFT_CAP as PartitionId {
            budget.suppress(partition, partition / 10);
        }
        assert_eq!(budget.cooldowns.len(), AUX_SOFT_CAP);
        // Half of them have ended by now: those go, and nothing else.
        let now = COOLDOWN_MS + AUX_SOFT_CAP as Millis / 20 - 1;
        budget.suppress(-1, now);
        assert_eq!(budget.cooldowns.len(), AUX_SOFT_CAP / 2 + 1);
        assert!(budget.cooling(-1, now) && budget.cooling(AUX_SOFT_CAP as PartitionId - 1, now));
        // Past the cap with none ended, those ending soonest go.
        let mut crowded = Budget::new(1_000);
        for partition in 0..=AUX_SOFT_CAP as PartitionId {
            crowded.suppress(partition, 0);
        }
        assert_eq!(crowded.cooldowns.len(), AUX_SOFT_CAP * 9 / 10);
        assert!(crowded.cooling(AUX_SOFT_CAP as PartitionId, 0) && !crowded.cooling(0, 0));
    }
}
