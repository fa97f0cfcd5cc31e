//! The sandbox's filesystem: a new root assembled from tmpfs and read-only binds, a fresh
//! /proc, a minimal /dev, then `pivot_root` and the old root detached.
//!
//! The new root is assembled on `/tmp` *of this mount namespace only*: the host's /tmp is
//! neither touched nor needed, and no host directory is ever created, so nothing can be left
//! behind (bubblewrap uses the same trick). Every source path is resolved before that mount
//! covers /tmp, or lies outside it.

use std::fs;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sys::statvfs::{statvfs, FsFlags};
use nix::unistd::{chdir, pivot_root};

use super::procfs;
use super::rootfs::{HOST_ETC, HOST_TOP};
use super::skeleton::{DEV_NODES, RESOLV_CONF};
use crate::protocol::{SetupError, Step, Tmpfs};
use crate::spec::{Rootfs, SandboxSpec};

/// The sandbox's tmpfs file systems as the launcher made and sent them (see [`Tmpfs`]).
pub type TmpfsFds = std::collections::BTreeMap<Tmpfs, std::os::fd::OwnedFd>;

/// Attaches the launcher's tmpfs `which` at `target`.
pub(super) fn attach(fds: &mut TmpfsFds, which: Tmpfs, target: &Path) -> std::io::Result<()> {
    let fd = fds.remove(&which).ok_or_else(|| {
        std::io::Error::other(format!("the launcher sent no tmpfs for {which:?}"))
    })?;
    crate::sys::move_mount_here(std::os::fd::AsFd::as_fd(&fd), target)
}

/// Where the new root is assembled before pivot_root.
const NEW_ROOT: &str = "/tmp";

/// The most ptys a sandbox may hold at once. Every devpts instance but the host's initial
/// one draws on one pool of `kernel.pty.max - kernel.pty.reserve` ptys (3072 by default),
/// and a pty's buffers are kernel memory no cgroup is charged for: one sandbox must not
/// take them all.
pub const MAX_PTYS: u32 = 32;
/// /proc entries made read-only: kernel knobs that even a namespaced root must not turn.
const PROC_READONLY: &[&str] = &["sys", "sysrq-trigger", "irq", "bus"];

type Done = Result<(), SetupError>;

fn at(rel: &str) -> PathBuf {
    Path::new(NEW_ROOT).join(rel)
}

/// Builds the new root and enters it.
pub fn build_root(
    spec: &SandboxSpec,
    mut tmpfs: TmpfsFds,
    volumes: Vec<std::os::fd::OwnedFd>,
) -> Done {
    // Our mounts must never propagate to the host's table: with a shared / (systemd's
    // default) they would, even from a new mount namespace.
    stop_mount_propagation()?;
    // Opened before the stage covers NEW_ROOT: the image may lie under the host's /tmp.
    let image = match &spec.rootfs {
        Rootfs::Host => None,
        Rootfs::Dir(dir) => Some(open_image(dir)?),
    };
    // The launcher wrote everything bound from the stage (see super::skeleton); it is made
    // read-only once.
    let mut stage = Stage::attach(&mut tmpfs)?;
    let resolver = matches!(spec.rootfs, Rootfs::Dir(_)) && spec.network.mode.has_gateway();
    if matches!(spec.rootfs, Rootfs::Host) {
        stage.bind_host_etc()?;
    }
    stage.seal()?;
    match (&spec.rootfs, image) {
        (Rootfs::Dir(dir), Some(image)) => {
            mount_image_root(dir, image, &mut tmpfs)?;
            stage.enter()?;
            check_mount_points(dir)?;
        }
        _ => {
            // Its mount points, symlinks, /etc files and the mount points of /tmp, /work,
            // /dev, /proc and /sys are the launcher's (super::skeleton).
            mount_root_tmpfs(&mut tmpfs)?;
            bind_host_dirs()?;
            bind_host_etc_entries(&stage)?;
        }
    }
    mount_tmp(&mut tmpfs)?;
    mount_work(&mut tmpfs)?;
    // On /work's tmpfs, before the payload exists: read-only trees attached, copies made.
    super::volumes::apply(&spec.volumes, volumes, &at("work"), spec.work_size)?;
    mount_dev(&mut tmpfs)?;
    procfs::mount_sys(&at("sys"), stage.path())?;
    if spec.drivers {
        mount_drivers(stage.path())?;
    }
    // Mounted while the host's /proc is still visible in this namespace: the kernel refuses
    // a new procfs in a user namespace unless a fully visible one is already mounted there
    // ("mount too revealing"), which is why bubblewrap keeps its old root until then.
    mount_proc()?;
    protect_proc()?;
    procfs::mask_host_entries(&at("proc"), stage.path())?;
    procfs::bind_sandbox_files(&at("proc"), stage.path())?;
    if resolver {
        point_resolver_at_gateway(stage.path())?;
    }
    // The stage's last use: it leaves the table with the old root (enter_new_root).
    stage.leave()?;
    if let Some(exec) = &spec.exec {
        restrict_exec_mounts(exec)?;
    }
    seal_dev()?;
    remount_root_readonly()?;
    enter_new_root()
}

