//! A fault proxy on loopback, in the style of toxiproxy: it accepts TCP
//! connections, opens one upstream connection for each (TCP or a unix
//! socket), relays bytes both ways, and on command delays, stalls, holds or
//! resets what it relays. Tests put it between gateways and PostgreSQL where
//! the kernel offers no `netem`.
//!
//! What each fault does (each applies to both directions):
//!
//! - **Latency**: every chunk read from one side is written to the other
//!   `latency` ± `jitter` (uniform) after it was read, never before the
//!   chunk read ahead of it (TCP delivers in order). A round trip through
//!   the proxy costs twice the latency, as `netem` on loopback does.
//! - **Loss**: a userspace proxy sees a byte stream, not packets, so a lost
//!   packet is modelled by what TCP makes of it: the chunk it carried (and,
//!   in order, everything behind it) arrives one retransmission timeout late,
//!   200 ms, Linux's minimum; a retransmission lost again (with the same
//!   chance) doubles the wait.
//! - **Partition**: nothing is relayed and no upstream connection is opened
//!   until it is lifted; connections stay open on both sides, and what was
//!   held flows once it ends, as after a network heals.
//! - **Reset**: every connection open at the command is reset right after it
//!   next carries a chunk upstream (a request reaches the server, its answer
//!   never comes back): both sides are closed with `SO_LINGER` 0, so the
//!   client and a TCP server get an RST (a unix-socket server sees the
//!   socket close).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng as _};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

/// What a lost packet costs at first: Linux's minimum retransmission timeout.
pub const RETRANSMISSION_TIMEOUT: Duration = Duration::from_millis(200);

/// Where the doubling of a retransmission timeout stops (TCP's own cap is
/// two minutes; a test never needs that).
const MAX_RETRANSMISSION_TIMEOUT: Duration = Duration::from_secs(6);

/// The most a chunk is read at once.
const CHUNK: usize = 16 * 1024;

/// Chunks read but not yet written, per direction, before reading waits.
const QUEUED_CHUNKS: usize = 64;

/// Where the proxy connects to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Upstream {
    Tcp(SocketAddr),
    /// The path of a unix socket (PostgreSQL's `<dir>/.s.PGSQL.<port>`).
    Unix(PathBuf),
}

impl Upstream {
    /// The first server a PostgreSQL configuration names.
    pub async fn of_postgres(config: &tokio_postgres::Config) -> std::io::Result<Upstream> {
        let port = config.get_ports().first().copied().unwrap_or(5432);
        match config.get_hosts().first() {
            Some(tokio_postgres::config::Host::Unix(dir)) => Ok(Upstream::Unix(dir.join(format!(".s.PGSQL.{port}")))),
            Some(tokio_postgres::config::Host::Tcp(host)) => {
                let addr = tokio::net::lookup_host((host.as_str(), port)).await?.next();
                addr.map(Upstream::Tcp).ok_or_else(|| std::io::Error::other(format!("{host} resolves to no address")))
            }
            None => Err(std::io::Error::other("the configuration names no host")),
        }
    }
}

/// What the proxy does to the traffic it relays. The default relays as is.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Toxics {
    /// Added to every chunk's delivery, each way.
    pub latency: Duration,
    /// The delay varies uniformly by up to this much either side of
    /// `latency` (never below zero).
    pub jitter: Duration,
    /// The chance (0 to 1) that a chunk is lost once and waits for a
    /// retransmission.
    pub loss: f64,
    /// Nothing relayed, no upstream connection opened.
    pub partitioned: bool,
}

/// Counts of what the proxy did, since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProxyStats {
    pub connections: u64,
    pub open: u64,
    /// Bytes relayed to the server and to the clients.
    pub bytes_up: u64,
    pub bytes_down: u64,
    /// Chunks that waited for at least one retransmission.
    pub chunks_lost: u64,
    /// Connections reset on command.
    pub resets: u64,
}

/// The proxy: listening on `127.0.0.1`, stopped (every connection cut) when
/// dropped.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    toxics: watch::Sender<Toxics>,
    shared: Arc<Shared>,
    acceptor: tokio::task::JoinHandle<()>,
}

#[derive(Debug)]
struct Shared {
    upstream: Upstream,
    toxics: watch::Receiver<Toxics>,
    connections: Mutex<Vec<Weak<Connection>>>,
    counters: Counters,
}

