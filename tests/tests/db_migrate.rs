//! Migrations and connections: idempotent, safe to run from several
//! gateways at once; errors sorted into "unavailable" and the rest.

use stile::db::{Db, MIGRATIONS, Migration};
use stile_tests::pg::TestDb;

async fn applied(t: &TestDb) -> Vec<i32> {
    t.client()
        .await
        .query("SELECT version FROM stile.schema_migrations ORDER BY version", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get("version"))
        .collect()
}

fn all_versions() -> Vec<i32> {
    MIGRATIONS.iter().map(|m| m.version).collect()
}

#[tokio::test]
async fn migrating_twice_changes_nothing() {
    let t = TestDb::unmigrated(2).await;
    assert_eq!(t.db.schema_version().await.unwrap(), 0);
    t.db.migrate().await.unwrap();
    let p = t.db.resolve_partition("q", "p").await.unwrap();
    t.db.migrate().await.unwrap();
    assert_eq!(applied(&t).await, all_versions());
    assert_eq!(t.db.schema_version().await.unwrap(), *all_versions().last().unwrap());
    // The data survived.
    assert_eq!(t.db.resolve_partition("q", "p").await.unwrap(), p);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gateways_starting_at_once_migrate_once() {
    let t = TestDb::unmigrated(1).await;
    let mut tasks = Vec::new();
    for _ in 0..6 {
        // Separate pools, as separate gateway processes would have.
        let db = Db::from_config(t.config().clone(), 1).await.unwrap();
        tasks.push(tokio::spawn(async move { db.migrate().await }));
    }
    for task in tasks {
        task.await.unwrap().expect("every migrator succeeds");
    }
    assert_eq!(applied(&t).await, all_versions());
}

#[tokio::test]
async fn a_half_migrated_database_is_completed() {
    let t = TestDb::unmigrated(1).await;
    let c = t.client().await;
    c.batch_execute(
        "CREATE SCHEMA stile; \
         CREATE TABLE stile.schema_migrations (version integer PRIMARY KEY, name text NOT NULL, \
             applied_at timestamptz NOT NULL DEFAULT now());",
    )
    .await
    .unwrap();
    c.batch_execute(MIGRATIONS[0].sql).await.unwrap();
    c.execute(
        "INSERT INTO stile.schema_migrations (version, name) VALUES ($1, $2)",
        &[&MIGRATIONS[0].version, &MIGRATIONS[0].name],
    )
    .await
    .unwrap();
    t.db.migrate().await.unwrap();
    assert_eq!(applied(&t).await, all_versions());
    t.db.resolve_partition("q", "p").await.unwrap();
}

/// A database migrated by an older build keeps its tables but gets this
/// build's functions: here `option_defaults` stands in for a function whose
/// text changed between builds.
#[tokio::test]
async fn functions_from_an_older_build_are_replaced_once() {
    let t = TestDb::unmigrated(1).await;
    t.db.migrate().await.unwrap();
    let c = t.client().await;
    let defaults = || async {
        c.query_one("SELECT stile.option_defaults()::text AS defaults", &[]).await.unwrap().get::<_, String>("defaults")
    };
    let current = defaults().await;
    c.batch_execute(
        "CREATE OR REPLACE FUNCTION stile.option_defaults() RETURNS jsonb LANGUAGE sql IMMUTABLE AS $$ SELECT '{}'::jsonb $$; \
         DELETE FROM stile.function_sets; INSERT INTO stile.function_sets (checksum) VALUES ('an older build')",
    )
    .await
    .unwrap();
    assert_eq!(defaults().await, "{}");
    t.db.migrate().await.unwrap();
    assert_eq!(defaults().await, current, "the older function was replaced");
    let sets: i64 = c.query_one("SELECT count(*) AS sets FROM stile.function_sets", &[]).await.unwrap().get("sets");
    assert_eq!(sets, 2, "both function sets are on record");
    // Up to date now: a further start changes nothing.
    t.db.migrate().await.unwrap();
    let sets: i64 = c.query_one("SELECT count(*) AS sets FROM stile.function_sets", &[]).await.unwrap().get("sets");
    assert_eq!(sets, 2);
    assert_eq!(applied(&t).await, all_versions());
}

/// A database a later build migrated keeps that build's functions: this
/// build, started against it (a gateway not yet upgraded, or rolled back),
/// calls them and replaces none.
#[tokio::test]
async fn functions_of_a_later_build_stay_in_place() {
    let t = TestDb::unmigrated(1).await;
    let mut later = MIGRATIONS.to_vec();
    later.push(Migration { version: 1000, name: "a later build's", sql: "SELECT 1" });
    t.db.migrate_with(&later).await.unwrap();
    let c = t.client().await;
    c.batch_execute(
        "CREATE OR REPLACE FUNCTION stile.option_defaults() RETURNS jsonb LANGUAGE sql IMMUTABLE \
             AS $$ SELECT '{\"later\": true}'::jsonb $$; \
         DELETE FROM stile.function_sets; INSERT INTO stile.function_sets (checksum) VALUES ('a later build')",
    )
    .await
    .unwrap();
    t.db.migrate().await.unwrap();
    let defaults: String = c.query_one("SELECT stile.option_defaults()::text AS defaults", &[]).await.unwrap().get("defaults");
    assert_eq!(defaults, r#"{"later": true}"#, "the later build's function was replaced");
    let sets: Vec<String> =
        c.query("SELECT checksum FROM stile.function_sets", &[]).await.unwrap().iter().map(|r| r.get("checksum")).collect();
    assert_eq!(sets, ["a later build"]);
    let mut versions = all_versions();
    versions.push(1000);
    assert_eq!(applied(&t).await, versions);
}

/// The functions are applied after every versioned migration: one that
/// drops a function the set defines leaves it defined, on a fresh database
/// and on one migrated before it.
#[tokio::test]
async fn a_later_migration_that_drops_a_function_leaves_it_defined() {
    let with_drop = |version| {
        let mut migrations = MIGRATIONS.to_vec();
        migrations.push(Migration {
            version,
            name: "drops option_defaults",
            sql: "DROP FUNCTION IF EXISTS stile.option_defaults() CASCADE",
        });
        migrations
    };
    let defaults = |c: tokio_postgres::Client| async move {
        c.query_one("SELECT stile.option_defaults() ->> 'dedupWindowSeconds' AS dedup_window_seconds", &[])
            .await
            .map(|row| row.get::<_, String>("dedup_window_seconds"))
    };
    // Fresh.
    let fresh = TestDb::unmigrated(1).await;
    fresh.db.migrate_with(&with_drop(1000)).await.unwrap();
    assert_eq!(defaults(fresh.client().await).await.expect("option_defaults is defined"), "3600");
    // Migrated by this build before the drop came along.
    let older = TestDb::unmigrated(1).await;
    older.db.migrate().await.unwrap();
    older
        .client()
        .await
        .batch_execute("DELETE FROM stile.function_sets; INSERT INTO stile.function_sets (checksum) VALUES ('an older build')")
        .await
        .unwrap();
    older.db.migrate_with(&with_drop(1000)).await.unwrap();
    assert_eq!(defaults(older.client().await).await.expect("option_defaults is defined"), "3600");
}

/// Version 5 copies each queue's window onto its partitions' rows, where the
/// push reads it: a database of version 4 keeps its queues' windows, and
/// from then on every writer of a queue or a partition keeps the copies
/// equal (see `db_configure::every_partition_keeps_its_queues_window_whoever_writes_it`).
#[tokio::test]
async fn the_queues_windows_are_copied_onto_their_partitions() {
    let t = TestDb::unmigrated(1).await;
    let before_v5: Vec<Migration> = MIGRATIONS.iter().copied().filter(|m| m.version < 5).collect();
    t.db.migrate_with(&before_v5).await.unwrap();
    let c = t.client().await;
    c.batch_execute(
        "INSERT INTO stile.queues (name, dedup_window_seconds) VALUES ('hour', 3600), ('off', 0), ('minute', 60); \
         INSERT INTO stile.partitions (queue, name) VALUES ('hour', 'a'), ('off', 'a'), ('minute', 'a'), ('minute', 'b')",
    )
    .await
    .unwrap();
    t.db.migrate().await.unwrap();
    assert_eq!(applied(&t).await, all_versions());
    let copies: Vec<(String, String, i32)> = c
        .query("SELECT queue, name, dedup_window_seconds FROM stile.partitions ORDER BY queue, name", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get("queue"), r.get("name"), r.get("dedup_window_seconds")))
        .collect();
    let expected = [("hour", "a", 3600), ("minute", "a", 60), ("minute", "b", 60), ("off", "a", 0)];
    assert_eq!(copies, expected.map(|(q, p, w)| (q.to_owned(), p.to_owned(), w)));
    assert_eq!(t.db.resolve_partition("minute", "b").await.unwrap().window_seconds, 60);
}

#[tokio::test]
async fn an_unreachable_database_is_unavailable() {
    let e = Db::connect("host=127.0.0.1 port=1 user=nobody dbname=x connect_timeout=2", 1).await.unwrap_err();
    assert!(e.is_unavailable(), "{e}");
    let e = Db::connect("host=/nonexistent/socket/dir dbname=x", 1).await.unwrap_err();
    assert!(e.is_unavailable(), "{e}");
    // A bad connection string is a configuration error, not an outage.
    let e = Db::connect("host=h port=notaport", 1).await.unwrap_err();
    assert!(!e.is_unavailable() && e.kind() == "config", "{e}");
    let e = Db::connect("postgresql://u:hunter2@h:x/d", 1).await.unwrap_err();
    assert!(!e.to_string().contains("hunter2"), "{e}");
}

#[tokio::test]
async fn a_terminated_connection_is_unavailable_and_the_pool_recovers() {
    let t = TestDb::with_pool(1).await;
    t.db.resolve_partition("q", "p").await.unwrap();
    let c = t.client().await;
    // Kill the pool's connection under it, as a server restart would, and
    // wait until its backend is gone.
    c.execute(
        "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity \
          WHERE datname = current_database() AND pid <> pg_backend_pid()",
        &[],
    )
    .await
    .unwrap();
    // The connection may or may not have noticed yet: the first call either
    // fails as unavailable or succeeds on a fresh connection.
    match t.db.resolve_partition("q", "p").await {
        Ok(_) => {}
        Err(e) => assert!(e.is_unavailable(), "{e}"),
    }
    t.db.resolve_partition("q", "p").await.unwrap();
}

#[test]
fn redacted_url_hides_the_password() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let t = rt.block_on(TestDb::new());
    assert!(!t.db.redacted_url().contains("password=") || t.db.redacted_url().contains("********"));
    let cfg = stile::db::DbConfig::parse("host=h user=u password=s3cret dbname=d").unwrap();
    let shown = cfg.to_url(false);
    assert!(!shown.contains("s3cret") && shown.contains("password=********"), "{shown}");
    drop(t);
}
