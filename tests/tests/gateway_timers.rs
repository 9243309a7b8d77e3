//! Timers against real gateways and PostgreSQL: schedule and fire, cancel,
//! reschedule, peek and list; a past delay fires at once; two gateways fire
//! each timer once; a gateway killed mid-fire leaves the timer pending or its
//! message stored, never both and never neither.

use std::time::{Duration, Instant};

use base64::Engine as _;
use hyper::Method;
use serde_json::{Value, json};
use stile_tests::gateway::{Client, Gateway, GatewayOptions, fresh_database, metric};
use stile_tests::pg::TestDb;

fn b64(value: &Value) -> String {
    base64::engine::general_purpose::STANDARD.encode(value.to_string())
}

fn schedule(queue: &str, key: &str, delay_ms: i64, txn: &str, payload: Value) -> Value {
    json!({"op": "schedule", "queue": queue, "timerKey": key, "delayMs": delay_ms, "txn": txn, "payload": b64(&payload)})
}

async fn timers(client: &mut Client, ops: Vec<Value>) -> Vec<Value> {
    let reply = client.post("/api/v1/timers", json!({ "operations": ops }).to_string()).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    reply.json()["results"].as_array().unwrap().clone()
}

/// A stored message of a timers' queue.
#[derive(Debug)]
struct Delivered {
    transaction_id: String,
    message_id: String,
    payload: Value,
}

/// Every stored message of a queue.
async fn delivered(t: &TestDb, queue: &str) -> Vec<Delivered> {
    let rows = t
        .client()
        .await
        .query(
            "SELECT transaction_id, message_id::text AS message_id, payload::jsonb AS payload FROM stile.messages WHERE queue = $1 ORDER BY created_at, \"offset\"",
            &[&queue],
        )
        .await
        .unwrap();
    rows.iter()
        .map(|r| Delivered {
            transaction_id: r.get("transaction_id"),
            message_id: r.get("message_id"),
            payload: r.get("payload"),
        })
        .collect()
}

async fn pending(t: &TestDb) -> i64 {
    t.client().await.query_one("SELECT count(*) AS pending FROM stile.timers", &[]).await.unwrap().get("pending")
}