#[derive(Debug, Default)]
struct Counters {
    connections: AtomicU64,
    open: AtomicU64,
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
    chunks_lost: AtomicU64,
    resets: AtomicU64,
}

/// One relayed connection, as the reset command sees it.
#[derive(Debug, Default)]
struct Connection {
    /// Reset after the next chunk written upstream.
    armed: AtomicBool,
    reset: Notify,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Direction {
    Up,
    Down,
}

/// `direct`'s database as reached through a proxy at `proxy`: the proxy's
/// address in place of the hosts, and the same user, database, password,
/// options, application name and TLS settings (the proxy relays bytes, so
/// TLS goes through it end to end).
pub fn proxied(direct: &stile::db::DbConfig, proxy: SocketAddr) -> stile::db::DbConfig {
    let direct_pg = &direct.pg;
    let mut pg = tokio_postgres::Config::new();
    pg.host("127.0.0.1").port(proxy.port());
    if let Some(user) = direct_pg.get_user() {
        pg.user(user);
    }
    if let Some(dbname) = direct_pg.get_dbname() {
        pg.dbname(dbname);
    }
    if let Some(password) = direct_pg.get_password() {
        pg.password(password);
    }
    if let Some(options) = direct_pg.get_options() {
        pg.options(options);
    }
    if let Some(application_name) = direct_pg.get_application_name() {
        pg.application_name(application_name);
    }
    stile::db::DbConfig { pg, tls: direct.tls.clone() }
}

impl FaultProxy {
    /// Listens on a free port of `127.0.0.1` and relays to `upstream`.
    pub async fn start(upstream: Upstream) -> std::io::Result<FaultProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (toxics, receiver) = watch::channel(Toxics::default());
        let shared =
            Arc::new(Shared { upstream, toxics: receiver, connections: Mutex::new(Vec::new()), counters: Counters::default() });
        let acceptor = tokio::spawn(accept(listener, shared.clone()));
        Ok(FaultProxy { addr, toxics, shared, acceptor })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The faults in force.
    pub fn toxics(&self) -> Toxics {
        *self.toxics.borrow()
    }

    /// Changes the faults in force; chunks already read keep the delay they
    /// were given, a partition holds them all.
    pub fn update(&self, change: impl FnOnce(&mut Toxics)) {
        self.toxics.send_modify(change);
    }

    /// Arms every open connection to be reset right after it next carries a
    /// chunk upstream, and answers how many were armed.
    pub fn reset_after_next_request(&self) -> usize {
        let mut connections = self.shared.connections.lock().expect("not poisoned");
        connections.retain(|weak| weak.strong_count() > 0);
        for connection in connections.iter().filter_map(Weak::upgrade) {
            connection.armed.store(true, Ordering::SeqCst);
        }
        connections.len()
    }

    pub fn stats(&self) -> ProxyStats {
        let c = &self.shared.counters;
        ProxyStats {
            connections: c.connections.load(Ordering::Relaxed),
            open: c.open.load(Ordering::Relaxed),
            bytes_up: c.bytes_up.load(Ordering::Relaxed),
            bytes_down: c.bytes_down.load(Ordering::Relaxed),
            chunks_lost: c.chunks_lost.load(Ordering::Relaxed),
            resets: c.resets.load(Ordering::Relaxed),
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // The acceptor owns every connection's task: aborting it cuts them.
        self.acceptor.abort();
    }
}

async fn accept(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                if let Ok((client, _)) = accepted {
                    let _ = client.set_nodelay(true);
                    shared.counters.connections.fetch_add(1, Ordering::Relaxed);
                    connections.spawn(serve(client, shared.clone()));
                }
            }
            Some(_) = connections.join_next() => {}
        }
    }
}

/// A socket the proxy can close abruptly.
trait Socket: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// Makes the coming close abort the connection rather than end it.
    fn abort_on_close(&self);
}

impl Socket for TcpStream {
    fn abort_on_close(&self) {
        let _ = self.set_zero_linger();
    }
}

impl Socket for UnixStream {
    /// A unix socket has no reset: closing it is as abrupt as it gets.
    fn abort_on_close(&self) {}
}

