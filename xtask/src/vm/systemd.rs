//! The `debian12-systemd` VM: Debian 12 with systemd as pid 1, in which `cargo xtask dist
//! --vm-check` installs, runs, upgrades and purges the Debian package
//! (`packaging/debian/vm-check.sh` says what it checks).
//!
//! The other lanes boot an init of ours; this one boots a Debian 12 root whose
//! `/sbin/codecage-vm-init` (what the lanes' initramfs switches to) is systemd itself. It
//! shares the `debian12-6.1` lane's kernel and initramfs (its image is built first when
//! missing), and has a root disk of its own in `<cache>/systemd-<hash>/rootfs.img`:
//! mmdebstrap'ed bookworm with systemd, python3 (the sandboxes' interpreter, from the
//! host's /usr: the VM has no codecage image) and the kernel's modules, copied out of the
//! `debian12-6.1` image's disk with `debugfs`. The hash covers this file and the kernel
//! image's, so a change to either rebuilds it, and an unchanged recipe is instant.
//!
//! The job reaches the guest as in the other lanes (`run.rs`: the control share, the
//! output port, `started` and `rc`): a unit baked into the image, `codecage-vm-job.service`
//! (wanted by multi-user.target), mounts the control share and runs its `systemd-job.sh`,
//! which waits until systemd has finished starting up, runs the job, reports its status
//! and powers off.

use super::lanes::{Cgroups, Lane, Profiles};
use super::{build, cache_root, ensure_image, Image};
use crate::host::{
    find_command, is_root, orphans, remove_stale, remove_tree, secs, status, warn, Runner, Steps,
    TempTree,
};
use anyhow::{ensure, Context, Result};
use sha2::{Digest as _, Sha256};
use std::fs;
use std::io::Write as _;
use std::os::unix::fs::{symlink, PermissionsExt as _};
use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// The lane, for `run::run` (its name in messages, its kernel and its cgroup layout). It
/// runs no test suite, so it is not one of `lanes::LANES`.
pub const LANE: Lane = Lane {
    name: "debian12-systemd",
    stands_for: "Debian 12 (bookworm) as installed, systemd as pid 1: Linux 6.1, pure \
                 cgroup v2",
    kernel_suite: "bookworm",
    cgroups: Cgroups::V2,
    suites: &[],
    skip: &[],
    profiles: Profiles::Default,
    landlock: true,
    known_failures: &[],
};

/// The Debian release of the root filesystem.
const SUITE: &str = "bookworm";

/// The packages on top of minbase: systemd as init, python3 for the sessions (on the
/// host's /usr), kmod so that the kernel can load modules (overlay, veth, tun), procps for
/// the check's `pgrep`. Nothing that the package depends on is left out on purpose
/// (libc6, init-system-helpers come with these), so `apt install ./codecage_*.deb` needs
/// no network.
const PACKAGES: &[&str] = &["systemd", "systemd-sysv", "python3", "kmod", "procps"];

/// Units of a stock Debian 12 that only cost boot time in a VM without terminals, a
/// network or a persistent disk: masked.
const MASKED: &[&str] = &[
    "getty@tty1.service",
    "serial-getty@ttyS0.service",
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "dpkg-db-backup.timer",
    "e2scrub_all.timer",
    "e2scrub_reap.service",
    "fstrim.timer",
    "systemd-timesyncd.service",
];

/// The job's unit: started once systemd reaches basic.target, in parallel with the rest
/// of multi-user.target (the job script waits for the end of startup itself: a unit that
/// waited for it would be one of the jobs startup waits for).
const JOB_UNIT: &str = "\
[Unit]
Description=codecage VM job (cargo xtask dist --vm-check)

[Service]
Type=exec
ExecStart=/usr/local/sbin/codecage-vm-job
StandardOutput=journal+console
StandardError=journal+console

[Install]
WantedBy=multi-user.target
";

/// The job unit's program: the per-run script from the control share, so that it can
/// change without a rebuild (as `vm-init.sh` does in the other images).
const JOB_STUB: &str = "#!/bin/sh
mkdir -p /run/codecage-ctl
if mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 codecage.ctl /run/codecage-ctl &&
	[ -f /run/codecage-ctl/systemd-job.sh ]; then
	exec /bin/sh /run/codecage-ctl/systemd-job.sh
fi
echo 'codecage-vm-job: control share missing' >/dev/console
systemctl poweroff -ff
";

/// Free space on the root disk beyond its files (the package, apt's work).
const DISK_SLACK: u64 = 1024 << 20;

/// This file: the build steps are part of the recipe.
const THIS_SOURCE: &str = include_str!("systemd.rs");

