//! The `stile` command line as an operator meets it: a database that cannot
//! be reached at start and a flag with a bad value each end the process with
//! one clear line and a non-zero exit, never a panic.
//!
//! These tests live in the `stile` package so that `cargo test --workspace`
//! builds the `stile` binary itself, which the process tests in `tests/` run.

use std::net::TcpListener;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Runs the built `stile` with `args` and waits for it to exit by itself,
/// failing the test if it is still running after `limit`.
fn run_stile(args: &[&str], limit: Duration) -> Output {
    let child = Command::new(env!("CARGO_BIN_EXE_stile"))
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("STILE_LISTEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start stile");
    let pid = child.id();
    let (done, outcome) = mpsc::channel();
    std::thread::spawn(move || done.send(child.wait_with_output()));
    match outcome.recv_timeout(limit) {
        Ok(output) => output.expect("wait for stile"),
        Err(_) => {
            // The waiting thread owns the child, so it is ended by its pid;
            // it has not been reaped, so the pid is still its own.
            let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
            panic!("stile {args:?} was still running after {limit:?}");
        }
    }
}

/// A port nothing listens on.
fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a port");
    listener.local_addr().expect("its address").port()
}

/// The non-empty lines of a stream.
fn lines(bytes: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(bytes).lines().filter(|l| !l.trim().is_empty()).map(str::to_owned).collect()
}

#[test]
fn an_unreachable_database_at_start_is_one_line_naming_it_without_the_password() {
    let port = closed_port();
    let urls = [
        format!("host=127.0.0.1 port={port} user=stile password=secret dbname=nowhere"),
        format!("postgresql://stile:secret@127.0.0.1:{port}/nowhere"),
    ];
    for url in urls {
        let output = run_stile(&["serve", "--listen", "127.0.0.1:0", "--database-url", &url], Duration::from_secs(60));
        let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        assert!(!output.status.success(), "{url}: exit status {}", output.status);
        let stderr_lines = lines(&output.stderr);
        assert_eq!(stderr_lines.len(), 1, "{url}: one line on stderr, got:\n{stderr}");
        let line = &stderr_lines[0];
        assert!(line.contains("127.0.0.1") && line.contains(&format!("port={port}")), "{url}: names the server: {line}");
        assert!(line.contains("dbname=nowhere") && line.contains("user=stile"), "{url}: names the database: {line}");
        assert!(!stderr.contains("secret") && !stdout.contains("secret"), "{url}: the password leaked:\n{stderr}\n{stdout}");
        assert!(!stdout.contains("listening"), "{url}: {stdout}");
        assert!(!stderr.contains("panicked"), "{url}: {stderr}");
    }
}

#[test]
fn a_connection_string_that_does_not_parse_is_not_printed() {
    for url in [
        "postgresql://stile:hunter2@127.0.0.1/nowhere?sslmode=bogus",
        "postgresql://stile@127.0.0.1/nowhere?password=hunter2&sslmode=bogus",
        "host=127.0.0.1 user=stile password = hunter2 sslmode=bogus",
        "host=127.0.0.1 password='hunter2 and more' sslmode=bogus",
    ] {
        let output = run_stile(&["serve", "--listen", "127.0.0.1:0", "--database-url", url], Duration::from_secs(30));
        let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        assert!(!output.status.success(), "{url}: exit status {}", output.status);
        assert!(!stderr.contains("hunter2") && !stdout.contains("hunter2"), "{url}: the password leaked:\n{stderr}\n{stdout}");
        assert!(stderr.contains("does not parse"), "{url}: {stderr}");
    }
}

#[test]
fn a_bad_flag_value_names_the_flag_and_exits_non_zero() {
    for (args, flag) in [
        (&["serve", "--idle-timeout", "-1"][..], "--idle-timeout"),
        (&["serve", "--body-timeout", "0"][..], "--body-timeout"),
        (&["serve", "--shutdown-timeout", "-5"][..], "--shutdown-timeout"),
        (&["serve", "--engine", "jit"][..], "--engine"),
        (&["serve", "--shards", "many"][..], "--shards"),
        (&["serve", "--cache-mb", "lots"][..], "--cache-mb"),
    ] {
        let output = run_stile(args, Duration::from_secs(30));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?}: exit status {}", output.status);
        assert!(stderr.contains(flag), "{args:?}: the error names {flag}:\n{stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(output.stdout.is_empty(), "{args:?}: nothing on stdout");
    }
}
