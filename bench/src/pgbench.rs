//! PostgreSQL alone, as a team would write deduplication without stile: one
//! table with a unique index on (partition, transaction_id), and each
//! request one prepared `INSERT … ON CONFLICT DO NOTHING RETURNING`,
//! driven by pgbench (no HTTP) as the upper bound of that design.
//!
//! The workload mirrors the load generator's: `size` messages of about 100
//! bytes per transaction to one random partition of `partitions`, and
//! `retry_percent` of the transactions re-inserting ids the table already
//! holds (they conflict and write nothing), into a table prefilled with as
//! many rows as the gateway's window.

use std::io::Write as _;
use std::process::Command;
use std::time::Instant;

use stile_tests::cpu::postgres_cpu_seconds;

/// The table a team would keep messages in, in `schema` of the benchmark
/// database (created if missing; the table is made afresh), with the unique
/// index on (partition, transaction_id) when it is the check. The peer's
/// here, and the HTTP peers' of [`crate::peer_http`].
pub fn messages_table(schema: &str, unique: bool) -> String {
    let unique = if unique { ",\n    UNIQUE (partition, transaction_id)" } else { "" };
    format!(
        "CREATE SCHEMA IF NOT EXISTS {schema};
DROP TABLE IF EXISTS {schema}.messages;
CREATE TABLE {schema}.messages (
    partition      text        NOT NULL,
    transaction_id text        NOT NULL,
    message_id     uuid        NOT NULL DEFAULT gen_random_uuid(),
    payload        json        NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(){unique}
);"
    )
}

/// A payload of the load generator's shape.
const PAYLOAD: &str = r#"{"order":1,"line":0,"amount":99.5,"currency":"EUR"}"#;

/// The peer on one database.
#[derive(Debug)]
pub struct Pgbench {
    program: String,
    /// `-h … -p … -U … dbname` for pgbench.
    connection: Vec<String>,
    partitions: usize,
    per_partition: usize,
}

/// One pgbench run's figures.
#[derive(Debug, Clone, Copy)]
pub struct PeerFigures {
    pub clients: usize,
    /// Messages per second (transactions per second times the batch size).
    pub rate: f64,
    /// pgbench's mean latency per transaction.
    pub latency_ms: f64,
    /// CPU milliseconds per 1,000 messages of every PostgreSQL process.
    pub postgres_cpu_ms_per_k: f64,
}

impl Pgbench {
    /// Creates and prefills the peer's table: `per_partition` rows in each of
    /// `partitions`, ids `prefill-p{p}-{i}`, as the gateway's queues hold.
    pub async fn prepare(
        client: &tokio_postgres::Client,
        config: &tokio_postgres::Config,
        partitions: usize,
        per_partition: usize,
    ) -> Pgbench {
        client.batch_execute(&messages_table("peer", true)).await.expect("create the peer's table");
        let fill = format!(
            "INSERT INTO peer.messages (partition, transaction_id, payload)
             SELECT 'p' || p, 'prefill-p' || p || '-' || i, '{PAYLOAD}'
               FROM generate_series(0, {}) AS p, generate_series(0, {}) AS i",
            partitions - 1,
            per_partition - 1
        );
        client.batch_execute(&fill).await.expect("prefill the peer's table");
        client.batch_execute("VACUUM ANALYZE peer.messages").await.expect("vacuum the peer's table");
        Pgbench { program: program(), connection: connection_args(config), partitions, per_partition }
    }