/// Directory names: `systemd-<hash>`, built in `.systemd-build-<hash>-<pid>-<n>`.
const IMAGE_PREFIX: &str = "systemd-";
const BUILD_PREFIX: &str = ".systemd-build-";

/// The image of the current recipe: the `debian12-6.1` kernel and initramfs (built first
/// when missing) and this recipe's root disk (built when missing; needs root).
pub fn ensure_systemd_image() -> Result<Image> {
    let kernel = ensure_image(LANE.kernel_suite)?;
    let hash = recipe_hash(&kernel);
    let dir = cache_root().join(format!("{IMAGE_PREFIX}{hash}"));
    if !dir.join(build::COMPLETE_MARKER).is_file() {
        build_rootfs(&kernel, &hash, &dir)?;
    }
    Ok(Image {
        vmlinux: kernel.vmlinux,
        initrd: kernel.initrd,
        rootfs: dir.join("rootfs.img"),
        dir,
    })
}

/// The first 16 hex digits of a SHA-256 over the suite, the packages, this file and the
/// kernel image's directory name (its own recipe hash).
fn recipe_hash(kernel: &Image) -> String {
    let mut h = Sha256::new();
    let kernel_name = kernel.dir.file_name().unwrap_or_default().to_string_lossy();
    let packages = PACKAGES.join(" ");
    for (name, content) in [
        ("suite", SUITE),
        ("packages", packages.as_str()),
        ("systemd.rs", THIS_SOURCE),
        ("kernel-image", kernel_name.as_ref()),
    ] {
        for field in [name, content] {
            h.update((field.len() as u64).to_le_bytes());
            h.update(field);
        }
    }
    let mut hex = format!("{:x}", h.finalize());
    hex.truncate(16);
    hex
}

fn build_rootfs(kernel: &Image, hash: &str, final_dir: &Path) -> Result<()> {
    let start = Instant::now();
    ensure!(
        is_root(),
        "the debian12-systemd image is built as root (mmdebstrap, chroot): run as root"
    );
    for tool in ["mmdebstrap", "debugfs", "mke2fs", "unshare"] {
        ensure!(
            find_command(tool).is_some(),
            "`{tool}` not found (cargo xtask vm-build installs mmdebstrap; debugfs and mke2fs \
             are e2fsprogs')"
        );
    }
    let cache = cache_root();
    let build_pid = |name: &str| -> Option<u32> {
        name.strip_prefix(BUILD_PREFIX)?
            .split('-')
            .nth(1)?
            .parse()
            .ok()
    };
    for stale in orphans(&cache, build_pid) {
        remove_stale(&stale);
    }
    let tmp = TempTree::create_in(&cache, &format!("{BUILD_PREFIX}{hash}-"))?;
    let dir = tmp.path().to_path_buf();
    let mut steps = Steps::new(
        &format!("VM image {IMAGE_PREFIX}{hash} (Debian 12 with systemd)"),
        4,
        dir.join("build.log"),
        false,
        cache.join("last-failed-build.log"),
    );
    let rootfs = dir.join("rootfs");
    steps.run(&format!("root filesystem: mmdebstrap {SUITE}"), |r| {
        let mut cmd = Command::new("unshare");
        // A private mount namespace: mmdebstrap's mounts in the chroot never reach the
        // host's mount table, even if it is killed.
        cmd.args(["--mount", "--propagation", "private", "--"])
            .arg("mmdebstrap")
            .args(["--mode=root", "--variant=minbase", "--verbose"])
            .arg(format!("--include={}", PACKAGES.join(",")))
            .arg("--aptopt=Acquire::Retries \"3\"")
            .arg(SUITE)
            .arg(&rootfs)
            .args(crate::host::debian::mirrors("CODECAGE_VM_MIRROR", SUITE));
        r.run("mmdebstrap", cmd)
    })?;
    steps.run("the kernel's modules (debugfs rdump)", |r| {
        // bookworm's /lib is a link to usr/lib.
        let to = rootfs.join("usr/lib");
        let mut cmd = Command::new(find_command("debugfs").context("debugfs")?);
        cmd.arg("-R")
            .arg(format!("rdump /usr/lib/modules {}", to.display()))
            .arg(&kernel.rootfs);
        r.run("debugfs", cmd)?;
        let modules = fs::read_dir(to.join("modules"))
            .context("debugfs copied no /usr/lib/modules")?
            .count();
        ensure!(modules > 0, "the kernel image has no modules");
        Ok(())
    })?;
    steps.run("guest files (systemd as init, the job unit)", |_| {
        customize(&rootfs)
    })?;
    steps.run("root disk: mke2fs -d", |r| {
        make_disk(r, &rootfs, &dir.join("rootfs.img"))
    })?;
    remove_tree(&rootfs)?;
    fs::write(
        dir.join("image.txt"),
        format!(
            "codecage VM image (Debian 12 with systemd)\nrecipe: {hash}\nsuite: {SUITE}\n\
             kernel image: {}\npackages: {}\nbuilt in: {}\n",
            kernel.dir.display(),
            PACKAGES.join(" "),
            secs(start.elapsed())
        ),
    )?;
    let mut marker = fs::File::create(dir.join(build::COMPLETE_MARKER))?;
    marker.write_all(b"ok\n")?;
    marker.sync_all()?;
    match fs::rename(&dir, final_dir) {
        Ok(()) => {}
        Err(_) if final_dir.join(build::COMPLETE_MARKER).is_file() => {}
        Err(e) => return Err(e).context(format!("renaming to {}", final_dir.display())),
    }
    drop(tmp);
    // Older recipes' disks (~1 GB each).
    let keep = final_dir.file_name().unwrap_or_default().to_os_string();
    for entry in fs::read_dir(&cache)?.flatten() {
        let name = entry.file_name();
        if name != keep
            && name.to_string_lossy().starts_with(IMAGE_PREFIX)
            && entry.path().join(build::COMPLETE_MARKER).is_file()
        {
            status("Removing", format!("old image {}", entry.path().display()));
            if let Err(e) = remove_tree(&entry.path()) {
                warn(format!("{e:#}"));
            }
        }
    }
    status(
        "Finished",
        format!(
            "VM image {} in {}",
            final_dir.display(),
            secs(start.elapsed())
        ),
    );
    Ok(())
}

