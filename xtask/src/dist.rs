//! `cargo xtask dist`: the Debian package, `target/dist/codecage_VERSION_ARCH.deb`.
//!
//! Built with `dpkg-deb` from a tree this task lays out itself, not with cargo-deb: every
//! file, the conffiles and the maintainer scripts are spelled out here and in
//! `packaging/debian/`, nothing has to be compiled or installed first (dpkg-deb is on
//! every Debian host), and the result is checked by the same task (`dpkg-deb -c` must list
//! what [`expected_paths`] says).
//!
//! What it holds:
//! - `/usr/bin/codecage`: the release binary, linked statically and stripped, and beside
//!   it `/usr/libexec/codecage/codecage-init`, the sandboxes' pid 1 (the launcher executes
//!   it instead of itself; static too), and `/usr/libexec/codecage/codecage-full`, every
//!   command with the server's code (`codecage` executes it for `serve`, `mcp`, `audit`,
//!   `image` and `openapi`, and for what asks the host's name service), linked
//!   dynamically;
//! - `/usr/share/codecage/profiles/` and `/usr/share/codecage/seccomp/`: the built-in
//!   profiles and seccomp policy, for reference (the binary has them built in; a file in
//!   /etc/codecage/profiles replaces a profile);
//! - `/etc/codecage/config.toml` (the CLI's host config) and `/etc/codecage/server.toml`
//!   (the service's server config), both conffiles;
//! - `/lib/systemd/system/codecage.service` (packaging/debian/codecage.service), enabled
//!   and started on install as debhelper's scripts do, stopped on removal;
//! - `/usr/share/codecage/recipes/`: the image recipes of `rootfs/` (with its README),
//!   which `codecage image build` finds there; `/etc/codecage/recipes/`, empty, for the
//!   operator's own (searched first);
//! - man pages generated from the CLI's clap definitions (examples/mangen.rs,
//!   clap_mangen), `codecage-image-build.1` and the other image commands' among them;
//! - purge removes /var/lib/codecage (images, audit log), /var/cache/codecage and
//!   /run/codecage.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, ensure, Context, Result};

use crate::host::{self, workspace_root};
use codecage_image::rootfs;

/// Where the package puts the image recipes (`codecage image build` looks there).
const RECIPES: &str = rootfs::INSTALLED_RECIPES;

#[derive(clap::Args, Debug)]
#[command(
    about = "Build the Debian package (target/dist/codecage_VERSION_ARCH.deb)",
    long_about = "Builds the release binary, the man pages (clap_mangen) and a Debian \
                  package with dpkg-deb: the stripped binary, the built-in profiles and \
                  seccomp policy, /etc/codecage/config.toml and server.toml (conffiles), \
                  the systemd unit. Checks the package's file list and prints its path and \
                  size."
)]
pub struct Args {
    /// Package target/release/codecage as it is, without `cargo build --release`.
    #[arg(long)]
    no_build: bool,
    /// The directory the .deb is written to (default target/dist).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Then install, run, upgrade and purge the package in the debian12-systemd VM
    /// (Debian 12, systemd as pid 1; packaging/debian/vm-check.sh), building its image
    /// first when needed (as root).
    #[arg(long)]
    vm_check: bool,
    /// With --vm-check: also try each hardening directive the unit does not have, one at a
    /// time, and say which work.
    #[arg(long, requires = "vm_check")]
    try_hardening: bool,
    /// Package the debug build (target/debug, into target/dist/debug) instead of the
    /// release build: what `cargo xtask test` checks in the VM, not for distribution.
    #[arg(long)]
    debug: bool,
}

impl Args {
    /// `cargo xtask test`'s: the debug build's package, checked in the VM.
    pub fn vm_check_of_the_debug_build() -> Args {
        Args {
            no_build: false,
            out: None,
            vm_check: true,
            try_hardening: false,
            debug: true,
        }
    }

    /// Whether the task boots a VM (it then polls interrupts to stop QEMU).
    pub fn boots_a_vm(&self) -> bool {
        self.vm_check
    }
}

