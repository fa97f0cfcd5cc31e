//! Volumes: host directories under /work, read-only or copied.
//!
//! The launcher clones each volume's mount tree in the host's mount namespace (the
//! sandbox's root maps to an unprivileged host uid and could not reach most host paths by
//! itself), makes every mount of it read-only, nosuid, nodev and private, and sends the
//! detached tree to the init with the spec. The init then, on /work's tmpfs, before
//! pivot_root:
//!
//! - `:ro`: attaches the tree at the target (move_mount), makes it private, and remounts
//!   every mount of it read-only, nosuid and nodev (the launcher made them so already with
//!   mount_setattr where the kernel has it, 5.12; before that this is what holds). The
//!   payload cannot mount, so nothing in the sandbox makes them writable again.
//! - `:copy`: copies the tree into the target, walking it with openat and O_NOFOLLOW from
//!   the tree's own fd, so no symlink is ever followed on the host's side: a symlink is
//!   copied as a link, which resolves inside the sandbox. Regular files keep their
//!   permission bits (less setuid and setgid) and modification times; everything becomes
//!   the sandbox user's. Fifos, sockets and device nodes are left out. The copy fills
//!   /work's tmpfs, whose size is the cap: a tree larger than `work_size` is refused with
//!   ENOSPC and a message that names the volume.
//!
//! Inside the sandbox the host's files belong to ids the sandbox does not map (they show
//! as nobody), so what the init copies and what the payload reads is what the host lets
//! any user read.

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{symlink, DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::dir::Dir;
use nix::fcntl::{openat, readlinkat, AtFlags, OFlag};
use nix::sys::stat::{fstatat, FileStat, Mode};
use nix::sys::time::TimeSpec;

use crate::protocol::{SetupError, Step};
use crate::spec::{Volume, VolumeMode, SANDBOX_UID};

/// Attaches or copies every volume, the targets being under `work` (the new root's /work).
pub fn apply(
    volumes: &[Volume],
    trees: Vec<OwnedFd>,
    work: &Path,
    work_size: u64,
) -> Result<(), SetupError> {
    for (volume, tree) in volumes.iter().zip(trees) {
        let rel = volume.target.strip_prefix("/work").unwrap_or(Path::new(""));
        let target = work.join(rel);
        let step = match volume.mode {
            VolumeMode::ReadOnly => Step::MountVolumes,
            VolumeMode::Copy => Step::CopyVolumes,
        };
        make_dirs(work, rel).map_err(|e| {
            SetupError::io(step, &e, format!("creating {}", volume.target.display()))
        })?;
        match volume.mode {
            VolumeMode::ReadOnly => attach_readonly(tree, &target).map_err(|e| {
                SetupError::io(
                    step,
                    &e,
                    format!("attaching the volume {} read-only", volume.target.display()),
                )
            })?,
            VolumeMode::Copy => copy_dir(tree.as_fd(), &target, Path::new("")).map_err(|e| {
                let (errno, path, err) = (e.error.raw_os_error(), e.path, e.error);
                let shown = volume.target.join(&path);
                let context = if errno == Some(libc::ENOSPC) {
                    format!(
                        "copying the volume {} into {}: it does not fit in /work ({}; files count \
                         too, one inode per 4 KiB): copy less, or use a profile with a larger \
                         work_size (the ci profile has 2G)",
                        volume.source.display(),
                        volume.target.display(),
                        crate::units::format_size(work_size)
                    )
                } else if errno == Some(libc::EACCES) {
                    format!(
                        "copying {}: the sandbox reads a volume as an unprivileged user, so its \
                         files must be readable by any user (and its directories searchable)",
                        shown.display()
                    )
                } else {
                    format!("copying {}", shown.display())
                };
                SetupError::io(step, &err, context)
            })?,
        }
    }
    Ok(())
}

/// Attaches a volume's tree at `target`, then makes it private and every mount of it
/// read-only, nosuid and nodev from here too: the launcher did so already where the kernel
/// has mount_setattr (5.12), and this holds on older kernels.
fn attach_readonly(tree: OwnedFd, target: &Path) -> io::Result<()> {
    use nix::mount::{mount, MsFlags};
    crate::sys::move_mount_here(tree.as_fd(), target)?;
    mount(
        None::<&str>,
        target,
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )?;
    for mount_point in mounts_at_or_under(target)? {
        super::mount::remount_readonly(&mount_point)?;
    }
    Ok(())
}

/// The mount points at `dir` or below it, from /proc/self/mountinfo (parents first).
fn mounts_at_or_under(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let table = fs::read_to_string("/proc/self/mountinfo")?;
    let mut points: Vec<PathBuf> = table
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|field| PathBuf::from(unescape_mountinfo(field)))
        .filter(|point| point.starts_with(dir))
        .collect();
    points.sort_by_key(|p| p.components().count());
    points.dedup();
    Ok(points)
}

