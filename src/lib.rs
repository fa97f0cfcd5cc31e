//! codecage runs untrusted Python, JavaScript and bash in a sandbox it builds itself from
//! Linux namespaces, with a read-only root, tmpfs scratch space, cgroup limits, landlock,
//! seccomp, a wall-clock timeout and an output cap. See ARCHITECTURE.md for the layers and
//! the setup order.
//!
//! ```no_run
//! // A program using the library must let codecage's init take over first:
//! codecage::dispatch_init();
//! let outcome = codecage::run(&codecage::Spec::new(vec!["echo".into(), "hi".into()]));
//! assert_eq!(outcome.stdout, b"hi\n");
//! ```
//!
//! The public surface is what a front end needs: [`knobs`] and [`profile`] (policy),
//! [`spec`] (the resolved sandbox), [`launcher`] (running it), [`outcome`] (the result),
//! [`runner`] (languages), [`units`], [`caller`] (who a front end acts for), and
//! [`doctor`] (what the host supports).

pub mod caller;
mod cgroup;
pub mod doctor;
mod drivers;
pub mod exec_ask;
pub mod exec_policy;
pub mod files;
pub mod format;
mod ids;
pub mod knobs;
pub mod launcher;
pub mod network;
pub mod outcome;
pub mod profile;
#[cfg(test)]
mod proptests;
mod protocol;
pub mod runner;
mod sandbox;
pub mod spec;
mod sys;

/// The CLI's own terminal: its size, and raw mode (`codecage session attach`).
pub mod tty {
    pub use crate::sys::{window_size, RawMode};
}
pub mod units;
pub mod workdir;

/// Where the sandboxes' cgroups go: at the hierarchy's root or under a delegated cgroup.
pub use cgroup::delegation;
pub use launcher::{
    processes, run, run_cancellable, run_with, session, Canceller, Sandbox, Stream,
};
pub use outcome::{ErrorKind, Outcome};
pub use sandbox::dispatch_init;
pub use spec::{Exec, Rootfs, SandboxSpec, Spec};

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// Only the launcher and the sandbox speak the wire protocol; the session, though under
    /// the launcher, talks to its sandbox through `Sandbox`'s typed methods. The compiler
    /// cannot hold this (the protocol must be visible to both, so to the whole crate), so
    /// this reads every library source for an import of it.
    #[test]
    fn only_the_launcher_and_the_sandbox_import_the_protocol() {
        fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    sources(&path, out);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    out.push(path);
                }
            }
        }
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        sources(&src, &mut files);
        // The paths looked for, built here so that this file does not match itself.
        let module = "protocol";
        let (by_crate, by_super, in_path) = (
            format!("crate::{module}"),
            format!("super::{module}"),
            format!("{module}::"),
        );
        let mut offenders = Vec::new();
        for file in files {
            let name = file
                .strip_prefix(&src)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let allowed = matches!(name.as_str(), "protocol.rs" | "proptests.rs")
                || name.starts_with("sandbox/")
                || (name.starts_with("launcher/") && !name.starts_with("launcher/session"));
            if allowed {
                continue;
            }
            let text: String = std::fs::read_to_string(&file)
                .unwrap()
                .split_whitespace()
                .collect();
            // The module by its path from the crate or a parent, or in a `use crate::{..}`.
            let grouped = text.split("crate::{").skip(1).any(|group| {
                let group = group.split(';').next().unwrap_or("");
                group
                    .split([',', '{', '}'])
                    .any(|item| item == module || item.starts_with(&in_path))
            });
            if text.contains(&by_crate) || text.contains(&by_super) || grouped {
                offenders.push(name);
            }
        }
        assert!(
            offenders.is_empty(),
            "these files import the wire protocol (src/protocol.rs), which only src/launcher/ \
             (not its session) and src/sandbox/ may; give the launcher's Sandbox a typed method \
             instead: {offenders:?}"
        );
    }
}
