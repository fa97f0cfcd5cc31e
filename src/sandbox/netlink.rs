//! NETLINK_ROUTE sockets, made by the init, counted, and with a small fixed receive buffer.
//!
//! The payload may read its own interfaces and addresses over NETLINK_ROUTE (glibc's
//! getifaddrs and if_nameindex, Node's `os.networkInterfaces()`). But a netlink socket's
//! queue of replies is kernel memory that no cgroup is charged for: a process that sends
//! requests and never reads holds a receive buffer's worth per socket (208 KiB by default,
//! twice `net.core.rmem_max` after SO_RCVBUF), and with 1024 fds in each of 64 processes
//! that would be gigabytes of the host's memory. So the init bounds both factors:
//!
//! - **How many.** The seccomp program each payload installs turns `socket(AF_NETLINK,
//!   ...)` into a user notification (its netlink watch, src/sandbox/seccomp_program.rs),
//!   and the payload hands the program's listener to the init before it execs. The init answers each one itself: while fewer
//!   than [`MAX_SOCKETS`] of the sockets it made are alive, it creates the socket and puts
//!   it into the caller's fd table (SECCOMP_IOCTL_NOTIF_ADDFD, Linux 5.9); otherwise the
//!   call fails with ENOBUFS. A socket is alive while some process's fd table holds it or
//!   it is bound (listed in the namespace's /proc/net/netlink; a socket that ever sent a
//!   request is bound, so every socket that can hold replies is seen). The init answers one
//!   notification at a time, so the count is exact, except for unbound sockets parked in
//!   flight in a unix socket's queue, which hold no replies and of which a user may have at
//!   most RLIMIT_NOFILE in flight (the kernel's unix_inflight limit).
//! - **How much each.** A socket the init makes gets a receive buffer of
//!   [`RCVBUF`]; the same filter sends `setsockopt(SOL_SOCKET, SO_RCVBUF)` to the init,
//!   which applies it itself to the socket it fetches from the caller (pidfd_getfd, so the
//!   fd cannot be swapped under it), and leaves a netlink socket's buffer as it is,
//!   answering success as the kernel does when it clamps a size.
//!
//! So a sandbox's netlink queues hold at most (MAX_SOCKETS + nofile) sockets of about
//! 2 * RCVBUF plus one message each: a few megabytes for a program that tries, and tens to
//! a few hundred megabytes for one that parks sockets in flight on purpose, less than its
//! memory limit either way (tests/suite/kmem.rs pins both).
//!
//! A socket the init made carries the init's credentials, which hold CAP_NET_ADMIN in the
//! sandbox's network namespace. That grants the payload nothing: rtnetlink asks for the
//! capability of the socket's opener *and* of the process that sends the request
//! (netlink_ns_capable), and multicast groups and unicasts to other sockets check the
//! sender's capabilities; the payload has none.

use std::collections::BTreeSet;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

use nix::errno::Errno;
use nix::sys::socket::{
    recvmsg, sendmsg, setsockopt, socketpair, sockopt, AddressFamily, ControlMessage,
    ControlMessageOwned, MsgFlags, SockFlag, SockProtocol, SockType,
};

use crate::protocol::{SetupError, Step};

/// The most netlink sockets a sandbox holds at once. A program needs one, briefly
/// (getifaddrs opens one, dumps the links and addresses, and closes it).
pub const MAX_SOCKETS: usize = 16;
/// The receive buffer of a netlink socket the init makes, as given to SO_RCVBUF (the
/// kernel doubles it). A dump of the sandbox's interfaces needs a few KiB.
pub const RCVBUF: usize = 16 << 10;

/// The init's side: where payloads' listeners arrive, the listeners, and the sockets made.
pub struct Guard {
    /// The init's end of the socket pair payloads send their listener on.
    inbox: OwnedFd,
    /// The payloads' end (inherited across fork, closed at exec).
    outbox: OwnedFd,
    listeners: Vec<OwnedFd>,
    /// Inode numbers of the sockets made and perhaps still alive.
    made: BTreeSet<u64>,
}

impl Guard {
    pub fn new() -> Result<Guard, SetupError> {
        let (inbox, outbox) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(|e| {
            SetupError::errno(
                Step::PrepareNetlinkWatch,
                e,
                "socketpair for the netlink watch",
            )
        })?;
        Ok(Guard {
            inbox,
            outbox,
            listeners: Vec::new(),
            made: BTreeSet::new(),
        })
    }

