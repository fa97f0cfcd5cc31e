//! A session's /work from the host: stat, list (to a depth), make directories, move,
//! remove and watch, on a dup of the /work tmpfs the launcher made (see `Tmpfs::Work`),
//! without a round trip through the sandbox's init and while a call runs.
//!
//! The sandbox's code is hostile and may swap any name for a symlink at any moment, so
//! every path is resolved by the kernel in one step from the /work fd with `openat2`'s
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV`: a `..`, an absolute or
//! relative symlink, a magic link or a mount point (a volume) anywhere in it fails, and
//! nothing outside /work's own file system is ever reached. The last component is then
//! acted on with the `*at` calls that never follow it (fstatat with AT_SYMLINK_NOFOLLOW,
//! mkdirat, renameat2, unlinkat). Paths with `..` are refused before any call, by name.
//! What is created belongs to the sandbox user (its host id).

use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, SystemTime};

use nix::errno::Errno;
use nix::fcntl::{openat, openat2, AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fstat, fstatat, mkdirat, FileStat, Mode, SFlag};
use nix::unistd::{fchownat, unlinkat, Gid, Uid, UnlinkatFlags};

/// Entries a listing returns at most (past it, an error asks for a smaller one).
pub const MAX_LISTED: usize = 100_000;
/// The deepest a listing goes.
pub const MAX_DEPTH: u32 = 64;
/// How deep a tree `remove` takes apart.
const MAX_REMOVE_DEPTH: usize = 256;

/// /work of one sandbox: its tmpfs's root, and the host ids its sandbox's ids map to.
#[derive(Debug)]
pub struct WorkDir {
    root: OwnedFd,
    /// The host uid (and gid) of the sandbox's root; its user's is the next, nobody's the
    /// one after (see `IdMapping::map_lines`).
    host_root: u32,
}

/// What went wrong, for a front end's status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsErrorKind {
    /// The path (or a directory on it) does not exist.
    NotFound,
    /// The path is refused: `..`, outside /work, through a symlink or a mount, the wrong
    /// type for the operation.
    Invalid,
    /// The target exists already.
    Exists,
    /// The file system refused (full, a race lost, ...).
    Failed,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsError {
    pub kind: FsErrorKind,
    pub message: String,
}

impl FsError {
    fn new(kind: FsErrorKind, message: impl Into<String>) -> FsError {
        FsError {
            kind,
            message: message.into(),
        }
    }
    fn invalid(message: impl Into<String>) -> FsError {
        FsError::new(FsErrorKind::Invalid, message)
    }
}

impl std::fmt::Display for FsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// An entry's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    /// A FIFO, socket or device node.
    Other,
}

impl FileKind {
    pub fn name(self) -> &'static str {
        match self {
            FileKind::File => "file",
            FileKind::Dir => "dir",
            FileKind::Symlink => "symlink",
            FileKind::Other => "other",
        }
    }
    fn of(mode: u32) -> FileKind {
        match SFlag::from_bits_truncate(mode) & SFlag::S_IFMT {
            SFlag::S_IFREG => FileKind::File,
            SFlag::S_IFDIR => FileKind::Dir,
            SFlag::S_IFLNK => FileKind::Symlink,
            _ => FileKind::Other,
        }
    }
}

/// One entry, as the sandbox sees it (E2B's `EntryInfo`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryInfo {
    /// Its last component ("work" for /work itself).
    pub name: String,
    pub kind: FileKind,
    /// Its absolute path in the sandbox, `/work/...`.
    pub path: String,
    pub size: u64,
    /// The permission bits (with setuid, setgid, sticky): `st_mode & 0o7777`.
    pub mode: u32,
    /// As `ls -l` prints them: `drwxr-xr-x`.
    pub permissions: String,
    /// The owner and group by the sandbox's names: `root`, `sandbox` or `nobody`.
    pub owner: String,
    pub group: String,
    pub modified: SystemTime,
    /// Where a symlink points (as written, never followed).
    pub symlink_target: Option<String>,
}

/// A path under /work, checked: its components (none for /work itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkPath {
    components: Vec<String>,
}

impl WorkPath {
    /// `path` as the API takes it: relative to /work, or absolute under /work. Refused:
    /// `..`, an absolute path elsewhere, a NUL byte. `.` and empty components are dropped.
    pub fn parse(path: &str) -> Result<WorkPath, FsError> {
        let rest = if path.starts_with('/') {
            match path.strip_prefix("/work") {
                Some(rest) if rest.is_empty() || rest.starts_with('/') => rest,
                _ => {
                    return Err(FsError::invalid(format!(
                        "{path:?} is outside /work: give a path relative to /work, or one starting with /work/"
                    )))
                }
            }
        } else {
            path
        };
        if path.contains('\0') {
            return Err(FsError::invalid(format!("{path:?} contains a NUL byte")));
        }
        let mut components = Vec::new();
        for c in rest.split('/') {
            match c {
                "" | "." => {}
                ".." => {
                    return Err(FsError::invalid(format!(
                    "{path:?} has a `..` component: paths stay under /work, give it without `..`"
                )))
                }
                c => components.push(c.to_string()),
            }
        }
        Ok(WorkPath { components })
    }

    pub fn is_root(&self) -> bool {
        self.components.is_empty()
    }

    /// Relative to /work ("." for /work).
    fn relative(&self) -> String {
        if self.components.is_empty() {
            ".".into()
        } else {
            self.components.join("/")
        }
    }

    /// `/work/...`.
    pub fn absolute(&self) -> String {
        if self.components.is_empty() {
            "/work".into()
        } else {
            format!("/work/{}", self.components.join("/"))
        }
    }

    fn parent(&self) -> WorkPath {
        let mut components = self.components.clone();
        components.pop();
        WorkPath { components }
    }

    fn name(&self) -> &str {
        self.components.last().map_or("work", String::as_str)
    }

    fn join(&self, name: &str) -> WorkPath {
        let mut components = self.components.clone();
        components.push(name.to_string());
        WorkPath { components }
    }

    /// Under `other` (or it).
    fn within(&self, other: &WorkPath) -> bool {
        self.components.starts_with(&other.components)
    }
}

fn cstr(name: &str) -> Result<CString, FsError> {
    CString::new(name).map_err(|_| FsError::invalid(format!("{name:?} contains a NUL byte")))
}

impl WorkDir {
    /// `root` is /work's tmpfs (its root directory), `host_root` the sandbox root's host id.
    pub fn new(root: OwnedFd, host_root: u32) -> WorkDir {
        WorkDir { root, host_root }
    }

    /// Opens `path` (a directory unless `flags` says O_PATH only) in one kernel walk that
    /// refuses `..`, symlinks and mount crossings.
    fn open(&self, path: &WorkPath, flags: OFlag) -> Result<OwnedFd, FsError> {
        let how = OpenHow::new()
            .flags(flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
            .resolve(
                ResolveFlag::RESOLVE_BENEATH
                    | ResolveFlag::RESOLVE_NO_SYMLINKS
                    | ResolveFlag::RESOLVE_NO_MAGICLINKS
                    | ResolveFlag::RESOLVE_NO_XDEV,
            );
        let rel = path.relative();
        // EAGAIN: a rename raced the walk; the kernel asks to try again.
        let mut tries = 0;
        loop {
            match openat2(self.root.as_fd(), rel.as_str(), how) {
                Err(Errno::EAGAIN) if tries < 8 => tries += 1,
                Ok(fd) => return Ok(fd),
                Err(e @ (Errno::ELOOP | Errno::ENOTDIR)) => {
                    return Err(self.diagnose(path).unwrap_or_else(|| walk_error(path, e)))
                }
                Err(e) => return Err(walk_error(path, e)),
            }
        }
    }

    /// Why a walk to directory `path` failed with ELOOP or ENOTDIR, by the first component
    /// that is a symlink or not a directory (each looked at without following anything).
    fn diagnose(&self, path: &WorkPath) -> Option<FsError> {
        let mut dir = self.root.try_clone().ok()?;
        let mut at = WorkPath { components: vec![] };
        for name in &path.components {
            at = at.join(name);
            let st = fstatat(&dir, name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW).ok()?;
            match FileKind::of(st.st_mode) {
                FileKind::Symlink => {
                    return Some(FsError::invalid(format!(
                        "{} is a symlink, which is not followed (a path must stay in /work)",
                        at.absolute()
                    )))
                }
                FileKind::Dir => {}
                _ => {
                    return Some(FsError::invalid(format!(
                        "{} is not a directory",
                        at.absolute()
                    )))
                }
            }
            dir = openat(
                &dir,
                name.as_str(),
                OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .ok()?;
        }
        None
    }

    fn open_dir(&self, path: &WorkPath) -> Result<OwnedFd, FsError> {
        self.open(path, OFlag::O_PATH | OFlag::O_DIRECTORY)
    }

    /// The entry at `path`, not followed if it is a symlink.
    pub fn stat(&self, path: &WorkPath) -> Result<EntryInfo, FsError> {
        if path.is_root() {
            let st = fstat(&self.root).map_err(|e| failed(path, e))?;
            return Ok(self.info(path, &st, None));
        }
        let parent = self.open_dir(&path.parent())?;
        self.stat_at(&parent, path)
    }

    fn stat_at(&self, parent: &OwnedFd, path: &WorkPath) -> Result<EntryInfo, FsError> {
        let name = path.name();
        let st = fstatat(parent, name, AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(|e| final_error(path, e))?;
        let target = if FileKind::of(st.st_mode) == FileKind::Symlink {
            nix::fcntl::readlinkat(parent, name)
                .ok()
                .map(|t| t.to_string_lossy().into_owned())
        } else {
            None
        };
        Ok(self.info(path, &st, target))
    }

    fn info(&self, path: &WorkPath, st: &FileStat, symlink_target: Option<String>) -> EntryInfo {
        EntryInfo {
            name: path.name().to_string(),
            kind: FileKind::of(st.st_mode),
            path: path.absolute(),
            size: st.st_size.max(0) as u64,
            mode: st.st_mode & 0o7777,
            permissions: permissions(st.st_mode),
            owner: self.id_name(st.st_uid),
            group: self.id_name(st.st_gid),
            modified: SystemTime::UNIX_EPOCH
                + Duration::new(st.st_mtime.max(0) as u64, st.st_mtime_nsec as u32),
            symlink_target,
        }
    }

    /// A host id by the sandbox's name for it.
    fn id_name(&self, host: u32) -> String {
        match host.wrapping_sub(self.host_root) {
            0 => "root".into(),
            1 => crate::spec::SANDBOX_USER.into(),
            _ => "nobody".into(),
        }
    }

    /// The entries of directory `path`, and with `depth` over 1 those of its
    /// subdirectories (not through symlinks), to `depth` levels; sorted by path.
    pub fn list(&self, path: &WorkPath, depth: u32) -> Result<Vec<EntryInfo>, FsError> {
        if depth == 0 || depth > MAX_DEPTH {
            return Err(FsError::invalid(format!(
                "depth {depth}: give 1 (the directory's own entries) to {MAX_DEPTH}"
            )));
        }
        let dir = self.open(path, OFlag::O_RDONLY | OFlag::O_DIRECTORY)?;
        let dev = fstat(&dir).map_err(|e| failed(path, e))?.st_dev;
        let mut out = Vec::new();
        self.list_into(dir, path, dev, depth, &mut out)?;
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    fn list_into(
        &self,
        dir: OwnedFd,
        path: &WorkPath,
        dev: u64,
        depth: u32,
        out: &mut Vec<EntryInfo>,
    ) -> Result<(), FsError> {
        let names = read_names(&dir).map_err(|e| failed(path, e))?;
        for name in names {
            let child = path.join(&name);
            // Gone since it was read: skipped.
            let Ok(info) = self.stat_at(&dir, &child) else {
                continue;
            };
            if out.len() >= MAX_LISTED {
                return Err(FsError::invalid(format!(
                    "{} holds more than {MAX_LISTED} entries to depth {depth}: list a subdirectory or a smaller depth",
                    path.absolute()
                )));
            }
            let is_dir = info.kind == FileKind::Dir;
            out.push(info);
            if is_dir && depth > 1 {
                // A directory swapped for a symlink or a mount since: not entered.
                if let Ok(sub) = open_dir_below(&dir, &name, dev, OFlag::O_RDONLY) {
                    self.list_into(sub, &child, dev, depth - 1, out)?;
                }
            }
        }
        Ok(())
    }

    /// Makes directory `path` and its missing parents, the sandbox user's. Its entry, and
    /// whether it was made (false: it was there).
    pub fn make_dir(&self, path: &WorkPath) -> Result<(EntryInfo, bool), FsError> {
        if path.is_root() {
            return Ok((self.stat(path)?, false));
        }
        let mut dir = self.open_dir(&WorkPath { components: vec![] })?;
        let dev = fstat(&dir).map_err(|e| failed(path, e))?.st_dev;
        let mut made = false;
        let mut at = WorkPath { components: vec![] };
        for name in &path.components {
            at = at.join(name);
            made = match mkdirat(&dir, name.as_str(), Mode::from_bits_truncate(0o755)) {
                Ok(()) => {
                    let user = Some(self.host_root.wrapping_add(1));
                    fchownat(
                        &dir,
                        name.as_str(),
                        user.map(Uid::from_raw),
                        user.map(Gid::from_raw),
                        AtFlags::AT_SYMLINK_NOFOLLOW,
                    )
                    .map_err(|e| failed(&at, e))?;
                    true
                }
                Err(Errno::EEXIST) => false,
                Err(e) => return Err(failed(&at, e)),
            };
            let opened = open_dir_below(&dir, name, dev, OFlag::O_PATH);
            // O_DIRECTORY | O_NOFOLLOW on a symlink is ENOTDIR too: told apart.
            let symlink = matches!(opened, Err(Errno::ENOTDIR))
                && fstatat(&dir, name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
                    .is_ok_and(|st| FileKind::of(st.st_mode) == FileKind::Symlink);
            dir = opened.map_err(|e| match e {
                Errno::ENOTDIR | Errno::ELOOP if symlink => FsError::invalid(format!(
                    "{} is a symlink, which is not followed (a path must stay in /work)",
                    at.absolute()
                )),
                Errno::ENOTDIR => FsError::new(
                    FsErrorKind::Exists,
                    format!("{} exists and is not a directory", at.absolute()),
                ),
                Errno::ELOOP => FsError::invalid(format!(
                    "{} is a symlink, which is not followed (a path must stay in /work)",
                    at.absolute()
                )),
                Errno::EXDEV => FsError::invalid(format!(
                    "{} is a mount point (a volume), which is not entered",
                    at.absolute()
                )),
                e => failed(&at, e),
            })?;
        }
        let st = fstat(&dir).map_err(|e| failed(path, e))?;
        Ok((self.info(path, &st, None), made))
    }

    /// Moves (renames) `source` to `destination`, whose parent must exist. An existing
    /// destination is replaced only with `overwrite` (as rename(2) would: a directory only
    /// by an empty one). The moved entry, at its new path.
    pub fn move_to(
        &self,
        source: &WorkPath,
        destination: &WorkPath,
        overwrite: bool,
    ) -> Result<EntryInfo, FsError> {
        if source.is_root() || destination.is_root() {
            return Err(FsError::invalid("/work itself cannot be moved or replaced"));
        }
        if destination.within(source) && destination != source {
            return Err(FsError::invalid(format!(
                "cannot move {} into itself ({})",
                source.absolute(),
                destination.absolute()
            )));
        }
        let from = self.open_dir(&source.parent())?;
        let to = self.open_dir(&destination.parent())?;
        // The source is named in the error if it is the one missing.
        self.stat_at(&from, source)?;
        let flags = if overwrite {
            0
        } else {
            crate::sys::RENAME_NOREPLACE
        };
        crate::sys::renameat2(
            from.as_fd(),
            &cstr(source.name())?,
            to.as_fd(),
            &cstr(destination.name())?,
            flags,
        )
        .map_err(|e| match Errno::from_raw(e.raw_os_error().unwrap_or(0)) {
            Errno::EEXIST | Errno::ENOTEMPTY => FsError::new(
                FsErrorKind::Exists,
                format!(
                    "{} exists{}",
                    destination.absolute(),
                    if overwrite {
                        " and is a directory that is not empty"
                    } else {
                        ": remove it first, or ask to overwrite"
                    }
                ),
            ),
            Errno::ENOENT => FsError::new(
                FsErrorKind::NotFound,
                format!("{} does not exist", source.absolute()),
            ),
            Errno::EISDIR | Errno::ENOTDIR => FsError::invalid(format!(
                "cannot replace {} with {}: one is a directory and the other is not",
                destination.absolute(),
                source.absolute()
            )),
            Errno::EXDEV | Errno::EBUSY => FsError::invalid(format!(
                "{} or {} is a mount point (a volume), which cannot be moved",
                source.absolute(),
                destination.absolute()
            )),
            e => FsError::new(
                FsErrorKind::Failed,
                format!(
                    "cannot move {} to {}: {e}",
                    source.absolute(),
                    destination.absolute()
                ),
            ),
        })?;
        self.stat_at(&to, destination)
    }

    /// Removes `path`: a file or symlink (never followed), or a directory and everything
    /// under it.
    pub fn remove(&self, path: &WorkPath) -> Result<(), FsError> {
        if path.is_root() {
            return Err(FsError::invalid(
                "/work itself cannot be removed: remove what is in it",
            ));
        }
        let parent = self.open_dir(&path.parent())?;
        let dev = fstat(&parent).map_err(|e| failed(path, e))?.st_dev;
        let info = self.stat_at(&parent, path)?;
        if info.kind == FileKind::Dir {
            remove_tree(&parent, path.name(), dev, 0).map_err(|e| match e {
                Errno::EXDEV | Errno::EBUSY => FsError::invalid(format!(
                    "{} holds a mount point (a volume), which cannot be removed",
                    path.absolute()
                )),
                Errno::ENOENT => FsError::new(
                    FsErrorKind::NotFound,
                    format!("{} does not exist", path.absolute()),
                ),
                e => failed(path, e),
            })
        } else {
            unlinkat(&parent, path.name(), UnlinkatFlags::NoRemoveDir)
                .map_err(|e| final_error(path, e))
        }
    }
}

/// The directories one watch follows at most (each costs the host an inotify watch, a
/// shared per-user budget): past it, or deeper than [`MAX_DEPTH`] below the watched one,
/// new subdirectories are not followed.
pub const MAX_WATCHED_DIRS: usize = 1024;

/// What happened to an entry of a watched directory (E2B's `EventType`, fsnotify's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// Made, or moved in.
    Create,
    /// Its content changed.
    Write,
    Remove,
    /// Moved away (or renamed: the new name comes as a `Create`).
    Rename,
    /// Its mode, owner or times changed.
    Chmod,
    /// The kernel's queue overflowed: events were lost.
    Overflow,
}

impl EventKind {
    pub fn name(self) -> &'static str {
        match self {
            EventKind::Create => "create",
            EventKind::Write => "write",
            EventKind::Remove => "remove",
            EventKind::Rename => "rename",
            EventKind::Chmod => "chmod",
            EventKind::Overflow => "overflow",
        }
    }
}

/// One event of a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsEvent {
    /// The entry's path relative to the watched directory (`sub/file.txt`; empty for the
    /// directory itself or an overflow).
    pub name: String,
    /// Its absolute path in the sandbox.
    pub path: String,
    pub kind: EventKind,
}

/// A watch on a directory of /work (inotify on the host, on directories opened beneath
/// /work as every path is): read its events with [`Watch::read`] when its fd is readable
/// (it is non-blocking). It holds /work only weakly: once the session's sandbox is gone,
/// `read` says so and the watch should be dropped (its inotify watches pin the tmpfs).
pub struct Watch {
    inotify: nix::sys::inotify::Inotify,
    work: std::sync::Weak<WorkDir>,
    root: WorkPath,
    recursive: bool,
    /// Each watched directory, relative to `root`.
    dirs: std::collections::HashMap<i32, WorkPath>,
    /// The watched directory itself is gone.
    ended: bool,
}

impl AsFd for Watch {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.inotify.as_fd()
    }
}

impl std::os::fd::AsRawFd for Watch {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.inotify.as_fd().as_raw_fd()
    }
}

/// The inotify instance is the watch's own, closed only when it is dropped.
#[cfg(feature = "cli")]
impl crate::sys::OwnsFd for Watch {}

/// A watch the tokio reactor tells the readiness of: waiting for its events takes no
/// thread.
#[cfg(feature = "cli")]
pub struct AsyncWatch(tokio::io::unix::AsyncFd<Watch>);

#[cfg(feature = "cli")]
impl AsyncWatch {
    pub fn new(watch: Watch) -> std::io::Result<AsyncWatch> {
        crate::sys::register_async(watch).map(AsyncWatch)
    }

    pub fn get_ref(&self) -> &Watch {
        self.0.get_ref()
    }

    /// The next events, waiting up to `wait` for some (none: nothing happened); an error
    /// as [`Watch::read`]'s.
    pub async fn next(&mut self, wait: Duration) -> Result<Vec<FsEvent>, FsError> {
        let timeout = tokio::time::sleep(wait);
        tokio::pin!(timeout);
        loop {
            let mut ready = tokio::select! {
                ready = self.0.readable_mut() => ready.map_err(|e| {
                    FsError::new(FsErrorKind::Failed, format!("cannot poll the watch: {e}"))
                })?,
                // Nothing came: still, say so if /work or the directory is gone.
                _ = &mut timeout => return self.0.get_mut().read(),
            };
            let events = ready.get_inner_mut().read()?;
            if events.is_empty() {
                ready.clear_ready();
                continue;
            }
            return Ok(events);
        }
    }
}

impl WorkDir {
    /// Watches directory `path` (and with `recursive` every directory under it, as they
    /// come too: never through a symlink or a mount).
    pub fn watch(
        self: &std::sync::Arc<Self>,
        path: &WorkPath,
        recursive: bool,
    ) -> Result<Watch, FsError> {
        use nix::sys::inotify::{InitFlags, Inotify};
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .map_err(|e| FsError::new(FsErrorKind::Failed, format!("cannot start a watch: {e}")))?;
        let mut watch = Watch {
            inotify,
            work: std::sync::Arc::downgrade(self),
            root: path.clone(),
            recursive,
            dirs: Default::default(),
            ended: false,
        };
        let top = self.open_dir(path)?;
        watch.add(top, WorkPath { components: vec![] })?;
        Ok(watch)
    }
}

impl Watch {
    /// The watched directory, `/work/...`.
    pub fn path(&self) -> String {
        self.root.absolute()
    }

    /// Watches directory `fd` (at `rel` under the root) and, if recursive, its
    /// subdirectories.
    fn add(&mut self, fd: OwnedFd, rel: WorkPath) -> Result<(), FsError> {
        use nix::sys::inotify::AddWatchFlags as F;
        use std::os::fd::AsRawFd;
        if self.dirs.len() >= MAX_WATCHED_DIRS {
            return Ok(());
        }
        let mask = F::IN_CREATE
            | F::IN_MODIFY
            | F::IN_DELETE
            | F::IN_MOVED_FROM
            | F::IN_MOVED_TO
            | F::IN_ATTRIB
            | F::IN_DELETE_SELF
            | F::IN_ONLYDIR;
        // The fd's magic link names the very directory openat2 found (the host's /proc).
        let proc_path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        let wd = self
            .inotify
            .add_watch(proc_path.as_str(), mask)
            .map_err(|e| {
                FsError::new(
                    FsErrorKind::Failed,
                    format!("cannot watch {}: {e}", self.root_of(&rel).absolute()),
                )
            })?;
        self.dirs.insert(wd.as_raw(), rel.clone());
        // Deeper than a listing goes, subdirectories are not followed (the walk recurses).
        if self.recursive && (rel.components.len() as u32) < MAX_DEPTH {
            let Ok(dev) = fstat(&fd).map(|st| st.st_dev) else {
                return Ok(());
            };
            let Ok(listing) = openat(
                &fd,
                ".",
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                Mode::empty(),
            ) else {
                return Ok(());
            };
            for name in read_names(&listing).unwrap_or_default() {
                if let Ok(sub) = open_dir_below(&listing, &name, dev, OFlag::O_PATH) {
                    self.add(sub, rel.join(&name))?;
                }
            }
        }
        Ok(())
    }

    fn root_of(&self, rel: &WorkPath) -> WorkPath {
        let mut components = self.root.components.clone();
        components.extend(rel.components.iter().cloned());
        WorkPath { components }
    }

    /// Why the watch is over, once its directory is gone (its last events were read).
    pub fn over(&self) -> Option<String> {
        self.ended
            .then(|| format!("{} was removed", self.root.absolute()))
    }

    /// Waits up to `wait` for events (on this thread), then reads them as [`Watch::read`].
    pub fn wait(&mut self, wait: Duration) -> Result<Vec<FsEvent>, FsError> {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let millis = i32::try_from(wait.as_millis()).unwrap_or(i32::MAX);
        let mut fds = [PollFd::new(self.inotify.as_fd(), PollFlags::POLLIN)];
        let _ = poll(
            &mut fds,
            PollTimeout::try_from(millis).unwrap_or(PollTimeout::MAX),
        );
        self.read()
    }

    /// The events queued since the last read (none if nothing happened). An error once
    /// the session's sandbox is gone, or the watched directory was removed (after its
    /// last events).
    pub fn read(&mut self) -> Result<Vec<FsEvent>, FsError> {
        use nix::sys::inotify::AddWatchFlags as F;
        let Some(work) = self.work.upgrade() else {
            return Err(FsError::new(
                FsErrorKind::NotFound,
                "the session was closed: its /work is gone",
            ));
        };
        if let Some(why) = self.over() {
            return Err(FsError::new(FsErrorKind::NotFound, why));
        }
        let raw = match self.inotify.read_events() {
            Ok(raw) => raw,
            Err(Errno::EAGAIN) => return Ok(Vec::new()),
            Err(e) => {
                return Err(FsError::new(
                    FsErrorKind::Failed,
                    format!("cannot read the watch: {e}"),
                ))
            }
        };
        let mut events = Vec::new();
        for event in raw {
            if event.mask.contains(F::IN_Q_OVERFLOW) {
                events.push(FsEvent {
                    name: String::new(),
                    path: self.root.absolute(),
                    kind: EventKind::Overflow,
                });
                continue;
            }
            let Some(dir) = self.dirs.get(&event.wd.as_raw()).cloned() else {
                continue;
            };
            if event.mask.contains(F::IN_IGNORED) {
                self.dirs.remove(&event.wd.as_raw());
                if dir.is_root() {
                    self.ended = true;
                }
                continue;
            }
            if event.mask.contains(F::IN_DELETE_SELF) {
                if dir.is_root() {
                    events.push(FsEvent {
                        name: String::new(),
                        path: self.root.absolute(),
                        kind: EventKind::Remove,
                    });
                }
                continue;
            }
            let Some(name) = event.name.as_ref().and_then(|n| n.to_str()) else {
                continue;
            };
            let rel = dir.join(name);
            let kind = if event.mask.intersects(F::IN_CREATE | F::IN_MOVED_TO) {
                EventKind::Create
            } else if event.mask.contains(F::IN_MODIFY) {
                EventKind::Write
            } else if event.mask.contains(F::IN_DELETE) {
                EventKind::Remove
            } else if event.mask.contains(F::IN_MOVED_FROM) {
                EventKind::Rename
            } else if event.mask.contains(F::IN_ATTRIB) {
                EventKind::Chmod
            } else {
                continue;
            };
            events.push(FsEvent {
                name: rel.components.join("/"),
                path: self.root_of(&rel).absolute(),
                kind,
            });
            if kind == EventKind::Create && self.recursive && event.mask.contains(F::IN_ISDIR) {
                // A new directory: followed, through the same beneath-/work walk.
                if let Ok(fd) = work.open_dir(&self.root_of(&rel)) {
                    let _ = self.add(fd, rel);
                }
            }
        }
        Ok(events)
    }
}

/// The names in `dir` (but `.` and `..`).
fn read_names(dir: &OwnedFd) -> nix::Result<Vec<String>> {
    let fd = openat(
        dir,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let mut listing = nix::dir::Dir::from_fd(fd)?;
    Ok(listing
        .iter()
        .flatten()
        .map(|e| String::from_utf8_lossy(e.file_name().to_bytes()).into_owned())
        .filter(|n| n != "." && n != ".." && !n.contains('\u{fffd}'))
        .collect())
}

/// Opens directory `name` under `dir`, never through a symlink, on `dev` only.
fn open_dir_below(dir: &OwnedFd, name: &str, dev: u64, flags: OFlag) -> nix::Result<OwnedFd> {
    let fd = openat(
        dir,
        name,
        flags | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    if fstat(&fd)?.st_dev != dev {
        return Err(Errno::EXDEV);
    }
    Ok(fd)
}

/// Empties directory `name` under `parent` and removes it; each level is entered by fd,
/// never by a path, so a tree swapped under it is taken apart where it lies (in /work).
fn remove_tree(parent: &OwnedFd, name: &str, dev: u64, depth: usize) -> nix::Result<()> {
    if depth > MAX_REMOVE_DEPTH {
        return Err(Errno::ELOOP);
    }
    let dir = open_dir_below(parent, name, dev, OFlag::O_RDONLY)?;
    // What the sandbox adds meanwhile is taken on the next round.
    for _ in 0..8 {
        for child in read_names(&dir)? {
            let st = match fstatat(&dir, child.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                Err(Errno::ENOENT) => continue,
                Err(e) => return Err(e),
            };
            let result = if FileKind::of(st.st_mode) == FileKind::Dir {
                remove_tree(&dir, &child, dev, depth + 1)
            } else {
                unlinkat(&dir, child.as_str(), UnlinkatFlags::NoRemoveDir)
            };
            match result {
                Ok(()) | Err(Errno::ENOENT) => {}
                Err(e) => return Err(e),
            }
        }
        match unlinkat(parent, name, UnlinkatFlags::RemoveDir) {
            Err(Errno::ENOTEMPTY) => continue,
            other => return other,
        }
    }
    Err(Errno::ENOTEMPTY)
}

/// An error of the walk to a path.
fn walk_error(path: &WorkPath, e: Errno) -> FsError {
    let p = path.absolute();
    match e {
        Errno::ENOENT => FsError::new(FsErrorKind::NotFound, format!("{p} does not exist")),
        Errno::ELOOP => FsError::invalid(format!(
            "{p} goes through a symlink, which is not followed (a path must stay in /work)"
        )),
        Errno::ENOTDIR => FsError::invalid(format!("{p}: a component of it is not a directory")),
        Errno::EXDEV => FsError::invalid(format!(
            "{p} crosses a mount point (a volume) or leaves /work, which is not allowed"
        )),
        e => FsError::new(FsErrorKind::Failed, format!("{p}: {e}")),
    }
}

/// An error on the last component.
fn final_error(path: &WorkPath, e: Errno) -> FsError {
    match e {
        Errno::ENOENT => FsError::new(
            FsErrorKind::NotFound,
            format!("{} does not exist", path.absolute()),
        ),
        e => walk_error(path, e),
    }
}

fn failed(path: &WorkPath, e: Errno) -> FsError {
    FsError::new(FsErrorKind::Failed, format!("{}: {e}", path.absolute()))
}

/// `ls -l`'s mode column.
pub fn permissions(mode: u32) -> String {
    let kind = match FileKind::of(mode) {
        FileKind::Dir => 'd',
        FileKind::Symlink => 'l',
        FileKind::File => '-',
        FileKind::Other => match SFlag::from_bits_truncate(mode) & SFlag::S_IFMT {
            SFlag::S_IFIFO => 'p',
            SFlag::S_IFSOCK => 's',
            SFlag::S_IFCHR => 'c',
            SFlag::S_IFBLK => 'b',
            _ => '?',
        },
    };
    let mut s = String::with_capacity(10);
    s.push(kind);
    let bit = |b: u32, c: char| if mode & b != 0 { c } else { '-' };
    let special =
        |x: u32, special: u32, set: char, unset: char| match (mode & x != 0, mode & special != 0) {
            (true, true) => set,
            (false, true) => unset,
            (true, false) => 'x',
            (false, false) => '-',
        };
    s.push(bit(0o400, 'r'));
    s.push(bit(0o200, 'w'));
    s.push(special(0o100, 0o4000, 's', 'S'));
    s.push(bit(0o040, 'r'));
    s.push(bit(0o020, 'w'));
    s.push(special(0o010, 0o2000, 's', 'S'));
    s.push(bit(0o004, 'r'));
    s.push(bit(0o002, 'w'));
    s.push(special(0o001, 0o1000, 't', 'T'));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_under_work_and_are_refused_by_name() {
        assert_eq!(WorkPath::parse("").unwrap().absolute(), "/work");
        assert_eq!(WorkPath::parse("/work").unwrap().absolute(), "/work");
        assert_eq!(
            WorkPath::parse("/work/a//b/./c/").unwrap().absolute(),
            "/work/a/b/c"
        );
        assert_eq!(WorkPath::parse("a/b").unwrap().absolute(), "/work/a/b");
        let e = WorkPath::parse("a/../../etc").unwrap_err();
        assert_eq!(e.kind, FsErrorKind::Invalid);
        assert!(e.message.contains("`..`"), "{e}");
        let e = WorkPath::parse("/etc/passwd").unwrap_err();
        assert!(e.message.contains("outside /work"), "{e}");
        assert!(WorkPath::parse("/workshop").is_err());
    }

    #[test]
    fn permissions_read_as_ls_prints_them() {
        assert_eq!(permissions(0o040755), "drwxr-xr-x");
        assert_eq!(permissions(0o100644), "-rw-r--r--");
        assert_eq!(permissions(0o120777), "lrwxrwxrwx");
        assert_eq!(permissions(0o041777), "drwxrwxrwt");
        assert_eq!(permissions(0o104644), "-rwSr--r--");
    }

    /// Everything against a real directory standing for /work, with hostile symlinks.
    #[test]
    fn operations_stay_beneath_the_root() {
        let base = std::env::temp_dir().join(format!("codecage-workdir-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        // Dropped last: the directory holding the two goes too.
        let _base = Scratch(base.clone());
        let (dir, outside) = (Scratch(base.join("work")), Scratch(base.join("outside")));
        std::fs::create_dir_all(dir.path()).unwrap();
        std::fs::create_dir_all(outside.path()).unwrap();
        std::fs::write(outside.path().join("secret"), "x").unwrap();
        let root = nix::fcntl::open(
            dir.path(),
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        let uid = nix::unistd::geteuid().as_raw();
        let work = WorkDir::new(root, uid.wrapping_sub(1));
        let p = |s: &str| WorkPath::parse(s).unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("out")).unwrap();
        std::os::unix::fs::symlink("../", dir.path().join("up")).unwrap();
        let info = work.stat(&p("out")).unwrap();
        assert_eq!(info.kind, FileKind::Symlink);
        assert_eq!(info.symlink_target.as_deref(), outside.path().to_str());
        for through in ["out/secret", "up/secret", "out"] {
            let e = work.list(&p(through), 1).unwrap_err();
            assert_eq!(e.kind, FsErrorKind::Invalid, "{through}: {e}");
        }
        assert_eq!(
            work.stat(&p("out/secret")).unwrap_err().kind,
            FsErrorKind::Invalid
        );
        assert_eq!(
            work.make_dir(&p("out/x")).unwrap_err().kind,
            FsErrorKind::Invalid
        );
        std::fs::write(dir.path().join("file"), "").unwrap();
        assert_eq!(
            work.make_dir(&p("file")).unwrap_err().kind,
            FsErrorKind::Exists
        );
        assert_eq!(
            work.remove(&p("out/secret")).unwrap_err().kind,
            FsErrorKind::Invalid
        );
        assert_eq!(
            work.move_to(&p("out/secret"), &p("taken"), false)
                .unwrap_err()
                .kind,
            FsErrorKind::Invalid
        );
        // Removing the link removes the link only.
        work.remove(&p("out")).unwrap();
        assert!(outside.path().join("secret").exists());
        // mkdir -p, then again (existed), move, list to a depth, remove the tree.
        let (made, created) = work.make_dir(&p("a/b/c")).unwrap();
        assert!(created);
        assert_eq!(
            (made.path.as_str(), made.kind),
            ("/work/a/b/c", FileKind::Dir)
        );
        assert!(!work.make_dir(&p("/work/a/b")).unwrap().1);
        std::fs::write(dir.path().join("a/b/c/f"), "hello").unwrap();
        let names = |d: u32| -> Vec<String> {
            work.list(&p("a"), d)
                .unwrap()
                .into_iter()
                .map(|e| e.path)
                .collect()
        };
        assert_eq!(names(1), ["/work/a/b"]);
        assert_eq!(names(3), ["/work/a/b", "/work/a/b/c", "/work/a/b/c/f"]);
        let moved = work.move_to(&p("a/b/c/f"), &p("a/g"), false).unwrap();
        assert_eq!((moved.path.as_str(), moved.size), ("/work/a/g", 5));
        std::fs::write(dir.path().join("a/h"), "").unwrap();
        assert_eq!(
            work.move_to(&p("a/h"), &p("a/g"), false).unwrap_err().kind,
            FsErrorKind::Exists
        );
        work.move_to(&p("a/h"), &p("a/g"), true).unwrap();
        assert_eq!(
            work.move_to(&p("a"), &p("a/b/z"), false).unwrap_err().kind,
            FsErrorKind::Invalid
        );
        assert_eq!(
            work.stat(&p("nope")).unwrap_err().kind,
            FsErrorKind::NotFound
        );
        assert_eq!(
            work.remove(&p("nope/x")).unwrap_err().kind,
            FsErrorKind::NotFound
        );
        work.remove(&p("a")).unwrap();
        assert!(!dir.path().join("a").exists());
        assert_eq!(work.remove(&p("")).unwrap_err().kind, FsErrorKind::Invalid);
        drop((dir, outside));
        let _ = std::fs::remove_dir(&base);
    }

    /// A recursive watch sees a file made in a directory made after it began, by its path
    /// relative to the watched one; the directory removed ends it.
    #[test]
    fn a_watch_follows_new_directories_and_ends_with_its_own() {
        let base = std::env::temp_dir().join(format!("codecage-watch-{}", std::process::id()));
        let dir = Scratch(base.clone());
        std::fs::create_dir_all(dir.path().join("w")).unwrap();
        let root = nix::fcntl::open(
            dir.path(),
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .unwrap();
        let work = std::sync::Arc::new(WorkDir::new(root, 0));
        let mut watch = work.watch(&WorkPath::parse("w").unwrap(), true).unwrap();
        assert!(watch.read().unwrap().is_empty());
        std::fs::create_dir(dir.path().join("w/sub")).unwrap();
        let events = watch.wait(Duration::from_secs(5)).unwrap();
        assert_eq!(
            (
                events[0].kind,
                events[0].name.as_str(),
                events[0].path.as_str()
            ),
            (EventKind::Create, "sub", "/work/w/sub")
        );
        std::fs::write(dir.path().join("w/sub/f"), "x").unwrap();
        let events = watch.wait(Duration::from_secs(5)).unwrap();
        let seen: Vec<_> = events.iter().map(|e| (e.kind, e.name.as_str())).collect();
        assert_eq!(
            seen,
            [(EventKind::Create, "sub/f"), (EventKind::Write, "sub/f")]
        );
        std::fs::remove_dir_all(dir.path().join("w")).unwrap();
        let mut last = Vec::new();
        for _ in 0..10 {
            if watch.over().is_some() {
                break;
            }
            last.extend(watch.wait(Duration::from_secs(5)).unwrap());
        }
        assert!(
            last.iter()
                .any(|e| (e.kind, e.name.as_str()) == (EventKind::Remove, "sub/f")),
            "{last:?}"
        );
        assert_eq!(watch.read().unwrap_err().kind, FsErrorKind::NotFound);
        // /work gone (the session closed): the watch says so.
        let mut watch = work.watch(&WorkPath::parse("").unwrap(), false).unwrap();
        drop(work);
        assert!(watch
            .read()
            .unwrap_err()
            .message
            .contains("session was closed"));
    }

    /// A directory removed when the test ends.
    struct Scratch(std::path::PathBuf);
    impl Scratch {
        fn path(&self) -> &std::path::Path {
            &self.0
        }
    }
    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
