//! The push path above the shards: layer 1, partition metadata, and routing.
//!
//! Layer 1 compares `queue \x1f partition \x1f transactionId` inside one
//! request: the first occurrence leads and the repeats inherit its final
//! result. Each partition's leaders then go to the one shard that partition
//! maps to.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytestring::ByteString;
use deadpool_postgres::GenericClient;
use futures::future::try_join_all;
use tokio::sync::Notify;
use uuid::Uuid;

use crate::api::{Payload, PushItem};
use crate::db::{
    ClockFloor, Db, DbError, MessageOutcome, PartitionMeta, PartitionName, SegmentPush, push_on, resolve_partitions_on,
};
use crate::fusion::Message;
use crate::hash::txn_hash;
use crate::metrics::Metrics;
use crate::shard::{Committed, METADATA_TTL, Outcome, PartitionPushRequest, PushFailure, ShardHandle, VouchRequest};

/// Most memoised partitions; beyond it the memo starts afresh.
const METADATA_CAP: usize = 100_000;

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
    metadata: Mutex<HashMap<(String, String), MetaRead>>,
    metrics: Arc<Metrics>,
    /// Woken when a timer is scheduled through this gateway, so that its
    /// firer looks again at once.
    timers_scheduled: Arc<Notify>,
}

/// A message pushed inside an open transaction (a transaction request's push,
/// a timer's fire), with its id already chosen.
#[derive(Clone, Debug)]
pub struct TransactionalPush {
    pub queue: String,
    pub partition: String,
    pub transaction_id: String,
    pub message_id: Uuid,
    pub payload: Payload,
}

/// Messages ready to push inside a transaction: layer 1 applied, one
/// segment per partition (see [`Gateway::plan_pushes`]).
#[derive(Debug)]
pub struct PlannedPushes {
    pushes: Vec<TransactionalPush>,
    hashes: Vec<[u8; 16]>,
    /// For every push, the push it follows (itself for a leader).
    leader_of: Vec<usize>,
    /// Each segment's leaders, in segment order.
    leaders: Vec<Vec<usize>>,
    segments: Vec<SegmentPush>,
    /// What the segments' vouches assume of PostgreSQL's clock.
    clock_floor: ClockFloor,
}

/// What [`Gateway::push_planned`] did, before the transaction commits.
#[derive(Debug)]
pub struct PushedInTransaction {
    /// One answer per push, in order. A repeat of an earlier push of the
    /// same transaction follows it and answers `duplicate`.
    pub results: Vec<PushResult>,
    /// How many pushes carried an id their partition already stores in the
    /// window.
    pub already_stored: usize,
    /// The segments written, for the shards' caches once committed.
    pub committed: Vec<Committed>,
}

impl Gateway {
    pub fn new(db: Db, shards: Vec<ShardHandle>, metrics: Arc<Metrics>) -> Gateway {
        assert!(!shards.is_empty(), "a gateway needs at least one shard");
        Gateway { db, shards, metadata: Mutex::new(HashMap::new()), metrics, timers_scheduled: Arc::new(Notify::new()) }
    }

    pub fn timers_scheduled(&self) -> &Arc<Notify> {
        &self.timers_scheduled
    }

