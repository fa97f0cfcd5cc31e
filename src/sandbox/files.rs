//! The init's side of files in and out (see `crate::files`): everything under /work is
//! reached one component at a time from a directory fd, with O_NOFOLLOW, and on /work's
//! own file system only. The init runs as the sandbox's root after pivot_root: even a path
//! it were tricked into would lie inside the sandbox; none can be, because no symlink is
//! ever followed.

use std::fs::File;
use std::io::Read;
use std::os::fd::OwnedFd;

use nix::errno::Errno;
use nix::fcntl::AtFlags;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fstat, fstatat, FileStat, Mode, SFlag};
use nix::unistd::{fchownat, unlinkat, UnlinkatFlags};

use crate::files::{InputFile, OutputRules, SkipReason, SkippedFile};
use crate::spec::SANDBOX_UID;

const WORK: &str = "/work";

/// How a file the payload could have planted is opened for reading: never through a
/// symlink, never blocking (a FIFO swapped in), never becoming a controlling terminal.
const READ_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_NONBLOCK)
    .union(OFlag::O_NOCTTY)
    .union(OFlag::O_CLOEXEC);

/// How deep the output directory is walked.
const MAX_DEPTH: usize = 16;
/// How many entries the walk looks at, at most: a million empty files cost the init no
/// more than this.
const MAX_VISITED: usize = 100_000;
/// How many skipped files are listed, at most.
const MAX_SKIPPED: usize = 1000;

/// A file taken from the output directory, as the init sends it.
pub struct Taken {
    pub path: String,
    pub data: Vec<u8>,
}

fn open_work() -> Result<OwnedFd, String> {
    nix::fcntl::open(
        WORK,
        OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("cannot open /work: {e}"))
}

/// Opens directory `name` under `dir` without following a symlink and without leaving
/// `dev`'s file system.
fn open_dir_at(dir: &OwnedFd, name: &str, dev: u64) -> Result<OwnedFd, Errno> {
    let fd = openat(
        dir,
        name,
        OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    if fstat(&fd)?.st_dev != dev {
        return Err(Errno::EXDEV);
    }
    Ok(fd)
}

/// Writes each input file under /work, owned by the sandbox user. Parent directories are
/// made as needed; an existing file of the same name is replaced, never followed.
pub fn write_inputs(files: &[InputFile]) -> Result<(), String> {
    let work = open_work()?;
    let dev = fstat(&work).map_err(|e| e.to_string())?.st_dev;
    for file in files {
        crate::files::check_input_path(&file.path)?;
        let fail = |e: &dyn std::fmt::Display| format!("cannot write /work/{}: {e}", file.path);
        let mut components: Vec<&str> = file.path.split('/').collect();
        let name = components.pop().expect("a checked path has a name");
        let mut dir = open_dir_at(&work, ".", dev).map_err(|e| fail(&e))?;
        for component in components {
            match nix::sys::stat::mkdirat(&dir, component, Mode::from_bits_truncate(0o755)) {
                Ok(()) => {
                    chown_at(&dir, component).map_err(|e| fail(&e))?;
                }
                Err(Errno::EEXIST) => {}
                Err(e) => return Err(fail(&e)),
            }
            dir = open_dir_at(&dir, component, dev).map_err(|e| match e {
                Errno::ELOOP | Errno::ENOTDIR => fail(&format!("{component} is not a directory")),
                e => fail(&e),
            })?;
        }
        match unlinkat(&dir, name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => {}
            Err(e) => return Err(fail(&e)),
        }
        let fd = openat(
            &dir,
            name,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o644),
        )
        .map_err(|e| fail(&e))?;
        let mut out = File::from(fd);
        std::io::Write::write_all(&mut out, &file.data).map_err(|e| fail(&e))?;
        let id = Some(SANDBOX_UID);
        std::os::unix::fs::fchown(&out, id, id).map_err(|e| fail(&e))?;
    }
    Ok(())
}

fn chown_at(dir: &OwnedFd, name: &str) -> nix::Result<()> {
    let id = nix::unistd::Uid::from_raw(SANDBOX_UID);
    let gid = nix::unistd::Gid::from_raw(SANDBOX_UID);
    fchownat(dir, name, Some(id), Some(gid), AtFlags::AT_SYMLINK_NOFOLLOW)
}

/// What identifies a file's content without reading it: inode, size, mtime and ctime (in
/// ns). A write changes the size or the times; with the coarse clock tmpfs stamps files
/// with, a write of the same size in the same tick as the mark could go unseen, but since
/// 6.13 a file whose times were read (the mark reads them) gets fine-grained times on its
/// next change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    ino: u64,
    size: i64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl Stamp {
    fn of(stat: &FileStat) -> Stamp {
        let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
        Stamp {
            ino: stat.st_ino,
            size: stat.st_size,
            mtime_ns: ns(stat.st_mtime, stat.st_mtime_nsec),
            ctime_ns: ns(stat.st_ctime, stat.st_ctime_nsec),
        }
    }
}

/// The output directory's regular files as a session call begins.
pub type Marks = std::collections::HashMap<String, Stamp>;

