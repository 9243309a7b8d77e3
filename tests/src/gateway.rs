//! Gateway processes for end-to-end tests: the built `stile` binary started
//! on a test database, and a small HTTP/1.1 client (hyper's connection-level
//! client over a tokio `TcpStream`).
//!
//! [`Gateway::start`] runs `stile serve --listen 127.0.0.1:0` and waits for
//! the one line the gateway prints when it listens ("stile listening on
//! http://ADDR ..."); no sleeping. The process is killed when the
//! [`Gateway`] is dropped, and its output is printed if a test panicked.
//!
//! The binary is found beside the test executable (`target/<profile>/deps/<test>`
//! → `target/<profile>/stile`), or at `$STILE_BIN`.

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

use crate::clock::ClockFile;
use crate::pg::TestDb;

/// How long a gateway may take to print its "listening on" line.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// How long one HTTP exchange may take before the client gives up.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// The environment variables `stile serve` reads; cleared in the child so that
/// only the flags a test passes count.
const STILE_ENV: &[&str] = &[
    "STILE_LISTEN",
    "DATABASE_URL",
    "STILE_SHARDS",
    "STILE_DEDUP_CACHE_MB",
    "STILE_ENGINE",
    "STILE_BODY_LIMIT",
    "STILE_MAX_ITEMS",
    "STILE_BEARER_TOKEN",
    "STILE_POOL_SIZE",
    "STILE_PURGE_SECONDS",
    "STILE_INJECT_GUEST_TRAPS_PER_MILLION",
];

/// The built `stile` binary: `$STILE_BIN`, else `stile` in the cargo profile
/// directory the running executable belongs to. Panics, saying how to build
/// it, when it is missing.
pub fn stile_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("STILE_BIN").filter(|p| !p.is_empty()) {
        return PathBuf::from(path);
    }
    let binary = beside_this_program("stile");
    if !binary.is_file() {
        let dir = binary.parent().expect("a binary lives in a directory");
        let profile = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let flag = if profile == "release" { " --release".to_owned() } else { format!(" --profile {profile}") };
        panic!(
            "the stile binary is missing at {}: build it first with `cargo build{flag} -p stile` \
             (or run `cargo test{flag} --workspace`), or point STILE_BIN at one",
            binary.display()
        );
    }
    if let Some(newer) = stale_sources(&binary) {
        panic!(
            "{} is older than its source {newer}: rebuild it with `cargo build --release -p stile` \
             (or run `cargo test --release --workspace`), or point STILE_BIN at a binary to use as is",
            binary.display()
        );
    }
    binary
}

/// The program `name` of the cargo profile directory the running executable
/// belongs to (`target/<profile>/`, also for a test in `target/<profile>/deps`).
pub fn beside_this_program(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the path of the running executable");
    let mut dir = exe.parent().expect("an executable lives in a directory").to_path_buf();
    if dir.file_name().is_some_and(|name| name == "deps") {
        dir.pop();
    }
    dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX))
}

/// A source file newer than `binary`, by the dependency list cargo wrote
/// beside it (`stile.d`); `None` when it is up to date or there is no list.
fn stale_sources(binary: &Path) -> Option<String> {
    let built = std::fs::metadata(binary).and_then(|m| m.modified()).ok()?;
    let deps = std::fs::read_to_string(binary.with_extension("d")).ok()?;
    let (_, sources) = deps.lines().next()?.split_once(": ")?;
    // Paths are separated by spaces; a space inside a path is escaped.
    let sources = sources.replace("\\ ", "\u{0}");
    sources
        .split(' ')
        .map(|path| PathBuf::from(path.replace('\u{0}', " ")))
        .filter(|path| std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.modified().is_ok_and(|modified| modified > built)))
        .map(|path| path.display().to_string())
        .next()
}

/// Has the kernel kill the child (SIGKILL) when the thread spawning it ends,
/// so that a gateway never outlives a test or benchmark that is killed
/// before it can drop the child's handle. The signal follows the spawning
/// thread, not the process: spawn from a thread that lives as long as the
/// child should (the main thread, a test's own, a runtime's workers).
pub fn die_with_parent(command: &mut Command) {
    use std::os::unix::process::CommandExt as _;
    let parent = std::process::id();
    // SAFETY: the closure runs in the child between fork and exec, and only
    // makes two system calls, both async-signal-safe, touching no memory
    // the parent's other threads could have left locked.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Had the parent already died, the signal would never come.
            if u32::try_from(libc::getppid()).ok() != Some(parent) {
                return Err(std::io::Error::other("the parent exited before the child started"));
            }
            Ok(())
        });
    }
}

