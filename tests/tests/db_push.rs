//! The push function against a real PostgreSQL: verdicts, the probe's span,
//! what a duplicate leaves behind (nothing), and where its neighbours go.

use serde_json::{Map, json};
use std::time::Duration;

use stile::configure::ConfigureMode;
use stile::db::{ClockFloor, Db, DbError, Duplicate, MessageOutcome, OwnPool, ProbeMode, SegmentOutcome, SegmentPush};
use stile::payload::Payload;
use stile::reads::PageBound;
use stile_tests::pg::{PartitionState, TestDb, partition_state, segment};
use tokio_postgres::types::Json;

/// A segment stored whole: its base offset and the probe.
fn committed(outcome: &SegmentOutcome) -> (i64, ProbeMode) {
    match outcome {
        SegmentOutcome { stored: Some(stored), duplicates, probe, .. } if duplicates.is_empty() => (stored.base_offset, *probe),
        other => panic!("expected a commit, got {other:?}"),
    }
}

/// A segment with duplicates: them and the probe.
fn duplicates(outcome: &SegmentOutcome) -> (Vec<Duplicate>, ProbeMode) {
    assert!(!outcome.duplicates.is_empty(), "expected duplicates, got {outcome:?}");
    (outcome.duplicates.clone(), outcome.probe)
}

/// Where a segment's messages that are not duplicates went, if anywhere.
fn stored_at(outcome: &SegmentOutcome) -> Option<i64> {
    outcome.stored.map(|s| s.base_offset)
}

/// Each duplicate as (its index in the segment, its original's offset).
fn placed(duplicates: &[Duplicate]) -> Vec<(u32, i64)> {
    duplicates.iter().map(|d| (d.index, d.offset)).collect()
}

/// Each duplicate as (its index, its original's offset and message id).
fn named(duplicates: &[Duplicate]) -> Vec<(u32, i64, uuid::Uuid)> {
    duplicates.iter().map(|d| (d.index, d.offset, d.message_id)).collect()
}

/// One segment through `stile.push` in plain SQL, with `clock_floor_ms` as
/// given (`None`: NULL): its row's probe, dup_idx and dup_off.
async fn push_in_sql(c: &tokio_postgres::Client, s: &SegmentPush, clock_floor_ms: Option<i64>) -> tokio_postgres::Row {
    let payloads: Vec<Json<&serde_json::value::RawValue>> = s.payloads.iter().map(|payload| Json(payload.raw())).collect();
    let transaction_ids: Vec<&str> = s.transaction_ids.iter().map(|t| &**t).collect();
    let rows = c
        .query(
            "SELECT probe, dup_idx, dup_off FROM stile.push(ARRAY[$1::bigint], ARRAY[$2::bigint], ARRAY[$3::integer], \
                    ARRAY[$4::integer], ARRAY[$5::bytea], $6::uuid[], $7::text[], $8::json[], $9)",
            &[
                &s.partition_id,
                &s.p_verified,
                &s.planned_window_seconds,
                &(s.len() as i32),
                &s.hashes,
                &s.message_ids,
                &transaction_ids,
                &payloads,
                &clock_floor_ms,
            ],
        )
        .await
        .unwrap();
    rows.into_iter().next().expect("one row per segment")
}

/// Pushes `s` (see [`push_in_sql`]) in a transaction rolled back after it,
/// and counts the entries of `stile.log`'s primary key the push read. The
/// counter is the backend's own, not yet reported: the difference inside one
/// transaction is what the push read.
async fn push_counting_index_reads(c: &tokio_postgres::Client, s: &SegmentPush) -> (tokio_postgres::Row, i64) {
    let index_reads = "SELECT pg_stat_get_xact_tuples_returned('stile.log_pkey'::regclass) AS entries_read";
    c.batch_execute("BEGIN").await.unwrap();
    let before: i64 = c.query_one(index_reads, &[]).await.unwrap().get("entries_read");
    let row = push_in_sql(c, s, Some(0)).await;
    let read = c.query_one(index_reads, &[]).await.unwrap().get::<_, i64>("entries_read") - before;
    c.batch_execute("ROLLBACK").await.unwrap();
    (row, read)
}

/// Removes the messages of the log row at `base_offset` and keeps its hashes,
/// as retention does for a retention shorter than the window.
async fn remove_messages(c: &tokio_postgres::Client, partition_id: i64, base_offset: i64) {
    let removed = c
        .execute(
            "UPDATE stile.log SET message_ids = NULL, transaction_ids = NULL, payloads = NULL \
              WHERE partition_id = $1 AND base_offset = $2",
            &[&partition_id, &base_offset],
        )
        .await
        .unwrap();
    assert_eq!(removed, 1);
}

async fn set_window(t: &TestDb, queue: &str, seconds: i64) {
    let mut options = Map::new();
    options.insert("dedupWindowSeconds".into(), json!(seconds));
    t.db.configure(queue, &options, ConfigureMode::Merge).await.expect("configure the window");
}

#[tokio::test]
async fn first_push_allocates_from_zero_and_writes_both_rows() {
    let t = TestDb::new().await;
    let p = t.db.resolve_partition("orders", "p0").await.unwrap();
    assert_eq!((p.window_seconds, p.last_offset, p.txns_start), (3600, -1, 0));

    let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["a", "b", "c"], -1, 3600)]).await.unwrap();
    // An empty partition has nothing to compare against.
    assert_eq!(committed(&out[0]), (0, ProbeMode::Skipped));
    assert_eq!(out[0].window_seconds, 3600);
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["d"], -1, 3600)]).await.unwrap();
    assert_eq!(committed(&out[0]), (3, ProbeMode::Full));

    let c = t.client().await;
    assert_eq!(partition_state(&c, p.id).await, PartitionState { last_offset: 3, txns_start: 0, segments: 2, txns: 2 });
    let row = c
        .query_one(
            "SELECT end_offset, hashes, transaction_ids, payloads FROM stile.txns \
             JOIN stile.segments USING (partition_id, base_offset, end_offset, created_at) \
             WHERE partition_id = $1 AND base_offset = 0",
            &[&p.id],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, i64>("end_offset"), 2);
    let hashes: Vec<u8> = row.get("hashes");
    assert_eq!(&hashes[16..32], &stile::hash::txn_hash("b"));
    assert_eq!(row.get::<_, Vec<String>>("transaction_ids"), vec!["a", "b", "c"]);
    assert_eq!(
        row.get::<_, Vec<serde_json::Value>>("payloads"),
        vec![json!({"txn": "a"}), json!({"txn": "b"}), json!({"txn": "c"})]
    );
}

#[tokio::test]
async fn a_duplicate_writes_nothing_and_names_the_original() {
    let t = TestDb::new().await;
    let p = t.db.resolve_partition("orders", "p0").await.unwrap();
    let first = segment(p.id, &["a", "b", "c"], -1, 3600);
    let b_id = first.message_ids[1];
    t.db.push_bundle(ClockFloor::EPOCH, &[first]).await.unwrap();
    let c = t.client().await;
    let before = partition_state(&c, p.id).await;

    // A segment of duplicates only: no allocator bump, no segment, no txns row.
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["c", "b"], -1, 3600)]).await.unwrap();
    let (dups, probe) = duplicates(&out[0]);
    assert_eq!(probe, ProbeMode::Full);
    assert_eq!(placed(&dups), vec![(0, 2), (1, 1)]);
    assert_eq!(stored_at(&out[0]), None);
    assert_eq!(partition_state(&c, p.id).await, before);

    // With neighbours: the duplicate writes nothing, "d" and "e" are stored
    // in their order at the next offsets, as one segment without "b".
    let s = segment(p.id, &["d", "b", "e"], -1, 3600);
    let (d_id, e_id) = (s.message_ids[0], s.message_ids[2]);
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[s]).await.unwrap();
    let (dups, probe) = duplicates(&out[0]);
    assert_eq!(probe, ProbeMode::Full);
    assert_eq!(dups, vec![Duplicate { index: 1, offset: 1, message_id: b_id }]);
    assert_eq!(stored_at(&out[0]), Some(3));
    let per_message = out[0].per_message(3);
    assert_eq!(per_message[0], MessageOutcome::Stored { offset: 3 });
    assert_eq!(per_message[2], MessageOutcome::Stored { offset: 4 });
    assert_eq!(partition_state(&c, p.id).await, PartitionState { last_offset: 4, txns_start: 0, segments: 2, txns: 2 });
    let row = c
        .query_one(
            "SELECT t.end_offset, t.hashes, s.transaction_ids, s.message_ids FROM stile.txns t \
             JOIN stile.segments s USING (partition_id, base_offset, end_offset, created_at) \
             WHERE partition_id = $1 AND base_offset = 3",
            &[&p.id],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, i64>("end_offset"), 4);
    let hash = stile::hash::txn_hash;
    assert_eq!(row.get::<_, Vec<u8>>("hashes"), [hash("d"), hash("e")].concat());
    assert_eq!(row.get::<_, Vec<String>>("transaction_ids"), vec!["d", "e"]);
    assert_eq!(row.get::<_, Vec<uuid::Uuid>>("message_ids"), vec![d_id, e_id]);

    // The same id in another partition or queue is another message.
    let other = t.db.resolve_partition("orders", "p1").await.unwrap();
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(other.id, &["b"], -1, 3600)]).await.unwrap();
    assert_eq!(committed(&out[0]).0, 0);
    let other_queue = t.db.resolve_partition("invoices", "p0").await.unwrap();
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(other_queue.id, &["b"], -1, 3600)]).await.unwrap();
    assert_eq!(committed(&out[0]).0, 0);
}

/// `synchronous_commit` inside a transaction on a connection of `db`'s pool,
/// after pushing `segments` in it.
async fn commit_setting_after_push(db: &Db, segments: &[SegmentPush]) -> String {
    let mut client = db.pool().get().await.unwrap();
    let tx = client.transaction().await.unwrap();
    stile::db::push_on(&tx, ClockFloor::EPOCH, segments).await.unwrap();
    let setting: String = tx.query_one("SHOW synchronous_commit", &[]).await.unwrap().get(0);
    tx.commit().await.unwrap();
    setting
}

#[tokio::test]
async fn a_call_that_stores_nothing_commits_without_waiting_for_its_flush_only_on_a_shards_connections() {
    let t = TestDb::new().await;
    let shard = t.db.with_own_pool(OwnPool { size: 1, lock_timeout: Duration::from_secs(1) }).unwrap();
    let p = t.db.resolve_partition("orders", "p0").await.unwrap();
    let q = t.db.resolve_partition("orders", "p1").await.unwrap();
    t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["a", "b"], -1, 3600)]).await.unwrap();
    let c = t.client().await;
    let before = partition_state(&c, p.id).await;

    // Every message a duplicate: only row locks were written.
    let replay = || [segment(p.id, &["b", "a"], -1, 3600)];
    assert_eq!(commit_setting_after_push(&shard, &replay()).await, "off");
    // The main pool's sessions, which run KV and timers after a push in one
    // transaction, commit as configured.
    assert_eq!(commit_setting_after_push(&t.db, &replay()).await, "on");
    assert_eq!(partition_state(&c, p.id).await, before);

    // Anything stored, in any segment of the call, commits as configured.
    let mixed = [segment(p.id, &["a"], -1, 3600), segment(q.id, &["new"], -1, 3600)];
    assert_eq!(commit_setting_after_push(&shard, &mixed).await, "on");
    assert_eq!(commit_setting_after_push(&shard, &[segment(p.id, &["b", "c"], -1, 3600)]).await, "on");
    assert_eq!(partition_state(&c, p.id).await.last_offset, 2);
}

