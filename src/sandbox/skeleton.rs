//! What the sandbox's tmpfs file systems hold before the init attaches them: the
//! directories, files and symlinks that depend only on the spec and the host (the stage's
//! /proc and /sys files, the host rootfs's mount points, symlinks and /etc, /dev's
//! placeholders and links). The launcher writes them on each detached tmpfs through its fd
//! (src/launcher/fill.rs) after "go", while the raw child executes the init, so the init's
//! part of a start is mounts: it binds onto what it finds.
//!
//! Everything is owned by the sandbox's root, as if the init had made it, and has the mode
//! given here whatever the caller's umask.

use std::path::{Path, PathBuf};

use super::procfs;
use super::rootfs::{resolv_conf, synthesized_etc, HOST_ETC, HOST_TOP};
use crate::protocol::Tmpfs;
use crate::spec::{Rootfs, SandboxSpec};

/// One entry, by its path relative to its file system's root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Entry {
    Dir(String, u32),
    /// A regular file, mode 0644.
    File(String, Vec<u8>),
    /// A symlink to the target.
    Link(String, PathBuf),
}

impl Entry {
    pub(crate) fn path(&self) -> &str {
        match self {
            Entry::Dir(path, _) | Entry::File(path, _) | Entry::Link(path, _) => path,
        }
    }
}

/// Device nodes bound from the host's /dev onto empty files: the sandbox's /dev tmpfs is
/// nodev (and inside a user namespace mknod of a device is not allowed).
pub(super) const DEV_NODES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// The name on the stage of the gateway's resolv.conf, for an image's /etc.
pub(super) const RESOLV_CONF: &str = "resolv.conf";

/// What `which` holds for a sandbox of `spec`, parents before children. Reads the host's
/// /proc (cpuinfo, stat, meminfo), /dev and the host rootfs's top level and /etc entries
/// (symlinks are copied, the rest become mount points).
pub(crate) fn entries(which: Tmpfs, spec: &SandboxSpec) -> Result<Vec<Entry>, String> {
    let host = matches!(spec.rootfs, Rootfs::Host);
    let mut entries = Vec::new();
    match which {
        Tmpfs::Stage => {
            procfs::stage_entries(spec, &mut entries);
            if !host && spec.network.mode.has_gateway() {
                entries.push(Entry::File(
                    RESOLV_CONF.into(),
                    resolv_conf(true).into_bytes(),
                ));
            }
            if spec.drivers {
                let dir = crate::spec::DRIVERS_DIR.trim_start_matches('/');
                dirs_to(&mut entries, dir);
                for (name, content) in crate::drivers::FILES {
                    entries.push(Entry::File(
                        format!("{dir}/{name}"),
                        content.as_bytes().into(),
                    ));
                }
            }
            if host {
                // Where the host's /etc is bound (Stage::bind_host_etc).
                entries.push(Entry::Dir("etc".into(), 0o755));
            }
        }
        Tmpfs::Root => {
            for name in HOST_TOP {
                mount_point(&mut entries, Path::new("/"), "", name)?;
            }
            entries.push(Entry::Dir("etc".into(), 0o755));
            for (name, content) in synthesized_etc(&spec.hostname, spec.network.mode.has_gateway())
            {
                entries.push(Entry::File(format!("etc/{name}"), content.into_bytes()));
            }
            for name in HOST_ETC {
                mount_point(&mut entries, Path::new("/etc"), "etc/", name)?;
            }
            for (name, mode) in [
                ("tmp", 0o1777),
                ("work", 0o755),
                ("dev", 0o755),
                ("proc", 0o555),
                ("sys", 0o555),
            ] {
                entries.push(Entry::Dir(name.into(), mode));
            }
            if spec.drivers {
                entries.push(Entry::Dir("run".into(), 0o755));
            }
        }
        Tmpfs::Dev => {
            for node in DEV_NODES {
                if Path::new("/dev").join(node).exists() {
                    entries.push(Entry::File((*node).into(), Vec::new()));
                }
            }
            for (name, target) in [
                ("fd", "/proc/self/fd"),
                ("stdin", "/proc/self/fd/0"),
                ("stdout", "/proc/self/fd/1"),
                ("stderr", "/proc/self/fd/2"),
                ("ptmx", "pts/ptmx"),
            ] {
                entries.push(Entry::Link(name.into(), target.into()));
            }
            entries.push(Entry::Dir("shm".into(), 0o1777));
            entries.push(Entry::Dir("pts".into(), 0o755));
        }
        Tmpfs::Tmp | Tmpfs::Work | Tmpfs::Shm | Tmpfs::Empty => {}
    }
    parents_first(&entries)?;
    Ok(entries)
}

