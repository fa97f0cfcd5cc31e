//! The steps of a rootfs build. This file and the scripts it includes are part
//! of the recipe hash (see [`SOURCES`]): changing how the image is built
//! rebuilds it.
//!
//! 1. host tools: mmdebstrap (installed with apt-get when missing), unshare, chroot
//! 2. Debian packages: `mmdebstrap --mode=root --variant=minbase` in a private
//!    mount namespace, without docs, man pages, info and locales
//! 3. PyPI packages: `pip install --no-deps -r requirements.txt` in the chroot
//! 4. npm packages: `npm ci` of package.json + package-lock.json in the chroot
//! 5. configuration and clean-up: matplotlib (Agg, pre-built font cache),
//!    build-only packages purged, caches and logs removed, the `sandbox` user,
//!    empty mount points, setuid/setgid bits and file capabilities removed
//! 6. smoke test: the recipe's `check.sh` as uid 1000 on a read-only root
//! 7. manifest, content hash, and the atomic switch of `<out>/<NAME>`
//!
//! Steps 3-6 run in the chroot through `chroot.sh`, each in its own private
//! mount namespace (`unshare --mount`), so no mount outlives its step or
//! reaches the host's mount table.

use super::manifest;
use super::{Paths, Recipe};
use crate::host::{
    debian, find_command, install_missing, kill_processes_rooted_in, mounts_below, remove_tree,
    secs, status, Recommends, Runner, Steps, TempTree,
};
use anyhow::{bail, ensure, Context, Result};
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// The Debian release of the image.
pub const SUITE: &str = "bookworm";

const CHROOT_SH: &str = include_str!("chroot.sh");
const PYTHON_SH: &str = include_str!("python.sh");
const NODE_SH: &str = include_str!("node.sh");
const FINISH_SH: &str = include_str!("finish.sh");
const MPLCACHE_PY: &str = include_str!("codecage_mplcache.py");

/// The smoke test's prelude; the recipe's `check.sh` follows it.
const CHECK_PRELUDE: &str = r#"# The sandbox's conditions, checked before the recipe's check.sh runs.
[ "$(id -u):$(id -g)" = 1000:1000 ] || { echo "running as $(id -u):$(id -g), not 1000:1000" >&2; exit 1; }
if ( : > /usr/.codecage-rw-test ) 2>/dev/null; then echo "the image root is writable" >&2; exit 1; fi
: > /work/.rw-test && : > /tmp/.rw-test && rm -f /work/.rw-test /tmp/.rw-test
echo "uid $(id -u) in $(pwd), HOME=$HOME, read-only root, writable /tmp and /work"
. /tmp/codecage/recipe/check.sh
"#;

/// Everything in xtask that decides what goes into an image, for the recipe
/// hash. (mod.rs only finds, names, places and cleans up images; `crate::host` runs the
/// tools and reports the steps.)
pub const SOURCES: &[(&str, &str)] = &[
    ("build.rs", include_str!("build.rs")),
    ("manifest.rs", include_str!("manifest.rs")),
    ("chroot.sh", CHROOT_SH),
    ("python.sh", PYTHON_SH),
    ("node.sh", NODE_SH),
    ("finish.sh", FINISH_SH),
    ("codecage_mplcache.py", MPLCACHE_PY),
    ("check prelude", CHECK_PRELUDE),
];

/// The variable that overrides the mirror (see [`debian::mirrors`]).
const MIRROR_VARIABLE: &str = "CODECAGE_ROOTFS_MIRROR";

/// dpkg options for mmdebstrap: no docs (but the copyright files), man
/// pages, info pages or translations. mmdebstrap also leaves them in the
/// image's /etc/dpkg/dpkg.cfg.d/, so the purge in step 5 follows them too.
const DPKG_OPTIONS: &[&str] = &[
    // No fsync per file while building (finish.sh removes it again; the
    // finished tree is synced once before it is put in place).
    "force-unsafe-io",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/locale/locale.alias",
    "path-exclude=/usr/share/lintian/*",
    "path-exclude=/usr/share/linda/*",
];

/// mmdebstrap's hooks for a merged /usr (shipped with mmdebstrap).
const MERGED_USR_HOOKS: &str = "/usr/share/mmdebstrap/hooks/merged-usr";

