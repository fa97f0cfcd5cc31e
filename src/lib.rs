//! codecage runs untrusted Python, JavaScript and bash in a sandbox it builds itself from
//! Linux namespaces, with a read-only root, tmpfs scratch space, a wall-clock timeout and an
//! output cap. See ARCHITECTURE.md for the layers and the setup order.
//!
//! ```no_run
//! // A program using the library must let codecage's init take over first:
//! codecage::sandbox::dispatch_init();
//! let outcome = codecage::run(&codecage::Spec::new(vec!["echo".into(), "hi".into()]));
//! assert_eq!(outcome.stdout, b"hi\n");
//! ```

pub mod cgroup;
pub mod channel;
pub mod cli;
pub mod doctor;
pub mod launcher;
pub mod outcome;
pub mod profile;
pub mod runner;
pub mod sandbox;
pub mod spec;
mod sys;
pub mod units;

pub use launcher::{run, run_with, Stream};
pub use outcome::{ErrorKind, Outcome};
pub use spec::{Rootfs, Spec};
