//! A gateway's life as a process: its log at start, graceful shutdown under
//! load and the bearer token. (A database that cannot be reached at start is tested in
//! `host/tests/cli.rs`.)

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use hyper::Method;
use serde_json::json;
use stile_tests::gateway::{Answer, Gateway, GatewayOptions, fresh_database, item};
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