/// Host environment variables passed on to the downloads in the chroot (a
/// proxy or a registry mirror configured for this host).
const FORWARDED_ENV: &[&str] = &[
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "PIP_INDEX_URL",
    "npm_config_registry",
];

/// The sandbox user the image must have.
const SANDBOX_PASSWD: &str = "sandbox:x:1000:1000:sandbox:/work:/bin/bash";
const SANDBOX_GROUP: &str = "sandbox:x:1000:";

/// Facts gathered during the build for the manifest.
#[derive(Default)]
pub struct BuildInfo {
    pub mmdebstrap: String,
    pub mirrors: Vec<String>,
    pub setid_removed: Vec<String>,
    pub caps_removed: Vec<String>,
    pub smoke_test: Vec<String>,
}

/// Build the image of `recipe` and switch `<out>/<NAME>` to it.
pub fn build(recipe: &Recipe, paths: &Paths, verbose: bool, start: Instant) -> Result<()> {
    // The work directory (build log, staged recipe and scripts) and the
    // image under construction are removed on every failure path by their
    // guards; on success the image is renamed away and the log kept.
    let work = TempTree::at(paths.work.clone())?;
    fs::create_dir(work.path()).with_context(|| format!("creating {}", work.path().display()))?;
    let stage = work.path().join("stage");
    stage_recipe(recipe, &stage)?;
    let mut tmp = TempTree::at(paths.tmp.clone())?;
    let root = tmp.path().to_path_buf();

    let mut steps = Steps::new(
        &format!("rootfs {}", recipe.name),
        7,
        work.path().join("build.log"),
        verbose,
        paths.failed_log.clone(),
    );
    steps.runner().note(&format!(
        "codecage rootfs build: recipe {} ({}), image {}",
        recipe.name,
        recipe.hash,
        paths.image.display()
    ));
    let mut info = BuildInfo {
        mirrors: debian::mirrors(MIRROR_VARIABLE, SUITE),
        ..BuildInfo::default()
    };

    info.mmdebstrap = steps.run("host tools", host_tools)?;

    let packages = recipe.list("packages.txt")?;
    ensure!(
        !packages.is_empty(),
        "rootfs/{}/packages.txt lists no packages",
        recipe.name
    );
    steps.run("Debian packages with mmdebstrap", |r| {
        mmdebstrap(r, &packages, &root, &info.mirrors)
    })?;
    prepare_for_chroot(&root)?;

    if recipe.has("requirements.txt") {
        steps.run("PyPI packages with pip", |r| {
            chroot_step(r, "build", &root, &stage, ("python.sh", PYTHON_SH))
        })?;
    } else {
        steps.skip(
            "PyPI packages with pip",
            "the recipe has no requirements.txt",
        );
    }

    if recipe.has("package.json") {
        ensure!(
            recipe.has("package-lock.json"),
            "rootfs/{}/package.json needs a package-lock.json beside it (run `npm install --package-lock-only` there)",
            recipe.name
        );
        steps.run("npm packages with npm ci", |r| {
            chroot_step(r, "build", &root, &stage, ("node.sh", NODE_SH))
        })?;
    } else {
        steps.skip("npm packages with npm ci", "the recipe has no package.json");
    }

    steps.run("configuration and clean-up", |r| {
        chroot_step(r, "build", &root, &stage, ("finish.sh", FINISH_SH))?;
        finalize_tree(r, &root, &mut info)
    })?;

    if recipe.has("check.sh") {
        steps.run("smoke test as uid 1000 on a read-only root", |r| {
            chroot_step(
                r,
                "check",
                &root,
                &stage,
                ("check.sh (uid 1000, read-only root)", CHECK_PRELUDE),
            )
        })?;
        info.smoke_test = steps
            .last_output()
            .lines()
            .filter(|l| !l.starts_with("$ ") && !l.starts_with("====="))
            .map(str::to_string)
            .collect();
        for l in &info.smoke_test {
            eprintln!("{:>12} {l}", "");
        }
    } else {
        steps.skip(
            "smoke test as uid 1000 on a read-only root",
            "the recipe has no check.sh",
        );
    }

    steps
        .run("manifest, content hash and switch", |r| {
            let m = manifest::build(&root, recipe, &info, start)?;
            let text = serde_json::to_string_pretty(&m.json)? + "\n";
            manifest::write_into_image(&root, &text)?;
            r.note(&format!(
                "content hash {}, {} bytes in {} files",
                m.content_hash, m.size_bytes, m.files
            ));
            // Everything on disk before the name points at it.
            sync_tree(&root);
            super::install(paths, &mut tmp, &text)?;
            Ok(m)
        })
        .map(|m| {
            let _ = fs::rename(steps.log(), &paths.log);
            let _ = fs::remove_file(&paths.failed_log);
            status(
                "Finished",
                format!(
                    "rootfs {} ({}) in {}: {} -> {} ({}, {} files)",
                    recipe.name,
                    recipe.short(),
                    secs(start.elapsed()),
                    paths.link.display(),
                    paths.image_name(),
                    human_bytes(m.size_bytes),
                    m.files
                ),
            );
            status("Manifest", paths.manifest.display());
        })
}