/// Notes the output directory's files (walked as [`collect`] walks it, nothing read).
pub fn mark(rules: &OutputRules) -> Marks {
    let mut marks = Marks::new();
    walk(rules, None, Some(&mut marks));
    marks
}

/// The output directory's files (with `before`, only those new or changed since that
/// mark): the ones taken, and the ones skipped with why.
pub fn collect(rules: &OutputRules, before: Option<&Marks>) -> (Vec<Taken>, Vec<SkippedFile>) {
    walk(rules, before, None)
}

fn walk(
    rules: &OutputRules,
    before: Option<&Marks>,
    marking: Option<&mut Marks>,
) -> (Vec<Taken>, Vec<SkippedFile>) {
    let mut walk = Walk {
        rules,
        before,
        marking,
        taken: Vec::new(),
        skipped: Vec::new(),
        total: 0,
        dev: 0,
        visited: 0,
    };
    let Ok(work) = open_work() else {
        return (Vec::new(), Vec::new());
    };
    let Ok(stat) = fstat(&work) else {
        return (Vec::new(), Vec::new());
    };
    walk.dev = stat.st_dev;
    // The output directory, reached like any other path: component by component.
    let mut dir = match open_dir_at(&work, ".", walk.dev) {
        Ok(d) => d,
        Err(_) => return (Vec::new(), Vec::new()),
    };
    for component in rules.dir.split('/').filter(|c| !c.is_empty()) {
        match open_dir_at(&dir, component, walk.dev) {
            Ok(next) => dir = next,
            // No output directory (or it is a symlink, or not ours): nothing to take.
            Err(_) => return (Vec::new(), Vec::new()),
        }
    }
    walk.dir(&dir, "", 0);
    (walk.taken, walk.skipped)
}

struct Walk<'a> {
    rules: &'a OutputRules,
    before: Option<&'a Marks>,
    marking: Option<&'a mut Marks>,
    taken: Vec<Taken>,
    skipped: Vec<SkippedFile>,
    total: u64,
    dev: u64,
    visited: usize,
}