/// Waits, polling PostgreSQL, until `queue` holds `count` messages.
async fn wait_delivered(t: &TestDb, queue: &str, count: usize) -> Vec<Delivered> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let messages = delivered(t, queue).await;
        if messages.len() >= count {
            return messages;
        }
        assert!(Instant::now() < deadline, "{} of {count} timers fired: {messages:?}", messages.len());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timer_fires_once_with_its_txn_and_promised_message_id() {
    let t = fresh_database().await;
    let gw = Gateway::start(&t.url()).await;
    let mut c = gw.client().await;
    let results = timers(
        &mut c,
        vec![
            schedule("jobs", "past", -60_000, "txn-past", json!({"n": 1})),
            schedule("jobs", "soon", 300, "txn-soon", json!({"n": 2})),
        ],
    )
    .await;
    assert_eq!((results[0]["ok"].clone(), results[0]["status"].clone()), (json!(true), json!("scheduled")));
    let promised = results[1]["messageId"].as_str().unwrap().to_owned();
    let messages = wait_delivered(&t, "jobs", 2).await;
    assert_eq!(messages[0].transaction_id, "txn-past", "a delay in the past fires on the first sweep");
    assert_eq!(
        (messages[1].transaction_id.as_str(), messages[1].message_id.as_str(), &messages[1].payload),
        ("txn-soon", promised.as_str(), &json!({"n": 2}))
    );
    assert_eq!(pending(&t).await, 0);
    // After the fire the timer is no longer pending: a cancel answers absent
    // (which may mean delivered), and peek finds nothing.
    let cancel = c.send(Method::DELETE, "/api/v1/timers/jobs/soon?txn=txn-soon", "", &[]).await.unwrap().json();
    assert_eq!(
        (cancel["ok"].clone(), cancel["status"].clone(), cancel["txn"].clone()),
        (json!(false), json!("absent"), json!("txn-soon"))
    );
    assert_eq!(c.get("/api/v1/timers/jobs/soon").await.json(), json!({"found": false}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_reschedule_peek_and_list() {
    let t = fresh_database().await;
    let gw = Gateway::start(&t.url()).await;
    let mut c = gw.client().await;
    let hour = 3_600_000;
    timers(
        &mut c,
        vec![
            schedule("q", "a", hour, "t-a", json!(1)),
            schedule("q", "b/1", hour, "t-b", json!(2)),
            schedule("q", "c", hour, "t-c", json!(3)),
        ],
    )
    .await;
    let rescheduled = timers(&mut c, vec![json!({"op": "reschedule", "queue": "q", "timerKey": "a", "delayMs": hour, "txn": "t-a2", "payload": b64(&json!("new"))})]).await;
    assert_eq!((rescheduled[0]["status"].clone(), rescheduled[0]["txn"].clone()), (json!("rescheduled"), json!("t-a2")));
    let peek = c.get("/api/v1/timers/q/a").await.json();
    assert_eq!(
        (peek["found"].clone(), peek["txn"].clone(), peek["payload"].clone()),
        (json!(true), json!("t-a2"), json!(b64(&json!("new"))))
    );
    let cancelled = c.send(Method::DELETE, "/api/v1/timers/q/b/1", "", &[]).await.unwrap().json();
    assert_eq!(
        (cancelled["ok"].clone(), cancelled["status"].clone(), cancelled["txn"].clone()),
        (json!(true), json!("cancelled"), json!("t-b"))
    );
    let page = c.get("/api/v1/timers/q?limit=1").await.json();
    assert_eq!(
        (page["rows"][0]["timerKey"].clone(), page["truncated"].clone(), page["nextAfter"].clone()),
        (json!("a"), json!(true), json!("a"))
    );
    let rest = c.get("/api/v1/timers/q?after=a").await.json();
    assert_eq!(
        (rest["rows"].as_array().unwrap().len(), rest["rows"][0]["timerKey"].clone(), rest["truncated"].clone()),
        (1, json!("c"), json!(false))
    );
    let bad = c
        .post(
            "/api/v1/timers",
            json!({"operations": [{"op": "schedule", "queue": "q", "timerKey": "k", "delayMs": 1, "payload": "bm9wZQ=="}]})
                .to_string(),
        )
        .await;
    assert_eq!(bad.status, 400);
    assert!(bad.error().starts_with("operations[0].payload"), "{}", bad.error());
    assert_eq!(pending(&t).await, 2, "nothing was written by the refused request, and nothing has fired");
}

/// A page of timers keeps `--answer-limit` whatever its `limit`: it ends
/// before the timer that would cross it, says so as a page ended by its
/// limit does, and is read on from its `nextAfter` to the end, every timer
/// seen once. A timer larger than the limit by itself is refused, named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_keeps_the_answer_limit_and_reads_on_to_the_end() {
    const ANSWER_LIMIT: usize = 300_000;
    const TIMERS: usize = 20;
    let t = fresh_database().await;
    let limit = ANSWER_LIMIT.to_string();
    let gw = Gateway::start_with(
        &t.url(),
        &GatewayOptions { extra_args: vec!["--answer-limit".into(), limit], ..GatewayOptions::default() },
    )
    .await;
    let mut c = gw.client().await;
    let hour = 3_600_000;
    // About 60 KB each: the twenty would take four times the limit.
    let keys: Vec<String> = (0..TIMERS).map(|n| format!("k{n:02}")).collect();
    let ops = keys.iter().map(|key| schedule("big", key, hour, &format!("{key}-{}", "t".repeat(60_000)), json!(1))).collect();
    timers(&mut c, ops).await;

    let mut seen: Vec<String> = Vec::new();
    let mut pages = 0;
    let mut path = "/api/v1/timers/big?limit=1000".to_owned();
    loop {
        let reply = c.get(&path).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert!(reply.body.len() <= ANSWER_LIMIT, "a page of {} bytes", reply.body.len());
        let page = reply.json();
        let rows: Vec<String> =
            page["rows"].as_array().unwrap().iter().map(|row| row["timerKey"].as_str().unwrap().to_owned()).collect();
        assert!(!rows.is_empty(), "a page shows at least one timer");
        pages += 1;
        seen.extend(rows);
        if page["truncated"] == json!(false) {
            assert_eq!(page["nextAfter"], Value::Null);
            break;
        }
        assert_eq!(page["nextAfter"].as_str(), seen.last().map(String::as_str), "the next page starts after the last shown");
        path = format!("/api/v1/timers/big?limit=1000&after={}", seen.last().unwrap());
    }
    assert_eq!(seen, keys, "every timer once, in key order");
    assert!(pages >= 4, "{pages} pages for four times the limit");

    // A transactionId of control characters is six times as long in JSON.
    timers(&mut c, vec![schedule("big", "zz", hour, &"\u{1}".repeat(60_000), json!(1))]).await;
    let reply = c.get("/api/v1/timers/big?after=k19").await;
    assert_eq!(reply.status, 413, "{}", reply.text());
    assert!(reply.error().starts_with("the timer \"zz\" is "), "{}", reply.error());
    let before = c.get("/api/v1/timers/big?after=k18").await.json();
    assert_eq!((before["rows"][0]["timerKey"].clone(), before["truncated"].clone()), (json!("k19"), json!(true)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_fire_each_timer_once() {
    const TIMERS: usize = 300;
    let t = fresh_database().await;
    let gateways = [Gateway::start(&t.url()).await, Gateway::start(&t.url()).await];
    let mut clients = [gateways[0].client().await, gateways[1].client().await];
    for chunk in 0..(TIMERS / 50) {
        let ops: Vec<Value> = (0..50)
            .map(|i| {
                let n = chunk * 50 + i;
                json!({"op": "schedule", "queue": "race", "timerKey": format!("k{n}"), "delayMs": 0, "txn": format!("t{n}"),
                       "partition": format!("p{}", n % 4), "payload": b64(&json!(n))})
            })
            .collect();
        timers(&mut clients[chunk % 2], ops).await;
    }
    let messages = wait_delivered(&t, "race", TIMERS).await;
    assert_eq!(pending(&t).await, 0);
    let mut txns: Vec<&str> = messages.iter().map(|m| m.transaction_id.as_str()).collect();
    txns.sort_unstable();
    txns.dedup();
    assert_eq!((messages.len(), txns.len()), (TIMERS, TIMERS), "every timer fired exactly once");
}

/// A fire holds its timer's row from the DELETE to its COMMIT. Hold the
/// destination partition's row lock so that a fire stops between the two,
/// kill the gateway there, and check that the timer is pending again; a
/// second gateway then delivers it, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_mid_fire_leaves_the_timer_pending() {
    let t = fresh_database().await;
    let mut first = Gateway::start(&t.url()).await;
    let mut c = first.client().await;
    // The destination partition exists first, so that its row can be locked.
    c.push(vec![stile_tests::gateway::item("held", "p", Some("before"), json!(0))]).await;
    let mut blocker = t.client().await;
    let lock = blocker.transaction().await.unwrap();
    lock.execute("SELECT 1 FROM stile.partitions WHERE queue = 'held' AND name = 'p' FOR UPDATE", &[]).await.unwrap();
    timers(
        &mut c,
        vec![json!({"op": "schedule", "queue": "held", "timerKey": "k", "delayMs": 0, "txn": "fired-once",
                               "partition": "p", "payload": b64(&json!("x"))})],
    )
    .await;

    // Wait until the fire has taken the timer and waits for the partition.
    let observer = t.client().await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let waiting: i64 = observer
            .query_one(
                "SELECT count(*) AS waiting FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%stile.push%'",
                &[],
            )
            .await
            .unwrap()
            .get("waiting");
        if waiting > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the fire never reached the partition lock");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.process().kill();
    first.process().wait_exit(Duration::from_secs(10)).await;
    lock.rollback().await.unwrap();

    // The killed fire rolls back when its backend finds the client gone.
    let deadline = Instant::now() + Duration::from_secs(20);
    while pending(&t).await != 1 {
        assert!(Instant::now() < deadline, "the killed fire's timer did not come back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(delivered(&t, "held").await.len(), 1, "the killed fire stored nothing");

    let _second = Gateway::start(&t.url()).await;
    let messages = wait_delivered(&t, "held", 2).await;
    assert_eq!(messages.iter().filter(|m| m.transaction_id == "fired-once").count(), 1, "{messages:?}");
    assert_eq!(pending(&t).await, 0);
}

/// A timer rides a transaction: rolled back with it, committed with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timer_rides_the_transaction() {
    let t = fresh_database().await;
    let gw = Gateway::start(&t.url()).await;
    let mut c = gw.client().await;
    c.push(vec![stile_tests::gateway::item("orders", "Default", Some("o-1"), json!(1))]).await;
    let rolled_back = c
        .post(
            "/api/v1/transaction",
            json!({"operations": [{"type": "push", "items": [{"queue": "orders", "transactionId": "o-1", "payload": 1}]}],
                   "timers": [schedule("later", "k", 0, "t-1", json!(1))]})
            .to_string(),
        )
        .await
        .json();
    assert_eq!(rolled_back["reason"], json!("duplicate"));
    let committed = c
        .post(
            "/api/v1/transaction",
            json!({"operations": [{"type": "push", "items": [{"queue": "orders", "transactionId": "o-2", "payload": 2}]}],
                   "timers": [schedule("later", "k", 0, "t-2", json!(2))]})
            .to_string(),
        )
        .await
        .json();
    assert_eq!(committed["success"], json!(true), "{committed}");
    let messages = wait_delivered(&t, "later", 1).await;
    assert_eq!(messages.iter().map(|m| m.transaction_id.as_str()).collect::<Vec<_>>(), vec!["t-2"]);
}

/// A transaction that pushes to a partition and reschedules a timer the firer
/// has taken, while the firer waits to push that timer's message to the same
/// partition: the transaction takes its timer rows first, so it waits for the
/// fire instead of holding the partition the fire needs (a deadlock, in which
/// PostgreSQL aborts one of the two).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_waits_for_a_fire_without_holding_its_partition() {
    let t = fresh_database().await;
    let gw = Gateway::start(&t.url()).await;
    let mut c = gw.client().await;
    // Two partitions, "a" created first: a fire locks "a" before "p".
    c.push(vec![stile_tests::gateway::item("held", "a", Some("before-a"), json!(0))]).await;
    c.push(vec![stile_tests::gateway::item("held", "p", Some("before-p"), json!(0))]).await;
    let mut blocker = t.client().await;
    let lock = blocker.transaction().await.unwrap();
    lock.execute("SELECT 1 FROM stile.partitions WHERE queue = 'held' AND name = 'a' FOR UPDATE", &[]).await.unwrap();
    let due = |key: &str, partition: &str| {
        json!({"op": "schedule", "queue": "held", "timerKey": key, "delayMs": 0, "txn": key, "partition": partition,
               "payload": b64(&json!(key))})
    };
    // Applied in key order, answered in the operations' order.
    let scheduled = timers(&mut c, vec![due("to-p", "p"), due("to-a", "a")]).await;
    let keys: Vec<&Value> = scheduled.iter().map(|r| &r["timerKey"]).collect();
    assert_eq!(keys, vec![&json!("to-p"), &json!("to-a")], "{scheduled:?}");
    t.wait_for_lock_waiters(1, "the fire never reached partition a's lock").await;

    let mut other = gw.client().await;
    let transaction = tokio::spawn(async move {
        let body = json!({
            "operations": [{"type": "push", "items": [{"queue": "held", "partition": "p", "transactionId": "t-1", "payload": 1}]}],
            "timers": [{"op": "reschedule", "queue": "held", "timerKey": "to-p", "delayMs": 3_600_000, "txn": "later",
                        "partition": "p", "payload": b64(&json!("later"))}],
        });
        other.post("/api/v1/transaction", body.to_string()).await
    });
    t.wait_for_lock_waiters(2, "the transaction never waited for the fire").await;
    lock.rollback().await.unwrap();

    let reply = transaction.await.unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text());
    let answer = reply.json();
    assert_eq!(answer["success"], json!(true), "{answer}");
    let timer = &answer["results"][1];
    assert_eq!(
        (timer["type"].clone(), timer["status"].clone()),
        (json!("timer"), json!("scheduled")),
        "the fire committed first, so the timer is scheduled anew: {answer}"
    );
    let messages = wait_delivered(&t, "held", 5).await;
    let mut fired: Vec<&str> = messages.iter().map(|m| m.transaction_id.as_str()).collect();
    fired.sort_unstable();
    assert_eq!(fired, vec!["before-a", "before-p", "t-1", "to-a", "to-p"], "each fired once, in the fire that took them");
    assert_eq!(pending(&t).await, 1, "the rescheduled timer waits");
}

/// The firer sleeps until the next timer is due: with none pending it is
/// told there is none (not one due now, which would make it look again at
/// once, forever), and otherwise how long until the earliest.
#[tokio::test]
async fn the_next_due_time_is_none_without_timers_and_the_earliest_with_them() {
    let t = TestDb::new().await;
    assert_eq!(stile::timers::next_due(&t.db, &[]).await.unwrap(), None);
    let c = t.client().await;
    for (key, delay_ms) in [("late", 3_600_000_i64), ("soon", 600_000)] {
        c.execute(
            "SELECT stile.timers_apply(jsonb_build_array(jsonb_build_object('op', 'schedule', 'queue', 'q', \
             'timerKey', $1::text, 'partition', 'p0', 'txn', $1::text, 'messageId', gen_random_uuid(), \
             'payload', '{}'::jsonb, 'delayMs', $2::bigint)))",
            &[&key, &delay_ms],
        )
        .await
        .unwrap();
    }
    let due = stile::timers::next_due(&t.db, &[]).await.unwrap().expect("two timers pending");
    assert!(due > Duration::from_secs(590) && due <= Duration::from_secs(600), "{due:?}");
    c.execute("DELETE FROM stile.timers WHERE timer_key = 'soon'", &[]).await.unwrap();
    let due = stile::timers::next_due(&t.db, &[]).await.unwrap().expect("one timer pending");
    assert!(due > Duration::from_secs(3_590), "{due:?}");
}

/// The peak resident memory of a process (`VmHWM`), in bytes.
fn peak_memory(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().strip_suffix("kB"))
        .and_then(|kib| kib.trim().parse().ok())
        .expect("a VmHWM line");
    kib * 1024
}

/// When each of a queue's messages was stored (PostgreSQL's clock, ms since
/// the epoch), by transactionId, without reading the payloads.
async fn stored_at(t: &TestDb, queue: &str) -> Vec<(String, i64)> {
    let rows = t
        .client()
        .await
        .query(
            "SELECT transaction_id, floor(extract(epoch FROM created_at) * 1000)::bigint AS at \
             FROM stile.messages WHERE queue = $1",
            &[&queue],
        )
        .await
        .unwrap();
    rows.iter().map(|r| (r.get("transaction_id"), r.get("at"))).collect()
}

/// One client schedules 40 timers of 4 MB each (160 MB; one fire at a time
/// at the firer's bound of bytes), all due at one moment; a bystander
/// queue's small timers fall due one every 100 ms just after them. Each
/// bystander timer fires within the firer's tick plus a second of its time,
/// while the large ones are still firing; every large timer fires once; and
/// the gateway's peak memory grows by less than its smallest budget for
/// requests (64 MB) twice over, where one fire of all 40 would hold their
/// 160 MB several times over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_timers_do_not_hold_up_another_queues_timers() {
    const LARGE: usize = 40;
    const LARGE_BYTES: usize = 4_000_000;
    const BYSTANDERS: i64 = 10;
    let t = fresh_database().await;
    let options = GatewayOptions { body_limit: Some(6 << 20), ..GatewayOptions::default() };
    let gw = Gateway::start_with(&t.url(), &options).await;
    let mut c = gw.client().await;
    let baseline = peak_memory(gw.pid());

    // Letters that PostgreSQL cannot compress much, as a real payload's.
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let letters: String = (0..LARGE_BYTES)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            char::from(b'a' + (seed % 26) as u8)
        })
        .collect();
    let large = b64(&json!(letters));
    for i in 0..LARGE {
        let op = json!({"op": "schedule", "queue": "large", "timerKey": format!("l{i}"), "delayMs": 3_600_000,
                        "txn": format!("l{i}"), "payload": large});
        timers(&mut c, vec![op]).await;
    }
    // The large timers fall due together, two seconds from now; the
    // bystander's from 100 ms after them, one every 100 ms.
    t.client()
        .await
        .execute("UPDATE stile.timers SET deliver_at = clock_timestamp() + interval '2 s' WHERE queue = 'large'", &[])
        .await
        .unwrap();
    let ops =
        (0..BYSTANDERS).map(|i| schedule("bystander", &format!("b{i}"), 2_100 + i * 100, &format!("b{i}"), json!(i))).collect();
    let scheduled = timers(&mut c, ops).await;
    let deliver_at: std::collections::HashMap<String, i64> =
        scheduled.iter().map(|r| (r["txn"].as_str().unwrap().to_owned(), r["deliverAt"].as_i64().unwrap())).collect();

    let deadline = Instant::now() + Duration::from_secs(120);
    while stored_at(&t, "large").await.len() < LARGE || stored_at(&t, "bystander").await.len() < BYSTANDERS as usize {
        assert!(Instant::now() < deadline, "the timers did not all fire");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let large_done = stored_at(&t, "large").await.iter().map(|(_, at)| *at).max().unwrap();
    let bystanders = stored_at(&t, "bystander").await;
    let mut late_ms: Vec<(String, i64)> = bystanders.iter().map(|(txn, at)| (txn.clone(), at - deliver_at[txn])).collect();
    late_ms.sort();
    let bound_ms = stile::timers::MAX_SLEEP.as_millis() as i64 + 1_000;
    assert!(late_ms.iter().all(|(_, late)| (0..=bound_ms).contains(late)), "bystanders fired late (ms): {late_ms:?}");
    assert!(
        bystanders.iter().filter(|(_, at)| *at < large_done).count() >= 2,
        "the bystanders fired while the large timers were still firing (else this shows nothing): {late_ms:?}, \
         the last large one at {large_done}"
    );
    assert_eq!(pending(&t).await, 0);
    let grew = peak_memory(gw.pid()).saturating_sub(baseline);
    assert!(grew < 128 << 20, "the gateway's peak memory grew by {} MB", grew >> 20);
    let metrics = c.metrics().await;
    assert_eq!(metric(&metrics, "stile_timers_fired_total"), (LARGE + BYSTANDERS as usize) as f64);
}

