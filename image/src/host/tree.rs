//! Removing directory trees without ever deleting through a mount point; temporary trees
//! that every failure and interrupt path removes; what processes that are gone left behind.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use super::{kill_processes_rooted_in, status, warn};

/// Mount points at or below `dir` in our mount namespace, deepest first.
pub fn mounts_below(dir: &Path) -> Vec<PathBuf> {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape_mountinfo(p)))
        .filter(|p| p.starts_with(dir))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let digit = |c: u8| u32::from(c - b'0');
            out.push((digit(b[i + 1]) * 64 + digit(b[i + 2]) * 8 + digit(b[i + 3])) as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `rm -rf path` (a directory or a file), but never through a mount point.
///
/// A chroot build killed halfway can leave /proc, /sys or /dev mounted inside its tree;
/// deleting through such a bind mount would delete the host's own files. Builds mount in
/// private mount namespaces, so this should find nothing, but removing a tree is too
/// dangerous to rely on that: what is mounted below is detached, and if anything stays,
/// nothing is removed.
pub fn remove_tree(path: &Path) -> Result<()> {
    let Ok(meta) = fs::symlink_metadata(path) else {
        return Ok(());
    };
    for m in mounts_below(path) {
        if let Ok(c) = std::ffi::CString::new(m.as_os_str().as_encoded_bytes()) {
            // SAFETY: plain syscall with a valid NUL-terminated path.
            unsafe {
                libc::umount2(c.as_ptr(), libc::MNT_DETACH);
            }
        }
    }
    let left = mounts_below(path);
    if !left.is_empty() {
        bail!(
            "not removing {}: still mounted below it: {left:?}",
            path.display()
        );
    }
    if meta.is_dir() {
        fs::remove_dir_all(path).with_context(|| format!("removing {}", path.display()))
    } else {
        fs::remove_file(path).with_context(|| format!("removing {}", path.display()))
    }
}

/// A tree (a directory, or a file) removed when dropped unless kept: a build in progress,
/// the VM's control directory, so that every failure and interrupt path cleans up.
/// Processes still running with their root inside it (a daemon that a package script
/// started in a chroot) are killed first, so that the mounts they hold go with them.
pub struct TempTree {
    path: PathBuf,
    keep: bool,
}

impl TempTree {
    /// `path`, which need not exist yet; whatever is there already is removed.
    pub fn at(path: PathBuf) -> Result<TempTree> {
        if fs::symlink_metadata(&path).is_ok() {
            remove_tree(&path)?;
        }
        Ok(TempTree { path, keep: false })
    }

    /// A new directory `parent/<prefix><pid>-<n>` (unique within this process; [`orphans`]
    /// finds it once the process is gone).
    pub fn create_in(parent: &Path, prefix: &str) -> Result<TempTree> {
        static N: AtomicU32 = AtomicU32::new(0);
        fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        let n = N.fetch_add(1, Ordering::SeqCst);
        let tree = TempTree::at(parent.join(format!("{prefix}{}-{n}", std::process::id())))?;
        fs::create_dir(&tree.path).with_context(|| format!("creating {}", tree.path.display()))?;
        Ok(tree)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Leave the tree in place (it was renamed into its final place, say).
    pub fn keep(&mut self) {
        self.keep = true;
    }
}

impl Drop for TempTree {
    fn drop(&mut self) {
        if self.keep || fs::symlink_metadata(&self.path).is_err() {
            return;
        }
        if kill_processes_rooted_in(&self.path) > 0 {
            // Time for the kernel to tear down what they held.
            std::thread::sleep(Duration::from_millis(200));
        }
        if let Err(e) = remove_tree(&self.path) {
            warn(format!("{e:#}"));
        }
    }
}

/// The entries of `dir` that processes which are gone left behind: those whose name
/// `owner` maps to the pid of a process that no longer runs (never this process).
pub fn orphans(dir: &Path, owner: impl Fn(&str) -> Option<u32>) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|entry| {
            owner(&entry.file_name().to_string_lossy())
                .is_some_and(|pid| pid != std::process::id() && !pid_alive(pid))
        })
        .map(|entry| entry.path())
        .collect()
}

/// Is a process with this pid alive (in our pid namespace)?
fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Remove a leftover that [`orphans`] found, with a status line; a failure is a warning.
pub fn remove_stale(path: &Path) {
    status("Removing", format!("stale {}", path.display()));
    if let Err(e) = remove_tree(path) {
        warn(format!("{e:#}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape_mountinfo("/a\\040b\\134c"), "/a b\\c");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
    }

    #[test]
    fn temp_trees_go_unless_kept() {
        let parent =
            std::env::temp_dir().join(format!("codecage-image-tree-test-{}", std::process::id()));
        let a = TempTree::create_in(&parent, "a-").unwrap();
        let b = TempTree::create_in(&parent, "a-").unwrap();
        assert_ne!(a.path(), b.path());
        fs::write(a.path().join("f"), "x").unwrap();
        let a_path = a.path().to_path_buf();
        let mut b = b;
        b.keep();
        let b_path = b.path().to_path_buf();
        drop((a, b));
        assert!(!a_path.exists());
        assert!(b_path.is_dir());
        // Our own leftovers are never orphans; a pid that cannot run is.
        let owner = |name: &str| name.strip_prefix("a-")?.split('-').next()?.parse().ok();
        assert!(orphans(&parent, owner).is_empty());
        fs::create_dir(parent.join(format!("a-{}-0", u32::MAX))).unwrap();
        assert_eq!(orphans(&parent, owner).len(), 1);
        remove_tree(&parent).unwrap();
        assert!(!parent.exists());
    }
}
