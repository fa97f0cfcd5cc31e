//! `cargo xtask vm-build`: build the VM image (as root).
//!
//! The image is three files in `<cache>/<recipe hash>/`:
//!
//! * `vmlinux`: the `linux-image-amd64` kernel of the lane's kernel suite
//!   (bookworm-backports, bookworm or bullseye; see `lanes.rs`), decompressed from its
//!   bzImage. QEMU boots an ELF vmlinux through its PVH entry point, which
//!   skips the in-guest decompression: under TCG that is 3 s to the root
//!   mount instead of 9 s.
//! * `initrd.cpio`: busybox plus the ~20 modules needed to reach the root disk
//!   and the 9p shares (Debian builds virtio, ext4 and 9p as modules).
//! * `rootfs.img`: a sparse ext4 image made with `mke2fs -d` from an
//!   mmdebstrap'ed bookworm (no loop mount needed). Runs open it with
//!   `snapshot=on`, so it stays pristine. A disk rather than a big initramfs,
//!   because `pivot_root(2)` does not work on an initramfs root, and sandboxes
//!   need pivot_root.
//!
//! The directory name is a hash of everything that determines the image (the
//! kernel suite, the asset files under `xtask/vm/` that go into it, the package list,
//! and this source file), so changing the recipe rebuilds and an unchanged recipe is
//! instant. The per-run guest init (`guest-init.sh`) and the runner are *not*
//! part of the image (the image's PID 1 is a stub that runs the init from the
//! control share), so they can change without a rebuild.
//!
//! The build happens in `<cache>/.build-<hash>-<pid>-<n>/` and is renamed into
//! place when complete; the `complete` marker is written last. The tools' output
//! stays beside the image in `build.log` (and a failed build's in
//! `<cache>/last-failed-build.log`).

