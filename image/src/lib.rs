//! codecage's root filesystem images, one implementation behind two entry points:
//! `cargo xtask rootfs` (the developer task, in a source checkout) and `codecage image`
//! (an installed codecage preparing its own images).
//!
//! * [`rootfs`]: recipes (data in a directory per recipe), the build (mmdebstrap, pip,
//!   npm, a smoke test), the manifest and content hash, and where images live: listing
//!   and verifying them.
//! * [`host`]: what a build needs of the host: root, tools in process groups of their
//!   own, interrupts, apt-get and the Debian mirror, numbered build steps, safe removal of
//!   trees. xtask's other tasks use it too.

pub mod host;
pub mod rootfs;
