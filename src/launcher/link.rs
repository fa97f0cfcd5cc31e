//! The sandbox's link to its gateway: a tun device in the sandbox's network namespace
//! whose queue only the launcher holds.
//!
//! The launcher, not the init, creates it: /dev/net/tun is root's (mode 0600) and the
//! sandbox's root maps to an unprivileged host uid, which may not open it; and a tun
//! queue's network namespace is fixed when /dev/net/tun is opened, so the open must happen
//! inside the sandbox's namespace. A short-lived thread enters that namespace (setns on the
//! init's pidfd affects only itself), opens the device and names it `tun0`, and exits; the
//! init then gives it its address and route. The payload never holds the queue: if the
//! launcher stops reading it, the sandbox has no network (fail closed).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use nix::fcntl::OFlag;
use nix::sched::CloneFlags;

use crate::network::TUN_NAME;

/// Creates `tun0` in the network namespace of the process behind `pidfd` and returns its
/// queue (non-blocking, close-on-exec).
pub(crate) fn create_tun(pidfd: BorrowedFd<'_>) -> Result<OwnedFd, String> {
    let ns = pidfd
        .try_clone_to_owned()
        .map_err(|e| format!("cannot duplicate the sandbox's pidfd: {e}"))?;
    let thread = std::thread::Builder::new()
        .name("codecage-tun".into())
        .spawn(move || -> Result<OwnedFd, String> {
            nix::sched::setns(&ns, CloneFlags::CLONE_NEWNET).map_err(|e| {
                format!("cannot enter the sandbox's network namespace to create its link (setns): {e}")
            })?;
            let fd = nix::fcntl::open(
                "/dev/net/tun",
                OFlag::O_RDWR | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
                nix::sys::stat::Mode::empty(),
            )
            .map_err(|e| {
                format!(
                    "cannot open /dev/net/tun for the sandbox's network link: {e} (the restricted network needs \
                     the tun driver: `modprobe tun`)"
                )
            })?;
            crate::sys::tun_set_iff(fd.as_fd(), TUN_NAME)
                .map_err(|e| format!("cannot create {TUN_NAME} in the sandbox (TUNSETIFF): {e}"))?;
            Ok(fd)
        })
        .map_err(|e| format!("cannot start a thread to create the sandbox's link: {e}"))?;
    thread
        .join()
        .map_err(|_| "the thread creating the sandbox's link panicked".to_string())?
}
