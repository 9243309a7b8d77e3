//! One partition's entry: its ring of hashes and the two watermarks that say
//! what the ring is complete for.
//!
//! The entry knows every in-window hash committed at offsets in
//! `(hydrated_from, verified_upto]`, and every offset at or below
//! `hydrated_from` holds only hashes created before the window (plus slack)
//! began. Together: no in-window hash at or below `verified_upto` is unknown,
//! which is exactly what vouching for `p_verified = verified_upto` claims.
//! Three rules keep that true:
//!
//! - An entry is born complete, only by [`Entry::hydrate`] from a full-window
//!   read taken in one snapshot with the allocator watermark.
//! - A commit extends it only when it starts right after `verified_upto`. One
//!   that starts further on means another writer interleaved: the entry is in
//!   [`Condition::Gap`] and answers -1 until rebuilt. One that starts at or
//!   below `verified_upto` cannot happen under a monotone allocator, so the
//!   entry distrusts itself and needs a rebuild ([`Condition::Rebuild`]).
//! - Expiry drops only whole generations created entirely before the window
//!   plus slack, and raises `hydrated_from` past them.

use alloc::vec::Vec;

use crate::api::{EntryState, HydrateError, Millis, NO_VOUCH, Offset, TxnsRow};
use crate::hash::{self, Hash};
use crate::ring::{self, Ring};

/// Accounted bytes of an entry besides its ring: the entry itself and its
/// share of the shard's and the budget's per-partition maps, measured
/// (`guest/tests/footprint.rs`).
pub const ENTRY_OVERHEAD: usize = 512;

/// Where an entry stands in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Condition {
    /// Complete up to `verified_upto`: plans vouch.
    Vouching,
    /// Another writer committed past `verified_upto + 1`.
    Gap,
    /// An overlapping or malformed commit, or a window change. Sticky: only a
    /// hydration replaces the entry.
    Rebuild,
}

impl Condition {
    pub fn state(self) -> EntryState {
        match self {
            Condition::Vouching => EntryState::Vouching,
            Condition::Gap => EntryState::Gap,
            Condition::Rebuild => EntryState::Rebuild,
        }
    }
}

/// The answer for one planned segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answer {
    pub p_verified: Offset,
    /// Whether the answer is the entry's `verified_upto`: a complete entry,
    /// a well-formed segment and no local hit. (For an empty partition that
    /// is -1, and still a vouch: PostgreSQL has nothing to probe.)
    pub vouched: bool,
    /// Hashes checked against the ring.
    pub checked: usize,
    /// Bloom "maybe"s across generations.
    pub maybes: usize,
}

impl Answer {
    const NONE: Answer = Answer { p_verified: NO_VOUCH, vouched: false, checked: 0, maybes: 0 };
}

/// Buffers that planning and recording reuse from call to call.
#[derive(Debug, Default)]
pub struct Workspace {
    hashes: Vec<Hash>,
    ring: ring::Scratch,
}

#[derive(Debug)]
pub struct Entry {
    window_ms: u64,
    hydrated_from: Offset,
    verified_upto: Offset,
    condition: Condition,
    ring: Ring,
}

