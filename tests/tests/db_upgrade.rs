//! Upgrading a database from the layout of two tables (segments and txns,
//! schema version 3) to the log: what was stored stays readable and is still
//! deduplicated against, and gateways of the previous build, which call the
//! push function's previous signature, keep answering correctly beside this
//! build's, against one database.

use std::collections::HashMap;

use serde_json::json;
use stile::configure::ConfigureMode;
use stile::db::{ClockFloor, Duplicate, MIGRATIONS, ProbeMode, SegmentPush};
use stile::payload::Payload;
use stile::reads::PageBound;
use stile_tests::pg::{TestDb, segment};
use tokio_postgres::types::Json;

/// The function set of the previous build.
const PREVIOUS_FUNCTIONS: &str = include_str!("../fixtures/functions_v3.sql");

/// A database as the previous build leaves it: migrations 1 to 3 and that
/// build's functions, recorded as its migration runner records them.
async fn previous_build_database() -> TestDb {
    let t = TestDb::unmigrated(4).await;
    let c = t.client().await;
    c.batch_execute(
        "CREATE SCHEMA stile; \
         CREATE TABLE stile.schema_migrations (version integer PRIMARY KEY, name text NOT NULL, \
             applied_at timestamptz NOT NULL DEFAULT now()); \
         CREATE TABLE stile.function_sets (checksum text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now());",
    )
    .await
    .unwrap();
    for m in MIGRATIONS.iter().filter(|m| m.version <= 3) {
        c.batch_execute(m.sql).await.unwrap();
        c.execute("INSERT INTO stile.schema_migrations (version, name) VALUES ($1, $2)", &[&m.version, &m.name]).await.unwrap();
    }
    c.batch_execute(PREVIOUS_FUNCTIONS).await.unwrap();
    c.execute("INSERT INTO stile.function_sets (checksum) VALUES ('the previous build')", &[]).await.unwrap();
    t
}