/// A fresh database of its own, left empty: the gateway under test creates
/// the schema at start, as it does in production (with the SQL built into
/// that binary). Dropped with the returned [`TestDb`].
pub async fn fresh_database() -> TestDb {
    TestDb::unmigrated(4).await
}

/// What a child process printed, both streams interleaved line by line.
#[derive(Debug, Default)]
struct Output {
    lines: Vec<String>,
    stderr: Vec<String>,
}

/// A child process whose output is drained by two threads (so it can never
/// block on a full pipe) and which is killed when dropped.
#[derive(Debug)]
pub struct Process {
    /// The program's name, for what is printed about it.
    program: String,
    child: Child,
    output: Arc<Mutex<Output>>,
    stdout_closed: Option<oneshot::Receiver<()>>,
    stderr_closed: Option<oneshot::Receiver<()>>,
    status: Option<ExitStatus>,
}

impl Process {
    /// Spawns `stile` with `args`. `on_stdout_line` sees every stdout line
    /// as it arrives.
    fn spawn(args: &[String], clock: Option<&ClockFile>, on_stdout_line: impl FnMut(&str) + Send + 'static) -> Process {
        Process::spawn_command(stile_command(args, clock), on_stdout_line, |_| {})
    }

    /// Spawns `command` (its stdio replaced by pipes, and killed when the
    /// spawning thread ends: [`die_with_parent`]). The callbacks see every
    /// line of its stdout and stderr as it arrives.
    pub fn spawn_command(
        mut command: Command,
        on_stdout_line: impl FnMut(&str) + Send + 'static,
        on_stderr_line: impl FnMut(&str) + Send + 'static,
    ) -> Process {
        command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        die_with_parent(&mut command);
        let program = command.get_program().to_string_lossy().into_owned();
        let mut child = command.spawn().unwrap_or_else(|e| panic!("start {program}: {e}"));
        let output = Arc::new(Mutex::new(Output::default()));
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr = child.stderr.take().expect("stderr is piped");
        let stdout_closed = drain(stdout, output.clone(), false, on_stdout_line);
        let stderr_closed = drain(stderr, output.clone(), true, on_stderr_line);
        Process { program, child, output, stdout_closed: Some(stdout_closed), stderr_closed: Some(stderr_closed), status: None }
    }

