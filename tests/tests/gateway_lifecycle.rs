//! A gateway's life as a process: its log at start, graceful shutdown under
//! load, a shutdown bounded whatever the clients do, and the bearer token. (A database that cannot be reached at start is tested in
//! `host/tests/cli.rs`.)

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hyper::Method;
use serde_json::json;
use stile_tests::gateway::{Answer, Client, Gateway, GatewayOptions, fresh_database, item, metric};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::Notify;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_logs_what_it_did_not_postgresqls_notices_of_what_it_skipped() {
    let t = fresh_database().await;
    // The first start migrates the fresh database; the second finds it
    // migrated. Neither log repeats PostgreSQL's "already exists, skipping".
    for start in ["first", "second"] {
        let mut gw = Gateway::start(&t.url()).await;
        let mut client = gw.client().await;
        let answer = client.push(vec![item("log", "p", Some(start), json!(null))]).await;
        assert_eq!(answer[0].status, "queued");
        gw.process().terminate();
        gw.process().wait_exit(Duration::from_secs(20)).await;
        let logs = gw.logs();
        assert!(logs.contains("listening on"), "{start} start:\n{logs}");
        assert!(!logs.contains("NOTICE"), "{start} start logged PostgreSQL's notices:\n{logs}");
    }
    let c = t.client().await;
    let versions: i64 = c.query_one("SELECT count(*) FROM stile.schema_migrations", &[]).await.unwrap().get(0);
    assert!(versions >= 5, "the first start migrated the database ({versions} versions recorded)");
}

