//! Bad input over HTTP: every refusal is a 4xx with a JSON `{"error": ...}`
//! naming the field, and nothing of a refused request is written.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hyper::Method;
use serde_json::json;
use stile_tests::gateway::{Gateway, GatewayOptions, fresh_database, item};

/// One request that must be refused.
struct Case {
    what: &'static str,
    method: Method,
    path: String,
    body: Vec<u8>,
    status: u16,
    /// The error message starts with this (the field it names).
    field: String,
}

fn case(what: &'static str, path: &str, body: impl Into<Vec<u8>>, status: u16, field: &str) -> Case {
    Case { what, method: Method::POST, path: path.to_owned(), body: body.into(), status, field: field.to_owned() }
}

fn push(what: &'static str, body: impl Into<Vec<u8>>, field: &str) -> Case {
    case(what, "/api/v1/push", body, 400, field)
}

fn push_item(what: &'static str, item: serde_json::Value, field: &str) -> Case {
    push(what, json!({ "items": [item] }).to_string(), field)
}

fn configure(what: &'static str, body: serde_json::Value, field: &str) -> Case {
    case(what, "/api/v1/configure", body.to_string(), 400, field)
}

fn get(what: &'static str, path: &str, status: u16, field: &str) -> Case {
    Case { what, method: Method::GET, path: path.to_owned(), body: Vec::new(), status, field: field.to_owned() }
}