/// One bundle through the push function's previous signature, as a gateway
/// of the previous build sends it: messages flat over the bundle, payloads as
/// json. Answers, per segment in order, the base offset and the duplicates
/// as (index, offset, message id).
async fn push_previous(c: &tokio_postgres::Client, segments: &[SegmentPush]) -> Vec<(Option<i64>, Vec<Duplicate>)> {
    let ids: Vec<i64> = segments.iter().map(|s| s.partition_id).collect();
    let verified: Vec<i64> = segments.iter().map(|s| s.p_verified).collect();
    let planned: Vec<i32> = segments.iter().map(|s| s.planned_window_seconds).collect();
    let counts: Vec<i32> = segments.iter().map(|s| s.len() as i32).collect();
    let hashes: Vec<&[u8]> = segments.iter().map(|s| &s.hashes[..]).collect();
    let message_ids: Vec<uuid::Uuid> = segments.iter().flat_map(|s| s.message_ids.iter().copied()).collect();
    let txns: Vec<&str> = segments.iter().flat_map(|s| s.transaction_ids.iter().map(|t| &**t)).collect();
    let payloads: Vec<Json<&serde_json::value::RawValue>> =
        segments.iter().flat_map(|s| s.payloads.iter().map(|p| Json(p.raw()))).collect();
    let rows = c
        .query(
            "SELECT seg, base_offset, dup_idx, dup_off, dup_ids \
               FROM stile.push($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            &[&ids, &verified, &planned, &counts, &hashes, &message_ids, &txns, &payloads, &0i64],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), segments.len());
    rows.iter()
        .enumerate()
        .map(|(i, row)| {
            assert_eq!(row.get::<_, i32>("seg") as usize, i, "rows in segment order");
            let idx: Option<Vec<i32>> = row.get("dup_idx");
            let off: Option<Vec<i64>> = row.get("dup_off");
            let mids: Option<Vec<Option<uuid::Uuid>>> = row.get("dup_ids");
            let dups = idx
                .unwrap_or_default()
                .into_iter()
                .zip(off.unwrap_or_default())
                .zip(mids.unwrap_or_default())
                .map(|((index, offset), id)| Duplicate { index: index as u32, offset, message_id: id.unwrap_or_default() })
                .collect();
            (row.get("base_offset"), dups)
        })
        .collect()
}

/// A segment whose payloads are JSON texts as a client sent them (spacing,
/// key order and duplicate keys kept).
fn raw_segment(partition_id: i64, txns: &[&str], payloads: &[&str]) -> SegmentPush {
    let mut s = segment(partition_id, txns, -1, 3600);
    s.payloads =
        payloads.iter().map(|p| Payload::from(serde_json::value::RawValue::from_string(p.to_string()).unwrap())).collect();
    s
}

#[tokio::test]
async fn messages_stored_before_the_upgrade_are_read_and_deduplicated_after_it() {
    let t = previous_build_database().await;
    let c = t.client().await;
    let p = t.db.resolve_partition("orders", "p0").await.unwrap();
    let other = t.db.resolve_partition("orders", "p1").await.unwrap();
    let first = raw_segment(p.id, &["a", "b", "c\u{1f}\"x"], &[r#"{"n" : 1, "n": 2}"#, "[1, 2 ]", r#""é""#]);
    let second = segment(other.id, &["d"], -1, 3600);
    let third = segment(p.id, &["e", "f"], -1, 3600);
    let before = push_previous(&c, &[first.clone(), second.clone(), third.clone()]).await;
    assert_eq!(before.iter().map(|b| b.0).collect::<Vec<_>>(), vec![Some(0), Some(0), Some(3)]);
    // Retention removed the messages of the partition's last segment and kept
    // its hashes, as it does for a retention shorter than the window.
    c.execute("DELETE FROM stile.segments WHERE partition_id = $1 AND base_offset = 3", &[&p.id]).await.unwrap();

    t.db.migrate().await.unwrap();
    assert_eq!(t.db.schema_version().await.unwrap(), MIGRATIONS.last().unwrap().version);
    // A gateway of the previous build starting now finds its function set
    // on record, and so leaves this build's in place.
    let recorded: bool = c
        .query_one("SELECT EXISTS (SELECT 1 FROM stile.function_sets WHERE checksum = '7b80b9dbd398a7db') AS recorded", &[])
        .await
        .unwrap()
        .get("recorded");
    assert!(recorded);

    // Read back as stored: ids, transactionIds and payloads byte for byte.
    let page = t.db.read_messages("orders", "p0", 0, PageBound { messages: 10, bytes: 1 << 20 }).await.unwrap();
    let read: Vec<(i64, uuid::Uuid, String, String)> =
        page.messages.iter().map(|m| (m.offset, m.message_id, m.transaction_id.clone(), m.payload.get().to_string())).collect();
    let expected: Vec<(i64, uuid::Uuid, String, String)> = (0..3)
        .map(|k| (k as i64, first.message_ids[k], first.transaction_ids[k].to_string(), first.payloads[k].get().to_string()))
        .collect();
    assert_eq!(read, expected);
    let found = t.db.message_by_transaction_id("orders", "p0", stile::hash::txn_hash("b"), "b").await.unwrap().unwrap();
    assert_eq!((found.offset, found.message_id, found.payload.get()), (1, first.message_ids[1], "[1, 2 ]"));
    let counted: i64 =
        c.query_one("SELECT count(*) AS counted FROM stile.messages WHERE queue = 'orders'", &[]).await.unwrap().get("counted");
    assert_eq!(counted, 4, "three messages of p0 and one of p1; retention removed e and f");
    let hydrated = t.db.hydration(p.id, 3600, 5000).await.unwrap();
    assert_eq!(hydrated.rows.iter().map(|r| (r.base_offset, r.end_offset)).collect::<Vec<_>>(), vec![(0, 2), (3, 4)]);
    assert_eq!(hydrated.rows[1].hashes, third.hashes);

    // The same ids again, through this build: duplicates of the originals,
    // by a full probe and by a narrowed one.
    let again = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["c\u{1f}\"x", "a", "f"], -1, 3600)]).await.unwrap();
    assert_eq!(again[0].probe, ProbeMode::Full);
    assert_eq!(again[0].stored, None);
    assert_eq!(
        again[0].duplicates,
        vec![
            Duplicate { index: 0, offset: 2, message_id: first.message_ids[2] },
            Duplicate { index: 1, offset: 0, message_id: first.message_ids[0] },
            // Its messages are gone: its hashes still deduplicate it.
            Duplicate { index: 2, offset: 4, message_id: uuid::Uuid::nil() },
        ]
    );
    let narrowed = t.db.push_bundle(ClockFloor::EPOCH, &[segment(other.id, &["d"], -1, 3600)]).await.unwrap();
    assert_eq!(narrowed[0].duplicates, vec![Duplicate { index: 0, offset: 0, message_id: second.message_ids[0] }]);
    let retry = segment(p.id, &["a", "b"], 0, 3600);
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[retry]).await.unwrap();
    assert_eq!(out[0].probe, ProbeMode::Narrowed);
    assert_eq!(
        out[0].duplicates.iter().map(|d| (d.offset, d.message_id)).collect::<Vec<_>>(),
        vec![(0, first.message_ids[0]), (1, first.message_ids[1])]
    );

    // New messages go on from the previous allocator.
    let fresh = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["g"], -1, 3600)]).await.unwrap();
    assert_eq!(fresh[0].stored.map(|s| s.base_offset), Some(5));
}