/// The package's name, its unit and its conffiles.
const PACKAGE: &str = "codecage";
/// The sandboxes' init binary, and where the package puts it (where `codecage` looks for
/// it when it is not beside it: src/main.rs).
const INIT: &str = "codecage-init";
const INIT_PATH: &str = "/usr/libexec/codecage/codecage-init";
const FULL: &str = "codecage-full";
const FULL_PATH: &str = "/usr/libexec/codecage/codecage-full";
const CONFFILES: &[&str] = &["/etc/codecage/config.toml", "/etc/codecage/server.toml"];
const UNIT: &str = "/lib/systemd/system/codecage.service";
const MAINTAINER: &str = "codecage maintainers <maintainers@codecage.invalid>";

pub fn dist(args: &Args) -> Result<i32> {
    let root = workspace_root();
    let version = package_version(&std::fs::read_to_string(root.join("Cargo.toml"))?)?;
    let arch = output(Command::new("dpkg").arg("--print-architecture"))?;
    let profile = if args.debug { "debug" } else { "release" };
    let dist = if args.debug {
        root.join("target/dist/debug")
    } else {
        root.join("target/dist")
    };
    let out = args.out.clone().unwrap_or_else(|| dist.clone());
    let stage = dist.join(format!("{PACKAGE}_{version}_{arch}"));

    // The VM first: a check that cannot boot should fail before a release build.
    let vm_image = if args.vm_check {
        Some(crate::vm::systemd::ensure_systemd_image()?)
    } else {
        None
    };

    if !args.no_build {
        host::status("building", format!("the {profile} binaries (cargo build)"));
        let mut build = Command::new("cargo");
        build.current_dir(&root).arg("build");
        if !args.debug {
            build.arg("--release");
        }
        run(build.args(["--locked", "--bin", PACKAGE, "--bin", FULL, "--bin", INIT]))?;
        host::status(
            "linking",
            format!("the {profile} {INIT} and {PACKAGE} statically"),
        );
        host::link_static_init(&root, !args.debug)?;
        host::link_static_launcher(&root, !args.debug)?;
    }
    let binary = root.join("target").join(profile).join(PACKAGE);
    let init = root.join("target").join(profile).join(INIT);
    let full = root.join("target").join(profile).join(FULL);
    for file in [&binary, &init, &full] {
        ensure!(
            file.is_file(),
            "{} does not exist: run without --no-build",
            file.display()
        );
    }

    if stage.exists() {
        std::fs::remove_dir_all(&stage)
            .with_context(|| format!("removing the old {}", stage.display()))?;
    }
    let put = |rel: &str, from: &Path, mode: u32| -> Result<()> {
        let to = stage.join(rel.trim_start_matches('/'));
        std::fs::create_dir_all(to.parent().expect("a file under the stage"))?;
        std::fs::copy(from, &to)
            .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
        set_mode(&to, mode)
    };
    let write = |rel: &str, text: &str, mode: u32| -> Result<()> {
        let to = stage.join(rel.trim_start_matches('/'));
        std::fs::create_dir_all(to.parent().expect("a file under the stage"))?;
        std::fs::write(&to, text).with_context(|| format!("writing {}", to.display()))?;
        set_mode(&to, mode)
    };

    // The binaries, stripped (the release profile keeps line tables for backtraces).
    put("/usr/bin/codecage", &binary, 0o755)?;
    put(INIT_PATH, &init, 0o755)?;
    put(FULL_PATH, &full, 0o755)?;
    for file in ["/usr/bin/codecage", INIT_PATH, FULL_PATH] {
        run(Command::new("strip")
            .arg("--strip-all")
            .arg(stage.join(file.trim_start_matches('/'))))?;
    }

    // The built-in profiles and the seccomp policy, as shipped in the binary.
    for (dir, ext, to) in [
        ("profiles", "toml", "/usr/share/codecage/profiles"),
        ("profiles/seccomp", "json", "/usr/share/codecage/seccomp"),
    ] {
        for file in files_with_extension(&root.join(dir), ext)? {
            let name = file.file_name().expect("a file name").to_string_lossy();
            put(&format!("{to}/{name}"), &file, 0o644)?;
        }
    }
    put(
        "/usr/share/codecage/profiles/README.md",
        &root.join("profiles/README.md"),
        0o644,
    )?;
    std::fs::create_dir_all(stage.join("etc/codecage/profiles"))?;

    // The image recipes, for `codecage image build`: each file as the recipe hash reads
    // it, so an image built from them is the one `cargo xtask rootfs` builds.
    let recipes = root.join("rootfs");
    for name in rootfs::list_recipes(&recipes) {
        let recipe = rootfs::Recipe::find(std::slice::from_ref(&recipes), &name)?;
        for (rel, content) in &recipe.files {
            write(
                &format!("{RECIPES}/{name}/{rel}"),
                &String::from_utf8(content.clone())
                    .with_context(|| format!("rootfs/{name}/{rel} is not UTF-8"))?,
                0o644,
            )?;
        }
    }
    put(
        &format!("{RECIPES}/README.md"),
        &recipes.join("README.md"),
        0o644,
    )?;
    std::fs::create_dir_all(stage.join("etc/codecage/recipes"))?;

    let packaging = root.join("packaging/debian");
    for conffile in CONFFILES {
        let name = Path::new(conffile).file_name().expect("a file name");
        put(conffile, &packaging.join(name), 0o644)?;
    }
    put(UNIT, &packaging.join("codecage.service"), 0o644)?;

    // The man pages, from the CLI's own definitions.
    host::status("generating", "the man pages (examples/mangen.rs)");
    let man = stage.join("usr/share/man/man1");
    run(Command::new("cargo")
        .current_dir(&root)
        .args([
            "run",
            "--quiet",
            "--locked",
            "--features",
            "mangen",
            "--example",
            "mangen",
            "--",
        ])
        .arg(&man))?;
    run(Command::new("gzip")
        .args(["-9", "-n"])
        .args(files_with_extension(&man, "1")?))?;

    // Debian's documentation files.
    let doc = "/usr/share/doc/codecage";
    write(&format!("{doc}/copyright"), COPYRIGHT, 0o644)?;
    let commit =
        output(
            Command::new("git")
                .current_dir(&root)
                .args(["rev-parse", "--short=12", "HEAD"]),
        )
        .unwrap_or_else(|_| "unknown".into());
    let date = output(Command::new("date").arg("-R"))?;
    write(
        &format!("{doc}/changelog"),
        &changelog(&version, &commit, &date),
        0o644,
    )?;
    run(Command::new("gzip")
        .args(["-9", "-n"])
        .arg(stage.join(doc.trim_start_matches('/')).join("changelog")))?;

    // The control files. `codecage` and the init are static; codecage-full is what needs
    // the host's glibc (and its name service modules).
    let glibc = glibc_needed(&output(
        Command::new("objdump")
            .arg("-T")
            .arg(stage.join(FULL_PATH.trim_start_matches('/'))),
    )?)
    .context("the binary names no GLIBC_ symbol version (objdump -T)")?;
    let installed_kib = output(
        Command::new("du")
            .args(["-sk", "--apparent-size"])
            .arg(&stage),
    )?
    .split_whitespace()
    .next()
    .and_then(|n| n.parse::<u64>().ok())
    .context("du -sk of the stage")?;
    write(
        "/DEBIAN/control",
        &control(&version, &arch, &glibc, installed_kib),
        0o644,
    )?;
    write("/DEBIAN/conffiles", &(CONFFILES.join("\n") + "\n"), 0o644)?;
    write("/DEBIAN/postinst", POSTINST, 0o755)?;
    write("/DEBIAN/prerm", PRERM, 0o755)?;
    write("/DEBIAN/postrm", POSTRM, 0o755)?;
    let md5sums = output(
        Command::new("sh")
            .current_dir(&stage)
            .args(["-c", "find usr lib -type f | LC_ALL=C sort | xargs md5sum"]),
    )?;
    write("/DEBIAN/md5sums", &(md5sums + "\n"), 0o644)?;

    // The package, owned by root whoever builds it.
    std::fs::create_dir_all(&out)?;
    let deb = out.join(format!("{PACKAGE}_{version}_{arch}.deb"));
    run(Command::new("dpkg-deb")
        .args(["--root-owner-group", "--build"])
        .args(compression(args.debug))
        .arg(&stage)
        .arg(&deb))?;

    // What dpkg will install is what this task meant to ship.
    let listing = output(Command::new("dpkg-deb").arg("-c").arg(&deb))?;
    let listed = listed_paths(&listing);
    let pages = files_with_extension(&man, "gz")?;
    ensure!(
        pages.len() > 5,
        "only {} man pages were generated",
        pages.len()
    );
    for path in expected_paths() {
        ensure!(
            listed.iter().any(|p| p == path),
            "{} is not in {} (dpkg-deb -c)",
            path,
            deb.display()
        );
    }
    let conffiles = output(
        Command::new("dpkg-deb")
            .arg("--info")
            .arg(&deb)
            .arg("conffiles"),
    )?;
    ensure!(
        conffiles.lines().eq(CONFFILES.iter().copied()),
        "the package's conffiles are {conffiles:?}"
    );
    let size = std::fs::metadata(&deb)?.len();
    println!(
        "{} ({:.1} MiB; {} files, {} man pages, installed {:.1} MiB, Depends libc6 (>= {glibc}))",
        deb.display(),
        size as f64 / (1 << 20) as f64,
        listed.iter().filter(|p| !p.ends_with('/')).count(),
        pages.len(),
        installed_kib as f64 / 1024.0
    );
    if let Some(image) = vm_image {
        return vm_check(
            &root,
            &image,
            &deb,
            &version,
            args.try_hardening,
            args.debug,
        );
    }
    Ok(0)
}

