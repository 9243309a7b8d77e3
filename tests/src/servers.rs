//! PostgreSQL servers of the tests' own, each in a temporary directory on a
//! free port: the checker's replicated pair of the failover fault
//! (`checker/replicated.rs`), its single server for the faults that must not
//! touch the shared one ([`OwnServer`]): taking every connection it has, or
//! filling its disk, which is then a tmpfs of a fixed size, and the scratch
//! servers of other tests ([`crate::scratch::ScratchServer`]).
//!
//! PostgreSQL refuses to run as root: when the tests run as root, the servers
//! and their tools run as `postgres`. Each server is a child of the test
//! process that the kernel kills with the thread that started it (see
//! [`crate::gateway::die_with_parent`]), and dropping a [`Home`] removes its
//! directory (unmounting it first if it is a tmpfs), so a failed run leaves
//! nothing behind.

use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use stile::db::DbConfig;

/// How long a server may take to accept connections.
pub(crate) const READY_WITHIN: Duration = Duration::from_secs(60);

/// The database the gateways use on a server of the checker's own.
pub(crate) const DATABASE: &str = "stile_checker";

/// A directory for servers, PostgreSQL's programs and the user they run as.
#[derive(Debug)]
pub(crate) struct Home {
    pub(crate) dir: PathBuf,
    bin: PathBuf,
    owner: Option<Owner>,
    /// The directory is a tmpfs mounted for the servers.
    mounted: bool,
}

/// The user the servers run as when the checker is root.
#[derive(Clone, Copy, Debug)]
struct Owner {
    uid: u32,
    gid: u32,
}

impl Home {
    /// A new directory under the system's temporary one, named after
    /// `purpose`; with `tmpfs_mb`, a tmpfs of that size mounted on it (which
    /// takes root).
    pub(crate) fn new(purpose: &str, tmpfs_mb: Option<u64>) -> anyhow::Result<Home> {
        let bin = server_binaries()?;
        let owner = owner()?;
        let dir = std::env::temp_dir().join(format!("stile-{purpose}-{:016x}", rand::random::<u64>()));
        std::fs::create_dir(&dir).with_context(|| format!("create {}", dir.display()))?;
        // From here on, a failure drops the home, which removes the directory.
        let mut home = Home { dir, bin, owner, mounted: false };
        if let Some(mb) = tmpfs_mb {
            mount_tmpfs(&home.dir, mb)?;
            home.mounted = true;
        }
        std::fs::set_permissions(&home.dir, std::fs::Permissions::from_mode(0o700))?;
        if let Some(owner) = owner {
            std::os::unix::fs::chown(&home.dir, Some(owner.uid), Some(owner.gid))
                .with_context(|| format!("give {} to the postgres user", home.dir.display()))?;
        }
        Ok(home)
    }