use super::Image;
use crate::host::{
    debian, find_command, install_missing, is_root, orphans, remove_stale, remove_tree, secs,
    shell_quote, status, warn, Recommends, Runner, Steps, TempTree,
};
use anyhow::{bail, ensure, Context, Result};
use sha2::{Digest as _, Sha256};
use std::collections::BTreeSet;
use std::fs;
use std::io::Write as _;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// The environment variables of the VM lanes, for `vm-build --help`.
pub const ENVIRONMENT: &str = "\
Environment:
  CODECAGE_VM_CACHE   image cache directory (default /var/cache/codecage/vm)
  CODECAGE_VM_MIRROR  mmdebstrap mirror argument(s), one per line (default: the
                      host's bookworm sources, else deb.debian.org)
  CODECAGE_VM_KERNEL_SUITE
                      without --lane: the suite the default lane's kernel comes
                      from instead of bookworm-backports (e.g. bookworm for 6.1)
  CODECAGE_VM_KERNEL_MIRROR
                      mirror for a kernel suite other than bookworm
                      (default http://deb.debian.org/debian)

Each lane's kernel suite has its own image; lanes with the same kernel share one.";

/// The line of `image.txt` naming the kernel suite (pruning keeps the
/// images of other kernel suites).
const KERNEL_SUITE_KEY: &str = "kernel-suite: ";

/// Hex digits of the recipe hash in an image directory's name.
const IMAGE_HASH_LEN: usize = 16;

/// Build directories are `<cache>/.build-<hash>-<pid>-<n>`.
const BUILD_PREFIX: &str = ".build-";

/// The build's log: the tools' output, kept in the image directory.
const BUILD_LOG: &str = "build.log";

/// The variable that overrides the mirror (see [`debian::mirrors`]).
const MIRROR_VARIABLE: &str = "CODECAGE_VM_MIRROR";

/// Written last into a finished image directory.
pub const COMPLETE_MARKER: &str = "complete";

/// The Debian release of the guest's root filesystem (and, by default, kernel).
const SUITE: &str = "bookworm";

const PACKAGES: &str = include_str!("../../vm/packages.txt");
const HOST_PACKAGES: &str = include_str!("../../vm/host-packages.txt");
const FETCH_KERNEL_SH: &str = include_str!("../../vm/fetch-kernel.sh");
const INITRAMFS_INIT_SH: &str = include_str!("../../vm/initramfs-init.sh");
const VM_INIT_SH: &str = include_str!("../../vm/vm-init.sh");
/// This file itself: the build steps are part of the recipe.
const THIS_SOURCE: &str = include_str!("build.rs");

/// Modules the initramfs loads (with their dependencies) to reach the root
/// disk, the 9p shares and the virtio-serial output port, and whether the
/// build may go on without them. crc32c is a soft dependency of ext4 that
/// `--show-depends` may not list (and a module name that kernels change).
const INITRAMFS_MODULES: &[(&str, bool)] = &[
    ("virtio_pci", true),
    ("virtio_blk", true),
    ("virtio_console", true),
    ("virtio_rng", false),
    ("crc32c_generic", false),
    ("ext4", true),
    ("9pnet_virtio", true),
    ("9p", true),
];

/// Parts of the kernel's module tree copied into the guest, so that tests can
/// load what a sandbox may need (overlay, veth, tun, netfilter, ...) while the
/// image stays small (no sound, wifi, GPU or USB drivers). Paths are relative
/// to `/lib/modules/<release>/`; a directory is copied whole, and for
/// `kernel/drivers/net` only the modules directly in it (veth, tun, dummy,
/// macvlan, virtio_net...) are.
const MODULE_TREES: &[&str] = &[
    "kernel/fs",
    "kernel/net",
    "kernel/crypto",
    "kernel/lib",
    "kernel/arch",
    "kernel/drivers/virtio",
    "kernel/drivers/block",
    "kernel/drivers/char",
];
const MODULE_FLAT_DIRS: &[&str] = &["kernel/drivers/net"];

/// Size of the (sparse) root disk beyond the files in it: free space for
/// whatever tests write outside /tmp (which is a tmpfs).
const DISK_SLACK: u64 = 1536 << 20;

/// The recipe hash naming the image directory: the first 16 hex digits of a SHA-256
/// over the names and contents of everything that goes into the image, each
/// length-prefixed so that no two recipes feed the same bytes.
pub fn recipe_hash(kernel_suite: &str) -> String {
    let mut h = Sha256::new();
    for (name, content) in [
        ("suite", SUITE),
        ("kernel-suite", kernel_suite),
        ("packages.txt", PACKAGES),
        ("fetch-kernel.sh", FETCH_KERNEL_SH),
        ("initramfs-init.sh", INITRAMFS_INIT_SH),
        ("vm-init.sh", VM_INIT_SH),
        ("build.rs", THIS_SOURCE),
    ] {
        for field in [name, content] {
            h.update((field.len() as u64).to_le_bytes());
            h.update(field);
        }
    }
    let mut hex = format!("{:x}", h.finalize());
    hex.truncate(IMAGE_HASH_LEN);
    hex
}

/// The guest packages: `packages.txt` without comments.
fn guest_packages() -> Vec<&'static str> {
    debian::list_lines(PACKAGES).collect()
}

/// Build the image of the current recipe with the kernel of `kernel_suite` unless it
/// exists already.
pub fn build(kernel_suite: &str) -> Result<Image> {
    let start = Instant::now();
    if let Some(image) = Image::current(kernel_suite) {
        status(
            "Fresh",
            format!(
                "VM image {} is up to date ({})",
                image.dir.display(),
                secs(start.elapsed())
            ),
        );
        return Ok(image);
    }
    ensure!(
        is_root(),
        "vm-build needs root (apt-get, mmdebstrap, chroot): run `sudo cargo xtask vm-build`"
    );
    let hash = recipe_hash(kernel_suite);
    let cache = super::cache_root();
    fs::create_dir_all(&cache).with_context(|| format!("creating {}", cache.display()))?;
    for stale in orphans(&cache, build_pid) {
        remove_stale(&stale);
    }
    let tmp = TempTree::create_in(&cache, &format!("{BUILD_PREFIX}{hash}-"))?;
    let dir = tmp.path().to_path_buf();
    let mut steps = Steps::new(
        &format!("VM image {hash} (kernel from {kernel_suite})"),
        7,
        dir.join(BUILD_LOG),
        false,
        cache.join("last-failed-build.log"),
    );
    steps
        .runner()
        .note(&format!("codecage VM image {hash} in {}", dir.display()));

    steps.run(
        "host tools (apt-get install when missing)",
        install_host_tools,
    )?;

    let rootfs = dir.join("rootfs");
    let kernel = dir.join("kernel");
    steps.run(
        &format!("root filesystem: mmdebstrap {SUITE} + kernel package"),
        |r| mmdebstrap(r, &dir, &rootfs, &kernel, kernel_suite),
    )?;

    let release = steps.run("kernel: vmlinux from the bzImage", |r| {
        let (release, bzimage) = find_kernel(&kernel)?;
        extract_vmlinux(r, &bzimage, &dir.join("vmlinux"))?;
        Ok(release)
    })?;

    steps.run("modules and initramfs", |r| {
        install_modules(r, &kernel, &rootfs, &release)?;
        build_initramfs(r, &rootfs, &release, &dir.join("initrd.cpio"))
    })?;
    // The unpacked kernel package is ~400 MB; it is not needed any more.
    remove_tree(&kernel)?;

    steps.run("guest files (init stub, hostname)", |_| {
        customize_rootfs(&rootfs)
    })?;

    steps.run("root disk: mke2fs -d", |r| {
        make_disk(r, &rootfs, &dir.join("rootfs.img"))
    })?;

    let final_dir = cache.join(&hash);
    steps.run("finish", |_| {
        remove_tree(&rootfs)?;
        fs::remove_file(dir.join("fetch-kernel.sh"))?;
        let manifest = format!(
            "codecage VM image\nrecipe: {hash}\nsuite: {SUITE}\n{KERNEL_SUITE_KEY}{}\n\
             kernel: {release}\npackages: {}\nbuilt in: {}\n",
            kernel_suite,
            guest_packages().join(" "),
            secs(start.elapsed())
        );
        fs::write(dir.join("image.txt"), manifest)?;
        // The marker last: an image directory without it is never used.
        let mut marker = fs::File::create(dir.join(COMPLETE_MARKER))?;
        marker.write_all(b"ok\n")?;
        marker.sync_all()?;
        match fs::rename(&dir, &final_dir) {
            Ok(()) => {}
            // Someone else finished the same image first; theirs is as good.
            Err(_) if final_dir.join(COMPLETE_MARKER).is_file() => {}
            Err(e) => return Err(e).context(format!("renaming to {}", final_dir.display())),
        }
        Ok(())
    })?;
    drop(tmp);
    remove_other_images(&cache, &hash, kernel_suite);

    let image = Image::current(kernel_suite).context("image vanished right after the build")?;
    status(
        "Finished",
        format!(
            "VM image {hash} in {}: {}",
            secs(start.elapsed()),
            image.dir.display()
        ),
    );
    Ok(image)
}

/// The pid in the name of a build directory, `.build-<hash>-<pid>-<n>`.
fn build_pid(name: &str) -> Option<u32> {
    name.strip_prefix(BUILD_PREFIX)?
        .split('-')
        .nth(1)?
        .parse()
        .ok()
}

/// Install the host packages (`host-packages.txt`) whose command is missing.
fn install_host_tools(r: &Runner) -> Result<()> {
    for cmd in ["apt-get", "dpkg-deb", "chroot", "unshare"] {
        ensure!(
            find_command(cmd).is_some(),
            "`{cmd}` not found: vm-build needs a Debian or Ubuntu host"
        );
    }
    let mut tools = Vec::new();
    for line in debian::list_lines(HOST_PACKAGES) {
        let mut words = line.split_whitespace();
        let (Some(package), Some(command)) = (words.next(), words.next()) else {
            bail!("bad line in host-packages.txt: {line:?}");
        };
        tools.push((command, package));
    }
    install_missing(r, &tools, Recommends::Skip)
}

/// Bootstrap the guest root filesystem, and fetch and unpack the kernel
/// package from inside it (see `fetch-kernel.sh`).
fn mmdebstrap(
    r: &Runner,
    dir: &Path,
    rootfs: &Path,
    kernel: &Path,
    kernel_suite: &str,
) -> Result<()> {
    let hook = dir.join("fetch-kernel.sh");
    fs::write(&hook, FETCH_KERNEL_SH)?;
    let kernel_mirror = std::env::var("CODECAGE_VM_KERNEL_MIRROR")
        .ok()
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| "http://deb.debian.org/debian".to_string());
    let mut cmd = Command::new("unshare");
    // A private mount namespace: the /proc, /sys and /dev mounts mmdebstrap
    // makes inside the chroot vanish with it, even if it is killed, and never
    // show up in the host's mount table.
    cmd.args(["--mount", "--propagation", "private", "--"])
        .arg("mmdebstrap")
        .args(["--mode=root", "--variant=minbase", "--verbose"])
        .arg(format!("--include={}", guest_packages().join(",")))
        .arg("--aptopt=Acquire::Retries \"3\"")
        .args(
            [
                "/usr/share/man/*",
                "/usr/share/doc/*",
                "/usr/share/info/*",
                "/usr/share/locale/*",
                "/usr/share/lintian/*",
            ]
            .map(|p| format!("--dpkgopt=path-exclude={p}")),
        )
        .arg(format!(
            "--customize-hook=sh {} \"$1\" {} {} {}",
            shell_quote(&hook),
            shell_quote(kernel),
            shell_quote(kernel_suite),
            shell_quote(kernel_mirror)
        ))
        .arg(SUITE)
        .arg(rootfs)
        .args(debian::mirrors(MIRROR_VARIABLE, SUITE));
    r.run("mmdebstrap", cmd)
}

