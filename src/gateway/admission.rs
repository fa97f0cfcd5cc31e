//! What a sandbox may make the gateway hold, decided on each packet before the stack sees
//! it, and the teardown of what it held, off the runtime's threads.
//!
//! ipstack makes a stream (a task, its channels and buffers) for the first packet of every
//! new flow, before the engine can decide anything; and it acknowledges what the sandbox
//! sends at once, queueing it unbounded until the engine reads it. So the link's reader
//! ([`Admission::inspect`], called by the tun device on every packet the sandbox sends)
//! is where the bounds are kept:
//!
//! - a TCP SYN for a new flow passes only while fewer than `tcp_cap` TCP flows are held
//!   (the engine's `max_connections` and some headroom for connections being closed);
//!   past it the device answers RST itself and the stack never sees it;
//! - a UDP packet for a new flow passes only while fewer than [`UDP_FLOWS`] are held;
//! - a TCP segment whose data would put more than [`UNREAD_MAX`] bytes ahead of what the
//!   engine has read from that flow is dropped (unacknowledged: the sandbox's TCP sends it
//!   again later), so the stack's queue of unread data stays bounded.
//!
//! A flow stays counted until its stream has been dropped. Dropping an ipstack TCP stream
//! waits for its task (`block_in_place` + `block_on`, ipstack 1.0.1's `Drop`): on a worker
//! thread each such wait takes a thread of tokio's blocking pool, and a mass teardown (a
//! sandbox with thousands of connections ending) filled the 512-thread pool and stopped the
//! gateway for every later sandbox. So streams are never dropped on the runtime's
//! threads: [`Held`] sends them to the [`Reaper`], one plain thread that drops them one by
//! one (there `block_in_place` runs its closure inline) and then releases their flow.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use etherparse::{NetSlice, PacketBuilder, SlicedPacket, TransportSlice};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// UDP flows held at once by one sandbox (DNS queries from as many source ports).
pub const UDP_FLOWS: usize = 64;
/// TCP flows held beyond `max_connections`: connections being refused or closed.
pub const TCP_HEADROOM: usize = 16;
/// Bytes a sandbox may send on one connection ahead of what the gateway has read from it.
pub const UNREAD_MAX: u32 = 512 * 1024;
/// How long an admitted flow may go without the engine accepting its stream before its
/// place is given back (a SYN the stack dropped, a race with the stack's own teardown).
const UNACCEPTED: Duration = Duration::from_secs(5);

/// A flow, as the sandbox addressed it: its own address and port, and the destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key {
    pub tcp: bool,
    pub src: SocketAddr,
    pub dst: SocketAddr,
}

struct Flow {
    /// The SYN's sequence number (TCP): a SYN with another one on the same flow is a new
    /// connection on a flow not yet released, and is refused. None for a flow the engine
    /// took without its SYN having been seen here (its place was given back meanwhile).
    isn: Option<u32>,
    admitted: Instant,
    /// Set when the engine takes the stream: from then on only its drop releases the flow.
    accepted: bool,
    /// Bytes the engine has read from the stream.
    read: Arc<AtomicU64>,
}

/// What the device does with a packet from the sandbox.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Drop,
    /// Refused: send this packet (a RST) back to the sandbox instead.
    Reply(Vec<u8>),
}

/// One sandbox's flows.
pub struct Admission {
    tcp_cap: usize,
    flows: Mutex<HashMap<Key, Flow>>,
    reaper: Reaper,
    /// Told of each TCP connection refused here (to log it).
    on_refused: Box<dyn Fn(SocketAddr) + Send + Sync>,
}

impl Admission {
    pub fn new(
        max_connections: u64,
        reaper: Reaper,
        on_refused: Box<dyn Fn(SocketAddr) + Send + Sync>,
    ) -> Admission {
        Admission {
            tcp_cap: (max_connections.max(1) as usize).saturating_add(TCP_HEADROOM),
            flows: Mutex::new(HashMap::new()),
            reaper,
            on_refused,
        }
    }