/// systemd as the init the initramfs starts, the job unit enabled, the slow units masked.
fn customize(rootfs: &Path) -> Result<()> {
    let init = rootfs.join("sbin/codecage-vm-init");
    let _ = fs::remove_file(&init);
    symlink("/lib/systemd/systemd", &init)?;
    let stub = rootfs.join("usr/local/sbin/codecage-vm-job");
    fs::create_dir_all(stub.parent().expect("a parent"))?;
    fs::write(&stub, JOB_STUB)?;
    fs::set_permissions(&stub, fs::Permissions::from_mode(0o755))?;
    let units = rootfs.join("etc/systemd/system");
    fs::write(units.join("codecage-vm-job.service"), JOB_UNIT)?;
    let wants = units.join("multi-user.target.wants");
    fs::create_dir_all(&wants)?;
    symlink(
        "/etc/systemd/system/codecage-vm-job.service",
        wants.join("codecage-vm-job.service"),
    )?;
    for unit in MASKED {
        let _ = fs::remove_file(units.join(unit));
        symlink("/dev/null", units.join(unit))?;
    }
    fs::write(rootfs.join("etc/hostname"), "vm\n")?;
    fs::write(
        rootfs.join("etc/hosts"),
        "127.0.0.1\tlocalhost\n127.0.1.1\tvm\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    )?;
    // The initramfs mounted the root read-write; nothing else to mount.
    fs::write(
        rootfs.join("etc/fstab"),
        "# the root is mounted by the initramfs\n",
    )?;
    let _ = fs::remove_file(rootfs.join("etc/resolv.conf"));
    fs::write(rootfs.join("etc/resolv.conf"), "")?;
    // A machine id per boot (systemd makes a transient one when the file is empty).
    fs::write(rootfs.join("etc/machine-id"), "")?;
    Ok(())
}

/// The ext4 root disk, sparse, populated by `mke2fs -d` (no loop mount), no journal (every
/// boot uses a throw-away snapshot).
fn make_disk(r: &Runner, rootfs: &Path, out: &Path) -> Result<()> {
    let du = r.capture({
        let mut du = Command::new("du");
        du.args(["-sb"]).arg(rootfs);
        du
    })?;
    let used: u64 = String::from_utf8_lossy(&du.stdout)
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .context("du -sb of the root filesystem")?;
    let size_mib = (used + DISK_SLACK).div_ceil(1 << 20);
    let mut mke2fs = Command::new(find_command("mke2fs").context("mke2fs not found")?);
    mke2fs
        .args(["-q", "-F", "-t", "ext4", "-O", "^has_journal"])
        .args(["-L", "codecage-vm", "-E", "root_owner=0:0", "-d"])
        .arg(rootfs)
        .arg(out)
        .arg(format!("{size_mib}M"));
    r.run("mke2fs", mke2fs)
}