/// The version of the upgrade `--vm-check` installs: one patch level up.
fn next_version(version: &str) -> Result<String> {
    let (head, last) = version
        .rsplit_once('.')
        .with_context(|| format!("version {version} has no patch level"))?;
    let digits: String = last.chars().take_while(char::is_ascii_digit).collect();
    let patch: u64 = digits
        .parse()
        .with_context(|| format!("version {version}'s last part is not a number"))?;
    Ok(format!("{head}.{}", patch + 1))
}

/// `--vm-check`: the package and its upgrade (the same files, the version one patch level
/// up) in a directory under target/dist, packaging/debian/vm-check.sh run on them in the
/// debian12-systemd VM; its status.
/// dpkg-deb's compression: xz for a release package (the smallest); gzip -1 for the debug
/// build's, which only `cargo xtask test` installs in the VM (its 46 MB tree took 27 s of
/// CPU under xz, twice per check with the upgrade's package; gzip -1 takes half a second).
fn compression(debug: bool) -> [&'static str; 2] {
    if debug {
        ["-Zgzip", "-z1"]
    } else {
        ["-Zxz", "-z6"]
    }
}

fn vm_check(
    root: &Path,
    image: &crate::vm::Image,
    deb: &Path,
    version: &str,
    try_hardening: bool,
    debug: bool,
) -> Result<i32> {
    let tmp = host::TempTree::create_in(
        deb.parent().expect("the package is in a directory"),
        "vm-check-",
    )?;
    let dir = tmp.path();
    std::fs::copy(deb, dir.join("this.deb"))?;
    let unpacked = dir.join("next");
    run(Command::new("dpkg-deb").arg("-R").arg(deb).arg(&unpacked))?;
    let next = next_version(version)?;
    let control = unpacked.join("DEBIAN/control");
    let text = std::fs::read_to_string(&control)?;
    std::fs::write(
        &control,
        text.replace(
            &format!("\nVersion: {version}\n"),
            &format!("\nVersion: {next}\n"),
        ),
    )?;
    run(Command::new("dpkg-deb")
        .args(["--root-owner-group", "--build"])
        .args(compression(debug))
        .arg(&unpacked)
        .arg(dir.join("next.deb"))
        .stdout(std::process::Stdio::null()))?;
    ensure!(
        output(
            Command::new("dpkg-deb")
                .args(["-f"])
                .arg(dir.join("next.deb"))
                .arg("Version")
        )? == next,
        "the upgrade's control file did not take version {next}"
    );
    let script = root.join("packaging/debian/vm-check.sh");
    let mut opts = crate::vm::run::RunOptions::new(vec![
        "bash".into(),
        script.display().to_string(),
        dir.display().to_string(),
    ]);
    opts.share = root.canonicalize()?;
    opts.cwd = opts.share.clone();
    opts.timeout = if try_hardening { 1800 } else { 900 };
    if try_hardening {
        opts.env.push(("TRY_HARDENING".into(), "1".into()));
    }
    host::status(
        "Checking",
        format!(
            "{} under systemd in the {} VM",
            deb.display(),
            crate::vm::systemd::LANE.name
        ),
    );
    let start = std::time::Instant::now();
    let rc = crate::vm::run::run(&crate::vm::systemd::LANE, image, &opts)?;
    if rc == 0 {
        host::status(
            "Finished",
            format!("the VM check passed in {}", host::secs(start.elapsed())),
        );
    } else {
        eprintln!(
            "error: the VM check of {} failed (status {rc}) after {}",
            deb.display(),
            host::secs(start.elapsed())
        );
    }
    Ok(rc)
}

