//! Reads keep `--answer-limit`, and PostgreSQL builds no more of an answer
//! than the limit lets the gateway send: a page of large messages stops at
//! the limit without PostgreSQL writing temporary files, and a batch of KV
//! reads whose JSON is larger than its stored form is refused at the limit.
//! The memory that readers who do not read take up is given back once they
//! are gone.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use stile_tests::gateway::{Client, Gateway, GatewayOptions, fresh_database, item, metric};
use stile_tests::pg::TestDb;
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpSocket;

/// The connections of the gateways under test are named so, to tell them
/// from the test's own.
const APPLICATION: &str = "stile_reads_under_test";

fn with_answer_limit(limit: usize) -> GatewayOptions {
    GatewayOptions { extra_args: vec!["--answer-limit".into(), limit.to_string()], ..GatewayOptions::default() }
}

/// A gateway on `t` whose PostgreSQL sessions are named [`APPLICATION`].
async fn start(t: &TestDb, options: &GatewayOptions) -> Gateway {
    Gateway::start_with(&format!("{} application_name={APPLICATION}", t.url()), options).await
}

/// Kills `gateway` and waits until every session it had has ended. A
/// session's statistics reach `pg_stat_database` at the latest when it ends,
/// before it leaves `pg_stat_activity`.
async fn stop_and_wait_for_its_sessions(t: &TestDb, mut gateway: Gateway) {
    gateway.process().kill();
    gateway.process().wait_exit(Duration::from_secs(10)).await;
    let observer = t.client().await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let row = observer
            .query_one(
                "SELECT count(*) AS sessions FROM pg_stat_activity \
                  WHERE datname = current_database() AND application_name = $1",
                &[&APPLICATION],
            )
            .await
            .expect("read pg_stat_activity");
        if row.get::<_, i64>("sessions") == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "the killed gateway's sessions did not end");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The bytes of temporary files PostgreSQL has counted for `t`'s database,