    /// Runs one of PostgreSQL's programs as the servers' owner, to its end.
    pub(crate) async fn tool(&self, name: &str, args: &[&str]) -> anyhow::Result<()> {
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

    /// Writes `contents` to the file `name` in the directory, readable by
    /// the servers' owner alone (as PostgreSQL wants of a private key), and
    /// answers its path.
    pub(crate) fn write_file(&self, name: &str, contents: &[u8]) -> anyhow::Result<PathBuf> {
        let path = self.dir.join(name);
        std::fs::write(&path, contents).with_context(|| format!("write {}", path.display()))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        if let Some(owner) = self.owner {
            std::os::unix::fs::chown(&path, Some(owner.uid), Some(owner.gid))
                .with_context(|| format!("give {} to the postgres user", path.display()))?;
        }
        Ok(path)
    }

    /// `initdb` of a server's data directory (trust, UTF8, C), with `extra`
    /// arguments.
    pub(crate) async fn initdb(&self, server: &Server, extra: &[&str]) -> anyhow::Result<()> {
        let data = server.data.display().to_string();
        let mut args = vec!["-D", &data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"];
        args.extend_from_slice(extra);
        self.tool("initdb", &args).await
    }

    /// Starts a server in the foreground as a child, its output in
    /// `<role>.log` beside its data directory. Spawns it from the calling
    /// thread, which it dies with: call it from a thread that lasts the run,
    /// such as a runtime's worker, never from a blocking task.
    pub(crate) fn serve(&self, server: &Server, settings: &[String]) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(server.log_path())
            .with_context(|| format!("open {}", server.log_path().display()))?;
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
    pub(crate) async fn ready(&self, server: &Server) -> anyhow::Result<()> {
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            if let Some(status) = server.exit_status() {
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
    /// owner in the home directory, with no `PG*` variable to redirect it.
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

impl Drop for Home {
    /// Call once the servers have stopped (a holder stops them first).
    fn drop(&mut self) {
        if self.mounted {
            let unmounted = Command::new("umount").arg(&self.dir).status();
            if !unmounted.is_ok_and(|status| status.success()) {
                // Busy (a process still has a file open): detach it now,
                // the kernel frees it once the last file closes.
                let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
            }
        }
        if let Err(error) = std::fs::remove_dir_all(&self.dir) {
            eprintln!("warning: could not remove {}: {error}", self.dir.display());
        }
    }
}

/// `mount -t tmpfs -o size=<mb>m tmpfs <dir>`. A tmpfs reserves nothing for
/// root, so a file the checker writes as root fills it for PostgreSQL too.
fn mount_tmpfs(dir: &Path, mb: u64) -> anyhow::Result<()> {
    // SAFETY: geteuid cannot fail and touches no memory.
    if unsafe { libc::geteuid() } != 0 {
        bail!("a size-limited filesystem for PostgreSQL is a tmpfs mounted by the checker, which takes root");
    }
    let output = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={mb}m,mode=0700"), "tmpfs"])
        .arg(dir)
        .output()
        .context("run mount")?;
    if !output.status.success() {
        bail!("mount a {mb} MiB tmpfs on {}: {}", dir.display(), String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(())
}

/// One server in a [`Home`].
#[derive(Debug)]
pub(crate) struct Server {
    role: &'static str,
    data: PathBuf,
    pub(crate) port: u16,
    child: Mutex<Option<Child>>,
}

impl Server {
    pub(crate) fn new(home: &Home, role: &'static str, port: u16) -> Server {
        Server { role, data: home.dir.join(role), port, child: Mutex::new(None) }
    }

    /// `127.0.0.1:port`.
    pub(crate) fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// A connection to one of its databases, this server only, without TLS
    /// (which a test's server may or may not offer).
    pub(crate) fn config(&self, dbname: &str) -> DbConfig {
        let mut config = tokio_postgres::Config::new();
        config
            .host("127.0.0.1")
            .port(self.port)
            .user("postgres")
            .dbname(dbname)
            .connect_timeout(Duration::from_secs(5))
            .ssl_mode(tokio_postgres::config::SslMode::Disable);
        DbConfig::from(config)
    }

    /// The data directory.
    pub(crate) fn data(&self) -> &Path {
        &self.data
    }

    pub(crate) fn log_path(&self) -> PathBuf {
        self.data.with_extension("log")
    }

    /// The last lines of what the server printed, for errors.
    pub(crate) fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// How the server's process ended, if it has (and it is reaped).
    pub(crate) fn exit_status(&self) -> Option<String> {
        let mut child = self.child.lock().expect("not poisoned");
        let status = child.as_mut()?.try_wait().ok()??;
        *child = None;
        Some(status.to_string())
    }

    /// Waits for the server's process to end (after a stop) and reaps it.
    pub(crate) fn reap(&self) -> String {
        let child = self.child.lock().expect("not poisoned").take();
        child.map_or_else(|| "not running".to_owned(), |mut child| child.wait().map_or_else(|e| e.to_string(), |s| s.to_string()))
    }

    /// Stops the server at once (SIGQUIT, PostgreSQL's immediate shutdown),
    /// SIGKILL if it has not exited within 10 s, and reaps it.
    pub(crate) fn stop_now(&self) {
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

/// What an [`OwnServer`] is made with.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OwnServerSpec {
    pub(crate) max_connections: u32,
    /// The size of the tmpfs it lives on (data and WAL), if any.
    pub(crate) tmpfs_mb: Option<u64>,
}

/// A single server of the checker's own with the gateways' database, so that
/// faults that would disturb everyone else on the shared server (all its
/// connections taken, its disk full) stay in the run.
#[derive(Debug)]
pub(crate) struct OwnServer {
    pub(crate) server: Server,
    settings: Vec<String>,
    pub(crate) spec: OwnServerSpec,
    /// Declared last: dropped after the server has been stopped.
    pub(crate) home: Home,
}

impl OwnServer {
    /// Makes the server and its database. Spawns the server from the calling
    /// thread (see [`Home::serve`]).
    pub(crate) async fn start(spec: OwnServerSpec) -> anyhow::Result<OwnServer> {
        let home = Home::new("own-server", spec.tmpfs_mb)?;
        let server = Server::new(&home, "server", free_ports::<1>()?[0]);
        // 1 MiB WAL segments and a small max_wal_size keep WAL within a small
        // filesystem, so that its data and its WAL both run out in a fault.
        let small_disk = spec.tmpfs_mb.is_some();
        home.initdb(&server, if small_disk { &["--wal-segsize=1"] } else { &[] }).await?;
        let mut settings = vec![format!("max_connections={}", spec.max_connections)];
        if small_disk {
            settings.extend(["max_wal_size=32MB".to_owned(), "min_wal_size=4MB".to_owned()]);
        }
        let own = OwnServer { server, settings, spec, home };
        own.home.serve(&own.server, &own.settings)?;
        own.home.ready(&own.server).await?;
        let admin = crate::pg::connect(&own.server.config("postgres")).await?;
        admin.batch_execute(&format!("CREATE DATABASE {DATABASE}")).await.context("create the gateways' database")?;
        Ok(own)
    }

    /// The gateways' database, for gateways and checks alike.
    pub(crate) fn url(&self) -> String {
        format!("postgresql://postgres@{}/{DATABASE}", self.server.address())
    }

    /// Starts the server again if it has exited (PostgreSQL stops for good
    /// when it cannot recover, as after a write to its WAL failed), and
    /// waits until it accepts connections. Answers how it had ended, with
    /// the last lines of its log that say why, if it had.
    pub(crate) async fn ensure_running(&self) -> anyhow::Result<Option<String>> {
        let Some(status) = self.server.exit_status() else {
            self.home.ready(&self.server).await?;
            return Ok(None);
        };
        let log = std::fs::read_to_string(self.server.log_path()).unwrap_or_default();
        let why = ["PANIC", "No space left", "startup process", "shutting down"];
        let fatal: Vec<&str> = log.lines().filter(|line| why.iter().any(|w| line.contains(w))).collect();
        self.home.serve(&self.server, &self.settings)?;
        self.home.ready(&self.server).await?;
        Ok(Some(format!("{status}; its log: {}", fatal[fatal.len().saturating_sub(3)..].join(" / "))))
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        self.server.stop_now();
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

/// `N` distinct ports free on 127.0.0.1 (held together while they are
/// chosen, so that they differ).
pub(crate) fn free_ports<const N: usize>() -> anyhow::Result<[u16; N]> {
    let listeners: Vec<std::net::TcpListener> =
        (0..N).map(|_| std::net::TcpListener::bind("127.0.0.1:0")).collect::<Result<_, _>>()?;
    let mut ports = [0; N];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener.local_addr()?.port();
    }
    Ok(ports)
}
