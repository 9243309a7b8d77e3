//! A gateway whose cache instances all fail and cannot be made again keeps
//! answering every push, exactly, from PostgreSQL alone: no request waits on
//! a shard stuck rebuilding its instance.

use std::time::Duration;

use serde_json::{Value, json};
use stile_tests::gateway::{Gateway, GatewayOptions, fresh_database, item, metric};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_without_cache_instances_answers_every_push_exactly() {
    let t = fresh_database().await;
    let options = GatewayOptions {
        inject_guest_traps_per_million: Some(1_000_000),
        inject_instance_refusals: true,
        shards: Some(2),
        ..GatewayOptions::default()
    };
    let gw = Gateway::start_with(&t.url(), &options).await;
    let mut client = gw.client().await;
    for round in 0..3 {
        for partition in ["p0", "p1", "p2", "p3"] {
            let items: Vec<Value> = ["a", "b", "a"].iter().map(|txn| item("q", partition, Some(txn), Value::Null)).collect();
            let answers = tokio::time::timeout(Duration::from_secs(10), client.push(items))
                .await
                .unwrap_or_else(|_| panic!("a push waited on the cache:\n{}", gw.logs()));
            let statuses: Vec<&str> = answers.iter().map(|a| a.status.as_str()).collect();
            let expected = if round == 0 { ["queued", "queued", "duplicate"] } else { ["duplicate"; 3] };
            assert_eq!(statuses, expected, "round {round}, {partition}");
            assert_eq!(answers.iter().map(|a| a.offset).collect::<Vec<_>>(), [0, 1, 0], "round {round}, {partition}");
        }
    }
    // Published by each shard's housekeeping, once a second.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let per_shard =
        |text: &str, name: &str| -> f64 { (0..2).map(|shard| metric(text, &format!("{name}{{shard=\"{shard}\"}}"))).sum() };
    loop {
        let text = client.get("/metrics").await.text();
        if per_shard(&text, "stile_cache_instance_rebuilds") >= 2.0 {
            assert_eq!(per_shard(&text, "stile_cache_entries"), 0.0, "an entry without an instance:\n{text}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the shards' instances did not both fail:\n{text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(gw.logs().contains("cannot make a cache instance"), "{}", gw.logs());
}

/// A session other than the gateway holds one partition's row: pushes to it
/// are refused with a 503 once `--lock-timeout` has passed, the other
/// partitions of its shard keep being answered while the lock is held, and
/// once it is let go the refused push is stored, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_locked_by_another_session_stalls_only_its_own_partition() {
    let t = fresh_database().await;
    let options = GatewayOptions {
        shards: Some(1),
        extra_args: vec!["--lock-timeout".to_owned(), "0.3".to_owned()],
        ..GatewayOptions::default()
    };
    let gw = Gateway::start_with(&t.url(), &options).await;
    let mut client = gw.client().await;
    for partition in ["locked", "free"] {
        let answers = client.push(vec![item("q", partition, Some("first"), Value::Null)]).await;
        assert!(answers[0].queued(), "{answers:?}");
    }

    let holder = t.client().await;
    holder.batch_execute("BEGIN; SELECT 1 FROM stile.partitions WHERE name = 'locked' FOR UPDATE").await.expect("lock the row");

    // Pushes to the free partition, sent while one to the locked partition
    // waits: the first may share its bundle, and is pushed again without it.
    let mut locked_client = gw.client().await;
    let locked_push = tokio::spawn(async move {
        let body = json!({ "items": [item("q", "locked", Some("second"), Value::Null)] }).to_string();
        locked_client.post("/api/v1/push", body).await
    });
    for n in 0..20 {
        let txn = format!("free-{n}");
        let answers =
            tokio::time::timeout(Duration::from_secs(30), client.push(vec![item("q", "free", Some(&txn), Value::Null)]))
                .await
                .unwrap_or_else(|_| panic!("a push to the free partition waited on the other's lock:\n{}", gw.logs()));
        assert!(answers[0].queued(), "{answers:?}");
        assert_eq!(answers[0].offset, n + 1);
    }
    let refused = tokio::time::timeout(Duration::from_secs(30), locked_push)
        .await
        .unwrap_or_else(|_| panic!("the locked partition's push waited past its lock timeout:\n{}", gw.logs()))
        .expect("the push task");
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert!(refused.headers.contains_key("retry-after"), "{:?}", refused.headers);
    assert!(refused.error().contains("locked by another session"), "{}", refused.text());
    let text = client.get("/metrics").await.text();
    assert!(metric(&text, "stile_bundle_lock_timeouts_total") >= 1.0, "{text}");

    // While the row stays locked, the partition keeps being refused.
    let reply =
        client.post("/api/v1/push", json!({ "items": [item("q", "locked", Some("second"), Value::Null)] }).to_string()).await;
    assert_eq!(reply.status, 503, "{}", reply.text());

    holder.batch_execute("ROLLBACK").await.expect("let the row go");
    let answers = client.push(vec![item("q", "locked", Some("second"), Value::Null)]).await;
    assert!(answers[0].queued(), "{answers:?}");
    assert_eq!(answers[0].offset, 1);
    let answers = client.push(vec![item("q", "locked", Some("second"), Value::Null)]).await;
    assert!(answers[0].duplicate(), "{answers:?}");
    let stored = client.messages("q", "locked", 0).await;
    assert_eq!(stored.len(), 2, "{stored:?}");
}