#[tokio::test]
async fn duplicates_of_several_segments_name_each_original() {
    let t = TestDb::new().await;
    let p = t.db.resolve_partition("orders", "p0").await.unwrap();
    let stored = [
        segment(p.id, &["a", "b", "c"], -1, 3600),
        segment(p.id, &["d", "e"], -1, 3600),
        segment(p.id, &["f", "g", "h"], -1, 3600),
    ];
    let ids: Vec<uuid::Uuid> = stored.iter().flat_map(|s| s.message_ids.iter().copied()).collect();
    for s in stored {
        t.db.push_bundle(ClockFloor::EPOCH, &[s]).await.unwrap();
    }
    // Originals in three segments, named out of offset order, around a new id.
    for (p_verified, fresh, stored) in [(-1, "new1", 8), (2, "new2", 9)] {
        let out =
            t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["g", "a", fresh, "e", "b", "h"], p_verified, 3600)])
                .await
                .unwrap();
        assert_eq!(stored_at(&out[0]), Some(stored));
        let (dups, _) = duplicates(&out[0]);
        let expected: Vec<Duplicate> = [(0, 6), (1, 0), (3, 4), (4, 1), (5, 7)]
            .into_iter()
            .map(|(index, offset)| Duplicate { index, offset, message_id: ids[offset as usize] })
            .collect();
        // Narrowed above offset 2, the first segment's are no longer seen.
        let expected: Vec<Duplicate> = expected.into_iter().filter(|d| d.offset > p_verified).collect();
        assert_eq!(dups, expected, "p_verified {p_verified}");
    }
}

#[tokio::test]
async fn a_narrowed_retry_is_answered_from_the_first_row_of_its_span_when_it_holds_every_hash() {
    let t = TestDb::new().await;
    let p = t.db.resolve_partition("q", "p").await.unwrap();
    let s0 = segment(p.id, &["a", "b", "c"], -1, 3600);
    let s1 = segment(p.id, &["d", "e", "b2"], -1, 3600);
    let ids: Vec<uuid::Uuid> = s0.message_ids.iter().chain(&s1.message_ids).copied().collect();
    for s in [s0, s1] {
        t.db.push_bundle(ClockFloor::EPOCH, &[s]).await.unwrap();
    }
    // The span (0, 5] starts in s0, which holds both: answered from it.
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["c", "b"], 0, 3600)]).await.unwrap();
    assert_eq!(out[0].probe, ProbeMode::Narrowed);
    assert_eq!(named(&out[0].duplicates), vec![(0, 2, ids[2]), (1, 1, ids[1])]);
    assert_eq!(stored_at(&out[0]), None);
    // s0 holds "c" but not "e": every row of the span is read.
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["e", "c"], 0, 3600)]).await.unwrap();
    assert_eq!(named(&out[0].duplicates), vec![(0, 4, ids[4]), (1, 2, ids[2])]);
    // A floor a few offsets below the original: with up to four hashes the
    // first row holding any of them is tried, here s1.
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["e", "d"], 0, 3600)]).await.unwrap();
    assert_eq!(named(&out[0].duplicates), vec![(0, 4, ids[4]), (1, 3, ids[3])]);
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["b2"], 0, 3600)]).await.unwrap();
    assert_eq!(named(&out[0].duplicates), vec![(0, 5, ids[5])]);
    // More than four hashes, the same.
    let all = ["b2", "e", "d", "c", "b"];
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &all, 0, 3600)]).await.unwrap();
    assert_eq!(named(&out[0].duplicates), vec![(0, 5, ids[5]), (1, 4, ids[4]), (2, 3, ids[3]), (3, 2, ids[2]), (4, 1, ids[1])]);
    let fresh = segment(p.id, &["e", "d", "b2", "x", "y"], 2, 3600);
    let ids_xy = [fresh.message_ids[3], fresh.message_ids[4]];
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[fresh]).await.unwrap();
    assert_eq!(named(&out[0].duplicates), vec![(0, 4, ids[4]), (1, 3, ids[3]), (2, 5, ids[5])]);
    assert_eq!(stored_at(&out[0]), Some(6));
    // Its messages removed by retention, the originals' ids are unknown.
    let c = t.client().await;
    remove_messages(&c, p.id, 3).await;
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["e", "d"], 2, 3600)]).await.unwrap();
    assert_eq!(named(&out[0].duplicates), vec![(0, 4, uuid::Uuid::nil()), (1, 3, uuid::Uuid::nil())]);
    // A first row outside the window does not count: the next one is first.
    set_window(&t, "q", 60).await;
    c.execute(
        "UPDATE stile.txns SET created_at = created_at - interval '2 minutes' WHERE partition_id = $1 AND base_offset = 0",
        &[&p.id],
    )
    .await
    .unwrap();
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["c", "b"], 0, 60)]).await.unwrap();
    assert_eq!((out[0].probe, out[0].duplicates.len(), stored_at(&out[0])), (ProbeMode::Narrowed, 0, Some(8)));
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["e", "d"], 0, 60)]).await.unwrap();
    assert_eq!(named(&out[0].duplicates), vec![(0, 4, uuid::Uuid::nil()), (1, 3, uuid::Uuid::nil())]);
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["x", "y"], 5, 60)]).await.unwrap();
    assert_eq!(named(&out[0].duplicates), vec![(0, 6, ids_xy[0]), (1, 7, ids_xy[1])]);
}

/// A retry of a push stored as sent is one run of its row's hashes, found by
/// one byte search, at the row's start or inside it (pushes coalesced into
/// one segment), short or long; the ids are the row's, in order.
#[tokio::test]
async fn a_retry_that_is_a_run_of_its_row_is_answered_from_that_row() {
    let t = TestDb::new().await;
    let p = t.db.resolve_partition("q", "p").await.unwrap();
    let names: Vec<String> = (0..60).map(|i| format!("m{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let row = segment(p.id, &names, -1, 3600);
    let row_ids = row.message_ids.clone();
    t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["before"], -1, 3600)]).await.unwrap();
    t.db.push_bundle(ClockFloor::EPOCH, &[row]).await.unwrap();
    t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["after"], -1, 3600)]).await.unwrap();
    // The row holds offsets 1 to 60.
    for (from, len) in [(0, 60), (0, 1), (0, 10), (7, 1), (7, 10), (20, 17), (23, 37), (59, 1)] {
        let retry = segment(p.id, &names[from..from + len], 0, 3600);
        let out = t.db.push_bundle(ClockFloor::EPOCH, &[retry]).await.unwrap();
        assert_eq!((out[0].probe, stored_at(&out[0])), (ProbeMode::Narrowed, None), "{from}+{len}");
        let expected: Vec<(u32, i64, uuid::Uuid)> =
            (0..len).map(|j| (j as u32, 1 + (from + j) as i64, row_ids[from + j])).collect();
        assert_eq!(named(&out[0].duplicates), expected, "{from}+{len}");
    }
    // Its messages removed by retention, the ids are unknown, the offsets not.
    let c = t.client().await;
    remove_messages(&c, p.id, 1).await;
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &names[3..30], 0, 3600)]).await.unwrap();
    let expected: Vec<(u32, i64, uuid::Uuid)> = (0..27).map(|j| (j as u32, 4 + j as i64, uuid::Uuid::nil())).collect();
    assert_eq!(named(&out[0].duplicates), expected);
    let state = partition_state(&c, p.id).await;
    assert_eq!((state.last_offset, state.txns), (61, 3), "nothing of the retries was written");
}

/// A segment whose hashes are given as bytes, for hashes that overlap others.
fn segment_of_hashes(partition_id: i64, hashes: &[[u8; 16]], p_verified: i64) -> SegmentPush {
    let mut s = segment(partition_id, &vec!["h"; hashes.len()], p_verified, 3600);
    s.transaction_ids = (0..hashes.len()).map(|i| format!("h{i}").into()).collect();
    s.hashes = hashes.concat();
    s
}

#[tokio::test]
async fn a_hash_that_a_row_holds_only_across_two_hashes_is_not_found_there() {
    let t = TestDb::new().await;
    let p = t.db.resolve_partition("q", "p").await.unwrap();
    let a: [u8; 16] = std::array::from_fn(|i| i as u8);
    let b: [u8; 16] = std::array::from_fn(|i| 100 + i as u8);
    // The last 8 bytes of `a` and the first 8 of `b`: in the row [a, b] at
    // byte 8, which is no hash of it.
    let straddle: [u8; 16] = std::array::from_fn(|i| if i < 8 { a[8 + i] } else { b[i - 8] });
    let original = segment_of_hashes(p.id, &[a, b], -1);
    t.db.push_bundle(ClockFloor::EPOCH, &[original]).await.unwrap();
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment_of_hashes(p.id, &[straddle], 0)]).await.unwrap();
    assert_eq!((out[0].probe, out[0].duplicates.len(), stored_at(&out[0])), (ProbeMode::Narrowed, 0, Some(2)));
    // A row holding it across two hashes first and as a hash of its own
    // after: the duplicate is found at its own place.
    let p2 = t.db.resolve_partition("q", "p2").await.unwrap();
    let row = segment_of_hashes(p2.id, &[a, b, straddle], -1);
    let straddle_id = row.message_ids[2];
    t.db.push_bundle(ClockFloor::EPOCH, &[row]).await.unwrap();
    for (retry, expected) in [(vec![straddle], vec![(0, 2)]), (vec![a, straddle], vec![(0, 0), (1, 2)])] {
        let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment_of_hashes(p2.id, &retry, 0)]).await.unwrap();
        assert_eq!(out[0].probe, ProbeMode::Narrowed);
        assert_eq!(placed(&out[0].duplicates), expected);
        assert_eq!(out[0].duplicates.last().map(|d| d.message_id), Some(straddle_id));
        assert_eq!(stored_at(&out[0]), None);
    }
}