/// The staging tmpfs (see [`Tmpfs::Stage`]): attached at NEW_ROOT before the root is, so
/// that the root covers it. No path of the new root leads to it, and the payload never sees
/// it; the init reaches it as its working directory, entered before the root covered it
/// (relative paths: a path through `/proc/self/fd/N` cost each bind ~15 us of lookups in
/// procfs), and by an fd to come back to after mount_image_root's chdir. It is made
/// read-only once its files are written, so every bind of them is read-only from the start
/// (a bind copies its source mount's flags), and it needs no unmount: it hangs under the old
/// root's mount tree, and goes with it when enter_new_root detaches that. (An unmount waits
/// for an RCU grace period: 80 us, to milliseconds on a loaded host.)
pub struct Stage {
    /// Its root directory, opened before the root covered it; closed by [`Stage::leave`].
    dir: std::os::fd::OwnedFd,
    /// The read-only bind of the host's /etc on it, if [`Stage::bind_host_etc`] made one.
    etc: Option<PathBuf>,
}

impl Stage {
    fn attach(tmpfs: &mut TmpfsFds) -> Result<Stage, SetupError> {
        attach(tmpfs, Tmpfs::Stage, Path::new(NEW_ROOT)).map_err(|e| {
            SetupError::io(
                Step::AttachStage,
                &e,
                format!("mounting the staging tmpfs on {NEW_ROOT}"),
            )
        })?;
        let dir = nix::fcntl::open(
            NEW_ROOT,
            nix::fcntl::OFlag::O_RDONLY
                | nix::fcntl::OFlag::O_DIRECTORY
                | nix::fcntl::OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .map_err(|e| SetupError::errno(Step::AttachStage, e, "opening the staging tmpfs"))?;
        let stage = Stage { dir, etc: None };
        stage.enter()?;
        Ok(stage)
    }

    /// Makes the stage the working directory again ([`Stage::path`] is relative to it).
    fn enter(&self) -> Done {
        nix::unistd::fchdir(&self.dir)
            .map_err(|e| SetupError::errno(Step::AttachStage, e, "entering the staging tmpfs"))
    }

    /// Leaves it for good (the working directory back at /, the fd closed).
    fn leave(self) -> Done {
        chdir("/").map_err(|e| SetupError::errno(Step::AttachStage, e, "chdir /"))
    }

    /// Its root: the working directory while the init builds the root.
    pub fn path(&self) -> &Path {
        Path::new(".")
    }

    /// The host's /etc bound (with its submounts) on the stage, every mount of it made
    /// read-only, nosuid and nodev at once (mount_setattr, Linux 5.12): the source of the
    /// host rootfs's /etc entries ([`Stage::etc`]). Before 5.12 (ENOSYS) there is none; the
    /// entries are then each bound from the host's /etc and remounted read-only.
    fn bind_host_etc(&mut self) -> Done {
        // Its mount point is the launcher's (super::skeleton).
        let dir = self.path().join("etc");
        let fail = |e: std::io::Error, what: &str| SetupError::io(Step::WriteEtc, &e, what);
        let flags = MsFlags::MS_BIND | MsFlags::MS_REC;
        mount(Some("/etc"), &dir, None::<&str>, flags, None::<&str>)
            .map_err(|e| SetupError::errno(Step::WriteEtc, e, "binding /etc on the stage"))?;
        let readonly = crate::sys::MOUNT_ATTR_RDONLY
            | crate::sys::MOUNT_ATTR_NOSUID
            | crate::sys::MOUNT_ATTR_NODEV;
        match crate::sys::set_mount_attrs_recursive(&dir, readonly) {
            Ok(()) => self.etc = Some(dir),
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {}
            Err(e) => return Err(fail(e, "making the stage's bind of /etc read-only")),
        }
        Ok(())
    }

    /// The read-only host /etc on the stage, if there is one.
    fn etc(&self) -> Option<&Path> {
        self.etc.as_deref()
    }

    /// Makes it read-only, once everything bound from it is written.
    fn seal(&self) -> Done {
        seal_written(self.path()).map_err(|e| {
            SetupError::errno(Step::AttachStage, e, "making the staging tmpfs read-only")
        })
    }
}

/// An image's /etc is its own: its resolv.conf is covered by one naming the gateway's DNS,
/// which the launcher wrote on the stage (super::skeleton), bound read-only here.
fn point_resolver_at_gateway(stage: &Path) -> Done {
    let target = at("etc/resolv.conf");
    if !target.is_file() {
        return Err(SetupError::refused(
            Step::PointResolverAtGateway,
            "the image has no /etc/resolv.conf file to cover with the gateway's; rebuild it with `cargo xtask \
             rootfs` (which creates one), or use the host rootfs",
        ));
    }
    bind_copy(&stage.join(RESOLV_CONF), &target).map_err(|e| {
        SetupError::errno(
            Step::PointResolverAtGateway,
            e,
            "binding resolv.conf over the image's",
        )
    })
}

fn stop_mount_propagation() -> Done {
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_SLAVE,
        None::<&str>,
    )
    .map_err(|e| {
        SetupError::errno(
            Step::StopMountPropagation,
            e,
            "making / a recursive slave mount",
        )
    })
}

