//! Every listener's bounds (unix socket and TCP alike): a connection cap below the fd
//! limit (past it, connections wait in the kernel's backlog, which holds no fd of ours),
//! a deadline on each request head (hyper's header read timeout, which also runs between
//! requests on a kept-alive connection: the idle deadline), a deadline on each request
//! body, and a deadline on a write the client does not take (a client that reads nothing
//! for `write_timeout` loses the connection). None of it needs a token: a half-open
//! connection costs one fd and one small task until its deadline, and there are at most
//! `max_connections` of them per listener.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Semaphore;
use tokio::time::Sleep;

use super::config::Limits;

/// fds kept free of connections: the audit database, the pool, each sandbox's pipes,
/// pidfd and channel, the gateway.
const RESERVED_FDS: u64 = 128;
/// What a sandbox holds in the server, counted on a running one (tests/suite/server.rs
/// `a_session_holds_at_most_its_share_of_the_servers_fds`): a Python session 17 (its
/// driver's pipes, the init's channel, a pidfd, /work, its unified cgroup directory, its id
/// slot's lock, the five cgroup files its usage is read from), each further language
/// context 3 more: 23-24 with all three (a connection being closed may be counted), and 4
/// to spare. A background process adds 2 (its output pipes).
const FDS_PER_SANDBOX: u64 = 28;

/// Raises the soft fd limit to the hard one (as servers do) and returns the connection
/// cap per listener: `limits.max_connections`, lowered so that every listener's
/// connections and every sandbox's fds fit under the fd limit.
pub fn connection_cap(limits: &Limits, listeners: usize) -> usize {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let nofile = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => hard,
            Err(_) => soft,
        },
        Ok((soft, _)) => soft,
        Err(_) => 1024,
    };
    let sandboxes = RESERVED_FDS + FDS_PER_SANDBOX * limits.max_sandboxes as u64;
    if sandboxes > nofile {
        tracing::warn!(
            nofile,
            needed = sandboxes,
            max_sandboxes = limits.max_sandboxes,
            "limits.max_sandboxes sandboxes may need more fds than the fd limit allows (LimitNOFILE): \
             raise it or lower max_sandboxes, or sandboxes past it fail to start"
        );
    }
    let cap = cap_under(nofile, limits, listeners);
    if cap < limits.max_connections {
        tracing::warn!(
            nofile,
            cap,
            "limits.max_connections lowered to fit under the fd limit (LimitNOFILE)"
        );
    }
    cap
}

/// The cap per listener under an fd limit of `nofile`.
fn cap_under(nofile: u64, limits: &Limits, listeners: usize) -> usize {
    let reserved = RESERVED_FDS + FDS_PER_SANDBOX * limits.max_sandboxes as u64;
    let room = nofile.saturating_sub(reserved) / listeners.max(1) as u64;
    (limits.max_connections as u64).min(room).max(8) as usize
}

/// Something that accepts connections: a TCP or unix listener.
pub trait Accept: Send + 'static {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    type Peer: Clone + Send + Sync + 'static;
    fn accept(&self) -> impl Future<Output = std::io::Result<(Self::Io, Self::Peer)>> + Send;
}

impl Accept for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;
    type Peer = std::net::SocketAddr;
    async fn accept(&self) -> std::io::Result<(Self::Io, Self::Peer)> {
        let (stream, peer) = tokio::net::TcpListener::accept(self).await?;
        // A streamed answer's small writes go out as they come, not after the client's
        // delayed ACK (Nagle's 40 ms).
        let _ = stream.set_nodelay(true);
        Ok((stream, peer))
    }
}

impl Accept for tokio::net::UnixListener {
    type Io = tokio::net::UnixStream;
    type Peer = super::UdsPeer;
    async fn accept(&self) -> std::io::Result<(Self::Io, Self::Peer)> {
        let (stream, _) = tokio::net::UnixListener::accept(self).await?;
        let uid = stream.peer_cred().map(|c| c.uid()).unwrap_or(u32::MAX);
        Ok((stream, super::UdsPeer { uid }))
    }
}