/// The kernel release and bzImage path in the unpacked kernel package.
fn find_kernel(kernel: &Path) -> Result<(String, PathBuf)> {
    let boot = kernel.join("boot");
    for entry in fs::read_dir(&boot).with_context(|| format!("reading {}", boot.display()))? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if let Some(release) = name.strip_prefix("vmlinuz-") {
            return Ok((release.to_string(), boot.join(&name)));
        }
    }
    bail!("no vmlinuz-* in {}", boot.display())
}

/// Decompress the kernel payload of a bzImage into an ELF vmlinux.
///
/// The boot protocol header says where the compressed payload is
/// (`payload_offset`/`payload_length`, relative to the protected-mode code
/// after the `setup_sects` real-mode sectors); its magic says how it is
/// compressed. The command-line decompressors do the work.
fn extract_vmlinux(r: &Runner, bzimage: &Path, out: &Path) -> Result<()> {
    let data = fs::read(bzimage).with_context(|| format!("reading {}", bzimage.display()))?;
    ensure!(
        data.len() > 0x250 && &data[0x202..0x206] == b"HdrS",
        "{} is not a bzImage",
        bzimage.display()
    );
    let u32_at = |off: usize| u32::from_le_bytes(data[off..off + 4].try_into().unwrap()) as usize;
    let setup_sects = match data[0x1f1] {
        0 => 4,
        n => usize::from(n),
    };
    let start = (setup_sects + 1) * 512 + u32_at(0x248);
    let len = u32_at(0x24c);
    ensure!(start + len <= data.len(), "bzImage payload out of bounds");
    let payload = &data[start..start + len];
    // The kernel build appends the uncompressed size (4 bytes) to xz and zstd
    // payloads; zstd refuses trailing bytes, xz is told to ignore them.
    let (tool, args, payload): (&str, &[&str], &[u8]) = match payload {
        [0x1f, 0x8b, ..] => ("gzip", &["-dc"], payload),
        [0xfd, b'7', b'z', b'X', b'Z', 0, ..] => ("xz", &["-dc", "--single-stream"], payload),
        [0x28, 0xb5, 0x2f, 0xfd, ..] => ("zstd", &["-dcq"], &payload[..payload.len() - 4]),
        _ => bail!(
            "unsupported kernel compression (magic {:02x?})",
            &payload[..payload.len().min(6)]
        ),
    };
    let compressed = out.with_extension("payload");
    fs::write(&compressed, payload)?;
    let mut cmd = Command::new(tool);
    cmd.args(args).arg(&compressed);
    let output = r.capture(cmd)?;
    fs::remove_file(&compressed)?;
    ensure!(
        output.stdout.starts_with(b"\x7fELF"),
        "{tool} did not produce an ELF kernel ({})",
        output.status
    );
    fs::write(out, &output.stdout)?;
    Ok(())
}