/// The paths (absolute, directories with a trailing slash) in `dpkg-deb -c` output.
fn listed_paths(listing: &str) -> Vec<String> {
    listing
        .lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .map(|p| p.trim_start_matches('.').to_string())
        .collect()
}

/// Files the package must hold whatever else it has.
fn expected_paths() -> Vec<&'static str> {
    let mut paths = vec![
        "/usr/bin/codecage",
        INIT_PATH,
        FULL_PATH,
        "/usr/share/codecage/profiles/python.toml",
        "/usr/share/codecage/profiles/ci.toml",
        "/usr/share/codecage/seccomp/x86_64.json",
        "/usr/share/codecage/seccomp/aarch64.json",
        "/usr/share/man/man1/codecage.1.gz",
        "/usr/share/man/man1/codecage-serve.1.gz",
        "/usr/share/man/man1/codecage-session-create.1.gz",
        "/usr/share/man/man1/codecage-image-build.1.gz",
        "/usr/share/man/man1/codecage-image-list.1.gz",
        "/usr/share/man/man1/codecage-image-verify.1.gz",
        "/usr/share/codecage/recipes/README.md",
        "/usr/share/codecage/recipes/default/packages.txt",
        "/usr/share/codecage/recipes/default/requirements.txt",
        "/usr/share/codecage/recipes/default/check.sh",
        "/usr/share/doc/codecage/copyright",
        "/etc/codecage/profiles/",
        "/etc/codecage/recipes/",
        UNIT,
    ];
    paths.extend(CONFFILES);
    paths
}

