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

/// Links `target/<profile>/codecage-init` again as a static PIE (glibc's static libc,
/// `-C target-feature=+crt-static`), for what ships (`cargo xtask dist`) and what is
/// measured (`cargo xtask bench`). Each sandbox's start executes the init, and without a
/// dynamic loader, libc.so and libgcc_s.so to map and relocate that exec costs ~0.2 ms
/// less (ARCHITECTURE.md, "The init binary and the start-up budget").
///
/// Only the init's own crate is compiled again (`cargo rustc` passes the flag to the final
/// crate alone; the libraries' rlibs are the same either way, glibc's static or shared
/// libc being chosen at the link), so it takes a second. Cargo keeps both links: a later
/// `cargo build` puts the dynamic one back (cargo has no per-binary target features), so
/// copy the result before building again.
pub fn link_static_init(root: &Path, release: bool) -> anyhow::Result<PathBuf> {
    link_static(root, release, "codecage-init")
}

/// Links `target/<profile>/codecage` (the launcher) again as a static PIE, as
/// [`link_static_init`] does the init: ~0.5 ms less for every `codecage run` (no dynamic
/// loader, no libraries to map, none of their symbols to bind). Such a `codecage` hands
/// what would reach the host's name service (NSS) to `codecage-full`, which stays dynamic
/// (ARCHITECTURE.md, "A static launcher"). Its crate (the CLI's modules) is compiled a
/// second time, once: 40 s in debug, 80 in release; later links are fresh.
pub fn link_static_launcher(root: &Path, release: bool) -> anyhow::Result<PathBuf> {
    link_static(root, release, "codecage")
}

fn link_static(root: &Path, release: bool, bin: &str) -> anyhow::Result<PathBuf> {
    let profile = if release { "release" } else { "debug" };
    let mut cargo = std::process::Command::new("cargo");
    cargo
        .current_dir(root)
        .args(["rustc", "--locked", "--quiet"]);
    if release {
        cargo.arg("--release");
    }
    cargo.args([
        "-p",
        "codecage",
        "--bin",
        bin,
        "--",
        "-C",
        "target-feature=+crt-static",
    ]);
    let status = cargo.status()?;
    anyhow::ensure!(status.success(), "linking {bin} statically failed");
    let path = root.join("target").join(profile).join(bin);
    anyhow::ensure!(
        is_static(&std::fs::read(&path)?),
        "{} is still dynamically linked after `cargo rustc -C target-feature=+crt-static`",
        path.display()
    );
    Ok(path)
}

/// Whether an ELF executable has no program interpreter (PT_INTERP): a static one.
pub fn is_static(elf: &[u8]) -> bool {
    // ELF64 little-endian: e_phoff at 32, e_phentsize at 54, e_phnum at 56; p_type first.
    let u16_at = |at: usize| {
        elf.get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u64_at = |at: usize| {
        elf.get(at..at + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
    };
    let (Some(phoff), Some(size), Some(count)) = (u64_at(32), u16_at(54), u16_at(56)) else {
        return false;
    };
    if !elf.starts_with(b"\x7fELF\x02\x01") {
        return false;
    }
    const PT_INTERP: u32 = 3;
    (0..usize::from(count)).all(|i| {
        let at = phoff as usize + i * usize::from(size);
        elf.get(at..at + 4)
            .is_some_and(|b| u32::from_le_bytes(b.try_into().unwrap()) != PT_INTERP)
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_static_executable_is_told_from_a_dynamic_one() {
        assert!(!super::is_static(&std::fs::read("/bin/true").unwrap()));
        assert!(!super::is_static(b"#!/bin/sh\n"));
    }

    #[test]
    fn the_workspace_has_the_xtask_crate() {
        assert!(super::workspace_root().join("xtask/Cargo.toml").is_file());
    }
}
