//! KV and once over HTTP, against real gateway processes and PostgreSQL:
//! each operation's verdicts, expiry, the path routes, two gateways racing
//! one `once`, and bad bodies refused with nothing written.

use hyper::Method;
use serde_json::{Value, json};
use stile_tests::gateway::{Client, Gateway, fresh_database};

async fn kv(client: &mut Client, ops: Value) -> Value {
    let reply = client.post("/api/v1/kv", json!({ "operations": ops }).to_string()).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    reply.json()
}

async fn one(client: &mut Client, op: Value) -> Value {
    kv(client, json!([op])).await["results"][0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_answers_its_verdict() {
    let t = fresh_database().await;
    let gw = Gateway::start(&t.url()).await;
    let mut c = gw.client().await;

    let won =
        one(&mut c, json!({"op": "putIfAbsent", "ns": "orders", "key": "o1", "value": {"by": "a"}, "ttlSeconds": 60})).await;
    assert_eq!((won["applied"].clone(), won["op"].clone()), (json!(true), json!("put")), "{won}");
    let version = won["version"].as_i64().unwrap();
    let lost =
        one(&mut c, json!({"op": "putIfAbsent", "ns": "orders", "key": "o1", "value": {"by": "b"}, "ttlSeconds": 60})).await;
    assert_eq!(lost["applied"], json!(false));
    assert_eq!(lost["reason"], json!("exists"));
    assert_eq!(
        (lost["value"].clone(), lost["version"].as_i64()),
        (json!({"by": "a"}), Some(version)),
        "the loser sees the winner"
    );

    let stale =
        one(&mut c, json!({"op": "put", "ns": "orders", "key": "o1", "value": 2, "forever": true, "expect": version + 100}))
            .await;
    assert_eq!((stale["applied"].clone(), stale["reason"].clone()), (json!(false), json!("version")));
    let cas =
        one(&mut c, json!({"op": "put", "ns": "orders", "key": "o1", "value": 2, "forever": true, "expect": version})).await;
    assert_eq!(cas["applied"], json!(true));
    assert!(cas["version"].as_i64().unwrap() > version, "a write takes a new version");
    let must_not_exist =
        one(&mut c, json!({"op": "put", "ns": "orders", "key": "o1", "value": 3, "forever": true, "expect": 0})).await;
    assert_eq!(must_not_exist["reason"], json!("exists"));
    let update_only =
        one(&mut c, json!({"op": "put", "ns": "orders", "key": "nope", "value": 3, "forever": true, "expect": 4})).await;
    assert_eq!(update_only["reason"], json!("absent"));

    let got = one(&mut c, json!({"op": "get", "ns": "orders", "key": "o1"})).await;
    assert_eq!((got["found"].clone(), got["value"].clone(), got["expiresAt"].clone()), (json!(true), json!(2), Value::Null));
    let missing = one(&mut c, json!({"op": "get", "ns": "orders", "key": "zz"})).await;
    assert_eq!(missing["found"], json!(false));
    assert!(missing.get("value").is_none(), "a miss carries no value: {missing}");

    // incr: from zero, bounded by max without saturating, and only on numbers.
    let counter = |delta: i64| json!({"op": "incr", "ns": "limits", "key": "c", "delta": delta, "max": 10, "ttlSeconds": 60});
    assert_eq!(one(&mut c, counter(7)).await["value"], json!(7));
    let refused = one(&mut c, counter(7)).await;
    assert_eq!(
        (refused["applied"].clone(), refused["reason"].clone(), refused["value"].clone()),
        (json!(false), json!("limit"), json!(7))
    );
    assert_eq!(one(&mut c, counter(3)).await["value"], json!(10));
    let typed = one(&mut c, json!({"op": "incr", "ns": "orders", "key": "o1", "forever": true})).await;
    assert_eq!(typed["applied"], json!(true), "an integer value counts: {typed}");
    one(&mut c, json!({"op": "put", "ns": "orders", "key": "text", "value": "x", "forever": true})).await;
    let not_a_number = one(&mut c, json!({"op": "incr", "ns": "orders", "key": "text", "forever": true})).await;
    assert_eq!(not_a_number["reason"], json!("type"));

    // check, delete, getMany, getPrefix (keyset pages in byte order).
    let absent = one(&mut c, json!({"op": "check", "ns": "orders", "key": "zz", "expect": 0})).await;
    assert_eq!(absent["applied"], json!(true));
    assert_eq!(one(&mut c, json!({"op": "delete", "ns": "orders", "key": "zz"})).await["reason"], json!("absent"));
    assert_eq!(one(&mut c, json!({"op": "delete", "ns": "orders", "key": "text"})).await["applied"], json!(true));
    let many = one(&mut c, json!({"op": "getMany", "ns": "orders", "keys": ["o1", "text", "zz"]})).await;
    assert_eq!(many["rows"].as_array().unwrap().len(), 1);
    assert_eq!(many["missing"], json!(["text", "zz"]));
    for key in ["p/b", "p/a", "p/c", "q/a"] {
        one(&mut c, json!({"op": "put", "ns": "pages", "key": key, "value": key, "forever": true})).await;
    }
    let page = one(&mut c, json!({"op": "getPrefix", "ns": "pages", "prefix": "p/", "limit": 2})).await;
    let keys: Vec<&str> = page["rows"].as_array().unwrap().iter().map(|r| r["key"].as_str().unwrap()).collect();
    assert_eq!((keys, page["truncated"].clone(), page["nextAfter"].clone()), (vec!["p/a", "p/b"], json!(true), json!("p/b")));
    let next = one(&mut c, json!({"op": "getPrefix", "ns": "pages", "prefix": "p/", "after": "p/b", "keysOnly": true})).await;
    assert_eq!(next["rows"], json!([{"key": "p/c", "version": next["rows"][0]["version"]}]));
    assert_eq!(next["truncated"], json!(false));
}

/// jsonb prints a double near its limit as 309 plain digits. A value
/// holding one (as written here directly, or by a gateway of an earlier
/// build) is read back as the same double, and one written through the
/// gateway too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_holding_the_largest_double_reads_back() {
    let t = fresh_database().await;
    let gw = Gateway::start(&t.url()).await;
    let mut c = gw.client().await;
    let db = t.client().await;
    db.execute(
        "INSERT INTO stile.kv (ns, key, value, version, updated_at)
         VALUES ('o', 'old', '[1.7976931348623157e308, -1.7976931348623157e308]', nextval('stile.kv_versions'), now())",
        &[],
    )
    .await
    .expect("a value written directly");
    let old = one(&mut c, json!({"op": "get", "ns": "o", "key": "old"})).await;
    assert_eq!(old["value"], json!([f64::MAX, f64::MIN]), "{old}");
    let put = one(&mut c, json!({"op": "put", "ns": "o", "key": "new", "value": {"x": f64::MAX}, "forever": true})).await;
    assert_eq!(put["applied"], json!(true), "{put}");
    let new = one(&mut c, json!({"op": "get", "ns": "o", "key": "new"})).await;
    assert_eq!(new["value"], json!({"x": f64::MAX}), "{new}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_required_operation_writes_nothing_of_its_call() {
    let t = fresh_database().await;
    let gw = Gateway::start(&t.url()).await;
    let mut c = gw.client().await;
    one(&mut c, json!({"op": "put", "ns": "o", "key": "gate", "value": "first", "forever": true})).await;
    let answer = kv(
        &mut c,
        json!([
            {"op": "put", "ns": "o", "key": "side-effect", "value": 1, "forever": true},
            {"op": "putIfAbsent", "ns": "o", "key": "gate", "value": true, "ttlSeconds": 60, "required": true},
        ]),
    )
    .await;
    assert_eq!(answer["ok"], json!(false));
    assert_eq!((answer["reason"].clone(), answer["failedIndex"].clone()), (json!("kv_precondition"), json!(1)));
    assert_eq!((answer["kvReason"].clone(), answer["value"].clone()), (json!("exists"), json!("first")));
    let side = one(&mut c, json!({"op": "get", "ns": "o", "key": "side-effect"})).await;
    assert_eq!(side["found"], json!(false), "the put before the lost gate was rolled back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_key_is_never_returned_and_is_purged() {
    let t = fresh_database().await;
    let gw = Gateway::start(&t.url()).await;
    let mut c = gw.client().await;
    one(&mut c, json!({"op": "put", "ns": "o", "key": "short", "value": 1, "ttlSeconds": 60})).await;
    one(&mut c, json!({"op": "incr", "ns": "o", "key": "window", "ttlSeconds": 60})).await;
    // Age both keys past their time in PostgreSQL, as the clock would.
    let db = t.client().await;
    db.execute("UPDATE stile.kv SET expires_at = clock_timestamp() - interval '1 second'", &[]).await.unwrap();

    assert_eq!(one(&mut c, json!({"op": "get", "ns": "o", "key": "short"})).await["found"], json!(false));
    let many = one(&mut c, json!({"op": "getMany", "ns": "o", "keys": ["short"]})).await;
    assert_eq!(many["missing"], json!(["short"]));
    let prefix = one(&mut c, json!({"op": "getPrefix", "ns": "o", "prefix": "s"})).await;
    assert_eq!(prefix["rows"], json!([]));
    assert_eq!(c.get("/api/v1/kv/o/short").await.status, 404);
    let again = one(&mut c, json!({"op": "putIfAbsent", "ns": "o", "key": "short", "value": 2, "ttlSeconds": 60})).await;
    assert_eq!(again["applied"], json!(true), "an expired key is absent to putIfAbsent");
    let restarted = one(&mut c, json!({"op": "incr", "ns": "o", "key": "window", "delta": 5, "ttlSeconds": 60})).await;
    assert_eq!(restarted["value"], json!(5), "an expired counter starts again from zero");

    // The background purge deletes what expired (it runs every few seconds).
    db.execute("UPDATE stile.kv SET expires_at = clock_timestamp() - interval '1 second'", &[]).await.unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let left: i64 = db.query_one("SELECT count(*) AS left FROM stile.kv", &[]).await.unwrap().get("left");
        if left == 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{left} expired keys were not purged");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_path_routes_get_put_and_delete_one_key() {
    let t = fresh_database().await;
    let gw = Gateway::start(&t.url()).await;
    let mut c = gw.client().await;
    let put = c.send(Method::PUT, "/api/v1/kv/orders/a%2Fb/c", r#"{"value":{"x":1},"forever":true}"#, &[]).await.unwrap();
    assert_eq!(put.status, 200, "{}", put.text());
    let version = put.json()["results"][0]["version"].as_i64().unwrap();
    let got = c.get("/api/v1/kv/orders/a%2Fb/c").await;
    assert_eq!(got.status, 200);
    assert_eq!(got.json()["key"], json!("a/b/c"));
    assert_eq!(got.json()["value"], json!({"x": 1}));
    let etag = one(&mut c, json!({"op": "get", "ns": "orders", "key": "a/b/c"})).await["version"].as_i64();
    assert_eq!(etag, Some(version));
    let deleted = c.send(Method::DELETE, "/api/v1/kv/orders/a%2Fb/c", "", &[]).await.unwrap();
    assert_eq!(deleted.json()["results"][0]["applied"], json!(true));
    assert_eq!(c.get("/api/v1/kv/orders/a%2Fb/c").await.status, 404);
    let bad = c.send(Method::PUT, "/api/v1/kv/orders/k", r#"{"value":1}"#, &[]).await.unwrap();
    assert_eq!(bad.status, 400);
    assert!(bad.error().contains("ttlSeconds or forever"), "{}", bad.error());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_racing_one_once_have_exactly_one_winner() {
    const CALLERS: usize = 16;
    const KEYS: usize = 20;
    let t = fresh_database().await;
    let gateways = [Gateway::start(&t.url()).await, Gateway::start(&t.url()).await];
    let mut tasks = Vec::new();
    for caller in 0..CALLERS {
        let mut client = gateways[caller % 2].client().await;
        tasks.push(tokio::spawn(async move {
            let mut won = Vec::new();
            for key in 0..KEYS {
                let op = json!({"op": "putIfAbsent", "ns": "once", "key": format!("k{key}"), "value": caller,
                                "ttlSeconds": 600, "required": true});
                let answer = kv(&mut client, json!([op])).await;
                if answer.get("results").is_some() {
                    assert_eq!(answer["results"][0]["applied"], json!(true), "{answer}");
                    won.push(key);
                } else {
                    assert_eq!(answer["reason"], json!("kv_precondition"), "{answer}");
                }
            }
            (caller, won)
        }));
    }
    let mut winners = vec![Vec::new(); KEYS];
    for task in tasks {
        let (caller, won) = task.await.unwrap();
        for key in won {
            winners[key].push(caller);
        }
    }
    let db = t.client().await;
    for (key, winners) in winners.iter().enumerate() {
        assert_eq!(winners.len(), 1, "key k{key} was won by {winners:?}");
        let row = db.query_one("SELECT value FROM stile.kv WHERE ns = 'once' AND key = $1", &[&format!("k{key}")]).await.unwrap();
        let stored: Value = row.get("value");
        assert_eq!(stored, json!(winners[0]), "the stored value is the winner's");
    }
}

/// Two calls writing the same keys in other orders: each call locks its keys
/// in key order before applying any, so one waits for the other. Applied in
/// the operations' order, the first would hold `a` and wait for `h` (held
/// here), the second hold `b` and wait for `a`, and once `h` is let go the
/// first would wait for `b`: a deadlock, one of them answered 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_writing_keys_in_other_orders_do_not_deadlock() {
    let t = fresh_database().await;
    let gw = Gateway::start(&t.url()).await;
    let mut c = gw.client().await;
    let put = |key: &str, value: i64| json!({"op": "put", "ns": "order", "key": key, "value": value, "forever": true});
    kv(&mut c, json!([put("h", 0)])).await;
    let mut holder = t.client().await;
    let lock = holder.transaction().await.unwrap();
    lock.execute("SELECT 1 FROM stile.kv WHERE ns = 'order' AND key = 'h' FOR UPDATE", &[]).await.unwrap();

    let mut first_client = gw.client().await;
    let first_ops = json!([put("a", 1), put("h", 1), put("b", 1)]);
    let first = tokio::spawn(async move { kv(&mut first_client, first_ops).await });
    t.wait_for_lock_waiters(1, "the first call never waited for h").await;
    let mut second_client = gw.client().await;
    let second_ops = json!([put("b", 2), put("a", 2)]);
    let second = tokio::spawn(async move { kv(&mut second_client, second_ops).await });
    t.wait_for_lock_waiters(2, "the second call never waited").await;
    lock.rollback().await.unwrap();

    let (first, second) = (first.await.unwrap(), second.await.unwrap());
    for answer in [&first, &second] {
        let results = answer["results"].as_array().unwrap();
        assert!(results.iter().all(|r| r["applied"] == json!(true)), "{answer}");
    }
    let got = kv(&mut c, json!([{"op": "getMany", "ns": "order", "keys": ["a", "b", "h"]}])).await;
    let values: Vec<&Value> = got["results"][0]["rows"].as_array().unwrap().iter().map(|r| &r["value"]).collect();
    assert_eq!(values, vec![&json!(2), &json!(2), &json!(1)], "the second call, which waited, wrote a and b last: {got}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_bodies_are_refused_naming_the_field_and_write_nothing() {
    let t = fresh_database().await;
    let gw = Gateway::start(&t.url()).await;
    let mut c = gw.client().await;
    let cases = [
        (
            json!({"operations": [{"op": "put", "ns": "o", "key": "a", "value": 1, "forever": true},
                               {"op": "put", "ns": "o", "key": "b", "value": 1}]}),
            "operations[1]: exactly one of ttlSeconds or forever",
        ),
        (
            json!({"operations": [{"op": "put", "ns": "o", "key": "a", "value": 1, "forever": true},
                               {"op": "get", "ns": "NO", "key": "b"}]}),
            "operations[1].ns",
        ),
        (
            json!({"operations": [{"op": "put", "ns": "o", "key": "a", "value": "x".repeat(70_000), "forever": true}]}),
            "operations[0].value",
        ),
        (json!({"operations": "nope"}), "operations: expected an array"),
        (json!({"operations": [{"op": "incr", "ns": "o", "key": "a", "delta": "1", "forever": true}]}), "operations[0].delta"),
    ];
    for (body, expected) in cases {
        let reply = c.post("/api/v1/kv", body.to_string()).await;
        assert!(matches!(reply.status, 400 | 413), "{body}: {}", reply.status);
        assert!(reply.error().starts_with(expected), "{body}: {}", reply.error());
    }
    let reply = c.post("/api/v1/kv", "{\"operations\": [").await;
    assert_eq!(reply.status, 400);
    let rows: i64 = t.client().await.query_one("SELECT count(*) AS rows FROM stile.kv", &[]).await.unwrap().get("rows");
    assert_eq!(rows, 0, "a refused request wrote nothing");
}

/// A prefix page holds exactly the keys that start with the prefix, in byte
/// order, whatever characters end the prefix: the last one below U+D800 and
/// the greatest, whose successors the key range is bounded by, and a prefix
/// of nothing but the greatest. Asked more than five times each, so that the
/// reads also run on the plans PostgreSQL caches after its first custom ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_page_holds_exactly_the_keys_starting_with_the_prefix() {
    let t = fresh_database().await;
    let gw = Gateway::start(&t.url()).await;
    let mut c = gw.client().await;
    let greatest = '\u{10FFFF}';
    let keys: Vec<String> = [
        "a",
        "a/",
        "a/x",
        "a0",
        "b",
        "b/",
        "\u{D7FF}",
        "\u{D7FF}x",
        "\u{E000}",
        "x\u{D7FF}",
        "x\u{D7FF}y",
        "x\u{E000}",
        "y",
        "y\u{10FFFF}",
        "y\u{10FFFF}z",
        "z",
        "\u{10FFFF}",
        "\u{10FFFF}\u{10FFFF}",
        "\u{10FFFF}a",
    ]
    .iter()
    .map(|k| k.to_string())
    .collect();
    for key in &keys {
        one(&mut c, json!({"op": "put", "ns": "edges", "key": key, "value": 1, "forever": true})).await;
    }
    let prefixes = ["a", "a/", "b", "\u{D7FF}", "x\u{D7FF}", "y", &format!("y{greatest}"), &greatest.to_string(), "q"];
    for round in 0..7 {
        for prefix in prefixes {
            let page =
                one(&mut c, json!({"op": "getPrefix", "ns": "edges", "prefix": prefix, "limit": 100, "keysOnly": true})).await;
            let got: Vec<&str> = page["rows"].as_array().unwrap().iter().map(|r| r["key"].as_str().unwrap()).collect();
            let mut want: Vec<&str> = keys.iter().map(String::as_str).filter(|k| k.starts_with(prefix)).collect();
            want.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
            assert_eq!(got, want, "round {round}, prefix {prefix:?}");
        }
    }
}

/// A number of a value, as the test writes it: an integer near an edge of
/// what a value holds, or one of more digits than any double has.
#[derive(Clone, Debug)]
enum Number {
    Integer(i128),
    Long(String),
}

impl Number {
    fn text(&self) -> String {
        match self {
            Number::Integer(n) => n.to_string(),
            Number::Long(digits) => digits.clone(),
        }
    }

    /// The model: a value holds the 64-bit integers, signed or not; an
    /// integer past them, or one of more significant digits than a double
    /// has, would come back changed, and is refused.
    fn stored(&self) -> bool {
        matches!(self, Number::Integer(n) if (i128::from(i64::MIN)..=i128::from(u64::MAX)).contains(n))
    }
}

fn numbers() -> impl proptest::strategy::Strategy<Value = Number> {
    use proptest::prelude::*;
    let edges = [i128::from(i64::MIN), i128::from(i64::MAX), i128::from(u64::MAX), 1 << 53, -(1 << 53), 0, 1 << 63, 1 << 64];
    prop_oneof![
        (proptest::sample::select(edges.to_vec()), -3i128..=3).prop_map(|(edge, offset)| Number::Integer(edge + offset)),
        proptest::num::i64::ANY.prop_map(|n| Number::Integer(n.into())),
        "-?[1-9][0-9]{19,30}[1-9]".prop_map(Number::Long),
    ]
}

fn deltas() -> impl proptest::strategy::Strategy<Value = i64> {
    use proptest::prelude::*;
    prop_oneof![Just(1i64), Just(-1), Just(i64::MAX), Just(i64::MIN), -1_000i64..1_000]
}

/// Numbers at the edges of what a value holds (the 64-bit bounds, 2^53,
/// beyond them, more digits than a double has), against the model: a value
/// is stored and read back with its number as written, or refused with a
/// 400 naming it and nothing written; an `incr` of a stored number applies
/// exactly when the sum stays within 64 bits (`limit` otherwise), and is
/// refused (`type`) on a number past them.
#[test]
fn numbers_are_kept_as_written_or_refused_and_counters_stay_exact() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (t, gw) = rt.block_on(async {
        let t = fresh_database().await;
        let gw = Gateway::start(&t.url()).await;
        (t, gw)
    });
    let case = std::sync::atomic::AtomicU64::new(0);
    let config = proptest::test_runner::Config { cases: 128, failure_persistence: None, ..Default::default() };
    let mut runner = proptest::test_runner::TestRunner::new(config);
    runner
        .run(&(numbers(), deltas()), |(number, delta)| {
            let key = format!("n{}", case.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
            let text = number.text();
            rt.block_on(async {
                let mut c = gw.client().await;
                let body = format!(
                    r#"{{"operations": [{{"op": "put", "ns": "edges", "key": "{key}", "value": {{"n": {text}}}, "forever": true}}]}}"#
                );
                let put = c.post("/api/v1/kv", body).await;
                let got = one(&mut c, json!({"op": "get", "ns": "edges", "key": key})).await;
                if !number.stored() {
                    assert_eq!(put.status, 400, "{text}: {}", put.text());
                    assert!(put.error().starts_with(&format!("operations[0].value: the number {text}")), "{}", put.error());
                    assert_eq!(got["found"], json!(false), "nothing of a refused call is written");
                    return;
                }
                assert_eq!(put.status, 200, "{text}: {}", put.text());
                assert_eq!(got["value"]["n"].to_string(), text, "read back as written");

                // The counter: a number of its own under another key.
                let counter = format!("{key}.counter");
                let body = format!(
                    r#"{{"operations": [{{"op": "put", "ns": "edges", "key": "{counter}", "value": {text}, "forever": true}}]}}"#
                );
                assert_eq!(c.post("/api/v1/kv", body).await.status, 200);
                let incr = one(&mut c, json!({"op": "incr", "ns": "edges", "key": counter, "delta": delta, "forever": true})).await;
                let Number::Integer(n) = number else { unreachable!("only integers are stored") };
                let sum = n + i128::from(delta);
                let read = one(&mut c, json!({"op": "get", "ns": "edges", "key": counter})).await["value"].to_string();
                if n > i128::from(i64::MAX) {
                    assert_eq!((&incr["applied"], &incr["reason"]), (&json!(false), &json!("type")), "{text} + {delta}: {incr}");
                    assert_eq!(read, text);
                } else if sum < i128::from(i64::MIN) || sum > i128::from(i64::MAX) {
                    assert_eq!((&incr["applied"], &incr["reason"]), (&json!(false), &json!("limit")), "{text} + {delta}: {incr}");
                    assert_eq!(read, text);
                } else {
                    assert_eq!(incr["applied"], json!(true), "{text} + {delta}: {incr}");
                    assert_eq!((incr["value"].to_string(), read), (sum.to_string(), sum.to_string()), "{text} + {delta}");
                }
            });
            Ok(())
        })
        .unwrap();

    // A number written past what a value holds by something other than a
    // gateway (plain SQL) reads back as PostgreSQL holds it, rounded, and is
    // no counter: an increment that nobody would see is refused.
    rt.block_on(async {
        let mut c = gw.client().await;
        one(&mut c, json!({"op": "put", "ns": "edges", "key": "big", "value": 1, "forever": true})).await;
        t.client()
            .await
            .execute("UPDATE stile.kv SET value = '123456789012345678901234567890' WHERE ns = 'edges' AND key = 'big'", &[])
            .await
            .unwrap();
        let incr = one(&mut c, json!({"op": "incr", "ns": "edges", "key": "big", "delta": 1, "forever": true})).await;
        assert_eq!((&incr["applied"], &incr["reason"]), (&json!(false), &json!("type")), "{incr}");
    });
}
