//! Transactions over HTTP against real gateways and PostgreSQL: all or
//! nothing, a stored id rolls everything back, a repeat inside commits once,
//! a lost gate writes nothing, a retry after a commit writes nothing, acks
//! are refused, and the cache stays sound (and warm) beside them.

use serde_json::{Value, json};
use stile_tests::gateway::{Client, Gateway, GatewayOptions, fresh_database, item, metric};
use stile_tests::pg::TestDb;

async fn transaction(client: &mut Client, body: Value) -> Value {
    let reply = client.post("/api/v1/transaction", body.to_string()).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    reply.json()
}

fn push(queue: &str, partition: &str, ids: &[&str]) -> Value {
    let items: Vec<Value> = ids
        .iter()
        .map(|id| json!({"queue": queue, "partition": partition, "transactionId": id, "payload": {"id": id}}))
        .collect();
    json!({"type": "push", "items": items})
}

fn once(key: &str) -> Value {
    json!({"op": "putIfAbsent", "ns": "steps", "key": key, "value": true, "ttlSeconds": 600, "required": true})
}

/// Every stored transactionId of a partition, in offset order.
async fn stored(t: &TestDb, queue: &str, partition: &str) -> Vec<String> {
    let c = t.client().await;
    let rows = c
        .query(
            "SELECT transaction_id FROM stile.messages WHERE queue = $1 AND partition = $2 ORDER BY \"offset\"",
            &[&queue, &partition],
        )
        .await
        .unwrap();
    rows.iter().map(|r| r.get("transaction_id")).collect()
}

/// How many rows the gateway's tables hold.
#[derive(Debug, PartialEq, Eq)]
struct Counts {
    messages: i64,
    kv: i64,
    timers: i64,
}