impl Walk<'_> {
    fn skip(&mut self, path: String, reason: SkipReason) {
        // The list of skipped files is bounded too.
        if self.skipped.len() < MAX_SKIPPED {
            self.skipped.push(SkippedFile { path, reason });
        }
    }

    fn dir(&mut self, dir: &OwnedFd, prefix: &str, depth: usize) {
        let Ok(listing) = nix::dir::Dir::openat(
            dir,
            ".",
            OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) else {
            return;
        };
        let mut names: Vec<Vec<u8>> = Vec::new();
        for entry in listing.into_iter().flatten() {
            let name = entry.file_name().to_bytes().to_vec();
            if name == b"." || name == b".." {
                continue;
            }
            self.visited += 1;
            if self.visited > MAX_VISITED {
                let path = format!("{prefix}{}", String::from_utf8_lossy(&name));
                self.skip(path, SkipReason::CountCap);
                break;
            }
            names.push(name);
        }
        names.sort();
        for raw in names {
            let Ok(name) = String::from_utf8(raw) else {
                self.skip(format!("{prefix}<not UTF-8>"), SkipReason::BadName);
                continue;
            };
            let path = format!("{prefix}{name}");
            if path.len() > crate::files::MAX_PATH {
                self.skip(path, SkipReason::BadName);
                continue;
            }
            let Ok(stat) = fstatat(dir, name.as_str(), nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
            else {
                continue;
            };
            let kind = SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT;
            if stat.st_dev != self.dev {
                self.skip(path, SkipReason::OtherMount);
            } else if kind == SFlag::S_IFLNK {
                self.skip(path, SkipReason::Symlink);
            } else if kind == SFlag::S_IFDIR {
                if depth < MAX_DEPTH {
                    if let Ok(sub) = open_dir_at(dir, &name, self.dev) {
                        self.dir(&sub, &format!("{path}/"), depth + 1);
                    }
                }
            } else if kind != SFlag::S_IFREG {
                self.skip(path, SkipReason::NotRegular);
            } else {
                self.file(dir, &name, path, &stat);
            }
        }
    }

    fn file(&mut self, dir: &OwnedFd, name: &str, path: String, stat: &FileStat) {
        let stamp = Stamp::of(stat);
        if let Some(marks) = self.marking.as_mut() {
            marks.insert(path, stamp);
            return;
        }
        if self
            .before
            .is_some_and(|marks| marks.get(&path) == Some(&stamp))
        {
            return;
        }
        let ext = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
        let allowed =
            ext.is_some_and(|e| self.rules.types.iter().any(|t| t.eq_ignore_ascii_case(&e)));
        if !allowed {
            return self.skip(path, SkipReason::Pattern);
        }
        if stat.st_nlink > 1 {
            return self.skip(path, SkipReason::HardLink);
        }
        let size = stat.st_size.max(0) as u64;
        if size > self.rules.max_file {
            return self.skip(path, SkipReason::Size);
        }
        if self.taken.len() as u64 >= self.rules.max_files {
            return self.skip(path, SkipReason::CountCap);
        }
        if self.total + size > self.rules.max_total {
            return self.skip(path, SkipReason::TotalCap);
        }
        // O_NONBLOCK: were it swapped for a FIFO since the fstatat, the open would not
        // block; the fstat of the open file decides.
        let Ok(fd) = openat(dir, name, READ_FLAGS, Mode::empty()) else {
            return;
        };
        let Ok(opened) = fstat(&fd) else {
            return;
        };
        let opened_kind = SFlag::from_bits_truncate(opened.st_mode) & SFlag::S_IFMT;
        if opened_kind != SFlag::S_IFREG
            || opened.st_ino != stat.st_ino
            || opened.st_dev != self.dev
        {
            return self.skip(path, SkipReason::NotRegular);
        }
        // A second name made between the fstatat and the open.
        if opened.st_nlink > 1 {
            return self.skip(path, SkipReason::HardLink);
        }
        // At most the cap plus one byte: a file that grows while it is read stops there.
        let cap = self.rules.max_file.min(self.rules.max_total - self.total);
        let mut data = Vec::with_capacity(size.min(cap) as usize);
        let file = File::from(fd);
        if file.take(cap + 1).read_to_end(&mut data).is_err() {
            return;
        }
        if data.len() as u64 > cap {
            let reason = if cap < self.rules.max_file {
                SkipReason::TotalCap
            } else {
                SkipReason::Size
            };
            return self.skip(path, reason);
        }
        self.total += data.len() as u64;
        self.taken.push(Taken { path, data });
    }
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Entry {
    pub name: String,
    /// `file`, `dir`, `symlink` or `other`.
    #[serde(rename = "type")]
    pub kind: String,
    pub size: u64,
    /// Seconds since the epoch.
    pub mtime: i64,
}

/// Opens `path` (relative to /work; "" is /work) as a directory, safely; with /work's
/// device.
fn walk_to_dir(path: &str) -> Result<(OwnedFd, u64), String> {
    let work = open_work()?;
    let dev = fstat(&work).map_err(|e| e.to_string())?.st_dev;
    let mut dir = open_dir_at(&work, ".", dev).map_err(|e| e.to_string())?;
    for component in path.split('/').filter(|c| !c.is_empty()) {
        if component == "." || component == ".." {
            return Err(format!("{path:?}: no `.` or `..` components"));
        }
        dir = open_dir_at(&dir, component, dev).map_err(|e| match e {
            Errno::ENOENT => format!("/work/{path} does not exist"),
            Errno::ELOOP | Errno::ENOTDIR => format!("/work/{path} is not a directory"),
            e => format!("/work/{path}: {e}"),
        })?;
    }
    Ok((dir, dev))
}

/// Lists a directory under /work (at most `max` entries).
pub fn list(path: &str, max: usize) -> Result<Vec<Entry>, String> {
    let (dir, _) = walk_to_dir(path)?;
    let listing = nix::dir::Dir::openat(
        &dir,
        ".",
        OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| e.to_string())?;
    let mut entries = Vec::new();
    for entry in listing.into_iter().flatten() {
        let name = String::from_utf8_lossy(entry.file_name().to_bytes()).to_string();
        if name == "." || name == ".." {
            continue;
        }
        let Ok(stat) = fstatat(
            &dir,
            name.as_str(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        ) else {
            continue;
        };
        let kind = match SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT {
            SFlag::S_IFREG => "file",
            SFlag::S_IFDIR => "dir",
            SFlag::S_IFLNK => "symlink",
            _ => "other",
        };
        entries.push(Entry {
            name,
            kind: kind.into(),
            size: stat.st_size.max(0) as u64,
            mtime: stat.st_mtime,
        });
        if entries.len() >= max {
            break;
        }
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(entries)
}

/// Reads one regular file under /work, at most `max` bytes (an error past it).
pub fn read(path: &str, max: u64) -> Result<Vec<u8>, String> {
    crate::files::check_input_path(path)?;
    let (parent, name) = path.rsplit_once('/').unwrap_or(("", path));
    let (dir, dev) = walk_to_dir(parent)?;
    let fd = openat(&dir, name, READ_FLAGS, Mode::empty()).map_err(|e| match e {
        Errno::ENOENT => format!("/work/{path} does not exist"),
        Errno::ELOOP => format!("/work/{path} is a symlink, which is not followed"),
        e => format!("/work/{path}: {e}"),
    })?;
    let stat = fstat(&fd).map_err(|e| e.to_string())?;
    if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
        return Err(format!("/work/{path} is not a regular file"));
    }
    if stat.st_dev != dev {
        return Err(format!("/work/{path} is on another file system than /work"));
    }
    let mut data = Vec::new();
    File::from(fd)
        .take(max + 1)
        .read_to_end(&mut data)
        .map_err(|e| e.to_string())?;
    if data.len() as u64 > max {
        return Err(format!(
            "/work/{path} is over {} (outputs.max_size)",
            crate::units::format_size(max)
        ));
    }
    Ok(data)
}
