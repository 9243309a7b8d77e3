//! A replicated PostgreSQL of the checker's own, for the failover fault: a
//! primary and a standby streaming from it, each a server in one temporary
//! directory on a free port, with the primary's commits waiting for the
//! standby (`synchronous_standby_names` names it, `synchronous_commit=on`).
//!
//! The shared server the other tests use cannot be made a primary without
//! changing its configuration, so the checker makes its own pair. PostgreSQL
//! refuses to run as root: when the checker is root, the servers and their
//! tools run as `postgres`. Each server is a child of the checker that the
//! kernel kills with the thread that started it (see
//! [`crate::gateway::die_with_parent`]), and dropping the pair stops both
//! and removes the directory, so a failed run leaves nothing behind.

use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};

use super::*;

/// The standby's `cluster_name`, which its WAL receiver gives the primary as
/// its application name, and so the name `synchronous_standby_names` waits
/// for.
const STANDBY_NAME: &str = "stile_standby";

/// The database the gateways use.
const DATABASE: &str = "stile_checker";

/// How long a server may take to accept connections, and the standby to
/// become synchronous.
const READY_WITHIN: Duration = Duration::from_secs(60);

/// A primary and its synchronous standby, stopped and removed on drop.
#[derive(Debug)]
pub(super) struct ReplicatedPair {
    dir: PathBuf,
    bin: PathBuf,
    owner: Option<Owner>,
    pub(super) primary: Server,
    pub(super) standby: Server,
    /// Set once the standby has been promoted: it is the primary from then on.
    promoted: std::sync::atomic::AtomicBool,
}

/// The user the servers run as when the checker is root.
#[derive(Clone, Copy, Debug)]
struct Owner {
    uid: u32,
    gid: u32,
}

/// One server of the pair.
#[derive(Debug)]
pub(super) struct Server {
    role: &'static str,
    data: PathBuf,
    pub(super) port: u16,
    child: Mutex<Option<Child>>,
}

impl Server {
    fn new(dir: &Path, role: &'static str, port: u16) -> Server {
        Server { role, data: dir.join(role), port, child: Mutex::new(None) }
    }

    /// `127.0.0.1:port`.
    pub(super) fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// A connection to one of its databases, this server only.
    fn config(&self, dbname: &str) -> tokio_postgres::Config {
        let mut config = tokio_postgres::Config::new();
        config.host("127.0.0.1").port(self.port).user("postgres").dbname(dbname).connect_timeout(Duration::from_secs(5));
        config
    }

    fn log_path(&self) -> PathBuf {
        self.data.with_extension("log")
    }