/// Replays of requests stored side by side in rows of one message each,
/// floored together (as the cache floors what arrived in one step): the
/// row just above the floor does not hold them all, and rather than read
/// every row of the span (here 4,000), the probe looks for each in the 128
/// offsets above the floor, reading those rows once for all of them.
#[tokio::test]
async fn replays_stored_in_rows_side_by_side_are_found_above_their_shared_floor() {
    let t = TestDb::new().await;
    let p = t.db.resolve_partition("q", "p").await.unwrap();
    let names: Vec<String> = (0..8).map(|i| format!("r{i}")).collect();
    let mut originals = Vec::new();
    for name in &names {
        let s = segment(p.id, &[name], -1, 3600);
        originals.push(s.message_ids[0]);
        t.db.push_bundle(ClockFloor::EPOCH, &[s]).await.unwrap();
    }
    let c = t.client().await;
    c.batch_execute(&format!(
        "INSERT INTO stile.txns SELECT {id}, g, g, now(), decode(md5(g::text), 'hex') FROM generate_series(8, 4007) AS g; \
         UPDATE stile.partitions SET last_offset = 4007 WHERE id = {id}; ANALYZE stile.log;",
        id = p.id
    ))
    .await
    .unwrap();
    let replayed = ["r2", "r5", "r3"];
    let retry = segment(p.id, &replayed, 0, 3600);
    let (row, read) = push_counting_index_reads(&c, &retry).await;
    let (probe, idx, off): (String, Vec<i32>, Vec<i64>) = (row.get("probe"), row.get("dup_idx"), row.get("dup_off"));
    assert_eq!(probe, "narrowed");
    assert_eq!((idx, off), (vec![0, 1, 2], vec![2, 5, 3]));
    assert!(read < 200, "{read} index entries read for three replays floored together");
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[retry]).await.unwrap();
    let ids: Vec<uuid::Uuid> = out[0].duplicates.iter().map(|d| d.message_id).collect();
    assert_eq!(ids, vec![originals[2], originals[5], originals[3]]);
}

/// A retry floored just below its original reads one entry of end_offset's
/// index however many rows follow it: the probe's plan walks the index in
/// order and stops at the first row (a plan that gathered the span and sorted
/// it read every row after the floor).
#[tokio::test]
async fn a_narrowed_retry_reads_one_index_entry_however_long_its_span() {
    let t = TestDb::new().await;
    let p = t.db.resolve_partition("q", "p").await.unwrap();
    // Offsets: z0 0, a0 1, b0 c1 2-3, x0-x9 4-13, y0-y19 14-33.
    let offset_of = |name: &str| -> i64 {
        let (series, i) = name.split_at(1);
        let i: i64 = i.parse().unwrap();
        i + match series {
            "z" => 0,
            "a" => 1,
            "b" | "c" => 2,
            "x" => 4,
            _ => 14,
        }
    };
    for batch in [vec!["z"], vec!["a"], vec!["b", "c"], vec!["x"; 10], vec!["y"; 20]] {
        let names: Vec<String> = batch.iter().enumerate().map(|(i, n)| format!("{n}{i}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &names, -1, 3600)]).await.unwrap();
    }
    let c = t.client().await;
    // 20,000 rows after them, one hash each, then fresh statistics.
    c.batch_execute(&format!(
        "INSERT INTO stile.txns SELECT {id}, g, g, now(), decode(md5(g::text), 'hex') FROM generate_series(34, 20033) AS g; \
         UPDATE stile.partitions SET last_offset = 20033 WHERE id = {id}; ANALYZE stile.log;",
        id = p.id
    ))
    .await
    .unwrap();
    let ys: Vec<String> = (0..20).rev().map(|i| format!("y{i}")).collect();
    let ys: Vec<&str> = ys.iter().map(String::as_str).collect();
    // Byte searches up to 16 hashes, a join above.
    let xs = vec!["x3", "x0", "x9", "x1", "x2"];
    // (names, floor, index entries read): the row holding the floor's next
    // offset is read first, alone; floored a row below the original, the
    // span is then read from there, and past four hashes read again for the
    // others.
    for (names, floor, entries) in
        [(vec!["a0"], 0, 1), (vec!["c1", "b0"], 1, 1), (xs.clone(), 3, 1), (xs, 1, 4), (vec!["x0"], 1, 3), (ys, 13, 1)]
    {
        let retry = segment(p.id, &names, floor, 3600);
        let (row, read) = push_counting_index_reads(&c, &retry).await;
        let (probe, idx, off): (String, Vec<i32>, Vec<i64>) = (row.get("probe"), row.get("dup_idx"), row.get("dup_off"));
        let expected: Vec<i64> = names.iter().map(|n| offset_of(n)).collect();
        assert_eq!(probe, "narrowed", "{names:?}");
        assert_eq!(idx, (0..names.len() as i32).collect::<Vec<_>>(), "{names:?}");
        assert_eq!(off, expected, "{names:?}");
        assert_eq!(read, entries, "index entries read for the retry of {names:?} floored at {floor}");
    }
}

#[tokio::test]
async fn min_picks_the_first_occurrence() {
    let t = TestDb::new().await;
    let p = t.db.resolve_partition("q", "p").await.unwrap();
    set_window(&t, "q", 0).await;
    let s0 = segment(p.id, &["x", "a"], -1, 0);
    let a_id = s0.message_ids[1];
    for s in [s0, segment(p.id, &["a"], -1, 0), segment(p.id, &["y", "a"], -1, 0)] {
        let out = t.db.push_bundle(ClockFloor::EPOCH, &[s]).await.unwrap();
        assert_eq!(committed(&out[0]).1, ProbeMode::Off);
    }
    // "a" is stored at offsets 1, 2 and 4; with the window back on, the
    // answer carries the first.
    set_window(&t, "q", 3600).await;
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["a", "z"], -1, 3600)]).await.unwrap();
    let (dups, probe) = duplicates(&out[0]);
    assert_eq!(probe, ProbeMode::Full);
    assert_eq!(dups, vec![Duplicate { index: 0, offset: 1, message_id: a_id }]);
    // A narrowed probe above offset 1 finds the next one still inside.
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["w", "a"], 1, 3600)]).await.unwrap();
    let (dups, probe) = duplicates(&out[0]);
    assert_eq!(probe, ProbeMode::Narrowed);
    assert_eq!(placed(&dups), vec![(1, 2)]);
}

/// Replays of old messages the cache cannot floor are probed over the whole
/// span: with up to four hashes, the span's first row holding any of them is
/// tried first, and answers when it holds them all; otherwise every row of
/// the span is read. Either way each hash is answered with its original.
#[tokio::test]
async fn a_full_probe_of_up_to_four_hashes_answers_from_the_first_row_holding_any_or_from_the_span() {
    let t = TestDb::new().await;
    let p = t.db.resolve_partition("q", "p").await.unwrap();
    let big: Vec<String> = (0..50).map(|i| format!("m{i}")).collect();
    let big: Vec<&str> = big.iter().map(String::as_str).collect();
    let rows = [segment(p.id, &["a", "b"], -1, 3600), segment(p.id, &big, -1, 3600), segment(p.id, &["c"], -1, 3600)];
    let mut ids: Vec<uuid::Uuid> = Vec::new();
    for s in rows {
        ids.extend(&s.message_ids);
        t.db.push_bundle(ClockFloor::EPOCH, &[s]).await.unwrap();
    }
    let full = |txns: &[&str]| segment(p.id, txns, -1, 3600);
    // Scattered in one row, not a run: answered from that row.
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[full(&["m40", "m3", "m17"])]).await.unwrap();
    assert_eq!(out[0].probe, ProbeMode::Full);
    assert_eq!(named(&out[0].duplicates), vec![(0, 42, ids[42]), (1, 5, ids[5]), (2, 19, ids[19])]);
    assert_eq!(stored_at(&out[0]), None);
    // In three rows: the first row holding any is not enough, the span is read.
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[full(&["c", "m9", "b", "m0"])]).await.unwrap();
    assert_eq!(named(&out[0].duplicates), vec![(0, 52, ids[52]), (1, 11, ids[11]), (2, 1, ids[1]), (3, 2, ids[2])]);
    // Stored ids among new ones: the new ones are stored, in order.
    let mixed = full(&["n1", "m49", "n2"]);
    let new_ids = [mixed.message_ids[0], mixed.message_ids[2]];
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[mixed]).await.unwrap();
    assert_eq!(named(&out[0].duplicates), vec![(1, 51, ids[51])]);
    assert_eq!(stored_at(&out[0]), Some(53));
    // None stored: nothing found, both stored.
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[full(&["n3", "n4"])]).await.unwrap();
    assert_eq!((out[0].duplicates.len(), stored_at(&out[0])), (0, Some(55)));
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[full(&["n2", "n1"])]).await.unwrap();
    assert_eq!(named(&out[0].duplicates), vec![(0, 54, new_ids[1]), (1, 53, new_ids[0])]);
}

#[tokio::test]
async fn past_four_hashes_a_row_below_the_tried_one_holding_another_hash_sends_the_probe_over_the_span() {
    let t = TestDb::new().await;
    let p = t.db.resolve_partition("q", "p").await.unwrap();
    let ks = ["k0", "k1", "k2", "k3", "k4", "k5"];
    // z at 0, k5 at 1, then all six at 2-7: k5 is stored twice.
    let b = segment(p.id, &ks, -1, 0);
    let k5_first = segment(p.id, &["k5"], -1, 0);
    let (k5_id, b_ids) = (k5_first.message_ids[0], b.message_ids.clone());
    store_with_repeats(&t, [segment(p.id, &["z"], -1, 0), k5_first, b]).await;
    // The first row holding one of k0-k3 is at 2-7 and holds all six, but
    // the row at 1 holds k5: its first occurrence is there.
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &ks, 0, 3600)]).await.unwrap();
    assert_eq!(out[0].probe, ProbeMode::Narrowed);
    let got = named(&out[0].duplicates);
    let mut expected: Vec<(u32, i64, uuid::Uuid)> = (0..5).map(|i| (i, 2 + i64::from(i), b_ids[i as usize])).collect();
    expected.push((5, 1, k5_id));
    assert_eq!(got, expected);
    // Floored above the row at 1, the row at 2-7 answers alone.
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &ks, 1, 3600)]).await.unwrap();
    let got = placed(&out[0].duplicates);
    assert_eq!(got, (0..6).map(|i| (i, 2 + i64::from(i))).collect::<Vec<_>>());
}

#[tokio::test]
async fn past_sixty_four_hashes_the_rows_below_are_joined_with_the_segment_above_the_floor() {
    let t = TestDb::new().await;
    let p = t.db.resolve_partition("q", "p").await.unwrap();
    let names: Vec<String> = (0..100).map(|i| format!("k{i}")).collect();
    let ks: Vec<&str> = names.iter().map(String::as_str).collect();
    // z at 0, then w1 k99 w2 at 1-3, then all hundred at 4-103: k99 is
    // stored twice, at 2, inside a row that straddles the floors below.
    let b = segment(p.id, &ks, -1, 0);
    let below = segment(p.id, &["w1", "k99", "w2"], -1, 0);
    let (k99_id, b_ids) = (below.message_ids[1], b.message_ids.clone());
    store_with_repeats(&t, [segment(p.id, &["z"], -1, 0), below, b]).await;
    let first_occurrences: Vec<(u32, i64, uuid::Uuid)> =
        (0..99).map(|i| (i, 4 + i64::from(i), b_ids[i as usize])).chain([(99, 2, k99_id)]).collect();
    // Floored at 0 and at 1, the row at 1-3 holds k99 above the floor: its
    // first occurrence is there.
    for p_verified in [0, 1] {
        let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &ks, p_verified, 3600)]).await.unwrap();
        assert_eq!(out[0].probe, ProbeMode::Narrowed);
        assert_eq!(named(&out[0].duplicates), first_occurrences, "floored at {p_verified}");
    }
    // Floored at 2, the copy at 2 is vouched for as older than the floor,
    // and the row at 4-103 answers alone.
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &ks, 2, 3600)]).await.unwrap();
    assert_eq!(placed(&out[0].duplicates), (0..100).map(|i| (i, 4 + i64::from(i))).collect::<Vec<_>>());
}