    /// Spawns `command` and waits (at most [`START_TIMEOUT`]) for the first
    /// line of its output, on either stream, for which `ready` answers
    /// something: a server's "listening" or "ready" line. Panics, with the
    /// output, if the process ends or stays silent first.
    pub async fn start_until<T: Send + 'static>(
        command: Command,
        ready: impl Fn(&str) -> Option<T> + Send + Sync + 'static,
    ) -> (Process, T) {
        let program = command.get_program().to_string_lossy().into_owned();
        let (ready_tx, ready_rx) = oneshot::channel::<T>();
        let ready_tx = Arc::new(Mutex::new(Some(ready_tx)));
        let ready = Arc::new(ready);
        let watcher = || {
            let (ready_tx, ready) = (ready_tx.clone(), ready.clone());
            move |line: &str| {
                if let Some(value) = ready(line)
                    && let Some(tx) = ready_tx.lock().expect("not poisoned").take()
                {
                    let _ = tx.send(value);
                }
            }
        };
        let (on_stdout, on_stderr) = (watcher(), watcher());
        drop(ready_tx);
        let mut process = Process::spawn_command(command, on_stdout, on_stderr);
        // Both senders are dropped at the end of the output: the process died first.
        match tokio::time::timeout(START_TIMEOUT, ready_rx).await {
            Ok(Ok(value)) => (process, value),
            Ok(Err(_)) => {
                let status = process.wait_exit(Duration::from_secs(10)).await;
                panic!("{program} exited before it was ready ({status}):\n{}", process.logs())
            }
            Err(_) => panic!("{program} was not ready within {START_TIMEOUT:?}:\n{}", process.logs()),
        }
    }

    /// Runs `stile` with `args` to its end (killed after `timeout`) and
    /// returns its exit status, stdout and stderr.
    pub async fn run(args: &[&str], timeout: Duration) -> (ExitStatus, String, String) {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let mut process = Process::spawn(&args, None, |_| {});
        let status = process.wait_exit(timeout).await;
        let output = process.output.lock().expect("not poisoned");
        let stderr = output.stderr.join("\n");
        let stdout = output.lines.iter().filter_map(|l| l.strip_prefix("[out] ")).collect::<Vec<_>>().join("\n");
        (status, stdout, stderr)
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("a pid fits pid_t");
        // SAFETY: kill(2) with a pid this process spawned and still holds
        // (not yet reaped, so the pid cannot have been reused).
        let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
        assert_eq!(rc, 0, "kill -TERM {pid}: {}", std::io::Error::last_os_error());
    }

    /// Sends SIGKILL: `kill -9`, nothing flushed or closed.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
    }

    /// Waits until the process has exited (both its pipes closed), killing it
    /// after `timeout`, and returns its exit status.
    pub async fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        if let Some(status) = self.status {
            return status;
        }
        let closed = async {
            if let Some(rx) = self.stdout_closed.take() {
                let _ = rx.await;
            }
            if let Some(rx) = self.stderr_closed.take() {
                let _ = rx.await;
            }
        };
        let timed_out = tokio::time::timeout(timeout, closed).await.is_err();
        if timed_out {
            let _ = self.child.kill();
        }
        // Both pipes are closed: the process has exited (or was just killed),
        // so this wait is short.
        let status = self.child.wait().expect("wait for the gateway process");
        self.status = Some(status);
        assert!(!timed_out, "the process did not exit within {timeout:?}; killed it.\n{}", self.logs());
        status
    }

    /// Everything the process printed so far, stderr lines marked `[err]`.
    pub fn logs(&self) -> String {
        self.output.lock().expect("not poisoned").lines.join("\n")
    }
}

/// `stile` with `args`, a clean `STILE_*` environment, and `clock` applied.
fn stile_command(args: &[String], clock: Option<&ClockFile>) -> Command {
    let mut command = Command::new(stile_binary());
    command.args(args);
    if let Some(clock) = clock {
        clock.apply(&mut command);
    }
    for var in STILE_ENV {
        command.env_remove(var);
    }
    command.env("NO_COLOR", "1").env("RUST_LOG", std::env::var("STILE_TEST_LOG").unwrap_or_else(|_| "info".into()));
    command
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            eprintln!("---- output of {} (pid {}) ----\n{}\n---- end of output ----", self.program, self.child.id(), self.logs());
        }
    }
}

/// Records each line of a child's stream in `output`, then hands it to
/// `on_line`. The receiver resolves when the stream closes.
fn drain(
    stream: impl Read + Send + 'static,
    output: Arc<Mutex<Output>>,
    is_stderr: bool,
    mut on_line: impl FnMut(&str) + Send + 'static,
) -> oneshot::Receiver<()> {
    each_line(stream, move |line| {
        {
            let mut output = output.lock().expect("not poisoned");
            if is_stderr {
                output.stderr.push(line.to_owned());
                output.lines.push(format!("[err] {line}"));
            } else {
                output.lines.push(format!("[out] {line}"));
            }
        }
        // After recording it, so that whoever the line wakes sees it.
        on_line(line);
    })
}

/// Reads a child's stream line by line on a thread of its own (invalid
/// UTF-8 replaced, the line ending removed) and hands each line to
/// `on_line`. The receiver resolves when the stream closes.
pub fn each_line(stream: impl Read + Send + 'static, mut on_line: impl FnMut(&str) + Send + 'static) -> oneshot::Receiver<()> {
    let (closed_tx, closed_rx) = oneshot::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stream);
        let mut buffer = Vec::new();
        loop {
            buffer.clear();
            match reader.read_until(b'\n', &mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(_) => on_line(String::from_utf8_lossy(&buffer).trim_end_matches(['\n', '\r'])),
            }
        }
        let _ = closed_tx.send(());
    });
    closed_rx
}

