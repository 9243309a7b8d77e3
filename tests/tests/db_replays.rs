//! The verdict on replays from what is committed, without the partition's
//! row lock (`stile.found_committed`): a segment the gateway marks as replays
//! is answered from committed rows only when every hash is found there, and
//! otherwise takes the lock, so that a first push still in flight, a
//! rollback, or a new id among the replays is decided exactly as before.

use std::collections::HashMap;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::seq::IndexedRandom as _;
use rand::{Rng as _, SeedableRng as _};
use stile::db::{ClockFloor, MessageOutcome, ProbeMode, SegmentOutcome, SegmentPush, push_on};
use stile_tests::pg::{PartitionState, TestDb, partition_state, segment};

/// A segment of `ids` marked as replays, vouched for by nothing.
fn replay(partition_id: i64, ids: &[&str]) -> SegmentPush {
    SegmentPush { replays: true, ..segment(partition_id, ids, -1, 3600) }
}

/// Each stored message of the database: (partition id, transactionId) to
/// its offset and message id.
async fn stored(c: &tokio_postgres::Client) -> HashMap<(i64, String), Vec<(i64, uuid::Uuid)>> {
    let rows = c
        .query(
            "SELECT p.id, m.transaction_id, m.\"offset\", m.message_id \
               FROM stile.messages m JOIN stile.partitions p ON p.queue = m.queue AND p.name = m.partition",
            &[],
        )
        .await
        .unwrap();
    let mut out: HashMap<(i64, String), Vec<(i64, uuid::Uuid)>> = HashMap::new();
    for row in rows {
        out.entry((row.get(0), row.get(1))).or_default().push((row.get(2), row.get(3)));
    }
    out
}

/// [`stored`], each id stored once (the model's first rule).
async fn stored_once(c: &tokio_postgres::Client) -> HashMap<(i64, String), Vec<(i64, uuid::Uuid)>> {
    let stored = stored(c).await;
    for ((pid, id), copies) in &stored {
        assert_eq!(copies.len(), 1, "{id} of partition {pid} stored {} times", copies.len());
    }
    stored
}

/// Fails the test instead of hanging when `work` waits for a lock it should
/// not wait for.
async fn promptly<T>(what: &str, work: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), work).await.unwrap_or_else(|_| panic!("{what}: no answer in 20 s"))
}

#[tokio::test]
async fn a_replay_of_committed_ids_is_answered_without_the_lock_and_writes_nothing() {
    let t = TestDb::new().await;
    let p = t.db.resolve_partition("q", "p").await.unwrap();
    let first = segment(p.id, &["a", "b"], -1, 3600);
    let second = segment(p.id, &["c"], -1, 3600);
    t.db.push_bundle(ClockFloor::EPOCH, std::slice::from_ref(&first)).await.unwrap();
    t.db.push_bundle(ClockFloor::EPOCH, std::slice::from_ref(&second)).await.unwrap();
    let c = t.client().await;
    let before = partition_state(&c, p.id).await;

    // Another session holds the partition's row lock throughout.
    let mut holder = t.client().await;
    let held = holder.transaction().await.unwrap();
    held.execute("SELECT 1 FROM stile.partitions WHERE id = $1 FOR UPDATE", &[&p.id]).await.unwrap();

    let mut replayer = t.db.pool().get().await.unwrap();
    let tx = replayer.transaction().await.unwrap();
    let out =
        promptly("a replay beside a held lock", push_on(&tx, ClockFloor::EPOCH, &[replay(p.id, &["c", "a"])])).await.unwrap();
    let assigned: Option<i64> = tx.query_one("SELECT txid_current_if_assigned()::text::bigint", &[]).await.unwrap().get(0);
    tx.commit().await.unwrap();
    held.rollback().await.unwrap();

    assert_eq!(out[0].probe, ProbeMode::Committed);
    assert!(out[0].stored.is_none());
    assert_eq!(
        out[0].per_message(2),
        vec![
            MessageOutcome::Duplicate(stile::db::Duplicate { index: 0, offset: 2, message_id: second.message_ids[0] }),
            MessageOutcome::Duplicate(stile::db::Duplicate { index: 1, offset: 0, message_id: first.message_ids[0] }),
        ]
    );
    assert_eq!(assigned, None, "the verdict took no transaction id");
    assert_eq!(partition_state(&c, p.id).await, before);
}