fn bad_cases() -> Vec<Case> {
    let long_name = "n".repeat(256);
    let long_multibyte = "é".repeat(128); // 256 bytes, 128 characters
    let mut too_many = String::from(r#"{"items":["#);
    for i in 0..100_000 {
        if i > 0 {
            too_many.push(',');
        }
        too_many.push_str(r#"{"queue":"bad-many"}"#);
    }
    too_many.push_str("]}");
    vec![
        // The body as a whole.
        push("malformed JSON", r#"{"items":[{"queue":bad-malformed}]}"#, "body"),
        push("truncated JSON", r#"{"items":[{"queue":"bad-truncated","transactionId":"a"#, "body"),
        push("empty body", "", "body"),
        push("trailing garbage", r#"{"items":[{"queue":"bad-trailing"}]} x"#, "body"),
        push("not an object", r#"[{"queue":"bad-array"}]"#, "body"),
        push("invalid UTF-8 in a string", &b"{\"items\":[{\"queue\":\"bad-\xff\xfe\"}]}"[..], "body"),
        push("invalid UTF-8 outside strings", &b"{\"items\":[{\"queue\":\"bad-utf8\"}]}\xc3"[..], "body"),
        push("a raw control character in a string", "{\"items\":[{\"queue\":\"bad-\u{1}raw\"}]}", "body"),
        // items.
        push("items missing", r#"{"queue":"bad-no-items"}"#, "items: missing"),
        push("items not an array", r#"{"items":{"queue":"bad-items-object"}}"#, "items: expected an array"),
        push("items null", r#"{"items":null}"#, "items: expected an array"),
        push("items empty", r#"{"items":[]}"#, "items: must not be empty"),
        push("an item not an object", r#"{"items":["bad-string-item"]}"#, "items[0]: expected an object"),
        // queue.
        push_item("queue missing", json!({"partition": "p", "payload": 1, "transactionId": "bad"}), "items[0].queue: missing"),
        push_item("queue a number", json!({"queue": 7}), "items[0].queue: expected a string"),
        push_item("queue null", json!({"queue": null}), "items[0].queue: expected a string"),
        push_item("queue an array", json!({"queue": ["bad-q"]}), "items[0].queue: expected a string"),
        push_item("queue empty", json!({"queue": ""}), "items[0].queue: must not be empty"),
        push_item("queue of 256 bytes", json!({"queue": long_name}), "items[0].queue: 256 bytes"),
        push_item("queue of 256 bytes in 128 characters", json!({"queue": long_multibyte}), "items[0].queue: 256 bytes"),
        push_item("queue with a unit separator", json!({"queue": "bad\u{1f}queue"}), "items[0].queue: must not contain control"),
        push_item("queue with a newline", json!({"queue": "bad\nqueue"}), "items[0].queue: must not contain control"),
        push_item("queue with DEL", json!({"queue": "bad\u{7f}"}), "items[0].queue: must not contain control"),
        push_item("queue with a C1 control", json!({"queue": "bad\u{85}"}), "items[0].queue: must not contain control"),
        // partition.
        push_item("partition a number", json!({"queue": "bad-p", "partition": 5}), "items[0].partition: expected a string"),
        push_item("partition an object", json!({"queue": "bad-p", "partition": {}}), "items[0].partition: expected a string"),
        push_item("partition empty", json!({"queue": "bad-p", "partition": ""}), "items[0].partition: must not be empty"),
        push_item("partition of 256 bytes", json!({"queue": "bad-p", "partition": long_name}), "items[0].partition: 256 bytes"),
        push_item("partition with a tab", json!({"queue": "bad-p", "partition": "a\tb"}), "items[0].partition: must not contain"),
        // transactionId.
        push_item("transactionId a number", json!({"queue": "bad-t", "transactionId": 9137}), "items[0].transactionId: expected"),
        push_item("transactionId a boolean", json!({"queue": "bad-t", "transactionId": true}), "items[0].transactionId: expected"),
        push_item("transactionId an object", json!({"queue": "bad-t", "transactionId": {}}), "items[0].transactionId: expected"),
        push_item("transactionId empty", json!({"queue": "bad-t", "transactionId": ""}), "items[0].transactionId: must not be"),
        push_item(
            "transactionId of 65,536 bytes",
            json!({"queue": "bad-t", "transactionId": "t".repeat(65_536)}),
            "items[0].transactionId: 65536 bytes",
        ),
        push_item(
            "transactionId with U+0000",
            json!({"queue": "bad-t", "transactionId": "order\u{0}1"}),
            "items[0].transactionId: must not contain the character U+0000",
        ),
        // One bad item refuses the whole request, good items before it too.
        push(
            "a bad item after good ones",
            json!({"items": [item("bad-mixed", "p", Some("a"), json!(1)), item("bad-mixed", "p", Some("b"), json!(2)), {"queue": 1}]})
                .to_string(),
            "items[2].queue",
        ),
        case("100,000 items", "/api/v1/push", too_many, 413, "items: 100000 items exceed the limit of 10000"),
        // configure.
        configure("an unknown option", json!({"queue": "bad-cfg", "options": {"colour": "red"}}), "colour: unknown option"),
        configure(
            "an unknown option beside a good one",
            json!({"queue": "bad-cfg", "options": {"dedupWindowSeconds": 5, "colour": "red"}}),
            "colour",
        ),
        configure("a negative window", json!({"queue": "bad-cfg", "options": {"dedupWindowSeconds": -1}}), "dedupWindowSeconds"),
        configure("a fractional window", json!({"queue": "bad-cfg", "options": {"dedupWindowSeconds": 1.5}}), "dedupWindowSeconds"),
        configure("a window as a string", json!({"queue": "bad-cfg", "options": {"dedupWindowSeconds": "60"}}), "dedupWindowSeconds"),
        configure(
            "a window beyond 32 bits",
            json!({"queue": "bad-cfg", "options": {"dedupWindowSeconds": 4_294_967_296u64}}),
            "dedupWindowSeconds",
        ),
        configure("a boolean as a number", json!({"queue": "bad-cfg", "options": {"encryptionEnabled": 1}}), "encryptionEnabled"),
        configure("an unknown top-level field", json!({"queue": "bad-cfg", "colour": "red"}), "colour"),
        configure("queue missing", json!({"options": {"dedupWindowSeconds": 5}}), "queue: missing"),
        configure("queue a number", json!({"queue": 5}), "queue: expected a string"),
        configure("queue empty", json!({"queue": ""}), "queue: must not be empty"),
        configure("queue with a control character", json!({"queue": "bad\u{1}cfg"}), "queue: must not contain"),
        configure("options not an object", json!({"queue": "bad-cfg", "options": [1]}), "options: expected an object"),
        configure("an unknown mode", json!({"queue": "bad-cfg", "mode": "upsert"}), "mode"),
        configure("a namespace with U+0000", json!({"queue": "bad-cfg", "namespace": "n\u{0}"}), "options.namespace: must not contain"),
        configure("a queue with U+0000", json!({"queue": "bad\u{0}cfg"}), "queue: must not contain"),
        // Timers and KV.
        case(
            "a timer's txn with U+0000",
            "/api/v1/timers",
            json!({"operations": [{"op": "schedule", "queue": "bad-timer", "timerKey": "k", "delayMs": 1,
                                    "txn": "t\u{0}", "payload": "MQ=="}]})
            .to_string(),
            400,
            "operations[0].txn: must not contain",
        ),
        case(
            "a timer's delay far in the past",
            "/api/v1/timers",
            json!({"operations": [{"op": "schedule", "queue": "bad-timer", "timerKey": "k", "delayMs": -1e15,
                                    "payload": "MQ=="}]})
            .to_string(),
            400,
            "operations[0].delayMs",
        ),
        case(
            "a timer's integer delay far in the past",
            "/api/v1/timers",
            json!({"operations": [{"op": "schedule", "queue": "bad-timer", "timerKey": "k", "delayMs": -1_000_000_000_000_000i64,
                                    "payload": "MQ=="}]})
            .to_string(),
            400,
            "operations[0].delayMs: is more than",
        ),
        case(
            "a timer's payload nested past the limit",
            "/api/v1/timers",
            json!({"operations": [{"op": "schedule", "queue": "bad-timer", "timerKey": "k", "delayMs": 1000,
                                    "payload": STANDARD.encode(format!("{}1{}", "[".repeat(128), "]".repeat(128)))}]})
            .to_string(),
            400,
            "operations[0].payload: the decoded bytes: nests arrays and objects deeper than 127 levels",
        ),
        case(
            "a KV value with U+0000 in a key of an object",
            "/api/v1/kv",
            json!({"operations": [{"op": "put", "ns": "n", "key": "k", "value": {"a\u{0}": 1}, "forever": true}]}).to_string(),
            400,
            "operations[0].value: must not contain",
        ),
        case(
            "a KV value with a number past 64 bits",
            "/api/v1/kv",
            r#"{"operations": [{"op": "put", "ns": "n", "key": "k", "value": 123456789012345678901234567890, "forever": true}]}"#,
            400,
            "operations[0].value: the number 123456789012345678901234567890 would not be kept as written",
        ),
        push_item("a payload of U+0000", json!({"queue": "bad-nul", "payload": "\u{0}"}), "items[0].payload: must not contain the character U+0000"),
        push_item(
            "a payload with U+0000 in a key of an object",
            json!({"queue": "bad-nul", "payload": {"a": [{"b\u{0}": 1}]}}),
            "items[0].payload: must not contain the character U+0000",
        ),
        case(
            "a timer's payload with U+0000",
            "/api/v1/timers",
            json!({"operations": [{"op": "schedule", "queue": "bad-timer", "timerKey": "k", "delayMs": 1,
                                    "payload": STANDARD.encode(r#"["\u0000"]"#)}]})
            .to_string(),
            400,
            "operations[0].payload: the decoded bytes: must not contain the character U+0000",
        ),
        configure(
            "a namespace of 100 KB",
            json!({"queue": "bad-cfg", "namespace": "n".repeat(100_000)}),
            "options.namespace: 100000 bytes exceed the limit of 255",
        ),
        configure(
            "a task of 256 bytes",
            json!({"queue": "bad-cfg", "options": {"task": "t".repeat(256)}}),
            "options.task: 256 bytes exceed the limit of 255",
        ),
        case(
            "a payload nested past the limit",
            "/api/v1/push",
            format!(r#"{{"items":[{{"queue":"deep","payload":{}1{}}}]}}"#, "[".repeat(128), "]".repeat(128)),
            400,
            "items[0].payload: nests arrays and objects deeper than 127 levels",
        ),
        get("a timer peek with U+0000 in its key", "/api/v1/timers/q/k%00", 400, "timerKey: must not contain"),
        get("a timer list with U+0000 in after", "/api/v1/timers/q?after=a%00", 400, "after: must not contain"),
        Case { method: Method::DELETE, ..get("a timer cancel's txn with U+0000", "/api/v1/timers/q/k?txn=a%00", 400, "txn: must not") },
        case("configure with malformed JSON", "/api/v1/configure", r#"{"queue":"bad-cfg","#, 400, "body"),
        // Reads.
        get("messages without a queue", "/api/v1/messages?partition=p", 400, "queue: must not be empty"),
        get("messages with a bad fromOffset", "/api/v1/messages?queue=q&fromOffset=abc", 400, "fromOffset"),
        get("messages from a negative offset", "/api/v1/messages?queue=q&fromOffset=-1", 400, "fromOffset: must be 0 or more, got -1"),
        get("messages with a zero limit", "/api/v1/messages?queue=q&limit=0", 400, "limit"),
        get("messages with an over-long partition", &format!("/api/v1/messages?queue=q&partition={long_name}"), 400, "partition"),
        get("lookup without a transactionId", "/api/v1/messages/by-transaction-id?queue=q&partition=p", 400, "transactionId"),
        get("lookup of an unknown transactionId", "/api/v1/messages/by-transaction-id?queue=q&transactionId=x", 404, "transactionId"),
        get(
            "lookup of a transactionId with U+0000",
            "/api/v1/messages/by-transaction-id?queue=q&transactionId=a%00b",
            400,
            "transactionId: must not contain",
        ),
        get("messages of a queue with U+0000", "/api/v1/messages?queue=q%00", 400, "queue: must not contain"),
        get("messages of a queue given twice", "/api/v1/messages?queue=a&queue=b", 400, "queue: given more than once"),
        get("messages of a queue that is not UTF-8", "/api/v1/messages?queue=%FF", 400, "queue: not percent-encoded UTF-8"),
        get("a timer list whose after is not UTF-8", "/api/v1/timers/q?after=%C3", 400, "after: not percent-encoded UTF-8"),
        // Routes.
        get("GET on the push route", "/api/v1/push", 405, "GET"),
        get("an unknown route", "/api/v2/push", 404, "no route"),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_4xx_naming_the_field_and_writes_nothing() {
    let t = fresh_database().await;
    let gw = Gateway::start(&t.url()).await;
    let mut client = gw.client().await;

    for case in bad_cases() {
        let reply = client.send(case.method.clone(), &case.path, case.body.clone(), &[]).await.unwrap();
        assert_eq!(reply.status, case.status, "{}: {}", case.what, reply.text());
        assert_eq!(reply.content_type.as_deref(), Some("application/json"), "{}", case.what);
        let error = reply.error();
        assert!(error.starts_with(&case.field), "{}: expected an error naming {:?}, got {error:?}", case.what, case.field);
    }

    // What is at the limits is accepted.
    let at_limit = "t".repeat(65_535);
    let long = client.push(vec![item("ok", "p", Some(&at_limit), json!(1))]).await;
    assert_eq!((long[0].status.as_str(), long[0].offset), ("queued", 0));
    assert_eq!(long[0].transaction_id.len(), 65_535);
    let again = client.push(vec![item("ok", "p", Some(&at_limit), json!(2))]).await;
    assert_eq!((again[0].status.as_str(), again[0].offset), ("duplicate", 0), "a 65,535-byte id deduplicates too");
    let (queue, partition) = ("q".repeat(255), "é".repeat(127)); // 255 and 254 bytes
    let named = client.push(vec![item(&queue, &partition, Some("a"), json!(3))]).await;
    assert_eq!((named[0].queue.as_str(), named[0].partition.as_str(), named[0].offset), (queue.as_str(), partition.as_str(), 0));
    let items: Vec<_> = (0..10_000).map(|_| json!({"queue": "ok-many"})).collect();
    let many = client.push(items).await;
    assert_eq!(many.len(), 10_000, "exactly --max-items items are accepted");
    assert_eq!(many.last().map(|a| a.offset), Some(9_999));
    assert_eq!(client.configure("ok", json!({"dedupWindowSeconds": 0, "namespace": "n", "task": null})).await["namespace"], "n");

    // A body over --body-limit, on a gateway with a small one.
    let small = Gateway::start_with(&t.url(), &GatewayOptions { body_limit: Some(2048), ..Default::default() }).await;
    let mut small_client = small.client().await;
    let fits = json!({"items": [item("ok-small", "p", Some("a"), json!("x".repeat(1500)))]}).to_string();
    assert!(fits.len() <= 2048);
    assert_eq!(small_client.post("/api/v1/push", fits).await.status, 201);
    let over = json!({"items": [item("bad-body-limit", "p", Some("a"), json!("x".repeat(4000)))]}).to_string();
    let reply = small_client.post("/api/v1/push", over).await;
    assert_eq!(reply.status, 413, "{}", reply.text());
    assert!(reply.error().starts_with("body: exceeds the limit of 2048 bytes"), "{}", reply.error());
    let over = json!({"queue": "bad-body-limit", "options": {"namespace": "x".repeat(4000)}}).to_string();
    assert_eq!(small_client.post("/api/v1/configure", over).await.status, 413);
    // The client reconnects if the gateway closed the connection.
    assert_eq!(small_client.get("/health").await.status, 200);

    // Nothing of the refused requests was written: only the accepted queues
    // exist, holding only the accepted messages.
    let c = t.client().await;
    let queues: Vec<String> =
        c.query("SELECT name FROM stile.queues ORDER BY name", &[]).await.unwrap().iter().map(|r| r.get("name")).collect();
    let mut expected = vec!["ok".to_owned(), "ok-many".to_owned(), "ok-small".to_owned(), queue.clone()];
    expected.sort();
    assert_eq!(queues, expected);
    let row = c
        .query_one(
            "SELECT (SELECT count(*) FROM stile.partitions) AS partitions, \
                    (SELECT coalesce(sum(end_offset - base_offset + 1), 0)::bigint FROM stile.segments) AS messages, \
                    (SELECT coalesce(sum(length(hashes) / 16), 0)::bigint FROM stile.txns) AS hashes",
            &[],
        )
        .await
        .unwrap();
    let (partitions, messages, hashes): (i64, i64, i64) = (row.get("partitions"), row.get("messages"), row.get("hashes"));
    assert_eq!(partitions, 4);
    assert_eq!(messages, 1 + 1 + 10_000 + 1);
    assert_eq!(hashes, messages);
    let window: i32 = c
        .query_one("SELECT dedup_window_seconds FROM stile.queues WHERE name = 'ok'", &[])
        .await
        .unwrap()
        .get("dedup_window_seconds");
    assert_eq!(window, 0, "only the good configure was applied");
}

/// What HTTP asks of every server, and what clients in the field send: `HEAD`
/// wherever `GET` is served (headers only), a 405 that names the methods the
/// path has (`Allow`), a 415 for a body in a coding the gateway does not
/// read, and a JSON body that starts with a UTF-8 byte order mark read as
/// the JSON after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_allow_codings_and_a_byte_order_mark_are_served_as_http_and_json_say() {
    let t = fresh_database().await;
    let gw = Gateway::start(&t.url()).await;
    let mut client = gw.client().await;

    let head = client.send(Method::HEAD, "/health", Vec::new(), &[]).await.unwrap();
    let get = client.get("/health").await;
    assert_eq!((head.status, get.status), (200, 200));
    assert!(head.body.is_empty() && !get.body.is_empty(), "HEAD answers headers only: {:?}", head.body);
    assert_eq!(head.content_type, get.content_type);

    let refused = client.send(Method::GET, "/api/v1/push", Vec::new(), &[]).await.unwrap();
    assert_eq!(refused.status, 405, "{}", refused.text());
    assert_eq!(refused.headers.get("allow").map(|v| v.to_str().unwrap()), Some("POST"));
    let refused = client.send(Method::PATCH, "/api/v1/kv/n/k", Vec::new(), &[]).await.unwrap();
    assert_eq!(refused.status, 405, "{}", refused.text());
    assert_eq!(refused.headers.get("allow").map(|v| v.to_str().unwrap()), Some("GET, HEAD, PUT, DELETE"));

    let body = json!({"items": [item("bom", "p", Some("a"), json!({"n": 1}))]}).to_string();
    let with_mark = [b"\xEF\xBB\xBF".as_slice(), body.as_bytes()].concat();
    let stored = client.post("/api/v1/push", with_mark.clone()).await;
    assert_eq!(stored.status, 201, "{}", stored.text());
    assert_eq!((stored.json()[0]["status"].as_str(), stored.json()[0]["offset"].as_i64()), (Some("queued"), Some(0)));
    let again = client.post("/api/v1/push", body).await;
    assert_eq!(again.json()[0]["status"], "duplicate", "the mark is not part of the transactionId");
    let read = client.get("/api/v1/messages?queue=bom&partition=p").await.json();
    assert_eq!(read["messages"][0]["payload"], json!({"n": 1}));

    // A compressed body is refused by its coding, not as malformed JSON.
    let body = json!({"items": [item("coded", "p", Some("a"), json!(1))]}).to_string();
    let headers = [("content-type", "application/json"), ("content-encoding", "gzip")];
    let refused = client.send(Method::POST, "/api/v1/push", body.clone(), &headers).await.unwrap();
    assert_eq!(refused.status, 415, "{}", refused.text());
    assert!(refused.error().starts_with("content-encoding: \"gzip\" is not supported"), "{}", refused.error());
    assert_eq!(client.get("/api/v1/messages?queue=coded&partition=p").await.json()["messages"], json!([]));
    let headers = [("content-type", "application/json"), ("content-encoding", "Identity")];
    assert_eq!(client.send(Method::POST, "/api/v1/push", body, &headers).await.unwrap().status, 201);

    // Only at the start: a mark anywhere else is not JSON.
    let twice = [b"\xEF\xBB\xBF".as_slice(), &with_mark].concat();
    let reply = client.post("/api/v1/push", twice).await;
    assert_eq!(reply.status, 400, "{}", reply.text());
    assert!(reply.error().starts_with("body: malformed JSON"), "{}", reply.error());
}