/// The flags a gateway is started with. Unset options keep the binary's
/// defaults, except the pool (8 connections) and the purge period (an hour,
/// so that no purge runs during a test).
#[derive(Clone, Debug, Default)]
pub struct GatewayOptions {
    /// `--listen`; `None` is `127.0.0.1:0`.
    pub listen: Option<String>,
    pub engine: Option<&'static str>,
    pub cache_mb: Option<u64>,
    pub shards: Option<usize>,
    pub pool_size: Option<usize>,
    pub body_limit: Option<usize>,
    pub max_items: Option<usize>,
    pub bearer_token: Option<String>,
    pub purge_seconds: Option<u64>,
    /// The gateway's wall clock against the machine's, in seconds, set with
    /// libfaketime (see [`crate::clock`]); `None` leaves it alone.
    pub clock_offset_s: Option<i64>,
    /// Guest calls per million that trap.
    pub inject_guest_traps_per_million: Option<u32>,
    /// Once started, no cache instance can be made again.
    pub inject_instance_refusals: bool,
    /// `--max-held-mb`: the bound on what requests in progress hold.
    pub max_held_mb: Option<u64>,
    /// Further flags, as given (`["--body-timeout", "2"]`).
    pub extra_args: Vec<String>,
    /// The process's environment beyond the test's: `Some` sets a
    /// variable, `None` removes it (`PGSSLMODE`, say).
    pub env: BTreeMap<String, Option<String>>,
}

impl GatewayOptions {
    fn args(&self, database_url: &str) -> Vec<String> {
        let listen = self.listen.as_deref().unwrap_or("127.0.0.1:0");
        let mut args: Vec<String> =
            ["serve", "--listen", listen, "--database-url", database_url].iter().map(|s| s.to_string()).collect();
        let mut flag = |name: &str, value: String| {
            args.push(format!("--{name}"));
            args.push(value);
        };
        flag("pool-size", self.pool_size.unwrap_or(8).to_string());
        flag("purge-seconds", self.purge_seconds.unwrap_or(3600).to_string());
        if let Some(engine) = self.engine {
            flag("engine", engine.to_owned());
        }
        if let Some(mb) = self.cache_mb {
            flag("cache-mb", mb.to_string());
        }
        if let Some(shards) = self.shards {
            flag("shards", shards.to_string());
        }
        if let Some(limit) = self.body_limit {
            flag("body-limit", limit.to_string());
        }
        if let Some(max) = self.max_items {
            flag("max-items", max.to_string());
        }
        if let Some(token) = &self.bearer_token {
            flag("bearer-token", token.clone());
        }
        if let Some(per_million) = self.inject_guest_traps_per_million {
            flag("inject-guest-traps-per-million", per_million.to_string());
        }
        if let Some(mb) = self.max_held_mb {
            flag("max-held-mb", mb.to_string());
        }
        if self.inject_instance_refusals {
            args.push("--inject-instance-refusals".to_owned());
        }
        args.extend(self.extra_args.iter().cloned());
        args
    }

    /// The `stile serve` command for `database_url`.
    fn command(&self, database_url: &str, clock: Option<&ClockFile>) -> Command {
        let mut command = stile_command(&self.args(database_url), clock);
        for (name, value) in &self.env {
            match value {
                Some(value) => command.env(name, value),
                None => command.env_remove(name),
            };
        }
        command
    }
}

/// How a gateway that was not to start ended.
#[derive(Debug)]
pub struct Refused {
    pub status: ExitStatus,
    /// What it wrote on stderr, line by line.
    pub stderr: String,
}

/// A running gateway process.
#[derive(Debug)]
pub struct Gateway {
    process: Process,
    addr: SocketAddr,
    clock: Option<ClockFile>,
}

impl Gateway {
    /// Starts a gateway on `database_url` with default options.
    pub async fn start(database_url: &str) -> Gateway {
        Gateway::start_with(database_url, &GatewayOptions::default()).await
    }

    /// Starts a gateway and waits for its "listening on" line.
    pub async fn start_with(database_url: &str, options: &GatewayOptions) -> Gateway {
        let clock = options
            .clock_offset_s
            .map(|offset_s| ClockFile::new("gateway", offset_s).unwrap_or_else(|e| panic!("set the gateway's clock: {e:#}")));
        let command = options.command(database_url, clock.as_ref());
        let (process, addr) = Process::start_until(command, listening_addr).await;
        Gateway { process, addr, clock }
    }