/// Every entry's parent is a directory made before it (or the root): the launcher writes
/// them as host root, by paths relative to the file system, so none of them may pass
/// through a symlink it made (an absolute target resolves on the host: `lib -> /usr/lib`).
fn parents_first(entries: &[Entry]) -> Result<(), String> {
    for (at, entry) in entries.iter().enumerate() {
        let Some((parent, _)) = entry.path().rsplit_once('/') else {
            continue;
        };
        if !entries[..at]
            .iter()
            .any(|e| matches!(e, Entry::Dir(path, _) if path == parent))
        {
            return Err(format!(
                "internal error: {} is not under a directory made before it",
                entry.path()
            ));
        }
    }
    Ok(())
}

/// The directories leading to `path` (itself included), mode 0755, that `entries` lacks
/// (a non-directory in the way is caught by [`parents_first`]).
pub(super) fn dirs_to(entries: &mut Vec<Entry>, path: &str) {
    let mut at = 0;
    while at < path.len() {
        let end = path[at..].find('/').map_or(path.len(), |i| at + i);
        let dir = &path[..end];
        if !entries.iter().any(|e| e.path() == dir) {
            entries.push(Entry::Dir(dir.to_string(), 0o755));
        }
        at = end + 1;
    }
}

/// `from/name` of the host recreated at `to` + `name`: a symlink as a symlink, a directory or
/// file as an empty one for the init to bind it onto. A missing one is left out.
fn mount_point(entries: &mut Vec<Entry>, from: &Path, to: &str, name: &str) -> Result<(), String> {
    let src = from.join(name);
    let meta = match std::fs::symlink_metadata(&src) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("cannot inspect {}: {e}", src.display())),
    };
    let dst = format!("{to}{name}");
    if let Some((parent, _)) = dst.rsplit_once('/') {
        dirs_to(entries, parent);
    }
    entries.push(if meta.file_type().is_symlink() {
        let target = std::fs::read_link(&src)
            .map_err(|e| format!("cannot read the link {}: {e}", src.display()))?;
        Entry::Link(dst, target)
    } else if meta.is_dir() {
        Entry::Dir(dst, 0o755)
    } else {
        Entry::File(dst, Vec::new())
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_plan_makes_parents_first_and_no_path_twice() {
        use crate::network::Mode;
        for (rootfs, drivers, network) in [
            (Rootfs::Host, false, Mode::None),
            (Rootfs::Host, true, Mode::Restricted),
            (Rootfs::Dir("/nonexistent".into()), true, Mode::Restricted),
            (Rootfs::Dir("/nonexistent".into()), false, Mode::None),
        ] {
            let mut spec = SandboxSpec {
                rootfs,
                drivers,
                ..SandboxSpec::default()
            };
            spec.network.mode = network;
            for which in Tmpfs::plan(&spec) {
                let entries = entries(which, &spec).unwrap();
                let mut paths: Vec<&str> = entries.iter().map(Entry::path).collect();
                paths.sort();
                let count = paths.len();
                paths.dedup();
                assert_eq!(paths.len(), count, "{which:?}: a path twice: {entries:?}");
            }
        }
    }

    #[test]
    fn a_path_through_a_link_or_file_is_refused() {
        let through_link = [
            Entry::Link("lib".into(), "/usr/lib".into()),
            Entry::File("lib/x".into(), Vec::new()),
        ];
        assert!(parents_first(&through_link).is_err());
        let under_file = [
            Entry::File("a".into(), Vec::new()),
            Entry::Dir("a/b".into(), 0o755),
        ];
        assert!(parents_first(&under_file).is_err());
    }

    #[test]
    fn parents_come_once_and_first() {
        let mut entries = vec![Entry::Dir("etc".into(), 0o755)];
        dirs_to(&mut entries, "etc/ssl/certs");
        dirs_to(&mut entries, "etc/ssl");
        let paths: Vec<&str> = entries.iter().map(Entry::path).collect();
        assert_eq!(paths, ["etc", "etc/ssl", "etc/ssl/certs"]);
    }
}