/// `version` of the `[package]` table in Cargo.toml.
fn package_version(manifest: &str) -> Result<String> {
    let mut in_package = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_package = line == "[package]";
        } else if let Some(value) = line.strip_prefix("version").map(str::trim_start) {
            if let (true, Some(value)) = (in_package, value.strip_prefix('=')) {
                return Ok(value.trim().trim_matches('"').to_string());
            }
        }
    }
    bail!("Cargo.toml has no version in [package]")
}

/// The newest GLIBC_x.y symbol version in `objdump -T` output: the libc6 the binary needs.
fn glibc_needed(objdump: &str) -> Option<String> {
    objdump
        .split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .filter_map(|w| w.strip_prefix("GLIBC_"))
        .filter_map(|v| {
            let parts: Option<Vec<u32>> = v.split('.').map(|n| n.parse().ok()).collect();
            parts.map(|p| (p, v))
        })
        .max_by(|a, b| a.0.cmp(&b.0))
        .map(|(_, v)| v.to_string())
}

fn control(version: &str, arch: &str, glibc: &str, installed_kib: u64) -> String {
    let mut c = String::new();
    let _ = writeln!(c, "Package: {PACKAGE}");
    let _ = writeln!(c, "Version: {version}");
    let _ = writeln!(c, "Architecture: {arch}");
    let _ = writeln!(c, "Maintainer: {MAINTAINER}");
    let _ = writeln!(c, "Installed-Size: {installed_kib}");
    let _ = writeln!(
        c,
        "Depends: libc6 (>= {glibc}), init-system-helpers (>= 1.54~)"
    );
    // `codecage image build` installs mmdebstrap with apt-get when it is missing.
    let _ = writeln!(c, "Suggests: mmdebstrap");
    let _ = writeln!(c, "Section: admin");
    let _ = writeln!(c, "Priority: optional");
    c.push_str(
        "Description: Linux-native sandbox for untrusted Python, JavaScript and bash\n \
         codecage runs untrusted code in sandboxes it builds itself from Linux\n \
         namespaces, cgroups, Landlock and seccomp: one-shot runs (codecage run),\n \
         sessions with a persistent interpreter, and an HTTP and MCP server\n \
         (codecage serve, the codecage service).\n",
    );
    c
}

