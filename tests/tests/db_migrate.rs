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
/// from then on the window's writers keep the copies equal (see
/// `db_configure::every_partition_keeps_its_queues_window_through_configure`);
/// version 9 names the partitions in `stile.partition_names`.
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

/// The distribution Citus is given (`scripts/citus/distribute.sql`): each
/// distributed table with its distribution column, and the reference tables.
struct Distribution {
    distributed: Vec<(String, String)>,
    reference: Vec<String>,
    functions: Vec<String>,
}

impl Distribution {
    const DDL: &str = include_str!("../../scripts/citus/distribute.sql");
    /// Tables that stay on the coordinator alone.
    const LOCAL: [&str; 2] = ["schema_migrations", "function_sets"];

    fn parse() -> Distribution {
        let quoted = |s: &str| -> Vec<String> { s.split('\'').skip(1).step_by(2).map(str::to_owned).collect() };
        let mut layout = Distribution { distributed: Vec::new(), reference: Vec::new(), functions: Vec::new() };
        for statement in Self::DDL.split(';').map(|s| s.lines().filter(|l| !l.trim_start().starts_with("--")).collect::<String>())
        {
            let args = quoted(&statement);
            let table = |i: usize| args[i].strip_prefix("stile.").expect("a table of the schema").to_owned();
            if statement.contains("create_distributed_table(") {
                layout.distributed.push((table(0), args[1].clone()));
            } else if statement.contains("create_reference_table(") {
                layout.reference.push(table(0));
            } else if statement.contains("create_distributed_function(") {
                layout.functions.push(args[0].clone());
            }
        }
        assert!(!layout.distributed.is_empty() && !layout.reference.is_empty(), "the DDL names its tables");
        layout
    }

    fn column_of(&self, table: &str) -> Option<&str> {
        self.distributed.iter().find(|(t, _)| t == table).map(|(_, c)| c.as_str())
    }

    /// The tables every node holds a part or a copy of.
    fn shared_tables(&self) -> Vec<String> {
        self.distributed.iter().map(|(t, _)| t.clone()).chain(self.reference.iter().cloned()).collect()
    }
}

/// Whether `text` names `stile.<relation>` as a whole word.
fn names_relation(text: &str, relation: &str) -> bool {
    let needle = format!("stile.{relation}");
    text.match_indices(&needle).any(|(at, _)| !text[at + needle.len()..].starts_with(|c: char| c.is_alphanumeric() || c == '_'))
}

async fn strings(c: &tokio_postgres::Client, sql: &str) -> Vec<String> {
    c.query(sql, &[]).await.unwrap().iter().map(|r| r.get(0)).collect()
}

/// The migrated schema holds nothing Citus refuses to distribute as
/// `scripts/citus/distribute.sql` says (docs/scale-out.md lists the
/// refusals): every table is distributed, a reference table or the
/// migrator's own; unique keys hold the distribution column; no triggers;
/// no free-standing sequence; no function taking a table's row type; no
/// `LANGUAGE sql` function reading a table or view of the nodes; no plan
/// forced generic where Citus is loaded; the delegated push's signature
/// exists. Then each kind of refusal is added to the test's database, and
/// each is found.
#[tokio::test]
async fn the_layout_has_nothing_a_distributed_database_refuses() {
    let t = TestDb::new().await;
    let c = t.client().await;
    let layout = Distribution::parse();
    let refused = refusals(&c, &layout).await;
    assert!(refused.is_empty(), "Citus would refuse:\n{}", refused.join("\n"));

    c.batch_execute(
        "ALTER TABLE stile.partitions ADD CONSTRAINT named_once UNIQUE (queue, name); \
         CREATE TABLE stile.undecided (id bigint); \
         CREATE FUNCTION stile.noop() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$; \
         CREATE TRIGGER noop BEFORE INSERT ON stile.kv FOR EACH ROW EXECUTE FUNCTION stile.noop(); \
         CREATE SEQUENCE stile.free_standing; \
         CREATE FUNCTION stile.window_of(q stile.queues) RETURNS integer LANGUAGE plpgsql AS $$ BEGIN RETURN q.dedup_window_seconds; END $$; \
         CREATE FUNCTION stile.rows_of(p bigint) RETURNS bigint LANGUAGE sql AS $$ SELECT count(*) FROM stile.log WHERE partition_id = p $$; \
         CREATE FUNCTION stile.generic() RETURNS void LANGUAGE plpgsql SET plan_cache_mode = force_generic_plan AS $$ BEGIN END $$; \
         ALTER TABLE stile.timers ADD COLUMN partition_id bigint REFERENCES stile.partitions (id)",
    )
    .await
    .unwrap();
    let found = refusals(&c, &layout).await;
    for expected in [
        "unique named_once",
        "table undecided",
        "trigger on stile.kv: noop",
        "sequence free_standing",
        "function stile.window_of(stile.queues)",
        "function stile.rows_of(bigint): LANGUAGE sql reading stile.log",
        "function stile.generic(): forces generic plans",
        "foreign key stile.timers -> stile.partitions",
    ] {
        assert!(found.iter().any(|f| f.starts_with(expected)), "{expected} not found in {found:#?}");
    }
}