pub fn human_bytes(n: u64) -> String {
    if n >= 1 << 30 {
        format!("{:.2} GiB", n as f64 / f64::from(1u32 << 30))
    } else {
        format!("{:.1} MiB", n as f64 / f64::from(1u32 << 20))
    }
}

/// Copy the recipe files and the helper files into the stage directory,
/// which `chroot.sh` copies to /tmp/codecage in the chroot.
fn stage_recipe(recipe: &Recipe, stage: &Path) -> Result<()> {
    let dir = stage.join("recipe");
    fs::create_dir_all(&dir)?;
    for (rel, content) in &recipe.files {
        let to = dir.join(rel);
        if let Some(parent) = to.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::write(&to, content)?;
    }
    fs::write(stage.join("codecage_mplcache.py"), MPLCACHE_PY)?;
    Ok(())
}

/// Step 1: the tools, mmdebstrap (installed when missing); its version.
fn host_tools(r: &Runner) -> Result<String> {
    for (cmd, pkg) in [
        ("unshare", "util-linux"),
        ("mount", "mount"),
        ("chroot", "coreutils"),
    ] {
        ensure!(
            find_command(cmd).is_some(),
            "`{cmd}` not found: install {pkg}"
        );
    }
    install_missing(r, &[("mmdebstrap", "mmdebstrap")], Recommends::Install)?;
    let mut version = Command::new("mmdebstrap");
    version.arg("--version");
    let out = r.capture(version)?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    r.note(&text);
    ensure!(
        out.status.success(),
        "mmdebstrap --version failed ({})",
        out.status
    );
    Ok(text)
}

/// Step 2: the Debian packages.
fn mmdebstrap(r: &Runner, packages: &[String], root: &Path, mirrors: &[String]) -> Result<()> {
    let unshare = find_command("unshare").context("unshare not found")?;
    let mut cmd = Command::new(unshare);
    // A private mount namespace: the /proc, /sys and /dev mounts mmdebstrap
    // makes in the chroot vanish with it, even if it is killed.
    cmd.args(["--mount", "--propagation", "private", "--"])
        .arg("mmdebstrap")
        .args([
            "--mode=root",
            "--variant=minbase",
            "--format=directory",
            "--verbose",
        ])
        .arg(format!("--include={}", packages.join(",")))
        .arg("--aptopt=Apt::Install-Recommends \"false\"")
        .arg("--aptopt=Acquire::Retries \"3\"")
        .args(DPKG_OPTIONS.iter().map(|f| format!("--dpkgopt={f}")));
    // Merged /usr the way debootstrap does it: essential init-system-helpers
    // depends on "usrmerge | usr-is-merged", and without the hook apt picks
    // usrmerge, which pulls in perl (~50 MB).
    if Path::new(MERGED_USR_HOOKS).join("setup00.sh").is_file() {
        cmd.arg(format!("--hook-dir={MERGED_USR_HOOKS}"));
    }
    cmd.arg(SUITE).arg(root).args(mirrors);
    r.run("mmdebstrap", cmd)?;
    ensure!(
        root.join("var/lib/dpkg/status").is_file(),
        "mmdebstrap finished but {} has no dpkg status",
        root.display()
    );
    Ok(())
}