#[tokio::test]
async fn a_replay_with_one_new_id_takes_the_lock_and_stores_it() {
    let t = TestDb::new().await;
    let p = t.db.resolve_partition("q", "p").await.unwrap();
    let first = segment(p.id, &["a", "b"], -1, 3600);
    t.db.push_bundle(ClockFloor::EPOCH, std::slice::from_ref(&first)).await.unwrap();
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[replay(p.id, &["b", "new"])]).await.unwrap();
    assert_ne!(out[0].probe, ProbeMode::Committed);
    assert_eq!(
        out[0].per_message(2),
        vec![
            MessageOutcome::Duplicate(stile::db::Duplicate { index: 0, offset: 1, message_id: first.message_ids[1] }),
            MessageOutcome::Stored { offset: 2 },
        ]
    );
    let c = t.client().await;
    assert_eq!(partition_state(&c, p.id).await, PartitionState { last_offset: 2, txns_start: 0, segments: 2, txns: 2 });
}

/// The first push of an id, in flight in another transaction, and its
/// replay: the replay finds nothing committed, so it waits for the lock,
/// and answers as the first push ends: the original once it commits, stored
/// itself once it rolls back.
#[tokio::test]
async fn a_replay_of_a_first_push_in_flight_waits_for_it() {
    for commit in [true, false] {
        let t = TestDb::new().await;
        let p = t.db.resolve_partition("q", "p").await.unwrap();
        let mut first = t.db.pool().get().await.unwrap();
        let tx = first.transaction().await.unwrap();
        let original = segment(p.id, &["x"], -1, 3600);
        let stored_first = push_on(&tx, ClockFloor::EPOCH, std::slice::from_ref(&original)).await.unwrap();
        assert_eq!(stored_first[0].stored.map(|s| s.base_offset), Some(0));

        let db = t.db.clone();
        let again = replay(p.id, &["x"]);
        let pushed = tokio::spawn(async move { db.push_bundle(ClockFloor::EPOCH, &[again]).await });
        t.wait_for_lock_waiters(1, "the replay never waited for the first push").await;
        if commit {
            tx.commit().await.unwrap();
        } else {
            tx.rollback().await.unwrap();
        }
        let out: Vec<SegmentOutcome> = promptly("the replay", pushed).await.unwrap().unwrap();
        assert_ne!(out[0].probe, ProbeMode::Committed);
        let expected = if commit {
            MessageOutcome::Duplicate(stile::db::Duplicate { index: 0, offset: 0, message_id: original.message_ids[0] })
        } else {
            MessageOutcome::Stored { offset: 0 }
        };
        assert_eq!(out[0].per_message(1), vec![expected], "first push committed: {commit}");
        let c = t.client().await;
        assert_eq!(stored(&c).await[&(p.id, "x".to_owned())].len(), 1);
    }
}

/// A lone replay (one message, every hash one the cache has seen) floored
/// at `p_verified`.
fn lone_replay(partition_id: i64, id: &str, p_verified: i64) -> SegmentPush {
    SegmentPush { replays: true, ..segment(partition_id, &[id], p_verified, 3600) }
}

