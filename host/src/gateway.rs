//! The push path above the shards: layer 1, partition metadata, and routing.
//!
//! Layer 1 compares `queue \x1f partition \x1f transactionId` inside one
//! request: the first occurrence leads and the repeats inherit its final
//! result. Each partition's leaders then go to the one shard that partition
//! maps to.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytestring::ByteString;
use deadpool_postgres::GenericClient;
use foldhash::{HashMap, HashMapExt as _};
use futures::future::try_join_all;
use stile_guest::OwnedCommit;
use tokio::sync::Notify;
use uuid::Uuid;

use crate::db::{
    ClockFloor, Db, DbError, MessageOutcome, PartitionMeta, PartitionName, SegmentPush, push_on, resolve_partitions_on,
};
use crate::fusion::Message;
use crate::hash::txn_hash;
use crate::message_id;
use crate::metrics::Metrics;
use crate::push::item::PushItem;
pub use crate::shard::PushFailure;
use crate::shard::{METADATA_TTL, Outcome, PartitionPushRequest, ShardHandle, VouchRequest};

/// Most memoised partitions (see [`PartitionMemo`]).
const METADATA_CAP: usize = 100_000;

/// Wakes this gateway's timer firer, so that a timer scheduled through this
/// gateway and due now fires without waiting for the firer's sleep.
#[derive(Debug, Default)]
pub struct FirerWake(Notify);

impl FirerWake {
    /// Wakes the firer, now or at its next wait.
    pub fn wake(&self) {
        self.0.notify_one();
    }

    /// Returns when woken.
    pub async fn woken(&self) {
        self.0.notified().await;
    }
}

/// One item's answer, in request order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PushResult {
    pub message_id: Uuid,
    pub transaction_id: ByteString,
    pub queue: ByteString,
    pub partition: ByteString,
    pub offset: i64,
    pub duplicate: bool,
}

/// The gateway's push path.
#[derive(Debug)]
pub struct Gateway {
    db: Db,
    shards: Vec<ShardHandle>,
    metadata: Mutex<PartitionMemo>,
    metrics: Arc<Metrics>,
}

/// What [`Gateway::push_in`] did, before the transaction commits.
#[derive(Debug)]
pub struct PushedInTransaction {
    /// One answer per item, in order. A repeat of an earlier item of the
    /// same plan follows it and answers `duplicate`.
    pub results: Vec<PushResult>,
    /// How many of the plan's messages carried an id their partition already
    /// stores in the window.
    pub already_stored: usize,
    /// The segments written, for the shards' caches once committed.
    pub committed: Vec<OwnedCommit>,
}

impl Gateway {
    pub fn new(db: Db, shards: Vec<ShardHandle>, metrics: Arc<Metrics>) -> Gateway {
        assert!(!shards.is_empty(), "a gateway needs at least one shard");
        Gateway { db, shards, metadata: Mutex::new(PartitionMemo::default()), metrics }
    }