/// Counts a connection open while it lives.
struct OpenGuard(Arc<Shared>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.counters.open.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn serve(client: TcpStream, shared: Arc<Shared>) {
    shared.counters.open.fetch_add(1, Ordering::Relaxed);
    let _open = OpenGuard(shared.clone());
    // During a partition the connection is not made upstream either.
    let mut toxics = shared.toxics.clone();
    if toxics.wait_for(|t| !t.partitioned).await.is_err() {
        return;
    }
    let connection = Arc::new(Connection::default());
    shared.connections.lock().expect("not poisoned").push(Arc::downgrade(&connection));
    match &shared.upstream {
        Upstream::Tcp(addr) => match TcpStream::connect(addr).await {
            Ok(server) => {
                let _ = server.set_nodelay(true);
                relay(client, server, &connection, &shared).await;
            }
            Err(_) => client.abort_on_close(),
        },
        Upstream::Unix(path) => match UnixStream::connect(path).await {
            Ok(server) => relay(client, server, &connection, &shared).await,
            Err(_) => client.abort_on_close(),
        },
    }
}

/// Relays both ways until both sides have ended, one side fails, or the
/// connection is reset on command; the last two abort both sides.
async fn relay<S: Socket>(client: TcpStream, server: S, connection: &Connection, shared: &Shared) {
    let (mut client_read, mut client_write) = tokio::io::split(client);
    let (mut server_read, mut server_write) = tokio::io::split(server);
    let abort = {
        let up = pump(&mut client_read, &mut server_write, Direction::Up, connection, shared);
        let down = pump(&mut server_read, &mut client_write, Direction::Down, connection, shared);
        let both = async { tokio::try_join!(up, down).is_err() };
        tokio::select! {
            failed = both => failed,
            () = connection.reset.notified() => {
                shared.counters.resets.fetch_add(1, Ordering::Relaxed);
                true
            }
        }
    };
    if abort {
        client_read.unsplit(client_write).abort_on_close();
        server_read.unsplit(server_write).abort_on_close();
    }
}

/// One direction: a reader that stamps each chunk with its delivery time,
/// and a writer that delivers them in order, holding them while the network
/// is partitioned. `Err` when either side failed.
async fn pump<R, W>(
    reader: &mut ReadHalf<R>,
    writer: &mut WriteHalf<W>,
    direction: Direction,
    connection: &Connection,
    shared: &Shared,
) -> Result<(), ()>
where
    R: AsyncRead,
    W: AsyncWrite,
{
    let (chunks, mut queued) = mpsc::channel::<(Instant, Bytes)>(QUEUED_CHUNKS);
    let read = async move {
        let mut last_due = Instant::now();
        // A generator of its own: the thread's cannot be held across awaits.
        let mut rng = StdRng::from_rng(&mut rand::rng());
        let ended = loop {
            let mut buffer = BytesMut::with_capacity(CHUNK);
            match reader.read_buf(&mut buffer).await {
                Ok(0) => break Ok(()),
                Ok(_) => {
                    let (delay, lost) = delay(&shared.toxics.borrow(), &mut rng);
                    if lost {
                        shared.counters.chunks_lost.fetch_add(1, Ordering::Relaxed);
                    }
                    last_due = (Instant::now() + delay).max(last_due);
                    if chunks.send((last_due, buffer.freeze())).await.is_err() {
                        break Ok(());
                    }
                }
                Err(_) => break Err(()),
            }
        };
        // The writer finishes what is queued, then passes the end on.
        drop(chunks);
        ended
    };
    let write = async {
        let mut toxics = shared.toxics.clone();
        while let Some((due, chunk)) = queued.recv().await {
            tokio::time::sleep_until(due).await;
            if toxics.wait_for(|t| !t.partitioned).await.is_err() {
                return Err(());
            }
            writer.write_all(&chunk).await.map_err(|_| ())?;
            let relayed = chunk.len() as u64;
            match direction {
                Direction::Up => {
                    shared.counters.bytes_up.fetch_add(relayed, Ordering::Relaxed);
                    if connection.armed.swap(false, Ordering::SeqCst) {
                        connection.reset.notify_one();
                    }
                }
                Direction::Down => {
                    shared.counters.bytes_down.fetch_add(relayed, Ordering::Relaxed);
                }
            }
        }
        // The other side ended its sending: pass the end on.
        let _ = writer.shutdown().await;
        Ok(())
    };
    tokio::try_join!(read, write).map(|_| ())
}

/// How long after it was read a chunk is due on the other side: the latency
/// with its jitter, plus a retransmission timeout (doubling) for each time it
/// is lost; and whether it was lost at all.
fn delay(toxics: &Toxics, rng: &mut impl Rng) -> (Duration, bool) {
    let mut delay = toxics.latency;
    if !toxics.jitter.is_zero() {
        let jitter = toxics.jitter.as_secs_f64();
        delay = Duration::from_secs_f64((delay.as_secs_f64() + rng.random_range(-jitter..=jitter)).max(0.0));
    }
    let loss = toxics.loss.clamp(0.0, 1.0);
    if loss == 0.0 || !rng.random_bool(loss) {
        return (delay, false);
    }
    let mut timeout = RETRANSMISSION_TIMEOUT;
    delay += timeout;
    while timeout < MAX_RETRANSMISSION_TIMEOUT && rng.random_bool(loss) {
        timeout *= 2;
        delay += timeout;
    }
    (delay, true)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rand::SeedableRng as _;
    use rand::rngs::StdRng;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::{TcpListener, TcpStream};
    use tokio::time::Instant;

    use super::{FaultProxy, MAX_RETRANSMISSION_TIMEOUT, RETRANSMISSION_TIMEOUT, Toxics, Upstream, delay};

    /// A proxy in front of a listener of the test's own, and the two ends of
    /// one connection through it: the client's and the server's.
    async fn through_proxy() -> (FaultProxy, TcpStream, TcpStream) {
        let server = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let proxy = FaultProxy::start(Upstream::Tcp(server.local_addr().expect("an address"))).await.expect("start the proxy");
        let client = TcpStream::connect(proxy.addr()).await.expect("connect to the proxy");
        let (upstream, _) = server.accept().await.expect("the proxy connects upstream");
        (proxy, client, upstream)
    }

    /// Bytes of every value, in an order no mix-up could keep.
    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    async fn read_exactly(stream: &mut TcpStream, len: usize, within: Duration) -> Vec<u8> {
        let mut received = vec![0; len];
        tokio::time::timeout(within, stream.read_exact(&mut received)).await.expect("in time").expect("read");
        received
    }

    #[tokio::test]
    async fn relays_bytes_exactly_both_ways() {
        let (proxy, mut client, mut server) = through_proxy().await;
        let up = pattern(1_000_000);
        let writer = tokio::spawn(async move {
            client.write_all(&up).await.expect("write up");
            client
        });
        assert_eq!(read_exactly(&mut server, 1_000_000, Duration::from_secs(10)).await, pattern(1_000_000));
        let mut client = writer.await.expect("the writer");
        let down: Vec<u8> = pattern(300_000).into_iter().rev().collect();
        server.write_all(&down).await.expect("write down");
        assert_eq!(read_exactly(&mut client, down.len(), Duration::from_secs(10)).await, down);
        // An end of sending passes through as one.
        client.shutdown().await.expect("shut down");
        let mut rest = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), server.read_to_end(&mut rest)).await;
        assert_eq!(read.expect("in time").expect("read to the end"), 0);
        let stats = proxy.stats();
        assert_eq!((stats.bytes_up, stats.bytes_down, stats.connections), (1_000_000, 300_000, 1), "{stats:?}");
    }

    #[tokio::test]
    async fn latency_delays_each_way_in_order() {
        let (proxy, mut client, mut server) = through_proxy().await;
        proxy.update(|t| {
            t.latency = Duration::from_millis(80);
            t.jitter = Duration::from_millis(20);
        });
        let started = Instant::now();
        for chunk in pattern(64).chunks(8) {
            client.write_all(chunk).await.expect("write");
        }
        assert_eq!(read_exactly(&mut server, 64, Duration::from_secs(5)).await, pattern(64));
        server.write_all(b"pong").await.expect("write");
        assert_eq!(read_exactly(&mut client, 4, Duration::from_secs(5)).await, b"pong");
        assert!(started.elapsed() >= Duration::from_millis(120), "a round trip took {:?}", started.elapsed());
    }

    #[test]
    fn loss_costs_a_retransmission_timeout_doubling_while_lost_again() {
        let toxics =
            Toxics { latency: Duration::from_millis(50), jitter: Duration::from_millis(10), loss: 0.05, partitioned: false };
        let mut rng = StdRng::seed_from_u64(7);
        let delays: Vec<(Duration, bool)> = (0..100_000).map(|_| delay(&toxics, &mut rng)).collect();
        let lost = delays.iter().filter(|(_, lost)| *lost).count();
        assert!((4_500..5_500).contains(&lost), "{lost} of 100,000 chunks lost at 5 %");
        for (delay, lost) in &delays {
            let (at_least, at_most) = if *lost {
                (Duration::from_millis(240), Duration::from_millis(60) + MAX_RETRANSMISSION_TIMEOUT * 3)
            } else {
                (Duration::from_millis(40), Duration::from_millis(60))
            };
            assert!(*delay >= at_least && *delay <= at_most, "{delay:?} (lost: {lost})");
        }
        // A retransmission lost again (5 % of the lost) waits 200 + 400 ms.
        let twice = delays.iter().filter(|(d, _)| *d >= Duration::from_millis(640)).count();
        assert!((150..350).contains(&twice), "{twice} chunks lost twice");
    }

    #[tokio::test]
    async fn a_lost_chunk_holds_back_what_follows_it() {
        let (proxy, mut client, mut server) = through_proxy().await;
        proxy.update(|t| t.loss = 1.0);
        client.write_all(b"lost").await.expect("write");
        // Once the proxy has read it (and lost it), nothing else is lost.
        let read = tokio::time::timeout(Duration::from_secs(5), async {
            while proxy.stats().chunks_lost == 0 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        });
        read.await.expect("the proxy reads the chunk");
        proxy.update(|t| t.loss = 0.0);
        client.write_all(b"next").await.expect("write");
        let mut buffer = [0u8; 4];
        let early = tokio::time::timeout(RETRANSMISSION_TIMEOUT / 2, server.read_exact(&mut buffer)).await;
        assert!(early.is_err(), "a lost chunk arrived within half a retransmission timeout");
        assert_eq!(proxy.stats().chunks_lost, 1, "{:?}", proxy.stats());
    }

    #[tokio::test]
    async fn a_partition_stalls_open_connections_and_new_ones_until_it_ends() {
        let (proxy, mut client, mut server) = through_proxy().await;
        proxy.update(|t| t.partitioned = true);
        client.write_all(b"held").await.expect("write");
        let mut buffer = [0u8; 4];
        let stalled = tokio::time::timeout(Duration::from_millis(400), server.read_exact(&mut buffer)).await;
        assert!(stalled.is_err(), "bytes crossed a partition");
        // A new connection is accepted but not made upstream.
        let _late = TcpStream::connect(proxy.addr()).await.expect("connect during the partition");
        let nothing = tokio::time::timeout(Duration::from_millis(200), async {
            while proxy.stats().connections < 2 {
                tokio::task::yield_now().await;
            }
        })
        .await;
        assert!(nothing.is_ok(), "the second connection was not accepted");
        proxy.update(|t| t.partitioned = false);
        assert_eq!(read_exactly(&mut server, 4, Duration::from_secs(5)).await, b"held");
        server.write_all(b"back").await.expect("write");
        assert_eq!(read_exactly(&mut client, 4, Duration::from_secs(5)).await, b"back");
    }

    #[tokio::test]
    async fn a_reset_reaches_the_server_with_the_request_then_aborts_both_sides() {
        let (proxy, mut client, mut server) = through_proxy().await;
        client.write_all(b"before").await.expect("write");
        assert_eq!(read_exactly(&mut server, 6, Duration::from_secs(5)).await, b"before");
        assert_eq!(proxy.reset_after_next_request(), 1);
        client.write_all(b"commit").await.expect("write");
        // The request reaches the server; then the server's side is reset.
        assert_eq!(read_exactly(&mut server, 6, Duration::from_secs(5)).await, b"commit");
        let mut rest = Vec::new();
        let server_end = tokio::time::timeout(Duration::from_secs(5), server.read_to_end(&mut rest)).await.expect("in time");
        assert_eq!(server_end.expect_err("an abort, not an end").kind(), std::io::ErrorKind::ConnectionReset);
        // The client never gets an answer: its side is reset too.
        let _ = server.write_all(b"answer").await;
        let client_end = tokio::time::timeout(Duration::from_secs(5), client.read_to_end(&mut rest)).await.expect("in time");
        assert_eq!(client_end.expect_err("an abort, not an end").kind(), std::io::ErrorKind::ConnectionReset);
        assert!(rest.is_empty(), "the client read {rest:?}");
        assert_eq!(proxy.stats().resets, 1);
    }
}