/// Copy the module subset into the guest and run depmod there.
fn install_modules(r: &Runner, kernel: &Path, rootfs: &Path, release: &str) -> Result<()> {
    let from = kernel.join("lib/modules").join(release);
    let to = rootfs.join("lib/modules").join(release);
    fs::create_dir_all(&to)?;
    for tree in MODULE_TREES {
        if from.join(tree).is_dir() {
            copy_tree(&from.join(tree), &to.join(tree))?;
        }
    }
    for flat in MODULE_FLAT_DIRS {
        fs::create_dir_all(to.join(flat))?;
        for entry in fs::read_dir(from.join(flat))? {
            let entry = entry?;
            if entry.file_type()?.is_file() {
                fs::copy(entry.path(), to.join(flat).join(entry.file_name()))?;
            }
        }
    }
    for file in [
        "modules.order",
        "modules.builtin",
        "modules.builtin.modinfo",
    ] {
        if from.join(file).is_file() {
            fs::copy(from.join(file), to.join(file))?;
        }
    }
    let mut depmod = Command::new("chroot");
    depmod.arg(rootfs).args(["depmod", "-a", release]);
    r.run("depmod", depmod)
}

/// Recursive copy of regular files and directories (a module tree has nothing else).
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    fs::create_dir_all(to)?;
    for entry in fs::read_dir(from)? {
        let entry = entry?;
        let ty = entry.file_type()?;
        let target = to.join(entry.file_name());
        if ty.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else if ty.is_file() {
            fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// The initramfs: busybox, the modules in load order, `/init`.
fn build_initramfs(r: &Runner, rootfs: &Path, release: &str, out: &Path) -> Result<()> {
    // Module paths in dependency order, as modprobe would load them.
    let mut seen = BTreeSet::new();
    let mut modules = Vec::new();
    for &(module, required) in INITRAMFS_MODULES {
        let mut modprobe = Command::new("chroot");
        modprobe
            .arg(rootfs)
            .args(["modprobe", "-S", release, "--show-depends", module]);
        let output = r.capture(modprobe)?;
        let text = String::from_utf8_lossy(&output.stdout);
        r.note(&format!("{module}: {}\n{text}", output.status));
        if !output.status.success() {
            ensure!(!required, "modprobe --show-depends {module} failed");
            continue;
        }
        for line in text.lines() {
            if let Some(path) = line.strip_prefix("insmod ") {
                let path = path.split_whitespace().next().unwrap_or("");
                if seen.insert(path.to_string()) {
                    modules.push(path.to_string());
                }
            }
        }
    }
    ensure!(!modules.is_empty(), "modprobe listed no modules to insmod");

    let mut cpio = Cpio::default();
    for d in ["bin", "dev", "proc", "sys", "newroot", "lib", "lib/modules"] {
        cpio.dir(d);
    }
    cpio.char_dev("dev/console", 0o600, 5, 1);
    let busybox = fs::read(rootfs.join("bin/busybox")).context("busybox missing in the rootfs")?;
    cpio.file("bin/busybox", 0o755, &busybox);
    cpio.file("init", 0o755, INITRAMFS_INIT_SH.as_bytes());
    let mut list = String::new();
    for m in &modules {
        let path = rootfs.join(m.trim_start_matches('/'));
        let base = path
            .file_name()
            .context("module path without a name")?
            .to_string_lossy()
            .into_owned();
        // busybox insmod takes uncompressed modules only.
        let (name, data) = if let Some(stem) = base.strip_suffix(".xz") {
            (stem.to_string(), decompress(r, "xz", &path)?)
        } else if let Some(stem) = base.strip_suffix(".zst") {
            (stem.to_string(), decompress(r, "zstd", &path)?)
        } else {
            (base.clone(), fs::read(&path)?)
        };
        cpio.file(&format!("lib/modules/{name}"), 0o644, &data);
        list.push_str(&name);
        list.push('\n');
    }
    cpio.file("modules", 0o644, list.as_bytes());
    fs::write(out, cpio.finish())?;
    Ok(())
}

fn decompress(r: &Runner, tool: &str, path: &Path) -> Result<Vec<u8>> {
    let mut cmd = Command::new(tool);
    cmd.arg("-dc").arg(path);
    let out = r.capture(cmd)?;
    ensure!(
        out.status.success(),
        "{tool} -dc {} failed ({})",
        path.display(),
        out.status
    );
    Ok(out.stdout)
}

/// A minimal writer for the "newc" cpio format the kernel unpacks.
#[derive(Default)]
struct Cpio {
    buf: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, rdev: (u32, u32), data: &[u8]) {
        self.ino += 1;
        let nlink = if mode & 0o170000 == 0o040000 { 2 } else { 1 };
        let fields = [
            self.ino,
            mode,
            0, // uid
            0, // gid
            nlink,
            0, // mtime
            data.len() as u32,
            0, // devmajor
            0, // devminor
            rdev.0,
            rdev.1,
            name.len() as u32 + 1,
            0, // check
        ];
        self.buf.extend_from_slice(b"070701");
        for f in fields {
            self.buf.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.buf.extend_from_slice(name.as_bytes());
        self.buf.push(0);
        self.pad();
        self.buf.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.buf.len().is_multiple_of(4) {
            self.buf.push(0);
        }
    }

    fn dir(&mut self, name: &str) {
        self.entry(name, 0o040755, (0, 0), &[]);
    }

    fn file(&mut self, name: &str, perm: u32, data: &[u8]) {
        self.entry(name, 0o100000 | perm, (0, 0), data);
    }

    fn char_dev(&mut self, name: &str, perm: u32, major: u32, minor: u32) {
        self.entry(name, 0o020000 | perm, (major, minor), &[]);
    }

    fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, (0, 0), &[]);
        self.buf
    }
}