/// read from a session of its own once the sessions to count have ended.
async fn temp_bytes(t: &TestDb) -> i64 {
    t.client()
        .await
        .query_one("SELECT temp_bytes FROM pg_stat_database WHERE datname = current_database()", &[])
        .await
        .expect("read pg_stat_database")
        .get("temp_bytes")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_of_large_messages_stops_at_the_limit_and_postgresql_writes_no_temporary_file_for_it() {
    const ANSWER_LIMIT: usize = 1 << 20;
    const MESSAGES: usize = 40;
    let t = fresh_database().await;
    // PostgreSQL's default, whatever the server's: a page the size of the
    // partition (12 MB) would not fit in it, one of the limit does.
    t.client().await.batch_execute(&format!("ALTER DATABASE \"{}\" SET work_mem = '4MB'", t.name())).await.unwrap();
    let gateway = start(&t, &with_answer_limit(ANSWER_LIMIT)).await;
    let mut client = gateway.client().await;
    // Two messages of 300 KB a push: log rows of 600 KB.
    for pair in 0..MESSAGES / 2 {
        let items = (2 * pair..2 * pair + 2)
            .map(|n| item("big", "p", Some(&format!("m{n}")), json!(format!("{n:02}").repeat(150_000))))
            .collect();
        client.push(items).await;
    }
    drop(client);
    stop_and_wait_for_its_sessions(&t, gateway).await;
    let before = temp_bytes(&t).await;

    let gateway = start(&t, &with_answer_limit(ANSWER_LIMIT)).await;
    let mut client = gateway.client().await;
    let mut offsets: Vec<i64> = Vec::new();
    loop {
        let from = offsets.last().map_or(0, |last| last + 1);
        let reply = client.get(&format!("/api/v1/messages?queue=big&partition=p&fromOffset={from}&limit=10000")).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert!(reply.body.len() <= ANSWER_LIMIT, "a page of {} bytes", reply.body.len());
        let page = reply.json();
        let messages = page["messages"].as_array().unwrap();
        offsets.extend(messages.iter().map(|m| m["offset"].as_i64().unwrap()));
        if page.get("truncated").is_none() {
            assert_eq!(messages.len(), MESSAGES % 3, "the last page holds the rest");
            break;
        }
        assert_eq!(page["truncated"], json!(true));
        assert_eq!(messages.len(), 3, "as many messages of 300 KB as 1 MB holds");
    }
    drop(client);
    stop_and_wait_for_its_sessions(&t, gateway).await;
    assert_eq!(offsets, (0..MESSAGES as i64).collect::<Vec<_>>(), "each message once, in order");
    assert_eq!(temp_bytes(&t).await, before, "PostgreSQL wrote temporary files for pages of the answer limit");

    // The count does see temporary files: the same messages sorted in one
    // query of a session of the test's own do not fit in work_mem.
    let own = t.client().await;
    let sorted: i64 = own
        .query_one("SELECT count(*) AS sorted FROM (SELECT payload::text FROM stile.messages ORDER BY 1 DESC) s", &[])
        .await
        .unwrap()
        .get("sorted");
    assert_eq!(sorted, MESSAGES as i64);
    drop(own);
    let deadline = Instant::now() + Duration::from_secs(20);
    while temp_bytes(&t).await == before {
        assert!(Instant::now() < deadline, "a sort of 12 MB in 4 MB of work_mem was not counted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_kv_reads_keeps_the_limit_when_its_json_is_larger_than_what_is_stored() {
    const ANSWER_LIMIT: usize = 1 << 20;
    const KEYS: usize = 30;
    let t = fresh_database().await;
    let gateway = start(&t, &with_answer_limit(ANSWER_LIMIT)).await;
    let mut client = gateway.client().await;
    // A control character is one byte stored and six in JSON: each value is
    // 10 KB in jsonb and 60 KB in an answer.
    let value = "\u{1}".repeat(10_000);
    let keys: Vec<String> = (0..KEYS).map(|n| format!("k{n:02}")).collect();
    // A put answers with the value it wrote: ten a call fit in the limit.
    for chunk in keys.chunks(10) {
        let puts: Vec<Value> =
            chunk.iter().map(|key| json!({"op": "put", "ns": "wide", "key": key, "value": value, "forever": true})).collect();
        let reply = client.post("/api/v1/kv", json!({ "operations": puts }).to_string()).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
    }

    let gets = |count: usize| -> String {
        let ops: Vec<Value> = keys[..count].iter().map(|key| json!({"op": "get", "ns": "wide", "key": key})).collect();
        json!({ "operations": ops }).to_string()
    };
    let fits = client.post("/api/v1/kv", gets(12)).await;
    assert_eq!(fits.status, 200, "{}", fits.text());
    assert!(fits.body.len() <= ANSWER_LIMIT && fits.body.len() > 12 * 60_000, "{} bytes", fits.body.len());
    let all = client.post("/api/v1/kv", gets(KEYS)).await;
    assert_eq!(all.status, 413, "an answer of {} bytes", all.body.len());
    // Each result is a little over 60,000 bytes: seventeen fit in the limit
    // less the room kept for what surrounds them, the eighteenth crosses it.
    assert!(all.error().starts_with("operations[17]: the answer would exceed"), "{}", all.error());

    let many = json!({"operations": [{"op": "getMany", "ns": "wide", "keys": keys}]}).to_string();
    let reply = client.post("/api/v1/kv", many).await;
    assert_eq!(reply.status, 413, "an answer of {} bytes", reply.body.len());
    assert!(reply.error().starts_with("operations[0]: the answer would exceed"), "{}", reply.error());
    let prefix = json!({"operations": [{"op": "getPrefix", "ns": "wide", "prefix": "k", "limit": 1000}]}).to_string();
    let reply = client.post("/api/v1/kv", prefix).await;
    assert_eq!(reply.status, 413, "an answer of {} bytes", reply.body.len());
    let keys_only =
        json!({"operations": [{"op": "getPrefix", "ns": "wide", "prefix": "k", "limit": 1000, "keysOnly": true}]}).to_string();
    let reply = client.post("/api/v1/kv", keys_only).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json()["results"][0]["rows"].as_array().map(Vec::len), Some(KEYS));
}

/// The resident memory of process `pid`, in bytes.
fn resident_bytes(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read the gateway's /proc status");
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().strip_suffix("kB"))
        .and_then(|kib| kib.trim().parse().ok())
        .expect("a VmRSS line in kB");
    kib << 10
}

/// Waits until the bytes the gateway holds for requests satisfy `holds`,
/// failing after `within`.
async fn wait_for_held(client: &mut Client, within: Duration, holds: impl Fn(f64) -> bool) {
    let deadline = Instant::now() + within;
    loop {
        let held = metric(&client.metrics().await, "stile_held_request_bytes");
        if holds(held) {
            return;
        }
        assert!(Instant::now() < deadline, "stile_held_request_bytes stayed at {held}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_of_answers_to_readers_that_do_not_read_is_given_back_once_they_are_cut() {
    const READERS: usize = 16;
    const MESSAGE_BYTES: usize = 1 << 20;
    const SLACK: u64 = 64 << 20;
    let t = fresh_database().await;
    // Thirty-three messages of 1 MB: a page of them is cut at the default
    // answer limit, 32 MiB.
    let writer = Gateway::start(&t.url()).await;
    let mut client = writer.client().await;
    for n in 0..33 {
        client.push(vec![item("big", "p", Some(&format!("m{n}")), json!(format!("{n:02}").repeat(MESSAGE_BYTES / 2)))]).await;
    }
    drop((client, writer));

    // The budget holds every answer, so that each reader gets its page.
    let options = GatewayOptions {
        max_held_mb: Some(2048),
        extra_args: vec!["--send-timeout".into(), "20".into()],
        ..GatewayOptions::default()
    };
    let gateway = Gateway::start_with(&t.url(), &options).await;
    let mut client = gateway.client().await;
    let start = resident_bytes(gateway.pid());
    let mut readers = Vec::new();
    for _ in 0..READERS {
        let socket = TcpSocket::new_v4().expect("a socket");
        socket.set_recv_buffer_size(4096).expect("a small receive buffer");
        let mut stream = socket.connect(gateway.addr()).await.expect("connect");
        stream
            .write_all(b"GET /api/v1/messages?queue=big&partition=p&limit=10000 HTTP/1.1\r\nhost: stile\r\n\r\n")
            .await
            .expect("ask for the page");
        readers.push(stream);
    }
    // Their answers are built and wait, unsent: at least half of each is
    // resident.
    let taken = start + READERS as u64 * (16 << 20);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut during = resident_bytes(gateway.pid());
    while during <= taken {
        assert!(Instant::now() < deadline, "the readers took up {} MB", during.saturating_sub(start) >> 20);
        tokio::time::sleep(Duration::from_millis(50)).await;
        during = resident_bytes(gateway.pid());
    }
    // The send limit cuts them: their answers are dropped...
    wait_for_held(&mut client, Duration::from_secs(60), |held| held == 0.0).await;
    drop(readers);
    // ...and the memory they held goes back to the system.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = resident_bytes(gateway.pid());
        if now <= start + SLACK {
            println!("resident: {} MB at start, {} MB with the readers, {} MB after", start >> 20, during >> 20, now >> 20);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "resident {} MB, from {} MB at start and {} MB with the readers",
            now >> 20,
            start >> 20,
            during >> 20
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(client.get("/health").await.status, 200);
}