/// Pushers storing fresh ids beside replayers sending bundles of lone
/// replays with the floors a cache could give: below the original where the
/// id was committed when the floor was chosen, else at most the allocator
/// then (a first push in flight, or an id never pushed, marked a replay as
/// a cache's false positive would be). Every answer is held against the
/// model, what the database stores at the end: each id stored once, a
/// duplicate naming that one original.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lone_replays_beside_first_pushes_answer_as_what_is_stored() {
    const PUSHERS: u64 = 4;
    const REPLAYERS: u64 = 4;
    const BUNDLES: usize = 40;
    const FRESH: usize = 120;
    let t = TestDb::with_pool(2 * (PUSHERS + REPLAYERS) as usize).await;
    let partitions = [t.db.resolve_partition("q", "a").await.unwrap().id, t.db.resolve_partition("q", "b").await.unwrap().id];
    let mut rng = SmallRng::seed_from_u64(0x10e5);
    for &pid in &partitions {
        let mut n = 0;
        while n < 100 {
            let ids: Vec<String> = (n..n + rng.random_range(1..6)).map(|i| format!("pre-{i}")).collect();
            n += ids.len();
            let s = segment(pid, &ids.iter().map(String::as_str).collect::<Vec<_>>(), -1, 3600);
            t.db.push_bundle(ClockFloor::EPOCH, &[s]).await.unwrap();
        }
    }
    let mut tasks = Vec::new();
    for pusher in 0..PUSHERS {
        let db = t.db.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = SmallRng::seed_from_u64(0xf2e5 + pusher);
            let mut answers = Vec::new();
            for _ in 0..BUNDLES {
                let pid = partitions[rng.random_range(0..2)];
                let ids: Vec<String> =
                    (0..rng.random_range(1..4)).map(|_| format!("fresh-{}", rng.random_range(0..FRESH))).collect();
                let mut ids: Vec<&str> = ids.iter().map(String::as_str).collect();
                ids.sort_unstable();
                ids.dedup();
                let s = segment(pid, &ids, -1, 3600);
                let out = db.push_bundle(ClockFloor::EPOCH, std::slice::from_ref(&s)).await.unwrap();
                for (k, outcome) in out[0].per_message(s.len()).into_iter().enumerate() {
                    answers.push((pid, s.transaction_ids[k].to_string(), outcome, out[0].probe, s.message_ids[k]));
                }
            }
            answers
        }));
    }
    for replayer in 0..REPLAYERS {
        let (db, reader) = (t.db.clone(), t.client().await);
        tasks.push(tokio::spawn(async move {
            let mut rng = SmallRng::seed_from_u64(0x2e91 + replayer);
            let mut answers = Vec::new();
            for _ in 0..BUNDLES {
                let mut bundle = Vec::new();
                for _ in 0..rng.random_range(1..7) {
                    let pid = partitions[rng.random_range(0..2)];
                    let id = if rng.random_bool(0.5) {
                        format!("pre-{}", rng.random_range(0..100))
                    } else {
                        format!("fresh-{}", rng.random_range(0..FRESH))
                    };
                    if bundle.iter().any(|s: &SegmentPush| s.partition_id == pid && s.transaction_ids[0] == id.as_str()) {
                        continue;
                    }
                    // The allocator and the id's first offset, in one snapshot.
                    let row = reader
                        .query_one(
                            "SELECT p.last_offset, (SELECT min(m.\"offset\") FROM stile.messages m \
                               WHERE m.queue = p.queue AND m.partition = p.name AND m.transaction_id = $2) \
                               FROM stile.partitions p WHERE p.id = $1",
                            &[&pid, &id],
                        )
                        .await
                        .unwrap();
                    let (last, first): (i64, Option<i64>) = (row.get(0), row.get(1));
                    let ceiling = first.map_or(last, |first| first - 1);
                    let floor = (ceiling - rng.random_range(0..40)).max(-1);
                    bundle.push(lone_replay(pid, &id, floor));
                }
                let out = db.push_bundle(ClockFloor::EPOCH, &bundle).await.unwrap();
                for (s, o) in bundle.iter().zip(&out) {
                    let outcome = o.per_message(1).remove(0);
                    answers.push((s.partition_id, s.transaction_ids[0].to_string(), outcome, o.probe, s.message_ids[0]));
                }
            }
            answers
        }));
    }
    let mut answers = Vec::new();
    for task in tasks {
        answers.extend(task.await.unwrap());
    }
    let stored = stored_once(&t.client().await).await;
    let mut committed = 0;
    for (pid, id, outcome, probe, message_id) in &answers {
        let original = stored.get(&(*pid, id.clone())).map(|copies| copies[0]);
        match outcome {
            MessageOutcome::Stored { offset } => assert_eq!(original, Some((*offset, *message_id)), "{id} of {pid}: stored"),
            MessageOutcome::Duplicate(d) => {
                assert_eq!(original, Some((d.offset, d.message_id)), "{id} of {pid}: duplicate ({probe:?})")
            }
        }
        committed += usize::from(*probe == ProbeMode::Committed);
    }
    assert!(committed > 0, "no replay was judged from what is committed");
}