    /// Runs `clients` pgbench clients for `secs` seconds at `size` messages per
    /// transaction, `retry_percent` of them re-inserting stored ids.
    pub fn run(&self, clients: usize, size: usize, retry_percent: u32, secs: f64) -> PeerFigures {
        let script = self.script(size, retry_percent);
        let mut file = tempfile("pgbench-peer.sql");
        file.1.write_all(script.as_bytes()).expect("write the pgbench script");
        let cpu_before = postgres_cpu_seconds();
        let started = Instant::now();
        let output = Command::new(&self.program)
            .args(["-n", "-M", "prepared", "-j", "2", "-c", &clients.to_string()])
            .args(["-T", &format!("{}", secs.ceil().max(1.0) as u64), "-f"])
            .arg(&file.0)
            .args(&self.connection)
            .output()
            .expect("run pgbench");
        let elapsed = started.elapsed().as_secs_f64();
        let cpu = postgres_cpu_seconds() - cpu_before;
        let _ = std::fs::remove_file(&file.0);
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "pgbench failed: {}\n{text}", String::from_utf8_lossy(&output.stderr));
        let tps = figure(&text, "tps = ").expect("pgbench prints its tps");
        let latency_ms = figure(&text, "latency average = ").unwrap_or(f64::NAN);
        let messages = tps * size as f64 * elapsed.min(secs.ceil());
        PeerFigures { clients, rate: tps * size as f64, latency_ms, postgres_cpu_ms_per_k: 1e6 * cpu / messages.max(1.0) }
    }

    /// One transaction: a fresh batch of ids, or (`retry_percent` of the
    /// time) a batch of ids the prefill stored.
    fn script(&self, size: usize, retry_percent: u32) -> String {
        let insert = |ids: &str| {
            format!(
                "INSERT INTO peer.messages (partition, transaction_id, payload) \
                 SELECT 'p' || :p, {ids}, '{PAYLOAD}' FROM generate_series(0, {}) AS i \
                 ON CONFLICT DO NOTHING RETURNING message_id;",
                size - 1
            )
        };
        format!(
            "\\set p random(0, {})\n\\set r random(1, 100)\n\\set k random(0, {})\n\\set n random(1, 1000000000000)\n\
             \\if :r <= {retry_percent}\n{}\n\\else\n{}\n\\endif\n",
            self.partitions - 1,
            self.per_partition.saturating_sub(size),
            insert("'prefill-p' || :p || '-' || (:k + i)"),
            insert("'pg-' || :client_id || '-' || :n || '-' || i"),
        )
    }
}

/// Connections the server can still take, a few kept back for the run's own
/// sessions: pgbench's clients are capped to it, beside the gateways' pools.
pub async fn room(client: &tokio_postgres::Client) -> usize {
    let row = client
        .query_one(
            "SELECT current_setting('max_connections')::int - current_setting('superuser_reserved_connections')::int \
                    - (SELECT count(*) FROM pg_stat_activity)::int AS free",
            &[],
        )
        .await
        .expect("read the server's free connections");
    usize::try_from(row.get::<_, i32>("free") - 4).unwrap_or(0)
}

/// pgbench of the server's own installation where it can be found, else the
/// one on the PATH.
fn program() -> String {
    let bindir = Command::new("pg_config").arg("--bindir").output().ok().filter(|o| o.status.success());
    if let Some(bindir) = bindir {
        let path = format!("{}/pgbench", String::from_utf8_lossy(&bindir.stdout).trim());
        if std::path::Path::new(&path).exists() {
            return path;
        }
    }
    "pgbench".to_owned()
}

fn connection_args(config: &tokio_postgres::Config) -> Vec<String> {
    let mut args = Vec::new();
    if let Some(host) = config.get_hosts().first() {
        let host = match host {
            tokio_postgres::config::Host::Tcp(host) => host.clone(),
            #[cfg(unix)]
            tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
        };
        args.extend(["-h".to_owned(), host]);
    }
    if let Some(port) = config.get_ports().first() {
        args.extend(["-p".to_owned(), port.to_string()]);
    }
    if let Some(user) = config.get_user() {
        args.extend(["-U".to_owned(), user.to_owned()]);
    }
    args.push(config.get_dbname().expect("the benchmark database is named").to_owned());
    args
}

/// The number after `label` in pgbench's report.
fn figure(text: &str, label: &str) -> Option<f64> {
    let rest = &text[text.find(label)? + label.len()..];
    rest.split_whitespace().next()?.parse().ok()
}

fn tempfile(name: &str) -> (std::path::PathBuf, std::fs::File) {
    let path = std::env::temp_dir().join(format!("{}-{name}", std::process::id()));
    let file = std::fs::File::create(&path).expect("create a temporary file");
    (path, file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_figures_pgbench_prints() {
        let text =
            "latency average = 1.234 ms\ninitial connection time = 5.0 ms\ntps = 17234.5 (without initial connection time)\n";
        assert_eq!(figure(text, "tps = "), Some(17234.5));
        assert_eq!(figure(text, "latency average = "), Some(1.234));
        assert_eq!(figure(text, "nothing = "), None);
    }
}
