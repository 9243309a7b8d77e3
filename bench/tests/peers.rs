//! The peers of the `peers` benchmark keep the promise the benchmark counts
//! on: started as the benchmark starts them (real PostgreSQL, a Redis and a
//! nats-server of their own), each answers a fresh request `new` for every
//! message, the same request again `duplicate` for every message, and reads
//! back each message once. The HTTP peers refuse a malformed body with a 400
//! and write nothing of it.
//!
//! Needs PostgreSQL, `redis-server` and `nats-server` (as the benchmark
//! does) and the built `peer_endpoint` beside the test.

use std::sync::Arc;
use std::time::Duration;

use hyper::Method;
use stile_bench::peers::systems::{Running, StartConfig, System};
use stile_bench::peers::workload::{Request, Transport};
use stile_tests::gateway::fresh_database;

async fn keeps_its_promise(system: System) {
    let t = fresh_database().await;
    let config = StartConfig { partitions: 4, pool_size: 2, window: Duration::from_secs(3600) };
    let running = Running::start(system, &t, &config).await;
    let mut transport = running.transport().await;
    let request = Request { tag: Arc::from("probe"), seq: 1, partition: 3, size: 5 };
    assert_eq!(transport.send(&request).await.unwrap(), [true; 5], "{system:?}: fresh messages are new");
    assert_eq!(transport.send(&request).await.unwrap(), [false; 5], "{system:?}: a redelivery is a duplicate");
    let other = Request { tag: Arc::from("probe"), seq: 2, partition: 0, size: 2 };
    assert_eq!(transport.send(&other).await.unwrap(), [true; 2], "{system:?}: other ids are new");

    if let Transport::Http { client, .. } = &mut transport {
        for body in [r#"{"items":[{"queue":"peers","partition":"p0"}]}"#, "not json", r#"{"items":[]}"#] {
            let reply = client.send(Method::POST, "/api/v1/push", body, &[("content-type", "application/json")]).await.unwrap();
            assert_eq!(reply.status, 400, "{system:?}: {body:?} is refused: {}", reply.text());
        }
    }

    let pg = t.client().await;
    let stored = running.stored_ids(&pg).await;
    let mut expected: Vec<String> = request.ids().chain(other.ids()).collect();
    expected.sort();
    let mut ids: Vec<String> = stored.keys().cloned().collect();
    ids.sort();
    assert_eq!(ids, expected, "{system:?}: what was acknowledged is what is stored");
    assert!(stored.values().all(|&n| n == 1), "{system:?}: each once: {stored:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_alone_keeps_its_promise() {
    keeps_its_promise(System::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_before_postgres_keeps_its_promise() {
    keeps_its_promise(System::RedisPostgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_keeps_its_promise() {
    keeps_its_promise(System::Nats1h).await;
}