fn changelog(version: &str, commit: &str, date: &str) -> String {
    format!(
        "{PACKAGE} ({version}) unstable; urgency=medium\n\n  \
         * Built by cargo xtask dist from commit {commit}.\n\n \
         -- {MAINTAINER}  {date}\n"
    )
}

const COPYRIGHT: &str = "\
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: codecage

Files: *
Copyright: 2026 The codecage authors
License: Apache-2.0
 On Debian systems, the full text of the Apache License 2.0 is in
 /usr/share/common-licenses/Apache-2.0.
";

/// As debhelper's dh_installsystemd writes it: enable on first install (keeping an
/// administrator's disable across upgrades), then start, or restart on upgrade.
const POSTINST: &str = r#"#!/bin/sh
set -e
case "$1" in
configure|abort-upgrade|abort-deconfigure|abort-remove)
    # Remove only a mask that a removal of this package made.
    deb-systemd-helper unmask codecage.service >/dev/null || true
    if deb-systemd-helper --quiet was-enabled codecage.service; then
        deb-systemd-helper enable codecage.service >/dev/null || true
    else
        deb-systemd-helper update-state codecage.service >/dev/null || true
    fi
    if [ -d /run/systemd/system ]; then
        systemctl --system daemon-reload >/dev/null || true
        if [ -n "$2" ]; then action=restart; else action=start; fi
        deb-systemd-invoke "$action" codecage.service >/dev/null || true
    fi
    ;;
esac
exit 0
"#;

const PRERM: &str = r#"#!/bin/sh
set -e
if [ -d /run/systemd/system ] && [ "$1" = remove ]; then
    deb-systemd-invoke stop codecage.service >/dev/null || true
fi
exit 0
"#;

/// Purge leaves no file of codecage's: its data (images, the audit log), cache and run
/// directories, and the empty `codecage` parent cgroups it made.
const POSTRM: &str = r#"#!/bin/sh
set -e
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
    systemctl --system daemon-reload >/dev/null || true
fi
if [ "$1" = remove ] && command -v deb-systemd-helper >/dev/null; then
    deb-systemd-helper mask codecage.service >/dev/null || true