async fn counts(t: &TestDb) -> Counts {
    let c = t.client().await;
    let row = c
        .query_one(
            "SELECT (SELECT count(*) FROM stile.messages) AS messages, (SELECT count(*) FROM stile.kv) AS kv, \
                    (SELECT count(*) FROM stile.timers) AS timers",
            &[],
        )
        .await
        .unwrap();
    Counts { messages: row.get("messages"), kv: row.get("kv"), timers: row.get("timers") }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_commits_its_pushes_keys_and_timers_together() {
    let t = fresh_database().await;
    let gw = Gateway::start(&t.url()).await;
    let mut c = gw.client().await;
    let answer = transaction(
        &mut c,
        json!({
            "operations": [push("emails", "u1", &["mail-1", "mail-1"]), push("audit", "Default", &["a-1"])],
            "requiredLeases": [],
            "kv": [once("welcome-u1")],
            "timers": [{"op": "schedule", "queue": "reminders", "timerKey": "u1", "delayMs": 3_600_000, "txn": "r-1",
                        "payload": "eyJ1IjoxfQ=="}],
        }),
    )
    .await;
    assert_eq!(answer["success"], json!(true), "{answer}");
    let results = answer["results"].as_array().unwrap();
    assert_eq!(results.len(), 5);
    assert_eq!((results[0]["type"].clone(), results[0]["index"].clone()), (json!("push"), json!(0)));
    assert!(results[0].get("duplicate").is_none());
    assert_eq!(results[1]["duplicate"], json!(true), "a repeat inside the transaction follows the first");
    assert_eq!(results[1]["messageId"], results[0]["messageId"]);
    assert_eq!(
        (results[3]["type"].clone(), results[3]["opIndex"].clone(), results[3]["applied"].clone()),
        (json!("kv"), json!(0), json!(true))
    );
    assert_eq!((results[4]["type"].clone(), results[4]["status"].clone()), (json!("timer"), json!("scheduled")));
    assert_eq!(stored(&t, "emails", "u1").await, vec!["mail-1"], "the repeat is stored once");
    assert_eq!(counts(&t).await, Counts { messages: 2, kv: 1, timers: 1 });

    // The same transaction again: its pushes are stored, so it writes nothing.
    let retry = transaction(
        &mut c,
        json!({"operations": [push("emails", "u1", &["mail-1"])], "kv": [once("another-key")],
               "timers": [{"op": "cancel", "queue": "reminders", "timerKey": "u1"}]}),
    )
    .await;
    assert_eq!((retry["success"].clone(), retry["reason"].clone()), (json!(false), json!("duplicate")), "{retry}");
    assert_eq!(retry["results"], json!([]));
    assert_eq!(
        counts(&t).await,
        Counts { messages: 2, kv: 1, timers: 1 },
        "a rolled-back transaction wrote nothing: no key, the timer still pending"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_gate_rolls_back_the_pushes_before_it() {
    let t = fresh_database().await;
    let gw = Gateway::start(&t.url()).await;
    let mut c = gw.client().await;
    let first = transaction(&mut c, json!({"operations": [push("emails", "u1", &["m-1"])], "kv": [once("step-1")]})).await;
    assert_eq!(first["success"], json!(true));
    // A redelivery with a fresh push id: the gate is what refuses it.
    let second = transaction(
        &mut c,
        json!({"operations": [push("emails", "u1", &["m-2", "m-3"])],
               "kv": [{"op": "put", "ns": "other", "key": "x", "value": 1, "forever": true}, once("step-1")]}),
    )
    .await;
    assert_eq!(second["success"], json!(false), "{second}");
    assert_eq!(second["reason"], json!("kv_precondition"));
    assert_eq!(second["failedIndex"], json!(3), "the flat index: two pushed items, then the kv rider");
    assert_eq!((second["kvReason"].clone(), second["value"].clone()), (json!("exists"), json!(true)));
    assert_eq!(stored(&t, "emails", "u1").await, vec!["m-1"], "the pushes before the lost gate were rolled back");
    assert_eq!(counts(&t).await, Counts { messages: 1, kv: 1, timers: 0 });
    // The ids of the rolled-back pushes are free: a plain push stores them.
    let answers = c.push(vec![item("emails", "u1", Some("m-2"), json!(2))]).await;
    assert!(answers[0].queued(), "{answers:?}");
}

/// A transaction may hold KV operations or timers alone, with no push.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_without_pushes_applies_its_riders() {
    let t = fresh_database().await;
    let gw = Gateway::start(&t.url()).await;
    let mut c = gw.client().await;
    let answer = transaction(&mut c, json!({"operations": [], "kv": [once("only-kv")]})).await;
    assert_eq!(answer["success"], json!(true), "{answer}");
    assert_eq!(counts(&t).await, Counts { messages: 0, kv: 1, timers: 0 });
}

/// Queues and partitions that exist, by name.
async fn names(t: &TestDb) -> Vec<String> {
    let c = t.client().await;
    let rows = c
        .query(
            "SELECT q.name || coalesce('/' || p.name, '') AS name FROM stile.queues q LEFT JOIN stile.partitions p ON p.queue = q.name
             ORDER BY 1",
            &[],
        )
        .await
        .unwrap();
    rows.iter().map(|r| r.get("name")).collect()
}

/// A rolled-back transaction leaves nothing of the queues and partitions
/// it named first: for a stored id, for a lost gate, and with many new
/// partitions at once (whose lookups are one round trip).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_transaction_leaves_no_new_queue_or_partition() {
    let t = fresh_database().await;
    let gw = Gateway::start(&t.url()).await;
    let mut c = gw.client().await;
    let first = transaction(&mut c, json!({"operations": [push("emails", "u1", &["m-1"])], "kv": [once("step-1")]})).await;
    assert_eq!(first["success"], json!(true));
    let before = names(&t).await;
    assert_eq!(before, vec!["emails/u1"]);

    let stored_id = transaction(
        &mut c,
        json!({"operations": [push("invoices", "new-1", &["i-1"]), push("emails", "u2", &["m-9"]), push("emails", "u1", &["m-1"])]}),
    )
    .await;
    assert_eq!(stored_id["reason"], json!("duplicate"), "{stored_id}");
    assert_eq!(names(&t).await, before, "the stored id rolled back the new queue and partitions");

    let lost_gate =
        transaction(&mut c, json!({"operations": [push("invoices", "new-2", &["i-2"])], "kv": [once("step-1")]})).await;
    assert_eq!(lost_gate["reason"], json!("kv_precondition"), "{lost_gate}");
    assert_eq!(names(&t).await, before, "the lost gate rolled back the new queue and partition");

    let partitions = 2_000;
    let mut operations: Vec<Value> = (0..partitions).map(|p| push("wide", &format!("p{p:05}"), &[&format!("w-{p}")])).collect();
    operations.push(push("emails", "u1", &["m-1"]));
    let started = std::time::Instant::now();
    let wide = transaction(&mut c, json!({ "operations": operations })).await;
    println!("a transaction naming {partitions} new partitions, rolled back, answered in {:?}", started.elapsed());
    assert_eq!(wide["reason"], json!("duplicate"), "{wide}");
    assert_eq!(names(&t).await, before);

    operations = (0..partitions).map(|p| push("wide", &format!("p{p:05}"), &[&format!("w-{p}")])).collect();
    let started = std::time::Instant::now();
    let committed = transaction(&mut c, json!({ "operations": operations })).await;
    println!("a transaction naming {partitions} new partitions, committed, answered in {:?}", started.elapsed());
    assert_eq!(committed["success"], json!(true), "{}", committed["error"]);
    assert_eq!(names(&t).await.len(), before.len() + partitions);
    // The ids stored in a transaction are duplicates to a plain push next.
    let again = c.push(vec![item("wide", "p01999", Some("w-1999"), json!(1))]).await;
    assert!(!again[0].queued(), "{again:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_and_bad_bodies_are_refused_and_write_nothing() {
    let t = fresh_database().await;
    let gw = Gateway::start(&t.url()).await;
    let mut c = gw.client().await;
    let cases = [
        (
            json!({"operations": [push("q", "p", &["a"]), {"type": "ack", "transactionId": "a", "partitionId": "x"}]}),
            "operations[1].type: ack is refused",
        ),
        (
            json!({"operations": [push("q", "p", &["a"]), {"type": "push", "items": [{"queue": "", "transactionId": "b"}]}]}),
            "operations[1].items[0].queue",
        ),
        (
            json!({"operations": [push("q", "p", &["a"])], "kv": [{"op": "put", "ns": "o", "key": "k", "value": 1}]}),
            "kv[0]: exactly one of",
        ),
        (
            json!({"operations": [push("q", "p", &["a"])], "timers": [{"op": "schedule", "queue": "q", "timerKey": "k", "delayMs": 1}]}),
            "timers[0].payload",
        ),
        (json!({"operations": [push("q", "p", &["a"])], "requiredLeases": ["lease-1"]}), "requiredLeases"),
        (json!({"operations": []}), "operations: the transaction has nothing to do"),
    ];
    for (body, expected) in cases {
        let reply = c.post("/api/v1/transaction", body.to_string()).await;
        assert_eq!(reply.status, 400, "{body}: {}", reply.text());
        assert!(reply.error().starts_with(expected), "{body}: {}", reply.error());
    }
    assert_eq!(counts(&t).await, Counts { messages: 0, kv: 0, timers: 0 });
}

/// Plain pushes and transactions into the same partitions through one
/// gateway: every id already stored answers duplicate whichever way it was
/// stored, and the cache is told of each transaction's segments, so it is
/// not rebuilt once per transaction and keeps skipping the probe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_keep_the_cache_sound_and_warm() {
    const ROUNDS: usize = 60;
    let t = fresh_database().await;
    let gw = Gateway::start_with(&t.url(), &GatewayOptions { shards: Some(1), ..GatewayOptions::default() }).await;
    let mut c = gw.client().await;
    c.push(vec![item("q", "p", Some("seed"), json!(0))]).await;
    for round in 0..ROUNDS {
        let tx_id = format!("tx-{round}");
        let answer = transaction(&mut c, json!({"operations": [push("q", "p", &[&tx_id])]})).await;
        assert_eq!(answer["success"], json!(true), "{answer}");
        let plain = format!("plain-{round}");
        let answers = c.push(vec![item("q", "p", Some(&plain), json!(1)), item("q", "p", Some(&tx_id), json!(1))]).await;
        assert!(answers[0].queued(), "round {round}: {answers:?}");
        assert!(answers[1].duplicate(), "round {round}: the transaction's id must answer duplicate: {answers:?}");
        let replay = transaction(&mut c, json!({"operations": [push("q", "p", &[&plain])]})).await;
        assert_eq!(replay["reason"], json!("duplicate"), "round {round}: {replay}");
    }
    let text = c.metrics().await;
    let installed = metric(&text, "stile_hydrations_total{outcome=\"installed\"}");
    assert!(installed <= 3.0, "{installed} hydrations for {ROUNDS} transactions:\n{text}");
    // Per round: the transaction's segment, the plain push's and the
    // replay's, each vouched for (skipped) or probed only above the vouch.
    let vouched =
        metric(&text, "stile_segments_total{probe=\"skipped\"}") + metric(&text, "stile_segments_total{probe=\"narrowed\"}");
    assert!(vouched >= (2 * ROUNDS) as f64, "the cache stopped vouching beside transactions:\n{text}");
    assert_eq!(stored(&t, "q", "p").await.len(), 1 + 2 * ROUNDS);
    assert_eq!(metric(&text, "stile_transactions_total{outcome=\"committed\"}"), ROUNDS as f64);
    assert_eq!(metric(&text, "stile_transactions_total{outcome=\"duplicate\"}"), ROUNDS as f64);
}

/// Many clients at once, each transaction pushing to a few shared partitions,
/// writing a few shared keys and scheduling due timers on a few shared keys,
/// each in an order of its own, while the firer pushes the timers' messages
/// to the same partitions: every transaction commits (rows are locked in one
/// order, so no two wait for each other in a cycle) and every pushed id is
/// stored once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_transactions_naming_shared_rows_in_any_order_all_commit() {
    use rand::SeedableRng as _;
    use rand::seq::SliceRandom as _;
    const CLIENTS: usize = 8;
    const TRANSACTIONS: usize = 40;
    let t = fresh_database().await;
    let gw = Gateway::start(&t.url()).await;
    let mut clients = Vec::new();
    for client in 0..CLIENTS {
        let mut c = gw.client().await;
        clients.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(client as u64);
            let mut failures = Vec::new();
            for n in 0..TRANSACTIONS {
                let mut partitions = ["p0", "p1", "p2", "p3"];
                let mut keys = ["k0", "k1", "k2", "k3", "k4"];
                let mut timer_keys = ["t0", "t1", "t2", "t3", "t4"];
                partitions.shuffle(&mut rng);
                keys.shuffle(&mut rng);
                timer_keys.shuffle(&mut rng);
                let operations: Vec<Value> =
                    partitions[..2].iter().map(|p| push("mix", p, &[&format!("{client}-{n}-{p}")])).collect();
                let kv: Vec<Value> =
                    keys[..3].iter().map(|k| json!({"op": "put", "ns": "mix", "key": k, "value": n, "forever": true})).collect();
                let timers: Vec<Value> = timer_keys[..2]
                    .iter()
                    .zip(partitions)
                    .map(|(key, p)| {
                        json!({"op": "schedule", "queue": "mix", "timerKey": key, "delayMs": 0, "partition": p,
                               "txn": format!("timer-{client}-{n}-{key}"), "payload": "MQ=="})
                    })
                    .collect();
                let body = json!({"operations": operations, "kv": kv, "timers": timers});
                let reply = c.post("/api/v1/transaction", body.to_string()).await;
                if reply.status != 200 || reply.json()["success"] != json!(true) {
                    failures.push(format!("{} {}", reply.status, reply.text()));
                }
            }
            failures
        }));
    }
    let mut failures = Vec::new();
    for client in clients {
        failures.extend(client.await.unwrap());
    }
    assert!(failures.is_empty(), "{} of {} transactions failed: {:?}", failures.len(), CLIENTS * TRANSACTIONS, failures);
    let c = t.client().await;
    let pushed: i64 = c
        .query_one(
            "SELECT count(DISTINCT transaction_id) AS n FROM stile.messages WHERE queue = 'mix' AND transaction_id NOT LIKE 'timer-%'",
            &[],
        )
        .await
        .unwrap()
        .get("n");
    let stored: i64 = c
        .query_one("SELECT count(*) AS n FROM stile.messages WHERE queue = 'mix' AND transaction_id NOT LIKE 'timer-%'", &[])
        .await
        .unwrap()
        .get("n");
    assert_eq!((pushed, stored), ((CLIENTS * TRANSACTIONS * 2) as i64, (CLIENTS * TRANSACTIONS * 2) as i64));
}