    /// The last lines of what the server printed, for errors.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Stops the server at once (SIGQUIT, PostgreSQL's immediate shutdown),
    /// SIGKILL if it has not exited within 10 s, and reaps it.
    fn stop_now(&self) {
        let Some(mut child) = self.child.lock().expect("not poisoned").take() else { return };
        if let Ok(pid) = i32::try_from(child.id()) {
            // SAFETY: a plain system call on the pid of a child not yet reaped.
            unsafe { libc::kill(pid, libc::SIGQUIT) };
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// When the failover fault stopped the primary and when the standby was
/// promoted, and how the standby stood just before.
#[derive(Clone, Debug)]
pub(super) struct FailoverTimes {
    /// The standby's `sync_state` in the primary's `pg_stat_replication`.
    pub(super) sync_state: String,
    /// How the primary's process ended.
    pub(super) primary_exit: String,
    pub(super) stopped_us: i64,
    pub(super) promoted_us: i64,
}

impl ReplicatedPair {
    /// Makes the primary, its database and the standby, and waits until the
    /// standby is synchronous. Spawns the servers from the calling thread
    /// (they die with it): call it from a thread that lasts the run, such as
    /// a runtime's worker.
    pub(super) async fn start() -> anyhow::Result<ReplicatedPair> {
        let bin = server_binaries()?;
        let owner = owner()?;
        let dir = std::env::temp_dir().join(format!("stile-failover-{:016x}", rand::random::<u64>()));
        std::fs::create_dir(&dir).with_context(|| format!("create {}", dir.display()))?;
        // From here on, a failure drops the pair, which removes the directory.
        let ports = free_ports()?;
        let pair = ReplicatedPair {
            primary: Server::new(&dir, "primary", ports[0]),
            standby: Server::new(&dir, "standby", ports[1]),
            dir,
            bin,
            owner,
            promoted: std::sync::atomic::AtomicBool::new(false),
        };
        std::fs::set_permissions(&pair.dir, std::fs::Permissions::from_mode(0o700))?;
        if let Some(owner) = owner {
            std::os::unix::fs::chown(&pair.dir, Some(owner.uid), Some(owner.gid))
                .with_context(|| format!("give {} to the postgres user", pair.dir.display()))?;
        }

        let data = pair.primary.data.display().to_string();
        pair.tool("initdb", &["-D", &data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"]).await?;
        let synchronous = [format!("synchronous_standby_names={STANDBY_NAME}"), "synchronous_commit=on".to_owned()];
        pair.serve(&pair.primary, &synchronous)?;
        pair.ready(&pair.primary).await?;

        // The standby: a copy of the primary that streams from it
        // (`-R` writes `primary_conninfo` and `standby.signal`). Its own
        // settings name no synchronous standby, so that once promoted it
        // commits alone.
        let data = pair.standby.data.display().to_string();
        let port = pair.primary.port.to_string();
        pair.tool(
            "pg_basebackup",
            &["-D", &data, "-h", "127.0.0.1", "-p", &port, "-U", "postgres", "-R", "-c", "fast", "--no-sync"],
        )
        .await?;
        pair.serve(&pair.standby, &[format!("cluster_name={STANDBY_NAME}")])?;
        pair.ready(&pair.standby).await?;

        let deadline = Instant::now() + READY_WITHIN;
        loop {
            match pair.sync_state().await {
                Ok(state) if state == "sync" => break,
                outcome if Instant::now() >= deadline => {
                    bail!("the standby did not become synchronous within {READY_WITHIN:?} ({outcome:?})")
                }
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        let admin = crate::pg::connect(&pair.primary.config("postgres")).await?;
        admin.batch_execute(&format!("CREATE DATABASE {DATABASE}")).await.context("create the gateways' database")?;
        Ok(pair)
    }

    /// Both servers, the primary first, for the gateways: libpq's multi-host
    /// form, which connects to the first that accepts writes.
    pub(super) fn url(&self) -> String {
        format!(
            "postgresql://postgres@{},{}/{DATABASE}?target_session_attrs=read-write",
            self.primary.address(),
            self.standby.address()
        )
    }

    /// The server that is the primary now: the standby once promoted.
    pub(super) fn current_primary(&self) -> &Server {
        if self.promoted.load(std::sync::atomic::Ordering::SeqCst) { &self.standby } else { &self.primary }
    }

    /// The gateways' database on the current primary only.
    pub(super) fn current_primary_url(&self) -> String {
        format!("postgresql://postgres@{}/{DATABASE}", self.current_primary().address())
    }

    /// Whether the current primary is still in recovery (a standby).
    pub(super) async fn current_primary_in_recovery(&self) -> anyhow::Result<bool> {
        let client = crate::pg::connect(&self.current_primary().config(DATABASE)).await?;
        Ok(client.query_one("SELECT pg_is_in_recovery()", &[]).await?.get(0))
    }

    /// The standby's `sync_state` as the primary sees it (`sync` when commits
    /// wait for it), or why there is none.
    async fn sync_state(&self) -> anyhow::Result<String> {
        let client = crate::pg::connect(&self.primary.config("postgres")).await?;
        let rows =
            client.query("SELECT sync_state FROM pg_stat_replication WHERE application_name = $1", &[&STANDBY_NAME]).await?;
        match rows.first() {
            Some(row) => Ok(row.get(0)),
            None => bail!("the standby is not streaming"),
        }
    }

    /// Stops the primary at once (`pg_ctl stop -m immediate`: no shutdown
    /// checkpoint, connections cut mid-transaction, as a crash would) and
    /// promotes the standby (`pg_ctl promote`), waiting until it accepts
    /// writes.
    pub(super) async fn fail_over(self: &Arc<Self>) -> anyhow::Result<FailoverTimes> {
        let sync_state = self.sync_state().await.unwrap_or_else(|error| format!("unknown ({error:#})"));
        let primary = self.primary.data.display().to_string();
        self.tool("pg_ctl", &["stop", "-D", &primary, "-m", "immediate", "-w", "-t", "30"]).await?;
        let stopped_us = now_us();
        let pair = self.clone();
        let primary_exit = tokio::task::spawn_blocking(move || {
            let child = pair.primary.child.lock().expect("not poisoned").take();
            child.map_or_else(
                || "not running".to_owned(),
                |mut child| child.wait().map_or_else(|e| e.to_string(), |s| s.to_string()),
            )
        })
        .await?;
        let standby = self.standby.data.display().to_string();
        self.tool("pg_ctl", &["promote", "-D", &standby, "-w", "-t", "60"]).await?;
        let promoted_us = now_us();
        self.promoted.store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(FailoverTimes { sync_state, primary_exit, stopped_us, promoted_us })
    }

    /// Runs one of PostgreSQL's programs as the servers' owner, to its end.
    async fn tool(&self, name: &str, args: &[&str]) -> anyhow::Result<()> {
        let mut command = self.command(name);
        command.args(args).stdin(Stdio::null());
        let output = tokio::task::spawn_blocking(move || command.output()).await?.with_context(|| format!("run {name}"))?;
        if !output.status.success() {
            bail!(
                "{name} {}: {}: {}{}",
                args.join(" "),
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        Ok(())
    }

    /// Starts a server in the foreground as a child, its output in
    /// `<role>.log` beside its data directory.
    fn serve(&self, server: &Server, settings: &[String]) -> anyhow::Result<()> {
        let log = std::fs::File::create(server.log_path()).with_context(|| format!("create {}", server.log_path().display()))?;
        let mut command = self.command("postgres");
        command.arg("-D").arg(&server.data);
        let common = [
            format!("port={}", server.port),
            "listen_addresses=127.0.0.1".to_owned(),
            format!("unix_socket_directories={}", self.dir.display()),
        ];
        for setting in common.iter().chain(settings) {
            command.args(["-c", setting]);
        }
        command.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
        crate::gateway::die_with_parent(&mut command);
        let child = command.spawn().with_context(|| format!("start the {}", server.role))?;
        *server.child.lock().expect("not poisoned") = Some(child);
        Ok(())
    }

    /// Waits until a server accepts connections.
    async fn ready(&self, server: &Server) -> anyhow::Result<()> {
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            if let Some(status) = server.child.lock().expect("not poisoned").as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                bail!("the {} exited ({status}):\n{}", server.role, server.log_tail());
            }
            match crate::pg::connect(&server.config("postgres")).await {
                Ok(_) => return Ok(()),
                Err(error) if Instant::now() >= deadline => {
                    bail!(
                        "the {} did not accept connections within {READY_WITHIN:?} ({error}):\n{}",
                        server.role,
                        server.log_tail()
                    )
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    /// A command for one of PostgreSQL's programs, run as the servers'
    /// owner in the pair's directory, with no `PG*` variable to redirect it.
    fn command(&self, name: &str) -> Command {
        let mut command = Command::new(self.bin.join(name));
        command.current_dir(&self.dir).env("HOME", &self.dir);
        for (var, _) in std::env::vars_os() {
            if var.to_string_lossy().starts_with("PG") {
                command.env_remove(var);
            }
        }
        if let Some(owner) = self.owner {
            command.uid(owner.uid).gid(owner.gid);
        }
        command
    }
}

impl Drop for ReplicatedPair {
    fn drop(&mut self) {
        self.primary.stop_now();
        self.standby.stop_now();
        if let Err(error) = std::fs::remove_dir_all(&self.dir) {
            eprintln!("warning: could not remove {}: {error}", self.dir.display());
        }
    }
}

/// The directory of PostgreSQL's server programs: the newest
/// `/usr/lib/postgresql/<version>/bin` (Debian's layout), else the one
/// `pg_config --bindir` names.
fn server_binaries() -> anyhow::Result<PathBuf> {
    let newest = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| Some((entry.file_name().to_str()?.parse::<u32>().ok()?, entry.path().join("bin"))))
        .filter(|(_, bin)| bin.join("initdb").is_file())
        .max_by_key(|(version, _)| *version);
    if let Some((_, bin)) = newest {
        return Ok(bin);
    }
    let output = Command::new("pg_config").arg("--bindir").output().context("find PostgreSQL's programs (pg_config --bindir)")?;
    let bin = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    if !bin.join("initdb").is_file() {
        bail!("PostgreSQL's server programs (initdb, pg_ctl, pg_basebackup, postgres) were not found");
    }
    Ok(bin)
}

/// `postgres` when the checker runs as root (PostgreSQL refuses root), else
/// nobody else: the servers run as the checker's own user.
fn owner() -> anyhow::Result<Option<Owner>> {
    // SAFETY: geteuid cannot fail and touches no memory.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let id = |flag: &str| -> anyhow::Result<u32> {
        let output = Command::new("id").args([flag, "postgres"]).output().context("run id")?;
        if !output.status.success() {
            bail!("running as root, the servers need the user `postgres`: {}", String::from_utf8_lossy(&output.stderr));
        }
        Ok(String::from_utf8_lossy(&output.stdout).trim().parse()?)
    };
    Ok(Some(Owner { uid: id("-u")?, gid: id("-g")? }))
}

/// Two distinct ports free on 127.0.0.1 (held together while they are
/// chosen, so that they differ).
fn free_ports() -> anyhow::Result<[u16; 2]> {
    let first = std::net::TcpListener::bind("127.0.0.1:0")?;
    let second = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok([first.local_addr()?.port(), second.local_addr()?.port()])
}