    /// Runs a gateway that should not start (a database it must refuse to
    /// use) to its exit, within [`START_TIMEOUT`], and answers how it ended.
    /// Panics, with its output, if it listens instead.
    pub async fn refused(database_url: &str, options: &GatewayOptions) -> Refused {
        let listened = Arc::new(AtomicBool::new(false));
        let seen = listened.clone();
        let on_stdout = move |line: &str| {
            if listening_addr(line).is_some() {
                seen.store(true, Ordering::SeqCst);
            }
        };
        let mut process = Process::spawn_command(options.command(database_url, None), on_stdout, |_| {});
        let status = process.wait_exit(START_TIMEOUT).await;
        assert!(!listened.load(Ordering::SeqCst), "the gateway started on {database_url}:\n{}", process.logs());
        let stderr = process.output.lock().expect("not poisoned").stderr.join("\n");
        Refused { status, stderr }
    }

    /// Its process id.
    pub fn pid(&self) -> i32 {
        i32::try_from(self.process.pid()).expect("a pid fits i32")
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A client on a connection of its own.
    pub async fn client(&self) -> Client {
        Client::connect(self.addr).await.unwrap_or_else(|e| panic!("connect to the gateway at {}: {e:#}", self.addr))
    }

    /// The process, to signal it or wait for its end.
    pub fn process(&mut self) -> &mut Process {
        &mut self.process
    }

    /// Everything the gateway printed so far.
    pub fn logs(&self) -> String {
        self.process.logs()
    }

    /// Moves the wall clock of a gateway started with a clock offset; the
    /// gateway sees it within a second.
    pub fn set_clock_offset(&self, offset_s: i64) {
        let clock = self.clock.as_ref().expect("the gateway was started with `clock_offset_s`");
        clock.set(offset_s).unwrap_or_else(|e| panic!("move the gateway's clock: {e:#}"));
    }
}

/// The address in a "stile listening on http://ADDR (...)" line (or
/// `https://`).
pub fn listening_addr(line: &str) -> Option<SocketAddr> {
    let (_, rest) = line.split_once("listening on http://").or_else(|| line.split_once("listening on https://"))?;
    rest.split(|c: char| c.is_whitespace() || c == '/').next()?.parse().ok()
}

/// A response: status and body.
#[derive(Clone, Debug)]
pub struct Reply {
    pub status: u16,
    pub content_type: Option<String>,
    pub headers: hyper::HeaderMap,
    pub body: Bytes,
}

impl Reply {
    /// The body as JSON; panics, showing the body, if it is not.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("HTTP {}: body is not JSON ({e}): {}", self.status, self.text()))
    }

    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The `error` of a JSON error body; panics if there is none.
    pub fn error(&self) -> String {
        match self.json().get("error") {
            Some(Value::String(message)) => message.clone(),
            _ => panic!("HTTP {}: expected {{\"error\": ...}}, got {}", self.status, self.text()),
        }
    }
}

/// One item's answer to a push.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub index: u64,
    pub message_id: String,
    pub transaction_id: String,
    pub queue: String,
    pub partition: String,
    pub offset: i64,
    pub status: String,
}

impl Answer {
    /// Parses one entry of a push's 201 body.
    pub fn from_json(value: &Value) -> Answer {
        let text = |key: &str| {
            value
                .get(key)
                .and_then(Value::as_str)
                .unwrap_or_else(|| panic!("answer without a string {key:?}: {value}"))
                .to_owned()
        };
        let number =
            |key: &str| value.get(key).and_then(Value::as_i64).unwrap_or_else(|| panic!("answer without {key:?}: {value}"));
        let answer = Answer {
            index: u64::try_from(number("index")).expect("index >= 0"),
            message_id: text("message_id"),
            transaction_id: text("transaction_id"),
            queue: text("queueName"),
            partition: text("partition"),
            offset: number("offset"),
            status: text("status"),
        };
        assert!(answer.queued() || answer.duplicate(), "unknown status in {value}");
        answer
    }

    pub fn queued(&self) -> bool {
        self.status == "queued"
    }

    pub fn duplicate(&self) -> bool {
        self.status == "duplicate"
    }
}

/// A message as `GET /api/v1/messages` returns it.
#[derive(Clone, Debug, PartialEq)]
pub struct Stored {
    pub offset: i64,
    pub message_id: String,
    pub transaction_id: String,
    pub payload: Value,
}

/// A push item: `{"queue", "partition", "transactionId"?, "payload"}`.
pub fn item(queue: &str, partition: &str, transaction_id: Option<&str>, payload: Value) -> Value {
    let mut item = json!({ "queue": queue, "partition": partition, "payload": payload });
    if let Some(id) = transaction_id {
        item["transactionId"] = Value::from(id);
    }
    item
}