/// mountinfo writes space, tab, newline and backslash in a path as `\ooo` (octal).
fn unescape_mountinfo(field: &str) -> std::ffi::OsString {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    std::ffi::OsString::from_vec(out)
}

/// Creates the directories of `rel` under `work` that do not exist yet, for the sandbox
/// user (so the payload may write beside a read-only volume).
fn make_dirs(work: &Path, rel: &Path) -> io::Result<()> {
    let mut dir = work.to_path_buf();
    for part in rel.components() {
        dir.push(part);
        match fs::DirBuilder::new().mode(0o755).create(&dir) {
            Ok(()) => std::os::unix::fs::lchown(&dir, Some(SANDBOX_UID), Some(SANDBOX_UID))?,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// A copy that failed: the path under the volume, and why.
struct CopyError {
    path: PathBuf,
    error: io::Error,
}

fn at(path: &Path) -> impl Fn(io::Error) -> CopyError + '_ {
    move |error| CopyError {
        path: path.to_path_buf(),
        error,
    }
}

fn nix_at(path: &Path) -> impl Fn(nix::errno::Errno) -> CopyError + '_ {
    move |errno| CopyError {
        path: path.to_path_buf(),
        error: errno.into(),
    }
}

/// Copies the directory `src` (an fd) into `dst`, which exists; `rel` is where it is in the
/// volume, for messages.
fn copy_dir(src: BorrowedFd<'_>, dst: &Path, rel: &Path) -> Result<(), CopyError> {
    let mut dir = Dir::openat(
        src,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(nix_at(rel))?;
    let mut names = Vec::new();
    for entry in dir.iter() {
        let entry = entry.map_err(nix_at(rel))?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(OsStr::from_bytes(name).to_os_string());
        }
    }
    for name in names {
        let path = rel.join(&name);
        let target = dst.join(&name);
        let st =
            fstatat(src, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW).map_err(nix_at(&path))?;
        match st.st_mode & libc::S_IFMT {
            libc::S_IFDIR => {
                let child = openat(
                    src,
                    name.as_os_str(),
                    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                    Mode::empty(),
                )
                .map_err(nix_at(&path))?;
                fs::DirBuilder::new()
                    .mode(0o700)
                    .create(&target)
                    .map_err(at(&path))?;
                copy_dir(child.as_fd(), &target, &path)?;
                finish(&target, &st).map_err(at(&path))?;
            }
            libc::S_IFREG => {
                let from = openat(
                    src,
                    name.as_os_str(),
                    OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                    Mode::empty(),
                )
                .map_err(nix_at(&path))?;
                let mut from = fs::File::from(from);
                let mut to = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(&target)
                    .map_err(at(&path))?;
                io::copy(&mut from, &mut to).map_err(at(&path))?;
                drop(to);
                finish(&target, &st).map_err(at(&path))?;
            }
            libc::S_IFLNK => {
                let link = readlinkat(src, name.as_os_str()).map_err(nix_at(&path))?;
                symlink(&link, &target).map_err(at(&path))?;
                std::os::unix::fs::lchown(&target, Some(SANDBOX_UID), Some(SANDBOX_UID))
                    .map_err(at(&path))?;
            }
            // Fifos, sockets, devices: host objects, not files to copy.
            _ => {}
        }
    }
    Ok(())
}

/// The sandbox user's, with the source's permission bits (less setuid and setgid) and
/// modification time.
fn finish(path: &Path, st: &FileStat) -> io::Result<()> {
    std::os::unix::fs::lchown(path, Some(SANDBOX_UID), Some(SANDBOX_UID))?;
    fs::set_permissions(path, fs::Permissions::from_mode(st.st_mode & 0o1777))?;
    let atime = TimeSpec::new(st.st_atime, st.st_atime_nsec);
    let mtime = TimeSpec::new(st.st_mtime, st.st_mtime_nsec);
    nix::sys::stat::utimensat(
        nix::fcntl::AT_FDCWD,
        path,
        &atime,
        &mtime,
        nix::sys::stat::UtimensatFlags::NoFollowSymlink,
    )
    .map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(
            unescape_mountinfo(r"/tmp/a\040b\011c\134d"),
            std::ffi::OsString::from("/tmp/a b\tc\\d")
        );
        assert_eq!(
            unescape_mountinfo(r"/x\04"),
            std::ffi::OsString::from(r"/x\04")
        );
    }
}
