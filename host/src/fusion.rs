//! Fusion: the pushes waiting for one partition, coalesced into segments.
//!
//! Layer 2 lives here: across the requests coalesced into one partition's
//! queue, messages with equal 16-byte hashes share one slot. The first
//! occurrence leads; the others wait on it and inherit its final result.
//! (Layer 1, inside one request, runs before a request reaches a shard.)

use bytestring::ByteString;
use foldhash::{HashMap, HashMapExt as _};
use uuid::Uuid;

use crate::payload::Payload;

/// A message as the shard pushes it: a layer-1 leader of its request.
#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    pub message_id: Uuid,
    pub transaction_id: ByteString,
    pub hash: [u8; 16],
    pub payload: Payload,
}

/// Where one slot's result must be delivered: a request and the position of
/// the message inside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Waiter {
    pub request: u64,
    pub index: u32,
}

/// One distinct hash of a partition's queue: the leading message and every
/// waiter on it. The leader's own request position is held apart from the
/// others', so that the common slot, waited on by its leader alone, costs no
/// allocation.
#[derive(Debug)]
pub struct Slot {
    pub message: Message,
    /// The leading message's own request position.
    pub leader: Waiter,
    /// Every other request position waiting on this hash, in arrival order.
    pub followers: Vec<Waiter>,
}

impl Slot {
    /// Every waiter, the leader first.
    pub fn waiters(&self) -> impl Iterator<Item = Waiter> + '_ {
        std::iter::once(self.leader).chain(self.followers.iter().copied())
    }
}

/// One partition's pending messages.
#[derive(Debug, Default)]
pub struct PartitionQueue {
    slots: Vec<Slot>,
    /// foldhash, not SipHash: a fraction of the cost, still seeded at random
    /// (a client chooses transactionIds, and xxh3 is not keyed).
    by_hash: HashMap<[u8; 16], usize>,
}

/// Slots taken out of the queue to be pushed as one segment.
#[derive(Debug)]
pub struct CoalescedSegment {
    pub slots: Vec<Slot>,
    /// The slots' hashes, 16 bytes each, in slot order.
    pub hashes: Vec<u8>,
}

impl CoalescedSegment {
    /// Cuts the segment around the slots `indexes` names, when they form one
    /// contiguous run that is not the whole segment: into the slots before
    /// the run, the run, and the slots after it (those that are not empty),
    /// in slot order. Otherwise gives the segment back whole. (The indexes
    /// come from the cache, which is trusted with nothing: their order does
    /// not matter, and indexes past the end are ignored.)
    pub fn cut_around(self, indexes: &[u32]) -> Result<Vec<CoalescedSegment>, CoalescedSegment> {
        let named = self.named(indexes);
        let Some(start) = named.iter().position(|&n| n) else { return Err(self) };
        let end = start + named[start..].iter().take_while(|&&n| n).count();
        if named[end..].contains(&true) || (start == 0 && end == named.len()) {
            return Err(self);
        }
        Ok(self.cut_at(&[start, end]))
    }

    /// Takes the requests whose every slot `indexes` names (replays, likely
    /// all duplicates) out of a segment that also holds others: into the
    /// slots of the others, in slot order, then a piece per replaying
    /// request. Concurrent requests promise no order among themselves, and
    /// each request's slots stay together and in order, so the pieces carry
    /// the same promises as the whole; the replays can then be judged apart
    /// from the new messages, which need the partition's lock. Gives the
    /// segment back whole when no request, or every request, replays.
    pub fn part_replaying_requests(self, indexes: &[u32]) -> Result<Vec<CoalescedSegment>, CoalescedSegment> {
        let named = self.named(indexes);
        let bounds: Vec<usize> = std::iter::once(0).chain(self.request_changes()).chain([self.slots.len()]).collect();
        let replaying: Vec<bool> = bounds.windows(2).map(|run| named[run[0]..run[1]].iter().all(|&n| n)).collect();
        if !replaying.contains(&true) || replaying.iter().all(|&r| r) {
            return Err(self);
        }
        let CoalescedSegment { slots, hashes: _ } = self;
        let mut slots = slots.into_iter();
        let mut others = Vec::new();
        let mut replays = Vec::new();
        for (run, &replay) in bounds.windows(2).zip(&replaying) {
            let run: Vec<Slot> = slots.by_ref().take(run[1] - run[0]).collect();
            if replay { replays.push(run) } else { others.extend(run) }
        }
        debug_assert!(!others.is_empty() && !replays.is_empty());
        Ok(std::iter::once(others).chain(replays).map(CoalescedSegment::of_slots).collect())
    }

    fn of_slots(slots: Vec<Slot>) -> CoalescedSegment {
        let hashes = slots.iter().flat_map(|slot| slot.message.hash).collect();
        CoalescedSegment { slots, hashes }
    }