    /// The end a payload sends its listener on.
    pub fn outbox(&self) -> BorrowedFd<'_> {
        self.outbox.as_fd()
    }

    /// The fds the init's loop polls for the guard: the inbox, then every listener.
    pub fn fds(&self) -> Vec<BorrowedFd<'_>> {
        std::iter::once(self.inbox.as_fd())
            .chain(self.listeners.iter().map(|l| l.as_fd()))
            .collect()
    }

    /// Handles what the poll found on [`Self::fds`] (their revents, in the same order).
    pub fn ready(&mut self, revents: &[nix::poll::PollFlags]) {
        use nix::poll::PollFlags;
        let gone = PollFlags::POLLHUP | PollFlags::POLLERR | PollFlags::POLLNVAL;
        let mut finished = Vec::new();
        for (i, events) in revents.iter().enumerate().skip(1) {
            if events.contains(PollFlags::POLLIN) {
                self.answer(i - 1);
            } else if events.intersects(gone) {
                // Every process of that payload's tree has exited.
                finished.push(i - 1);
            }
        }
        for i in finished.into_iter().rev() {
            self.listeners.remove(i);
        }
        if revents
            .first()
            .is_some_and(|e| e.contains(PollFlags::POLLIN))
        {
            self.receive_listener();
        }
    }

    fn receive_listener(&mut self) {
        let mut byte = [0u8; 1];
        let mut space = nix::cmsg_space!([RawFd; 1]);
        let mut iov = [io::IoSliceMut::new(&mut byte)];
        let Ok(msg) = recvmsg::<()>(
            self.inbox.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT,
        ) else {
            return;
        };
        let Ok(cmsgs) = msg.cmsgs() else { return };
        for cmsg in cmsgs {
            if let ControlMessageOwned::ScmRights(fds) = cmsg {
                self.listeners
                    .extend(fds.into_iter().map(crate::sys::adopt_fd));
            }
        }
    }

    /// Answers one notification of listener `i`.
    fn answer(&mut self, i: usize) {
        let (listeners, made) = (&self.listeners, &mut self.made);
        let listener = listeners[i].as_fd();
        // ENOENT: the caller is gone or was interrupted by a signal; nothing to answer.
        let Ok(notif) = crate::sys::seccomp_notif_recv(listener) else {
            return;
        };
        let result = match i64::from(notif.data.nr) {
            libc::SYS_socket => create(made, listener, &notif).map(i64::from),
            libc::SYS_setsockopt => set_rcvbuf(made, listener, &notif),
            _ => Err(Errno::ENOSYS),
        };
        let (val, errno) = match result {
            Ok(val) => (val, 0),
            Err(e) => (0, e as i32),
        };
        // ENOENT again: the caller went away meanwhile; an fd it got is closed with it.
        let _ = crate::sys::seccomp_notif_send(listener, notif.id, val, errno);
    }
}

/// Creates the socket that `notif` asks for, if the sandbox may have another, and puts it
/// into the caller's fd table. Returns its number there.
fn create(
    made: &mut BTreeSet<u64>,
    listener: BorrowedFd<'_>,
    notif: &libc::seccomp_notif,
) -> Result<RawFd, Errno> {
    let args = notif.data.args;
    let (family, kind, protocol) = (args[0] as i32, args[1] as i32, args[2] as i32);
    // The program only sends socket(AF_NETLINK, ...), and its deny list has refused every
    // protocol but NETLINK_ROUTE; anything else is not ours to make.
    if family != libc::AF_NETLINK || protocol != libc::NETLINK_ROUTE {
        return Err(Errno::EPERM);
    }
    let sock_type = match kind & 0xf {
        libc::SOCK_RAW => SockType::Raw,
        libc::SOCK_DGRAM => SockType::Datagram,
        _ => return Err(Errno::ESOCKTNOSUPPORT),
    };
    if kind & !(0xf | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK) != 0 {
        return Err(Errno::EINVAL);
    }
    if alive(made) >= MAX_SOCKETS {
        return Err(Errno::ENOBUFS);
    }
    let mut flags = SockFlag::SOCK_CLOEXEC;
    if kind & libc::SOCK_NONBLOCK != 0 {
        flags |= SockFlag::SOCK_NONBLOCK;
    }
    let socket = nix::sys::socket::socket(
        AddressFamily::Netlink,
        sock_type,
        flags,
        SockProtocol::NetlinkRoute,
    )?;
    setsockopt(&socket, sockopt::RcvBuf, &RCVBUF)?;
    let inode = inode_of(socket.as_fd())?;
    let cloexec = kind & libc::SOCK_CLOEXEC != 0;
    let fd = crate::sys::seccomp_notif_addfd(listener, notif.id, socket.as_fd(), cloexec)
        .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EBADF)))?;
    made.insert(inode);
    Ok(fd)
}