/// Make the paths `chroot.sh` mounts over plain files and directories of the
/// image (a symlink there would be resolved on the host's side).
fn prepare_for_chroot(root: &Path) -> Result<()> {
    for d in ["proc", "dev", "tmp", "work"] {
        let p = root.join(d);
        match fs::symlink_metadata(&p) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                fs::remove_file(&p)?;
                fs::create_dir(&p)?;
            }
            Err(_) => fs::create_dir(&p)?,
        }
    }
    let resolv = root.join("etc/resolv.conf");
    if fs::symlink_metadata(&resolv).is_ok_and(|m| !m.is_file()) {
        fs::remove_file(&resolv)?;
    }
    if fs::symlink_metadata(&resolv).is_err() {
        fs::write(&resolv, "")?;
    }
    Ok(())
}

/// Run a script in the image through `chroot.sh` (see there for the modes).
fn chroot_step(
    r: &Runner,
    mode: &str,
    root: &Path,
    stage: &Path,
    (name, script): (&str, &str),
) -> Result<()> {
    fs::write(stage.join("step.sh"), script)?;
    let unshare = find_command("unshare").context("unshare not found")?;
    let mut cmd = Command::new(unshare);
    cmd.args(["--mount", "--propagation", "private", "--"])
        .args(["/bin/sh", "-c", CHROOT_SH, "chroot.sh", mode])
        .arg(root)
        .arg(stage)
        .env_clear()
        .env("LANG", "C.UTF-8");
    if mode == "check" {
        cmd.env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", "/work");
    } else {
        cmd.env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env("HOME", "/root")
        .env("DEBIAN_FRONTEND", "noninteractive")
        // node has its own CA list; the bound-in host bundle may hold a
        // proxy's CA (see chroot.sh).
        .env("NODE_EXTRA_CA_CERTS", "/etc/ssl/certs/ca-certificates.crt");
        for k in FORWARDED_ENV {
            if let Some(v) = std::env::var_os(k) {
                cmd.env(k, v);
            }
        }
    }
    let result = r.run(&format!("{name} in the image"), cmd);
    let killed = kill_processes_rooted_in(root);
    if killed > 0 {
        r.note(&format!(
            "killed {killed} process(es) left running in the chroot"
        ));
    }
    result
}

/// Step 5, outside the chroot: users, host names, mount points, no set-id
/// bits, no file capabilities.
fn finalize_tree(r: &Runner, root: &Path, info: &mut BuildInfo) -> Result<()> {
    add_sandbox_user(root)?;
    fs::write(root.join("etc/hostname"), "sandbox\n")?;
    fs::write(
        root.join("etc/hosts"),
        "127.0.0.1\tlocalhost\n127.0.1.1\tsandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    )?;
    // mmdebstrap copied the host's resolver configuration in; the image's is
    // empty (network mode none), and the file is the mount point a sandbox
    // with a network gateway covers with one naming the gateway's DNS.
    let _ = fs::remove_file(root.join("etc/resolv.conf"));
    fs::write(root.join("etc/resolv.conf"), "")?;

    // Empty mount points (the sandbox refuses an image without them).
    let mounted = mounts_below(root);
    ensure!(
        mounted.is_empty(),
        "mounts left below {}: {mounted:?}",
        root.display()
    );
    for (d, mode) in [
        ("dev", 0o755),
        ("proc", 0o555),
        ("tmp", 0o1777),
        ("work", 0o755),
    ] {
        let p = root.join(d);
        if fs::symlink_metadata(&p).is_ok_and(|m| m.is_dir()) {
            for entry in fs::read_dir(&p)? {
                remove_tree(&entry?.path())?;
            }
        } else {
            let _ = fs::remove_file(&p);
            fs::create_dir(&p)?;
        }
        fs::set_permissions(&p, fs::Permissions::from_mode(mode))?;
        std::os::unix::fs::lchown(&p, Some(0), Some(0))?;
    }

    // No setuid/setgid bits and no file capabilities anywhere: nothing in
    // the image can gain privileges (the sandbox also sets no_new_privs).
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir)? {
            let entry = entry?;
            let path = entry.path();
            let meta = fs::symlink_metadata(&path)?;
            if meta.file_type().is_symlink() {
                continue;
            }
            if meta.is_dir() {
                stack.push(path.clone());
            }
            let mode = meta.mode() & 0o7777;
            let rel = format!("/{}", path.strip_prefix(root)?.display());
            if mode & 0o6000 != 0 {
                fs::set_permissions(&path, fs::Permissions::from_mode(mode & !0o6000))?;
                r.note(&format!("removed set-id bits: {mode:04o} {rel}"));
                info.setid_removed.push(rel.clone());
            }
            if meta.is_file() && remove_capability(&path)? {
                r.note(&format!("removed file capabilities: {rel}"));
                info.caps_removed.push(rel);
            }
        }
    }
    info.setid_removed.sort();
    info.caps_removed.sort();
    r.note(&format!(
        "set-id bits removed from {} files, capabilities from {}",
        info.setid_removed.len(),
        info.caps_removed.len()
    ));
    Ok(())
}