/// One request that names 10,000 new partitions costs the log a few lines
/// at most, whichever way it comes: a transaction (its partitions are
/// planned for before it commits, so their rows cannot be read yet), a plain
/// push, and timers fired into new partitions. The gateway is stopped
/// before its log is read, so that every line it would write is in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_naming_ten_thousand_new_partitions_write_a_few_log_lines() {
    const PARTITIONS: usize = 10_000;
    let t = fresh_database().await;
    let mut gw = Gateway::start(&t.url()).await;
    let mut c = gw.client().await;
    let items = |queue: &str| -> Vec<Value> {
        (0..PARTITIONS)
            .map(|i| json!({"queue": queue, "partition": format!("p{i}"), "transactionId": format!("t{i}"), "payload": i}))
            .collect()
    };
    let answer = transaction(&mut c, json!({"operations": [{"type": "push", "items": items("wide")}]})).await;
    assert_eq!(answer["success"], json!(true), "{answer}");
    let pushed = c.push(items("pushed")).await;
    assert!(pushed.iter().all(|a| a.queued()), "every item of the push was stored");
    let timers: Vec<Value> = (0..200)
        .map(|i| {
            json!({"op": "schedule", "queue": "fired", "timerKey": format!("k{i}"), "partition": format!("p{i}"), "delayMs": 0,
                   "txn": format!("t{i}"), "payload": "MQ=="})
        })
        .collect();
    let reply = c.post("/api/v1/timers", json!({ "operations": timers }).to_string()).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let c2 = t.client().await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let fired: i64 =
            c2.query_one("SELECT count(*) AS n FROM stile.messages WHERE queue = 'fired'", &[]).await.unwrap().get("n");
        if fired == 200 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{fired} of 200 timers fired");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(counts(&t).await.messages, 2 * PARTITIONS as i64 + 200);

    gw.process().terminate();
    gw.process().wait_exit(std::time::Duration::from_secs(60)).await;
    let logs = gw.logs();
    let warnings: Vec<&str> = logs.lines().filter(|line| line.contains("WARN") || line.contains("ERROR")).collect();
    assert!(warnings.len() <= 3, "{} warnings:\n{}", warnings.len(), warnings.join("\n"));
    assert!(logs.len() < 16 << 10, "the log holds {} bytes", logs.len());
}