/// What one pusher was answered for one id, with whether its push committed.
#[derive(Debug, Clone, Copy)]
struct Answer {
    outcome: MessageOutcome,
    probe: ProbeMode,
    message_id: uuid::Uuid,
    committed: bool,
}

/// Pushers over two partitions, each pushing random sets of a small pool of
/// ids, some marked as replays and some not, some as pushes of their own and
/// some inside transactions that commit or roll back after a random number
/// of yields: every answer is held against what the database stores at the
/// end, the model (each id stored once, at one offset, with the message id
/// of the push that stored it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replays_beside_first_pushes_and_rollbacks_answer_as_what_is_stored() {
    const PUSHERS: u64 = 8;
    const OPERATIONS: usize = 60;
    const IDS: usize = 24;
    // A connection of each pusher's own for its transactions, and as many
    // again for its other pushes.
    let t = TestDb::with_pool(2 * PUSHERS as usize).await;
    let partitions = [t.db.resolve_partition("q", "a").await.unwrap().id, t.db.resolve_partition("q", "b").await.unwrap().id];
    let ids: Vec<String> = (0..IDS).map(|i| format!("id-{i}")).collect();
    let mut tasks = Vec::new();
    for pusher in 0..PUSHERS {
        let (db, ids) = (t.db.clone(), ids.clone());
        tasks.push(tokio::spawn(async move {
            let mut rng = SmallRng::seed_from_u64(0x5eed_0000 + pusher);
            let mut own = db.pool().get().await.unwrap();
            let mut answers: Vec<(i64, String, Answer)> = Vec::new();
            for _ in 0..OPERATIONS {
                let mut bundle = Vec::new();
                for &pid in &partitions {
                    let n = rng.random_range(0..4);
                    if n == 0 {
                        continue;
                    }
                    let chosen: Vec<&str> = ids.choose_multiple(&mut rng, n).map(String::as_str).collect();
                    let mut s = segment(pid, &chosen, -1, 3600);
                    s.replays = rng.random_bool(0.6);
                    bundle.push(s);
                }
                if bundle.is_empty() {
                    continue;
                }
                let (outcomes, committed) = if rng.random_bool(0.3) {
                    let tx = own.transaction().await.unwrap();
                    let outcomes = push_on(&tx, ClockFloor::EPOCH, &bundle).await.unwrap();
                    for _ in 0..rng.random_range(0..20) {
                        tokio::task::yield_now().await;
                    }
                    let commit = rng.random_bool(0.5);
                    if commit {
                        tx.commit().await.unwrap();
                    } else {
                        tx.rollback().await.unwrap();
                    }
                    (outcomes, commit)
                } else {
                    (db.push_bundle(ClockFloor::EPOCH, &bundle).await.unwrap(), true)
                };
                for (s, o) in bundle.iter().zip(&outcomes) {
                    for (k, outcome) in o.per_message(s.len()).into_iter().enumerate() {
                        let answer = Answer { outcome, probe: o.probe, message_id: s.message_ids[k], committed };
                        answers.push((s.partition_id, s.transaction_ids[k].to_string(), answer));
                    }
                }
            }
            answers
        }));
    }
    let mut answers = Vec::new();
    for task in tasks {
        answers.extend(task.await.unwrap());
    }
    let stored = stored_once(&t.client().await).await;
    for (pid, id, answer) in &answers {
        let original = stored.get(&(*pid, id.clone())).map(|copies| copies[0]);
        match (answer.outcome, answer.committed) {
            (MessageOutcome::Stored { offset }, true) => {
                assert_eq!(original, Some((offset, answer.message_id)), "{id} of {pid}: stored, {answer:?}");
            }
            (MessageOutcome::Stored { offset }, false) => {
                assert_ne!(original, Some((offset, answer.message_id)), "{id} of {pid}: rolled back, {answer:?}");
            }
            // A duplicate, even inside a transaction that rolled back, names
            // an original committed before it.
            (MessageOutcome::Duplicate(d), _) => {
                assert_eq!(original, Some((d.offset, d.message_id)), "{id} of {pid}: duplicate, {answer:?}");
            }
        }
    }
    let unlocked = answers.iter().filter(|(_, _, a)| a.probe == ProbeMode::Committed).count();
    let locked_duplicates = answers
        .iter()
        .filter(|(_, _, a)| a.probe != ProbeMode::Committed && matches!(a.outcome, MessageOutcome::Duplicate(_)))
        .count();
    assert!(unlocked > 0 && locked_duplicates > 0, "{unlocked} answered unlocked, {locked_duplicates} under the lock");
}