fn mount_root_tmpfs(tmpfs: &mut TmpfsFds) -> Done {
    attach(tmpfs, Tmpfs::Root, Path::new(NEW_ROOT)).map_err(|e| {
        SetupError::io(
            Step::MountRootTmpfs,
            &e,
            format!("mounting the root tmpfs on {NEW_ROOT}"),
        )
    })
}

fn bind_host_dirs() -> Done {
    for name in HOST_TOP {
        bind_onto_mount_point(
            Path::new("/"),
            Path::new(NEW_ROOT),
            name,
            Step::BindHostDirs,
            Bind::Readonly,
        )?;
    }
    Ok(())
}

/// The harmless host /etc entries (see rootfs.rs) on the launcher's /etc, bound from a
/// read-only bind of the host's /etc on the stage ([`Stage::bind_host_etc`]): a bind copies
/// its source's flags, so each entry is one bind instead of a bind and a remount.
fn bind_host_etc_entries(stage: &Stage) -> Done {
    let etc = at("etc");
    let (from, bind) = match stage.etc() {
        Some(readonly) => (readonly, Bind::Copy),
        None => (Path::new("/etc"), Bind::Readonly),
    };
    for name in HOST_ETC {
        bind_onto_mount_point(from, &etc, name, Step::WriteEtc, bind)?;
    }
    Ok(())
}

/// How [`bind_onto_mount_point`] binds: onto the new mount point then made read-only, or
/// as a copy of a source that is read-only already.
#[derive(Clone, Copy)]
enum Bind {
    Readonly,
    Copy,
}

/// Binds `from/name` onto `to/name` where the launcher made a directory or file for it
/// there (super::skeleton: it copied a symlink as a symlink, and made nothing for an entry
/// the host lacks). A symlink is never mounted on: mount(2) would follow it.
fn bind_onto_mount_point(from: &Path, to: &Path, name: &str, step: Step, bind: Bind) -> Done {
    let (src, dst) = (from.join(name), to.join(name));
    match fs::symlink_metadata(&dst) {
        Ok(meta) if meta.is_dir() || meta.is_file() => {}
        Ok(_) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(SetupError::io(
                step,
                &e,
                format!("inspecting {}", dst.display()),
            ))
        }
    }
    let bound = match bind {
        Bind::Readonly => bind_readonly(&src, &dst),
        Bind::Copy => bind_copy_recursive(&src, &dst),
    };
    bound.map_err(|e| {
        SetupError::errno(
            step,
            e,
            format!("binding {} read-only on {}", src.display(), dst.display()),
        )
    })
}

