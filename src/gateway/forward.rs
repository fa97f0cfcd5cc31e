//! Copying a connection's bytes both ways under the sandbox's bandwidth cap, counting them,
//! and closing it when it has been idle too long.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::http::Requests;
use super::log::Bytes;

/// A token bucket: `rate` bytes per second with a burst of a twentieth of a second (at
/// least 16 KiB). A sender that overdraws it waits until its debt is paid, so the sum of
/// every connection's bytes stays at the rate.
pub struct Bucket {
    rate: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl Bucket {
    pub fn new(rate: u64) -> Bucket {
        let rate = rate.max(1) as f64;
        let burst = (rate / 20.0).max(16.0 * 1024.0);
        Bucket {
            rate,
            burst,
            state: Mutex::new((burst, Instant::now())),
        }
    }

    pub async fn spend(&self, n: usize) {
        let wait = {
            let Ok(mut state) = self.state.lock() else {
                return;
            };
            let now = Instant::now();
            let (tokens, last) = *state;
            let tokens = (tokens + now.duration_since(last).as_secs_f64() * self.rate)
                .min(self.burst)
                - n as f64;
            *state = (tokens, now);
            if tokens < 0.0 {
                Duration::from_secs_f64(-tokens / self.rate)
            } else {
                Duration::ZERO
            }
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

/// The two buckets of a sandbox.
pub struct Limits {
    pub up: Bucket,
    pub down: Bucket,
    pub idle: Duration,
}

/// What one read takes: small enough that the bucket's pacing stays smooth.
const CHUNK: usize = 32 * 1024;

/// Copies both ways until both sides have finished (or one fails, or nothing moved for
/// `limits.idle`). `first` is what was read from the sandbox before the connection was
/// decided; it goes out first. With `requests` (plain HTTP), every request the sandbox
/// sends is checked before it goes on; at the first refused one the upstream is sent a FIN
/// (the requests before it are still answered) and `refuse` is told why, at once.
pub async fn relay<S, U>(
    sandbox: S,
    upstream: U,
    first: Vec<u8>,
    requests: Option<Requests>,
    refuse: &(dyn Fn(String) + Sync),
    limits: &Limits,
    bytes: &Bytes,
) where
    S: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let start = Instant::now();
    let activity = AtomicU64::new(0);
    let touch = || activity.store(start.elapsed().as_millis() as u64, Ordering::Relaxed);
    let (mut s_read, mut s_write) = tokio::io::split(sandbox);
    let (mut u_read, mut u_write) = tokio::io::split(upstream);
    let out = async {
        if !first.is_empty() {
            limits.up.spend(first.len()).await;
            u_write.write_all(&first).await?;
            bytes.out.fetch_add(first.len() as u64, Ordering::Relaxed);
            touch();
        }
        match requests {
            // Refused already, behind the requests in `first`: no more goes up.
            Some(requests) if requests.refused().is_some() => {
                refuse(requests.refused().unwrap_or_default().to_string());
                shutdown(&mut u_write).await;
                Ok(())
            }
            Some(mut requests) => {
                let checked = Checked {
                    requests: &mut requests,
                    refuse,
                };
                pipe(
                    &mut s_read,
                    &mut u_write,
                    &limits.up,
                    &bytes.out,
                    &touch,
                    Some(checked),
                )
                .await
            }
            None => {
                pipe(
                    &mut s_read,
                    &mut u_write,
                    &limits.up,
                    &bytes.out,
                    &touch,
                    None,
                )
                .await
            }
        }
    };
    let back = pipe(
        &mut u_read,
        &mut s_write,
        &limits.down,
        &bytes.inn,
        &touch,
        None,
    );
    let both = async { tokio::join!(out, back) };
    let idle = async {
        loop {
            let last = Duration::from_millis(activity.load(Ordering::Relaxed));
            let quiet_until = start + last + limits.idle;
            if Instant::now() >= quiet_until {
                return;
            }
            tokio::time::sleep_until(quiet_until).await;
        }
    };
    tokio::select! {
        _ = both => {}
        _ = idle => {}
    }
}

/// The checker of a pipe that carries HTTP requests, and where it puts its refusal.
struct Checked<'a> {
    requests: &'a mut Requests,
    refuse: &'a (dyn Fn(String) + Sync),
}

async fn pipe<R, W>(
    from: &mut R,
    to: &mut W,
    bucket: &Bucket,
    counter: &AtomicU64,
    touch: &impl Fn(),
    mut check: Option<Checked<'_>>,
) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(n) => n,
            Err(e) => {
                shutdown(to).await;
                return Err(e);
            }
        };
        if n == 0 {
            shutdown(to).await;
            return Ok(());
        }
        let mut checked = Vec::new();
        let mut refused = None;
        let send = match &mut check {
            None => &buf[..n],
            Some(c) => {
                if let Err(reason) = c.requests.feed(&buf[..n], &mut checked) {
                    refused = Some(reason);
                }
                &checked[..]
            }
        };
        if !send.is_empty() {
            bucket.spend(send.len()).await;
            to.write_all(send).await?;
            counter.fetch_add(send.len() as u64, Ordering::Relaxed);
            touch();
        }
        if let (Some(reason), Some(c)) = (refused, &mut check) {
            // The requests before the refused one went on and are answered; no more goes.
            (c.refuse)(reason);
            shutdown(to).await;
            return Ok(());
        }
    }
}

/// Closes `to`'s sending side, polling again until it is done: the stack sends its FIN
/// only once everything written is acknowledged, and does not wake a shutdown that was
/// polled before that (ipstack 1.0), so each poll is a new attempt.
pub async fn shutdown<W: AsyncWrite + Unpin>(to: &mut W) {
    for _ in 0..400 {
        if tokio::time::timeout(Duration::from_millis(25), to.shutdown())
            .await
            .is_ok()
        {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_bucket_holds_its_rate() {
        let bucket = Bucket::new(1 << 20);
        let start = tokio::time::Instant::now();
        for _ in 0..(4 << 20) / CHUNK {
            bucket.spend(CHUNK).await;
        }
        let secs = start.elapsed().as_secs_f64();
        assert!((3.8..4.1).contains(&secs), "{secs}");
    }
}
