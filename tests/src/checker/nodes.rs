//! Gateway processes: starting one (with its clock fault, if any), killing
//! it, and reading what it printed.

use std::collections::VecDeque;
use std::io::Read;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::sync::oneshot;

use super::{GatewaySpec, TRAP_LINE};
use crate::gateway::{each_line, stile_binary};

/// What a gateway printed: the last lines and the traps it reported.
#[derive(Debug, Default)]
pub(super) struct NodeLog {
    pub(super) tail: VecDeque<String>,
    pub(super) traps: u64,
}

pub(super) const TAIL_LINES: usize = 60;

/// One gateway process (and its successors after restarts).
#[derive(Debug)]
pub(super) struct Node {
    pub(super) spec: GatewaySpec,
    pub(super) clock: Option<crate::clock::ClockFile>,
    pub(super) database_url: String,
    pub(super) addr: Option<SocketAddr>,
    pub(super) child: Option<Child>,
    pub(super) incarnation: u32,
    pub(super) log: Arc<Mutex<NodeLog>>,
}

impl Node {
    pub(super) fn new(spec: GatewaySpec, database_url: &str) -> Node {
        Node {
            spec,
            clock: None,
            database_url: database_url.to_owned(),
            addr: None,
            child: None,
            incarnation: 0,
            log: Arc::default(),
        }
    }

    /// Starts the process, on its previous address if it had one, and waits
    /// for its "listening on" line.
    pub(super) async fn start(&mut self) -> anyhow::Result<SocketAddr> {
        assert!(self.child.is_none(), "a node runs one process at a time");
        let listen = self.addr.map_or_else(|| "127.0.0.1:0".to_owned(), |a| a.to_string());
        let mut command = Command::new(stile_binary());
        command
            .args(["serve", "--listen", &listen, "--database-url", &self.database_url])
            .args(["--pool-size", "8", "--purge-seconds", "3600"])
            .args(&self.spec.args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (var, _) in std::env::vars_os() {
            if var.to_string_lossy().starts_with("STILE_") || var == "DATABASE_URL" {
                command.env_remove(var);
            }
        }
        command.env("NO_COLOR", "1").env("RUST_LOG", "info");
        if let Some(skew) = &self.spec.clock
            && self.clock.is_none()
        {
            self.clock = Some(crate::clock::ClockFile::new(&self.spec.label, skew.offsets_s[0])?);
        }
        if let Some(file) = &self.clock {
            file.apply(&mut command);
        }
        crate::gateway::die_with_parent(&mut command);
        let mut child = command.spawn().context("start stile")?;
        let (ready_tx, ready_rx) = oneshot::channel::<SocketAddr>();
        let ready = Arc::new(Mutex::new(Some(ready_tx)));
        let label = format!("{}#{}", self.spec.label, self.incarnation);
        drain(child.stdout.take().expect("piped"), self.log.clone(), label.clone(), Some(ready.clone()));
        drain(child.stderr.take().expect("piped"), self.log.clone(), label, None);
        self.child = Some(child);
        match tokio::time::timeout(Duration::from_secs(60), ready_rx).await {
            Ok(Ok(addr)) => {
                self.addr = Some(addr);
                Ok(addr)
            }
            outcome => {
                self.kill();
                let why = if outcome.is_err() { "did not listen within 60 s" } else { "exited before listening" };
                bail!("gateway {} {why}:\n{}", self.spec.label, self.tail())
            }
        }
    }

    /// `kill -9` and reap.
    pub(super) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Whether the process ended by itself (and its status).
    pub(super) fn exited(&mut self) -> Option<String> {
        let status = self.child.as_mut()?.try_wait().ok()??;
        self.child = None;
        Some(status.to_string())
    }

    pub(super) fn tail(&self) -> String {
        let log = self.log.lock().expect("not poisoned");
        log.tail.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    pub(super) fn traps(&self) -> u64 {
        self.log.lock().expect("not poisoned").traps
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Reads a child's stream on a thread of its own into the node's log,
/// counting trap lines and handing the "listening on" address to `ready`.
pub(super) fn drain(
    stream: impl Read + Send + 'static,
    log: Arc<Mutex<NodeLog>>,
    label: String,
    ready: Option<Arc<Mutex<Option<oneshot::Sender<SocketAddr>>>>>,
) {
    let _closed = each_line(stream, move |line| {
        if let Some(ready) = &ready
            && let Some(addr) = listening_addr(line)
            && let Some(tx) = ready.lock().expect("not poisoned").take()
        {
            let _ = tx.send(addr);
        }
        let mut log = log.lock().expect("not poisoned");
        if line.contains(TRAP_LINE) {
            log.traps += 1;
        }
        if log.tail.len() == TAIL_LINES {
            log.tail.pop_front();
        }
        log.tail.push_back(format!("[{label}] {line}"));
    });
}

pub(super) fn listening_addr(line: &str) -> Option<SocketAddr> {
    let (_, rest) = line.split_once("listening on http://")?;
    rest.split(|c: char| c.is_whitespace() || c == '/').next()?.parse().ok()
}

/// Where producers find each gateway: its address and incarnation, `None`
/// while it is down.
pub(super) type AddressBook = Arc<RwLock<Vec<Option<(SocketAddr, u32)>>>>;