    pub fn db(&self) -> &Db {
        &self.db
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Pushes a validated request and answers every item, in order.
    pub async fn push(&self, items: Vec<PushItem>) -> Result<Vec<PushResult>, PushFailure> {
        let mut plan = RequestPlan::new(items);
        let group_messages = plan.take_group_messages();
        let groups = plan.groups.iter().zip(group_messages).map(|(group, messages)| async move {
            let MetaRead { meta, read_at: window_read_at } = self.partition(&group.queue, &group.partition).await?;
            let shard = &self.shards[shard_of(meta.id, self.shards.len())];
            let request =
                PartitionPushRequest { partition_id: meta.id, window_seconds: meta.window_seconds, window_read_at, messages };
            let outcomes = shard.push(request).await?;
            Ok::<_, PushFailure>(group.leaders.iter().copied().zip(outcomes).collect::<Vec<_>>())
        });
        let answered = try_join_all(groups).await.inspect_err(|failure| {
            if matches!(failure, PushFailure::Unavailable(_)) {
                self.metrics.unavailable();
            }
        })?;
        let mut leader_outcomes: Vec<Option<Outcome>> = vec![None; plan.len()];
        for (item, outcome) in answered.into_iter().flatten() {
            leader_outcomes[item] = Some(outcome);
        }
        let results = plan.answer(&leader_outcomes);
        let duplicates = results.iter().filter(|r| r.duplicate).count() as u64;
        self.metrics.pushed(results.len() as u64 - duplicates, duplicates);
        Ok(results)
    }

    /// Pushes a planned request inside the open transaction of `client`
    /// (a transaction request's pushes, a timer fire's). Partitions this
    /// gateway has not seen lately are looked up (or created) in that
    /// transaction, all in one round trip and in (queue, partition) order: a
    /// queue or partition that only a rolled-back transaction named is never
    /// left behind, and a transaction holds one connection only. Each
    /// segment is probed under its partition's row lock above what its
    /// shard's cache vouches for. Nothing is visible until the caller
    /// commits; then it hands [`PushedInTransaction::committed`] to
    /// [`Gateway::committed_elsewhere`].
    pub async fn push_in(&self, client: &impl GenericClient, plan: RequestPlan) -> Result<PushedInTransaction, DbError> {
        let mut groups: Vec<&PartitionGroup> = plan.groups.iter().collect();
        groups.sort_unstable_by(|a, b| (&a.queue, &a.partition).cmp(&(&b.queue, &b.partition)));
        let names = groups.iter().map(|group| PartitionName { queue: &group.queue, partition: &group.partition });
        let metas = self.partitions_in(client, names).await?;
        let mut segments = Vec::with_capacity(groups.len());
        let mut clock_floor = ClockFloor::EPOCH;
        for (group, MetaRead { meta, read_at: window_read_at }) in groups.iter().zip(metas) {
            let messages: Vec<&Message> = group.leaders.iter().map(|&item| &plan.messages[item]).collect();
            let hashes: Vec<u8> = messages.iter().flat_map(|m| m.hash).collect();
            let shard = &self.shards[shard_of(meta.id, self.shards.len())];
            let vouch = shard
                .vouch(VouchRequest {
                    partition_id: meta.id,
                    window_seconds: meta.window_seconds,
                    window_read_at,
                    hashes: hashes.clone(),
                })
                .await;
            // One floor for all the segments: the latest, so that each
            // vouch holds once PostgreSQL's clock has passed it.
            if vouch.p_verified >= 0 {
                clock_floor = clock_floor.max(vouch.clock_floor);
            }
            segments.push(SegmentPush {
                partition_id: meta.id,
                p_verified: vouch.p_verified,
                planned_window_seconds: meta.window_seconds,
                hashes,
                message_ids: messages.iter().map(|m| m.message_id).collect(),
                transaction_ids: messages.iter().map(|m| m.transaction_id.clone()).collect(),
                payloads: messages.iter().map(|m| m.payload.clone()).collect(),
                hash_floors: None,
                replays: false,
            });
        }
        let outcomes = push_on(client, clock_floor, &segments).await?;
        let mut leader_outcomes: Vec<Option<Outcome>> = vec![None; plan.len()];
        let mut already_stored = 0;
        let mut committed = Vec::new();
        for ((segment, group), outcome) in segments.iter().zip(&groups).zip(&outcomes) {
            let leaders = &group.leaders;
            self.metrics.segment(outcome.probe);
            let mut stored_hashes = Vec::with_capacity(segment.hashes.len());
            for ((&item, &message_id), message) in
                leaders.iter().zip(&segment.message_ids).zip(outcome.per_message(leaders.len()))
            {
                leader_outcomes[item] = Some(match message {
                    MessageOutcome::Stored { offset } => {
                        stored_hashes.extend_from_slice(&plan.messages[item].hash);
                        Outcome::Queued { message_id, offset }
                    }
                    MessageOutcome::Duplicate(original) => {
                        already_stored += 1;
                        Outcome::Duplicate { message_id: original.message_id, offset: original.offset }
                    }
                });
            }
            if let Some(stored) = outcome.stored {
                committed.push(OwnedCommit {
                    partition: segment.partition_id,
                    base_offset: stored.base_offset,
                    created_ms: stored.created_ms,
                    hashes: stored_hashes,
                });
            }
        }
        let results = plan.answer(&leader_outcomes);
        Ok(PushedInTransaction { results, already_stored, committed })
    }

    /// Tells each shard's cache of segments a transaction or a fire has
    /// committed (see [`ShardHandle::committed_elsewhere`]).
    pub async fn committed_elsewhere(&self, committed: Vec<OwnedCommit>) {
        let mut by_shard: BTreeMap<usize, Vec<OwnedCommit>> = BTreeMap::new();
        for commit in committed {
            by_shard.entry(shard_of(commit.partition, self.shards.len())).or_default().push(commit);
        }
        for (shard, commits) in by_shard {
            self.shards[shard].committed_elsewhere(commits).await;
        }
    }

    /// A partition's metadata, memoised for [`METADATA_TTL`]; created in
    /// PostgreSQL on first use.
    /// Answers the metadata with the instant it was read from PostgreSQL.
    async fn partition(&self, queue: &ByteString, partition: &ByteString) -> Result<MetaRead, PushFailure> {
        self.partition_meta(queue, partition).await.map_err(|error| {
            if error.is_unavailable() {
                PushFailure::Unavailable(error.to_string())
            } else {
                PushFailure::Database(error.to_string())
            }
        })
    }

    async fn partition_meta(&self, queue: &ByteString, partition: &ByteString) -> Result<MetaRead, DbError> {
        if let Some(memoised) = self.memoised(PartitionName { queue, partition }) {
            return Ok(memoised);
        }
        let meta = self.db.resolve_partition(queue, partition).await?;
        let read = MetaRead { meta, read_at: Instant::now() };
        self.metadata.lock().expect("not poisoned").insert(queue, partition, read);
        Ok(read)
    }

    /// A partition's memoised metadata, if it is fresh.
    fn memoised(&self, name: PartitionName<'_>) -> Option<MetaRead> {
        self.metadata.lock().expect("not poisoned").get(name).filter(|read| read.read_at.elapsed() < METADATA_TTL)
    }

    /// Partitions' metadata, in order: from the memo where it is fresh,
    /// the others read (or created) on `client` and not memoised, since
    /// `client`'s transaction may yet roll back. `names` come sorted, so
    /// that creations take one order (see [`resolve_partitions_on`]).
    async fn partitions_in(
        &self,
        client: &impl GenericClient,
        names: impl Iterator<Item = PartitionName<'_>>,
    ) -> Result<Vec<MetaRead>, DbError> {
        let names: Vec<PartitionName<'_>> = names.collect();
        let mut known: Vec<Option<MetaRead>> = names.iter().map(|&name| self.memoised(name)).collect();
        let unknown: Vec<PartitionName<'_>> =
            names.iter().zip(&known).filter(|(_, meta)| meta.is_none()).map(|(&name, _)| name).collect();
        let read_at = Instant::now();
        let mut resolved = resolve_partitions_on(client, &unknown).await?.into_iter();
        for meta in known.iter_mut().filter(|meta| meta.is_none()) {
            *meta = Some(MetaRead { meta: resolved.next().expect("one meta per unknown name"), read_at });
        }
        Ok(known.into_iter().map(|meta| meta.expect("every name resolved")).collect())
    }

    /// Forgets memoised metadata of a queue, so that a configure made through
    /// this gateway takes effect at once here.
    pub fn forget_queue(&self, queue: &str) {
        self.metadata.lock().expect("not poisoned").forget_queue(queue);
    }
}

/// Partitions' metadata by queue and partition name, at most
/// [`METADATA_CAP`] of them, in two generations: a partition is memoised in
/// the newer one, and when that holds half the cap it becomes the older one
/// and the older one is dropped. Every partition in use is read again each
/// [`METADATA_TTL`], into the newer generation, so while fewer than half the
/// cap are in use, none is dropped while fresh; with more, the busiest are
/// still found, and none costs more than a read each time it expires.
#[derive(Debug, Default)]
struct PartitionMemo {
    newer: MemoGeneration,
    older: MemoGeneration,
}

impl PartitionMemo {
    fn get(&self, name: PartitionName<'_>) -> Option<MetaRead> {
        self.newer.get(name).or_else(|| self.older.get(name))
    }