#[tokio::test]
async fn a_row_below_the_tried_one_is_searched_above_the_floor_only() {
    let t = TestDb::new().await;
    let p = t.db.resolve_partition("q", "p").await.unwrap();
    let ks = ["k0", "k1", "k2", "k3", "k4", "k5"];
    // z at 0, then w1 w2 k5 at 1-3, then all six at 4-9: k5 is stored twice,
    // at 3 in a row that straddles the floors below.
    let b = segment(p.id, &ks, -1, 0);
    let below = segment(p.id, &["w1", "w2", "k5"], -1, 0);
    let (k5_id, b_ids) = (below.message_ids[2], b.message_ids.clone());
    store_with_repeats(&t, [segment(p.id, &["z"], -1, 0), below, b]).await;
    let first_occurrences: Vec<(u32, i64, uuid::Uuid)> =
        (0..5).map(|i| (i, 4 + i64::from(i), b_ids[i as usize])).chain([(5, 3, k5_id)]).collect();
    // Floored at 0 and at 2, the row at 1-3 holds k5 above the floor: its
    // first occurrence is there.
    for p_verified in [0, 2] {
        let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &ks, p_verified, 3600)]).await.unwrap();
        assert_eq!(out[0].probe, ProbeMode::Narrowed);
        let got = named(&out[0].duplicates);
        assert_eq!(got, first_occurrences, "floored at {p_verified}");
    }
    // Floored at 3, the row at 4-9 answers alone.
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &ks, 3, 3600)]).await.unwrap();
    let got = placed(&out[0].duplicates);
    assert_eq!(got, (0..6).map(|i| (i, 4 + i64::from(i))).collect::<Vec<_>>());
}

#[tokio::test]
async fn a_hash_older_than_the_window_is_new_again() {
    let t = TestDb::new().await;
    let p = t.db.resolve_partition("q", "p").await.unwrap();
    set_window(&t, "q", 60).await;
    t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["a", "b"], -1, 60)]).await.unwrap();
    let c = t.client().await;
    // Age the first segment by two minutes instead of waiting.
    c.execute("UPDATE stile.txns SET created_at = created_at - interval '2 minutes' WHERE partition_id = $1", &[&p.id])
        .await
        .unwrap();
    t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["c"], -1, 60)]).await.unwrap();
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["a", "c"], -1, 60)]).await.unwrap();
    // "c" (offset 2) is inside the window, "a" (offset 0) is not: stored.
    let (dups, _) = duplicates(&out[0]);
    assert_eq!(placed(&dups), vec![(1, 2)]);
    assert_eq!(stored_at(&out[0]), Some(3));
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["b"], -1, 60)]).await.unwrap();
    assert_eq!(committed(&out[0]), (4, ProbeMode::Full));
}

#[tokio::test]
async fn p_verified_skips_or_narrows_the_probe() {
    let t = TestDb::new().await;
    let p = t.db.resolve_partition("q", "p").await.unwrap();
    t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["a", "b"], -1, 3600)]).await.unwrap();

    // Vouched up to last_offset: no probe at all.
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["c"], 1, 3600)]).await.unwrap();
    assert_eq!(committed(&out[0]), (2, ProbeMode::Skipped));
    // The vouch is trusted: a hash at or below it is not looked for (a cache
    // vouches only for what it knows is absent, so this never happens).
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["a"], 2, 3600)]).await.unwrap();
    assert_eq!(committed(&out[0]), (3, ProbeMode::Skipped));
    // Vouched below last_offset: the span above is still probed.
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["d", "c"], 1, 3600)]).await.unwrap();
    let (dups, probe) = duplicates(&out[0]);
    assert_eq!(probe, ProbeMode::Narrowed);
    assert_eq!(placed(&dups), vec![(1, 2)]);
    assert_eq!(stored_at(&out[0]), Some(4));
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["e"], 1, 3600)]).await.unwrap();
    assert_eq!(committed(&out[0]), (5, ProbeMode::Narrowed));
    // A vouch beyond the allocator is clamped to it.
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["f"], 1_000, 3600)]).await.unwrap();
    assert_eq!(committed(&out[0]), (6, ProbeMode::Skipped));
}

#[tokio::test]
async fn txns_start_bounds_the_probe() {
    let t = TestDb::new().await;
    let p = t.db.resolve_partition("q", "p").await.unwrap();
    t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["a"], -1, 3600)]).await.unwrap();
    t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["b"], -1, 3600)]).await.unwrap();
    let c = t.client().await;
    // Offsets below txns_start count as purged even while their row lingers.
    c.execute("UPDATE stile.partitions SET txns_start = 1 WHERE id = $1", &[&p.id]).await.unwrap();
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["a"], -1, 3600)]).await.unwrap();
    assert_eq!(committed(&out[0]), (2, ProbeMode::Full));
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["b"], -1, 3600)]).await.unwrap();
    assert_eq!(duplicates(&out[0]).0[0].offset, 1);
    // Everything below txns_start: nothing to probe.
    c.execute("UPDATE stile.partitions SET txns_start = 3 WHERE id = $1", &[&p.id]).await.unwrap();
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["b"], -1, 3600)]).await.unwrap();
    assert_eq!(committed(&out[0]), (3, ProbeMode::Skipped));
}

#[tokio::test]
async fn window_zero_skips_the_probe_but_writes_txns() {
    let t = TestDb::new().await;
    let p = t.db.resolve_partition("q", "p").await.unwrap();
    set_window(&t, "q", 0).await;
    for expected in 0..3 {
        let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["same"], -1, 0)]).await.unwrap();
        assert_eq!(committed(&out[0]), (expected, ProbeMode::Off));
        assert_eq!(out[0].window_seconds, 0);
    }
    let c = t.client().await;
    assert_eq!(partition_state(&c, p.id).await, PartitionState { last_offset: 2, txns_start: 0, segments: 3, txns: 3 });
}

#[tokio::test]
async fn a_window_larger_than_planned_forces_the_full_probe() {
    let t = TestDb::new().await;
    let p = t.db.resolve_partition("q", "p").await.unwrap();
    t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["a", "b"], -1, 3600)]).await.unwrap();
    // The cache planned under 60 s and vouches up to last_offset: the window
    // is 3600 s now, so the vouch is void.
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["b"], 1, 60)]).await.unwrap();
    let (dups, probe) = duplicates(&out[0]);
    assert_eq!(probe, ProbeMode::Full);
    assert_eq!(dups[0].offset, 1);
    // Planned under the same or a larger window, the vouch holds.
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["c"], 1, 3600)]).await.unwrap();
    assert_eq!(committed(&out[0]), (2, ProbeMode::Skipped));
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["d"], 2, 7200)]).await.unwrap();
    assert_eq!(committed(&out[0]), (3, ProbeMode::Skipped));
}

#[tokio::test]
async fn a_later_segment_of_the_same_partition_is_probed_against_the_earlier() {
    let t = TestDb::new().await;
    let p = t.db.resolve_partition("q", "p").await.unwrap();
    t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["a"], -1, 3600)]).await.unwrap();
    // Both segments vouched at last_offset = 0, as a cache planning them in
    // one flush would.
    let s1 = segment(p.id, &["x", "y"], 0, 3600);
    let y_id = s1.message_ids[1];
    let out =
        t.db.push_bundle(ClockFloor::EPOCH, &[s1, segment(p.id, &["y"], 0, 3600), segment(p.id, &["z"], 0, 3600)]).await.unwrap();
    assert_eq!(committed(&out[0]), (1, ProbeMode::Skipped));
    let (dups, probe) = duplicates(&out[1]);
    assert_eq!(probe, ProbeMode::Narrowed);
    assert_eq!(dups, vec![Duplicate { index: 0, offset: 2, message_id: y_id }]);
    assert_eq!(committed(&out[2]), (3, ProbeMode::Narrowed));
}

#[tokio::test]
async fn a_bundle_with_a_duplicate_commits_the_other_partitions() {
    let t = TestDb::new().await;
    let p1 = t.db.resolve_partition("q", "p1").await.unwrap();
    let p2 = t.db.resolve_partition("q", "p2").await.unwrap();
    let p3 = t.db.resolve_partition("other", "p3").await.unwrap();
    let seed = segment(p2.id, &["x"], -1, 3600);
    let x_id = seed.message_ids[0];
    t.db.push_bundle(ClockFloor::EPOCH, &[seed]).await.unwrap();

    let out =
        t.db.push_bundle(
            ClockFloor::EPOCH,
            &[segment(p3.id, &["a", "b"], -1, 3600), segment(p2.id, &["y", "x"], -1, 3600), segment(p1.id, &["x"], -1, 3600)],
        )
        .await
        .unwrap();
    assert_eq!(committed(&out[0]).0, 0);
    assert_eq!(duplicates(&out[1]).0, vec![Duplicate { index: 1, offset: 0, message_id: x_id }]);
    assert_eq!(stored_at(&out[1]), Some(1));
    assert_eq!(committed(&out[2]).0, 0);
    let c = t.client().await;
    assert_eq!(partition_state(&c, p1.id).await, PartitionState { last_offset: 0, txns_start: 0, segments: 1, txns: 1 });
    assert_eq!(partition_state(&c, p2.id).await, PartitionState { last_offset: 1, txns_start: 0, segments: 2, txns: 2 });
    assert_eq!(partition_state(&c, p3.id).await, PartitionState { last_offset: 1, txns_start: 0, segments: 1, txns: 1 });
}

#[tokio::test]
async fn malformed_bundles_are_refused_whole() {
    let t = TestDb::new().await;
    let p = t.db.resolve_partition("q", "p").await.unwrap();
    assert!(t.db.push_bundle(ClockFloor::EPOCH, &[]).await.unwrap().is_empty());
    let c = t.client().await;
    let rows = c.query("SELECT * FROM stile.push('{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', 0)", &[]).await.unwrap();
    assert!(rows.is_empty());

    let mut bad = segment(p.id, &["a", "b"], -1, 3600);
    bad.hashes.truncate(20);
    let e = t.db.push_bundle(ClockFloor::EPOCH, &[bad]).await.unwrap_err();
    assert!(!e.is_unavailable() && e.kind() == "invalid", "{e}");

    let e =
        t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["a"], -1, 3600), segment(p.id + 1000, &["b"], -1, 3600)])
            .await
            .unwrap_err();
    assert!(!e.is_unavailable(), "{e}");
    assert!(e.to_string().contains("unknown partition"), "{e}");
    assert_eq!(partition_state(&c, p.id).await, PartitionState { last_offset: -1, txns_start: 0, segments: 0, txns: 0 });

    // Names the schema refuses: empty, too long, with control characters.
    let long = "x".repeat(256);
    for (queue, partition) in [("q", ""), ("", "p"), ("q", long.as_str()), ("q", "a\u{1f}b")] {
        let e = t.db.resolve_partition(queue, partition).await.unwrap_err();
        assert_eq!(e.kind(), "invalid", "{queue:?}/{partition:?}: {e}");
    }
    let n: i64 = c.query_one("SELECT count(*) AS partitions FROM stile.partitions", &[]).await.unwrap().get("partitions");
    assert_eq!(n, 1);
}

