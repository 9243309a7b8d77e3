//! A connection's time limits: how long the gateway waits for a client.
//!
//! A client that opens a connection and sends nothing, sends its header one
//! byte at a time, or stops reading its answer, holds a task, a socket and
//! (for an answer) memory. [`TimedIo`] wraps a connection's socket and fails
//! a read or a write that waits past its limit, which ends the connection:
//!
//! - between requests (a new connection, or keep-alive after an answer), the
//!   next request's first byte must arrive within [`ConnectionLimits::idle`];
//! - from that first byte, its header must be complete within
//!   [`ConnectionLimits::header`];
//! - a write that makes no progress for [`ConnectionLimits::send`] (a client
//!   that does not read its answer) ends the connection, and the answer's
//!   memory is given back.
//!
//! While a request is being served, the socket's reads are the body's, whose
//! limit the handler keeps (`crate::http`, [`ConnectionLimits::body`]); the
//! wait for room in the intake, before the body is read, has a limit of its
//! own ([`ConnectionLimits::queue`]).

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// How long the gateway waits for a client, at each step of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// From the end of one request (or the connection's start) to the next
    /// request's first byte.
    pub idle: Duration,
    /// From a request's first byte to the end of its header.
    pub header: Duration,
    /// The whole body, counting only the time spent waiting for the client.
    pub body: Duration,
    /// A write that makes no progress.
    pub send: Duration,
    /// A wait for room in the intake, before the body is read
    /// ([`crate::intake`]); past it, the request is answered 503.
    pub queue: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> ConnectionLimits {
        ConnectionLimits {
            idle: Duration::from_secs(60),
            header: Duration::from_secs(10),
            body: Duration::from_secs(30),
            send: Duration::from_secs(30),
            queue: Duration::from_secs(5),
        }
    }
}

/// Where a connection is between requests; shared by its socket and the
/// handler of its requests.
#[derive(Clone, Debug)]
pub struct ConnectionPhase {
    phase: Arc<Mutex<Phase>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting for a request's first byte since this instant.
    Idle(Instant),
    /// A request's header is arriving, since its first byte.
    Header(Instant),
    /// Requests are being served: this many handlers run (more than one
    /// only on an HTTP/2 connection, one per stream).
    Serving(usize),
}

impl ConnectionPhase {
    fn new() -> ConnectionPhase {
        ConnectionPhase { phase: Arc::new(Mutex::new(Phase::Idle(Instant::now()))) }
    }

    /// A request's header is complete and its handler starts; the handler
    /// keeps the guard until it has answered (or is dropped unfinished).
    pub fn serving(&self) -> Serving {
        let mut phase = self.lock();
        *phase = match *phase {
            Phase::Serving(handlers) => Phase::Serving(handlers + 1),
            Phase::Idle(_) | Phase::Header(_) => Phase::Serving(1),
        };
        Serving { phase: self.clone() }
    }

    /// A handler has answered: once none runs, the connection waits for
    /// the next request.
    fn answered(&self) {
        let mut phase = self.lock();
        *phase = match *phase {
            Phase::Serving(handlers) if handlers > 1 => Phase::Serving(handlers - 1),
            _ => Phase::Idle(Instant::now()),
        };
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The instant a read still waiting must have completed by, if any; a
    /// read that brings bytes to an idle connection starts a header.
    fn read_deadline(&self, limits: &ConnectionLimits) -> Option<Instant> {
        match *self.lock() {
            Phase::Idle(since) => Some(since + limits.idle),
            Phase::Header(since) => Some(since + limits.header),
            Phase::Serving(_) => None,
        }
    }

    fn bytes_arrived(&self) {
        let mut phase = self.lock();
        if matches!(*phase, Phase::Idle(_)) {
            *phase = Phase::Header(Instant::now());
        }
    }
}

/// A request being served on a connection: while any is, the connection's
/// reads have no limit here (the handler keeps the body's).
#[derive(Debug)]
#[must_use = "the request counts as served only while the guard is kept"]
pub struct Serving {
    phase: ConnectionPhase,
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.phase.answered();
    }
}

/// A socket whose reads and writes fail once they wait past the
/// connection's limits.
#[derive(Debug)]
pub struct TimedIo<T> {
    inner: T,
    limits: ConnectionLimits,
    phase: ConnectionPhase,
    read_timer: Option<Pin<Box<Sleep>>>,
    write_timer: Option<Pin<Box<Sleep>>>,
}

impl<T> TimedIo<T> {
    /// Wraps a new connection's socket; the phase is shared with the
    /// connection's request handler.
    pub fn new(inner: T, limits: ConnectionLimits) -> (TimedIo<T>, ConnectionPhase) {
        let phase = ConnectionPhase::new();
        (TimedIo { inner, limits, phase: phase.clone(), read_timer: None, write_timer: None }, phase)
    }
}

/// Polls `timer`, set to `deadline` (armed or moved as needed): ready once
/// the deadline has passed.
fn expired(timer: &mut Option<Pin<Box<Sleep>>>, deadline: Instant, cx: &mut Context<'_>) -> bool {
    match timer {
        Some(sleep) if sleep.deadline() == deadline => {}
        Some(sleep) => sleep.as_mut().reset(deadline),
        None => *timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
    }
    timer.as_mut().expect("armed above").as_mut().poll(cx).is_ready()
}