/// What Citus would refuse of the schema in `c`'s database, distributed as
/// `layout` says: one line each.
async fn refusals(c: &tokio_postgres::Client, layout: &Distribution) -> Vec<String> {
    let mut refused: Vec<String> = Vec::new();

    let tables = strings(
        c,
        "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
          WHERE n.nspname = 'stile' AND c.relkind IN ('r', 'p') ORDER BY 1",
    )
    .await;
    for table in &tables {
        if !layout.shared_tables().contains(table) && !Distribution::LOCAL.contains(&table.as_str()) {
            refused.push(format!("table {table}: neither distributed, a reference table nor local"));
        }
    }
    for (table, column) in &layout.distributed {
        let keys = c
            .query(
                "SELECT i.relname::text AS index, \
                        array(SELECT a.attname::text FROM unnest(x.indkey) k \
                                JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k) AS columns \
                   FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid \
                  WHERE x.indrelid = ('stile.' || $1)::regclass AND x.indisunique",
                &[table],
            )
            .await
            .unwrap();
        for key in keys {
            let columns: Vec<String> = key.get("columns");
            if !columns.contains(column) {
                refused.push(format!(
                    "unique {} on {table} {columns:?} lacks the distribution column {column}",
                    key.get::<_, String>("index")
                ));
            }
        }
    }
    for trigger in strings(
        c,
        "SELECT t.tgrelid::regclass::text || ': ' || t.tgname FROM pg_trigger t \
           JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace \
          WHERE n.nspname = 'stile' AND NOT t.tgisinternal",
    )
    .await
    {
        refused.push(format!("trigger on {trigger}"));
    }
    for sequence in strings(
        c,
        "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
          WHERE n.nspname = 'stile' AND c.relkind = 'S' \
            AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid \
                              AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i'))",
    )
    .await
    {
        refused.push(format!("sequence {sequence}: owned by no column"));
    }
    for function in strings(
        c,
        "SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
          WHERE n.nspname = 'stile' \
            AND EXISTS (SELECT 1 FROM unnest(p.proargtypes::oid[]) a JOIN pg_type ty ON ty.oid = a \
                          JOIN pg_class r ON r.oid = ty.typrelid WHERE r.relkind IN ('r', 'p', 'v'))",
    )
    .await
    {
        refused.push(format!("function {function}: takes a table's row type"));
    }
    let views =
        strings(c, "SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'stile' AND c.relkind = 'v'")
            .await;
    let read_on_nodes: Vec<String> = layout.shared_tables().into_iter().chain(views).collect();
    let functions = c
        .query(
            "SELECT p.oid::regprocedure::text AS function, l.lanname::text AS language, p.prosrc AS source, \
                    coalesce(array_to_string(p.proconfig, ' '), '') AS settings \
               FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace JOIN pg_language l ON l.oid = p.prolang \
              WHERE n.nspname = 'stile'",
            &[],
        )
        .await
        .unwrap();
    for f in &functions {
        let (function, language, source, settings): (String, String, String, String) =
            (f.get("function"), f.get("language"), f.get("source"), f.get("settings"));
        if language == "sql" {
            for relation in read_on_nodes.iter().filter(|r| names_relation(&source, r)) {
                refused.push(format!("function {function}: LANGUAGE sql reading stile.{relation}"));
            }
        }
        if settings.contains("force_generic_plan") || (source.contains("force_generic_plan") && !source.contains("citus.version"))
        {
            refused.push(format!("function {function}: forces generic plans where Citus is loaded"));
        }
    }
    for (table, column) in &layout.distributed {
        let found: i64 = c
            .query_one(
                "SELECT count(*) FROM pg_attribute WHERE attrelid = ('stile.' || $1)::regclass AND attname = $2 AND NOT attisdropped",
                &[table, column],
            )
            .await
            .unwrap()
            .get(0);
        if found != 1 {
            refused.push(format!("table {table}: no distribution column {column}"));
        }
    }
    for signature in &layout.functions {
        let exists: bool = c.query_one("SELECT to_regprocedure($1) IS NOT NULL", &[signature]).await.unwrap().get(0);
        if !exists {
            refused.push(format!("distributed function {signature}: no such function"));
        }
    }
    for key in strings(
        c,
        "SELECT r.conrelid::regclass::text || ' -> ' || r.confrelid::regclass::text FROM pg_constraint r \
           JOIN pg_namespace n ON n.oid = r.connamespace WHERE n.nspname = 'stile' AND r.contype = 'f'",
    )
    .await
    {
        let referenced = key.rsplit(" -> ").next().unwrap().trim_start_matches("stile.").to_owned();
        if layout.column_of(&referenced).is_some() {
            refused.push(format!("foreign key {key}: references a distributed table"));
        }
    }
    refused
}
