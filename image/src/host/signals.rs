//! SIGINT, SIGTERM and SIGHUP turned into a flag that the wait loops poll, so that a task
//! can stop its tools (QEMU, mmdebstrap) and clean up before it exits.

use std::sync::atomic::{AtomicI32, Ordering};

use anyhow::{bail, Result};

/// The signal (SIGINT, SIGTERM, SIGHUP) that asked us to stop, 0 if none.
static INTERRUPT: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    INTERRUPT.store(sig, Ordering::SeqCst);
}

/// Turn SIGINT/SIGTERM/SIGHUP into a flag that the wait loops poll, until
/// the returned guard is dropped: then the previous handlers are back (a task that
/// runs another, as `test` runs `rootfs`, gets its own back), and a signal that came
/// in meanwhile is raised again for a previous handler that is a function.
pub fn install_signal_handlers() -> SignalGuard {
    let mut previous = Vec::new();
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: a zeroed sigaction is a valid starting value; the handler
        // only performs an atomic store, which is async-signal-safe; `old`
        // is written by the kernel.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut action.sa_mask);
            action.sa_flags = libc::SA_RESTART;
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, &action, &mut old) == 0 {
                previous.push((sig, old));
            }
        }
    }
    SignalGuard { previous }
}

pub struct SignalGuard {
    previous: Vec<(libc::c_int, libc::sigaction)>,
}

impl Drop for SignalGuard {
    fn drop(&mut self) {
        for (sig, old) in &self.previous {
            // SAFETY: restores a sigaction the kernel gave us.
            unsafe {
                libc::sigaction(*sig, old, std::ptr::null_mut());
            }
        }
        if let Some(sig) = interrupted() {
            let custom = self.previous.iter().any(|(s, old)| {
                *s == sig && old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN
            });
            if custom {
                // SAFETY: plain syscall; the handler is the caller's own.
                unsafe {
                    libc::raise(sig);
                }
            }
        }
    }
}

/// The signal that interrupted us, if any.
pub fn interrupted() -> Option<i32> {
    match INTERRUPT.load(Ordering::SeqCst) {
        0 => None,
        sig => Some(sig),
    }
}

/// Fail if a signal asked us to stop.
pub fn check_interrupted() -> Result<()> {
    match interrupted() {
        Some(sig) => bail!("interrupted by signal {sig}"),
        None => Ok(()),
    }
}
