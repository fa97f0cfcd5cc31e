//! Where the `codecage` parent cgroup goes: at the root of the hierarchy, or under a cgroup
//! delegated to codecage (systemd's `Delegate=yes`, "Control Group APIs and Delegation").
//!
//! systemd's rule for a delegated cgroup: its subtree belongs to the unit's processes, and
//! they must not create cgroups outside it. Because of cgroup v2's no-internal-process rule
//! (a cgroup that enables controllers for its children may hold no process itself), the
//! unit's own processes move into a leaf of their own. So `codecage serve`, started in a
//! delegated cgroup `<unit>`, makes:
//!
//! ```text
//! <unit>/                     trusted.delegate=1 (systemd), +memory +cpu +pids for children
//! <unit>/supervisor           the server itself (all its threads), and what it forks
//! <unit>/codecage/run-...     the sandboxes, one cgroup each, as at the root otherwise
//! ```
//!
//! Only on pure cgroup v2. On v1 and hybrid hosts the limits live in the v1 controller
//! hierarchies, which systemd does not delegate safely (its documentation: delegation is
//! only complete on the unified hierarchy; on v1 a delegated unit gets the name=systemd
//! tree, plus controller directories other managers may rearrange), and the unified tree of
//! a hybrid host has no controllers to enable. There codecage keeps its `codecage` parent
//! at the root of each hierarchy, as before.
//!
//! The process-wide choice is made once, by the server at start ([`place_server`]); until
//! then (and in every other process: `codecage run`, `codecage doctor`, the library) the
//! parent is at the hierarchy's root. The one-shot CLI does not move itself: its cgroup is
//! its caller's (a shell, a CI step), shared with processes it did not start, so it could
//! neither empty that cgroup nor enable controllers in it.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::{enable_controllers, layout, mkdir_if_missing, read, write, Layout};

/// The leaf a server in a delegated cgroup moves itself into.
pub const SUPERVISOR: &str = "supervisor";

/// `[cgroups] parent` of the server's configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ParentMode {
    /// Under the server's own cgroup when it is delegated (the `trusted.delegate` or
    /// `user.delegate` xattr systemd sets), else at the root.
    #[default]
    Auto,
    /// Under the server's own cgroup, which the operator says is delegated (a manager other
    /// than systemd); an error where that cannot be done.
    Delegated,
    /// At the root of the hierarchy, whatever the server's cgroup.
    Root,
}

impl ParentMode {
    pub const ALLOWED: &'static str = "\"auto\", \"delegated\" or \"root\"";

    pub fn parse(text: &str) -> Result<ParentMode, String> {
        match text {
            "auto" => Ok(ParentMode::Auto),
            "delegated" => Ok(ParentMode::Delegated),
            "root" => Ok(ParentMode::Root),
            other => Err(format!(
                "[cgroups] parent = {other:?} is not a parent mode; allowed: {}",
                ParentMode::ALLOWED
            )),
        }
    }
}

impl fmt::Display for ParentMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ParentMode::Auto => "auto",
            ParentMode::Delegated => "delegated",
            ParentMode::Root => "root",
        })
    }
}

/// The cgroup the `codecage` parent is made in on v2, once the server chose one.
static BASE: OnceLock<PathBuf> = OnceLock::new();

/// The directory the v2 `codecage` parent is made in: the delegated cgroup the server chose,
/// else `root`.
pub(super) fn v2_base(root: &Path) -> PathBuf {
    BASE.get().cloned().unwrap_or_else(|| root.to_path_buf())
}

/// The directories holding this process's run cgroups (`.../codecage`), one per hierarchy
/// its runs use: what the sweep reads, what `codecage doctor` reports.
pub fn parents(layout: &Layout) -> Vec<PathBuf> {
    let mut parents = Vec::new();
    match layout {
        Layout::V2 { root } => parents.push(v2_base(root).join(super::PARENT)),
        Layout::V1 { controllers } | Layout::Hybrid { controllers, .. } => {
            parents.extend(
                controllers
                    .iter()
                    .map(|(_, mount)| mount.join(super::PARENT)),
            );
            if let Layout::Hybrid { unified, .. } = layout {
                parents.push(unified.join(super::PARENT));
            }
        }
        Layout::None => {}
    }
    parents.dedup();
    parents
}

/// This process's cgroup in the unified hierarchy mounted at `root` (the `0::` line of
/// /proc/self/cgroup; relative to the cgroup namespace's root, as the mount is).
pub fn own_cgroup(root: &Path) -> Option<PathBuf> {
    let text = read(Path::new("/proc/self/cgroup"))?;
    let path = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    let relative = path.trim().trim_start_matches('/');
    // "(deleted)" and the like: a cgroup removed under us is no place to build in.
    if relative.contains(' ') {
        return None;
    }
    Some(root.join(relative))
}

/// Whether `dir` carries systemd's delegation mark: `trusted.delegate` (systemd 251 and
/// later; Debian 12 has 252) or `user.delegate` (254 and later, readable without
/// privileges) set to "1", the order systemd's own cg_is_delegated() reads them in.
pub fn is_delegated(dir: &Path) -> bool {
    ["trusted.delegate", "user.delegate"]
        .iter()
        .any(|name| crate::sys::get_xattr(dir, name).is_ok_and(|v| v == b"1"))
}

/// Marks `dir` as delegated, as systemd does for a unit with `Delegate=yes` (sets
/// `trusted.delegate` to "1"; root only). For managers other than systemd, and for tests.
pub fn mark_delegated(dir: &Path) -> std::io::Result<()> {
    crate::sys::set_xattr(dir, "trusted.delegate", b"1")
}