fi
if [ "$1" = purge ]; then
    if command -v deb-systemd-helper >/dev/null; then
        deb-systemd-helper purge codecage.service >/dev/null || true
        deb-systemd-helper unmask codecage.service >/dev/null || true
    fi
    rm -rf --one-file-system /var/lib/codecage /var/cache/codecage /run/codecage
    for dir in /sys/fs/cgroup/codecage /sys/fs/cgroup/*/codecage; do
        [ -d "$dir" ] && rmdir "$dir" 2>/dev/null || true
    done
fi
exit 0
"#;

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {mode:o} {}", path.display()))
}

/// The files `dir/*.ext`, sorted.
fn files_with_extension(dir: &Path, ext: &str) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == ext))
        .collect();
    files.sort();
    Ok(files)
}

fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("running {}", host::display_command(cmd)))?;
    ensure!(
        status.success(),
        "{} failed ({status})",
        host::display_command(cmd)
    );
    Ok(())
}

/// A command's stdout, trimmed; its stderr is shown with the error when it fails.
fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("running {}", host::display_command(cmd)))?;
    ensure!(
        out.status.success(),
        "{} failed ({}): {}",
        host::display_command(cmd),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_is_the_package_tables() {
        let manifest = "[package]\nname = \"codecage\"\nversion = \"0.1.0\"\n\n[dependencies]\nversion = \"9\"\n";
        assert_eq!(package_version(manifest).unwrap(), "0.1.0");
        assert!(package_version("[dependencies]\nversion = \"1\"\n").is_err());
        let real = std::fs::read_to_string(workspace_root().join("Cargo.toml")).unwrap();
        assert!(package_version(&real)
            .unwrap()
            .starts_with(|c: char| c.is_ascii_digit()));
    }

    #[test]
    fn the_upgrade_is_one_patch_level_up() {
        assert_eq!(next_version("0.1.0").unwrap(), "0.1.1");
        assert_eq!(next_version("1.2.9").unwrap(), "1.2.10");
        assert!(next_version("7").is_err());
        assert!(next_version("1.x").is_err());
    }

    #[test]
    fn the_vm_check_script_parses() {
        let script = workspace_root().join("packaging/debian/vm-check.sh");
        let out = Command::new("bash")
            .arg("-n")
            .arg(&script)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let job = workspace_root().join("xtask/vm/systemd-job.sh");
        let out = Command::new("sh").arg("-n").arg(&job).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    fn libc6_is_the_newest_glibc_symbol_version() {
        let objdump = "0000 DF *UND* 0000 (GLIBC_2.2.5) memcpy\n\
                       0000 DF *UND* 0000 (GLIBC_2.34) pthread_create\n\
                       0000 DF *UND* 0000 (GLIBC_2.9) pipe2\n\
                       0000 DF *UND* 0000  GLIBC_PRIVATE  x\n";
        assert_eq!(glibc_needed(objdump).as_deref(), Some("2.34"));
        assert_eq!(glibc_needed("no versions"), None);
    }

    #[test]
    fn the_control_file_has_every_required_field_and_a_folded_description() {
        let text = control("0.1.0", "amd64", "2.34", 12345);
        for field in [
            "Package: codecage\n",
            "Version: 0.1.0\n",
            "Architecture: amd64\n",
            "Maintainer: ",
            "Installed-Size: 12345\n",
            "Depends: libc6 (>= 2.34)",
        ] {
            assert!(text.contains(field), "{field:?} in {text}");
        }
        let description: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("Description:"))
            .collect();
        assert!(description.len() > 2);
        assert!(
            description[1..]
                .iter()
                .all(|l| l.starts_with(' ') && l.len() < 80),
            "{description:?}"
        );
    }

    #[test]
    fn dpkg_deb_listings_give_absolute_paths() {
        let listing = "drwxr-xr-x root/root         0 2026-11-26 14:00 ./etc/codecage/profiles/\n\
                       -rwxr-xr-x root/root   9000000 2026-11-26 14:00 ./usr/bin/codecage\n";
        assert_eq!(
            listed_paths(listing),
            ["/etc/codecage/profiles/", "/usr/bin/codecage"]
        );
    }

    /// Every file the package takes from packaging/debian exists, and the maintainer
    /// scripts are valid sh.
    #[test]
    fn the_packaging_files_exist_and_the_scripts_parse() {
        let packaging = workspace_root().join("packaging/debian");
        for name in ["config.toml", "server.toml", "codecage.service"] {
            assert!(packaging.join(name).is_file(), "{name}");
        }
        for (name, script) in [("postinst", POSTINST), ("prerm", PRERM), ("postrm", POSTRM)] {
            let out = Command::new("sh")
                .args(["-n", "-c", script])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{name}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    /// The unit for a build from source (docs/systemd) carries every hardening directive
    /// of the package's unit, so that the two cannot drift apart: a directive tried and
    /// kept in packaging/debian/codecage.service is kept in both.
    #[test]
    fn the_source_builds_unit_has_the_packages_hardening() {
        let root = workspace_root();
        let directives = |path: &str| -> std::collections::BTreeSet<String> {
            std::fs::read_to_string(root.join(path))
                .unwrap()
                .lines()
                .map(str::trim)
                .filter(|l| {
                    [
                        "Protect",
                        "Private",
                        "Restrict",
                        "NoNewPrivileges",
                        "LockPersonality",
                        "SystemCallArchitectures",
                        "KeyringMode",
                        "ReadWritePaths",
                    ]
                    .iter()
                    .any(|p| l.starts_with(p))
                })
                .map(String::from)
                .collect()
        };
        let package = directives("packaging/debian/codecage.service");
        let source = directives("docs/systemd/codecage.service");
        assert!(package.len() >= 15, "{package:?}");
        let missing: Vec<_> = package.difference(&source).collect();
        assert!(
            missing.is_empty(),
            "docs/systemd/codecage.service lacks {missing:?}"
        );
    }
}
