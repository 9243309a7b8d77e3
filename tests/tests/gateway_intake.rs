//! The intake's bound on what requests in progress hold: a request is charged
//! for the body it has read; while one request holds the whole budget, the
//! next waits with its body unread, and both are answered, exactly, once the
//! first is done.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use stile_tests::gateway::{Gateway, GatewayOptions, fresh_database, metric};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waits_unread_while_another_holds_the_budget() {
    let t = fresh_database().await;
    let options = GatewayOptions { max_held_mb: Some(1), ..GatewayOptions::default() };
    let gw = Gateway::start_with(&t.url(), &options).await;
    let mut observer = gw.client().await;

    // A push sent in two parts: the first (three times its length above a
    // MiB) is charged the whole budget, which the push holds while the rest
    // of its body is still coming.
    let big = push_body("big", 3000);
    let part = 400_000;
    assert!(3 * part > 1 << 20 && part < big.len(), "the first part must be charged the whole budget");
    let mut slow = TcpStream::connect(gw.addr()).await.expect("connect");
    let head = format!(
        "POST /api/v1/push HTTP/1.1\r\nhost: stile\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        big.len()
    );
    slow.write_all(head.as_bytes()).await.expect("send the head");
    slow.write_all(&big.as_bytes()[..part]).await.expect("send the body's start");
    wait_for(&mut observer, "stile_held_request_bytes", f64::from(1 << 20)).await;

    // The second push finds no room: it waits, unread and unanswered.
    let mut second = gw.client().await;
    let waiting = tokio::spawn(async move { second.post("/api/v1/push", push_body("small", 3)).await });
    wait_for(&mut observer, "stile_requests_waited_for_room_total", 1.0).await;
    assert!(!waiting.is_finished(), "the second push was answered while the first held the budget");

    // The rest of the first body: it is answered, and the second is let in.
    slow.write_all(&big.as_bytes()[part..]).await.expect("send the body's rest");
    let first = read_response(&mut slow).await;
    assert!(first.starts_with("HTTP/1.1 201"), "the first push: {first}");
    assert_eq!(first.matches(r#""status":"queued""#).count(), 3000, "the first push stores every item");
    let second = waiting.await.expect("the second push");
    assert_eq!(second.status, 201, "the second push: {}", second.text());
    let answers = second.json();
    assert!(answers.as_array().is_some_and(|a| a.len() == 3 && a.iter().all(|a| a["status"] == "queued")), "{answers}");
    wait_for(&mut observer, "stile_held_request_bytes", 0.0).await;
    let text = observer.metrics().await;
    assert_eq!(metric(&text, "stile_held_request_bytes_limit"), f64::from(1 << 20));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_declared_over_the_limit_is_refused_before_it_waits_or_is_read() {
    let t = fresh_database().await;
    let options = GatewayOptions { max_held_mb: Some(1), body_limit: Some(4096), ..GatewayOptions::default() };
    let gw = Gateway::start_with(&t.url(), &options).await;
    let mut slow = TcpStream::connect(gw.addr()).await.expect("connect");
    let head = "POST /api/v1/push HTTP/1.1\r\nhost: stile\r\ncontent-type: application/json\r\ncontent-length: 5000\r\n\r\n";
    slow.write_all(head.as_bytes()).await.expect("send the head");
    let reply = read_response(&mut slow).await;
    assert!(reply.starts_with("HTTP/1.1 413"), "{reply}");
    assert!(reply.contains("body: exceeds the limit of 4096 bytes"), "{reply}");
    let mut observer = gw.client().await;
    assert_eq!(metric(&observer.metrics().await, "stile_held_request_bytes"), 0.0);
}

fn push_body(tag: &str, items: usize) -> String {
    let items: Vec<Value> = (0..items)
        .map(|i| json!({"queue": "q", "partition": "p", "transactionId": format!("{tag}-{i}"), "payload": {"n": i, "pad": "x".repeat(300)}}))
        .collect();
    json!({ "items": items }).to_string()
}

/// Waits until a series of /metrics reaches `value` (a condition the gateway
/// reports, polled), failing after ten seconds.
async fn wait_for(observer: &mut stile_tests::gateway::Client, series: &str, value: f64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = observer.metrics().await;
        if metric(&text, series) == value {
            return;
        }
        assert!(Instant::now() < deadline, "{series} did not reach {value}:\n{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reads one HTTP response whose body ends the read (the test's requests get
/// small JSON answers, the big one in a few reads): head and body as text.
async fn read_response(stream: &mut TcpStream) -> String {
    let mut bytes = Vec::new();
    let mut buf = [0u8; 65536];
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let n = tokio::time::timeout_at(deadline.into(), stream.read(&mut buf)).await.expect("an answer").expect("read");
        bytes.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&bytes);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|line| line.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_owned()))
                .and_then(|v| v.parse::<usize>().ok());
            if length.is_some_and(|length| body.len() >= length) || n == 0 {
                return text.into_owned();
            }
        }
        if n == 0 {
            return text.into_owned();
        }
    }
}