    /// Whether `indexes` names every slot (indexes past the end ignored).
    pub fn all_named(&self, indexes: &[u32]) -> bool {
        self.named(indexes).iter().all(|&n| n)
    }

    /// The slot indexes where the request of a slot's leading message
    /// changes: where the segment would be cut to give each request's slots
    /// a piece of their own.
    pub fn request_changes(&self) -> Vec<usize> {
        let request = |slot: &Slot| slot.leader.request;
        (1..self.slots.len()).filter(|&i| request(&self.slots[i]) != request(&self.slots[i - 1])).collect()
    }

    fn named(&self, indexes: &[u32]) -> Vec<bool> {
        let mut named = vec![false; self.slots.len()];
        for &i in indexes {
            if let Some(named) = usize::try_from(i).ok().and_then(|i| named.get_mut(i)) {
                *named = true;
            }
        }
        named
    }

    /// Cuts the segment before each of the ascending slot indexes `cuts`,
    /// leaving out empty pieces.
    pub fn cut_at(self, cuts: &[usize]) -> Vec<CoalescedSegment> {
        debug_assert!(cuts.is_sorted() && cuts.last().is_none_or(|&cut| cut <= self.slots.len()));
        let CoalescedSegment { slots, hashes } = self;
        let mut pieces = Vec::with_capacity(cuts.len() + 1);
        let mut slots = slots.into_iter();
        let mut from = 0;
        for end in cuts.iter().copied().chain([hashes.len() / 16]) {
            if end > from {
                let piece: Vec<Slot> = slots.by_ref().take(end - from).collect();
                pieces.push(CoalescedSegment { slots: piece, hashes: hashes[16 * from..16 * end].to_vec() });
            }
            from = end;
        }
        pieces
    }
}

impl PartitionQueue {
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Adds a request's messages (`(position in request, message)`), merging
    /// each into the slot of an earlier equal hash where there is one.
    pub fn add(&mut self, request: u64, messages: impl IntoIterator<Item = (u32, Message)>) {
        let messages = messages.into_iter();
        // Room for them all at once: a queue gives its buffers up with each
        // segment taken, and would otherwise grow them step by step again.
        let (expected, _) = messages.size_hint();
        self.slots.reserve(expected);
        self.by_hash.reserve(expected);
        for (index, message) in messages {
            self.push_slot(Slot { message, leader: Waiter { request, index }, followers: Vec::new() });
        }
    }

    /// Takes up to `max` slots, oldest first, as one segment.
    pub fn take_segment(&mut self, max: usize) -> CoalescedSegment {
        assert!(max > 0);
        let take = self.slots.len().min(max);
        let slots: Vec<Slot> = if take == self.slots.len() {
            // The common case: everything goes. The queue gives its buffers
            // up with it, so that the many partitions a gateway remembers
            // between pushes hold no capacity while idle.
            self.by_hash = HashMap::new();
            std::mem::take(&mut self.slots)
        } else {
            let slots = self.slots.drain(..take).collect();
            self.reindex();
            slots
        };
        let mut hashes = Vec::with_capacity(slots.len() * 16);
        for slot in &slots {
            hashes.extend_from_slice(&slot.message.hash);
        }
        CoalescedSegment { slots, hashes }
    }

    fn push_slot(&mut self, slot: Slot) {
        match self.by_hash.get(&slot.message.hash) {
            Some(&leader) => self.slots[leader].followers.extend(slot.waiters()),
            None => {
                self.by_hash.insert(slot.message.hash, self.slots.len());
                self.slots.push(slot);
            }
        }
    }