#[tokio::test]
async fn a_previous_build_and_this_one_push_to_one_upgraded_database() {
    let t = previous_build_database().await;
    let c = t.client().await;
    let p = t.db.resolve_partition("orders", "p0").await.unwrap();
    let q = t.db.resolve_partition("orders", "p1").await.unwrap();
    push_previous(&c, &[segment(p.id, &["old-0"], -1, 3600)]).await;
    t.db.migrate().await.unwrap();

    // After the upgrade, the previous signature still stores and still
    // answers duplicates, whichever build stored the original, and a bundle
    // whose segments are not in partition order is answered in its order.
    let mixed = push_previous(&c, &[segment(q.id, &["x"], -1, 3600), segment(p.id, &["old-0", "y"], -1, 3600)]).await;
    assert_eq!(mixed[0].0, Some(0));
    assert_eq!(mixed[1].0, Some(1));
    assert_eq!(mixed[1].1.iter().map(|d| (d.index, d.offset)).collect::<Vec<_>>(), vec![(0, 0)]);
    let out = t.db.push_bundle(ClockFloor::EPOCH, &[segment(p.id, &["y"], -1, 3600)]).await.unwrap();
    assert_eq!(out[0].duplicates.iter().map(|d| d.offset).collect::<Vec<_>>(), vec![1]);
    let seen = push_previous(&c, &[segment(p.id, &["z"], -1, 3600)]).await;
    assert_eq!(seen[0].0, Some(2));
    let seen = push_previous(&c, &[segment(p.id, &["z"], -1, 3600)]).await;
    assert_eq!(seen[0].1.iter().map(|d| d.offset).collect::<Vec<_>>(), vec![2]);
}

/// Two builds under load against one upgraded database: tasks pushing
/// through the previous signature and through this build's, the same ids
/// from both, over a few partitions. Every id is stored once, every answer
/// names the offset where it is stored, and reading back counts them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_builds_under_load_store_each_id_once() {
    let t = previous_build_database().await;
    let mut partitions = Vec::new();
    for k in 0..3 {
        partitions.push(t.db.resolve_partition("orders", &format!("p{k}")).await.unwrap().id);
    }
    t.db.migrate().await.unwrap();
    const IDS: usize = 300;
    let mut tasks = Vec::new();
    for task in 0..6usize {
        let previous = task % 2 == 0;
        let db = t.db.clone();
        let client = t.client().await;
        let partitions = partitions.clone();
        tasks.push(tokio::spawn(async move {
            let mut answers: Vec<(i64, String, i64)> = Vec::new();
            // Each task walks the ids in its own order, two segments a
            // bundle, on two different partitions (in either order).
            for step in 0..IDS / 2 {
                let n = (step * (task + 1) * 7) % (IDS / 2);
                let txn_a = format!("id-{}", 2 * n);
                let txn_b = format!("id-{}", 2 * n + 1);
                let (pa, pb) = (partitions[n % 3], partitions[(n + 1) % 3]);
                let bundle = [segment(pa, &[&txn_a], -1, 3600), segment(pb, &[&txn_b], -1, 3600)];
                let outcomes: Vec<i64> = if previous {
                    push_previous(&client, &bundle)
                        .await
                        .into_iter()
                        .map(|(base, dups)| base.unwrap_or_else(|| dups[0].offset))
                        .collect()
                } else {
                    db.push_bundle(ClockFloor::EPOCH, &bundle)
                        .await
                        .unwrap()
                        .iter()
                        .map(|o| o.stored.map(|s| s.base_offset).unwrap_or_else(|| o.duplicates[0].offset))
                        .collect()
                };
                answers.push((pa, txn_a, outcomes[0]));
                answers.push((pb, txn_b, outcomes[1]));
            }
            answers
        }));
    }
    let mut answered: HashMap<(i64, String), i64> = HashMap::new();
    for task in tasks {
        for (partition, txn, offset) in task.await.unwrap() {
            let previous = answered.insert((partition, txn.clone()), offset);
            assert!(previous.is_none_or(|o| o == offset), "{txn} answered at {previous:?} and {offset}");
        }
    }
    let c = t.client().await;
    let rows = c
        .query(
            "SELECT p.id AS partition_id, m.transaction_id, m.\"offset\" FROM stile.messages m \
               JOIN stile.partitions p ON p.queue = m.queue AND p.name = m.partition",
            &[],
        )
        .await
        .unwrap();
    let stored: HashMap<(i64, String), i64> =
        rows.iter().map(|r| ((r.get("partition_id"), r.get("transaction_id")), r.get("offset"))).collect();
    assert_eq!(rows.len(), stored.len(), "no id stored twice");
    assert_eq!(stored, answered, "every answer names where its id is stored");
}

