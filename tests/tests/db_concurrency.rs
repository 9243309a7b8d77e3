//! The push function under concurrency: the partition row lock serialises
//! probe-then-allocate, and the ascending lock order rules out deadlocks.

use std::collections::HashMap;
use std::sync::Arc;

use rand::seq::SliceRandom;
use stile::db::{ClockFloor, MessageOutcome, SegmentOutcome};
use stile_tests::pg::{PartitionState, TestDb, partition_state, segment};
use tokio::sync::Barrier;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_pushers_of_one_transaction_id_store_it_once() {
    const PUSHERS: usize = 16;
    const ROUNDS: usize = 50;
    // Per round: the shared id once, and every pusher's own id.
    const STORED_PER_ROUND: i64 = PUSHERS as i64 + 1;
    let t = TestDb::with_pool(PUSHERS).await;
    let p = t.db.resolve_partition("race", "p").await.unwrap();
    let barrier = Arc::new(Barrier::new(PUSHERS));
    let mut tasks = Vec::new();
    for pusher in 0..PUSHERS {
        let db = t.db.clone();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            let mut results = Vec::with_capacity(ROUNDS);
            for round in 0..ROUNDS {
                let shared = format!("txn-{round}");
                let own = format!("txn-{round}-{pusher}");
                // The shared id first or second, beside an id of the pusher's
                // own, which every loser still stores.
                let ids: [&str; 2] = if pusher % 2 == 0 { [&shared, &own] } else { [&own, &shared] };
                let at = usize::from(pusher % 2 == 1);
                // Half the pushers cannot vouch; the others vouch for what
                // was stored before the round began (a stale but sound vouch).
                let p_verified = if pusher % 4 < 2 { -1 } else { round as i64 * STORED_PER_ROUND - 1 };
                let s = segment(p.id, &ids, p_verified, 3600);
                let id = s.message_ids[at];
                barrier.wait().await;
                let out = db.push_bundle(ClockFloor::EPOCH, &[s]).await.expect("push");
                results.push((id, at, out.into_iter().next().expect("one outcome")));
                // Everyone finishes the round before the next starts.
                barrier.wait().await;
            }
            results
        }));
    }
    let mut by_round: Vec<Vec<(uuid::Uuid, usize, SegmentOutcome)>> = vec![Vec::new(); ROUNDS];
    for task in tasks {
        for (round, r) in task.await.unwrap().into_iter().enumerate() {
            by_round[round].push(r);
        }
    }
    for (round, results) in by_round.iter().enumerate() {
        let first = round as i64 * STORED_PER_ROUND;
        let mut offsets: Vec<i64> = Vec::new();
        let mut winners = Vec::new();
        for (id, at, o) in results {
            for message in o.per_message(2) {
                if let MessageOutcome::Stored { offset } = message {
                    offsets.push(offset);
                }
            }
            if o.duplicates.is_empty() {
                let MessageOutcome::Stored { offset } = o.per_message(2)[*at] else { unreachable!() };
                winners.push((*id, offset));
            }
        }
        offsets.sort_unstable();
        assert_eq!(offsets, (first..first + STORED_PER_ROUND).collect::<Vec<_>>(), "round {round}: one offset each");
        assert_eq!(winners.len(), 1, "round {round}: {results:?}");
        let (winner_id, winner_offset) = winners[0];
        for (_, at, o) in results {
            for d in &o.duplicates {
                assert_eq!(d.index as usize, *at, "only the shared id is a duplicate");
                assert_eq!((d.offset, d.message_id), (winner_offset, winner_id));
            }
        }
    }
    let c = t.client().await;
    let (n, stored) = (ROUNDS as i64, ROUNDS as i64 * STORED_PER_ROUND);
    assert_eq!(
        partition_state(&c, p.id).await,
        PartitionState { last_offset: stored - 1, txns_start: 0, segments: n * PUSHERS as i64, txns: n * PUSHERS as i64 }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn overlapping_bundles_in_random_order_never_deadlock() {
    const PARTITIONS: usize = 12;
    const WORKERS: usize = 8;
    const BUNDLES: usize = 40;
    let t = TestDb::with_pool(WORKERS).await;
    let mut ids = Vec::new();
    for i in 0..PARTITIONS {
        ids.push(t.db.resolve_partition("mesh", &format!("p{i}")).await.unwrap().id);
    }
    let barrier = Arc::new(Barrier::new(WORKERS));
    let mut tasks = Vec::new();
    for worker in 0..WORKERS {
        let db = t.db.clone();
        let ids = ids.clone();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let mut counts: HashMap<i64, i64> = HashMap::new();
            for bundle in 0..BUNDLES {
                // 3..=8 partitions in random order, some twice.
                let (chosen, sizes): (Vec<i64>, Vec<usize>) = {
                    let mut rng = rand::rng();
                    let mut chosen = ids.clone();
                    chosen.shuffle(&mut rng);
                    chosen.truncate(3 + (bundle % 6));
                    chosen.push(chosen[0]);
                    chosen.shuffle(&mut rng);
                    let sizes = chosen.iter().map(|_| 1 + rand::random_range(0..5usize)).collect();
                    (chosen, sizes)
                };
                let segments: Vec<_> = chosen
                    .iter()
                    .zip(&sizes)
                    .enumerate()
                    .map(|(k, (&pid, &n))| {
                        let txns: Vec<String> = (0..n).map(|m| format!("w{worker}-b{bundle}-s{k}-m{m}")).collect();
                        let refs: Vec<&str> = txns.iter().map(String::as_str).collect();
                        segment(pid, &refs, -1, 3600)
                    })
                    .collect();
                let out = db.push_bundle(ClockFloor::EPOCH, &segments).await.expect("no deadlock, no error");
                for (s, o) in segments.iter().zip(&out) {
                    assert!(o.duplicates.is_empty() && o.stored.is_some(), "{o:?}");
                    *counts.entry(s.partition_id).or_default() += s.len() as i64;
                }
            }
            counts
        }));
    }
    let mut total: HashMap<i64, i64> = HashMap::new();
    for task in tasks {
        for (pid, n) in task.await.unwrap() {
            *total.entry(pid).or_default() += n;
        }
    }
    let c = t.client().await;
    for pid in ids {
        let n = total.get(&pid).copied().unwrap_or(0);
        let last = partition_state(&c, pid).await.last_offset;
        assert_eq!(last, n - 1, "partition {pid}");
        // Segments tile the offsets without gaps or overlaps.
        let gaps: i64 = c
            .query_one(
                "SELECT count(*) AS gaps FROM (SELECT base_offset, \
                        lag(end_offset) OVER (ORDER BY base_offset) AS prev \
                   FROM stile.segments WHERE partition_id = $1) s \
                  WHERE prev IS NOT NULL AND base_offset <> prev + 1",
                &[&pid],
            )
            .await
            .unwrap()
            .get("gaps");
        assert_eq!(gaps, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_first_use_creates_one_queue_and_one_partition() {
    let t = TestDb::with_pool(16).await;
    let barrier = Arc::new(Barrier::new(16));
    let mut tasks = Vec::new();
    for i in 0..16 {
        let db = t.db.clone();
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            if i % 4 == 0 {
                // Configure races creation too.
                db.configure("fresh", &serde_json::Map::new(), Default::default()).await.unwrap();
            }
            db.resolve_partition("fresh", "p").await.unwrap()
        }));
    }
    let mut seen = Vec::new();
    for task in tasks {
        seen.push(task.await.unwrap());
    }
    assert!(seen.iter().all(|m| *m == seen[0]), "{seen:?}");
    let c = t.client().await;
    let n: i64 = c.query_one("SELECT count(*) AS partitions FROM stile.partitions", &[]).await.unwrap().get("partitions");
    assert_eq!(n, 1);
}
