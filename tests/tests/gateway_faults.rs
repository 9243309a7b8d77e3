//! A gateway whose cache instances all fail and cannot be made again keeps
//! answering every push, exactly, from PostgreSQL alone: no request waits on
//! a shard stuck rebuilding its instance.

use std::time::Duration;

use serde_json::Value;
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
