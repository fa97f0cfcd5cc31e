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
pub mod session;
pub mod spec;
mod sys;
pub mod units;

pub use launcher::{run, run_cancellable, run_with, Canceller, Sandbox, Stream};
pub use outcome::{ErrorKind, Outcome};
pub use sandbox::dispatch_init;
pub use spec::{Exec, Rootfs, SandboxSpec, Spec};
