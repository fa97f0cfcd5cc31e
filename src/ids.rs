//! Host id slots: two live sandboxes never share a host uid, across every codecage process
//! on the host (the CLI beside the server beside its pool). A slot is an open file
//! description's write lock (`F_OFD_SETLK`) on one byte of [`SLOTS_FILE`]: the kernel drops
//! it when its holder closes the file or dies, so a crashed launcher frees its slots
//! without any cleanup, and no stale state can block a slot. Each sandbox holds its own
//! open file description for its whole life, so locks of one process conflict with each
//! other too.
//!
//! A sandbox's processes die with its launcher (the parent-death signal of the init), so a
//! slot freed by a launcher's death cannot meet a live sandbox that still uses its ids.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::spec::IdMapping;

/// The directory of codecage's run-time state.
pub const RUN_DIR: &str = "/run/codecage";
/// The file whose bytes are the slots.
pub const SLOTS_FILE: &str = "/run/codecage/id-slots";

/// A slot this process holds; dropping it frees the slot.
#[derive(Debug)]
pub struct Slot {
    number: u32,
    _lock: File,
}

impl Slot {
    pub fn number(&self) -> u32 {
        self.number
    }

    /// Takes a free slot: from a per-process cursor (so consecutive sandboxes spread
    /// out), the first byte no other open file description holds.
    pub fn take() -> Result<Slot, String> {
        static CURSOR: AtomicU32 = AtomicU32::new(u32::MAX);
        let slots = IdMapping::SLOTS;
        // Start each process somewhere else in the range: launchers in parallel then
        // rarely probe the same bytes.
        let _ = CURSOR.compare_exchange(
            u32::MAX,
            (std::process::id().wrapping_mul(2_654_435_761)) % slots,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        let file = open_slots_file()?;
        for _ in 0..slots {
            let number = CURSOR.fetch_add(1, Ordering::Relaxed) % slots;
            match lock_byte(&file, number) {
                Ok(true) => {
                    return Ok(Slot {
                        number,
                        _lock: file,
                    })
                }
                Ok(false) => continue,
                Err(e) => return Err(format!("cannot lock a host id slot in {SLOTS_FILE}: {e}")),
            }
        }
        Err(format!(
            "all {slots} host id slots are taken: {slots} sandboxes are live on this host"
        ))
    }
}

fn open_slots_file() -> Result<File, String> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(RUN_DIR)
        .map_err(|e| format!("cannot create {RUN_DIR} (codecage must run as root): {e}"))?;
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC)
        .open(SLOTS_FILE)
        .map_err(|e| format!("cannot open {SLOTS_FILE} (codecage must run as root): {e}"))
}

/// Tries to write-lock byte `number` of `file` for this open file description. Ok(false):
/// another holds it.
fn lock_byte(file: &File, number: u32) -> std::io::Result<bool> {
    let lock = libc::flock {
        l_type: libc::F_WRLCK as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: libc::off_t::from(number),
        l_len: 1,
        l_pid: 0,
    };
    match nix::fcntl::fcntl(file, nix::fcntl::FcntlArg::F_OFD_SETLK(&lock)) {
        Ok(_) => Ok(true),
        Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EACCES) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_slots_are_distinct_and_freed_on_drop() {
        if !nix::unistd::geteuid().is_root() {
            return skip();
        }
        let held: Vec<Slot> = (0..64).map(|_| Slot::take().unwrap()).collect();
        let mut numbers: Vec<u32> = held.iter().map(Slot::number).collect();
        numbers.sort();
        numbers.dedup();
        assert_eq!(numbers.len(), 64);
        let first = held[0].number();
        drop(held);
        // The byte is free again: an open file description of ours can lock it.
        let file = open_slots_file().unwrap();
        assert!(lock_byte(&file, first).unwrap());
    }

    /// Any other open file description, in this process or another, finds a held slot
    /// locked.
    #[test]
    fn a_held_slot_is_locked_for_every_other_holder() {
        if !nix::unistd::geteuid().is_root() {
            return skip();
        }
        let slot = Slot::take().unwrap();
        let file = open_slots_file().unwrap();
        assert!(!lock_byte(&file, slot.number()).unwrap());
    }

    fn skip() {
        if std::env::var_os("CODECAGE_ALLOW_SKIP").is_some_and(|v| v == "1") {
            eprintln!("SKIPPED: needs root (CODECAGE_ALLOW_SKIP=1)");
        } else {
            panic!("this test needs root: it locks slots under /run/codecage");
        }
    }
}
