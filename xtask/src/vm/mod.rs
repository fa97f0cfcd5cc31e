//! The VM test lanes.
//!
//! Build machines of this project run a *hybrid* cgroup layout (v1
//! controllers, a controller-less cgroup2 mount) on a recent kernel, and a kernel binds
//! each controller to one hierarchy for its whole life, so neither codecage's pure v2 and
//! pure v1 backends nor older kernels can be exercised there. Instead we boot a small
//! Debian bookworm VM under QEMU, with the kernel and the cgroup layout of a *lane*
//! ([`lanes`]: pure v2 on 6.12, Debian 12's 6.1, pure v1, Debian 11's 5.10 without
//! landlock), and run the project's integration tests inside it, in one boot per lane.
//!
//! * [`lanes`]: the lanes, as data.
//! * [`build`]: `cargo xtask vm-build`, the image (kernel, initramfs, ext4
//!   root disk) in a cache directory keyed by a hash of the recipe.
//! * [`run`]: `cargo xtask vm-run`, boot, run one command with the project
//!   directory shared at the same absolute path, stream its output, return
//!   its exit status; [`qemu`]: the machine it boots.
//! * [`lane`]: `cargo xtask vm-test`, `vm-check` and `vm-build`'s lanes;
//!   [`matrix`]: the probe each lane runs and the support matrix (`vm-matrix`).
//!
//! The recipe and its measurements are in `xtask/vm/README.md`.

pub mod build;
pub mod lane;
pub mod lanes;
pub mod matrix;
mod qemu;
pub mod run;
pub mod systemd;

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
    /// The image of the current recipe with the kernel of `kernel_suite`, if it was built
    /// completely.
    pub fn current(kernel_suite: &str) -> Option<Image> {
        let dir = cache_root().join(build::recipe_hash(kernel_suite));
        dir.join(build::COMPLETE_MARKER).is_file().then(|| Image {
            vmlinux: dir.join("vmlinux"),
            initrd: dir.join("initrd.cpio"),
            rootfs: dir.join("rootfs.img"),
            dir,
        })
    }
}

/// The image of the current recipe with the kernel of `kernel_suite`, built first if
/// needed (which needs root).
pub fn ensure_image(kernel_suite: &str) -> Result<Image> {
    // One image at a time: lanes run side by side (vm-test) must not build one kernel's
    // image together (apt-get's lock, the build log), say after a first try failed.
    static BUILDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(image) = Image::current(kernel_suite) {
        run::require_qemu()?;
        return Ok(image);
    }
    eprintln!("[vm] no image for the current recipe with the {kernel_suite} kernel yet: building it first");
    build::build(kernel_suite)
}
