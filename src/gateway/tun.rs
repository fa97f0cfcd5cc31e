//! The sandbox's tun queue as an async device for the stack: one read is one packet, one
//! write is one packet.

use std::io;
use std::os::fd::OwnedFd;
use std::pin::Pin;
use std::task::{Context, Poll};

use std::sync::Arc;

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::admission::{Admission, Verdict};

/// The queue, and what decides on each packet read from it before the stack sees it.
pub struct TunDevice(AsyncFd<OwnedFd>, Option<Arc<Admission>>);

impl TunDevice {
    /// `fd` must be non-blocking (the launcher opens it so).
    pub fn new(fd: OwnedFd) -> io::Result<TunDevice> {
        // SAFETY: an OwnedFd is an open fd that stays open, the same file description,
        // until it is dropped, which only the AsyncFd that owns it does.
        let fd = unsafe { AsyncFd::register(fd) }.map_err(|e| e.into_parts().1)?;
        Ok(TunDevice(fd, None))
    }

    /// Every packet read from now on goes through `admission` first.
    pub fn admit_with(&mut self, admission: Arc<Admission>) {
        self.1 = Some(admission);
    }
}

impl AsyncRead for TunDevice {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        // Packets refused in a row before the task yields (a flood must not hold a worker).
        let mut refused = 0;
        loop {
            if refused == 64 {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            let mut guard = match self.0.poll_read_ready(cx) {
                Poll::Ready(Ok(g)) => g,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            };
            let unfilled = buf.initialize_unfilled();
            match guard
                .try_io(|fd| nix::unistd::read(fd.get_ref(), unfilled).map_err(io::Error::from))
            {
                Ok(Ok(n)) => {
                    let verdict = match &self.1 {
                        Some(admission) => admission.inspect(&unfilled[..n]),
                        None => Verdict::Pass,
                    };
                    match verdict {
                        Verdict::Pass => {
                            buf.advance(n);
                            return Poll::Ready(Ok(()));
                        }
                        Verdict::Drop => refused += 1,
                        // A refusal goes straight back; if the queue is full it is lost
                        // like the SYN would be, and the sandbox asks again.
                        Verdict::Reply(packet) => {
                            refused += 1;
                            let _ = nix::unistd::write(self.0.get_ref(), &packet);
                        }
                    }
                }
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for TunDevice {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            let mut guard = match self.0.poll_write_ready(cx) {
                Poll::Ready(Ok(g)) => g,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            };
            match guard.try_io(|fd| nix::unistd::write(fd.get_ref(), buf).map_err(io::Error::from))
            {
                Ok(result) => return Poll::Ready(result),
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