/// At most `messages` messages, and no bound on their bytes that a test's
/// messages reach.
fn bound(messages: i64) -> PageBound {
    PageBound { messages, bytes: 1 << 20 }
}

#[tokio::test]
async fn a_read_ends_its_page_at_its_bound_of_bytes_and_refuses_a_message_above_it() {
    let t = TestDb::new().await;
    let p = t.db.resolve_partition("q", "p").await.unwrap();
    t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["a", "b", "c", "d"], -1, 3600)]).await.unwrap();
    let all = t.db.read_messages("q", "p", 0, bound(10)).await.unwrap();
    assert_eq!((all.messages.len(), all.truncated), (4, false));
    let one = all.messages[0].answer_bytes();
    let two_and_a_half = PageBound { messages: 10, bytes: one * 5 / 2 };
    let page = t.db.read_messages("q", "p", 0, two_and_a_half).await.unwrap();
    assert_eq!((page.messages.len(), page.truncated), (2, true));
    let next = t.db.read_messages("q", "p", 2, two_and_a_half).await.unwrap();
    assert_eq!(next.messages.iter().map(|m| m.offset).collect::<Vec<_>>(), [2, 3]);
    let below_one = PageBound { messages: 10, bytes: one - 1 };
    let refused = t.db.read_messages("q", "p", 0, below_one).await.unwrap_err();
    assert!(matches!(&refused, DbError::TooLarge(message) if message.contains("offset 0")), "{refused}");
}

/// PostgreSQL stops at the bound of bytes as the gateway does: it returns
/// the page, then the message that would cross the bound without its
/// payload, sized as the gateway sizes it, and nothing after it.
#[tokio::test]
async fn the_read_function_stops_at_the_message_that_would_cross_its_bound() {
    let t = TestDb::new().await;
    let p = t.db.resolve_partition("q", "p").await.unwrap();
    // Two log rows, so that the page ends inside the second.
    t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["a", "b"], -1, 3600)]).await.unwrap();
    t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["c", "d", "e"], -1, 3600)]).await.unwrap();
    let all = t.db.read_messages("q", "p", 0, bound(10)).await.unwrap();
    let sizes: Vec<i64> = all.messages.iter().map(|m| m.answer_bytes() as i64).collect();
    let c = t.client().await;
    let read = |from: i64, max_bytes: Option<i64>| {
        let c = &c;
        async move {
            c.query(
                "SELECT \"offset\", payload::text AS payload, answer_bytes FROM stile.read_messages('q', 'p', $1, 10, $2)",
                &[&from, &max_bytes],
            )
            .await
            .unwrap()
            .iter()
            .map(|row| {
                (
                    row.get::<_, i64>("offset"),
                    row.get::<_, Option<String>>("payload").is_some(),
                    row.get::<_, i64>("answer_bytes"),
                )
            })
            .collect::<Vec<_>>()
        }
    };
    let unbounded = read(1, None).await;
    assert_eq!(unbounded, (1..5).map(|o| (o, true, sizes[o as usize])).collect::<Vec<_>>());
    // Offsets 1 and 2 fit; 3 would cross, and comes without its payload.
    let page = read(1, Some(sizes[1] + sizes[2] + sizes[3] - 1)).await;
    assert_eq!(page, [(1, true, sizes[1]), (2, true, sizes[2]), (3, false, sizes[3])]);
    let exact = read(1, Some(sizes[1] + sizes[2] + sizes[3])).await;
    assert_eq!(exact.iter().map(|&(o, whole, _)| (o, whole)).collect::<Vec<_>>(), [(1, true), (2, true), (3, true), (4, false)]);
    let first = read(1, Some(sizes[1] - 1)).await;
    assert_eq!(first, [(1, false, sizes[1])]);
    let refused = t.db.read_messages("q", "p", 1, PageBound { messages: 10, bytes: sizes[1] as usize - 1 }).await.unwrap_err();
    let expected = format!("the message at offset 1 is {} bytes", sizes[1]);
    assert!(matches!(&refused, DbError::TooLarge(message) if message.starts_with(&expected)), "{refused}");
}

#[tokio::test]
async fn reads_return_what_was_pushed() {
    let t = TestDb::new().await;
    let p = t.db.resolve_partition("q", "p").await.unwrap();
    let s0 = segment(p.id, &["a", "b", "c"], -1, 3600);
    let s1 = segment(p.id, &["d", "e"], -1, 3600);
    let ids: Vec<_> = s0.message_ids.iter().chain(&s1.message_ids).copied().collect();
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[s0, s1]).await.unwrap();
    let created_ms = out[0].stored.expect("stored").created_ms;

    let all = t.db.read_messages("q", "p", 0, bound(100)).await.unwrap().messages;
    assert_eq!(all.len(), 5);
    assert!(t.db.read_messages("q", "x", 0, bound(100)).await.unwrap().messages.is_empty(), "no partition x");
    assert!(t.db.read_messages("other", "p", 0, bound(100)).await.unwrap().messages.is_empty(), "no queue other");
    for (i, m) in all.iter().enumerate() {
        assert_eq!(m.offset, i as i64);
        assert_eq!(m.message_id, ids[i]);
        assert_eq!(m.payload, Payload::from(&json!({ "txn": m.transaction_id })));
    }
    assert_eq!(all[0].created_ms, created_ms);
    assert_eq!(all[4].transaction_id, "e");
    let page = t.db.read_messages("q", "p", 2, bound(2)).await.unwrap().messages;
    assert_eq!(page.iter().map(|m| (m.offset, m.transaction_id.as_str())).collect::<Vec<_>>(), vec![(2, "c"), (3, "d")]);
    assert!(t.db.read_messages("q", "p", 5, bound(10)).await.unwrap().messages.is_empty());
    assert!(t.db.read_messages("q", "nope", 0, bound(10)).await.unwrap().messages.is_empty());

    // The same log through the plain-SQL view, beside another partition's.
    let other = t.db.resolve_partition("q", "other").await.unwrap();
    t.db.push_bundle(ClockFloor::EPOCH, &[segment(other.id, &["z"], -1, 3600)]).await.unwrap();
    let c = t.client().await;
    let rows = c
        .query(
            "SELECT \"offset\", message_id, transaction_id, payload::text AS payload, \
                    ceil(extract(epoch FROM created_at) * 1000)::bigint AS created_ms \
               FROM stile.messages WHERE queue = 'q' AND partition = 'p' ORDER BY \"offset\"",
            &[],
        )
        .await
        .unwrap();
    let viewed: Vec<(i64, uuid::Uuid, String, String, i64)> = rows
        .iter()
        .map(|r| (r.get("offset"), r.get("message_id"), r.get("transaction_id"), r.get("payload"), r.get("created_ms")))
        .collect();
    let read: Vec<(i64, uuid::Uuid, String, String, i64)> = all
        .iter()
        .map(|m| (m.offset, m.message_id, m.transaction_id.clone(), m.payload.raw().get().to_owned(), m.created_ms))
        .collect();
    assert_eq!(viewed, read);
    let total: i64 = c.query_one("SELECT count(*) AS messages FROM stile.messages", &[]).await.unwrap().get("messages");
    assert_eq!(total, 6);

    let hash = stile::hash::txn_hash;
    let m = t.db.message_by_transaction_id("q", "p", hash("d"), "d").await.unwrap().unwrap();
    assert_eq!((m.offset, m.message_id), (3, ids[3]));
    assert!(t.db.message_by_transaction_id("q", "p", hash("zz"), "zz").await.unwrap().is_none());
    assert!(t.db.message_by_transaction_id("q", "x", hash("d"), "d").await.unwrap().is_none());

    // A hash collision: "coll" stored under b's hash. The stored
    // transactionId rules it out, and the search goes on to the real "b".
    let mut forged = segment(p.id, &["coll"], -1, 0);
    forged.hashes = hash("b").to_vec();
    set_window_zero_then_push(&t, forged).await;
    let m = t.db.message_by_transaction_id("q", "p", hash("b"), "b").await.unwrap().unwrap();
    assert_eq!((m.offset, m.transaction_id.as_str()), (1, "b"));
    let m = t.db.message_by_transaction_id("q", "p", hash("b"), "coll").await.unwrap().unwrap();
    assert_eq!(m.offset, 5);
    // Newest first when an id is stored twice (window 0).
    t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["a"], -1, 0)]).await.unwrap();
    let m = t.db.message_by_transaction_id("q", "p", hash("a"), "a").await.unwrap().unwrap();
    assert_eq!(m.offset, 6);
}

/// Stores the segments in order with the queue's window at 0, so that
/// repeats are stored again, then sets the window back to an hour.
async fn store_with_repeats<const N: usize>(t: &TestDb, segments: [SegmentPush; N]) {
    set_window(t, "q", 0).await;
    for s in segments {
        t.db.push_bundle(ClockFloor::EPOCH, &[s]).await.unwrap();
    }
    set_window(t, "q", 3600).await;
}

async fn set_window_zero_then_push(t: &TestDb, s: SegmentPush) {
    set_window(t, "q", 0).await;
    t.db.push_bundle(ClockFloor::EPOCH, &[s]).await.unwrap();
}

#[tokio::test]
async fn hydration_reads_the_window_and_the_allocator_together() {
    let t = TestDb::new().await;
    let p = t.db.resolve_partition("q", "p").await.unwrap();
    let h = t.db.hydration(p.id, 60, 5_000).await.unwrap();
    assert_eq!((h.last_offset, h.txns_start, h.rows.len()), (-1, 0, 0));

    t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["a", "b"], -1, 3600)]).await.unwrap();
    t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["c"], -1, 3600)]).await.unwrap();
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["d"], -1, 3600)]).await.unwrap();
    let created_ms = out[0].stored.expect("stored").created_ms;
    let c = t.client().await;
    // Row 0 is 10 minutes old, row 2 is 62 s old: outside 60 s, but inside
    // the 5 s slack.
    c.execute(
        "UPDATE stile.txns SET created_at = created_at - interval '10 minutes' \
         WHERE partition_id = $1 AND base_offset = 0",
        &[&p.id],
    )
    .await
    .unwrap();
    c.execute(
        "UPDATE stile.txns SET created_at = created_at - interval '62 seconds' \
         WHERE partition_id = $1 AND base_offset = 2",
        &[&p.id],
    )
    .await
    .unwrap();
    let h = t.db.hydration(p.id, 60, 5_000).await.unwrap();
    assert_eq!(h.last_offset, 3);
    assert_eq!(h.rows.iter().map(|r| (r.base_offset, r.end_offset)).collect::<Vec<_>>(), vec![(2, 2), (3, 3)]);
    assert_eq!(h.rows[1].created_ms, created_ms);
    assert_eq!(h.rows[1].hashes, stile::hash::txn_hash("d").to_vec());
    let h = t.db.hydration(p.id, 3600, 5_000).await.unwrap();
    assert_eq!(h.rows.len(), 3);
    assert!(t.db.hydration(p.id + 1000, 60, 5_000).await.unwrap_err().kind() == "not_found");
    // The slack is the caller's: without it, the 62 s old row is left out.
    let h = t.db.hydration(p.id, 60, 0).await.unwrap();
    assert_eq!(h.rows.iter().map(|r| r.base_offset).collect::<Vec<_>>(), vec![3]);
}