fn timed_out(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, what.to_owned())
}

impl<T: AsyncRead + Unpin> AsyncRead for TimedIo<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(result) => {
                this.read_timer = None;
                if buf.filled().len() > before {
                    this.phase.bytes_arrived();
                }
                Poll::Ready(result)
            }
            Poll::Pending => match this.phase.read_deadline(&this.limits) {
                Some(deadline) if expired(&mut this.read_timer, deadline, cx) => {
                    Poll::Ready(Err(timed_out("the client sent nothing within the connection's time limit")))
                }
                Some(_) => Poll::Pending,
                None => {
                    this.read_timer = None;
                    Poll::Pending
                }
            },
        }
    }
}

impl<T: AsyncWrite + Unpin> TimedIo<T> {
    /// Runs a write step, failing it once it has made no progress for the
    /// send limit.
    fn write_step<R>(
        &mut self,
        cx: &mut Context<'_>,
        step: impl FnOnce(Pin<&mut T>, &mut Context<'_>) -> Poll<io::Result<R>>,
    ) -> Poll<io::Result<R>> {
        match step(Pin::new(&mut self.inner), cx) {
            Poll::Ready(result) => {
                self.write_timer = None;
                Poll::Ready(result)
            }
            Poll::Pending => {
                let deadline = match &self.write_timer {
                    Some(sleep) => sleep.deadline(),
                    None => Instant::now() + self.limits.send,
                };
                if expired(&mut self.write_timer, deadline, cx) {
                    return Poll::Ready(Err(timed_out("the client did not read its answer within the send limit")));
                }
                Poll::Pending
            }
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for TimedIo<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.write_step(cx, |inner, cx| inner.poll_write(cx, buf))
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        self.write_step(cx, |inner, cx| inner.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.write_step(cx, |inner, cx| inner.poll_flush(cx))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.write_step(cx, |inner, cx| inner.poll_shutdown(cx))
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _, duplex};

    use super::*;

    fn limits() -> ConnectionLimits {
        ConnectionLimits {
            idle: Duration::from_secs(60),
            header: Duration::from_secs(10),
            body: Duration::from_secs(30),
            send: Duration::from_secs(5),
            queue: Duration::from_secs(5),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_is_closed_after_the_idle_limit_and_not_before() {
        let (client, server) = duplex(64);
        let (mut io, _phase) = TimedIo::new(server, limits());
        let mut buf = [0u8; 8];
        let started = Instant::now();
        let error = io.read(&mut buf).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(60));
        drop(client);
    }

    #[tokio::test(start_paused = true)]
    async fn a_header_must_be_complete_within_the_header_limit_from_its_first_byte() {
        let (mut client, server) = duplex(64);
        let (mut io, _phase) = TimedIo::new(server, limits());
        tokio::time::advance(Duration::from_secs(50)).await;
        client.write_all(b"GET /").await.unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(io.read(&mut buf).await.unwrap(), 5);
        let first_byte = Instant::now();
        let error = io.read(&mut buf).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert_eq!(first_byte.elapsed(), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_being_served_has_no_read_limit_here_and_an_answer_restarts_the_idle_one() {
        let (mut client, server) = duplex(64);
        let (mut io, phase) = TimedIo::new(server, limits());
        client.write_all(b"x").await.unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(io.read(&mut buf).await.unwrap(), 1);
        let serving = phase.serving();
        let read = tokio::time::timeout(Duration::from_secs(3600), io.read(&mut buf)).await;
        assert!(read.is_err(), "a served request's reads wait as long as the handler lets them");
        drop(serving);
        let answered = Instant::now();
        assert_eq!(io.read(&mut buf).await.unwrap_err().kind(), io::ErrorKind::TimedOut);
        assert_eq!(answered.elapsed(), Duration::from_secs(60));
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_the_client_does_not_read_fails_after_the_send_limit() {
        let (mut client, server) = duplex(16);
        let (mut io, _phase) = TimedIo::new(server, limits());
        io.write_all(&[7u8; 16]).await.unwrap();
        let started = Instant::now();
        let error = io.write_all(&[7u8; 16]).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        let mut buf = [0u8; 16];
        client.read_exact(&mut buf).await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_is_idle_again_only_once_every_stream_it_serves_has_answered() {
        let (_client, server) = duplex(64);
        let (mut io, phase) = TimedIo::new(server, limits());
        let first = phase.serving();
        let second = phase.serving();
        drop(first);
        let mut buf = [0u8; 8];
        let read = tokio::time::timeout(Duration::from_secs(3600), io.read(&mut buf)).await;
        assert!(read.is_err(), "one stream still served: no idle limit");
        drop(second);
        let idle = Instant::now();
        assert_eq!(io.read(&mut buf).await.unwrap_err().kind(), io::ErrorKind::TimedOut);
        assert_eq!(idle.elapsed(), Duration::from_secs(60));
    }
}