/// The image as the new root: a read-only overlay of it, so that /proc/self/mountinfo
/// shows `/` as the root's path rather than the image's directory on the host (a bind's
/// root is that directory's path in its file system). Overlay wants two layers when it has
/// no upper one: the image, and an empty tmpfs of the launcher's, first attached at
/// NEW_ROOT, under the overlay. Both are named by paths that tell nothing of the host (the
/// image as ".", our cwd, the empty one as NEW_ROOT), and overlay shows them as given; the
/// empty tmpfs leaves the table with the old root. Before Linux 5.11 a user namespace
/// cannot mount an overlay: there the image is bound on top of the empty tmpfs instead.
fn mount_image_root(dir: &Path, image: std::os::fd::OwnedFd, tmpfs: &mut TmpfsFds) -> Done {
    use std::os::fd::AsRawFd;
    let fail = |e: Errno, what: String| SetupError::errno(Step::BindImageRoot, e, what);
    attach(tmpfs, Tmpfs::Empty, Path::new(NEW_ROOT))
        .map_err(|e| SetupError::io(Step::BindImageRoot, &e, "attaching the empty layer"))?;
    nix::unistd::fchdir(&image).map_err(|e| fail(e, format!("chdir {}", dir.display())))?;
    let mounted = mount(
        Some("overlay"),
        NEW_ROOT,
        Some("overlay"),
        MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(format!("lowerdir=.:{NEW_ROOT}").as_str()),
    );
    chdir("/").map_err(|e| fail(e, "chdir /".into()))?;
    match mounted {
        Ok(()) => Ok(()),
        // No overlay in a user namespace (before 5.11), or none at all.
        Err(Errno::EPERM | Errno::EINVAL | Errno::ENODEV) => {
            let source = PathBuf::from(format!("/proc/self/fd/{}", image.as_raw_fd()));
            bind_image_root(&source).map_err(|mut e| {
                e.context = format!("binding the rootfs {} on {NEW_ROOT}", dir.display());
                e
            })
        }
        Err(e) => Err(fail(
            e,
            format!("mounting an overlay of the rootfs {}", dir.display()),
        )),
    }
}

fn bind_image_root(dir: &Path) -> Done {
    mount(
        Some(dir),
        NEW_ROOT,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|e| {
        SetupError::errno(
            Step::BindImageRoot,
            e,
            format!("binding the rootfs {} on {NEW_ROOT}", dir.display()),
        )
    })
}

/// The image directory, opened before anything covers NEW_ROOT (it may lie under the
/// host's /tmp).
fn open_image(dir: &Path) -> Result<std::os::fd::OwnedFd, SetupError> {
    nix::fcntl::open(
        dir,
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| {
        SetupError::errno(
            Step::BindImageRoot,
            e,
            format!("opening the rootfs {}", dir.display()),
        )
    })
}

/// A prepared image cannot grow mount points: it is read-only, and it is the user's.
fn check_mount_points(dir: &Path) -> Done {
    for name in ["tmp", "work", "dev", "proc"] {
        if !at(name).is_dir() {
            return Err(SetupError::errno(Step::CheckMountPoints,
                Errno::ENOENT,
                format!(
                    "the rootfs {} has no /{name} directory to mount on; every image needs /dev, /proc, \
                     /tmp and /work (`cargo xtask rootfs` creates them)",
                    dir.display()
                ),
            ));
        }
    }
    Ok(())
}

fn mount_tmp(tmpfs: &mut TmpfsFds) -> Done {
    attach(tmpfs, Tmpfs::Tmp, &at("tmp"))
        .map_err(|e| SetupError::io(Step::MountTmp, &e, "mounting the tmpfs on /tmp"))
}

fn mount_work(tmpfs: &mut TmpfsFds) -> Done {
    attach(tmpfs, Tmpfs::Work, &at("work"))
        .map_err(|e| SetupError::io(Step::MountWork, &e, "mounting the tmpfs on /work"))
}

/// A tmpfs /dev with the harmless device nodes bound from the host onto the launcher's
/// placeholders (it made the usual symlinks and /dev/shm's and /dev/pts's directories too,
/// super::skeleton), a /dev/shm tmpfs and a devpts instance of the sandbox's own;
/// [`seal_dev`] makes it read-only at the end.
fn mount_dev(tmpfs: &mut TmpfsFds) -> Done {
    let dev = at("dev");
    attach(tmpfs, Tmpfs::Dev, &dev)
        .map_err(|e| SetupError::io(Step::MountDev, &e, "mounting the tmpfs on /dev"))?;
    for node in DEV_NODES {
        let (src, dst) = (Path::new("/dev").join(node), dev.join(node));
        // No placeholder where the host had no such node: the bind's ENOENT.
        match bind_copy(&src, &dst) {
            Err(Errno::ENOENT) if fs::symlink_metadata(&dst).is_err() => {}
            bound => bound.map_err(|e| {
                SetupError::errno(Step::MountDev, e, format!("binding {}", src.display()))
            })?,
        }
    }
    attach(tmpfs, Tmpfs::Shm, &dev.join("shm"))
        .map_err(|e| SetupError::io(Step::MountDev, &e, "mounting the tmpfs on /dev/shm"))?;
    mount_devpts(&dev)
}