#[tokio::test]
async fn pushes_and_hydrations_read_the_database_clock() {
    let t = TestDb::new().await;
    let p = t.db.resolve_partition("q", "p").await.unwrap();
    let before = t.db.clock_ms().await.unwrap();
    let out =
        t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["a"], -1, 3600), segment(p.id, &["a"], -1, 3600)]).await.unwrap();
    let hydration = t.db.hydration(p.id, 60, 5_000).await.unwrap();
    let after = t.db.clock_ms().await.unwrap();
    let readings = [out[0].clock_ms, out[1].clock_ms, hydration.clock_ms];
    assert!(readings.iter().all(|&ms| (before..=after).contains(&ms)), "{before} <= {readings:?} <= {after}");
    assert!(readings.is_sorted(), "{readings:?}");
    // A stored segment's created_ms is the same instant, rounded up.
    let created_ms = out[0].stored.expect("stored").created_ms;
    assert!((out[0].clock_ms..=out[0].clock_ms + 1).contains(&created_ms), "{created_ms} vs {}", out[0].clock_ms);
    assert!(out[1].stored.is_none(), "the second segment repeats the first");
}

/// The cache judges age by the `now` it was given. A vouch made under a
/// `now` this database's clock has not reached (a gateway whose bound ran
/// ahead, or this clock stepped back) may skip hashes the window still
/// holds: the push function refuses it and probes the whole window.
#[tokio::test]
async fn a_vouch_planned_ahead_of_the_database_clock_is_refused() {
    let t = TestDb::new().await;
    let p = t.db.resolve_partition("q", "p").await.unwrap();
    t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["a", "b"], -1, 3600)]).await.unwrap();
    let now = t.db.clock_ms().await.unwrap();

    // A cache that expired "a" vouches past it, planned an hour ahead.
    let ahead = ClockFloor(now + 3_600_000);
    let out = t.db.push_bundle(ahead, &[segment(p.id, &["a", "c"], 1, 3600)]).await.unwrap();
    let (found, probe) = duplicates(&out[0]);
    assert_eq!((placed(&found), probe), (vec![(0, 0)], ProbeMode::Full));
    assert_eq!(stored_at(&out[0]), Some(2));
    assert!(out[0].clock_ms < ahead.0);

    // Planned at a time the clock has passed, the same vouch is honoured as
    // given: the push function skips what it vouches for, and "b" (which
    // it wrongly covers) is stored again. That is why the floor matters.
    let out = t.db.push_bundle(ClockFloor(now - 5_000), &[segment(p.id, &["b"], 2, 3600)]).await.unwrap();
    assert_eq!(committed(&out[0]), (3, ProbeMode::Skipped));

    // No floor at all (NULL) vouches for nothing.
    let c = t.client().await;
    let row = push_in_sql(&c, &segment(p.id, &["c"], 3, 3600), None).await;
    let (probe, offsets): (String, Vec<i64>) = (row.get("probe"), row.get("dup_off"));
    assert_eq!((probe.as_str(), offsets), ("full", vec![2]));
}

#[tokio::test]
async fn retention_purges_segments_and_txns_outside_the_window() {
    let t = TestDb::new().await;
    let kept = t.db.resolve_partition("forever", "p").await.unwrap();
    let p = t.db.resolve_partition("short", "p").await.unwrap();
    let mut options = Map::new();
    options.insert("retentionSeconds".into(), json!(60));
    options.insert("dedupWindowSeconds".into(), json!(600));
    t.db.configure("short", &options, ConfigureMode::Merge).await.unwrap();
    for s in [&["a", "b"][..], &["c"], &["d"]] {
        t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, s, -1, 600)]).await.unwrap();
        t.db.push_bundle(ClockFloor::EPOCH, &[segment(kept.id, s, -1, 3600)]).await.unwrap();
    }
    let c = t.client().await;
    // Everything is 2 hours old except offset 3 ("d"), which is 2 minutes:
    // past the retention, inside the window.
    for table in ["segments", "txns"] {
        c.execute(
            &format!(
                "UPDATE stile.{table} SET created_at = created_at - \
                 CASE WHEN base_offset = 3 THEN interval '2 minutes' ELSE interval '2 hours' END"
            ),
            &[],
        )
        .await
        .unwrap();
    }
    let report = t.db.purge().await.unwrap();
    assert_eq!((report.partitions, report.segments_deleted, report.txns_deleted), (1, 3, 2));
    // Retention 0 keeps everything.
    assert_eq!(partition_state(&c, kept.id).await, PartitionState { last_offset: 3, txns_start: 0, segments: 3, txns: 3 });
    // Segments older than 60 s are gone; txns only outside the 600 s window.
    assert_eq!(partition_state(&c, p.id).await, PartitionState { last_offset: 3, txns_start: 3, segments: 0, txns: 1 });
    assert!(t.db.read_messages("short", "p", 0, bound(10)).await.unwrap().messages.is_empty());

    // "d" is still a duplicate (its hash is inside the window), but its
    // message is gone: the original's id is unknown.
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["d"], -1, 600)]).await.unwrap();
    let (dups, probe) = duplicates(&out[0]);
    assert_eq!(probe, ProbeMode::Full);
    assert_eq!((dups[0].offset, dups[0].message_id), (3, uuid::Uuid::nil()));
    // "a" is past the watermark: new again.
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["a"], -1, 600)]).await.unwrap();
    assert_eq!(committed(&out[0]), (4, ProbeMode::Full));
    // Nothing more to purge.
    let report = t.db.purge().await.unwrap();
    assert_eq!((report.segments_deleted, report.txns_deleted), (0, 0));
}

/// The shapes the push function checks before anything is written: a bundle
/// that fails one, at any segment, is refused whole.
#[tokio::test]
async fn a_bundle_whose_shapes_do_not_add_up_stores_none_of_its_segments() {
    let t = TestDb::new().await;
    let p = t.db.resolve_partition("q", "p").await.unwrap();
    let other = t.db.resolve_partition("q", "other").await.unwrap();
    let c = t.client().await;
    let push = "SELECT * FROM stile.push($1, $2, ARRAY[-1, -1]::bigint[], ARRAY[3600, 3600], ARRAY[1, $3::integer], \
                $4::bytea[], $5::bytea[], $6::text[], $7::text[], 0)";
    let ids = vec![p.id, other.id];
    let hashes = |n: usize| {
        vec![stile::hash::txn_hash("a").to_vec(), [stile::hash::txn_hash("b"), stile::hash::txn_hash("c")][..n].concat()]
    };
    let uuid_bytes = |n: usize| vec![vec![1u8; 16], vec![2u8; 16 * n]];
    let txns = vec![r#"["a"]"#.to_string(), r#"["b","c"]"#.to_string()];
    let payloads = vec!["[1]".to_string(), "[2,3]".to_string()];
    // The second segment's message ids are one short, then its hashes.
    for (hash_count, id_count) in [(2, 1), (1, 2)] {
        let e =
            c.query(push, &[&p.id, &ids, &2i32, &hashes(hash_count), &uuid_bytes(id_count), &txns, &payloads]).await.unwrap_err();
        assert_eq!(e.as_db_error().map(|d| d.code().code()), Some("22023"), "{e}");
    }
    // One of its per-segment arrays is a segment short.
    let short = "SELECT * FROM stile.push($1, $2, ARRAY[-1]::bigint[], ARRAY[3600, 3600], ARRAY[1, 2], \
                 $3::bytea[], $4::bytea[], $5::text[], $6::text[], 0)";
    let e = c.query(short, &[&p.id, &ids, &hashes(2), &uuid_bytes(2), &txns, &payloads]).await.unwrap_err();
    assert_eq!(e.as_db_error().map(|d| d.code().code()), Some("22023"), "{e}");
    assert!(e.as_db_error().is_some_and(|d| d.message().contains("differ in length")), "{e:?}");
    // Its JSON arrays hold fewer elements than it has messages: found when
    // a duplicate makes the function rebuild them.
    let first =
        c.query(push, &[&p.id, &ids, &2i32, &hashes(2), &uuid_bytes(2), &txns, &payloads]).await.expect("a well-formed bundle");
    assert_eq!(first.len(), 2);
    let e = c
        .query(
            push,
            &[
                &p.id,
                &ids,
                &2i32,
                &[hashes(2)[0].clone(), [stile::hash::txn_hash("b"), stile::hash::txn_hash("d")].concat()].to_vec(),
                &uuid_bytes(2),
                &vec![r#"["a"]"#.to_string(), r#"["b"]"#.to_string()],
                &payloads,
            ],
        )
        .await
        .unwrap_err();
    assert_eq!(e.as_db_error().map(|d| d.code().code()), Some("22023"), "{e}");
    assert_eq!(partition_state(&c, p.id).await, PartitionState { last_offset: 0, txns_start: 0, segments: 1, txns: 1 });
    assert_eq!(partition_state(&c, other.id).await, PartitionState { last_offset: 1, txns_start: 0, segments: 1, txns: 1 });
}

/// `s` with each hash's floor, pushed with the lowest as its `p_verified`
/// (as the gateway sends a segment of replays).
fn with_floors(mut s: SegmentPush, floors: &[i64]) -> SegmentPush {
    s.p_verified = *floors.iter().min().expect("a floor per message");
    s.hash_floors = Some(floors.to_vec());
    s
}

/// Replays of ids stored far apart, each with its own floor (a redelivery
/// storm): every hash is answered with its original's offset and message
/// id, and nothing is written. A floor that misses its original in the row
/// above it (too far below), or a hash stored nowhere, sends the segment
/// over the whole span, with the same answers, and the new hash is stored.
#[tokio::test]
async fn replays_with_their_own_floors_name_each_original() {
    let t = TestDb::new().await;
    let p = t.db.resolve_partition("q", "p").await.unwrap();
    // Rows of 300, 5 and 2,000 ids: the last, where 4 replayed ids are
    // looked for, is read in slices, the first (3 of them) whole.
    let ids: Vec<String> = (0..2305).map(|i| format!("id-{i}")).collect();
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let mut message_ids = Vec::new();
    for range in [0..300, 300..305, 305..2305] {
        let s = segment(p.id, &refs[range], -1, 3600);
        message_ids.extend(s.message_ids.iter().copied());
        t.db.push_bundle(ClockFloor::EPOCH, &[s]).await.unwrap();
    }
    let c = t.client().await;
    let before = partition_state(&c, p.id).await;
    let picks = [450usize, 13, 301, 299, 120, 504];
    let replay = |extra: &[&'static str]| {
        let txns: Vec<&str> = picks.iter().map(|&i| refs[i]).chain(extra.iter().copied()).collect();
        segment(p.id, &txns, -1, 3600)
    };
    let originals: Vec<(u32, i64, uuid::Uuid)> =
        picks.iter().enumerate().map(|(k, &i)| (k as u32, i as i64, message_ids[i])).collect();
    // Floors within a few offsets below each original, as the cache gives.
    let close: Vec<i64> = picks.iter().map(|&i| i as i64 - 1 - (i as i64 % 7)).collect();
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[with_floors(replay(&[]), &close)]).await.unwrap();
    let (dups, probe) = duplicates(&out[0]);
    assert_eq!((named(&dups), probe, stored_at(&out[0])), (originals.clone(), ProbeMode::Narrowed, None));
    assert_eq!(partition_state(&c, p.id).await, before);

    // The first replay's floor lies in the row before its original's.
    let mut far = close.clone();
    far[0] = 100;
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[with_floors(replay(&[]), &far)]).await.unwrap();
    let (dups, probe) = duplicates(&out[0]);
    assert_eq!((named(&dups), probe, stored_at(&out[0])), (originals.clone(), ProbeMode::Narrowed, None));

    // An original among the first offsets is floored at -1 (nothing below
    // offset 0): the segment has no vouch, and still its floors hold.
    let mut first = close.clone();
    first[1] = -1;
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[with_floors(replay(&[]), &first)]).await.unwrap();
    let (dups, probe) = duplicates(&out[0]);
    assert_eq!((named(&dups), probe, stored_at(&out[0])), (originals.clone(), ProbeMode::Full, None));

    // A hash the cache claims but no row holds.
    let mut claimed = close.clone();
    claimed.push(400);
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[with_floors(replay(&["never-stored"]), &claimed)]).await.unwrap();
    let (dups, _) = duplicates(&out[0]);
    assert_eq!((named(&dups), stored_at(&out[0])), (originals, Some(2305)));
}

