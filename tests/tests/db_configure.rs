//! Configure: creation from defaults, merge, null, replace, refusals.

use serde_json::{Map, Value, json};
use stile::configure::{ConfigureError, ConfigureMode};
use stile::db::ClockFloor;
use stile_tests::pg::{TestDb, segment};

fn defaults() -> Value {
    json!({
        "dedupWindowSeconds": 3600,
        "retentionSeconds": 0,
        "leaseTime": 300,
        "retryLimit": 3,
        "priority": 0,
        "delayedProcessing": 0,
        "windowBuffer": 0,
        "maxSize": 10000,
        "completedRetentionSeconds": 0,
        "encryptionEnabled": false,
        "namespace": null,
        "task": null,
    })
}

fn opts(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        other => panic!("not an object: {other}"),
    }
}

fn with(mut base: Value, changes: Value) -> Value {
    for (k, v) in opts(changes) {
        base[k] = v;
    }
    base
}

#[tokio::test]
async fn a_new_queue_starts_from_the_defaults() {
    let t = TestDb::new().await;
    let stored = t.db.configure("q", &Map::new(), ConfigureMode::Merge).await.unwrap();
    assert_eq!(stored, defaults());
    // A queue created by a push has the same defaults.
    t.db.resolve_partition("pushed", "p").await.unwrap();
    assert_eq!(t.db.queue_options("pushed").await.unwrap(), Some(defaults()));
    assert_eq!(t.db.queue_options("absent").await.unwrap(), None);
    // Created with options: the omitted keys are the defaults, in either mode.
    let stored = t.db.configure("r", &opts(json!({"dedupWindowSeconds": 0})), ConfigureMode::Merge).await.unwrap();
    assert_eq!(stored, with(defaults(), json!({"dedupWindowSeconds": 0})));
    let p = t.db.resolve_partition("r", "p").await.unwrap();
    assert_eq!(p.window_seconds, 0);
}

#[tokio::test]
async fn merge_leaves_omitted_keys_alone() {
    let t = TestDb::new().await;
    t.db.configure("q", &opts(json!({"dedupWindowSeconds": 0, "leaseTime": 60})), ConfigureMode::Merge).await.unwrap();
    let stored = t.db.configure("q", &opts(json!({"retryLimit": 9})), ConfigureMode::Merge).await.unwrap();
    // The queue created with deduplication off keeps it off.
    assert_eq!(stored, with(defaults(), json!({"dedupWindowSeconds": 0, "leaseTime": 60, "retryLimit": 9})));
    assert_eq!(t.db.queue_options("q").await.unwrap(), Some(stored));
}

#[tokio::test]
async fn null_restores_a_default() {
    let t = TestDb::new().await;
    t.db.configure("q", &opts(json!({"dedupWindowSeconds": 0, "namespace": "billing", "priority": -5})), ConfigureMode::Merge)
        .await
        .unwrap();
    let stored =
        t.db.configure("q", &opts(json!({"dedupWindowSeconds": null, "namespace": null})), ConfigureMode::Merge).await.unwrap();
    assert_eq!(stored, with(defaults(), json!({"priority": -5})));
    assert_eq!(t.db.resolve_partition("q", "p").await.unwrap().window_seconds, 3600);
}

#[tokio::test]
async fn replace_resets_every_omitted_key() {
    let t = TestDb::new().await;
    t.db.configure(
        "q",
        &opts(json!({"dedupWindowSeconds": 0, "retentionSeconds": 86400, "task": "import"})),
        ConfigureMode::Merge,
    )
    .await
    .unwrap();
    let stored = t.db.configure("q", &opts(json!({"maxSize": 5})), ConfigureMode::Replace).await.unwrap();
    assert_eq!(stored, with(defaults(), json!({"maxSize": 5})));
}

