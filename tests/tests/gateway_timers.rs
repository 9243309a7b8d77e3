//! Timers against real gateways and PostgreSQL: schedule and fire, cancel,
//! reschedule, peek and list; a past delay fires at once; two gateways fire
//! each timer once; a gateway killed mid-fire leaves the timer pending or its
//! message stored, never both and never neither.

use std::time::{Duration, Instant};

use base64::Engine as _;
use hyper::Method;
use serde_json::{Value, json};
use stile_tests::gateway::{Client, Gateway, fresh_database};
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
    assert_eq!(stile::db::timers::next_due(&t.db).await.unwrap(), None);
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
    let due = stile::db::timers::next_due(&t.db).await.unwrap().expect("two timers pending");
    assert!(due > Duration::from_secs(590) && due <= Duration::from_secs(600), "{due:?}");
    c.execute("DELETE FROM stile.timers WHERE timer_key = 'soon'", &[]).await.unwrap();
    let due = stile::db::timers::next_due(&t.db).await.unwrap().expect("one timer pending");
    assert!(due > Duration::from_secs(3_590), "{due:?}");
}