/// Each hash is looked for above its own floor, which is trusted as the
/// cache's vouch is: an id stored twice (with the window off in between)
/// floored between the two is answered with the later. Planned ahead of the
/// database's clock, the floors are ignored with the vouch, and the span is
/// read whole.
#[tokio::test]
async fn each_hash_is_looked_for_above_its_own_floor() {
    let t = TestDb::new().await;
    let p = t.db.resolve_partition("q", "p").await.unwrap();
    store_with_repeats(&t, [segment(p.id, &["x", "a"], -1, 0), segment(p.id, &["a"], -1, 0)]).await;
    t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["y"], -1, 3600)]).await.unwrap();
    // "a" at 1 and 2, "y" at 3.
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[with_floors(segment(p.id, &["a", "y"], -1, 3600), &[1, 2])]).await.unwrap();
    let (dups, probe) = duplicates(&out[0]);
    assert_eq!((placed(&dups), probe), (vec![(0, 2), (1, 3)], ProbeMode::Narrowed));
    // Without the floors the span above the lowest is read: "a" at 1.
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["a", "y"], 0, 3600)]).await.unwrap();
    assert_eq!(placed(&duplicates(&out[0]).0), vec![(0, 1), (1, 3)]);
    let now = t.db.clock_ms().await.unwrap();
    let ahead = ClockFloor(now + 3_600_000);
    let out = t.db.push_bundle(ahead, &[with_floors(segment(p.id, &["a", "y"], -1, 3600), &[1, 2])]).await.unwrap();
    let (dups, probe) = duplicates(&out[0]);
    assert_eq!((placed(&dups), probe), (vec![(0, 1), (1, 3)], ProbeMode::Full));
}

/// A hash whose floor lies in the row before its own (within 128 offsets)
/// is found in the row after: the rows above a floor are read up to the one
/// holding the floor's 128th offset. An id stored twice, floored between the
/// two across a row, is answered with the later, which only the floors name.
#[tokio::test]
async fn a_hash_is_looked_for_in_the_rows_just_above_its_floor() {
    let t = TestDb::new().await;
    let p = t.db.resolve_partition("q", "p").await.unwrap();
    let filler: Vec<String> = (0..40).map(|i| format!("f-{i}")).collect();
    let filler: Vec<&str> = filler.iter().map(String::as_str).collect();
    store_with_repeats(
        &t,
        [
            segment(p.id, &["x", "a"], -1, 0),
            segment(p.id, &["b", "c"], -1, 0),
            segment(p.id, &filler, -1, 0),
            segment(p.id, &["a"], -1, 0),
        ],
    )
    .await;
    t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["y"], -1, 3600)]).await.unwrap();
    // "a" at 1 and 44, "y" at 45. Floored at 2, "a" is found two rows
    // above its floor's row; the segment's vouch of 0 would find it at 1.
    let mut replay = with_floors(segment(p.id, &["a", "y"], -1, 3600), &[2, 44]);
    replay.p_verified = 0;
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[replay]).await.unwrap();
    assert_eq!(placed(&duplicates(&out[0]).0), vec![(0, 44), (1, 45)]);
    // Floored at -1, "a" occurs twice within 128 offsets: the lower is its
    // first occurrence.
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[with_floors(segment(p.id, &["a", "y"], -1, 3600), &[-1, 44])]).await.unwrap();
    assert_eq!(placed(&duplicates(&out[0]).0), vec![(0, 1), (1, 45)]);
}

/// Replays floored far below their originals, over rows of every size: rows
/// of one and of three messages (read together up to the floor's 128th
/// offset), rows of 20 (walked one by one), a row of 750 (read whole) and
/// one larger than 256 hashes per hash looked for (read in slices). Each
/// replay is answered with its
/// first occurrence above its floor, the ids of messages retention removed
/// as unknown, and nothing is written. A replay with an offset in no row
/// between its floor and its original is answered the same, by the probe's
/// other reads.
#[tokio::test]
async fn replays_floored_far_below_are_found_across_rows_of_every_size() {
    let t = TestDb::new().await;
    let p = t.db.resolve_partition("q", "p").await.unwrap();
    let c = t.client().await;
    let ids: Vec<String> = (0..5000).map(|i| format!("r-{i}")).collect();
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    // Offsets 0..60 one per row, 60..150 three per row, 150..250 twenty per
    // row, 250..1000 one row, 1000..5000 one row.
    let mut bounds: Vec<usize> = (0..=60).collect();
    bounds.extend((63..=150).step_by(3));
    bounds.extend((170..=250).step_by(20));
    bounds.extend([1000, 5000]);
    let mut message_ids = Vec::new();
    for pair in bounds.windows(2) {
        let s = segment(p.id, &refs[pair[0]..pair[1]], -1, 3600);
        message_ids.extend(s.message_ids.iter().copied());
        t.db.push_bundle(ClockFloor::EPOCH, &[s]).await.unwrap();
    }
    for base in [30, 31, 90, 170, 1000] {
        remove_messages(&c, p.id, base).await;
    }
    let removed = |i: usize| [30..32, 90..93, 170..190, 1000..5000].iter().any(|r| r.contains(&i));
    let before = partition_state(&c, p.id).await;
    let picks = [31usize, 100, 92, 58, 245, 171, 140, 700, 260, 12, 999, 3456];
    let txns: Vec<&str> = picks.iter().map(|&i| refs[i]).collect();
    let expected: Vec<(u32, i64, uuid::Uuid)> = picks
        .iter()
        .enumerate()
        .map(|(k, &i)| (k as u32, i as i64, if removed(i) { uuid::Uuid::nil() } else { message_ids[i] }))
        .collect();
    for distance in [1i64, 17, 64, 127] {
        let floors: Vec<i64> = picks.iter().map(|&i| (i as i64 - distance).max(-1)).collect();
        let out = t.db.push_bundle(ClockFloor::EPOCH, &[with_floors(segment(p.id, &txns, -1, 3600), &floors)]).await.unwrap();
        let (dups, _) = duplicates(&out[0]);
        assert_eq!((named(&dups), stored_at(&out[0])), (expected.clone(), None), "floors {distance} below");
    }
    assert_eq!(partition_state(&c, p.id).await, before);

    // The rows of offsets 40..50 gone: a replay of 55 floored at 35 finds
    // no row holding 40, and the rows read together are apart.
    c.execute("DELETE FROM stile.log WHERE partition_id = $1 AND end_offset BETWEEN 40 AND 49", &[&p.id]).await.unwrap();
    let out =
        t.db.push_bundle(ClockFloor::EPOCH, &[with_floors(segment(p.id, &[refs[55], refs[245]], -1, 3600), &[35, 200])])
            .await
            .unwrap();
    assert_eq!(named(&duplicates(&out[0]).0), vec![(0, 55, message_ids[55]), (1, 245, message_ids[245])]);
}

/// Hash floors that are not 8 bytes per message refuse the bundle whole.
#[tokio::test]
async fn hash_floors_of_the_wrong_length_refuse_the_bundle() {
    let t = TestDb::new().await;
    let p = t.db.resolve_partition("q", "p").await.unwrap();
    let c = t.client().await;
    let push = "SELECT * FROM stile.push($1::bigint, ARRAY[$1::bigint], ARRAY[-1]::bigint[], ARRAY[3600], ARRAY[1], \
                ARRAY[$2::bytea], ARRAY[$3::bytea], ARRAY['[\"a\"]']::text[], ARRAY['[1]']::text[], 0, $4::bytea[])";
    let hash = stile::hash::txn_hash("a").to_vec();
    for floors in [vec![Some(vec![0u8; 7])], vec![None, None]] {
        let e = c.query(push, &[&p.id, &hash, &vec![1u8; 16], &floors]).await.unwrap_err();
        assert_eq!(e.as_db_error().map(|d| d.code().code()), Some("22023"), "{e}");
    }
    let mut s = segment(p.id, &["a", "b"], -1, 3600);
    s.hash_floors = Some(vec![0]);
    assert!(matches!(t.db.push_bundle(ClockFloor::EPOCH, &[s]).await, Err(DbError::Invalid(_))));
    assert_eq!(partition_state(&c, p.id).await, PartitionState { last_offset: -1, txns_start: 0, segments: 0, txns: 0 });
    // Eight bytes per message are taken.
    let rows = c.query(push, &[&p.id, &hash, &vec![1u8; 16], &vec![Some(vec![0u8; 8])]]).await.unwrap();
    assert_eq!(rows.len(), 1);
}

/// A bundle's segments go to PostgreSQL in ascending partition order (the
/// lock order); the outcomes come back in the caller's order.
#[tokio::test]
async fn outcomes_follow_the_bundles_order_whatever_the_partitions_order() {
    let t = TestDb::new().await;
    let a = t.db.resolve_partition("q", "a").await.unwrap();
    let b = t.db.resolve_partition("q", "b").await.unwrap();
    assert!(a.id < b.id);
    let bundle = [
        segment(b.id, &["b1"], -1, 3600),
        segment(a.id, &["a1", "a2"], -1, 3600),
        segment(b.id, &["b2", "b1"], -1, 3600),
        segment(a.id, &["a3"], -1, 3600),
    ];
    let out = t.db.push_bundle(ClockFloor::EPOCH, &bundle).await.unwrap();
    assert_eq!(out.iter().map(stored_at).collect::<Vec<_>>(), vec![Some(0), Some(0), Some(1), Some(2)]);
    assert_eq!(placed(&out[2].duplicates), vec![(1, 0)]);
    assert_eq!(out[2].duplicates[0].message_id, bundle[0].message_ids[0]);
}

