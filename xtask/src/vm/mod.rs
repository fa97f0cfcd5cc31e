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
//!   its exit status.
//! * [`lane`]: `cargo xtask vm-test` and `cargo xtask vm-check`.
//!
//! The recipe and its measurements are in `xtask/vm/README.md`.

pub mod build;
pub mod lane;
pub mod run;

pub use crate::host::{
    display_command, find_command, interrupted, is_root, own_group_and_die_with_parent,
    remove_tree, secs, shell_quote, signal_group, stop_group,
};
use anyhow::{bail, Context, Result};
use std::fmt::Write as _;
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Exit status when the command ran into its timeout (like coreutils' `timeout`).
pub const EXIT_TIMEOUT: i32 = 124;
/// Exit status when the VM failed before the command could report a status.
pub const EXIT_VM_FAILED: i32 = 125;

/// The directory of the workspace (the repository root): the default share.
///
/// `cargo run` sets `CARGO_MANIFEST_DIR` to xtask's directory at run time;
/// the compile-time value is the fallback for a directly started binary.
pub fn workspace_root() -> PathBuf {
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    manifest.parent().map(Path::to_path_buf).unwrap_or(manifest)
}

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

// ---------------------------------------------------------------------------
// Interrupts
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// Child processes
// ---------------------------------------------------------------------------

/// Run a command to completion with its stdout+stderr appended to `log`,
/// polling for interrupts. Returns its exit status.
pub fn run_logged(cmd: &mut Command, log: &Path) -> Result<ExitStatus> {
    let file = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("opening {}", log.display()))?;
    {
        let mut f = &file;
        let _ = writeln!(f, "\n$ {}", display_command(cmd));
    }
    cmd.stdin(std::process::Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file);
    own_group_and_die_with_parent(cmd);
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot start {}", display_command(cmd)))?;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if let Some(sig) = interrupted() {
            stop_group(&mut child, Duration::from_secs(10));
            bail!("interrupted by signal {sig}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Is `name` an executable in `$PATH`?
pub fn have_command(name: &str) -> bool {
    find_command(name).is_some()
}

/// The last `n` lines of a file (lossy UTF-8), for failure reports.
pub fn tail_lines(path: &Path, n: usize) -> String {
    let Ok(bytes) = fs::read(path) else {
        return format!("({} is missing)\n", path.display());
    };
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.len().saturating_sub(n);
    let mut out = String::new();
    if start > 0 {
        let _ = writeln!(out, "... ({start} earlier lines in {})", path.display());
    }
    for l in &lines[start..] {
        let _ = writeln!(out, "{l}");
    }
    out
}

// ---------------------------------------------------------------------------
// Removing directory trees safely
// ---------------------------------------------------------------------------

/// A temporary directory removed (safely) when dropped.
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// Create `parent/<prefix><pid>-<n>` (unique within this process).
    pub fn new_in(parent: &Path, prefix: &str) -> Result<TempDir> {
        use std::sync::atomic::AtomicU32;
        static N: AtomicU32 = AtomicU32::new(0);
        fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        let path = parent.join(format!(
            "{prefix}{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        if path.exists() {
            remove_tree(&path)?;
        }
        fs::create_dir(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(TempDir { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if let Err(e) = remove_tree(&self.path) {
            eprintln!("warning: {e:#}");
        }
    }
}
