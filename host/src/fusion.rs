//! Fusion: the pushes waiting for one partition, coalesced into segments.
//!
//! Layer 2 lives here: across the requests coalesced into one partition's
//! queue, messages with equal 16-byte hashes share one slot. The first
//! occurrence leads; the others wait on it and inherit its final result.
//! (Layer 1, inside one request, runs before a request reaches a shard.)

use std::collections::HashMap;

use serde_json::Value;
use uuid::Uuid;

/// A message as the shard pushes it: a layer-1 leader of its request.
#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    pub message_id: Uuid,
    pub transaction_id: String,
    pub hash: [u8; 16],
    pub payload: Value,
}

/// Where one slot's result must be delivered: a request and the position of
/// the message inside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Waiter {
    pub request: u64,
    pub index: u32,
}

/// One distinct hash of a partition's queue: the leading message and every
/// waiter on it. `waiters[0]` is the leader's own request position.
#[derive(Debug)]
pub struct Slot {
    pub message: Message,
    pub waiters: Vec<Waiter>,
}

/// One partition's pending messages.
#[derive(Debug, Default)]
pub struct PartitionQueue {
    slots: Vec<Slot>,
    by_hash: HashMap<[u8; 16], usize>,
}

/// Slots taken out of the queue to be pushed as one segment.
#[derive(Debug)]
pub struct Segment {
    pub slots: Vec<Slot>,
    /// The slots' hashes, 16 bytes each, in slot order.
    pub hashes: Vec<u8>,
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
        for (index, message) in messages {
            self.push_slot(Slot { message, waiters: vec![Waiter { request, index }] });
        }
    }

    /// Takes up to `max` slots, oldest first, as one segment.
    pub fn take_segment(&mut self, max: usize) -> Segment {
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
        Segment { slots, hashes }
    }

    fn push_slot(&mut self, slot: Slot) {
        match self.by_hash.get(&slot.message.hash) {
            Some(&leader) => self.slots[leader].waiters.extend(slot.waiters),
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
            transaction_id: id.to_owned(),
            hash: crate::hash::txn_hash(id),
            payload: Value::Null,
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
        assert_eq!(b.waiters, vec![Waiter { request: 1, index: 1 }, Waiter { request: 2, index: 0 }]);
        assert_eq!(segment.hashes.len(), 3 * 16);
        assert_eq!(&segment.hashes[16..32], &crate::hash::txn_hash("b"));
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