/// A one-message segment as a gateway of the build before `p_replays`
/// sends it: eleven arguments. Answers the probe and the message's offset
/// (its own, or its original's).
async fn push_without_replays(c: &tokio_postgres::Client, s: &SegmentPush) -> (String, i64) {
    assert_eq!(s.len(), 1);
    let message_id: Vec<u8> = s.message_ids[0].as_bytes().to_vec();
    let txns = format!("[{}]", serde_json::json!(&*s.transaction_ids[0]));
    let payloads = format!("[{}]", s.payloads[0].raw().get());
    let row = c
        .query_one(
            "SELECT probe, coalesce(base_offset, dup_off[1]) AS offset \
               FROM stile.push($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
            &[
                &s.partition_id,
                &vec![s.partition_id],
                &vec![s.p_verified],
                &vec![s.planned_window_seconds],
                &vec![1i32],
                &vec![&s.hashes[..]],
                &vec![message_id],
                &vec![txns],
                &vec![payloads],
                &0i64,
                &None::<Vec<Vec<u8>>>,
            ],
        )
        .await
        .unwrap();
    (row.get("probe"), row.get("offset"))
}

/// Gateways of the build before `p_replays`, calling the push function with
/// eleven arguments, beside this build's, which marks its segments as
/// replays, on one database: the same ids from both, each stored once, every
/// answer naming where it is stored, and the earlier build's calls never
/// answered `committed`, a probe mode it does not know.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_previous_builds_calls_and_this_builds_replays_store_each_id_once() {
    const IDS: usize = 120;
    let t = TestDb::with_pool(4).await;
    let partitions =
        [t.db.resolve_partition("orders", "p0").await.unwrap().id, t.db.resolve_partition("orders", "p1").await.unwrap().id];
    let mut tasks = Vec::new();
    for task in 0..6usize {
        let previous = task % 2 == 0;
        let db = t.db.clone();
        let client = t.client().await;
        tasks.push(tokio::spawn(async move {
            let mut answers: Vec<(i64, String, i64)> = Vec::new();
            for round in 0..2 {
                for step in 0..IDS {
                    let n = (step * (task + 1) * 7 + round) % IDS;
                    let txn = format!("id-{n}");
                    let pid = partitions[n % 2];
                    let s = if previous { segment(pid, &[&txn], -1, 3600) } else { replay(pid, &[&txn]) };
                    let offset = if previous {
                        let (probe, offset) = push_without_replays(&client, &s).await;
                        assert_ne!(probe, "committed", "the previous build's call was answered a mode it does not know");
                        offset
                    } else {
                        match db.push_bundle(ClockFloor::EPOCH, std::slice::from_ref(&s)).await.unwrap()[0].per_message(1)[0] {
                            MessageOutcome::Stored { offset } => offset,
                            MessageOutcome::Duplicate(d) => d.offset,
                        }
                    };
                    answers.push((pid, txn, offset));
                }
            }
            answers
        }));
    }
    let mut answered: HashMap<(i64, String), i64> = HashMap::new();
    for task in tasks {
        for (pid, txn, offset) in task.await.unwrap() {
            let before = answered.insert((pid, txn.clone()), offset);
            assert!(before.is_none_or(|o| o == offset), "{txn} answered at {before:?} and {offset}");
        }
    }
    let c = t.client().await;
    let stored: HashMap<(i64, String), i64> = stored(&c)
        .await
        .into_iter()
        .map(|(key, copies)| {
            assert_eq!(copies.len(), 1, "{key:?} stored {} times", copies.len());
            (key, copies[0].0)
        })
        .collect();
    assert_eq!(stored, answered, "every answer names where its id is stored");
}