/// A gateway whose pools may open more connections than PostgreSQL has
/// room for says so at start, with the numbers and what to change, and
/// serves all the same: the pools open connections only as load asks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_warns_when_its_pools_may_open_more_connections_than_postgresql_takes() {
    let t = fresh_database().await;
    let c = t.client().await;
    let max_connections: i64 = c.query_one("SELECT current_setting('max_connections')::bigint", &[]).await.unwrap().get(0);
    // Four connections a shard (one bundle in flight, the contended
    // partitions', two for hydrations): past the server's whole limit.
    let shards = usize::try_from(max_connections).unwrap() / 4 + 1;
    let options = GatewayOptions {
        shards: Some(shards),
        pool_size: Some(8),
        extra_args: vec!["--bundles-in-flight".into(), "1".into()],
        ..GatewayOptions::default()
    };
    let mut gw = Gateway::start_with(&t.url(), &options).await;
    let mut client = gw.client().await;
    assert_eq!(client.push(vec![item("room", "p", Some("one"), json!(1))]).await[0].status, "queued");
    let logs = gw.logs();
    let most = 8 + shards * 4;
    assert!(
        logs.contains(&format!("may open up to {most} connections to PostgreSQL (--pool-size 8 and {shards} shards × 4)"))
            && logs.contains(&format!("max_connections {max_connections}"))
            && logs.contains("lower --shards or --pool-size, or raise max_connections"),
        "{logs}"
    );
    let warned = logs.find("may open up to").unwrap();
    assert!(warned < logs.find("listening on").unwrap(), "the warning comes before the gateway says it listens:\n{logs}");
    gw.process().terminate();
    gw.process().wait_exit(Duration::from_secs(20)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_requests_in_flight_stores_every_answered_message_and_exits_zero() {
    const TASKS: usize = 16;
    const ANSWERED_BEFORE_SIGNAL: usize = 100;
    let t = fresh_database().await;
    let mut gw = Gateway::start(&t.url()).await;
    let answered = Arc::new(AtomicUsize::new(0));
    let signalled = Arc::new(AtomicBool::new(false));
    let answered_after_signal = Arc::new(AtomicUsize::new(0));
    let enough = Arc::new(Notify::new());
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let mut client = gw.client().await;
        let (answered, signalled, after, enough) =
            (answered.clone(), signalled.clone(), answered_after_signal.clone(), enough.clone());
        tasks.push(tokio::spawn(async move {
            let mut answers: Vec<Answer> = Vec::new();
            let mut refused = 0usize;
            for request in 0.. {
                let partition = format!("p{}", task % 4);
                let items =
                    (0..5).map(|i| item("drain", &partition, Some(&format!("t{task}-r{request}-{i}")), json!(i))).collect();
                match client.try_push(items).await {
                    Ok(batch) => {
                        answers.extend(batch);
                        if answered.fetch_add(1, Ordering::SeqCst) + 1 == ANSWERED_BEFORE_SIGNAL {
                            enough.notify_one();
                        }
                        if signalled.load(Ordering::SeqCst) {
                            after.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    // A 503 while shutting down is an answer too, but stores
                    // nothing the test can hold the gateway to; the
                    // connection closing ends the task.
                    Err(error) if error.to_string().contains("answered 503") => refused += 1,
                    Err(_) => break,
                }
                assert!(refused < 1000, "the gateway keeps refusing without closing");
            }
            answers
        }));
    }
    tokio::time::timeout(Duration::from_secs(120), enough.notified()).await.expect("the gateway answers pushes");
    signalled.store(true, Ordering::SeqCst);
    gw.process().terminate();
    let status = gw.process().wait_exit(Duration::from_secs(60)).await;
    let mut answers = Vec::new();
    for task in tasks {
        answers.extend(task.await.expect("a pushing task"));
    }
    assert!(status.success(), "exit status {status}:\n{}", gw.logs());
    assert!(gw.logs().contains("stile stopped"), "{}", gw.logs());
    assert!(answers.iter().all(Answer::queued), "every id was new");
    assert!(
        answered_after_signal.load(Ordering::SeqCst) > 0,
        "requests in flight when the signal was sent were answered ({} answered in all)",
        answers.len() / 5
    );

    let c = t.client().await;
    let rows = c
        .query(
            "SELECT p.name AS partition, s.base_offset + m.i - 1 AS offset, m.id::text AS message_id, m.txn \
               FROM stile.segments s JOIN stile.partitions p ON p.id = s.partition_id \
              CROSS JOIN LATERAL unnest(s.message_ids, s.transaction_ids) WITH ORDINALITY AS m(id, txn, i)",
            &[],
        )
        .await
        .unwrap();
    let stored: HashMap<(String, i64), (String, String)> =
        rows.iter().map(|r| ((r.get("partition"), r.get("offset")), (r.get("message_id"), r.get("txn")))).collect();
    for answer in &answers {
        let held = stored.get(&(answer.partition.clone(), answer.offset));
        assert_eq!(
            held,
            Some(&(answer.message_id.clone(), answer.transaction_id.clone())),
            "answered but not stored: {answer:?}"
        );
    }
    assert!(stored.len() >= answers.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_bearer_token_the_api_requires_it_and_health_stays_open() {
    const TOKEN: &str = "tok-9f2c41";
    let t = fresh_database().await;
    let options = GatewayOptions { bearer_token: Some(TOKEN.into()), ..Default::default() };
    let gw = Gateway::start_with(&t.url(), &options).await;
    let mut anonymous = gw.client().await;
    let body = json!({"items": [item("guarded", "p", Some("a"), json!(1))]}).to_string();

    let wrong = [
        vec![],
        vec![("authorization", "Bearer tok-9f2c42")],
        vec![("authorization", "Bearer ")],
        vec![("authorization", "tok-9f2c41")],
        vec![("authorization", "Basic tok-9f2c41")],
        vec![("authorization", "Bearer tok-9f2c41x")],
    ];
    for headers in &wrong {
        let reply = anonymous.send(Method::POST, "/api/v1/push", body.clone(), headers).await.unwrap();
        assert_eq!(reply.status, 401, "{headers:?}: {}", reply.text());
        assert!(reply.error().starts_with("authorization"), "{}", reply.error());
        for path in ["/api/v1/messages?queue=guarded&partition=p", "/api/v1/nothing-here"] {
            let reply = anonymous.send(Method::GET, path, "", headers).await.unwrap();
            assert_eq!(reply.status, 401, "{path} {headers:?}");
        }
        let reply = anonymous.send(Method::POST, "/api/v1/configure", r#"{"queue":"guarded"}"#, headers).await.unwrap();
        assert_eq!(reply.status, 401, "configure {headers:?}");
    }
    let health = anonymous.get("/health").await;
    assert_eq!(health.status, 200, "{}", health.text());
    assert_eq!(health.json()["status"], "ok");
    assert_eq!(anonymous.get("/metrics").await.status, 200);

    let mut client = gw.client().await.with_bearer(TOKEN);
    let answers = client.push(vec![item("guarded", "p", Some("a"), json!(1))]).await;
    assert_eq!((answers[0].status.as_str(), answers[0].offset), ("queued", 0));
    assert_eq!(client.messages("guarded", "p", 0).await.len(), 1);
    assert_eq!(client.configure("guarded", json!({"dedupWindowSeconds": 60})).await["dedupWindowSeconds"], json!(60));
    assert_eq!(client.get("/health").await.status, 200);

    let c = t.client().await;
    let count: i64 = c.query_one("SELECT count(*) AS segments FROM stile.segments", &[]).await.unwrap().get("segments");
    assert_eq!(count, 1, "the refused pushes wrote nothing");
}

/// The shutdown timeout of the tests below, in seconds.
const SHUTDOWN_TIMEOUT_S: u64 = 2;

/// How long past its shutdown timeout a gateway may take to exit, whatever
/// its clients do.
const EXIT_GRACE: Duration = Duration::from_secs(5);

fn with_shutdown_timeout(seconds: u64) -> GatewayOptions {
    GatewayOptions { extra_args: vec!["--shutdown-timeout".to_owned(), seconds.to_string()], ..GatewayOptions::default() }
}

/// A push whose header declares `declared` bytes of body, of which `sent`
/// are sent (spaces, which a JSON body may start with).
async fn push_part_of_a_body(gw: &Gateway, declared: usize, sent: usize) -> TcpStream {
    let mut stream = TcpStream::connect(gw.addr()).await.expect("connect");
    let head = format!("POST /api/v1/push HTTP/1.1\r\nhost: stile\r\ncontent-length: {declared}\r\n\r\n");
    stream.write_all(head.as_bytes()).await.expect("send the head");
    stream.write_all(&vec![b' '; sent]).await.expect("send part of the body");
    stream
}

/// Waits until a series of /metrics satisfies `holds` (polled: a condition
/// the gateway reports), failing after fifteen seconds.
async fn wait_for_metric(client: &mut Client, series: &str, holds: impl Fn(f64) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let value = metric(&client.metrics().await, series);
        if holds(value) {
            return;
        }
        assert!(Instant::now() < deadline, "{series} stayed at {value}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until the gateway's log holds `text` (polled), failing after
/// fifteen seconds.
async fn wait_for_log(gw: &Gateway, text: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !gw.logs().contains(text) {
        assert!(Instant::now() < deadline, "the gateway did not log {text:?}:\n{}", gw.logs());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reads one answer on a raw connection (its header, then as many bytes as
/// its `content-length` says) and returns its status line.
async fn read_answer(stream: &mut TcpStream) -> String {
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        let n = stream.read(&mut buf).await.expect("read an answer");
        assert!(n > 0, "the connection closed before its answer: {:?}", String::from_utf8_lossy(&bytes));
        bytes.extend_from_slice(&buf[..n]);
        if let Some(at) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
    };
    let head = String::from_utf8_lossy(&bytes[..head_end]).into_owned();
    let length: usize = head
        .lines()
        .find_map(|line| line.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().expect("a length")))
        .expect("an answer with a content-length");
    while bytes.len() < head_end + length {
        let n = stream.read(&mut buf).await.expect("read an answer's body");
        assert!(n > 0, "the connection closed within an answer");
        bytes.extend_from_slice(&buf[..n]);
    }
    head.lines().next().unwrap_or_default().to_owned()
}

/// Whether the gateway closes `stream` within `within`: reads what it
/// sends until the end of the stream, or a reset.
async fn closes_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 4096];
    let until_closed = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(within, until_closed).await.is_ok()
}

/// How many connections the gateway says it closed at the shutdown
/// timeout, if it logged that it did.
fn connections_closed_at_the_timeout(logs: &str) -> Option<usize> {
    logs.lines().find_map(|line| {
        let (_, rest) = line.split_once("shutdown timeout: closing the connections")?;
        rest.split_once("(connections: ")?.1.strip_suffix(')')?.parse().ok()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_the_gateway_within_the_shutdown_timeout_and_five_seconds_whatever_the_clients_do() {
    const MESSAGES: usize = 16;
    const DECLARED: usize = 4_000_000;
    const SENT: usize = DECLARED / 2;
    let t = fresh_database().await;
    let mut gw = Gateway::start_with(&t.url(), &with_shutdown_timeout(SHUTDOWN_TIMEOUT_S)).await;
    let mut client = gw.client().await;
    let blob = "x".repeat(1 << 20);
    for n in 0..MESSAGES {
        client.push(vec![item("big", "p", Some(&format!("m{n}")), json!({ "blob": blob }))]).await;
    }

    // A connection that never sends a byte, and one that stops within its
    // header.
    let mut silent = TcpStream::connect(gw.addr()).await.expect("connect");
    let mut half_header = TcpStream::connect(gw.addr()).await.expect("connect");
    half_header.write_all(b"POST /api/v1/push HTTP/1.1\r\nhost: sti").await.expect("send half a header");
    // A push that sent half of its body and stops; its request is in flight
    // once the gateway holds what it sent.
    let _mid_body = push_part_of_a_body(&gw, DECLARED, SENT).await;
    let held_by_the_body = 3.0 * SENT as f64;
    wait_for_metric(&mut client, "stile_held_request_bytes", |held| held >= held_by_the_body).await;
    // A read of 16 MB by a client that never reads it: its answer is in
    // flight while the gateway holds it.
    let socket = TcpSocket::new_v4().expect("a socket");
    socket.set_recv_buffer_size(4096).expect("a small receive buffer");
    let mut never_reads = socket.connect(gw.addr()).await.expect("connect");
    never_reads
        .write_all(b"GET /api/v1/messages?queue=big&partition=p&limit=100 HTTP/1.1\r\nhost: stile\r\n\r\n")
        .await
        .expect("ask for the messages");
    let answer_bytes = (MESSAGES << 20) as f64;
    wait_for_metric(&mut client, "stile_held_request_bytes", |held| held >= held_by_the_body + answer_bytes).await;
    // A keep-alive connection after one answered request.
    let mut idle = TcpStream::connect(gw.addr()).await.expect("connect");
    idle.write_all(b"GET /health HTTP/1.1\r\nhost: stile\r\n\r\n").await.expect("ask for health");
    assert_eq!(read_answer(&mut idle).await, "HTTP/1.1 200 OK");

    let signalled = Instant::now();
    gw.process().terminate();
    // The idle connections close at once, not at the shutdown timeout.
    let at_once = Duration::from_secs(SHUTDOWN_TIMEOUT_S);
    assert!(closes_within(&mut idle, at_once).await, "the idle keep-alive connection outlived the shutdown timeout");
    assert!(closes_within(&mut silent, at_once).await, "the silent connection outlived the shutdown timeout");
    let idle_closed_after = signalled.elapsed();

    let status = gw.process().wait_exit(Duration::from_secs(60)).await;
    let exited_after = signalled.elapsed();
    let logs = gw.logs();
    assert!(status.success(), "exit status {status}:\n{logs}");
    assert!(
        exited_after < Duration::from_secs(SHUTDOWN_TIMEOUT_S) + EXIT_GRACE,
        "the gateway exited {exited_after:?} after SIGTERM, past the shutdown timeout and {EXIT_GRACE:?}:\n{logs}"
    );
    assert!(
        exited_after >= Duration::from_secs(SHUTDOWN_TIMEOUT_S),
        "the gateway exited {exited_after:?} after SIGTERM, before its requests in flight had their shutdown timeout:\n{logs}"
    );
    assert!(logs.contains("shutting down: no new connections"), "{logs}");
    // At least the push mid-body and the unread answer were in flight; the
    // half header may or may not have been read by the signal.
    let aborted = connections_closed_at_the_timeout(&logs);
    assert!(aborted.is_some_and(|n| (2..=3).contains(&n)), "closed at the timeout: {aborted:?}\n{logs}");
    assert!(!logs.contains("exiting without them"), "the connections and shards stopped when aborted:\n{logs}");
    assert!(logs.contains("stile stopped"), "{logs}");
    assert!(closes_within(&mut half_header, Duration::from_secs(1)).await, "the half header's connection is still open");
    println!(
        "SIGTERM to exit: {exited_after:?} (shutdown timeout {SHUTDOWN_TIMEOUT_S} s); idle connections closed after {idle_closed_after:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_during_the_shutdown_exits_at_once() {
    let t = fresh_database().await;
    let mut gw = Gateway::start_with(&t.url(), &with_shutdown_timeout(60)).await;
    let mut client = gw.client().await;
    // A push mid-body holds the shutdown until its body timeout (30 s).
    let _mid_body = push_part_of_a_body(&gw, 4_000_000, 1_000_000).await;
    wait_for_metric(&mut client, "stile_held_request_bytes", |held| held >= 3_000_000.0).await;

    gw.process().terminate();
    wait_for_log(&gw, "shutting down: no new connections").await;
    let second = Instant::now();
    gw.process().terminate();
    let status = gw.process().wait_exit(Duration::from_secs(60)).await;
    let exited_after = second.elapsed();
    let logs = gw.logs();
    assert!(exited_after < Duration::from_secs(3), "the gateway exited {exited_after:?} after the second SIGTERM:\n{logs}");
    assert_eq!(status.code(), Some(143), "exit status {status}:\n{logs}");
    assert!(logs.contains("SIGTERM during the shutdown: exiting at once"), "{logs}");
    assert!(!logs.contains("stile stopped"), "{logs}");
    println!("second SIGTERM to exit: {exited_after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_far_database_gets_more_bundles_in_flight_unless_they_are_configured() {
    let t = fresh_database().await;
    let near = Gateway::start(&t.url()).await;
    assert!(near.logs().contains(": 1 bundles in flight per shard"), "{}", near.logs());

    let upstream = stile_tests::proxy::Upstream::of_postgres(&t.config().pg).await.expect("PostgreSQL's address");
    let proxy = stile_tests::proxy::FaultProxy::start(upstream).await.expect("a proxy");
    proxy.update(|toxics| toxics.latency = Duration::from_millis(5));
    let far_url = stile_tests::proxy::proxied(t.config(), proxy.addr()).to_url(true);
    let far = Gateway::start(&far_url).await;
    assert!(far.logs().contains(": 4 bundles in flight per shard"), "{}", far.logs());
    let mut client = far.client().await;
    let answers = client.push(vec![item("far", "p", Some("far-1"), json!(1))]).await;
    assert_eq!(answers[0].status, "queued");

    let configured = GatewayOptions { extra_args: vec!["--bundles-in-flight".into(), "2".into()], ..GatewayOptions::default() };
    let chosen = Gateway::start_with(&far_url, &configured).await;
    assert!(!chosen.logs().contains("bundles in flight per shard"), "a configured value is kept: {}", chosen.logs());
}
