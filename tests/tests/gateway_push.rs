//! The gateway's push answers over HTTP, against a real gateway process on a
//! fresh database: retries, repeats, scope, races, pushes without an id, and
//! the window as configured.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::{Value, json};
use stile_tests::gateway::{Answer, Gateway, GatewayOptions, fresh_database, item, metric};
use stile_tests::pg::TestDb;
use tokio::sync::Barrier;

/// `(messages in segments, txns hashes)` of a queue, straight from SQL.
async fn stored_counts(t: &TestDb, queue: &str) -> (i64, i64) {
    let c = t.client().await;
    let row = c
        .query_one(
            "SELECT (SELECT coalesce(sum(s.end_offset - s.base_offset + 1), 0)::bigint \
                       FROM stile.segments s JOIN stile.partitions p ON p.id = s.partition_id WHERE p.queue = $1) AS messages, \
                    (SELECT coalesce(sum(length(x.hashes) / 16), 0)::bigint \
                       FROM stile.txns x JOIN stile.partitions p ON p.id = x.partition_id WHERE p.queue = $1) AS hashes",
            &[&queue],
        )
        .await
        .expect("count a queue's rows");
    (row.get("messages"), row.get("hashes"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_push_answers_duplicate_with_the_original_and_appends_nothing() {
    let t = fresh_database().await;
    let gw = Gateway::start(&t.url()).await;
    let mut client = gw.client().await;

    let first = client.push(vec![item("payments", "customer-42", Some("order-9137-paid"), json!({"orderId": 9137}))]).await;
    assert_eq!(first[0].status, "queued");
    assert_eq!(first[0].offset, 0);
    assert_eq!((first[0].queue.as_str(), first[0].partition.as_str()), ("payments", "customer-42"));
    assert_eq!(first[0].transaction_id, "order-9137-paid");

    for _ in 0..3 {
        let retry = client.push(vec![item("payments", "customer-42", Some("order-9137-paid"), json!({"orderId": 9137}))]).await;
        assert_eq!(retry[0].status, "duplicate");
        assert_eq!((&retry[0].message_id, retry[0].offset), (&first[0].message_id, 0));
        assert_eq!(retry[0].transaction_id, "order-9137-paid");
    }
    // A retry from another connection is answered the same way.
    let mut other = gw.client().await;
    let retry = other.push(vec![item("payments", "customer-42", Some("order-9137-paid"), json!(null))]).await;
    assert_eq!((retry[0].status.as_str(), &retry[0].message_id, retry[0].offset), ("duplicate", &first[0].message_id, 0));

    let stored = client.messages("payments", "customer-42", 0).await;
    assert_eq!(stored.len(), 1, "{stored:?}");
    assert_eq!(stored[0].message_id, first[0].message_id);
    assert_eq!(stored[0].payload, json!({"orderId": 9137}), "the original's payload");
    assert_eq!(stored_counts(&t, "payments").await, (1, 1));
    let c = t.client().await;
    let last: i64 =
        c.query_one("SELECT last_offset FROM stile.partitions WHERE queue = 'payments'", &[]).await.unwrap().get("last_offset");
    assert_eq!(last, 0, "a duplicate does not move the allocator");

    // The next new id gets the next offset.
    let next = client.push(vec![item("payments", "customer-42", Some("order-9138-paid"), json!(null))]).await;
    assert_eq!((next[0].status.as_str(), next[0].offset), ("queued", 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_are_stored_as_the_text_sent() {
    let t = fresh_database().await;
    let gw = Gateway::start(&t.url()).await;
    let mut client = gw.client().await;
    // Spacing, key order, an integer no double holds exactly and an escape:
    // what a decoded tree would have normalised.
    let payload = r#"{ "z": 123456789012345678901234567890, "a": [1.50, "\u00e9"] }"#;
    let body = format!(r#"{{"items":[{{"queue":"raw","transactionId":"r-1","payload":{payload}}},{{"queue":"raw"}}]}}"#);
    let reply = client.post("/api/v1/push", body).await;
    assert_eq!(reply.status, 201, "{}", reply.text());
    let c = t.client().await;
    let stored: Vec<Option<String>> = c
        .query_one("SELECT s.payloads::text[] AS payloads FROM stile.segments s JOIN stile.partitions p ON p.id = s.partition_id WHERE p.queue = 'raw'", &[])
        .await
        .unwrap()
        .get("payloads");
    assert_eq!(stored, [Some(payload.to_owned()), Some("null".to_owned())]);
    // And read back as stored, by both read endpoints.
    let listed = client.get("/api/v1/messages?queue=raw&partition=Default").await;
    assert_eq!(listed.status, 200, "{}", listed.text());
    assert!(listed.text().contains(&format!(r#""payload":{payload}"#)), "{}", listed.text());
    assert!(listed.text().contains(r#""payload":null"#), "{}", listed.text());
    let one = client.get("/api/v1/messages/by-transaction-id?queue=raw&partition=Default&transactionId=r-1").await;
    assert_eq!(one.status, 200, "{}", one.text());
    assert!(one.text().contains(&format!(r#""payload":{payload}"#)), "{}", one.text());
    // What no reader could decode is refused by name, and nothing of the
    // request is written.
    for bad in [r#"[1e400]"#, r#""\ud800""#] {
        let body = format!(r#"{{"items":[{{"queue":"raw","transactionId":"r-2"}},{{"queue":"raw","payload":{bad}}}]}}"#);
        let reply = client.post("/api/v1/push", body).await;
        assert_eq!(reply.status, 400, "{}", reply.text());
        assert!(reply.error().starts_with("items[1].payload: malformed JSON"), "{}", reply.error());
    }
    assert_eq!(stored_counts(&t, "raw").await, (2, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_mixing_stored_and_new_ids_stores_the_new_ones_in_order_in_one_segment() {
    let t = fresh_database().await;
    let gw = Gateway::start(&t.url()).await;
    let mut client = gw.client().await;
    let first = client.push(vec![item("q", "p", Some("a"), json!("a")), item("q", "p", Some("b"), json!("b"))]).await;
    assert!(first.iter().all(Answer::queued));
    let segments = |text: &str| {
        ["skipped", "narrowed", "full"]
            .iter()
            .map(|p| metric(text, &format!("stile_segments_total{{probe=\"{p}\"}}")))
            .sum::<f64>()
    };
    let before = segments(&client.metrics().await);

    let ids = ["c", "b", "d", "a", "e"];
    let answers = client.push(ids.iter().map(|id| item("q", "p", Some(id), json!(id))).collect()).await;
    let got: Vec<(&str, i64)> = answers.iter().map(|a| (a.status.as_str(), a.offset)).collect();
    assert_eq!(got, vec![("queued", 2), ("duplicate", 1), ("queued", 3), ("duplicate", 0), ("queued", 4)]);
    assert_eq!(answers[1].message_id, first[1].message_id);
    assert_eq!(answers[3].message_id, first[0].message_id);
    // The duplicates wrote nothing; the new ones went in the same segment
    // as the retried ones, in one round trip, not sent again after it.
    assert_eq!(segments(&client.metrics().await) - before, 1.0);
    let stored = client.messages("q", "p", 0).await;
    let order: Vec<(i64, &str)> = stored.iter().map(|m| (m.offset, m.transaction_id.as_str())).collect();
    assert_eq!(order, vec![(0, "a"), (1, "b"), (2, "c"), (3, "d"), (4, "e")]);
    assert_eq!(stored[2].message_id, answers[0].message_id);
    assert_eq!(stored_counts(&t, "q").await, (5, 5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_ids_among_new_ones_are_probed_apart_and_everything_stays_in_order() {
    let t = fresh_database().await;
    let gw = Gateway::start(&t.url()).await;
    let mut client = gw.client().await;
    let first = client.push(["x", "a", "b"].iter().map(|id| item("q", "p", Some(id), json!(id))).collect()).await;
    assert!(first.iter().all(Answer::queued));
    // The partition hydrates after its first push, and the next push waits
    // for that: the cache plans it with the partition's whole window.
    let probes =
        |text: &str| ["skipped", "narrowed", "full"].map(|p| metric(text, &format!("stile_segments_total{{probe=\"{p}\"}}")));
    let before = probes(&client.metrics().await);

    // The stored ids form one run among new ones: cut around it, the ids
    // before it are vouched for, the run is probed from just below its
    // originals, and the ids after it only against what this bundle wrote
    // before them. No piece reads the whole window.
    let ids = ["c", "d", "a", "b", "e"];
    let answers = client.push(ids.iter().map(|id| item("q", "p", Some(id), json!(id))).collect()).await;
    let got: Vec<(&str, i64)> = answers.iter().map(|a| (a.status.as_str(), a.offset)).collect();
    assert_eq!(got, vec![("queued", 3), ("queued", 4), ("duplicate", 1), ("duplicate", 2), ("queued", 5)]);
    assert_eq!((&answers[2].message_id, &answers[3].message_id), (&first[1].message_id, &first[2].message_id));
    let after = probes(&client.metrics().await);
    let delta: Vec<f64> = after.iter().zip(before).map(|(a, b)| a - b).collect();
    assert_eq!(delta, vec![1.0, 2.0, 0.0], "segments skipped, narrowed, full");
    let stored = client.messages("q", "p", 0).await;
    let order: Vec<(i64, &str)> = stored.iter().map(|m| (m.offset, m.transaction_id.as_str())).collect();
    assert_eq!(order, vec![(0, "x"), (1, "a"), (2, "b"), (3, "c"), (4, "d"), (5, "e")]);
    assert_eq!(stored_counts(&t, "q").await.0, 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeats_in_one_request_follow_the_first_and_other_partitions_are_other_messages() {
    let t = fresh_database().await;
    let gw = Gateway::start(&t.url()).await;
    let mut client = gw.client().await;

    let answers = client
        .push(vec![
            item("q", "p", Some("a"), json!(1)),
            item("q", "p", Some("b"), json!(2)),
            item("q", "p", Some("a"), json!(3)),
            item("q", "other", Some("a"), json!(4)),
            item("q", "p", Some("a"), json!(5)),
            item("q2", "p", Some("a"), json!(6)),
        ])
        .await;
    let statuses: Vec<&str> = answers.iter().map(|a| a.status.as_str()).collect();
    assert_eq!(statuses, ["queued", "queued", "duplicate", "queued", "duplicate", "queued"]);
    for (i, answer) in answers.iter().enumerate() {
        assert_eq!(answer.index, i as u64);
    }
    for repeat in [&answers[2], &answers[4]] {
        assert_eq!((&repeat.message_id, repeat.offset), (&answers[0].message_id, answers[0].offset));
        assert_eq!(repeat.partition, "p");
    }
    assert_eq!(answers[3].offset, 0, "the same id in another partition is queued there, at its own first offset");
    assert_eq!(answers[5].offset, 0, "and in another queue");
    let distinct: HashSet<&str> = [0, 1, 3, 5].iter().map(|&i| answers[i].message_id.as_str()).collect();
    assert_eq!(distinct.len(), 4);

    let stored = client.messages("q", "p", 0).await;
    let stored: Vec<(&str, &Value)> = stored.iter().map(|m| (m.transaction_id.as_str(), &m.payload)).collect();
    assert_eq!(stored, [("a", &json!(1)), ("b", &json!(2))], "the first occurrence is stored, once");
    assert_eq!(client.messages("q", "other", 0).await.len(), 1);
    assert_eq!(stored_counts(&t, "q").await, (3, 3));

    // Across requests, per partition: each partition answers for its own.
    let again = client.push(vec![item("q", "other", Some("a"), json!(7)), item("q", "p", Some("a"), json!(8))]).await;
    assert!(again.iter().all(Answer::duplicate));
    assert_eq!((again[0].partition.as_str(), again[0].message_id.as_str()), ("other", answers[3].message_id.as_str()));
    assert_eq!((again[1].partition.as_str(), again[1].message_id.as_str()), ("p", answers[0].message_id.as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_concurrent_pushes_of_one_id_store_it_once() {
    let threads = eight_concurrent_pushes_of_one_id(&GatewayOptions::default()).await;
    assert!(!threads.iter().any(|name| name.starts_with("stile-shard")), "{threads:?}");
}

/// The same race with each shard's worker on a thread of its own (the
/// default is a task of the serving runtime).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_concurrent_pushes_of_one_id_store_it_once_with_shards_on_threads_of_their_own() {
    let options = GatewayOptions { extra_args: vec!["--shard-placement".into(), "thread".into()], ..GatewayOptions::default() };
    let threads = eight_concurrent_pushes_of_one_id(&options).await;
    assert!(threads.iter().any(|name| name == "stile-shard-0"), "{threads:?}");
}

/// Runs the race; answers the names of the gateway's threads at its end.
async fn eight_concurrent_pushes_of_one_id(options: &GatewayOptions) -> Vec<String> {
    const TASKS: usize = 8;
    const ROUNDS: usize = 12;
    let t = fresh_database().await;
    let gw = Gateway::start_with(&t.url(), options).await;
    let mut clients = Vec::new();
    for _ in 0..TASKS {
        clients.push(gw.client().await);
    }
    let barrier = Arc::new(Barrier::new(TASKS));
    let mut tasks = Vec::new();
    for (task, mut client) in clients.into_iter().enumerate() {
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            let mut answers = Vec::new();
            for round in 0..ROUNDS {
                barrier.wait().await;
                let id = format!("race-{round}");
                let mut answer = client.push(vec![item("race", "p", Some(&id), json!({ "task": task }))]).await;
                answers.push(answer.remove(0));
            }
            answers
        }));
    }
    let mut by_task = Vec::new();
    for task in tasks {
        by_task.push(task.await.expect("a pushing task"));
    }

    let mut client = gw.client().await;
    let stored = client.messages("race", "p", 0).await;
    assert_eq!(stored.len(), ROUNDS, "one message per round: {stored:?}");
    for round in 0..ROUNDS {
        let answers: Vec<&Answer> = by_task.iter().map(|answers| &answers[round]).collect();
        let winners: Vec<usize> = (0..TASKS).filter(|&task| answers[task].queued()).collect();
        assert_eq!(winners.len(), 1, "round {round}: exactly one queued: {answers:?}");
        let winner = answers[winners[0]];
        for answer in &answers {
            assert_eq!(answer.transaction_id, format!("race-{round}"));
            assert_eq!((&answer.message_id, answer.offset), (&winner.message_id, winner.offset), "round {round}");
        }
        let message = stored.iter().find(|m| m.offset == winner.offset).expect("the winner's offset is stored");
        assert_eq!(message.message_id, winner.message_id);
        assert_eq!(message.transaction_id, format!("race-{round}"));
        assert_eq!(message.payload, json!({ "task": winners[0] }), "the winner's payload is the one stored");
    }
    let offsets: HashSet<i64> = stored.iter().map(|m| m.offset).collect();
    assert_eq!(offsets, (0..ROUNDS as i64).collect(), "offsets are dense");
    assert_eq!(stored_counts(&t, "race").await, (ROUNDS as i64, ROUNDS as i64));
    thread_names(gw.pid())
}

/// Replays of many stored ids, one per request, sent at once by many
/// connections to one partition: the shard coalesces them into segments of
/// hits only, led by several requests (cut per request where the cache
/// floors them apart), and every replay answers duplicate with its own
/// original's id and offset, and nothing is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_replays_of_stored_ids_each_answer_their_own_original() {
    const TASKS: usize = 8;
    const ROUNDS: usize = 10;
    let t = fresh_database().await;
    let gw = Gateway::start(&t.url()).await;
    let mut client = gw.client().await;
    let mut originals = Vec::new();
    for i in 0..TASKS * ROUNDS {
        let id = format!("stored-{i}");
        originals.push(client.push(vec![item("replay", "p", Some(&id), json!(i))]).await.remove(0));
    }
    assert!(originals.iter().all(Answer::queued));
    let barrier = Arc::new(Barrier::new(TASKS));
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let (barrier, mut client) = (barrier.clone(), gw.client().await);
        tasks.push(tokio::spawn(async move {
            let mut answers = Vec::new();
            for round in 0..ROUNDS {
                barrier.wait().await;
                // Scattered over the stored range, each task its own ids.
                let i = (round * TASKS + task) * 37 % (TASKS * ROUNDS);
                let id = format!("stored-{i}");
                answers.push((i, client.push(vec![item("replay", "p", Some(&id), json!("again"))]).await.remove(0)));
            }
            answers
        }));
    }
    for task in tasks {
        for (i, answer) in task.await.expect("a replaying task") {
            assert_eq!(answer.status, "duplicate", "stored-{i}: {answer:?}");
            let original = &originals[i];
            assert_eq!((&answer.message_id, answer.offset), (&original.message_id, original.offset), "stored-{i}");
        }
    }
    let count = (TASKS * ROUNDS) as i64;
    assert_eq!(stored_counts(&t, "replay").await, (count, count));
}

/// A redelivery storm: requests replaying many ids stored by different
/// requests, in no order, to two partitions at once (so that a bundle can
/// carry several segments of replays, each hash floored by the cache on its
/// own). Every replay answers duplicate with its own original's id and
/// offset, and nothing is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_replaying_ids_of_many_requests_answer_each_with_its_original() {
    const STORED_REQUESTS: usize = 6;
    const PER_REQUEST: usize = 40;
    const TASKS: usize = 4;
    const ROUNDS: usize = 5;
    const STORED: usize = STORED_REQUESTS * PER_REQUEST;
    let t = fresh_database().await;
    let gw = Gateway::start(&t.url()).await;
    let mut client = gw.client().await;
    let mut originals: Vec<Vec<Answer>> = Vec::new();
    for partition in ["a", "b"] {
        let mut stored = Vec::new();
        for request in 0..STORED_REQUESTS {
            let items = (0..PER_REQUEST)
                .map(|k| {
                    let i = request * PER_REQUEST + k;
                    item("storm", partition, Some(&format!("{partition}-{i}")), json!(i))
                })
                .collect();
            stored.extend(client.push(items).await);
        }
        assert!(stored.iter().all(Answer::queued));
        originals.push(stored);
    }
    let barrier = Arc::new(Barrier::new(TASKS));
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let (barrier, mut client) = (barrier.clone(), gw.client().await);
        tasks.push(tokio::spawn(async move {
            // Answers are checked once every task is done: a task that
            // stopped early would leave the others waiting at the barrier.
            let mut answered = Vec::new();
            for round in 0..ROUNDS {
                barrier.wait().await;
                // 25 ids scattered over every stored request, in no order.
                let picks: Vec<usize> = (0..25).map(|k| (k * 97 + round * 31 + task * 13) % STORED).collect();
                let partition = ["a", "b"][task % 2];
                let items =
                    picks.iter().map(|i| item("storm", partition, Some(&format!("{partition}-{i}")), json!("again"))).collect();
                answered.push((task % 2, picks, client.try_push(items).await));
            }
            answered
        }));
    }
    for task in tasks {
        for (partition, picks, answers) in task.await.expect("a replaying task") {
            let answers = answers.expect("a push of replays");
            assert_eq!(answers.len(), picks.len());
            for (i, answer) in picks.into_iter().zip(answers) {
                let original = &originals[partition][i];
                assert_eq!(answer.status, "duplicate", "{partition}/{i}: {answer:?}");
                assert_eq!((&answer.message_id, answer.offset), (&original.message_id, original.offset), "{partition}/{i}");
            }
        }
    }
    assert_eq!(stored_counts(&t, "storm").await, (2 * STORED as i64, 2 * STORED as i64));
}

/// A retry storm beside fresh traffic: single-message requests replaying
/// stored ids and pushing new ones to the same partitions at once, so that
/// the shard's bundles hold segments of both (replays judged without the
/// lock, fresh ids under it, in one call). Every replay answers duplicate
/// with its own original; every new id is stored once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_beside_fresh_pushes_answer_their_originals_and_fresh_ids_are_stored_once() {
    const PARTITIONS: usize = 4;
    const STORED: usize = 40;
    const TASKS: usize = 16;
    const ROUNDS: usize = 20;
    let t = fresh_database().await;
    let gw = Gateway::start_with(&t.url(), &GatewayOptions { shards: Some(1), ..GatewayOptions::default() }).await;
    let mut client = gw.client().await;
    let mut originals: Vec<Answer> = Vec::new();
    for i in 0..PARTITIONS * STORED {
        let partition = format!("p{}", i % PARTITIONS);
        originals.push(client.push(vec![item("mixed", &partition, Some(&format!("stored-{i}")), json!(i))]).await.remove(0));
    }
    assert!(originals.iter().all(Answer::queued));
    let originals = Arc::new(originals);
    let barrier = Arc::new(Barrier::new(TASKS));
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let (barrier, originals, mut client) = (barrier.clone(), originals.clone(), gw.client().await);
        tasks.push(tokio::spawn(async move {
            // Answers are checked once every task is done: a task that
            // stopped early would leave the others waiting at the barrier.
            let mut answered = Vec::new();
            for round in 0..ROUNDS {
                barrier.wait().await;
                let (i, partition, id) = if task % 2 == 0 {
                    let i = (round * TASKS + task) * 37 % originals.len();
                    (Some(i), format!("p{}", i % PARTITIONS), format!("stored-{i}"))
                } else {
                    (None, format!("p{}", task % PARTITIONS), format!("fresh-{round}-{task}"))
                };
                let answer = client.try_push(vec![item("mixed", &partition, Some(&id), json!(round))]).await;
                answered.push((i, id, answer));
            }
            answered
        }));
    }
    let mut fresh = 0;
    for task in tasks {
        for (i, id, answer) in task.await.expect("a pushing task") {
            let answer = answer.expect("a push").remove(0);
            match i {
                Some(i) => {
                    let original = &originals[i];
                    assert_eq!(answer.status, "duplicate", "{id}: {answer:?}");
                    assert_eq!((&answer.message_id, answer.offset), (&original.message_id, original.offset), "{id}");
                }
                None => {
                    assert_eq!(answer.status, "queued", "{id}: {answer:?}");
                    fresh += 1;
                }
            }
        }
    }
    let stored = (PARTITIONS * STORED + fresh) as i64;
    assert_eq!(stored_counts(&t, "mixed").await, (stored, stored));
    let c = t.client().await;
    let twice: i64 = c
        .query_one(
            "SELECT count(*) FROM (SELECT partition, transaction_id FROM stile.messages WHERE queue = 'mixed' \
              GROUP BY 1, 2 HAVING count(*) > 1) AS d",
            &[],
        )
        .await
        .expect("count ids stored twice")
        .get(0);
    assert_eq!(twice, 0, "no id is stored twice");
}

/// The names of a process's threads, as Linux reports them.
fn thread_names(pid: i32) -> Vec<String> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the gateway's threads");
    tasks
        .map(|task| {
            std::fs::read_to_string(task.expect("a thread").path().join("comm")).expect("a thread's name").trim().to_owned()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushes_without_a_transaction_id_are_all_stored_under_their_message_id() {
    let t = fresh_database().await;
    let gw = Gateway::start(&t.url()).await;
    let mut client = gw.client().await;

    let mut answers = Vec::new();
    for _ in 0..3 {
        let same = json!({"same": "payload"});
        let items =
            vec![item("anon", "p", None, same.clone()), item("anon", "p", None, same.clone()), item("anon", "p", None, same)];
        answers.extend(client.push(items).await);
    }
    // An explicit null is the same as no id.
    answers.extend(client.push(vec![json!({"queue": "anon", "partition": "p", "transactionId": null, "payload": 1})]).await);
    assert!(answers.iter().all(Answer::queued), "{answers:?}");
    for answer in &answers {
        assert_eq!(answer.transaction_id, answer.message_id, "the message id stands in for the transactionId");
        assert_eq!(uuid::Uuid::parse_str(&answer.message_id).expect("a UUID").get_version_num(), 7);
    }
    let offsets: Vec<i64> = answers.iter().map(|a| a.offset).collect();
    assert_eq!(offsets, (0..10).collect::<Vec<i64>>());
    let stored = client.messages("anon", "p", 0).await;
    assert_eq!(stored.len(), 10);
    for (message, answer) in stored.iter().zip(&answers) {
        assert_eq!((&message.message_id, &message.transaction_id), (&answer.message_id, &answer.message_id));
    }
    assert_eq!(stored_counts(&t, "anon").await, (10, 10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_shortened_by_configure_takes_effect_and_window_zero_turns_dedup_off() {
    let t = fresh_database().await;
    let gw = Gateway::start(&t.url()).await;
    let mut client = gw.client().await;
    let c = t.client().await;
    let age_rows = "UPDATE stile.txns SET created_at = created_at - interval '10 seconds' \
                    WHERE partition_id IN (SELECT id FROM stile.partitions WHERE queue = 'win')";

    let first = client.push(vec![item("win", "p", Some("x"), json!(1))]).await;
    assert_eq!((first[0].status.as_str(), first[0].offset), ("queued", 0));
    // Ten seconds old: still inside the default window of an hour.
    c.execute(age_rows, &[]).await.unwrap();
    let retry = client.push(vec![item("win", "p", Some("x"), json!(2))]).await;
    assert_eq!((retry[0].status.as_str(), &retry[0].message_id, retry[0].offset), ("duplicate", &first[0].message_id, 0));

    let options = client.configure("win", json!({"dedupWindowSeconds": 1})).await;
    assert_eq!(options["dedupWindowSeconds"], json!(1));
    // The original is now ten seconds old, outside a window of one second.
    let after = client.push(vec![item("win", "p", Some("x"), json!(3))]).await;
    assert_eq!((after[0].status.as_str(), after[0].offset), ("queued", 1), "outside the window the id is a new message");
    assert_ne!(after[0].message_id, first[0].message_id);
    // Aged again, the newer copy is outside the window too.
    c.execute(age_rows, &[]).await.unwrap();
    let again = client.push(vec![item("win", "p", Some("x"), json!(4))]).await;
    assert_eq!((again[0].status.as_str(), again[0].offset), ("queued", 2));
    assert_eq!(stored_counts(&t, "win").await, (3, 3));

    // Window 0: repeats across requests are stored, repeats inside one
    // request are still collapsed.
    let options = client.configure("w0", json!({"dedupWindowSeconds": 0})).await;
    assert_eq!(options["dedupWindowSeconds"], json!(0));
    let one = client.push(vec![item("w0", "p", Some("x"), json!(1))]).await;
    let two = client.push(vec![item("w0", "p", Some("x"), json!(2))]).await;
    assert_eq!((one[0].status.as_str(), one[0].offset), ("queued", 0));
    assert_eq!((two[0].status.as_str(), two[0].offset), ("queued", 1));
    let inside = client
        .push(vec![
            item("w0", "p", Some("y"), json!(3)),
            item("w0", "p", Some("y"), json!(4)),
            item("w0", "p", Some("x"), json!(5)),
        ])
        .await;
    let inside: Vec<(&str, i64)> = inside.iter().map(|a| (a.status.as_str(), a.offset)).collect();
    assert_eq!(inside, [("queued", 2), ("duplicate", 2), ("queued", 3)]);
    let stored: Vec<(String, Value)> =
        client.messages("w0", "p", 0).await.into_iter().map(|m| (m.transaction_id, m.payload)).collect();
    assert_eq!(
        stored,
        [("x".into(), json!(1)), ("x".into(), json!(2)), ("y".into(), json!(3)), ("x".into(), json!(5))],
        "txns are written even with the window at 0"
    );
    assert_eq!(stored_counts(&t, "w0").await, (4, 4));
    assert!(metric(&client.metrics().await, "stile_segments_total{probe=\"off\"}") >= 3.0);

    // Back to a window: the ids stored meanwhile are found again.
    client.configure("w0", json!({"dedupWindowSeconds": 3600})).await;
    let back = client.push(vec![item("w0", "p", Some("y"), json!(6))]).await;
    assert_eq!((back[0].status.as_str(), back[0].offset), ("duplicate", 2));
    let back = client.push(vec![item("w0", "p", Some("x"), json!(7))]).await;
    assert_eq!((back[0].status.as_str(), back[0].offset), ("duplicate", 0), "the first occurrence in the window is the original");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_warm_up_the_probe_is_skipped_for_nearly_every_segment() {
    const PARTITIONS: usize = 4;
    const REQUESTS: usize = 300;
    let t = fresh_database().await;
    let gw = Gateway::start(&t.url()).await;
    let mut client = gw.client().await;
    for request in 0..REQUESTS {
        let partition = format!("p{}", request % PARTITIONS);
        let items = (0..1 + request % 5)
            .map(|i| item("warm", &partition, Some(&format!("m-{request}-{i}")), json!({"n": request})))
            .collect();
        let answers = client.push(items).await;
        assert!(answers.iter().all(Answer::queued));
    }
    let text = client.metrics().await;
    let series = |probe: &str| metric(&text, &format!("stile_segments_total{{probe=\"{probe}\"}}"));
    let (skipped, narrowed, full) = (series("skipped"), series("narrowed"), series("full"));
    let total = skipped + narrowed + full;
    assert_eq!(total, REQUESTS as f64, "sequential pushes are one segment each:\n{text}");
    // Each partition's first push finds it empty; after it the cache vouches.
    let first = PARTITIONS as f64;
    let share = (skipped - first) / (total - first);
    assert!(share >= 0.9, "skipped {skipped}, narrowed {narrowed}, full {full}: {:.1} % skipped after warm-up", share * 100.0);
    assert!(metric(&text, "stile_hydrations_total{outcome=\"installed\"}") >= 1.0, "{text}");
    assert_eq!(metric(&text, "stile_pushes_total{status=\"queued\"}"), (0..REQUESTS).map(|r| 1 + r % 5).sum::<usize>() as f64);
    // The kernel's figure for the process, beside the cache's own accounting:
    // at least the embedded component's compiled code and one instance.
    let resident = metric(&text, "stile_process_resident_memory_bytes");
    assert!(resident > 4.0 * 1024.0 * 1024.0 && resident < 64.0 * 1024.0 * 1024.0 * 1024.0, "resident {resident}:\n{text}");
}

/// A window larger than the cache's budget, met by a gateway that has never
/// seen its partition: its rows are read, found too large and refused
/// (`suppressed`) before they are copied into the cache, and the partition
/// is probed in full, exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_larger_than_the_budget_is_refused_before_it_is_copied_in() {
    const REQUESTS: usize = 10;
    const PER_REQUEST: usize = 10_000;
    let t = fresh_database().await;
    let options = GatewayOptions { cache_mb: Some(1), shards: Some(1), ..Default::default() };
    let id = |request: usize, i: usize| format!("big-{request}-{i}");
    {
        let filler = Gateway::start_with(&t.url(), &options).await;
        let mut client = filler.client().await;
        for request in 0..REQUESTS {
            let items = (0..PER_REQUEST).map(|i| item("big", "p", Some(&id(request, i)), json!(i))).collect();
            assert!(client.push(items).await.iter().all(Answer::queued));
        }
    }
    let gw = Gateway::start_with(&t.url(), &options).await;
    let mut client = gw.client().await;
    let answers = client.push(vec![item("big", "p", Some("new"), json!(0))]).await;
    assert!(answers[0].queued(), "{answers:?}");
    let retry = client.push(vec![item("big", "p", Some(&id(3, 7)), json!(7))]).await;
    assert_eq!(retry[0].status, "duplicate", "{retry:?}");
    // The hydration the first push asked for runs beside it: wait for its outcome.
    let hydrations = |text: &str, outcome: &str| metric(text, &format!("stile_hydrations_total{{outcome=\"{outcome}\"}}"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let text = loop {
        let text = client.metrics().await;
        if hydrations(&text, "installed") + hydrations(&text, "suppressed") > 0.0 {
            break text;
        }
        assert!(std::time::Instant::now() < deadline, "no hydration ended:\n{text}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!((hydrations(&text, "installed"), hydrations(&text, "suppressed")), (0.0, 1.0), "{text}");
    assert_eq!(stored_counts(&t, "big").await.0, (REQUESTS * PER_REQUEST + 1) as i64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_cache_disabled_every_segment_is_probed_in_full_and_answers_stay_exact() {
    const PARTITIONS: usize = 3;
    const REQUESTS: usize = 60;
    let t = fresh_database().await;
    let gw = Gateway::start_with(&t.url(), &GatewayOptions { cache_mb: Some(0), ..Default::default() }).await;
    let mut client = gw.client().await;
    for request in 0..REQUESTS {
        let partition = format!("p{}", request % PARTITIONS);
        let id = format!("m-{request}");
        let answers = client.push(vec![item("cold", &partition, Some(&id), json!(request))]).await;
        assert!(answers[0].queued());
        // Every other request is retried at once: still exact without a cache.
        if request % 2 == 0 {
            let retry = client.push(vec![item("cold", &partition, Some(&id), json!(request))]).await;
            assert_eq!((retry[0].status.as_str(), &retry[0].message_id), ("duplicate", &answers[0].message_id));
        }
    }
    let text = client.metrics().await;
    let series = |probe: &str| metric(&text, &format!("stile_segments_total{{probe=\"{probe}\"}}"));
    // Each partition's first push finds it empty; every later one is probed
    // over the whole window.
    assert_eq!(series("skipped"), PARTITIONS as f64, "{text}");
    assert_eq!(series("narrowed"), 0.0, "{text}");
    assert_eq!(series("full"), (REQUESTS + REQUESTS / 2 - PARTITIONS) as f64, "{text}");
    assert_eq!(metric(&text, "stile_hydrations_total{outcome=\"installed\"}"), 0.0, "{text}");
    assert_eq!(stored_counts(&t, "cold").await, (REQUESTS as i64, REQUESTS as i64));
}