/// `setsockopt(fd, SOL_SOCKET, SO_RCVBUF, value, len)` of the caller, applied by the init
/// to the very socket the caller's fd names now; a netlink socket the init made keeps its
/// buffer.
fn set_rcvbuf(
    made: &BTreeSet<u64>,
    listener: BorrowedFd<'_>,
    notif: &libc::seccomp_notif,
) -> Result<i64, Errno> {
    let args = notif.data.args;
    let (fd, value_at, len) = (args[0] as i32, args[3], args[4] as u32);
    let pidfd = crate::sys::pidfd_open(notif.pid).map_err(io_errno)?;
    // The pid was read from the notification: it is still the caller's only if the
    // notification is still pending.
    if !crate::sys::seccomp_notif_id_valid(listener, notif.id) {
        return Err(Errno::ENOENT);
    }
    let socket = crate::sys::pidfd_getfd(pidfd.as_fd(), fd).map_err(io_errno)?;
    if len < 4 {
        return Err(Errno::EINVAL);
    }
    let mut value = [0u8; 4];
    let read = nix::sys::uio::process_vm_readv(
        nix::unistd::Pid::from_raw(notif.pid as i32),
        &mut [io::IoSliceMut::new(&mut value)],
        &[nix::sys::uio::RemoteIoVec {
            base: value_at as usize,
            len: 4,
        }],
    )
    .map_err(|_| Errno::EFAULT)?;
    if read != 4 {
        return Err(Errno::EFAULT);
    }
    if made.contains(&inode_of(socket.as_fd())?) {
        return Ok(0);
    }
    // The kernel reads an int and treats it as unsigned before it clamps it.
    let value = i32::from_ne_bytes(value) as u32 as usize;
    setsockopt(&socket, sockopt::RcvBuf, &value).map(|()| 0)
}

/// How many of the sockets made are alive: held in some process's fd table, or bound
/// (listed in the sandbox namespace's /proc/net/netlink; an unbound socket is not). Sockets
/// gone are forgotten.
fn alive(made: &mut BTreeSet<u64>) -> usize {
    // Every socket alive is among those made: below the bound, no need to look.
    if made.len() < MAX_SOCKETS {
        return made.len();
    }
    let mut seen: BTreeSet<u64> = BTreeSet::new();
    match std::fs::read_to_string("/proc/net/netlink") {
        Ok(table) => seen.extend(
            table
                .lines()
                .skip(1)
                .filter_map(|line| line.split_whitespace().nth(9)?.parse::<u64>().ok()),
        ),
        // Unreadable: count every socket ever made, which errs on the safe side.
        Err(_) => return made.len(),
    }
    let Ok(processes) = std::fs::read_dir("/proc") else {
        return made.len();
    };
    for process in processes.flatten() {
        let name = process.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let Ok(link) = std::fs::read_link(fd.path()) else {
                continue;
            };
            let inode = link
                .to_str()
                .and_then(|l| l.strip_prefix("socket:["))
                .and_then(|l| l.strip_suffix(']'))
                .and_then(|n| n.parse::<u64>().ok());
            seen.extend(inode);
        }
    }
    made.retain(|inode| seen.contains(inode));
    made.len()
}

fn inode_of(fd: BorrowedFd<'_>) -> Result<u64, Errno> {
    nix::sys::stat::fstat(fd).map(|st| st.st_ino)
}

fn io_errno(e: io::Error) -> Errno {
    Errno::from_raw(e.raw_os_error().unwrap_or(libc::EPERM))
}

/// The payload's side: sends its listener to the init.
pub fn send_listener(outbox: BorrowedFd<'_>, listener: &OwnedFd) -> io::Result<()> {
    let fds = [listener.as_raw_fd()];
    let iov = [io::IoSlice::new(b"L")];
    sendmsg::<()>(
        outbox.as_raw_fd(),
        &iov,
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map(drop)
    .map_err(io::Error::from)
}