impl Entry {
    /// Builds an entry from a full-window read: every txns row created within
    /// the window plus slack, and `last_offset` from the same snapshot. Rows
    /// may come in any order; they are validated, then appended in offset
    /// order.
    pub fn hydrate(
        window_ms: u64,
        last_offset: Offset,
        rows: &[TxnsRow<'_>],
        workspace: &mut Workspace,
    ) -> Result<Entry, HydrateError> {
        if window_ms == 0 {
            return Err(HydrateError::WindowOff);
        }
        let rows = validated_in_offset_order(last_offset, rows)?;
        let hydrated_from = rows.first().map_or(last_offset, |first| first.base_offset - 1);
        let mut entry =
            Entry { window_ms, hydrated_from, verified_upto: last_offset, condition: Condition::Vouching, ring: Ring::default() };
        let total: usize = rows.iter().map(|row| row.hashes.len() / hash::HASH_LEN).sum();
        for row in rows {
            let decoded = hash::decode_into(row.hashes, &mut workspace.hashes);
            assert!(decoded, "validated above");
            entry.ring.append_sized(row.base_offset, row.created_ms, &workspace.hashes, total);
        }
        debug_assert!(entry.hydrated_from <= entry.verified_upto);
        Ok(entry)
    }

    pub fn condition(&self) -> Condition {
        self.condition
    }

    pub fn window_ms(&self) -> u64 {
        self.window_ms
    }

    pub fn hydrated_from(&self) -> Offset {
        self.hydrated_from
    }

    pub fn verified_upto(&self) -> Offset {
        self.verified_upto
    }

    pub fn held(&self) -> usize {
        self.ring.held()
    }

    pub fn generation_count(&self) -> usize {
        self.ring.generation_count()
    }

    /// The accounted footprint, dominated by 16 bytes per held hash.
    pub fn bytes(&self) -> usize {
        ENTRY_OVERHEAD + self.ring.bytes()
    }

    /// Answers one segment: `verified_upto` when the entry vouches and holds
    /// none of the segment's hashes. When it vouches but holds some (their
    /// indexes go to `hits`, a hint for the host, never a verdict), the
    /// answer is narrowed to just below the oldest place in the ring that
    /// holds one of them, so that PostgreSQL's probe still finds every
    /// original and the first occurrence of each. Otherwise -1.
    ///
    /// A segment under another window than the entry's marks it for rebuild:
    /// its expiry was computed under the old window. A malformed segment
    /// answers -1 and changes nothing.
    pub fn plan(&mut self, window_ms: u64, hashes: &[u8], workspace: &mut Workspace, hits: &mut Vec<u32>) -> Answer {
        hits.clear();
        if window_ms != self.window_ms {
            self.condition = Condition::Rebuild;
        }
        if self.condition != Condition::Vouching {
            return Answer::NONE;
        }
        if !hash::decode_into(hashes, &mut workspace.hashes) || u32::try_from(workspace.hashes.len()).is_err() {
            return Answer::NONE;
        }
        let found = self.ring.find(&workspace.hashes, &mut workspace.ring, hits);
        let vouched = hits.is_empty();
        let p_verified = if vouched {
            self.verified_upto
        } else {
            // The hashes not found occur nowhere in (hydrated_from,
            // verified_upto]; those found occur nowhere below the floor.
            assert!(found.floor <= self.verified_upto);
            found.floor - 1
        };
        Answer { p_verified, vouched, checked: workspace.hashes.len(), maybes: found.maybes }
    }

    /// Records one segment PostgreSQL committed at `base_offset`.
    pub fn record(&mut self, base_offset: Offset, created_ms: Millis, hashes: &[u8], workspace: &mut Workspace) {
        if self.condition == Condition::Rebuild {
            return;
        }
        let Some(count) = hash::count(hashes) else {
            self.condition = Condition::Rebuild;
            return;
        };
        if count == 0 {
            // An empty segment allocates no offset and says nothing.
            return;
        }
        // At the end of the offset space nothing can follow: any commit
        // overlaps.
        let Some(next) = self.verified_upto.checked_add(1) else {
            self.condition = Condition::Rebuild;
            return;
        };
        if base_offset < next {
            self.condition = Condition::Rebuild;
            return;
        }
        if base_offset > next || self.condition == Condition::Gap {
            self.condition = Condition::Gap;
            return;
        }
        let Some(last_offset) = (count as Offset).checked_sub(1).and_then(|span| base_offset.checked_add(span)) else {
            self.condition = Condition::Rebuild;
            return;
        };
        let decoded = hash::decode_into(hashes, &mut workspace.hashes);
        debug_assert!(decoded);
        let expected = self.ring.projected(created_ms, self.window_ms);
        self.ring.append_sized(base_offset, created_ms, &workspace.hashes, expected);
        self.verified_upto = last_offset;
    }

    /// Drops the generations whose newest hash is older than the window plus
    /// `slack_ms` at `now_ms`, and answers how many it dropped.
    pub fn expire(&mut self, now_ms: Millis, slack_ms: u32) -> usize {
        let window = Millis::try_from(self.window_ms).unwrap_or(Millis::MAX);
        let cutoff = now_ms.saturating_sub(window).saturating_sub(Millis::from(slack_ms));
        let expired = self.ring.expire(cutoff);
        // Everything dropped is pre-window, so the entry still knows every
        // in-window hash above the dropped offsets.
        self.hydrated_from = self.hydrated_from.max(expired.max_offset);
        debug_assert!(self.hydrated_from <= self.verified_upto || self.condition != Condition::Vouching);
        expired.generations
    }
}

/// The rows sorted by base offset, or `Malformed` when a row's hash count
/// does not match its offsets, a row ends past `last_offset`, or rows overlap.
fn validated_in_offset_order<'r, 'a>(last_offset: Offset, rows: &'r [TxnsRow<'a>]) -> Result<Vec<&'r TxnsRow<'a>>, HydrateError> {
    if last_offset < NO_VOUCH {
        return Err(HydrateError::Malformed);
    }
    let mut sorted: Vec<&TxnsRow<'a>> = rows.iter().collect();
    sorted.sort_unstable_by_key(|row| row.base_offset);
    let mut previous_end = NO_VOUCH;
    for row in &sorted {
        let span_ok = row.base_offset > previous_end && row.end_offset >= row.base_offset && row.end_offset <= last_offset;
        // `end - base + 1` cannot overflow once 0 <= base <= end.
        let count_ok = hash::count(row.hashes).is_some_and(|n| n as u64 == (row.end_offset - row.base_offset) as u64 + 1);
        if !(span_ok && count_ok) {
            return Err(HydrateError::Malformed);
        }
        previous_end = row.end_offset;
    }
    Ok(sorted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::encode;
    use alloc::vec;

    const WINDOW: u64 = 60_000;

    fn row(base: Offset, created_ms: Millis, hashes: &[u8]) -> TxnsRow<'_> {
        let count = (hashes.len() / 16) as Offset;
        TxnsRow { base_offset: base, end_offset: base + count - 1, created_ms, hashes }
    }

    fn hydrated(last_offset: Offset, rows: &[TxnsRow<'_>]) -> Entry {
        Entry::hydrate(WINDOW, last_offset, rows, &mut Workspace::default()).expect("well formed")
    }

    fn plan(entry: &mut Entry, hashes: &[Hash]) -> (Offset, Vec<u32>) {
        let mut hits = Vec::new();
        let answer = entry.plan(WINDOW, &encode(hashes), &mut Workspace::default(), &mut hits);
        (answer.p_verified, hits)
    }

    fn record(entry: &mut Entry, base: Offset, created_ms: Millis, hashes: &[Hash]) {
        entry.record(base, created_ms, &encode(hashes), &mut Workspace::default());
    }

    #[test]
    fn hydration_sets_the_watermarks() {
        let (a, b) = (encode(&[1, 2, 3]), encode(&[4, 5]));
        // Rows arrive in any order; the lowest base sets hydrated_from.
        let mut entry = hydrated(9, &[row(7, 20, &b), row(4, 10, &a)]);
        assert_eq!((entry.hydrated_from(), entry.verified_upto()), (3, 9));
        assert_eq!((entry.condition(), entry.held()), (Condition::Vouching, 5));
        assert_eq!(plan(&mut entry, &[9, 10]), (9, vec![]));
        // 2 and 5 were committed at 5 and 8: probe from 5.
        assert_eq!(plan(&mut entry, &[9, 2, 10, 5]), (4, vec![1, 3]));
        let empty = hydrated(41, &[]);
        assert_eq!((empty.hydrated_from(), empty.verified_upto()), (41, 41));
    }

    #[test]
    fn malformed_hydrations_are_refused() {
        let three = encode(&[1, 2, 3]);
        let two = encode(&[4, 5]);
        let cases: [(Offset, Vec<TxnsRow<'_>>); 6] = [
            // Hash count does not match the offsets.
            (10, vec![TxnsRow { base_offset: 0, end_offset: 3, created_ms: 0, hashes: &three }]),
            // A row ends past last_offset.
            (1, vec![row(0, 0, &three)]),
            // Rows overlap, in either order.
            (10, vec![row(0, 0, &three), row(2, 0, &two)]),
            (10, vec![row(2, 0, &two), row(0, 0, &three)]),
            // Not a whole number of hashes.
            (10, vec![TxnsRow { base_offset: 0, end_offset: 0, created_ms: 0, hashes: &three[..15] }]),
            // A watermark below "none".
            (-2, vec![]),
        ];
        for (last_offset, rows) in cases {
            let result = Entry::hydrate(WINDOW, last_offset, &rows, &mut Workspace::default());
            assert_eq!(result.err(), Some(HydrateError::Malformed), "{rows:?}");
        }
        let result = Entry::hydrate(0, 5, &[], &mut Workspace::default());
        assert_eq!(result.err(), Some(HydrateError::WindowOff));
        // Adjacent rows and holes between rows are fine.
        assert!(
            Entry::hydrate(WINDOW, 10, &[row(0, 0, &three), row(3, 0, &two), row(8, 0, &two)], &mut Workspace::default()).is_ok()
        );
    }

    #[test]
    fn contiguous_commits_extend_the_watermark() {
        let mut entry = hydrated(-1, &[]);
        assert_eq!(plan(&mut entry, &[1]), (NO_VOUCH, vec![]), "an empty partition vouches for offset -1");
        record(&mut entry, 0, 100, &[1, 2]);
        record(&mut entry, 2, 100, &[]);
        record(&mut entry, 2, 110, &[3]);
        assert_eq!((entry.verified_upto(), entry.held()), (2, 3));
        assert_eq!(plan(&mut entry, &[4]), (2, vec![]));
        // 3 was committed at 2: probe from there.
        assert_eq!(plan(&mut entry, &[3, 3, 4]), (1, vec![0, 1]), "repeats within a segment all hit");
    }

    #[test]
    fn a_local_hit_narrows_the_answer_to_below_the_place_holding_it() {
        let mut entry = hydrated(-1, &[]);
        for offset in 0..1_000 {
            record(&mut entry, offset, 100, &[offset as Hash]);
        }
        assert_eq!(entry.verified_upto(), 999);
        // In the hot buffer, sorted chunks and unsorted tail alike, the
        // answer is just below the original's own offset.
        for original in [999, 990, 600, 3] {
            assert_eq!(plan(&mut entry, &[5_000, original as Hash]), (original - 1, vec![1]));
        }
        // The oldest hit decides.
        assert_eq!(plan(&mut entry, &[990, 3, 600]), (2, vec![0, 1, 2]));
    }

    #[test]
    fn a_gap_stops_vouching_and_an_overlap_demands_a_rebuild() {
        let mut entry = hydrated(4, &[]);
        record(&mut entry, 6, 0, &[1]);
        assert_eq!(entry.condition(), Condition::Gap);
        assert_eq!(plan(&mut entry, &[9]), (NO_VOUCH, vec![]));
        // A gap stays a gap even if the next commit happens to line up.
        record(&mut entry, 5, 0, &[2]);
        assert_eq!(entry.condition(), Condition::Gap);
        record(&mut entry, 2, 0, &[2]);
        assert_eq!(entry.condition(), Condition::Rebuild);
        record(&mut entry, 5, 0, &[2]);
        assert_eq!(entry.condition(), Condition::Rebuild, "sticky");

        let mut overlapped = hydrated(4, &[]);
        record(&mut overlapped, 4, 0, &[1]);
        assert_eq!(overlapped.condition(), Condition::Rebuild);
        assert_eq!(overlapped.verified_upto(), 4);
    }

    #[test]
    fn malformed_or_overflowing_commits_demand_a_rebuild() {
        let mut entry = hydrated(4, &[]);
        entry.record(5, 0, &[0u8; 17], &mut Workspace::default());
        assert_eq!(entry.condition(), Condition::Rebuild);

        let mut near_the_end = hydrated(Offset::MAX - 1, &[]);
        record(&mut near_the_end, Offset::MAX, 0, &[1, 2]);
        assert_eq!(near_the_end.condition(), Condition::Rebuild);
        assert_eq!(near_the_end.held(), 0);

        let mut at_the_end = hydrated(Offset::MAX, &[]);
        record(&mut at_the_end, Offset::MAX, 0, &[1]);
        assert_eq!((at_the_end.condition(), at_the_end.held()), (Condition::Rebuild, 0));
    }

    #[test]
    fn a_malformed_segment_answers_minus_one_and_changes_nothing() {
        let mut entry = hydrated(3, &[]);
        let mut hits = vec![7];
        let answer = entry.plan(WINDOW, &[0u8; 20], &mut Workspace::default(), &mut hits);
        assert_eq!((answer.p_verified, hits.len(), entry.condition()), (NO_VOUCH, 0, Condition::Vouching));
    }

    #[test]
    fn a_window_change_demands_a_rebuild() {
        let mut entry = hydrated(3, &[]);
        let answer = entry.plan(WINDOW + 1, &encode(&[1]), &mut Workspace::default(), &mut Vec::new());
        assert_eq!((answer.p_verified, entry.condition()), (NO_VOUCH, Condition::Rebuild));
        assert_eq!(plan(&mut entry, &[1]), (NO_VOUCH, vec![]), "sticky under the old window too");
    }

    #[test]
    fn expiry_raises_hydrated_from_and_forgets_old_hashes() {
        let old = encode(&(0..4_096).collect::<Vec<Hash>>());
        let mut entry = hydrated(4_096, &[row(0, 1_000, &old), row(4_096, 50_000, &encode(&[7_777]))]);
        assert_eq!(entry.generation_count(), 2);
        // Not yet: the first generation's newest hash is exactly at the edge.
        assert_eq!(entry.expire(1_000 + 60_000 + 5_000, 5_000), 0);
        assert_eq!(plan(&mut entry, &[17]), (15, vec![0]), "committed at 17, its arrival step begins at 16");
        assert_eq!(entry.expire(1_001 + 60_000 + 5_000, 5_000), 1);
        assert_eq!((entry.hydrated_from(), entry.held()), (4_095, 1));
        assert_eq!(plan(&mut entry, &[17]), (4_096, vec![]));
        assert_eq!(plan(&mut entry, &[7_777]), (4_095, vec![0]), "committed at 4,096");
        // A window beyond i64 milliseconds never expires anything.
        let mut forever = Entry::hydrate(u64::MAX, 0, &[row(0, 0, &encode(&[1]))], &mut Workspace::default()).unwrap();
        assert_eq!(forever.expire(Millis::MAX, u32::MAX), 0);
    }
}