    /// The decision on one packet the sandbox sent.
    pub fn inspect(&self, packet: &[u8]) -> Verdict {
        let Ok(sliced) = SlicedPacket::from_ip(packet) else {
            return Verdict::Pass;
        };
        // IPv6 is off on the link, but a packet of it would make a stream all the same.
        let (src_ip, dst_ip): (IpAddr, IpAddr) = match &sliced.net {
            Some(NetSlice::Ipv4(ip)) => (
                ip.header().source_addr().into(),
                ip.header().destination_addr().into(),
            ),
            Some(NetSlice::Ipv6(ip)) => (
                ip.header().source_addr().into(),
                ip.header().destination_addr().into(),
            ),
            _ => return Verdict::Pass,
        };
        let (key, syn) = match &sliced.transport {
            Some(TransportSlice::Tcp(tcp)) => {
                let key = Key {
                    tcp: true,
                    src: SocketAddr::new(src_ip, tcp.source_port()),
                    dst: SocketAddr::new(dst_ip, tcp.destination_port()),
                };
                let syn = (tcp.syn() && !tcp.ack() && !tcp.rst()).then_some(tcp.sequence_number());
                (key, syn)
            }
            Some(TransportSlice::Udp(udp)) => {
                let key = Key {
                    tcp: false,
                    src: SocketAddr::new(src_ip, udp.source_port()),
                    dst: SocketAddr::new(dst_ip, udp.destination_port()),
                };
                (key, None)
            }
            _ => return Verdict::Pass,
        };
        let Ok(mut flows) = self.flows.lock() else {
            return Verdict::Drop;
        };
        if let Some(flow) = flows.get(&key) {
            let Some(TransportSlice::Tcp(tcp)) = &sliced.transport else {
                return Verdict::Pass;
            };
            return match syn {
                Some(isn) if Some(isn) == flow.isn => Verdict::Pass,
                Some(_) => {
                    drop(flows);
                    self.refuse(key, tcp.sequence_number(), tcp.payload().len())
                }
                None if tcp.payload().is_empty() => Verdict::Pass,
                None => {
                    let Some(isn) = flow.isn else {
                        return Verdict::Pass;
                    };
                    // Where this segment's data ends, counted from the first byte of the
                    // connection (32-bit sequence space: wrapping differences).
                    let end = tcp
                        .sequence_number()
                        .wrapping_sub(isn.wrapping_add(1))
                        .wrapping_add(tcp.payload().len() as u32);
                    let read = flow.read.load(Ordering::Relaxed) as u32;
                    let ahead = end.wrapping_sub(read) as i32;
                    if ahead > UNREAD_MAX as i32 {
                        Verdict::Drop
                    } else {
                        Verdict::Pass
                    }
                }
            };
        }
        if key.tcp && syn.is_none() {
            // Not a new connection: the stack answers it (RST) without making a stream.
            return Verdict::Pass;
        }
        let cap = if key.tcp { self.tcp_cap } else { UDP_FLOWS };
        let held = |flows: &HashMap<Key, Flow>| flows.keys().filter(|k| k.tcp == key.tcp).count();
        if held(&flows) >= cap {
            let now = Instant::now();
            flows.retain(|_, f| f.accepted || now.duration_since(f.admitted) < UNACCEPTED);
        }
        if held(&flows) >= cap {
            drop(flows);
            return match (&sliced.transport, syn) {
                (Some(TransportSlice::Tcp(tcp)), Some(isn)) => {
                    self.refuse(key, isn, tcp.payload().len())
                }
                _ => Verdict::Drop,
            };
        }
        flows.insert(
            key,
            Flow {
                isn: syn,
                admitted: Instant::now(),
                accepted: false,
                read: Arc::new(AtomicU64::new(0)),
            },
        );
        Verdict::Pass
    }

    /// A RST for the SYN `isn` of `key` (carrying `len` bytes), logged.
    fn refuse(&self, key: Key, isn: u32, len: usize) -> Verdict {
        (self.on_refused)(key.dst);
        match rst_for(key, isn, len) {
            Some(rst) => Verdict::Reply(rst),
            None => Verdict::Drop,
        }
    }

