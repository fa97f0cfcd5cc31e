//! What the tasks share of the host: the `codecage-image` crate's `host` module (root,
//! commands and their process groups, interrupts, apt-get and the Debian mirror, build
//! steps, safe removal of trees; the rootfs build uses it too), and the workspace.

pub use codecage_image::host::*;

use std::path::{Path, PathBuf};

/// The directory of the workspace (the repository root).
///
/// `cargo run` sets `CARGO_MANIFEST_DIR` to xtask's directory at run time; the
/// compile-time value is the fallback for a binary started directly.
pub fn workspace_root() -> PathBuf {
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    manifest.parent().map(Path::to_path_buf).unwrap_or(manifest)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_workspace_has_the_xtask_crate() {
        assert!(super::workspace_root().join("xtask/Cargo.toml").is_file());
    }
}