/// Remove a file's `security.capability` attribute; whether it had one.
fn remove_capability(path: &Path) -> Result<bool> {
    let c = CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: valid NUL-terminated strings; removexattr only reads them.
    let rc = unsafe { libc::removexattr(c.as_ptr(), c"security.capability".as_ptr()) };
    if rc == 0 {
        return Ok(true);
    }
    let err = std::io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::ENODATA) | Some(libc::ENOTSUP) => Ok(false),
        _ => Err(err).with_context(|| format!("removexattr {}", path.display())),
    }
}

/// Add the sandbox user and group (uid/gid 1000, home /work) unless present.
fn add_sandbox_user(root: &Path) -> Result<()> {
    let add = |file: &str, line: &str, check_id: bool| -> Result<()> {
        let path = root.join("etc").join(file);
        let text = fs::read_to_string(&path).unwrap_or_default();
        let name = line.split(':').next().unwrap_or_default();
        let id = line.split(':').nth(2).unwrap_or_default();
        for existing in text.lines() {
            let fields: Vec<&str> = existing.split(':').collect();
            if fields.first() == Some(&name) {
                if check_id && fields.get(2) != Some(&id) {
                    bail!("/etc/{file} has {name} with another id: {existing}");
                }
                return Ok(());
            }
            if check_id && fields.get(2) == Some(&id) {
                bail!("/etc/{file}: id {id} is taken already: {existing}");
            }
        }
        let mut text = text;
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(line);
        text.push('\n');
        let mode = fs::metadata(&path).map_or(0o644, |m| m.mode() & 0o7777);
        fs::write(&path, text)?;
        fs::set_permissions(&path, fs::Permissions::from_mode(mode))?;
        Ok(())
    };
    add("passwd", SANDBOX_PASSWD, true)?;
    add("group", SANDBOX_GROUP, true)?;
    if root.join("etc/shadow").exists() {
        add("shadow", "sandbox:!:19000:0:99999:7:::", false)?;
    }
    if root.join("etc/gshadow").exists() {
        add("gshadow", "sandbox:!::", false)?;
    }
    // The result must be what the sandbox expects.
    let passwd = fs::read_to_string(root.join("etc/passwd"))?;
    let group = fs::read_to_string(root.join("etc/group"))?;
    for (file, text, want) in [
        ("passwd", &passwd, SANDBOX_PASSWD),
        ("passwd", &passwd, "root:x:0:0:"),
        ("passwd", &passwd, "nobody:x:65534:"),
        ("group", &group, SANDBOX_GROUP),
        ("group", &group, "root:x:0:"),
    ] {
        ensure!(
            text.lines().any(|l| l.starts_with(want)),
            "/etc/{file} of the image has no line starting with {want:?}"
        );
    }
    Ok(())
}

/// Flush the image to disk (syncfs on its file system).
fn sync_tree(root: &Path) {
    if let Ok(dir) = fs::File::open(root) {
        use std::os::fd::AsRawFd as _;
        // SAFETY: plain syscall on a descriptor we own.
        unsafe {
            libc::syncfs(dir.as_raw_fd());
        }
    }
}