    /// Wraps a stream the engine takes: counted as accepted, its reads counted, and dropped
    /// by the reaper, which then releases its flow.
    pub fn hold<T: Send + 'static>(self: &Arc<Self>, key: Key, stream: T) -> Held<T> {
        let read = match self.flows.lock() {
            Ok(mut flows) => {
                let flow = flows.entry(key).or_insert_with(|| Flow {
                    isn: None,
                    admitted: Instant::now(),
                    accepted: true,
                    read: Arc::new(AtomicU64::new(0)),
                });
                flow.accepted = true;
                flow.read.clone()
            }
            Err(_) => Arc::new(AtomicU64::new(0)),
        };
        Held {
            stream: Some(stream),
            key,
            read,
            admission: self.clone(),
        }
    }

    fn release(&self, key: &Key) {
        if let Ok(mut flows) = self.flows.lock() {
            flows.remove(key);
        }
    }

    /// TCP and UDP flows held now.
    #[cfg(test)]
    fn held(&self) -> (usize, usize) {
        let flows = self.flows.lock().unwrap();
        let tcp = flows.keys().filter(|k| k.tcp).count();
        (tcp, flows.len() - tcp)
    }
}

/// The RST|ACK that refuses a SYN: from its destination, acknowledging it.
fn rst_for(key: Key, isn: u32, len: usize) -> Option<Vec<u8>> {
    let (IpAddr::V4(src), IpAddr::V4(dst)) = (key.src.ip(), key.dst.ip()) else {
        return None;
    };
    let builder = PacketBuilder::ipv4(dst.octets(), src.octets(), 64)
        .tcp(key.dst.port(), key.src.port(), 0, 0)
        .rst()
        .ack(isn.wrapping_add(1).wrapping_add(len as u32));
    let mut out = Vec::with_capacity(builder.size(0));
    builder.write(&mut out, &[]).ok()?;
    Some(out)
}

/// A stream the engine holds: reads are counted (for [`UNREAD_MAX`]), and the stream is
/// dropped by the reaper, never where the holder is dropped.
pub struct Held<T: Send + 'static> {
    stream: Option<T>,
    key: Key,
    read: Arc<AtomicU64>,
    admission: Arc<Admission>,
}

impl<T: Send + 'static> Held<T> {
    pub fn stream(&mut self) -> &mut T {
        self.stream
            .as_mut()
            .expect("a held stream is present until dropped")
    }
}

impl<T: Send + 'static> Drop for Held<T> {
    fn drop(&mut self) {
        if let Some(stream) = self.stream.take() {
            let admission = self.admission.clone();
            let key = self.key;
            self.admission.reaper.reap(Box::new(move || {
                drop(stream);
                admission.release(&key);
            }));
        }
    }
}

impl<T: AsyncRead + Send + Unpin + 'static> AsyncRead for Held<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(self.stream()).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        self.read.fetch_add(n as u64, Ordering::Relaxed);
        polled
    }
}

impl<T: AsyncWrite + Send + Unpin + 'static> AsyncWrite for Held<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(self.stream()).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(self.stream()).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(self.stream()).poll_shutdown(cx)
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// The thread that drops streams (one per gateway, shared by its sandboxes).
#[derive(Clone)]
pub struct Reaper {
    jobs: mpsc::Sender<Job>,
    queued: Arc<AtomicUsize>,
}

impl Reaper {
    /// Starts the thread, in `runtime`'s context (ipstack's drop asks for the current
    /// runtime).
    pub fn start(runtime: tokio::runtime::Handle) -> std::io::Result<Reaper> {
        let (jobs, rx) = mpsc::channel::<Job>();
        let queued = Arc::new(AtomicUsize::new(0));
        let count = queued.clone();
        std::thread::Builder::new()
            .name("codecage-reaper".into())
            .spawn(move || {
                let _context = runtime.enter();
                for job in rx {
                    // A stream whose drop panics (a poisoned lock in the stack) must not
                    // stop the reaping of every other.
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                    count.fetch_sub(1, Ordering::Relaxed);
                }
            })?;
        Ok(Reaper { jobs, queued })
    }

    fn reap(&self, job: Job) {
        self.queued.fetch_add(1, Ordering::Relaxed);
        if let Err(mpsc::SendError(job)) = self.jobs.send(job) {
            // The thread is gone (it never returns while a sender lives): leak the stream
            // rather than wait for it here, on a runtime thread.
            self.queued.fetch_sub(1, Ordering::Relaxed);
            std::mem::forget(job);
        }
    }

