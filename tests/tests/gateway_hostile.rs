//! Clients that misbehave, beside clients that don't: a poisoned item is its
//! sender's own refusal, idle and slow connections hold nothing for long,
//! answers count against the memory bound and have a limit, and a page of
//! another site cannot write through a user's browser.

use std::time::{Duration, Instant};

use hyper::Method;
use serde_json::{Value, json};
use stile_tests::gateway::{Client, Gateway, GatewayOptions, Reply, fresh_database, item, metric};
use stile_tests::pg::TestDb;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpSocket, TcpStream};

fn options(extra: &[&str]) -> GatewayOptions {
    GatewayOptions { extra_args: extra.iter().map(|s| (*s).to_owned()).collect(), ..GatewayOptions::default() }
}

/// A trigger that refuses any segment holding the transactionId `poison-…`:
/// a message PostgreSQL will not take, for a reason of that segment's own.
async fn refuse_poison_in_postgres(t: &TestDb) {
    t.client()
        .await
        .batch_execute(
            "CREATE FUNCTION stile.refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF EXISTS (SELECT 1 FROM json_array_elements_text(NEW.transaction_ids::json) AS t WHERE t LIKE 'poison-%') THEN
                     RAISE EXCEPTION 'refused by the test' USING ERRCODE = '22023';
                 END IF;
                 RETURN NEW;
             END $$;
             CREATE TRIGGER refuse_poison BEFORE INSERT ON stile.log
                 FOR EACH ROW EXECUTE FUNCTION stile.refuse_poison();",
        )
        .await
        .expect("install the poison trigger");
}

/// What one producer saw.
#[derive(Debug, Default)]
struct Tally {
    created: usize,
    refused_4xx: usize,
    failed_5xx: usize,
    acknowledged: Vec<String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisoned_item_fails_only_its_sender_and_every_bystander_is_answered() {
    let t = fresh_database().await;
    // One shard: every partition's segments share its bundles.
    let gw = Gateway::start_with(&t.url(), &GatewayOptions { shards: Some(1), ..GatewayOptions::default() }).await;
    let mut first = gw.client().await;
    first.push(vec![item("orders", "warm", Some("warm"), json!(0))]).await;
    refuse_poison_in_postgres(&t).await;

    const BYSTANDERS: usize = 8;
    const PUSHES: usize = 60;
    let mut producers = Vec::new();
    for producer in 0..BYSTANDERS {
        let mut client = gw.client().await;
        producers.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            for n in 0..PUSHES {
                let id = format!("ok-{producer}-{n}");
                let body = json!({"items": [item("orders", &format!("p{producer}"), Some(&id), json!({"n": n}))]});
                let reply = client.post("/api/v1/push", body.to_string()).await;
                match reply.status {
                    201 => {
                        tally.created += 1;
                        tally.acknowledged.push(id);
                    }
                    400..=499 => tally.refused_4xx += 1,
                    _ => tally.failed_5xx += 1,
                }
            }
            tally
        }));
    }
    let mut poisoner = gw.client().await;
    let poison = tokio::spawn(async move {
        let (mut nul_refused, mut poison_failed, mut other) = (0, 0, 0);
        for n in 0..PUSHES {
            let nul = json!({"items": [item("orders", "px", Some(&format!("nul-{n}\u{0}")), json!(n))]});
            match poisoner.post("/api/v1/push", nul.to_string()).await.status {
                400 => nul_refused += 1,
                _ => other += 1,
            }
            let refused = json!({"items": [item("orders", "px", Some(&format!("poison-{n}")), json!(n))]});
            match poisoner.post("/api/v1/push", refused.to_string()).await.status {
                500 => poison_failed += 1,
                _ => other += 1,
            }
        }
        (nul_refused, poison_failed, other)
    });
    let mut bystanders = Tally::default();
    for producer in producers {
        let tally = producer.await.expect("a bystander");
        bystanders.created += tally.created;
        bystanders.refused_4xx += tally.refused_4xx;
        bystanders.failed_5xx += tally.failed_5xx;
        bystanders.acknowledged.extend(tally.acknowledged);
    }
    let (nul_refused, poison_failed, other) = poison.await.expect("the poisoner");
    let split = metric(&first.metrics().await, "stile_bundles_split_total");
    println!(
        "bystanders: {} created, {} 4xx, {} 5xx; poisoner: {nul_refused} NUL ids refused (400), {poison_failed} refused by \
         PostgreSQL (500), {other} otherwise; bundles split: {split}",
        bystanders.created, bystanders.refused_4xx, bystanders.failed_5xx
    );
    assert_eq!(
        (bystanders.created, bystanders.refused_4xx, bystanders.failed_5xx),
        (BYSTANDERS * PUSHES, 0, 0),
        "every bystander push is stored and answered 201"
    );
    assert_eq!((nul_refused, poison_failed, other), (PUSHES, PUSHES, 0), "the poison is its sender's alone");
    assert!(split > 0.0, "no poisoned segment shared a bundle with a bystander's; the test proved nothing");
    let stored: i64 = t
        .client()
        .await
        .query_one(
            "SELECT count(DISTINCT t) AS stored FROM stile.segments s, unnest(s.transaction_ids) AS t WHERE t = ANY($1)",
            &[&bystanders.acknowledged],
        )
        .await
        .expect("count the stored ids")
        .get("stored");
    assert_eq!(stored as usize, BYSTANDERS * PUSHES, "every acknowledged bystander message is stored");
}