    fn insert(&mut self, queue: &str, partition: &str, read: MetaRead) {
        if self.newer.len >= METADATA_CAP / 2 {
            self.older = std::mem::take(&mut self.newer);
        }
        self.newer.insert(queue, partition, read);
    }

    fn forget_queue(&mut self, queue: &str) {
        self.newer.forget_queue(queue);
        self.older.forget_queue(queue);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.newer.len + self.older.len
    }
}

/// One generation of the memo. Keyed by queue, then partition, so that a
/// lookup by borrowed names allocates nothing: it runs for every partition
/// of every push.
#[derive(Debug, Default)]
struct MemoGeneration {
    by_queue: HashMap<ByteString, HashMap<ByteString, MetaRead>>,
    len: usize,
}

impl MemoGeneration {
    fn get(&self, name: PartitionName<'_>) -> Option<MetaRead> {
        self.by_queue.get(name.queue)?.get(name.partition).copied()
    }

    /// Memoises `read` under copies of the names. A request's names are
    /// views of its body, and a view held here would keep the whole buffer
    /// the body arrived in (a connection's read buffer, kilobytes) alive for
    /// as long as the memo holds the partition, outside the bound on what
    /// requests in progress hold.
    fn insert(&mut self, queue: &str, partition: &str, read: MetaRead) {
        let partitions = self.by_queue.entry(ByteString::from(queue)).or_default();
        let previous = partitions.insert(ByteString::from(partition), read);
        if previous.is_none() {
            self.len += 1;
        }
    }