/// What a message costs PostgreSQL's tables: a vouched push of one segment
/// writes one log row and updates the allocator in place (a HOT update),
/// whatever the number of messages; a retry reads one row.
#[tokio::test]
async fn a_vouched_segment_is_one_row_and_a_retry_one_row_read() {
    let t = TestDb::new().await;
    let p = t.db.resolve_partition("q", "p").await.unwrap();
    let c = t.client().await;
    t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["a"], -1, 3600)]).await.unwrap();
    let counters = "SELECT pg_stat_get_xact_tuples_inserted('stile.log'::regclass) AS inserted, \
                           pg_stat_get_xact_tuples_hot_updated('stile.partitions'::regclass) AS hot_updated, \
                           pg_stat_get_xact_tuples_updated('stile.partitions'::regclass) AS updated, \
                           pg_stat_get_xact_tuples_returned('stile.log_pkey'::regclass) AS pkey_read, \
                           pg_stat_get_xact_tuples_returned('stile.log_created_at'::regclass) AS created_at_read";
    let names: Vec<String> = (0..100).map(|i| format!("m{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let vouched = segment(p.id, &names, 0, 3600);
    c.batch_execute("BEGIN").await.unwrap();
    let before = c.query_one(counters, &[]).await.unwrap();
    let row = push_in_sql(&c, &vouched, Some(0)).await;
    let after = c.query_one(counters, &[]).await.unwrap();
    c.batch_execute("COMMIT").await.unwrap();
    let delta = |k: &str| after.get::<_, i64>(k) - before.get::<_, i64>(k);
    assert_eq!(row.get::<_, String>("probe"), "skipped");
    assert_eq!(
        (delta("inserted"), delta("hot_updated"), delta("updated"), delta("pkey_read"), delta("created_at_read")),
        (1, 1, 1, 0, 0),
        "rows inserted, HOT, updated, read"
    );

    // The retry: its originals' offsets and ids from the one row that holds them.
    let mut retry = segment(p.id, &names, 0, 3600);
    retry.message_ids.clone_from(&vouched.message_ids);
    c.batch_execute("BEGIN").await.unwrap();
    let before = c.query_one(counters, &[]).await.unwrap();
    let row = push_in_sql(&c, &retry, Some(0)).await;
    let after = c.query_one(counters, &[]).await.unwrap();
    c.batch_execute("COMMIT").await.unwrap();
    let delta = |k: &str| after.get::<_, i64>(k) - before.get::<_, i64>(k);
    assert_eq!(row.get::<_, String>("probe"), "narrowed");
    assert_eq!(row.get::<_, Vec<i64>>("dup_off"), (1..=100).collect::<Vec<i64>>());
    assert_eq!(
        (delta("inserted"), delta("updated"), delta("pkey_read"), delta("created_at_read")),
        (0, 0, 1, 0),
        "rows inserted, updated, read"
    );
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &names[..3], 0, 3600)]).await.unwrap();
    assert_eq!(named(&out[0].duplicates), (0..3).map(|j| (j as u32, 1 + j as i64, vouched.message_ids[j])).collect::<Vec<_>>());
}

/// Payloads and transactionIds are stored as the gateway sent them, text
/// that PostgreSQL does not parse on the way in: read back byte for byte,
/// by every reader.
#[tokio::test]
async fn payloads_and_transaction_ids_are_stored_and_read_as_sent() {
    let t = TestDb::new().await;
    let p = t.db.resolve_partition("q", "p").await.unwrap();
    let mut s = segment(p.id, &["quote\"", "tab\tand\u{1f}", "é ☃"], -1, 3600);
    s.payloads = [r#"{"b" : 1,  "a":[ ] , "b": 2}"#, "-0.50e+3", r#""\u00e9\n""#]
        .iter()
        .map(|p| Payload::from(serde_json::value::RawValue::from_string(p.to_string()).unwrap()))
        .collect();
    t.db.push_bundle(ClockFloor::EPOCH, std::slice::from_ref(&s)).await.unwrap();
    let page = t.db.read_messages("q", "p", 0, PageBound { messages: 10, bytes: 1 << 20 }).await.unwrap();
    let read: Vec<(String, String)> =
        page.messages.iter().map(|m| (m.transaction_id.clone(), m.payload.get().to_string())).collect();
    let sent: Vec<(String, String)> =
        s.transaction_ids.iter().zip(&s.payloads).map(|(t, p)| (t.to_string(), p.get().to_string())).collect();
    assert_eq!(read, sent);
    let c = t.client().await;
    let rows = c
        .query("SELECT transaction_id, payload::text AS payload, message_id FROM stile.messages ORDER BY \"offset\"", &[])
        .await
        .unwrap();
    let viewed: Vec<(String, String)> = rows.iter().map(|r| (r.get("transaction_id"), r.get("payload"))).collect();
    assert_eq!(viewed, sent);
    assert_eq!(rows.iter().map(|r| r.get::<_, uuid::Uuid>("message_id")).collect::<Vec<_>>(), s.message_ids);
    for (k, txn) in s.transaction_ids.iter().enumerate() {
        let found = t.db.message_by_transaction_id("q", "p", stile::hash::txn_hash(txn), txn).await.unwrap().unwrap();
        assert_eq!((found.offset, found.payload.get()), (k as i64, s.payloads[k].get()));
    }
}

/// What the push function's floors search must answer for a replay, from a
/// model of the log: each hash's first occurrence above its floor (raised to
/// `from`) in the rows inside the window, with its message id (`None` where
/// retention removed it), or `None` where it has none.
struct LogModel {
    /// Per offset: the hash, the message id, and whether its row is inside
    /// the window.
    offsets: Vec<([u8; 16], Option<uuid::Uuid>, bool)>,
}

impl LogModel {
    fn first_above(&self, hash: &[u8; 16], floor: i64, from: i64) -> Option<(i64, Option<uuid::Uuid>)> {
        let start = (floor.max(from) + 1) as usize;
        self.offsets
            .iter()
            .enumerate()
            .skip(start)
            .find(|(_, (h, _, inside))| *inside && h == hash)
            .map(|(offset, (_, id, _))| (offset as i64, *id))
    }
}

/// `stile.found_above_floors` against a model of the log, over rows of
/// random sizes whose hashes repeat, some rows outside the window and some
/// with their messages removed, for replays floored up to 128 (now and then
/// 140) offsets below an occurrence: every answer it gives names each hash's
/// first occurrence above its floor, and it answers most replays.
#[tokio::test]
async fn replays_found_above_their_floors_name_each_first_occurrence_above_it() {
    use rand::{Rng as _, SeedableRng as _};
    let t = TestDb::new().await;
    let p = t.db.resolve_partition("q", "p").await.unwrap();
    let c = t.client().await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
    let pool: Vec<[u8; 16]> = (0..600).map(|_| rng.random()).collect();
    let mut model = LogModel { offsets: Vec::new() };
    while model.offsets.len() < 3000 {
        let base = model.offsets.len() as i64;
        let size = if rng.random_range(0..20) == 0 { 400 } else { rng.random_range(1..=60) };
        // Rows age out of the window from the oldest, so outside rows lie below.
        let inside = base >= 300 || rng.random_range(0..2) == 0;
        let removed = rng.random_range(0..20) == 0;
        let rows: Vec<([u8; 16], uuid::Uuid)> =
            (0..size).map(|_| (pool[rng.random_range(0..pool.len())], uuid::Uuid::now_v7())).collect();
        let hashes: Vec<u8> = rows.iter().flat_map(|(h, _)| *h).collect();
        let ids: Vec<u8> = rows.iter().flat_map(|(_, id)| *id.as_bytes()).collect();
        c.execute(
            "INSERT INTO stile.log (partition_id, end_offset, base_offset, created_at, hashes, message_ids, transaction_ids, payloads) \
             VALUES ($1, $2::bigint + $3::bigint - 1, $2, now() - CASE WHEN $4::boolean THEN interval '0' ELSE interval '2 hours' END, \
                     $5, CASE WHEN $6::boolean THEN NULL ELSE $7::bytea END, \
                     CASE WHEN $6 THEN NULL ELSE '[]' END, CASE WHEN $6 THEN NULL ELSE '[]' END)",
            &[&p.id, &base, &(size as i64), &inside, &hashes, &removed, &ids],
        )
        .await
        .unwrap();
        model.offsets.extend(rows.iter().map(|(h, id)| (*h, (!removed).then_some(*id), inside)));
    }
    let last = model.offsets.len() as i64 - 1;
    const REPLAYS: usize = 300;
    let mut answered = 0;
    for _ in 0..REPLAYS {
        let from = if rng.random_range(0..4) == 0 { rng.random_range(0..last) } else { -1 };
        let mut hashes: Vec<[u8; 16]> = Vec::new();
        let mut floors: Vec<i64> = Vec::new();
        // Replays of a stretch of the log (a producer's recent sends), or of
        // ids anywhere in it.
        let (low, high) = match rng.random_range(0..3) {
            0 => (0, last),
            _ => {
                let low = rng.random_range(0..=last - 800);
                (low, low + 800)
            }
        };
        // A cache floors a hit less than 128 offsets below it; farther
        // floors now and then.
        let farthest = if rng.random_range(0..10) == 0 { 140 } else { 128 };
        for _ in 0..rng.random_range(1..=30) {
            let offset = rng.random_range(low..=high);
            let hash = model.offsets[offset as usize].0;
            if !hashes.contains(&hash) {
                hashes.push(hash);
                floors.push((offset - rng.random_range(1..=farthest)).max(-1));
            }
        }
        let expected: Vec<Option<(i64, Option<uuid::Uuid>)>> =
            hashes.iter().zip(&floors).map(|(hash, &floor)| model.first_above(hash, floor, from)).collect();
        let packed_hashes: Vec<u8> = hashes.concat();
        let packed_floors: Vec<u8> = floors.iter().flat_map(|f| f.to_be_bytes()).collect();
        let row = c
            .query_one(
                "SELECT f.dup_idx, f.dup_off, f.dup_ids \
                   FROM stile.found_above_floors($1, $2, $3, now() - interval '1 hour', $4, $5) AS f",
                &[&p.id, &from, &last, &packed_hashes, &packed_floors],
            )
            .await
            .unwrap();
        // NULLs leave the segment to the probe's other reads.
        let Some(offsets) = row.get::<_, Option<Vec<i64>>>("dup_off") else { continue };
        let ids: Vec<Option<uuid::Uuid>> = row.get("dup_ids");
        let indexes: Vec<i32> = row.get("dup_idx");
        assert_eq!(indexes, (0..hashes.len() as i32).collect::<Vec<_>>());
        let answers: Vec<Option<(i64, Option<uuid::Uuid>)>> = offsets.into_iter().zip(ids).map(Some).collect();
        assert_eq!(answers, expected, "from {from}, floors {floors:?}");
        answered += 1;
    }
    assert!(answered * 2 > REPLAYS, "answered {answered} of {REPLAYS} replays");
}
