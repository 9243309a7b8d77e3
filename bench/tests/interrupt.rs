//! A benchmark stopped by hand cleans up after itself: the load generator,
//! sent SIGTERM in the middle of a measurement, drops its database and exits
//! 130, instead of leaving a database of a million messages behind.
//!
//! Needs PostgreSQL (as every test of `stile-tests` does) and a built `stile`
//! binary beside the test (`cargo build --release -p stile`), which the load
//! generator starts.

use std::process::{Command, Stdio};
use std::time::Duration;

use stile_tests::gateway::{die_with_parent, each_line};
use stile_tests::pg::{admin_config, connect};
use tokio::sync::mpsc;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_run_stopped_by_sigterm_drops_its_database_and_exits_130() {
    let mut command = Command::new(env!("CARGO_BIN_EXE_load"));
    command
        .args(["--configs", "off", "--partitions", "2", "--prefill", "200", "--conns", "2", "--sizes", "1"])
        .args(["--rounds", "1", "--secs", "600"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    die_with_parent(&mut command);
    let mut child = command.spawn().expect("start the load generator");
    let (lines_tx, mut lines) = mpsc::unbounded_channel();
    let closed = each_line(child.stderr.take().expect("stderr is piped"), move |line| {
        let _ = lines_tx.send(line.to_owned());
    });

    // The database is named first; "primed" means the gateway runs and the
    // measurement (of 600 s) is about to start.
    let mut database = None;
    let mut seen = Vec::new();
    let primed = tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(line) = lines.recv().await {
            if let Some(name) = line.strip_prefix("load: database ") {
                database = Some(name.to_owned());
            }
            let primed = line.contains("primed");
            seen.push(line);
            if primed {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(primed, Ok(true), "the load generator never primed its gateway:\n{}", seen.join("\n"));
    let database = database.expect("the load generator names its database before priming");
    let c = connect(&admin_config()).await.expect("connect to the server");
    let exists = async |name: &str| -> bool {
        let row = c.query_one("SELECT count(*) AS databases FROM pg_database WHERE datname = $1", &[&name]).await.unwrap();
        row.get::<_, i64>("databases") == 1
    };
    assert!(exists(&database).await, "{database} is there while the run is");

    let pid = libc::pid_t::try_from(child.id()).expect("a pid fits pid_t");
    // SAFETY: kill(2) with a pid this test spawned and has not reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    tokio::time::timeout(Duration::from_secs(60), closed).await.expect("the load generator exits").ok();
    let status = child.wait().expect("wait for the load generator");
    while let Ok(line) = lines.try_recv() {
        seen.push(line);
    }
    assert_eq!(status.code(), Some(130), "{}", seen.join("\n"));
    assert!(seen.iter().any(|line| line.contains("interrupted")), "{}", seen.join("\n"));
    assert!(!exists(&database).await, "{database} was left behind");
}