/// Serves `app` on `listener` within `limits` until `shutdown` fires, then lets the open
/// connections finish (the caller bounds how long).
pub async fn serve<L: Accept>(
    listener: L,
    app: axum::Router,
    limits: Limits,
    cap: usize,
    shutdown: impl Future<Output = ()> + Send,
) {
    let permits = Arc::new(Semaphore::new(cap));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(64 << 10);
    let app = app.layer(axum::middleware::from_fn_with_state(
        limits.body_timeout,
        body_deadline,
    ));
    tokio::pin!(shutdown);
    loop {
        // Room first, then accept: past the cap, connections wait in the backlog.
        let permit = tokio::select! {
            _ = &mut shutdown => break,
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
        };
        let (io, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // EMFILE and friends: wait rather than spin; the connection stays queued.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let app = app.clone();
        let service =
            hyper::service::service_fn(move |mut request: Request<hyper::body::Incoming>| {
                request
                    .extensions_mut()
                    .insert(axum::extract::ConnectInfo(peer.clone()));
                let request = request.map(Body::new);
                tower::ServiceExt::oneshot(app.clone(), request)
            });
        let io = TokioIo::new(WriteDeadline::new(io, limits.write_timeout));
        let connection = builder.serve_connection(io, service);
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            let _permit = permit;
            let _ = connection.await;
        });
    }
    graceful.shutdown().await;
}

/// A request's body must arrive whole within `deadline` of its head: a client that sends
/// a head and then trickles (or nothing) gets an error, not a task and a buffer held
/// forever.
async fn body_deadline(
    axum::extract::State(deadline): axum::extract::State<Duration>,
    request: Request,
    next: Next,
) -> Response {
    let request = request.map(|body| {
        Body::new(DeadlineBody {
            inner: body,
            sleep: Box::pin(tokio::time::sleep(deadline)),
        })
    });
    next.run(request).await
}

struct DeadlineBody {
    inner: Body,
    sleep: Pin<Box<Sleep>>,
}

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Pending => match this.sleep.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(axum::Error::new(BodyTimeout)))),
                Poll::Pending => Poll::Pending,
            },
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The body did not arrive within `limits.body_timeout`.
#[derive(Debug)]
pub struct BodyTimeout;

impl std::fmt::Display for BodyTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the request body did not arrive within the server's limits.body_timeout"
        )
    }
}

impl std::error::Error for BodyTimeout {}

/// A connection whose writes fail once one has waited `deadline` for the client to read.
struct WriteDeadline<Io> {
    io: Io,
    deadline: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<Io> WriteDeadline<Io> {
    fn new(io: Io, deadline: Duration) -> Self {
        WriteDeadline {
            io,
            deadline,
            stalled: None,
        }
    }

    fn on_write<T>(&mut self, cx: &mut Context<'_>, poll: Poll<T>) -> Poll<std::io::Result<T>>
    where
        T: Sized,
    {
        match poll {
            Poll::Ready(v) => {
                self.stalled = None;
                Poll::Ready(Ok(v))
            }
            Poll::Pending => {
                let deadline = self.deadline;
                let sleep = self
                    .stalled
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(deadline)));
                match sleep.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the client read nothing within limits.write_timeout",
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl<Io: AsyncRead + Unpin> AsyncRead for WriteDeadline<Io> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<Io: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<Io> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match Pin::new(&mut self.io).poll_write(cx, buf) {
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Ready(Ok(n)) => self.on_write(cx, Poll::Ready(n)),
            Poll::Pending => self.on_write(cx, Poll::<usize>::Pending),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match Pin::new(&mut self.io).poll_flush(cx) {
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Ready(Ok(())) => self.on_write(cx, Poll::Ready(())),
            Poll::Pending => self.on_write(cx, Poll::<()>::Pending),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match Pin::new(&mut self.io).poll_write_vectored(cx, bufs) {
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Ready(Ok(n)) => self.on_write(cx, Poll::Ready(n)),
            Poll::Pending => self.on_write(cx, Poll::<usize>::Pending),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connection_caps_fit_under_the_fd_limit() {
        let limits = Limits::default();
        let sandboxes = FDS_PER_SANDBOX * limits.max_sandboxes as u64;
        // Two listeners share what the sandboxes and the reserve leave.
        let nofile = RESERVED_FDS + sandboxes + 384;
        assert_eq!(cap_under(nofile, &limits, 2), 192);
        assert!(2 * cap_under(nofile, &limits, 2) as u64 + RESERVED_FDS + sandboxes <= nofile);
        assert_eq!(cap_under(1 << 20, &limits, 2), limits.max_connections);
        // Never below 8 connections, however few fds.
        assert_eq!(cap_under(100, &limits, 1), 8);
    }
}