#[tokio::test]
async fn queens_full_option_set_is_stored_and_echoed() {
    let t = TestDb::new().await;
    let all = json!({
        "dedupWindowSeconds": 120,
        "retentionSeconds": 7200,
        "leaseTime": 30,
        "retryLimit": 5,
        "priority": 10,
        "delayedProcessing": 2,
        "windowBuffer": 1,
        "maxSize": 500,
        "completedRetentionSeconds": 60,
        "encryptionEnabled": true,
        "namespace": "billing",
        "task": "invoices",
    });
    let stored = t.db.configure("q", &opts(all.clone()), ConfigureMode::Replace).await.unwrap();
    assert_eq!(stored, all);
    // Whole numbers written as floats are stored as integers.
    let stored = t.db.configure("q", &opts(json!({"leaseTime": 45.0})), ConfigureMode::Merge).await.unwrap();
    assert_eq!(stored["leaseTime"], json!(45));
}

#[tokio::test]
async fn bad_keys_and_values_are_refused_by_name_and_nothing_is_written() {
    let t = TestDb::new().await;
    t.db.configure("q", &opts(json!({"dedupWindowSeconds": 60})), ConfigureMode::Merge).await.unwrap();
    let before = t.db.queue_options("q").await.unwrap();
    // Each refusal names the key and says what the key takes.
    let cases = [
        (json!({"dedupWindowSeconds": -1}), "dedupWindowSeconds: must be an integer from 0 to 2147483647, got -1"),
        (json!({"dedupWindowSeconds": "60"}), "dedupWindowSeconds: must be an integer, got \"60\""),
        (json!({"dedupWindowSeconds": 1.5}), "dedupWindowSeconds: must be an integer from 0 to 2147483647, got 1.5"),
        (json!({"retentionSeconds": 4_000_000_000u64}), "retentionSeconds: must be an integer from 0 to"),
        (json!({"priority": 1.5}), "priority: must be an integer from -2147483648 to 2147483647"),
        (json!({"encryptionEnabled": 1}), "encryptionEnabled:"),
        (json!({"namespace": 7}), "namespace:"),
        (json!({"leaseTime": [1]}), "leaseTime:"),
        (json!({"dedupWindow": 60}), "dedupWindow:"),
        // One bad key refuses the good ones beside it.
        (json!({"retryLimit": 1, "maxSize": -3}), "maxSize:"),
    ];
    for (options, refusal) in cases {
        for (queue, mode) in [("q", ConfigureMode::Merge), ("new", ConfigureMode::Replace)] {
            match t.db.configure(queue, &opts(options.clone()), mode).await {
                Err(ConfigureError::Invalid(message)) => {
                    assert!(message.starts_with(refusal), "{options} -> {message}")
                }
                other => panic!("{options}: expected a refusal, got {other:?}"),
            }
        }
    }
    assert_eq!(t.db.queue_options("q").await.unwrap(), before);
    // A refused create creates nothing.
    assert_eq!(t.db.queue_options("new").await.unwrap(), None);
    // A bad queue name is refused too.
    match t.db.configure("", &Map::new(), ConfigureMode::Merge).await {
        Err(ConfigureError::Invalid(message)) => assert!(message.starts_with("queue:"), "{message}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// The window of each partition's queue, as the partition's row keeps it.
async fn partition_windows(t: &TestDb) -> Vec<(String, String, i32)> {
    t.client()
        .await
        .query("SELECT queue, name, dedup_window_seconds FROM stile.partitions ORDER BY queue, name", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get("queue"), r.get("name"), r.get("dedup_window_seconds")))
        .collect()
}

fn windows(expected: &[(&str, &str, i32)]) -> Vec<(String, String, i32)> {
    expected.iter().map(|&(q, p, w)| (q.to_owned(), p.to_owned(), w)).collect()
}

/// The push reads a queue's window from each partition's row:
/// `stile.configure` and `stile.resolve_partition`, the window's writers,
/// keep that copy equal to the queue's, and the push decides by it. A window
/// written by plain SQL is not copied (the tables carry no triggers, which a
/// distributed database refuses) until the next configure puts it right.
#[tokio::test]
async fn every_partition_keeps_its_queues_window_through_configure() {
    let t = TestDb::new().await;
    let a = t.db.resolve_partition("q", "a").await.unwrap();
    t.db.resolve_partition("other", "a").await.unwrap();
    t.db.configure("q", &opts(json!({"dedupWindowSeconds": 60})), ConfigureMode::Merge).await.unwrap();
    t.db.resolve_partition("q", "b").await.unwrap();
    assert_eq!(partition_windows(&t).await, windows(&[("other", "a", 3600), ("q", "a", 60), ("q", "b", 60)]));
    assert_eq!(t.db.resolve_partition("q", "a").await.unwrap().window_seconds, 60);

    // Options other than the window leave the copies alone; a replace that
    // resets the window to its default reaches them.
    t.db.configure("q", &opts(json!({"retryLimit": 5})), ConfigureMode::Merge).await.unwrap();
    assert_eq!(partition_windows(&t).await, windows(&[("other", "a", 3600), ("q", "a", 60), ("q", "b", 60)]));
    t.db.configure("q", &opts(json!({"retryLimit": 5})), ConfigureMode::Replace).await.unwrap();
    assert_eq!(partition_windows(&t).await, windows(&[("other", "a", 3600), ("q", "a", 3600), ("q", "b", 3600)]));

    // Plain SQL on the queue is put right by the next configure, even one
    // that leaves the window as it is.
    let c = t.client().await;
    c.execute("UPDATE stile.queues SET dedup_window_seconds = 0 WHERE name = 'q'", &[]).await.unwrap();
    t.db.configure("q", &opts(json!({"retryLimit": 4})), ConfigureMode::Merge).await.unwrap();
    assert_eq!(partition_windows(&t).await, windows(&[("other", "a", 3600), ("q", "a", 0), ("q", "b", 0)]));
    t.db.resolve_partition("q", "c").await.unwrap();
    assert_eq!(partition_windows(&t).await[3], ("q".to_owned(), "c".to_owned(), 0), "a new partition takes its queue's");

    // The push decides by the copy: with the window at 0 an id is stored
    // again; at an hour it is a duplicate of its first copy.
    let push = |txn: &'static str| {
        let db = t.db.clone();
        async move { db.push_bundle(ClockFloor::EPOCH, &[segment(a.id, &[txn], -1, 3600)]).await.unwrap().remove(0) }
    };
    assert!(push("x").await.stored.is_some());
    assert!(push("x").await.stored.is_some(), "no window: stored again");
    t.db.configure("q", &opts(json!({"dedupWindowSeconds": 3600})), ConfigureMode::Merge).await.unwrap();
    let again = push("x").await;
    assert!(again.stored.is_none());
    assert_eq!(again.duplicates.iter().map(|d| (d.index, d.offset)).collect::<Vec<_>>(), vec![(0, 0)]);
}

/// A configure and a creation of one of its queue's partitions, each
/// waiting for the other's commit in turn: the partition ends with the
/// configured window either way. A creation beside an uncommitted configure
/// waits for it and reads the window it commits; a configure beside an
/// uncommitted creation waits for it and then copies the window to it.
#[tokio::test]
async fn a_partition_created_beside_a_configure_takes_its_window() {
    let t = TestDb::new().await;
    t.db.resolve_partition("q", "a").await.unwrap();

    let configuring = t.client().await;
    configuring.batch_execute("BEGIN").await.unwrap();
    configuring.execute("SELECT stile.configure('q', '{\"dedupWindowSeconds\": 60}')", &[]).await.unwrap();
    let db = t.db.clone();
    let created = tokio::spawn(async move { db.resolve_partition("q", "during-configure").await.unwrap() });
    t.wait_for_lock_waiters(1, "the creation waits for the configure").await;
    configuring.batch_execute("COMMIT").await.unwrap();
    assert_eq!(created.await.unwrap().window_seconds, 60);

    let creating = t.client().await;
    creating.batch_execute("BEGIN").await.unwrap();
    creating.execute("SELECT * FROM stile.resolve_partition('q', 'during-creation')", &[]).await.unwrap();
    let db = t.db.clone();
    let configured =
        tokio::spawn(
            async move { db.configure("q", &opts(json!({"dedupWindowSeconds": 120})), ConfigureMode::Merge).await.unwrap() },
        );
    t.wait_for_lock_waiters(1, "the configure waits for the creation").await;
    creating.batch_execute("COMMIT").await.unwrap();
    configured.await.unwrap();
    assert_eq!(
        partition_windows(&t).await,
        windows(&[("q", "a", 120), ("q", "during-configure", 120), ("q", "during-creation", 120)])
    );
}
