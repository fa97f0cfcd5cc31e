//! The cgroup-v2 VM test lane.
//!
//! Build machines of this project run a *hybrid* cgroup layout (v1
//! controllers, a controller-less cgroup2 mount), and a kernel binds each
//! controller to one hierarchy for its whole life, so codecage's cgroup v2
//! backend cannot be exercised there. Instead we boot a small Debian bookworm
//! VM under QEMU whose kernel runs with `cgroup_no_v1=all`, mount a pure
//! cgroup2 hierarchy the way systemd does, and run the project's integration
//! tests inside it, in one boot.
//!
//! * [`build`]: `cargo xtask vm-build`, the image (kernel, initramfs, ext4
//!   root disk) in a cache directory keyed by a hash of the recipe.
//! * [`run`]: `cargo xtask vm-run`, boot, run one command with the project
//!   directory shared at the same absolute path, stream its output, return
//!   its exit status; [`qemu`]: the machine it boots.
//! * [`lane`]: `cargo xtask vm-test` and `cargo xtask vm-check`.
//!
//! The recipe and its measurements are in `xtask/vm/README.md`.

pub mod build;
pub mod lane;
mod qemu;
pub mod run;

use anyhow::Result;
use std::path::PathBuf;

/// Exit status when the command ran into its timeout (like coreutils' `timeout`).
pub const EXIT_TIMEOUT: i32 = 124;
/// Exit status when the VM failed before the command could report a status.
pub const EXIT_VM_FAILED: i32 = 125;

/// Where built images live: `$CODECAGE_VM_CACHE`, else `/var/cache/codecage/vm`.
pub fn cache_root() -> PathBuf {
    std::env::var_os("CODECAGE_VM_CACHE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/codecage/vm"))
}

/// A complete, built image.
#[derive(Debug, Clone)]
pub struct Image {
    pub dir: PathBuf,
    pub vmlinux: PathBuf,
    pub initrd: PathBuf,
    pub rootfs: PathBuf,
}

impl Image {
    /// The image for the current recipe, if it was built completely.
    pub fn current() -> Option<Image> {
        let dir = cache_root().join(build::recipe_hash());
        dir.join(build::COMPLETE_MARKER).is_file().then(|| Image {
            vmlinux: dir.join("vmlinux"),
            initrd: dir.join("initrd.cpio"),
            rootfs: dir.join("rootfs.img"),
            dir,
        })
    }
}

/// The image for the current recipe, built first if needed (which needs root).
pub fn ensure_image() -> Result<Image> {
    if let Some(image) = Image::current() {
        run::require_qemu()?;
        return Ok(image);
    }
    eprintln!("[vm] no image for the current recipe yet: building it first");
    build::build()
}