/// The value of one series (`name{labels}` exactly as rendered) in a
/// Prometheus text exposition; 0 when absent.
pub fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| line.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
        .map_or(0.0, |value| value.trim().parse().unwrap_or_else(|e| panic!("metric {series}: {value:?}: {e}")))
}

/// The sum of every series of the metric `name`, whatever its labels (a
/// gauge published per shard, say); 0 when there is none.
pub fn metric_total(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            let value = if rest.starts_with('{') { rest.split_once("} ")?.1 } else { rest.strip_prefix(' ')? };
            Some(value.trim().parse::<f64>().unwrap_or_else(|e| panic!("metric {name}: {value:?}: {e}")))
        })
        .sum()
}

/// An HTTP/1.1 client on one keep-alive connection (reopened when the
/// gateway closed it between requests).
#[derive(Debug)]
pub struct Client {
    addr: SocketAddr,
    sender: SendRequest<Full<Bytes>>,
    bearer: Option<String>,
}

impl Client {
    /// Opens a connection.
    pub async fn connect(addr: SocketAddr) -> anyhow::Result<Client> {
        Ok(Client { addr, sender: open(addr).await?, bearer: None })
    }

    /// Sends `Authorization: Bearer <token>` with every request from now on.
    pub fn with_bearer(mut self, token: &str) -> Client {
        self.bearer = Some(token.to_owned());
        self
    }

