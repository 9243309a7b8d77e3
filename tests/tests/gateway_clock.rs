//! A gateway whose wall clock is off PostgreSQL's by more than the window
//! (libfaketime preloaded into the gateway process, its monotonic clock left
//! alone), and whose clock then jumps the other way: every verdict stays
//! exact, the offset shows in `/metrics`, and the log warns once.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use stile_tests::gateway::{Client, Gateway, GatewayOptions, fresh_database, item, metric};

/// Pushes `txn` to `s/p` and answers `(status, offset)`.
async fn push(client: &mut Client, txn: &str) -> (String, i64) {
    let answer = client.push(vec![item("s", "p", Some(txn), Value::Null)]).await;
    (answer[0].status.clone(), answer[0].offset)
}

/// Waits until the gateway reports its clock `offset_s` off PostgreSQL's
/// (to within two seconds), scraping `/metrics`; panics after 20 s.
async fn await_clock_offset(client: &mut Client, offset_s: f64) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = client.get("/metrics").await.text();
        let seen = metric(&text, "stile_clock_offset_seconds");
        if (seen - offset_s).abs() < 2.0 {
            return text;
        }
        assert!(Instant::now() < deadline, "the gateway reports its clock {seen} s off, not {offset_s} s:\n{text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_clock_ahead_or_behind_by_more_than_the_window_changes_no_verdict() {
    for engine in ["wasm", "native"] {
        let t = fresh_database().await;
        let options = GatewayOptions { engine: Some(engine), clock_offset_s: Some(150), ..GatewayOptions::default() };
        let gw = Gateway::start_with(&t.url(), &options).await;
        let mut client = gw.client().await;
        client.configure("s", json!({ "dedupWindowSeconds": 120 })).await;
        await_clock_offset(&mut client, 150.0).await;

        // 150 s ahead, a 120 s window: the hydration after the first push
        // must not look expired to the cache.
        assert_eq!(push(&mut client, "a").await, ("queued".to_owned(), 0), "{engine}");
        for _ in 0..3 {
            assert_eq!(push(&mut client, "a").await, ("duplicate".to_owned(), 0), "{engine}");
        }
        assert_eq!(push(&mut client, "b").await, ("queued".to_owned(), 1), "{engine}");

        // The clock jumps to 150 s behind: nothing changes either.
        gw.set_clock_offset(-150);
        await_clock_offset(&mut client, -150.0).await;
        for txn in ["a", "b", "a"] {
            assert_eq!(push(&mut client, txn).await.0, "duplicate", "{engine} {txn}");
        }
        assert_eq!(push(&mut client, "c").await, ("queued".to_owned(), 2), "{engine}");
        // The cache vouched throughout (PostgreSQL's clock is its clock):
        // the first push, "b" and "c" skipped the probe, and no vouch was
        // refused.
        let text = client.get("/metrics").await.text();
        assert_eq!(metric(&text, "stile_segments_total{probe=\"skipped\"}"), 3.0, "{engine}:\n{text}");
        assert_eq!(metric(&text, "stile_vouches_refused_total"), 0.0, "{engine}:\n{text}");

        let logs = gw.logs();
        assert_eq!(logs.matches("ahead of PostgreSQL's").count(), 1, "{engine}: one warning:\n{logs}");
        assert_eq!(logs.matches("behind PostgreSQL's").count(), 0, "{engine}: warned once only:\n{logs}");
        let stored = client.messages("s", "p", 0).await;
        let ids: Vec<&str> = stored.iter().map(|m| m.transaction_id.as_str()).collect();
        assert_eq!(ids, ["a", "b", "c"], "{engine}");
    }
}
