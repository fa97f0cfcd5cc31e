//! The sandbox's tmpfs file systems filled before the init attaches them (what goes on each:
//! `crate::sandbox::skeleton`). The launcher writes through each detached mount's fd, as
//! host root in the host's namespaces, after "go": the raw child is executing the init
//! meanwhile, which waits for these file systems only once it has started. What the init
//! did itself before (about a hundred system calls on tmpfs, and reading the host's
//! cpuinfo) so leaves the start's critical path.
//!
//! The entries are made as the init made them: owned by the sandbox's root (its host id
//! here), with their modes whatever the caller's umask (a server run by systemd has 0077).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::RwLock;

use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{fchmod, fchmodat, mkdirat, mknodat, FchmodatFlags, Mode, SFlag};
use nix::unistd::{fchown, fchownat, symlinkat, Gid, Uid};

use crate::protocol::Tmpfs;
use crate::sandbox::skeleton::{self, Entry};
use crate::spec::SandboxSpec;

/// Held (shared) while a file on a sandbox's tmpfs is open for writing, and (exclusive) by
/// each clone of a sandbox (super::clone): a clone copies the fd table, and the copy of such
/// a file, held by the new child until its exec, counts as a writer of its mount, which the
/// init then cannot make read-only (EBUSY). A server clones one sandbox while it fills
/// another's file systems.
pub(super) static WRITING: RwLock<()> = RwLock::new(());

/// Writes what each of `tmpfs` (made in [`Tmpfs::plan`]'s order) holds, owned by `root`,
/// the sandbox root's host id.
pub(super) fn fill(spec: &SandboxSpec, tmpfs: &[OwnedFd], root: u32) -> Result<(), String> {
    for (which, fd) in Tmpfs::plan(spec).into_iter().zip(tmpfs) {
        for entry in skeleton::entries(which, spec)? {
            make(fd.as_fd(), &entry, root).map_err(|e| {
                format!(
                    "cannot write {} on the sandbox's tmpfs ({which:?}): {e}",
                    entry.path()
                )
            })?;
        }
    }
    Ok(())
}

fn make(dir: BorrowedFd<'_>, entry: &Entry, root: u32) -> nix::Result<()> {
    let (uid, gid) = (Some(Uid::from_raw(root)), Some(Gid::from_raw(root)));
    let file_mode = Mode::from_bits_truncate(0o644);
    // The mode again (the umask narrows mkdir's and mknod's: 022 makes /tmp's 1777 a
    // 1755; None for a symlink, which has none), then the sandbox root as owner.
    let settle = |path: &str, mode: Option<Mode>| {
        if let Some(mode) = mode {
            fchmodat(dir, path, mode, FchmodatFlags::FollowSymlink)?;
        }
        fchownat(dir, path, uid, gid, AtFlags::AT_SYMLINK_NOFOLLOW)
    };
    match entry {
        Entry::Dir(path, mode) => {
            let mode = Mode::from_bits_truncate(*mode);
            mkdirat(dir, path.as_str(), mode)?;
            settle(path, Some(mode))
        }
        Entry::File(path, content) if content.is_empty() => {
            // Made without opening it (a mount point, a mask): no fd, no writer.
            mknodat(dir, path.as_str(), SFlag::S_IFREG, file_mode, 0)?;
            settle(path, Some(file_mode))
        }
        Entry::File(path, content) => {
            let _writing = WRITING.read().unwrap_or_else(|e| e.into_inner());
            let flags = OFlag::O_WRONLY
                | OFlag::O_CREAT
                | OFlag::O_EXCL
                | OFlag::O_NOFOLLOW
                | OFlag::O_CLOEXEC;
            let file = std::fs::File::from(openat(dir, path.as_str(), flags, file_mode)?);
            std::io::Write::write_all(&mut &file, content)
                .map_err(|e| nix::Error::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))?;
            fchmod(file.as_fd(), file_mode)?;
            fchown(file.as_fd(), uid, gid)
        }
        Entry::Link(path, target) => {
            symlinkat(target, dir, path.as_str())?;
            settle(path, None)
        }
    }
}