    /// One exchange; `headers` are added as given (a `host` among them
    /// replaces the gateway's address). Errors are transport errors only
    /// (any status is a reply).
    pub async fn send(
        &mut self,
        method: Method,
        path: &str,
        body: impl Into<Bytes>,
        headers: &[(&str, &str)],
    ) -> anyhow::Result<Reply> {
        let mut request = Request::builder().method(method).uri(path);
        // A `host` among `headers` stands in for the gateway's address.
        if !headers.iter().any(|(name, _)| name.eq_ignore_ascii_case("host")) {
            request = request.header(HOST, self.addr.to_string());
        }
        if let Some(token) = &self.bearer {
            request = request.header(AUTHORIZATION, format!("Bearer {token}"));
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request.body(Full::new(body.into())).context("build the request")?;
        tokio::time::timeout(REQUEST_TIMEOUT, self.exchange(request))
            .await
            .map_err(|_| anyhow!("no answer within {REQUEST_TIMEOUT:?}"))?
    }

    async fn exchange(&mut self, request: Request<Full<Bytes>>) -> anyhow::Result<Reply> {
        if self.sender.ready().await.is_err() {
            // The gateway closed the connection after the last exchange
            // (e.g. after refusing an oversized body): open another.
            self.sender = open(self.addr).await?;
            self.sender.ready().await.context("a fresh connection is not ready")?;
        }
        let response = self.sender.send_request(request).await.context("send the request")?;
        let status = response.status().as_u16();
        let content_type = response.headers().get(CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let headers = response.headers().clone();
        let body = response.into_body().collect().await.context("read the response body")?.to_bytes();
        Ok(Reply { status, content_type, headers, body })
    }

    /// `GET path`; panics on a transport error.
    pub async fn get(&mut self, path: &str) -> Reply {
        self.send(Method::GET, path, Bytes::new(), &[]).await.unwrap_or_else(|e| panic!("GET {path}: {e:#}"))
    }

    /// `POST path` with a raw body; panics on a transport error.
    pub async fn post(&mut self, path: &str, body: impl Into<Bytes>) -> Reply {
        self.send(Method::POST, path, body, &[("content-type", "application/json")])
            .await
            .unwrap_or_else(|e| panic!("POST {path}: {e:#}"))
    }

    /// `POST /api/v1/push {"items": items}`, expecting 201; the answers.
    pub async fn push(&mut self, items: Vec<Value>) -> Vec<Answer> {
        let count = items.len();
        let reply = self.post("/api/v1/push", json!({ "items": items }).to_string()).await;
        assert_eq!(reply.status, 201, "push answered {}: {}", reply.status, reply.text());
        let answers = parse_answers(&reply.json());
        assert_eq!(answers.len(), count, "one answer per item");
        answers
    }

    /// Like [`Client::push`], but a transport error or a status other than
    /// 201 is returned instead of panicking.
    pub async fn try_push(&mut self, items: Vec<Value>) -> anyhow::Result<Vec<Answer>> {
        let reply = self.send(Method::POST, "/api/v1/push", json!({ "items": items }).to_string(), &[]).await?;
        if reply.status != 201 {
            bail!("push answered {}: {}", reply.status, reply.text());
        }
        Ok(parse_answers(&reply.json()))
    }

    /// `POST /api/v1/configure {"queue", "options"}`, expecting 200; the
    /// stored options.
    pub async fn configure(&mut self, queue: &str, options: Value) -> Value {
        let reply = self.post("/api/v1/configure", json!({ "queue": queue, "options": options }).to_string()).await;
        assert_eq!(reply.status, 200, "configure answered {}: {}", reply.status, reply.text());
        reply.json()["options"].clone()
    }

    /// Every message of a partition from `from` on (paging through
    /// `GET /api/v1/messages`).
    pub async fn messages(&mut self, queue: &str, partition: &str, from: i64) -> Vec<Stored> {
        let mut out = Vec::new();
        let mut from = from;
        loop {
            let query = form_urlencoded::Serializer::new(String::new())
                .append_pair("queue", queue)
                .append_pair("partition", partition)
                .append_pair("fromOffset", &from.to_string())
                .append_pair("limit", "10000")
                .finish();
            let reply = self.get(&format!("/api/v1/messages?{query}")).await;
            assert_eq!(reply.status, 200, "messages answered {}: {}", reply.status, reply.text());
            let page = reply.json()["messages"].as_array().cloned().unwrap_or_default();
            let Some(last) = page.last() else { return out };
            from = last["offset"].as_i64().expect("an offset") + 1;
            out.extend(page.iter().map(|m| Stored {
                offset: m["offset"].as_i64().expect("an offset"),
                message_id: m["message_id"].as_str().expect("a message id").to_owned(),
                transaction_id: m["transaction_id"].as_str().expect("a transaction id").to_owned(),
                payload: m["payload"].clone(),
            }));
        }
    }

    /// `GET /metrics` as text.
    pub async fn metrics(&mut self) -> String {
        let reply = self.get("/metrics").await;
        assert_eq!(reply.status, 200, "metrics answered {}", reply.status);
        reply.text()
    }
}

fn parse_answers(body: &Value) -> Vec<Answer> {
    body.as_array().unwrap_or_else(|| panic!("a push answers an array: {body}")).iter().map(Answer::from_json).collect()
}

async fn open(addr: SocketAddr) -> anyhow::Result<SendRequest<Full<Bytes>>> {
    let stream = TcpStream::connect(addr).await.with_context(|| format!("connect to {addr}"))?;
    stream.set_nodelay(true)?;
    let (sender, connection) = http1::handshake(TokioIo::new(stream)).await.context("HTTP/1.1 handshake")?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_listening_line() {
        let line = "\u{1b}[2m2026-01-01T00:00:00Z\u{1b}[0m  INFO stile listening on http://127.0.0.1:40613 (database host=x, 2 shards, engine Wasm)";
        assert_eq!(listening_addr(line), Some("127.0.0.1:40613".parse().unwrap()));
        assert_eq!(listening_addr("stile stopped"), None);
    }

    /// A child spawned by a thread that then ends is killed by the kernel:
    /// what happens to a gateway when the test or benchmark that started it
    /// is killed. (Without the signal, `wait` would return after 60 s with
    /// the sleep's own exit status.)
    #[test]
    fn a_child_dies_with_the_thread_that_spawned_it() {
        use std::os::unix::process::ExitStatusExt as _;
        let mut child = std::thread::spawn(|| {
            let mut command = Command::new("sleep");
            command.arg("60");
            die_with_parent(&mut command);
            command.spawn().expect("spawn sleep")
        })
        .join()
        .expect("the spawning thread");
        let status = child.wait().expect("wait for the child");
        assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    }

    #[test]
    fn reads_a_series() {
        let text = "# HELP x\nstile_segments_total{probe=\"skipped\"} 12\nstile_segments_total{probe=\"full\"} 3\n";
        assert_eq!(metric(text, "stile_segments_total{probe=\"skipped\"}"), 12.0);
        assert_eq!(metric(text, "stile_segments_total{probe=\"narrowed\"}"), 0.0);
    }
}