/// A queue's options and a pending timer are shown by functions taking a
/// name or the columns (`stile.queue_options_of`, `stile.timer_json`): the
/// ones taking a table's row, which gateways of earlier builds called and a
/// distributed database cannot run, are gone after the upgrade.
#[tokio::test]
async fn options_and_timers_are_shown_from_names_and_columns_not_rows() {
    let t = previous_build_database().await;
    t.db.migrate().await.unwrap();
    let c = t.client().await;
    for retired in ["stile.queue_options(stile.queues)", "stile.timer_row(stile.timers)"] {
        let exists: bool = c.query_one("SELECT to_regprocedure($1) IS NOT NULL", &[&retired]).await.unwrap().get(0);
        assert!(!exists, "{retired} is dropped");
    }
    let options = serde_json::Map::from_iter([("dedupWindowSeconds".to_owned(), serde_json::json!(60))]);
    let configured = t.db.configure("orders", &options, ConfigureMode::Merge).await.unwrap();
    assert_eq!(configured["dedupWindowSeconds"], 60);
    let shown: Json<serde_json::Value> = c.query_one("SELECT stile.queue_options_of($1)", &[&"orders"]).await.unwrap().get(0);
    assert_eq!(shown.0, configured);
    assert_eq!(t.db.queue_options("orders").await.unwrap(), Some(configured));
    assert_eq!(t.db.queue_options("absent").await.unwrap(), None);

    let scheduled: Json<serde_json::Value> = c
        .query_one(
            "SELECT stile.timers_apply(jsonb_build_array(jsonb_build_object('op', 'schedule', 'queue', 'orders', \
             'timerKey', 'k', 'partition', 'p0', 'txn', 't', 'messageId', gen_random_uuid(), 'payload', '{}'::jsonb, \
             'delayMs', 60000))) -> 0",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let shown: Json<serde_json::Value> = c
        .query_one(
            "SELECT stile.timer_json(t.queue, t.timer_key, t.partition, t.txn, t.message_id, t.deliver_at, t.scheduled_at) \
               FROM stile.timers t WHERE t.queue = $1 AND t.timer_key = $2::text COLLATE \"C\"",
            &[&"orders", &"k"],
        )
        .await
        .unwrap()
        .get(0);
    let serde_json::Value::Object(mut expected) = scheduled.0 else { panic!("a timer result is an object") };
    for field in ["index", "ok", "status"] {
        expected.remove(field);
    }
    assert_eq!(shown.0, serde_json::Value::Object(expected));
}

/// The previous build's firer takes due timers through
/// `stile.timers_take_due(integer)` and sleeps by `stile.timers_next_due_ms()`:
/// both answer as before, and the take keeps to this build's bound of bytes,
/// so that the previous build's gateways cannot build a batch PostgreSQL
/// refuses either.
#[tokio::test]
async fn the_previous_builds_firer_takes_due_timers_within_the_bound_of_bytes() {
    let t = TestDb::new().await;
    let c = t.client().await;
    let large = format!("\"{}\"", "x".repeat(3 << 20));
    for (key, payload) in [("a", large.as_str()), ("b", large.as_str()), ("c", "1")] {
        c.execute(
            "SELECT stile.timers_apply(jsonb_build_array(jsonb_build_object('op', 'schedule', 'queue', 'q', \
             'timerKey', $1::text, 'partition', 'p0', 'txn', $1::text, 'messageId', gen_random_uuid(), \
             'payload', $2::text, 'delayMs', -1000)))",
            &[&key, &payload],
        )
        .await
        .unwrap();
    }
    let due_ms: Option<i64> = c.query_one("SELECT stile.timers_next_due_ms()", &[]).await.unwrap().get(0);
    assert_eq!(due_ms, Some(0));
    let mut taken = Vec::new();
    loop {
        let rows = c
            .query("SELECT queue, partition, txn, message_id, payload::text AS payload FROM stile.timers_take_due($1)", &[&512])
            .await
            .unwrap();
        if rows.is_empty() {
            break;
        }
        let bytes: usize = rows.iter().map(|r| r.get::<_, String>("payload").len()).sum();
        assert!(rows.len() == 1 || bytes <= 4 << 20, "{} timers of {bytes} bytes in one take", rows.len());
        let mut txns: Vec<String> = rows.iter().map(|r| r.get("txn")).collect();
        txns.sort();
        taken.push(txns);
    }
    // Each large timer alone or with the small one: never both large ones.
    assert_eq!(taken.len(), 2, "{taken:?}");
    assert_eq!(taken.concat().len(), 3, "{taken:?}");
    let due_ms: Option<i64> = c.query_one("SELECT stile.timers_next_due_ms()", &[]).await.unwrap().get(0);
    assert_eq!(due_ms, None);
}

/// A gateway of the previous build reads messages and pages of timers
/// through the signatures without a bound of bytes (which readers with plain
/// SQL use too); this build's take one. The previous signatures still answer
/// what they answered: the messages as pushed, the pages as paged.
#[tokio::test]
async fn the_previous_builds_reads_of_messages_and_timer_pages_answer_as_before() {
    let t = TestDb::new().await;
    let c = t.client().await;
    let p = t.db.resolve_partition("orders", "p0").await.unwrap();
    let first = segment(p.id, &["a", "b"], -1, 3600);
    let second = segment(p.id, &["c"], -1, 3600);
    let mut pushed = Vec::new();
    for s in [&first, &second] {
        let outcome = t.db.push_bundle(ClockFloor::EPOCH, std::slice::from_ref(s)).await.unwrap();
        let created_ms = outcome[0].stored.unwrap().created_ms;
        for (id, txn) in s.message_ids.iter().zip(&s.transaction_ids) {
            pushed.push((*id, txn.to_string(), json!({ "txn": &**txn }), created_ms));
        }
    }
    let rows = c
        .query(
            "SELECT \"offset\", message_id, transaction_id, payload, created_ms FROM stile.read_messages('orders', 'p0', 1, 10)",
            &[],
        )
        .await
        .unwrap();
    let read: Vec<(i64, uuid::Uuid, String, serde_json::Value, i64)> = rows
        .iter()
        .map(|r| {
            let Json(payload): Json<serde_json::Value> = r.get("payload");
            (r.get("offset"), r.get("message_id"), r.get("transaction_id"), payload, r.get("created_ms"))
        })
        .collect();
    let expected: Vec<(i64, uuid::Uuid, String, serde_json::Value, i64)> = pushed
        .into_iter()
        .enumerate()
        .skip(1)
        .map(|(offset, (id, txn, payload, ms))| (offset as i64, id, txn, payload, ms))
        .collect();
    assert_eq!(read, expected);

    c.execute(
        "SELECT stile.timers_apply(jsonb_build_array( \
             jsonb_build_object('op', 'schedule', 'queue', 'orders', 'timerKey', 'k1', 'partition', 'p0', 'txn', 't1', \
                                'messageId', gen_random_uuid(), 'payload', '{}'::jsonb, 'delayMs', 60000), \
             jsonb_build_object('op', 'schedule', 'queue', 'orders', 'timerKey', 'k2', 'partition', 'p0', 'txn', 't2', \
                                'messageId', gen_random_uuid(), 'payload', '{}'::jsonb, 'delayMs', 60000)))",
        &[],
    )
    .await
    .unwrap();
    let pages = [
        (None, 1, json!(["k1"]), json!(true), json!("k1")),
        (Some("k1"), 1, json!(["k2"]), json!(false), json!(null)),
        (None, 5, json!(["k1", "k2"]), json!(false), json!(null)),
    ];
    for (after, limit, keys, truncated, next_after) in pages {
        let page = |sql: &'static str| {
            let c = &c;
            async move {
                let Json(page): Json<serde_json::Value> = c.query_one(sql, &[&after, &limit]).await.unwrap().get("page");
                page
            }
        };
        let previous = page("SELECT stile.timers_list('orders', $1, $2) AS page").await;
        let shown: Vec<serde_json::Value> = previous["rows"].as_array().unwrap().iter().map(|r| r["timerKey"].clone()).collect();
        assert_eq!(
            (json!(shown), previous["truncated"].clone(), previous["nextAfter"].clone()),
            (keys, truncated, next_after),
            "after {after:?}, limit {limit}"
        );
        assert_eq!(previous, page("SELECT stile.timers_list('orders', $1, $2, NULL) AS page").await);
    }
}