/// A devpts instance of the sandbox's own on /dev/pts, which /dev/ptmx points into (the
/// launcher's symlink): the payload can open ptys (`os.openpty()`, `script`, test suites of
/// terminal code), and no host pty is visible. A devpts mounted in a user namespace is
/// always a new instance. The slaves belong to whoever opens the master (the sandbox user);
/// `max` bounds how many the sandbox holds ([`MAX_PTYS`]).
fn mount_devpts(dev: &Path) -> Done {
    mount(
        Some("devpts"),
        &dev.join("pts"),
        Some("devpts"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some(format!("newinstance,ptmxmode=0666,mode=0620,max={MAX_PTYS}").as_str()),
    )
    .map_err(|e| {
        SetupError::errno(
            Step::MountDevpts,
            e,
            "mounting a devpts instance on /dev/pts",
        )
    })
}

/// The REPL drivers of this codecage's version, which the launcher wrote on the stage's
/// `run` (super::skeleton), on /run (the host rootfs's mount point is the launcher's too;
/// images have one): a bind, read-only from the stage.
fn mount_drivers(stage: &Path) -> Done {
    let run = at("run");
    if !run.is_dir() {
        return Err(SetupError::refused(
            Step::MountDrivers,
            "the image has no /run to mount the REPL drivers on",
        ));
    }
    bind_copy(&stage.join("run"), &run)
        .map_err(|e| SetupError::errno(Step::MountDrivers, e, "binding the drivers on /run"))
}

fn seal_dev() -> Done {
    seal_written(&at("dev"))
        .map_err(|e| SetupError::errno(Step::SealDev, e, "making /dev read-only"))
}

fn mount_proc() -> Done {
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount(Some("proc"), &at("proc"), Some("proc"), flags, None::<&str>)
        .map_err(|e| SetupError::errno(Step::MountProc, e, "mounting a new proc on /proc"))
}

fn protect_proc() -> Done {
    for name in PROC_READONLY {
        let path = at("proc").join(name);
        // The bind's ENOENT says the entry is not there (no lookup first: see bind_if_there).
        match mount(
            Some(&path),
            &path,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        ) {
            Err(Errno::ENOENT) => continue,
            bound => bound.and_then(|()| remount_readonly(&path)),
        }
        .map_err(|e| {
            SetupError::errno(
                Step::ProtectProc,
                e,
                format!("making /proc/{name} read-only"),
            )
        })?;
    }
    Ok(())
}

/// An exec allowlist's half in the mount table: every mount of the new root noexec (the
/// kernel then refuses to execve a file from it, *and* to map one executable, which is what
/// the dynamic loader does with `ld.so PROGRAM`), then each file that must be executed or
/// mapped executable (the allowed programs, their loader and libraries) bound onto itself
/// read-only, nosuid, nodev and exec. The other half is landlock's EXECUTE right
/// (super::landlock), which keeps the libraries from being executed.
fn restrict_exec_mounts(exec: &crate::exec_policy::ExecAllowlist) -> Done {
    crate::sys::set_mount_attrs_recursive(Path::new(NEW_ROOT), crate::sys::MOUNT_ATTR_NOEXEC)
        .map_err(|e| SetupError::io(Step::RestrictExecMounts, &e, "making every mount noexec"))?;
    for file in exec.exec_mounted() {
        bind_exec(file, &at(&file.to_string_lossy()[1..]))?;
    }
    Ok(())
}

/// `file` (its path in the sandbox, at `path` now) bound onto itself read-only, nosuid,
/// nodev and exec: at setup under the new root, and later in the running sandbox for an
/// approved command's files (`path` = `file` then).
pub(super) fn bind_exec(file: &Path, path: &Path) -> Done {
    let fail = |e: Errno, what: &str| {
        SetupError::errno(
            Step::RestrictExecMounts,
            e,
            format!("{what} {}", file.display()),
        )
    };
    if !fs::symlink_metadata(path).is_ok_and(|m| m.is_file() || m.is_dir()) {
        return Err(fail(Errno::ENOENT, "the image has no file or directory at"));
    }
    // Recursive: a directory's submounts stay (noexec).
    let bind = MsFlags::MS_BIND | MsFlags::MS_REC;
    mount(Some(path), path, None::<&str>, bind, None::<&str>).map_err(|e| fail(e, "binding"))?;
    let flags = MsFlags::MS_BIND
        | MsFlags::MS_REMOUNT
        | MsFlags::MS_RDONLY
        | MsFlags::MS_NOSUID
        | MsFlags::MS_NODEV;
    mount(None::<&str>, path, None::<&str>, flags, None::<&str>)
        .map_err(|e| fail(e, "making exec the bind of"))
}

fn remount_root_readonly() -> Done {
    seal_written(Path::new(NEW_ROOT))
        .map_err(|e| SetupError::errno(Step::RemountRootReadonly, e, "making / read-only"))
}

/// pivot_root(".", ".") stacks the old root on the new one; detaching it leaves the new root
/// alone, with no put_old directory to clean up (pivot_root(2), "NOTES").
fn enter_new_root() -> Done {
    chdir(NEW_ROOT)
        .map_err(|e| SetupError::errno(Step::EnterNewRoot, e, format!("chdir {NEW_ROOT}")))?;
    pivot_root(".", ".").map_err(|e| SetupError::errno(Step::EnterNewRoot, e, "pivot_root"))?;
    umount2(".", MntFlags::MNT_DETACH)
        .map_err(|e| SetupError::errno(Step::EnterNewRoot, e, "detaching the old root"))?;
    chdir("/").map_err(|e| SetupError::errno(Step::EnterNewRoot, e, "chdir /"))
}

pub(super) fn bind_readonly(src: &Path, dst: &Path) -> nix::Result<()> {
    mount(
        Some(src),
        dst,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )?;
    remount_readonly(dst)
}

/// Binds `src`, which is on a read-only mount already, to `dst`: a bind copies its source
/// mount's flags, so one remount of the source serves every bind of it.
pub(super) fn bind_copy(src: &Path, dst: &Path) -> nix::Result<()> {
    mount(Some(src), dst, None::<&str>, MsFlags::MS_BIND, None::<&str>)
}

/// [`bind_copy`] of `src` and every mount below it.
fn bind_copy_recursive(src: &Path, dst: &Path) -> nix::Result<()> {
    let flags = MsFlags::MS_BIND | MsFlags::MS_REC;
    mount(Some(src), dst, None::<&str>, flags, None::<&str>)
}

/// [`remount_readonly`] of a tmpfs the launcher wrote on (src/launcher/fill.rs). EBUSY says
/// a file of the mount is still open for writing somewhere: only a copy of one of the
/// launcher's fds can be, in a process that its program forked while it wrote (its own
/// clones of sandboxes wait for its writes), and that copy goes at the process's exec. So
/// it is tried again, for at most about 100 ms.
fn seal_written(path: &Path) -> nix::Result<()> {
    for _ in 0..100 {
        match remount_readonly(path) {
            Err(Errno::EBUSY) => std::thread::sleep(std::time::Duration::from_millis(1)),
            done => return done,
        }
    }
    remount_readonly(path)
}

/// Makes a mount read-only, nosuid, nodev. The first bind ignores these flags; only a
/// remount with MS_BIND|MS_REMOUNT applies them (mount(2)). Flags the kernel locked when it copied the host's
/// mount into our user namespace must be kept, or the remount fails with EPERM
/// (mount_namespaces(7), "locked mounts"); atime flags are preserved by a remount anyway.
pub(super) fn remount_readonly(path: &Path) -> nix::Result<()> {
    let current = statvfs(path)?.flags();
    let mut flags = MsFlags::MS_BIND
        | MsFlags::MS_REMOUNT
        | MsFlags::MS_RDONLY
        | MsFlags::MS_NOSUID
        | MsFlags::MS_NODEV;
    if current.contains(FsFlags::ST_NOEXEC) {
        flags |= MsFlags::MS_NOEXEC;
    }
    mount(None::<&str>, path, None::<&str>, flags, None::<&str>)
}