/// Timers that cannot be fired (written by plain SQL: a payload no JSON
/// reader takes, a queue name PostgreSQL's own check refuses) are set aside
/// with their error, counted, and tried again later; every other timer fires
/// on time beside them, and the log says so in a few lines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timer_that_cannot_be_fired_is_set_aside_and_the_others_fire() {
    let t = fresh_database().await;
    let gw = Gateway::start(&t.url()).await;
    let mut c = gw.client().await;
    let sql = t.client().await;
    for (queue, key, payload) in [("poison", "unreadable", "1e999"), (&*"q".repeat(300), "refused", "1")] {
        sql.execute(
            "INSERT INTO stile.timers (queue, timer_key, partition, txn, message_id, payload, deliver_at, scheduled_at) \
             VALUES ($1, $2, 'p', $2, gen_random_uuid(), $3::text::json, now(), now())",
            &[&queue, &key, &payload],
        )
        .await
        .unwrap();
    }
    let ops = (0..20).map(|i| schedule(&format!("good{}", i % 4), &format!("k{i}"), 0, &format!("t{i}"), json!(i))).collect();
    timers(&mut c, ops).await;
    for queue in ["good0", "good1", "good2", "good3"] {
        wait_delivered(&t, queue, 5).await;
    }
    // A timer scheduled after them fires on time.
    let later = timers(&mut c, vec![schedule("later", "k", 1_000, "later", json!("on time"))]).await;
    let deliver_at = later[0]["deliverAt"].as_i64().unwrap();
    wait_delivered(&t, "later", 1).await;
    let late_ms = stored_at(&t, "later").await[0].1 - deliver_at;
    assert!(late_ms <= stile::timers::MAX_SLEEP.as_millis() as i64 + 1_000, "fired {late_ms} ms late");

    let left: Vec<String> = sql
        .query("SELECT timer_key FROM stile.timers ORDER BY timer_key", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get("timer_key"))
        .collect();
    assert_eq!(left, ["refused", "unreadable"], "the timers at fault stay pending, to be tried again");
    let metrics = c.metrics().await;
    assert!(metric(&metrics, "stile_timers_set_aside_total") >= 2.0, "{metrics}");
    assert_eq!(metric(&metrics, "stile_timers_fired_total"), 21.0);
    let logs = gw.logs();
    let lines = logs.lines().filter(|line| line.contains("WARN") && line.contains("timer")).count();
    assert!(lines <= 4, "{lines} warnings:\n{logs}");
    assert!(logs.contains("a timer cannot be fired"), "{logs}");
}