    /// Streams waiting to be dropped.
    pub fn backlog(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    const SANDBOX: [u8; 4] = [198, 18, 0, 2];
    const GATEWAY: [u8; 4] = [198, 18, 0, 1];

    fn syn(port: u16, isn: u32) -> Vec<u8> {
        let b = PacketBuilder::ipv4(SANDBOX, GATEWAY, 64)
            .tcp(port, 53, isn, 65000)
            .syn();
        let mut out = Vec::new();
        b.write(&mut out, &[]).unwrap();
        out
    }

    fn data(port: u16, seq: u32, len: usize) -> Vec<u8> {
        let b = PacketBuilder::ipv4(SANDBOX, GATEWAY, 64)
            .tcp(port, 53, seq, 65000)
            .ack(1);
        let mut out = Vec::new();
        b.write(&mut out, &vec![0; len]).unwrap();
        out
    }

    fn key(port: u16) -> Key {
        Key {
            tcp: true,
            src: SocketAddr::new(Ipv4Addr::from(SANDBOX).into(), port),
            dst: SocketAddr::new(Ipv4Addr::from(GATEWAY).into(), 53),
        }
    }

    fn admission(max: u64) -> (Arc<Admission>, Arc<AtomicUsize>) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let refused = Arc::new(AtomicUsize::new(0));
        let r = refused.clone();
        let admission = Admission::new(
            max,
            Reaper::start(runtime.handle().clone()).unwrap(),
            Box::new(move |_| {
                r.fetch_add(1, Ordering::Relaxed);
            }),
        );
        std::mem::forget(runtime);
        (Arc::new(admission), refused)
    }

    #[test]
    fn syns_past_the_cap_get_a_rst_and_a_released_flow_makes_room() {
        let (a, refused) = admission(2);
        let cap = 2 + TCP_HEADROOM;
        for port in 0..cap as u16 {
            assert_eq!(a.inspect(&syn(1000 + port, 7)), Verdict::Pass);
        }
        // A retransmitted SYN of a held flow passes; a new one does not.
        assert_eq!(a.inspect(&syn(1000, 7)), Verdict::Pass);
        let Verdict::Reply(rst) = a.inspect(&syn(5000, 41)) else {
            panic!("no RST");
        };
        let sliced = SlicedPacket::from_ip(&rst).unwrap();
        let Some(TransportSlice::Tcp(tcp)) = sliced.transport else {
            panic!()
        };
        assert!(tcp.rst() && tcp.ack());
        assert_eq!(
            (
                tcp.source_port(),
                tcp.destination_port(),
                tcp.acknowledgment_number()
            ),
            (53, 5000, 42)
        );
        assert_eq!(refused.load(Ordering::Relaxed), 1);
        // Another SYN (another sequence number) on a held flow is a new connection: refused.
        assert!(matches!(a.inspect(&syn(1001, 99)), Verdict::Reply(_)));
        assert_eq!(a.held(), (cap, 0));
        // An IPv6 SYN (the link has none, but a stream would be made) counts the same.
        let v6 = PacketBuilder::ipv6([0xfd; 16], [0xfe; 16], 64)
            .tcp(1, 80, 5, 100)
            .syn();
        let mut packet = Vec::new();
        v6.write(&mut packet, &[]).unwrap();
        assert_eq!(a.inspect(&packet), Verdict::Drop);
        // The engine takes one and lets it go: the reaper drops it and frees its place.
        drop(a.hold(key(1000), ()));
        assert!((0..100).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            a.held().0 == cap - 1
        }));
        assert_eq!(a.inspect(&syn(5000, 41)), Verdict::Pass);
    }

    #[test]
    fn data_far_ahead_of_what_the_engine_read_is_dropped() {
        let (a, _) = admission(4);
        assert_eq!(a.inspect(&syn(1000, u32::MAX - 10)), Verdict::Pass);
        let held = a.hold(key(1000), ());
        // The sequence space wraps between the SYN and the data: still counted right.
        let first = (u32::MAX - 10).wrapping_add(1);
        assert_eq!(a.inspect(&data(1000, first, 1000)), Verdict::Pass);
        let far = first.wrapping_add(UNREAD_MAX);
        assert_eq!(a.inspect(&data(1000, far, 1000)), Verdict::Drop);
        held.read.fetch_add(100_000, Ordering::Relaxed);
        assert_eq!(a.inspect(&data(1000, far, 1000)), Verdict::Pass);
        // Garbage passes to the stack (which ignores it); a bare ACK of no flow too.
        assert_eq!(a.inspect(b"\x45\x00"), Verdict::Pass);
        assert_eq!(a.inspect(&data(2000, 1, 0)), Verdict::Pass);
        assert_eq!(a.held(), (1, 0));
    }
}