/// Where the server put the sandboxes' parent, for its log and for tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The `codecage` parent directory of the unified hierarchy (or of the first v1 one).
    pub parent: PathBuf,
    /// The delegated cgroup the parent is under, None at the root.
    pub delegated: Option<PathBuf>,
    /// Why it is there.
    pub reason: String,
}

/// Chooses where this server's sandboxes go, once, before it starts anything: with a
/// delegated cgroup (per `mode`), moves this process (all its threads) into
/// `<delegated>/supervisor`, enables memory, cpu and pids for `<delegated>`'s children and
/// makes every later run cgroup `<delegated>/codecage/<run>`. Call it before any thread or
/// child of the server that must not move (it moves the whole process).
pub fn place_server(mode: ParentMode) -> Result<Placement, String> {
    let layout = layout();
    let root_parent = |reason: String| {
        Ok(Placement {
            parent: parents(layout).into_iter().next().unwrap_or_default(),
            delegated: None,
            reason,
        })
    };
    if mode == ParentMode::Root {
        return root_parent("[cgroups] parent = \"root\"".into());
    }
    let Layout::V2 { root } = layout else {
        let why = format!(
            "this host's cgroups are {layout}: delegation is used on pure cgroup v2 only (the limits of v1 \
             and hybrid hosts live in v1 hierarchies systemd does not delegate safely)"
        );
        return match mode {
            ParentMode::Delegated => Err(format!(
                "[cgroups] parent = \"delegated\" cannot be honoured: {why}; use \"auto\" or \"root\""
            )),
            _ => root_parent(why),
        };
    };
    let Some(own) = own_cgroup(root) else {
        return match mode {
            ParentMode::Delegated => Err(
                "[cgroups] parent = \"delegated\": this process's cgroup cannot be read from /proc/self/cgroup"
                    .into(),
            ),
            _ => root_parent("this process's cgroup is unknown".into()),
        };
    };
    // Already in the leaf (a restart in place, or systemd's DelegateSubgroup=supervisor).
    let in_leaf = own.file_name().is_some_and(|n| n == SUPERVISOR)
        && own
            .parent()
            .is_some_and(|p| p != root.as_path() && is_delegated(p));
    let delegated = if in_leaf {
        own.parent().map(Path::to_path_buf).unwrap_or_default()
    } else {
        own.clone()
    };
    if delegated == *root {
        return match mode {
            ParentMode::Delegated => Err(format!(
                "[cgroups] parent = \"delegated\": this process is in the root cgroup ({}), not in a cgroup of \
                 its own; start it in a delegated one (a systemd unit with Delegate=yes) or use \"auto\" or \"root\"",
                root.display()
            )),
            _ => root_parent("the server is in the root cgroup".into()),
        };
    }
    if mode == ParentMode::Auto && !in_leaf && !is_delegated(&own) {
        return root_parent(format!(
            "the server's cgroup {} is not delegated (no trusted.delegate or user.delegate xattr)",
            own.display()
        ));
    }
    use_delegated(&delegated, !in_leaf)?;
    BASE.set(delegated.clone())
        .map_err(|_| "the cgroup parent was chosen twice".to_string())?;
    Ok(Placement {
        parent: delegated.join(super::PARENT),
        delegated: Some(delegated.clone()),
        reason: format!("{} is delegated to codecage", delegated.display()),
    })
}

/// Moves this process into `<delegated>/supervisor` (when `move_self`) and enables the
/// controllers codecage uses for `<delegated>`'s children.
fn use_delegated(delegated: &Path, move_self: bool) -> Result<(), String> {
    let leaf = delegated.join(SUPERVISOR);
    if move_self {
        mkdir_if_missing(&leaf).map_err(|e| e.to_string())?;
        // cgroup.procs moves the whole process, every thread of it.
        write(&leaf.join("cgroup.procs"), &std::process::id().to_string())
            .map_err(|e| e.to_string())?;
    }
    let available = read(&delegated.join("cgroup.controllers")).unwrap_or_default();
    let wanted: Vec<&str> = ["memory", "cpu", "pids"]
        .into_iter()
        .filter(|c| available.split_whitespace().any(|a| a == *c))
        .collect();
    // A controller the delegated cgroup lacks is reported when a run asks for its limit.
    enable_controllers(delegated, &wanted).map_err(|e| {
        format!(
            "{e} (codecage moved itself into {}; another process in {} keeps it from enabling \
             controllers: give codecage a unit of its own, or set [cgroups] parent = \"root\")",
            leaf.display(),
            delegated.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parent_modes_parse_and_bad_ones_name_the_allowed() {
        assert_eq!(ParentMode::parse("auto"), Ok(ParentMode::Auto));
        assert_eq!(ParentMode::parse("delegated"), Ok(ParentMode::Delegated));
        assert_eq!(ParentMode::parse("root"), Ok(ParentMode::Root));
        let e = ParentMode::parse("unit").unwrap_err();
        assert!(
            e.contains("\"unit\"") && e.contains("\"auto\", \"delegated\" or \"root\""),
            "{e}"
        );
    }

    #[test]
    fn until_a_server_chooses_the_parent_is_at_the_root() {
        let root = Path::new("/sys/fs/cgroup");
        assert_eq!(v2_base(root), root);
        let v2 = Layout::V2 { root: root.into() };
        assert_eq!(parents(&v2), vec![root.join("codecage")]);
    }
}