    fn forget_queue(&mut self, queue: &str) {
        if let Some(partitions) = self.by_queue.remove(queue) {
            self.len -= partitions.len();
        }
    }
}

/// A partition's metadata and the instant it was read from PostgreSQL,
/// which bounds how stale its window may be.
#[derive(Clone, Copy, Debug)]
struct MetaRead {
    meta: PartitionMeta,
    read_at: Instant,
}

/// A partition always maps to the same shard.
pub fn shard_of(partition_id: i64, shards: usize) -> usize {
    (partition_id.unsigned_abs() % shards as u64) as usize
}

/// Layer 1 over one request: which items lead, grouped by partition, and
/// which item each repeat follows.
#[derive(Debug)]
pub struct RequestPlan {
    /// What each item's answer names, in request order.
    names: Vec<ItemNames>,
    /// One message per item (followers' are unused).
    messages: Vec<Message>,
    /// For every item, the item that leads it (itself for a leader).
    leader_of: Vec<usize>,
    /// Each partition's leaders, partitions in the order the request first
    /// names them.
    groups: Vec<PartitionGroup>,
}

/// What an item's answer names: its partition and its transactionId (the
/// message id's text when the producer sent none). Moved into the answer,
/// not copied: the strings are views of the request's body, and each copy
/// touches the body's one reference count from whichever thread runs it.
#[derive(Debug)]
struct ItemNames {
    queue: ByteString,
    partition: ByteString,
    transaction_id: ByteString,
}

/// One partition's leaders in a request, in request order.
#[derive(Debug)]
struct PartitionGroup {
    queue: ByteString,
    partition: ByteString,
    leaders: Vec<usize>,
}

impl RequestPlan {
    /// Plans a validated request: a message for each item, its leader, and
    /// the leaders of each partition.
    pub fn new(items: Vec<PushItem>) -> RequestPlan {
        let message_ids = message_id::mint(items.len());
        RequestPlan::with_message_ids(items, message_ids)
    }

    /// [`RequestPlan::new`] with the messages' ids chosen before (a timer's
    /// message id, promised when it was scheduled): one per item.
    pub fn with_message_ids(items: Vec<PushItem>, message_ids: Vec<Uuid>) -> RequestPlan {
        assert_eq!(items.len(), message_ids.len(), "one message id per item");
        let mut plan = RequestPlan::led(&items);
        for (item, message_id) in items.into_iter().zip(message_ids) {
            let PushItem { queue, partition, payload, transaction_id } = item;
            let transaction_id = transaction_id.unwrap_or_else(|| ByteString::from(message_id.to_string()));
            let hash = txn_hash(&transaction_id);
            plan.messages.push(Message { message_id, hash, transaction_id: transaction_id.clone(), payload });
            plan.names.push(ItemNames { queue, partition, transaction_id });
        }
        plan
    }