/// Opens a connection that sends `head` (and nothing more).
async fn send_head(gw: &Gateway, head: &str) -> TcpStream {
    let mut stream = TcpStream::connect(gw.addr()).await.expect("connect");
    stream.write_all(head.as_bytes()).await.expect("send the head");
    stream
}

/// Reads what the gateway sends until it closes the connection (or resets
/// it), failing after `within`.
async fn until_closed(stream: &mut TcpStream, within: Duration) -> String {
    let mut bytes = Vec::new();
    let mut buf = [0u8; 4096];
    let read = tokio::time::timeout(within, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => bytes.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "the gateway kept the connection open; it sent {:?}", String::from_utf8_lossy(&bytes));
    String::from_utf8_lossy(&bytes).into_owned()
}

fn percentile_ms(sorted: &[Duration], p: f64) -> f64 {
    let at = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[at].as_secs_f64() * 1000.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_slow_clients_hold_nothing_for_long_and_normal_clients_keep_pushing() {
    let t = fresh_database().await;
    let gw = Gateway::start_with(
        &t.url(),
        &GatewayOptions {
            max_held_mb: Some(64),
            ..options(&["--body-timeout", "2", "--header-timeout", "2", "--idle-timeout", "3"])
        },
    )
    .await;
    let mut observer = gw.client().await;

    // Bodies declared and never sent: 16 MB each, and one of unknown length.
    let declared =
        "POST /api/v1/push HTTP/1.1\r\nhost: stile\r\ncontent-type: application/json\r\ncontent-length: 16000000\r\n\r\n";
    let chunked =
        "POST /api/v1/push HTTP/1.1\r\nhost: stile\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
    let mut silent = vec![send_head(&gw, declared).await, send_head(&gw, declared).await, send_head(&gw, chunked).await];
    // Slow headers, and connections that never send a byte.
    let mut slowloris = Vec::new();
    for _ in 0..100 {
        slowloris.push(send_head(&gw, "POST /api/v1/push HTTP/1.1\r\nhost: st").await);
    }
    let mut idle = Vec::new();
    for _ in 0..100 {
        idle.push(TcpStream::connect(gw.addr()).await.expect("connect"));
    }

    // Normal clients push beside them.
    let mut latencies = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(gw.client().await);
    }
    for round in 0..50 {
        for (c, client) in clients.iter_mut().enumerate() {
            let started = Instant::now();
            let answers = client.push(vec![item("normal", &format!("p{c}"), Some(&format!("{round}")), json!(round))]).await;
            latencies.push(started.elapsed());
            assert_eq!(answers[0].status, "queued");
        }
    }
    latencies.sort();
    println!(
        "normal pushes beside 3 silent bodies, 100 slow headers and 100 idle connections: {} pushes, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        latencies.len(),
        percentile_ms(&latencies, 0.5),
        percentile_ms(&latencies, 0.99),
        percentile_ms(&latencies, 1.0)
    );
    assert_eq!(metric(&observer.metrics().await, "stile_held_request_bytes"), 0.0, "a body not sent holds nothing");

    // Each misbehaving connection is ended by its limit.
    for stream in &mut silent {
        let answer = until_closed(stream, Duration::from_secs(10)).await;
        assert!(answer.starts_with("HTTP/1.1 408"), "a body never sent: {answer}");
        assert!(answer.contains("body: not received within 2 s"), "{answer}");
    }
    for stream in &mut slowloris {
        let answer = until_closed(stream, Duration::from_secs(10)).await;
        assert!(!answer.contains("201"), "a header never finished was served: {answer}");
    }
    for stream in &mut idle {
        assert_eq!(until_closed(stream, Duration::from_secs(10)).await, "", "an idle connection is closed silently");
    }
    assert_eq!(metric(&observer.metrics().await, "stile_held_request_bytes"), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_body_holds_its_charge_until_its_time_limit_and_a_client_that_does_not_read_its_answer_lets_go_of_it() {
    let t = fresh_database().await;
    let gw = Gateway::start_with(
        &t.url(),
        &GatewayOptions { max_held_mb: Some(64), ..options(&["--body-timeout", "3", "--send-timeout", "3"]) },
    )
    .await;
    let mut client = gw.client().await;

    // A body sent in part holds the charge of its declared 16 MB from its
    // first byte, for at most the body's time limit.
    let mut slow = send_head(
        &gw,
        "POST /api/v1/push HTTP/1.1\r\nhost: stile\r\ncontent-type: application/json\r\ncontent-length: 16000000\r\n\r\n",
    )
    .await;
    slow.write_all(&[b' '; 1000]).await.expect("send a little");
    wait_for_metric(&mut client, "stile_held_request_bytes", |held| held == 48_000_000.0).await;
    let answer = until_closed(&mut slow, Duration::from_secs(10)).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    wait_for_metric(&mut client, "stile_held_request_bytes", |held| held == 0.0).await;

    // A 12 MB message, read by clients that never read their answers.
    let payload = json!({ "blob": "x".repeat(12 << 20) });
    let answers = client.push(vec![item("big", "p", Some("big"), payload)]).await;
    assert_eq!(answers[0].status, "queued");
    // Their answers count against the bound while they are unsent (each read
    // reserves room for an answer as large as the answer limit while
    // PostgreSQL reads, so they are sent one after the other here)...
    let mut readers = Vec::new();
    for reader in 1..=3 {
        let socket = TcpSocket::new_v4().expect("a socket");
        socket.set_recv_buffer_size(4096).expect("a small receive buffer");
        let mut stream = socket.connect(gw.addr()).await.expect("connect");
        stream
            .write_all(b"GET /api/v1/messages?queue=big&partition=p HTTP/1.1\r\nhost: stile\r\n\r\n")
            .await
            .expect("ask for the message");
        readers.push(stream);
        let answers = f64::from(reader * (12 << 20));
        wait_for_metric(&mut client, "stile_held_request_bytes", |held| held >= answers && held < answers + 1e6).await;
    }
    // ...and are let go once the send limit has passed without progress.
    wait_for_metric(&mut client, "stile_held_request_bytes", |held| held == 0.0).await;
    for reader in &mut readers {
        let answer = until_closed(reader, Duration::from_secs(10)).await;
        assert!(answer.len() < 12 << 20, "a client that did not read got its whole answer");
    }
    assert_eq!(client.get("/health").await.status, 200);
}

/// Waits until a series of /metrics satisfies `holds` (polled, a condition
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_are_bounded_by_the_answer_limit() {
    let t = fresh_database().await;
    let gw = Gateway::start_with(&t.url(), &options(&["--answer-limit", "200000"])).await;
    let mut client = gw.client().await;

    let value = "v".repeat(60_000);
    for key in ["a", "b", "c", "d"] {
        let put = json!({"operations": [{"op": "put", "ns": "big", "key": key, "value": value, "forever": true}]});
        assert_eq!(client.post("/api/v1/kv", put.to_string()).await.status, 200);
    }
    let three = json!({"operations": [{"op": "getMany", "ns": "big", "keys": ["a", "b", "c"]}]});
    let reply = client.post("/api/v1/kv", three.to_string()).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let four = json!({"operations": [{"op": "getMany", "ns": "big", "keys": ["a", "b", "c", "d"]}]});
    let reply = client.post("/api/v1/kv", four.to_string()).await;
    assert_eq!(reply.status, 413, "{}", reply.text());
    assert!(reply.error().starts_with("operations[0]: the answer would exceed"), "{}", reply.error());
    let gets: Vec<Value> = ["a", "b", "c", "d"].iter().map(|k| json!({"op": "get", "ns": "big", "key": k})).collect();
    let reply = client.post("/api/v1/kv", json!({ "operations": gets }).to_string()).await;
    assert_eq!(reply.status, 413, "{}", reply.text());
    assert!(reply.error().starts_with("operations[3]:"), "{}", reply.error());

    // Messages: a page ends at the limit, and says so; the next page goes on.
    let items: Vec<Value> = (0..5).map(|n| item("pages", "p", Some(&format!("m{n}")), json!(value))).collect();
    client.push(items).await;
    let page = client.get("/api/v1/messages?queue=pages&partition=p&limit=100").await.json();
    assert_eq!((page["messages"].as_array().map(Vec::len), &page["truncated"]), (Some(3), &json!(true)));
    let rest = client.get("/api/v1/messages?queue=pages&partition=p&fromOffset=3").await.json();
    assert_eq!((rest["messages"].as_array().map(Vec::len), rest.get("truncated")), (Some(2), None));
    // One message above the limit is refused, naming it.
    client.push(vec![item("pages", "p", Some("huge"), json!("h".repeat(300_000)))]).await;
    let reply = client.get("/api/v1/messages?queue=pages&partition=p&fromOffset=5").await;
    assert_eq!(reply.status, 413, "{}", reply.text());
    assert!(reply.error().contains("offset 5"), "{}", reply.error());
}

/// Pushes one message with transactionId `id`, with `headers`.
async fn push_with(client: &mut Client, id: &str, headers: &[(&str, &str)]) -> Reply {
    let body = json!({"items": [item("web", "p", Some(id), json!(1))]}).to_string();
    client.send(Method::POST, "/api/v1/push", body, headers).await.expect("an answer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_of_another_site_cannot_write_and_command_line_habits_still_can() {
    let t = fresh_database().await;
    let gw = Gateway::start(&t.url()).await;
    let mut client = gw.client().await;
    let evil = push_with(&mut client, "evil", &[("origin", "http://evil.example"), ("content-type", "text/plain")]).await;
    assert_eq!(evil.status, 403, "{}", evil.text());
    assert!(evil.error().starts_with("origin:"), "{}", evil.error());
    let own_origin = format!("http://{}", gw.addr());
    let own = push_with(&mut client, "own", &[("origin", &own_origin)]).await;
    assert_eq!(own.status, 201, "a page of the gateway's own origin: {}", own.text());
    let curl = push_with(&mut client, "curl", &[("content-type", "application/x-www-form-urlencoded")]).await;
    assert_eq!(curl.status, 201, "curl -d: {}", curl.text());
    let text = client.send(Method::POST, "/api/v1/push", "items=1", &[("content-type", "text/plain")]).await.expect("an answer");
    assert_eq!(text.status, 400, "{}", text.text());
    assert!(text.error().starts_with("body: malformed JSON"), "{}", text.error());

    // With an origin allowed, its pages may push, and get CORS headers.
    let open = Gateway::start_with(&t.url(), &options(&["--cors-origin", "http://app.example"])).await;
    let mut browser = open.client().await;
    let allowed = push_with(&mut browser, "app", &[("origin", "http://app.example")]).await;
    assert_eq!(allowed.status, 201, "{}", allowed.text());
    assert_eq!(allowed.headers.get("access-control-allow-origin").map(|v| v.to_str().unwrap()), Some("http://app.example"));
    let preflight = browser
        .send(Method::OPTIONS, "/api/v1/push", "", &[("origin", "http://app.example"), ("access-control-request-method", "POST")])
        .await
        .expect("an answer");
    assert_eq!(preflight.status, 204);
    assert_eq!(preflight.headers.get("access-control-allow-methods").map(|v| v.to_str().unwrap()), Some("POST"));
    let asking = [("origin", "http://app.example"), ("access-control-request-method", "PUT")];
    let preflight = browser.send(Method::OPTIONS, "/api/v1/kv/n/k", "", &asking).await.expect("an answer");
    assert_eq!(preflight.status, 204);
    let methods = preflight.headers.get("access-control-allow-methods").map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(methods.as_deref(), Some("GET, PUT, DELETE"));
    let nowhere = browser.send(Method::OPTIONS, "/api/v1/nowhere", "", &asking).await.expect("an answer");
    assert_eq!(nowhere.status, 404);
    let other = push_with(&mut browser, "other", &[("origin", "http://evil.example")]).await;
    assert_eq!(other.status, 403);

    let stored: Vec<String> = t
        .client()
        .await
        .query("SELECT t FROM stile.segments s, unnest(s.transaction_ids) AS t ORDER BY t", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get("t"))
        .collect();
    assert_eq!(stored, ["app", "curl", "own"], "nothing of a refused request is written");
}

/// DNS rebinding: a page whose own name was pointed at the gateway's
/// address sends that name in `Host` and its own origin in `Origin`, which
/// match. Its name is not one the gateway is known by, so its requests are
/// refused, writes and same-origin reads alike; addresses, `localhost`,
/// names given with `--allowed-hosts`, and tools that send no browser header
/// are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_whose_name_was_rebound_to_the_gateway_is_refused() {
    let t = fresh_database().await;
    let gw = Gateway::start(&t.url()).await;
    let mut client = gw.client().await;
    let port = gw.addr().port();
    let rebound_host = format!("attacker.example:{port}");
    let rebound_origin = format!("http://attacker.example:{port}");
    let rebound = push_with(
        &mut client,
        "rebound",
        &[("host", &rebound_host), ("origin", &rebound_origin), ("content-type", "text/plain")],
    )
    .await;
    assert_eq!(rebound.status, 403, "{}", rebound.text());
    assert!(rebound.error().starts_with("host:") && rebound.error().contains("--allowed-hosts"), "{}", rebound.error());
    // A same-origin fetch of the rebound page sends no Origin with a GET,
    // but a browser marks it with Sec-Fetch-*.
    let read = client
        .send(
            Method::GET,
            "/api/v1/messages?queue=web&partition=p",
            "",
            &[("host", &rebound_host), ("sec-fetch-site", "same-origin")],
        )
        .await
        .expect("an answer");
    assert_eq!(read.status, 403, "{}", read.text());
    for name in [format!("localhost:{port}"), format!("127.0.0.1:{port}"), format!("LocalHost.:{port}")] {
        let origin = format!("http://{name}");
        let own = push_with(&mut client, &format!("own {name}"), &[("host", &name), ("origin", &origin)]).await;
        assert_eq!(own.status, 201, "{name}: {}", own.text());
    }
    let tool = push_with(&mut client, "tool", &[("host", &rebound_host)]).await;
    assert_eq!(tool.status, 201, "a client that is not a browser, by any name: {}", tool.text());

    let named = Gateway::start_with(&t.url(), &options(&["--allowed-hosts", "queue.internal, attacker.example"])).await;
    let mut client = named.client().await;
    let port = named.addr().port();
    let allowed_host = format!("attacker.example:{port}");
    let allowed_origin = format!("http://attacker.example:{port}");
    let allowed = push_with(&mut client, "allowed", &[("host", &allowed_host), ("origin", &allowed_origin)]).await;
    assert_eq!(allowed.status, 201, "{}", allowed.text());
    let other_host = format!("other.example:{port}");
    let other_origin = format!("http://other.example:{port}");
    let other = push_with(&mut client, "other", &[("host", &other_host), ("origin", &other_origin)]).await;
    assert_eq!(other.status, 403, "{}", other.text());

    let mut stored: Vec<String> = t
        .client()
        .await
        .query("SELECT transaction_id FROM stile.messages", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get("transaction_id"))
        .collect();
    stored.sort();
    let first = gw.addr().port();
    let mut expected = vec![
        "allowed".to_owned(),
        format!("own 127.0.0.1:{first}"),
        format!("own LocalHost.:{first}"),
        format!("own localhost:{first}"),
        "tool".to_owned(),
    ];
    expected.sort();
    assert_eq!(stored, expected, "nothing of a refused request is written");
}

/// Headers a request may carry once, sent twice, are refused naming the
/// header: the gateway's checks read one value, and something behind it
/// might read the other (`identity` then `gzip`, or a harmless origin then
/// another).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_sent_twice_is_refused_naming_it() {
    let t = fresh_database().await;
    let gw = Gateway::start(&t.url()).await;
    let mut client = gw.client().await;
    let own_origin = format!("http://{}", gw.addr());
    let cases: [(&str, [(&str, &str); 2]); 3] = [
        ("content-encoding", [("content-encoding", "identity"), ("content-encoding", "gzip")]),
        ("origin", [("origin", &own_origin), ("origin", "http://evil.example")]),
        ("origin", [("origin", &own_origin), ("origin", &own_origin)]),
    ];
    for (i, (header, headers)) in cases.iter().enumerate() {
        let reply = push_with(&mut client, &format!("twice-{i}"), headers).await;
        assert_eq!(reply.status, 400, "{headers:?}: {}", reply.text());
        assert!(reply.error().starts_with(&format!("{header}: sent 2 times")), "{}", reply.error());
    }
    let gzip = push_with(&mut client, "gzip", &[("content-encoding", "identity, gzip")]).await;
    assert_eq!(gzip.status, 415, "{}", gzip.text());
    let once = push_with(&mut client, "once", &[("content-encoding", "identity"), ("origin", &own_origin)]).await;
    assert_eq!(once.status, 201, "{}", once.text());
    let stored: Vec<String> = t
        .client()
        .await
        .query("SELECT transaction_id FROM stile.messages", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get("transaction_id"))
        .collect();
    assert_eq!(stored, ["once"], "nothing of a refused request is written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_that_differ_only_in_unicode_normalization_are_one_queue() {
    let t = fresh_database().await;
    let gw = Gateway::start(&t.url()).await;
    let mut client = gw.client().await;
    let composed = client.push(vec![item("caf\u{e9}", "r\u{e9}gion", Some("order-1"), json!(1))]).await;
    let decomposed = client.push(vec![item("cafe\u{301}", "re\u{301}gion", Some("order-1"), json!(1))]).await;
    assert_eq!(composed[0].status, "queued");
    assert_eq!((decomposed[0].status.as_str(), decomposed[0].offset), ("duplicate", composed[0].offset));
    assert_eq!((decomposed[0].queue.as_str(), decomposed[0].partition.as_str()), ("caf\u{e9}", "r\u{e9}gion"));
    let queues: i64 = t.client().await.query_one("SELECT count(*) AS queues FROM stile.queues", &[]).await.unwrap().get("queues");
    assert_eq!(queues, 1);
    let read = client.get("/api/v1/messages?queue=cafe%CC%81&partition=re%CC%81gion").await.json();
    assert_eq!(read["messages"].as_array().map(Vec::len), Some(1), "a read by either spelling finds the queue");
}
