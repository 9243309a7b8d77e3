//! The intake's bound on what requests in progress hold, on a bad day: a
//! request takes its whole charge before it reads its body and never waits
//! while it holds any, so more large pushes than the budget holds all end
//! (201 or 503) and the gateway recovers at once; slow bodies and unread
//! answers hold room, but not the room small requests need.

use std::time::{Duration, Instant};

use hyper::Method;
use serde_json::{Value, json};
use stile_tests::gateway::{Client, Gateway, GatewayOptions, fresh_database, item, metric};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpSocket, TcpStream};

/// The longest the bystander's push may take while others hold the budget:
/// well below the body and send time limits (30 s), which the stalls this
/// file guards against lasted.
const BYSTANDER_LIMIT: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_large_pushes_than_the_budget_holds_all_end_and_a_push_after_them_is_stored_at_once() {
    const PUSHES: usize = 64;
    let t = fresh_database().await;
    let options = GatewayOptions { max_held_mb: Some(4), ..GatewayOptions::default() };
    let gw = Gateway::start_with(&t.url(), &options).await;
    let started = Instant::now();
    let mut burst = Vec::new();
    for push in 0..PUSHES {
        let mut client = gw.client().await;
        burst.push(tokio::spawn(async move {
            let reply = client.post("/api/v1/push", push_body(&format!("burst{push}"), 1000)).await;
            (reply.status, reply.headers.get("retry-after").is_some(), reply.text())
        }));
    }
    let (mut stored, mut shed) = (0, 0);
    for push in burst {
        let (status, retry_after, text) = push.await.expect("a burst push");
        match status {
            201 => stored += 1,
            503 => {
                assert!(retry_after, "a 503 says when to retry: {text}");
                shed += 1;
            }
            other => panic!("a burst push answered {other}: {text}"),
        }
    }
    let burst_took = started.elapsed();
    assert!(burst_took < Duration::from_secs(30), "the burst took {burst_took:?}, past the body time limit");
    assert!(stored > 0 && shed > 0, "64 pushes of 300 KiB against a budget of 4 MiB: {stored} stored, {shed} shed");

    let mut after = gw.client().await;
    let sent = Instant::now();
    let answers = after.push(vec![item("q", "p", Some("after-the-burst"), json!(1))]).await;
    let took = sent.elapsed();
    assert_eq!(answers[0].status, "queued");
    assert!(took < Duration::from_secs(1), "the push after the burst took {took:?}");
    let text = after.metrics().await;
    assert_eq!(metric(&text, "stile_held_request_bytes"), 0.0, "{text}");
    assert_eq!(metric(&text, "stile_requests_shed_total"), f64::from(shed), "{text}");

    // What was answered 201 is stored; what was answered 503 is not.
    let c = t.client().await;
    let rows: i64 = c.query_one("SELECT count(*) FROM stile.messages", &[]).await.unwrap().get(0);
    assert_eq!(rows, i64::from(stored) * 1000 + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_bodies_that_hold_the_large_share_do_not_stall_a_small_push() {
    let t = fresh_database().await;
    // A queue time limit longer than the test, so that the two large pushes
    // that wait are still waiting when the first slow body ends.
    let options = GatewayOptions {
        max_held_mb: Some(4),
        extra_args: vec!["--queue-timeout".into(), "600".into()],
        ..GatewayOptions::default()
    };
    let gw = Gateway::start_with(&t.url(), &options).await;
    let mut observer = gw.client().await;
    // Two bodies declared at 1.5 MB each (charged 3.5 MiB, all the large
    // share), each sent but for its last bytes: the first is admitted, the
    // second waits for room. The second is sent only once the first holds
    // its charge, so that which of the two is admitted is not left to the
    // order in which the gateway reads two heads that arrive together.
    let big = push_body("slow", 4000);
    assert!(big.len() > 1_300_000, "{}", big.len());
    let mut first = send_all_but_its_end(&gw, &big).await;
    wait_for_at_least(&mut observer, "stile_held_request_bytes", big.len() as f64).await;
    let _second = send_all_but_its_end(&gw, &big).await;
    wait_for(&mut observer, "stile_requests_waiting_for_room", 1.0).await;

    let sent = Instant::now();
    let mut bystander = gw.client().await;
    let reply = tokio::time::timeout(BYSTANDER_LIMIT, bystander.post("/api/v1/push", push_body("bystander", 3)))
        .await
        .expect("the bystander's push is answered while the slow bodies hold the large share");
    assert_eq!(reply.status, 201, "{}", reply.text());
    let took = sent.elapsed();
    let health = observer.get("/health").await.json();
    assert_eq!(health["intake"]["saturated"], true, "{health}");
    assert_eq!(health["intake"]["waitingRequests"], 1, "{health}");

    // The first slow body ends: it is stored, and the second is let in.
    first.write_all(&big.as_bytes()[big.len() - 10..]).await.expect("send the rest");
    let answer = read_response(&mut first, &gw).await;
    assert!(answer.starts_with("HTTP/1.1 201"), "{}", &answer[..answer.len().min(300)]);
    wait_for(&mut observer, "stile_requests_waiting_for_room", 0.0).await;
    eprintln!("the bystander's push took {took:?} beside two slow bodies");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_whose_client_hangs_up_while_it_waits_for_room_is_not_stored_and_its_turn_passes() {
    let t = fresh_database().await;
    let options = GatewayOptions {
        max_held_mb: Some(1),
        extra_args: vec!["--queue-timeout".into(), "600".into()],
        ..GatewayOptions::default()
    };
    let gw = Gateway::start_with(&t.url(), &options).await;
    let mut observer = gw.client().await;
    // A slow body of about 330 KB holds the large share (896 KiB of the
    // budget of 1 MiB); a push of about 53 KB (charged 160 KB) then finds
    // no room and waits, its body sent whole and unread.
    let slow = push_body("slow", 1000);
    let mut holder = send_all_but_its_end(&gw, &slow).await;
    wait_for_at_least(&mut observer, "stile_held_request_bytes", 896.0 * 1024.0).await;
    let gone = push_body("gone", 160);
    assert!((48_000..64_000).contains(&gone.len()), "{}", gone.len());
    let mut leaver = TcpStream::connect(gw.addr()).await.expect("connect");
    let head = format!("POST /api/v1/push HTTP/1.1\r\nhost: stile\r\ncontent-length: {}\r\n\r\n", gone.len());
    leaver.write_all(head.as_bytes()).await.expect("send the head");
    leaver.write_all(gone.as_bytes()).await.expect("send the whole body");
    wait_for(&mut observer, "stile_requests_waiting_for_room", 1.0).await;
    // Its client gives up and closes the connection while it waits.
    drop(leaver);
    let _ = observer.metrics().await;

    // The slow body ends and gives its room back: the waiting push's turn
    // comes, its client is gone, and it is neither read nor stored.
    holder.write_all(&slow.as_bytes()[slow.len() - 10..]).await.expect("send the rest");
    let answer = read_response(&mut holder, &gw).await;
    assert!(answer.starts_with("HTTP/1.1 201"), "{}", &answer[..answer.len().min(300)]);
    wait_for(&mut observer, "stile_requests_abandoned_total", 1.0).await;
    wait_for(&mut observer, "stile_requests_waiting_for_room", 0.0).await;
    let mut after = gw.client().await;
    let answers = after.push(vec![item("q", "p", Some("after-the-leaver"), json!(1))]).await;
    assert_eq!(answers[0].status, "queued");
    let text = observer.metrics().await;
    assert_eq!(metric(&text, "stile_held_request_bytes"), 0.0, "{text}");
    assert_eq!(metric(&text, "stile_requests_shed_total"), 0.0, "a client that left was not refused: {text}");
    let c = t.client().await;
    let stored: Vec<String> = c
        .query("SELECT DISTINCT split_part(transaction_id, '-', 1) FROM stile.messages ORDER BY 1", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(stored, ["after", "slow"], "the push of the client that left is not stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_nobody_reads_hold_room_within_the_budget_and_a_small_push_still_goes_through() {
    let t = fresh_database().await;
    let options = GatewayOptions {
        max_held_mb: Some(24),
        body_limit: Some(4 << 20),
        extra_args: vec!["--answer-limit".into(), (8u32 << 20).to_string()],
        ..GatewayOptions::default()
    };
    let gw = Gateway::start_with(&t.url(), &options).await;
    let mut writer = gw.client().await;
    let pad = "y".repeat(1_000_000);
    for i in 0..10 {
        writer.push(vec![item("big", "p", Some(&format!("m{i}")), json!({ "pad": pad }))]).await;
    }
    // Readers that ask for pages of 10 MB (cut at the answer limit of 8 MiB,
    // more than the kernel's socket buffers take) from sockets whose
    // receive buffers are small, and read no further than the status line.
    let mut readers = Vec::new();
    let mut statuses = Vec::new();
    for _ in 0..6 {
        let socket = TcpSocket::new_v4().expect("a socket");
        socket.set_recv_buffer_size(4096).expect("a small receive buffer");
        let mut stream = socket.connect(gw.addr()).await.expect("connect");
        stream
            .write_all(b"GET /api/v1/messages?queue=big&partition=p&limit=100 HTTP/1.1\r\nhost: stile\r\n\r\n")
            .await
            .expect("send the read");
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).await.expect("the answer's status line");
        statuses.push(String::from_utf8_lossy(&head).into_owned());
        readers.push(stream);
    }
    let text = writer.metrics().await;
    let held = metric(&text, "stile_held_request_bytes");
    assert!(held > f64::from(16u32 << 20), "the unread answers hold their room: {held}");
    assert_eq!(statuses.iter().filter(|s| s.ends_with("200")).count(), 3, "two full pages and one shorter: {statuses:?}");
    assert!(statuses.iter().skip(3).all(|s| s.ends_with("503")), "then no room is left: {statuses:?}\n{text}");

    let mut bystander = gw.client().await;
    let answers = tokio::time::timeout(BYSTANDER_LIMIT, bystander.push(vec![item("q", "p", Some("beside-readers"), json!(1))]))
        .await
        .expect("the bystander's push is answered while the answers are unread");
    assert_eq!(answers[0].status, "queued");

    drop(readers);
    wait_for(&mut writer, "stile_held_request_bytes", 0.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_sent_without_a_length_is_read_and_stored() {
    let t = fresh_database().await;
    let gw = Gateway::start(&t.url()).await;
    let body = push_body("chunked", 2000);
    let mut stream = TcpStream::connect(gw.addr()).await.expect("connect");
    stream
        .write_all(b"POST /api/v1/push HTTP/1.1\r\nhost: stile\r\ntransfer-encoding: chunked\r\n\r\n")
        .await
        .expect("send the head");
    for piece in body.as_bytes().chunks(100_000) {
        stream.write_all(format!("{:x}\r\n", piece.len()).as_bytes()).await.expect("a chunk's size");
        stream.write_all(piece).await.expect("a chunk");
        stream.write_all(b"\r\n").await.expect("a chunk's end");
    }
    stream.write_all(b"0\r\n\r\n").await.expect("the last chunk");
    let answer = read_response(&mut stream, &gw).await;
    assert!(answer.starts_with("HTTP/1.1 201"), "{}", &answer[..answer.len().min(300)]);
    assert_eq!(answer.matches(r#""status":"queued""#).count(), 2000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shed_push_gets_its_503_whole_and_the_connection_serves_the_next_request() {
    let t = fresh_database().await;
    let options = GatewayOptions {
        max_held_mb: Some(1),
        extra_args: vec!["--queue-timeout".into(), "0.2".into()],
        ..GatewayOptions::default()
    };
    let gw = Gateway::start_with(&t.url(), &options).await;
    // A slow body holds the large share; a second large push waits for the
    // queue's time limit and is refused, its body read and thrown away.
    let big = push_body("holder", 2000);
    let mut holder = TcpStream::connect(gw.addr()).await.expect("connect");
    let head = format!("POST /api/v1/push HTTP/1.1\r\nhost: stile\r\ncontent-length: {}\r\n\r\n", big.len());
    holder.write_all(head.as_bytes()).await.expect("send the head");
    holder.write_all(&big.as_bytes()[..1000]).await.expect("send the body's start");
    let mut observer = gw.client().await;
    wait_for_at_least(&mut observer, "stile_held_request_bytes", 900_000.0).await;

    let mut refused = Client::connect(gw.addr()).await.expect("connect");
    let reply = refused.send(Method::POST, "/api/v1/push", push_body("refused", 2000), &[]).await.expect("an answer");
    assert_eq!(reply.status, 503, "{}", reply.text());
    assert_eq!(reply.headers.get("retry-after").map(|v| v.to_str().unwrap().to_owned()), Some("1".to_owned()));
    assert!(reply.error().contains("within 0.2 s"), "{}", reply.error());
    let health = observer.get("/health").await.json();
    assert_eq!(health["intake"]["saturated"], true, "{health}");

    let answers = refused.push(vec![item("q", "p", Some("small"), json!(1))]).await;
    assert_eq!(answers[0].status, "queued", "the same connection serves a small push next");
    let c = t.client().await;
    let refused_rows: i64 =
        c.query_one("SELECT count(*) FROM stile.messages WHERE transaction_id LIKE 'refused-%'", &[]).await.unwrap().get(0);
    assert_eq!(refused_rows, 0, "nothing of a refused push is written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_declared_over_the_limit_is_refused_before_it_waits_or_is_read() {
    let t = fresh_database().await;
    let options = GatewayOptions { max_held_mb: Some(1), body_limit: Some(4096), ..GatewayOptions::default() };
    let gw = Gateway::start_with(&t.url(), &options).await;
    let mut slow = TcpStream::connect(gw.addr()).await.expect("connect");
    let head = "POST /api/v1/push HTTP/1.1\r\nhost: stile\r\ncontent-type: application/json\r\ncontent-length: 5000\r\n\r\n";
    slow.write_all(head.as_bytes()).await.expect("send the head");
    let reply = read_response(&mut slow, &gw).await;
    assert!(reply.starts_with("HTTP/1.1 413"), "{reply}");
    assert!(reply.contains("body: exceeds the limit of 4096 bytes"), "{reply}");
    let mut observer = gw.client().await;
    assert_eq!(metric(&observer.metrics().await, "stile_held_request_bytes"), 0.0);
}

/// Opens a connection and sends a push of `body` but for its last 10 bytes.
async fn send_all_but_its_end(gw: &Gateway, body: &str) -> TcpStream {
    let mut stream = TcpStream::connect(gw.addr()).await.expect("connect");
    let head = format!("POST /api/v1/push HTTP/1.1\r\nhost: stile\r\ncontent-length: {}\r\n\r\n", body.len());
    stream.write_all(head.as_bytes()).await.expect("send the head");
    stream.write_all(&body.as_bytes()[..body.len() - 10]).await.expect("send most of the body");
    stream
}

fn push_body(tag: &str, items: usize) -> String {
    let items: Vec<Value> = (0..items)
        .map(|i| json!({"queue": "q", "partition": "p", "transactionId": format!("{tag}-{i}"), "payload": {"n": i, "pad": "x".repeat(300)}}))
        .collect();
    json!({ "items": items }).to_string()
}

/// Waits until a series of /metrics reaches at least `value`, failing after
/// ten seconds.
async fn wait_for_at_least(observer: &mut Client, series: &str, value: f64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = observer.metrics().await;
        if metric(&text, series) >= value {
            return;
        }
        assert!(Instant::now() < deadline, "{series} did not reach {value}:\n{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until a series of /metrics reaches `value` (a condition the gateway
/// reports, polled), failing after ten seconds.
async fn wait_for(observer: &mut Client, series: &str, value: f64) {
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
async fn read_response(stream: &mut TcpStream, gw: &Gateway) -> String {
    let mut bytes = Vec::new();
    let mut buf = [0u8; 65536];
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let n = tokio::time::timeout_at(deadline.into(), stream.read(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("no answer within 20 s; the gateway's log:\n{}", gw.logs()))
            .expect("read");
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