    /// Layer 1 over `items`: each item's leader (the first item naming the
    /// same partition and transactionId; an item without one leads itself)
    /// and each partition's leaders. Names and messages are left empty.
    fn led(items: &[PushItem]) -> RequestPlan {
        let mut plan = RequestPlan {
            names: Vec::with_capacity(items.len()),
            messages: Vec::with_capacity(items.len()),
            leader_of: Vec::with_capacity(items.len()),
            groups: Vec::new(),
        };
        let repeats_possible = items.len() > 1;
        let mut seen: HashMap<(&str, &str, &str), usize> = HashMap::with_capacity(if repeats_possible { items.len() } else { 0 });
        let mut group_of: HashMap<(&str, &str), usize> = HashMap::new();
        for (index, item) in items.iter().enumerate() {
            let leader = match &item.transaction_id {
                Some(id) if repeats_possible => *seen.entry((&item.queue, &item.partition, id)).or_insert(index),
                // No id: the message id stands in, new every time.
                _ => index,
            };
            plan.leader_of.push(leader);
            if leader == index {
                let group = *group_of.entry((&item.queue, &item.partition)).or_insert_with(|| {
                    let (queue, partition) = (item.queue.clone(), item.partition.clone());
                    plan.groups.push(PartitionGroup { queue, partition, leaders: Vec::new() });
                    plan.groups.len() - 1
                });
                plan.groups[group].leaders.push(index);
            }
        }
        plan
    }

    /// The number of items, and of answers.
    fn len(&self) -> usize {
        self.names.len()
    }

    /// Moves the leaders' messages out, one list per group in group order,
    /// each in its leaders' order: what the shards push. The plan keeps what
    /// its answers need, and no messages: [`Gateway::push_in`], which reads
    /// them, takes a plan whose messages were never taken.
    fn take_group_messages(&mut self) -> Vec<Vec<Message>> {
        let mut group_of: Vec<Option<usize>> = vec![None; self.messages.len()];
        for (group, PartitionGroup { leaders, .. }) in self.groups.iter().enumerate() {
            for &leader in leaders {
                group_of[leader] = Some(group);
            }
        }
        let mut taken: Vec<Vec<Message>> = self.groups.iter().map(|g| Vec::with_capacity(g.leaders.len())).collect();
        for (message, group) in std::mem::take(&mut self.messages).into_iter().zip(group_of) {
            if let Some(group) = group {
                taken[group].push(message);
            }
        }
        taken
    }

