//! Which cgroup layout this host has, and where its hierarchies are mounted.
//!
//! - **v2** (unified): `/sys/fs/cgroup` is cgroup2 and holds every controller.
//! - **v1** (legacy): one cgroup v1 hierarchy per controller (or per group of them, such as
//!   `cpu,cpuacct`), no cgroup2 mount.
//! - **hybrid**: v1 hierarchies for the controllers plus a cgroup2 mount (usually
//!   `/sys/fs/cgroup/unified`) without them, which still offers `cgroup.kill`,
//!   `cgroup.events` and `CLONE_INTO_CGROUP`.
//!
//! The mounts come from /proc/self/mountinfo, so non-standard mount points work too.

use std::fmt;
use std::path::{Path, PathBuf};

/// A v1 controller codecage uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Controller {
    Memory,
    Cpu,
    Cpuacct,
    Pids,
}

impl Controller {
    pub const ALL: [Controller; 4] = [
        Controller::Memory,
        Controller::Cpu,
        Controller::Cpuacct,
        Controller::Pids,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Controller::Memory => "memory",
            Controller::Cpu => "cpu",
            Controller::Cpuacct => "cpuacct",
            Controller::Pids => "pids",
        }
    }
}

/// The host's cgroup layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// cgroup v2 only, mounted at the path.
    V2 { root: PathBuf },
    /// cgroup v1 hierarchies only.
    V1 {
        controllers: Vec<(Controller, PathBuf)>,
    },
    /// v1 hierarchies for the controllers, and a cgroup2 mount without them.
    Hybrid {
        controllers: Vec<(Controller, PathBuf)>,
        unified: PathBuf,
    },
    /// No cgroup filesystem at all.
    None,
}

impl Layout {
    pub fn name(&self) -> &'static str {
        match self {
            Layout::V2 { .. } => "v2",
            Layout::V1 { .. } => "v1",
            Layout::Hybrid { .. } => "hybrid",
            Layout::None => "none",
        }
    }

    /// The v1 mount of `controller`, if there is one.
    pub fn v1(&self, controller: Controller) -> Option<&Path> {
        match self {
            Layout::V1 { controllers } | Layout::Hybrid { controllers, .. } => controllers
                .iter()
                .find(|(c, _)| *c == controller)
                .map(|(_, p)| p.as_path()),
            _ => None,
        }
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Layout::V2 { root } => write!(f, "v2 (unified hierarchy at {})", root.display()),
            Layout::V1 { controllers } | Layout::Hybrid { controllers, .. } => {
                write!(f, "{} (", self.name())?;
                for (i, (c, p)) in controllers.iter().enumerate() {
                    write!(
                        f,
                        "{}{}: {}",
                        if i > 0 { ", " } else { "" },
                        c.name(),
                        p.display()
                    )?;
                }
                if let Layout::Hybrid { unified, .. } = self {
                    write!(f, "; controller-less cgroup2 at {}", unified.display())?;
                }
                write!(f, ")")
            }
            Layout::None => write!(f, "none (no cgroup filesystem is mounted)"),
        }
    }
}

/// Reads the layout from /proc/self/mountinfo.
pub fn detect() -> Layout {
    match std::fs::read_to_string("/proc/self/mountinfo") {
        Ok(text) => parse_mountinfo(&text),
        Err(_) => Layout::None,
    }
}

/// The layout described by a mountinfo text. The first mount of each hierarchy wins.
pub fn parse_mountinfo(text: &str) -> Layout {
    let mut unified: Option<PathBuf> = None;
    let mut controllers: Vec<(Controller, PathBuf)> = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(dash) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        let (Some(mount_point), Some(fstype), Some(options)) =
            (fields.get(4), fields.get(dash + 1), fields.get(dash + 3))
        else {
            continue;
        };
        // Only a hierarchy's root can host our cgroups (a bind of a sub-cgroup cannot).
        if fields.get(3) != Some(&"/") {
            continue;
        }
        let mount_point = PathBuf::from(unescape(mount_point));
        match *fstype {
            "cgroup2" if unified.is_none() => unified = Some(mount_point),
            "cgroup" => {
                for option in options.split(',') {
                    let found = Controller::ALL.iter().find(|c| c.name() == option);
                    if let Some(c) = found {
                        if !controllers.iter().any(|(have, _)| have == c) {
                            controllers.push((*c, mount_point.clone()));
                        }
                    }
                }
            }
            _ => {}
        }
    }
    controllers.sort();
    match (unified, controllers.is_empty()) {
        (Some(root), true) => Layout::V2 { root },
        (Some(unified), false) => Layout::Hybrid {
            controllers,
            unified,
        },
        (None, false) => Layout::V1 { controllers },
        (None, true) => Layout::None,
    }
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(field: &str) -> String {
    let mut out = String::new();
    let mut chars = field.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' {
            let digits: String = chars.clone().take(3).collect();
            if let Ok(value) = u8::from_str_radix(&digits, 8) {
                out.push(value as char);
                chars.nth(2);
                continue;
            }
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn a_hybrid_host_is_recognised() {
        let layout = parse_mountinfo(HYBRID);
        assert_eq!(layout.name(), "hybrid");
        assert_eq!(
            layout.v1(Controller::Memory),
            Some(Path::new("/sys/fs/cgroup/memory"))
        );
        assert_eq!(
            layout.v1(Controller::Cpuacct),
            Some(Path::new("/sys/fs/cgroup/cpuacct"))
        );
        let Layout::Hybrid { unified, .. } = &layout else {
            unreachable!()
        };
        assert_eq!(unified, Path::new("/sys/fs/cgroup/unified"));
    }

    #[test]
    fn a_pure_v2_host_is_recognised() {
        let text = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n";
        assert_eq!(
            parse_mountinfo(text),
            Layout::V2 {
                root: "/sys/fs/cgroup".into()
            }
        );
    }

    #[test]
    fn combined_v1_hierarchies_map_each_controller() {
        let text = "25 20 0:21 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n\
                    26 20 0:22 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        let layout = parse_mountinfo(text);
        assert_eq!(layout.name(), "v1");
        assert_eq!(layout.v1(Controller::Cpu), layout.v1(Controller::Cpuacct));
        assert_eq!(layout.v1(Controller::Pids), None);
    }

    #[test]
    fn a_bind_of_a_sub_cgroup_is_not_a_hierarchy_root() {
        let text = "30 23 0:26 /user.slice /mnt/cg rw - cgroup2 cgroup2 rw\n";
        assert_eq!(parse_mountinfo(text), Layout::None);
    }

    #[test]
    fn escaped_mount_points_are_decoded() {
        assert_eq!(unescape("/a\\040b"), "/a b");
    }
}
