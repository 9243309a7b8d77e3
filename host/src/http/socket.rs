//! A connection's TCP socket, shared: hyper reads and writes it through
//! [`SharedSocket`], and a request waiting for room in the intake asks
//! [`ClientWatch`] whether its client has hung up.
//!
//! Under a burst, requests wait for room with their bodies unread in the
//! kernel's buffers, and hyper does not read a connection whose request
//! waits, so a client that gives up and closes its connection is not seen
//! until its request's turn comes. Without this, the gateway would then read,
//! run and store a push nobody will hear the answer to, and a push sent after
//! the burst would wait behind every such request. Seeing the hang-up needs
//! no read: the socket's readiness, kept by tokio, records the peer's end of
//! stream (`EPOLLRDHUP`) even while unread bytes remain before it.
//!
//! A client that shuts down only its sending side while it waits for an
//! answer counts as hung up, as hyper itself treats it by default.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use futures::FutureExt as _;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;

/// The most bytes of a read's buffer made ready for one read: the buffer
/// hyper offers is uninitialised and is zeroed here before the kernel fills
/// it, so a read zeroes no more than this.
const MOST_BYTES_PER_READ: usize = 64 << 10;

/// Shares `stream` between a connection's reads and writes and the watch of
/// its client.
pub fn share(stream: TcpStream) -> (SharedSocket, ClientWatch) {
    let stream = Arc::new(stream);
    (SharedSocket { stream: stream.clone() }, ClientWatch { stream })
}

/// A connection's socket, read and written by hyper.
#[derive(Debug)]
pub struct SharedSocket {
    stream: Arc<TcpStream>,
}

/// Tells whether a connection's client has hung up.
#[derive(Clone, Debug)]
pub struct ClientWatch {
    stream: Arc<TcpStream>,
}

impl ClientWatch {
    /// Whether the client has closed its end of the connection (or the
    /// connection has failed), as far as the socket's readiness has been
    /// seen; never waits.
    pub fn has_hung_up(&self) -> bool {
        match self.stream.ready(Interest::READABLE).now_or_never() {
            Some(Ok(ready)) => ready.is_read_closed(),
            Some(Err(_)) => true,
            None => false,
        }
    }
}

impl AsyncRead for SharedSocket {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        loop {
            ready!(self.stream.poll_read_ready(cx))?;
            let room = buf.remaining().min(MOST_BYTES_PER_READ);
            match self.stream.try_read(buf.initialize_unfilled_to(room)) {
                Ok(read) => {
                    buf.advance(read);
                    return Poll::Ready(Ok(()));
                }
                // Readiness was stale; `try_read` has cleared it, so the
                // next poll waits for the socket.
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                Err(error) => return Poll::Ready(Err(error)),
            }
        }
    }
}

impl SharedSocket {
    /// Runs `write` once the socket is writable, until it is not refused
    /// for stale readiness (which `write` then clears).
    fn poll_write_with(&self, cx: &mut Context<'_>, write: impl Fn(&TcpStream) -> io::Result<usize>) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.stream.poll_write_ready(cx))?;
            match write(&self.stream) {
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                written => return Poll::Ready(written),
            }
        }
    }
}

impl AsyncWrite for SharedSocket {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        self.poll_write_with(cx, |stream| stream.try_write(data))
    }

    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        self.poll_write_with(cx, |stream| stream.try_write_vectored(data))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let shut = socket2::SockRef::from(&*self.stream).shutdown(std::net::Shutdown::Write);
        // A peer that has gone already leaves nothing to shut down.
        Poll::Ready(match shut {
            Err(error) if error.kind() == io::ErrorKind::NotConnected => Ok(()),
            shut => shut,
        })
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpListener;

    use super::*;

    async fn connected() -> (TcpStream, SharedSocket, ClientWatch) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let (socket, watch) = share(server);
        (client, socket, watch)
    }

    /// Waits until the watch sees what the socket's readiness will show:
    /// the driver records an event some time after the kernel has it.
    async fn until_hung_up(watch: &ClientWatch) {
        loop {
            let ready = watch.stream.ready(Interest::READABLE).await.unwrap();
            if ready.is_read_closed() {
                return;
            }
            // Readable with bytes still unread: the end of stream may come
            // after them, which a later event reports.
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn bytes_go_both_ways_and_a_shutdown_ends_the_clients_read() {
        let (mut client, mut socket, watch) = connected().await;
        client.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        socket.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
        socket.write_all(b"pong").await.unwrap();
        socket.shutdown().await.unwrap();
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).await.unwrap();
        assert_eq!(answer, b"pong");
        assert!(!watch.has_hung_up(), "the client has not closed its end");
    }

    #[tokio::test]
    async fn a_client_that_closes_is_seen_to_have_hung_up_with_its_bytes_unread() {
        let (mut client, _socket, watch) = connected().await;
        client.write_all(&[7u8; 4096]).await.unwrap();
        assert!(!watch.has_hung_up(), "bytes waiting are not a hang-up");
        drop(client);
        tokio::time::timeout(std::time::Duration::from_secs(10), until_hung_up(&watch)).await.expect("the hang-up is seen");
        assert!(watch.has_hung_up());
    }
}