    /// Every item's answer, in order, from its leader's outcome (indexed by
    /// item; `None` for followers).
    pub fn answer(self, leader_outcomes: &[Option<Outcome>]) -> Vec<PushResult> {
        let RequestPlan { names, leader_of, .. } = self;
        names
            .into_iter()
            .zip(leader_of)
            .enumerate()
            .map(|(index, (ItemNames { queue, partition, transaction_id }, leader))| {
                let outcome = leader_outcomes[leader].expect("every leader is answered");
                let (message_id, offset, duplicate) = match outcome {
                    Outcome::Queued { message_id, offset } => (message_id, offset, leader != index),
                    Outcome::Duplicate { message_id, offset } => (message_id, offset, true),
                };
                PushResult { message_id, transaction_id, queue, partition, offset, duplicate }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::payload::Payload;

    fn item(queue: &str, partition: &str, id: Option<&str>) -> PushItem {
        PushItem {
            queue: queue.into(),
            partition: partition.into(),
            payload: Payload::null(),
            transaction_id: id.map(Into::into),
        }
    }

    #[test]
    fn the_metadata_memo_holds_no_view_of_a_request_body() {
        let body = bytes::Bytes::from(b"orders eu".to_vec());
        let queue = ByteString::try_from(body.slice(0..6)).expect("UTF-8");
        let partition = ByteString::try_from(body.slice(7..9)).expect("UTF-8");
        let meta = PartitionMeta { id: 7, window_seconds: 3600, last_offset: -1, txns_start: 0 };
        let mut memo = PartitionMemo::default();
        memo.insert(&queue, &partition, MetaRead { meta, read_at: Instant::now() });
        drop((queue, partition));
        assert!(body.is_unique(), "the memo keeps the body's buffer alive");
        let memoised = memo.get(PartitionName { queue: "orders", partition: "eu" }).expect("memoised");
        assert_eq!(memoised.meta.id, 7);
    }

    #[test]
    fn the_memo_keeps_the_partitions_read_again_and_at_most_its_cap() {
        let read = |id| MetaRead {
            meta: PartitionMeta { id, window_seconds: 60, last_offset: -1, txns_start: 0 },
            read_at: Instant::now(),
        };
        let id_of = |memo: &PartitionMemo, partition: &str| memo.get(PartitionName { queue: "q", partition }).map(|r| r.meta.id);
        let cap = METADATA_CAP as i64;
        let mut memo = PartitionMemo::default();
        for i in 0..2 * cap {
            // A busy partition is read again each time its entry expires.
            if i % (cap / 4) == 0 {
                memo.insert("q", "busy", read(-1));
            }
            memo.insert("q", &format!("p{i}"), read(i));
            assert!(memo.len() <= METADATA_CAP);
        }
        assert_eq!(id_of(&memo, "busy"), Some(-1));
        assert_eq!(id_of(&memo, &format!("p{}", 2 * cap - 1)), Some(2 * cap - 1));
        assert_eq!(id_of(&memo, "p0"), None, "the oldest partitions make room");
    }

    #[test]
    fn repeats_in_one_request_follow_the_first_and_scope_is_the_partition() {
        let plan = RequestPlan::new(vec![
            item("q", "p", Some("a")),
            item("q", "p", Some("a")),
            item("q", "other", Some("a")),
            item("q", "p", None),
            item("q", "p", None),
        ]);
        assert_eq!(plan.leader_of, vec![0, 0, 2, 3, 4]);
        let leaders: Vec<(&str, &str, &[usize])> = plan.groups.iter().map(|g| (&*g.queue, &*g.partition, &*g.leaders)).collect();
        assert_eq!(leaders, [("q", "p", &[0, 3, 4][..]), ("q", "other", &[2][..])]);
        let own_id = plan.messages[3].message_id;
        let first = Uuid::now_v7();
        let outcomes = vec![
            Some(Outcome::Queued { message_id: first, offset: 7 }),
            None,
            Some(Outcome::Queued { message_id: Uuid::now_v7(), offset: 0 }),
            Some(Outcome::Queued { message_id: Uuid::now_v7(), offset: 8 }),
            Some(Outcome::Queued { message_id: Uuid::now_v7(), offset: 9 }),
        ];
        let results = plan.answer(&outcomes);
        assert!(!results[0].duplicate);
        assert!(results[1].duplicate);
        assert_eq!((results[1].message_id, results[1].offset), (first, 7));
        assert!(!results[2].duplicate);
        assert_eq!(results[3].transaction_id, own_id.to_string());
    }

    #[test]
    fn the_leaders_messages_move_out_by_group_in_leader_order() {
        let mut plan = RequestPlan::new(vec![
            item("q", "p", Some("a")),
            item("q", "other", Some("b")),
            item("q", "p", Some("a")),
            item("q", "p", Some("c")),
        ]);
        let ids: Vec<Uuid> = plan.messages.iter().map(|m| m.message_id).collect();
        let taken = plan.take_group_messages();
        let taken: Vec<Vec<(Uuid, &str)>> =
            taken.iter().map(|group| group.iter().map(|m| (m.message_id, &*m.transaction_id)).collect()).collect();
        assert_eq!(taken, [vec![(ids[0], "a"), (ids[3], "c")], vec![(ids[1], "b")]]);
        let outcomes: Vec<Option<Outcome>> = plan
            .leader_of
            .iter()
            .enumerate()
            .map(|(item, &leader)| (item == leader).then(|| Outcome::Queued { message_id: ids[item], offset: item as i64 }))
            .collect();
        let results = plan.answer(&outcomes);
        let names: Vec<(&str, &str, bool)> = results.iter().map(|r| (&*r.partition, &*r.transaction_id, r.duplicate)).collect();
        assert_eq!(names, [("p", "a", false), ("other", "b", false), ("p", "a", true), ("p", "c", false)]);
    }

    /// Layer 1 by its definition, over (queue, partition, transactionId)
    /// triples: an item leads unless an earlier item names the same three
    /// (an item without an id always leads); the groups are the leaders by
    /// partition, partitions in order of their first leader.
    fn reference_layer_one(items: &[(String, String, Option<String>)]) -> (Vec<usize>, Vec<Group>) {
        let leader_of: Vec<usize> = items
            .iter()
            .enumerate()
            .map(|(index, item)| match item.2 {
                Some(_) => items.iter().position(|earlier| earlier == item).expect("the item itself"),
                None => index,
            })
            .collect();
        let mut groups: Vec<Group> = Vec::new();
        for (index, (queue, partition, _)) in items.iter().enumerate().filter(|&(index, _)| leader_of[index] == index) {
            match groups.iter_mut().find(|g| (&g.queue, &g.partition) == (queue, partition)) {
                Some(group) => group.leaders.push(index),
                None => groups.push(Group { queue: queue.clone(), partition: partition.clone(), leaders: vec![index] }),
            }
        }
        (leader_of, groups)
    }

    /// A partition's leaders, as the reference states them.
    #[derive(Debug, PartialEq)]
    struct Group {
        queue: String,
        partition: String,
        leaders: Vec<usize>,
    }

    fn drawn_item() -> impl proptest::strategy::Strategy<Value = (String, String, Option<String>)> {
        ("[ab]", "[pq]", proptest::option::of("[xyz]"))
    }

    proptest::proptest! {
        #[test]
        fn the_plan_agrees_with_layer_one_by_its_definition(drawn in proptest::collection::vec(drawn_item(), 0..24)) {
            let items = drawn.iter().map(|(q, p, id)| item(q, p, id.as_deref())).collect();
            let mut plan = RequestPlan::new(items);
            let (leader_of, groups) = reference_layer_one(&drawn);
            proptest::prop_assert_eq!(&plan.leader_of, &leader_of);
            let planned: Vec<Group> = plan
                .groups
                .iter()
                .map(|g| Group { queue: g.queue.to_string(), partition: g.partition.to_string(), leaders: g.leaders.clone() })
                .collect();
            proptest::prop_assert_eq!(&planned, &groups);

            // Each group's messages are its leaders' own, in order.
            let ids: Vec<Uuid> = plan.messages.iter().map(|m| m.message_id).collect();
            let taken = plan.take_group_messages();
            proptest::prop_assert_eq!(taken.len(), groups.len());
            for (messages, group) in taken.iter().zip(&groups) {
                let taken_ids: Vec<Uuid> = messages.iter().map(|m| m.message_id).collect();
                let leader_ids: Vec<Uuid> = group.leaders.iter().map(|&l| ids[l]).collect();
                proptest::prop_assert_eq!(taken_ids, leader_ids);
            }

            // Every item answers with its own names and its leader's outcome;
            // a follower answers duplicate.
            let outcomes: Vec<Option<Outcome>> = leader_of
                .iter()
                .enumerate()
                .map(|(item, &leader)| (item == leader).then(|| Outcome::Queued { message_id: ids[item], offset: item as i64 }))
                .collect();
            let results = plan.answer(&outcomes);
            proptest::prop_assert_eq!(results.len(), drawn.len());
            for (index, (result, (queue, partition, id))) in results.iter().zip(&drawn).enumerate() {
                let leader = leader_of[index];
                proptest::prop_assert_eq!((&*result.queue, &*result.partition), (queue.as_str(), partition.as_str()));
                let own_id = id.clone().unwrap_or_else(|| ids[index].to_string());
                proptest::prop_assert_eq!(&*result.transaction_id, own_id.as_str());
                proptest::prop_assert_eq!((result.message_id, result.offset), (ids[leader], leader as i64));
                proptest::prop_assert_eq!(result.duplicate, leader != index);
            }
        }
    }

    #[test]
    fn followers_of_a_duplicate_leader_report_the_original() {
        let plan = RequestPlan::new(vec![item("q", "p", Some("a")), item("q", "p", Some("a"))]);
        let original = Uuid::now_v7();
        let results = plan.answer(&[Some(Outcome::Duplicate { message_id: original, offset: 3 }), None]);
        assert!(results.iter().all(|r| r.duplicate && r.message_id == original && r.offset == 3));
    }

    #[test]
    fn shard_of_is_stable_and_in_range() {
        for id in [0, 1, 7, i64::MAX, -3] {
            assert_eq!(shard_of(id, 3), shard_of(id, 3));
            assert!(shard_of(id, 3) < 3);
        }
    }
}