    pub fn db(&self) -> &Db {
        &self.db
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Pushes a validated request and answers every item, in order.
    pub async fn push(&self, items: Vec<PushItem>) -> Result<Vec<PushResult>, PushFailure> {
        let plan = RequestPlan::new(items);
        let plan = &plan;
        let groups = plan.groups.iter().map(|((queue, partition), leaders)| async move {
            let MetaRead { meta, read_at: window_read_at } = self.partition(queue, partition).await?;
            let messages = leaders.iter().map(|&item| plan.messages[item].clone()).collect();
            let shard = &self.shards[shard_of(meta.id, self.shards.len())];
            let request =
                PartitionPushRequest { partition_id: meta.id, window_seconds: meta.window_seconds, window_read_at, messages };
            let outcomes = shard.push(request).await?;
            Ok::<_, PushFailure>(leaders.iter().copied().zip(outcomes).collect::<Vec<_>>())
        });
        let answered = try_join_all(groups).await.inspect_err(|failure| {
            if matches!(failure, PushFailure::Unavailable(_)) {
                self.metrics.unavailable();
            }
        })?;
        let mut leader_outcomes: Vec<Option<Outcome>> = vec![None; plan.items.len()];
        for (item, outcome) in answered.into_iter().flatten() {
            leader_outcomes[item] = Some(outcome);
        }
        let results = plan.answer(&leader_outcomes);
        let duplicates = results.iter().filter(|r| r.duplicate).count() as u64;
        self.metrics.pushed(results.len() as u64 - duplicates, duplicates);
        Ok(results)
    }

    /// Layer 1 and partition lookups for messages to push inside the open
    /// transaction of `client`. Partitions this gateway has not seen lately
    /// are looked up (or created) in that transaction, all in one round
    /// trip: a queue or partition that only a rolled-back transaction named
    /// is never left behind, and a transaction holds one connection only.
    pub async fn plan_pushes(
        &self,
        client: &impl GenericClient,
        pushes: Vec<TransactionalPush>,
    ) -> Result<PlannedPushes, DbError> {
        let hashes: Vec<[u8; 16]> = pushes.iter().map(|p| txn_hash(&p.transaction_id)).collect();
        let mut first: HashMap<(&str, &str, [u8; 16]), usize> = HashMap::new();
        let mut leader_of = Vec::with_capacity(pushes.len());
        let mut groups: BTreeMap<(&str, &str), Vec<usize>> = BTreeMap::new();
        for (index, push) in pushes.iter().enumerate() {
            let leader = *first.entry((&push.queue, &push.partition, hashes[index])).or_insert(index);
            leader_of.push(leader);
            if leader == index {
                groups.entry((&push.queue, &push.partition)).or_default().push(index);
            }
        }
        let metas =
            self.partitions_in(client, groups.keys().map(|&(queue, partition)| PartitionName { queue, partition })).await?;
        let mut segments = Vec::with_capacity(groups.len());
        let mut clock_floor = ClockFloor::EPOCH;
        for (leaders, MetaRead { meta, read_at: window_read_at }) in groups.values().zip(metas) {
            let segment_hashes: Vec<u8> = leaders.iter().flat_map(|&i| hashes[i]).collect();
            let shard = &self.shards[shard_of(meta.id, self.shards.len())];
            let vouch = shard
                .vouch(VouchRequest {
                    partition_id: meta.id,
                    window_seconds: meta.window_seconds,
                    window_read_at,
                    hashes: segment_hashes.clone(),
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
                hashes: segment_hashes,
                message_ids: leaders.iter().map(|&i| pushes[i].message_id).collect(),
                transaction_ids: leaders.iter().map(|&i| pushes[i].transaction_id.clone()).collect(),
                payloads: leaders.iter().map(|&i| pushes[i].payload.clone()).collect(),
            });
        }
        let leaders = groups.into_values().collect();
        Ok(PlannedPushes { pushes, hashes, leader_of, leaders, segments, clock_floor })
    }

    /// Pushes planned messages in the open transaction of `client`, each
    /// segment probed under its partition's row lock above what its shard's
    /// cache vouched for when it was planned. Nothing is visible until the caller
    /// commits; then it hands [`PushedInTransaction::committed`] to
    /// [`Gateway::committed_elsewhere`].
    pub async fn push_planned(
        &self,
        client: &impl GenericClient,
        planned: PlannedPushes,
    ) -> Result<PushedInTransaction, DbError> {
        let PlannedPushes { pushes, hashes, leader_of, leaders, segments, clock_floor } = planned;
        let outcomes = push_on(client, clock_floor, &segments).await?;
        let mut answers: Vec<Option<(Uuid, i64)>> = vec![None; pushes.len()];
        let mut already_stored = 0;
        let mut committed = Vec::new();
        for ((segment, leaders), outcome) in segments.iter().zip(&leaders).zip(&outcomes) {
            self.metrics.segment(outcome.probe);
            let mut stored_hashes = Vec::with_capacity(segment.hashes.len());
            for ((k, &item), message) in leaders.iter().enumerate().zip(outcome.per_message(leaders.len())) {
                answers[item] = Some(match message {
                    MessageOutcome::Stored { offset } => {
                        stored_hashes.extend_from_slice(&hashes[item]);
                        (segment.message_ids[k], offset)
                    }
                    MessageOutcome::Duplicate(original) => {
                        already_stored += 1;
                        (original.message_id, original.offset)
                    }
                });
            }
            if let Some(stored) = outcome.stored {
                committed.push(Committed {
                    partition_id: segment.partition_id,
                    base_offset: stored.base_offset,
                    created_ms: stored.created_ms,
                    hashes: stored_hashes,
                });
            }
        }
        let results = pushes
            .into_iter()
            .enumerate()
            .map(|(index, push)| {
                let leader = leader_of[index];
                let (message_id, offset) = answers[leader].expect("every leader is answered");
                let stored_now = message_id == push.message_id && leader == index;
                PushResult {
                    message_id,
                    transaction_id: push.transaction_id.into(),
                    queue: push.queue.into(),
                    partition: push.partition.into(),
                    offset,
                    duplicate: !stored_now,
                }
            })
            .collect();
        Ok(PushedInTransaction { results, already_stored, committed })
    }

    /// Tells each shard's cache of segments a transaction or a fire has
    /// committed (see [`ShardHandle::committed_elsewhere`]).
    pub async fn committed_elsewhere(&self, committed: Vec<Committed>) {
        let mut by_shard: BTreeMap<usize, Vec<Committed>> = BTreeMap::new();
        for commit in committed {
            by_shard.entry(shard_of(commit.partition_id, self.shards.len())).or_default().push(commit);
        }
        for (shard, commits) in by_shard {
            self.shards[shard].committed_elsewhere(commits).await;
        }
    }

    /// A partition's metadata, memoised for [`METADATA_TTL`]; created in
    /// PostgreSQL on first use.
    /// Answers the metadata with the instant it was read from PostgreSQL.
    async fn partition(&self, queue: &str, partition: &str) -> Result<MetaRead, PushFailure> {
        self.partition_meta(queue, partition).await.map_err(|error| {
            if error.is_unavailable() {
                PushFailure::Unavailable(error.to_string())
            } else {
                PushFailure::Database(error.to_string())
            }
        })
    }

    async fn partition_meta(&self, queue: &str, partition: &str) -> Result<MetaRead, DbError> {
        if let Some(memoised) = self.memoised(PartitionName { queue, partition }) {
            return Ok(memoised);
        }
        let meta = self.db.resolve_partition(queue, partition).await?;
        let mut memo = self.metadata.lock().expect("not poisoned");
        if memo.len() >= METADATA_CAP {
            memo.clear();
        }
        let read = MetaRead { meta, read_at: Instant::now() };
        memo.insert((queue.to_owned(), partition.to_owned()), read);
        Ok(read)
    }

    /// A partition's memoised metadata, if it is fresh.
    fn memoised(&self, name: PartitionName<'_>) -> Option<MetaRead> {
        let key = (name.queue.to_owned(), name.partition.to_owned());
        self.metadata.lock().expect("not poisoned").get(&key).filter(|read| read.read_at.elapsed() < METADATA_TTL).copied()
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
        self.metadata.lock().expect("not poisoned").retain(|(q, _), _| q != queue);
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
    items: Vec<PushItem>,
    /// One message per item (followers' are unused).
    messages: Vec<Message>,
    /// For every item, the item that leads it (itself for a leader).
    leader_of: Vec<usize>,
    groups: HashMap<(ByteString, ByteString), Vec<usize>>,
}

impl RequestPlan {
    /// Plans a validated request: a message for each item, its leader, and
    /// the leaders of each partition.
    pub fn new(items: Vec<PushItem>) -> RequestPlan {
        let mut seen: HashMap<(&str, &str, &str), usize> = HashMap::new();
        let mut groups: HashMap<(ByteString, ByteString), Vec<usize>> = HashMap::new();
        let mut messages = Vec::with_capacity(items.len());
        let mut leader_of = Vec::with_capacity(items.len());
        for item in &items {
            let message_id = Uuid::now_v7();
            let transaction_id = item.transaction_id.clone().unwrap_or_else(|| ByteString::from(message_id.to_string()));
            messages.push(Message { message_id, hash: txn_hash(&transaction_id), transaction_id, payload: item.payload.clone() });
        }
        let repeats_possible = items.len() > 1;
        for (index, item) in items.iter().enumerate() {
            let leader = match &item.transaction_id {
                Some(id) if repeats_possible => *seen.entry((&item.queue, &item.partition, id)).or_insert(index),
                // No id: the message id stands in, new every time.
                _ => index,
            };
            leader_of.push(leader);
            if leader == index {
                groups.entry((item.queue.clone(), item.partition.clone())).or_default().push(index);
            }
        }
        RequestPlan { items, messages, leader_of, groups }
    }

    /// Every item's answer, in order, from its leader's outcome (indexed by
    /// item; `None` for followers).
    pub fn answer(&self, leader_outcomes: &[Option<Outcome>]) -> Vec<PushResult> {
        self.items
            .iter()
            .enumerate()
            .map(|(index, item)| {
                let leader = self.leader_of[index];
                let outcome = leader_outcomes[leader].expect("every leader is answered");
                let (message_id, offset, duplicate) = match outcome {
                    Outcome::Queued { message_id, offset } => (message_id, offset, leader != index),
                    Outcome::Duplicate { message_id, offset } => (message_id, offset, true),
                };
                PushResult {
                    message_id,
                    transaction_id: self.messages[index].transaction_id.clone(),
                    queue: item.queue.clone(),
                    partition: item.partition.clone(),
                    offset,
                    duplicate,
                }
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
    fn repeats_in_one_request_follow_the_first_and_scope_is_the_partition() {
        let plan = RequestPlan::new(vec![
            item("q", "p", Some("a")),
            item("q", "p", Some("a")),
            item("q", "other", Some("a")),
            item("q", "p", None),
            item("q", "p", None),
        ]);
        assert_eq!(plan.leader_of, vec![0, 0, 2, 3, 4]);
        assert_eq!(plan.groups[&(ByteString::from("q"), ByteString::from("p"))], vec![0, 3, 4]);
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
        assert_eq!(results[3].transaction_id, plan.messages[3].message_id.to_string());
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