/// Files the guest needs besides its packages.
fn customize_rootfs(rootfs: &Path) -> Result<()> {
    let init = rootfs.join("sbin/codecage-vm-init");
    fs::write(&init, VM_INIT_SH)?;
    fs::set_permissions(&init, fs::Permissions::from_mode(0o755))?;
    fs::write(rootfs.join("etc/hostname"), "vm\n")?;
    fs::write(
        rootfs.join("etc/hosts"),
        "127.0.0.1\tlocalhost\n127.0.1.1\tvm\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    )?;
    fs::write(
        rootfs.join("etc/fstab"),
        "# filesystems are mounted by /sbin/codecage-vm-init\n",
    )?;
    // No name resolution in the guest (it has no network but loopback).
    let _ = fs::remove_file(rootfs.join("etc/resolv.conf"));
    fs::write(rootfs.join("etc/resolv.conf"), "")?;
    for d in ["run", "tmp", "sys/fs/cgroup"] {
        fs::create_dir_all(rootfs.join(d))?;
    }
    Ok(())
}

/// The ext4 root disk: a sparse file, populated by `mke2fs -d` without any
/// loop mount. No journal: every run uses a throw-away snapshot, and jbd2
/// writes cost time under TCG.
fn make_disk(r: &Runner, rootfs: &Path, out: &Path) -> Result<()> {
    let used = tree_size(rootfs)?;
    let size_mib = (used + DISK_SLACK).div_ceil(1 << 20);
    let mut mke2fs = Command::new(find_command("mke2fs").context("mke2fs not found")?);
    mke2fs
        .args([
            "-q",
            "-F",
            "-t",
            "ext4",
            "-O",
            "^has_journal",
            "-L",
            "codecage-vm",
        ])
        .args(["-E", "root_owner=0:0", "-d"])
        .arg(rootfs)
        .arg(out)
        .arg(format!("{size_mib}M"));
    r.run("mke2fs", mke2fs)
}

/// Bytes used by the files in a tree (hard links counted once).
fn tree_size(dir: &Path) -> Result<u64> {
    let mut seen = BTreeSet::new();
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d)? {
            let entry = entry?;
            let meta = entry.metadata()?;
            if meta.is_dir() {
                stack.push(entry.path());
            } else if meta.nlink() < 2 || seen.insert(meta.ino()) {
                total += meta.blocks() * 512;
            }
        }
    }
    Ok(total)
}

/// After a successful build: remove complete images of older recipes for
/// the same kernel suite (each is ~0.5 GB). A VM still running from one keeps
/// its open files.
fn remove_other_images(cache: &Path, keep: &str, kernel_suite: &str) {
    let Ok(entries) = fs::read_dir(cache) else {
        return;
    };
    let suite_line = format!("{KERNEL_SUITE_KEY}{kernel_suite}");
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name != keep
            && name.len() == IMAGE_HASH_LEN
            && name.bytes().all(|b| b.is_ascii_hexdigit())
            && path.join(COMPLETE_MARKER).is_file()
            && fs::read_to_string(path.join("image.txt"))
                .unwrap_or_default()
                .lines()
                .any(|l| l == suite_line)
        {
            status("Removing", format!("old image {}", path.display()));
            if let Err(e) = remove_tree(&path) {
                warn(format!("{e:#}"));
            }
        }
    }
}