    fn reindex(&mut self) {
        self.by_hash.clear();
        for (position, slot) in self.slots.iter().enumerate() {
            self.by_hash.insert(slot.message.hash, position);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(id: &str) -> Message {
        Message {
            message_id: Uuid::now_v7(),
            transaction_id: id.into(),
            hash: crate::hash::txn_hash(id),
            payload: Payload::null(),
        }
    }

    #[test]
    fn equal_hashes_across_requests_share_the_first_slot() {
        let mut queue = PartitionQueue::default();
        queue.add(1, [(0, message("a")), (1, message("b"))]);
        queue.add(2, [(0, message("b")), (1, message("c"))]);
        assert_eq!(queue.len(), 3);
        let segment = queue.take_segment(10);
        assert!(queue.is_empty());
        let b = &segment.slots[1];
        assert_eq!(b.message.transaction_id, "b");
        assert_eq!(b.waiters().collect::<Vec<_>>(), vec![Waiter { request: 1, index: 1 }, Waiter { request: 2, index: 0 }]);
        assert_eq!(segment.hashes.len(), 3 * 16);
        assert_eq!(&segment.hashes[16..32], &crate::hash::txn_hash("b"));
    }

    fn segment_of(n: u32) -> CoalescedSegment {
        let mut queue = PartitionQueue::default();
        queue.add(1, (0..n).map(|i| (i, message(&format!("m{i}")))));
        queue.take_segment(n as usize)
    }

    fn names(pieces: &[CoalescedSegment]) -> Vec<Vec<&str>> {
        pieces.iter().map(|p| p.slots.iter().map(|s| &*s.message.transaction_id).collect()).collect()
    }

    #[test]
    fn a_segment_is_cut_around_one_run_of_named_slots() {
        let pieces = segment_of(6).cut_around(&[3, 2]).expect("one run, not the whole segment");
        assert_eq!(names(&pieces), vec![vec!["m0", "m1"], vec!["m2", "m3"], vec!["m4", "m5"]]);
        for piece in &pieces {
            let hashes: Vec<u8> = piece.slots.iter().flat_map(|s| s.message.hash).collect();
            assert_eq!(piece.hashes, hashes, "each piece carries its own slots' hashes");
        }
        let pieces = segment_of(3).cut_around(&[0, 9, 0, u32::MAX]).expect("a leading run");
        assert_eq!(names(&pieces), vec![vec!["m0"], vec!["m1", "m2"]]);
        let pieces = segment_of(3).cut_around(&[2]).expect("a trailing run");
        assert_eq!(names(&pieces), vec![vec!["m0", "m1"], vec!["m2"]]);
    }

    #[test]
    fn a_segment_stays_whole_unless_one_run_of_some_slots_is_named() {
        for indexes in [&[][..], &[7], &[0, 1, 2], &[0, 2], &[2, 0, 1, 1]] {
            let whole = segment_of(3).cut_around(indexes).expect_err("left whole");
            assert_eq!(names(&[whole]), vec![vec!["m0", "m1", "m2"]], "{indexes:?}");
        }
    }

    #[test]
    fn a_segment_is_cut_where_its_leading_request_changes() {
        let mut queue = PartitionQueue::default();
        queue.add(1, [(0, message("a")), (1, message("b"))]);
        queue.add(2, [(0, message("c"))]);
        queue.add(3, [(0, message("b")), (1, message("d")), (2, message("e"))]);
        let segment = queue.take_segment(10);
        assert!(segment.all_named(&[4, 3, 9, 2, 1, 0]) && !segment.all_named(&[0, 1, 2, 3]));
        // "b" of request 3 waits on request 1's slot: its leader decides.
        let changes = segment.request_changes();
        assert_eq!(changes, vec![2, 3]);
        let pieces = segment.cut_at(&changes);
        assert_eq!(names(&pieces), vec![vec!["a", "b"], vec!["c"], vec!["d", "e"]]);
        for piece in &pieces {
            let hashes: Vec<u8> = piece.slots.iter().flat_map(|s| s.message.hash).collect();
            assert_eq!(piece.hashes, hashes, "each piece carries its own slots' hashes");
        }
        assert!(segment_of(3).request_changes().is_empty(), "one request leads every slot");
    }

    #[test]
    fn replaying_requests_are_taken_apart_from_the_others_each_in_order() {
        let mut queue = PartitionQueue::default();
        queue.add(1, [(0, message("new-1"))]);
        queue.add(2, [(0, message("old-2"))]);
        queue.add(3, [(0, message("new-3")), (1, message("old-3"))]);
        queue.add(4, [(0, message("old-4a")), (1, message("old-4b"))]);
        queue.add(5, [(0, message("new-5"))]);
        let segment = queue.take_segment(10);
        // Named: request 2's slot, request 3's second, request 4's two.
        let pieces = segment.part_replaying_requests(&[1, 3, 4, 5]).expect("parted");
        assert_eq!(
            names(&pieces),
            vec![vec!["new-1", "new-3", "old-3", "new-5"], vec!["old-2"], vec!["old-4a", "old-4b"]],
            "a request that replays only in part stays with the new ones, whole and in order"
        );
        for piece in &pieces {
            let hashes: Vec<u8> = piece.slots.iter().flat_map(|s| s.message.hash).collect();
            assert_eq!(piece.hashes, hashes, "each piece carries its own slots' hashes");
        }
        for indexes in [&[][..], &[0, 1, 2, 3, 4, 5, 6], &[2, 9]] {
            let mut queue = PartitionQueue::default();
            queue.add(1, [(0, message("a"))]);
            queue.add(2, [(0, message("b")), (1, message("c"))]);
            let whole = queue.take_segment(10).part_replaying_requests(indexes).expect_err("no request apart");
            assert_eq!(names(&[whole]), vec![vec!["a", "b", "c"]], "{indexes:?}");
        }
    }

    #[test]
    fn take_segment_respects_the_cap_and_keeps_the_index_right() {
        let mut queue = PartitionQueue::default();
        queue.add(1, (0..5).map(|i| (i, message(&i.to_string()))));
        let first = queue.take_segment(2);
        assert_eq!(first.slots.len(), 2);
        queue.add(2, [(0, message("4"))]);
        assert_eq!(queue.len(), 3, "the repeat of \"4\" joins its pending slot");
    }
}
