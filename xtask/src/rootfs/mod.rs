//! `cargo xtask rootfs`: build the sandbox's root filesystem image.
//!
//! A recipe is data in `rootfs/<NAME>/` (Debian packages, pinned PyPI and
//! npm packages, a smoke test; see `rootfs/README.md`). The image for recipe
//! NAME with recipe hash H is built in `<out>/<NAME>-<H12>.tmp-<pid>`, renamed
//! to `<out>/<NAME>-<H12>` when complete, and `<out>/<NAME>` is a symlink
//! switched to it atomically (a new symlink renamed over the old one), so a
//! running server never sees half an image. The previous image of the recipe
//! is kept (a server may still be using it); older ones are removed.
//!
//! H covers every file of `rootfs/<NAME>/` and the xtask sources that decide
//! what goes into the image ([`build::SOURCES`]), so an unchanged recipe is
//! up to date at once, and any change rebuilds.
//!
//! * [`build`]: the steps (mmdebstrap, pip, npm, configuration, smoke test).
//! * [`manifest`]: the manifest and the content hash of the tree.
//! * `crate::host` runs the tools, reports the steps, handles interrupts and removes
//!   trees safely.

mod build;
mod manifest;

use crate::host::{
    check_interrupted, debian, find_command, install_signal_handlers, is_root,
    kill_processes_rooted_in, orphans, remove_stale, remove_tree, secs, shell_quote, status, warn,
    workspace_root, TempTree,
};
use anyhow::{bail, Context, Result};
use sha2::{Digest as _, Sha256};
use std::fs;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Build the sandbox's root filesystem image (root; instant when up to date)
///
/// Builds the image of the recipe in rootfs/NAME/: Debian bookworm packages (mmdebstrap),
/// pinned PyPI packages (pip) and npm packages (npm ci), then a smoke test as uid 1000 on
/// a read-only root. Needs root (mmdebstrap, chroot, mounts in a private mount namespace).
/// Instant when the image of the current recipe exists already.
///
/// The image goes to OUT/NAME-HASH (HASH: 12 hex digits of the recipe hash) and OUT/NAME
/// is a symlink switched to it atomically; its manifest is in the image at
/// /usr/share/codecage/manifest.json and beside it at OUT/NAME-HASH.manifest.json.
#[derive(clap::Args, Debug)]
#[command(
    verbatim_doc_comment,
    override_usage = "cargo xtask rootfs [--recipe NAME] [--out DIR] [--force] [--verbose]\n       \
                      cargo xtask rootfs --verify [--recipe NAME] [--out DIR]",
    after_long_help = ENVIRONMENT
)]
pub struct Args {
    /// The recipe, a directory under rootfs/
    #[arg(
        long,
        value_name = "NAME",
        default_value = DEFAULT_RECIPE,
        value_parser = clap::builder::NonEmptyStringValueParser::new()
    )]
    recipe: String,
    /// Where images live
    ///
    /// Default: $CODECAGE_DATA_DIR/rootfs, else /var/lib/codecage/rootfs.
    #[arg(long, value_name = "DIR", value_parser = non_empty_path)]
    out: Option<PathBuf>,
    /// Rebuild even if the image of the current recipe exists
    #[arg(long)]
    force: bool,
    /// Stream the tools' output
    ///
    /// Otherwise it goes to the build log only, and is shown when a step fails.
    #[arg(short, long)]
    verbose: bool,
    /// Check the image against its manifest (builds nothing)
    ///
    /// Recomputes the content hash of the image OUT/NAME points to and compares it with the
    /// one in its manifest.
    #[arg(long)]
    verify: bool,
}

impl Default for Args {
    /// The default recipe into the default place: what `cargo xtask rootfs` builds.
    fn default() -> Args {
        Args {
            recipe: DEFAULT_RECIPE.to_string(),
            out: None,
            force: false,
            verbose: false,
            verify: false,
        }
    }
}

impl Args {
    /// `--out`, else `$CODECAGE_DATA_DIR/rootfs`, else `/var/lib/codecage/rootfs`.
    fn out(&self) -> PathBuf {
        self.out.clone().unwrap_or_else(|| {
            std::env::var_os("CODECAGE_DATA_DIR")
                .filter(|v| !v.is_empty())
                .map(|d| PathBuf::from(d).join("rootfs"))
                .unwrap_or_else(|| PathBuf::from(DEFAULT_OUT))
        })
    }
}

const ENVIRONMENT: &str = "\
Environment:
  CODECAGE_DATA_DIR       data directory; images go to $CODECAGE_DATA_DIR/rootfs
  CODECAGE_ROOTFS_MIRROR  mmdebstrap mirror argument(s), one per line (default: the host's
                          bookworm sources, else deb.debian.org)";

const DEFAULT_RECIPE: &str = "default";
const DEFAULT_OUT: &str = "/var/lib/codecage/rootfs";

fn non_empty_path(s: &str) -> Result<PathBuf, String> {
    if s.is_empty() {
        return Err("a directory is needed".to_string());
    }
    Ok(PathBuf::from(s))
}

/// `cargo xtask rootfs`: the exit status, or an error to report.
pub fn rootfs(args: &Args) -> Result<i32> {
    let start = Instant::now();
    let out = args.out();
    if args.verify {
        return verify(&out, &args.recipe, start);
    }
    let recipe = Recipe::load(&recipes_dir(), &args.recipe)?;
    let paths = Paths::new(&out, &recipe);

    if !args.force && up_to_date(&paths) {
        report_fresh(&recipe, &paths, start);
        return Ok(0);
    }
    if !args.force && is_complete(&paths) {
        // Built already, but OUT/NAME points elsewhere (another recipe
        // version was built since, or the switch was interrupted).
        let _lock = Lock::acquire(&paths)?;
        switch_link(&paths)?;
        status(
            "Switched",
            format!(
                "rootfs {}: {} -> {} (built before; manifest {})",
                recipe.name,
                paths.link.display(),
                paths.image_name(),
                paths.manifest.display()
            ),
        );
        return Ok(0);
    }
    if !is_root() {
        let mut msg = format!(
            "building the rootfs image {} needs root (mmdebstrap --mode=root, chroot, and mounts \
             in a private mount namespace); run it as root:\n\n    sudo -E cargo xtask{}",
            paths.image.display(),
            std::env::args()
                .skip(1)
                .map(|a| format!(" {}", shell_quote(a)))
                .collect::<String>()
        );
        if find_command("mmdebstrap").is_none() {
            msg.push_str(
                "\n\nmmdebstrap is not installed either (the root build installs it, or: \
                 sudo apt-get install -y mmdebstrap)",
            );
        }
        bail!(msg);
    }
    fs::create_dir_all(&paths.out).with_context(|| format!("creating {}", paths.out.display()))?;
    let _signals = install_signal_handlers();
    let _lock = Lock::acquire(&paths)?;
    if !args.force && up_to_date(&paths) {
        // Another build of the same recipe finished while we waited.
        report_fresh(&recipe, &paths, start);
        return Ok(0);
    }
    remove_stale_builds(&paths.out);
    build::build(&recipe, &paths, args.verbose, start)?;
    Ok(0)
}

/// `rootfs/` in the workspace: the recipes.
fn recipes_dir() -> PathBuf {
    workspace_root().join("rootfs")
}

/// A recipe: the files of `rootfs/<NAME>/` and their hash.
pub struct Recipe {
    pub name: String,
    pub dir: PathBuf,
    /// (path relative to the recipe directory, contents), sorted by path.
    pub files: Vec<(String, Vec<u8>)>,
    /// SHA-256 (hex) over the recipe files and [`build::SOURCES`].
    pub hash: String,
}

impl Recipe {
    fn load(recipes: &Path, name: &str) -> Result<Recipe> {
        let valid = !name.starts_with('.')
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        let dir = recipes.join(name);
        if !valid || !dir.join("packages.txt").is_file() {
            let known = list_recipes(recipes);
            bail!(
                "unknown rootfs recipe {name:?}: there is no {}/packages.txt\nrecipes in {}: {}",
                dir.display(),
                recipes.display(),
                if known.is_empty() {
                    "(none)".to_string()
                } else {
                    known.join(", ")
                }
            );
        }
        let mut files = Vec::new();
        collect_files(&dir, &dir, &mut files)?;
        files.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));

        let mut h = Sha256::new();
        let mut field = |bytes: &[u8]| {
            h.update((bytes.len() as u64).to_le_bytes());
            h.update(bytes);
        };
        field(b"codecage-rootfs-recipe/1");
        field(name.as_bytes());
        for (rel, content) in &files {
            field(b"recipe file");
            field(rel.as_bytes());
            field(content);
        }
        for (src, content) in build::SOURCES {
            field(b"xtask source");
            field(src.as_bytes());
            field(content.as_bytes());
        }
        Ok(Recipe {
            name: name.to_string(),
            dir,
            files,
            hash: format!("{:x}", h.finalize()),
        })
    }

    /// The 12 hex digits that name the image.
    pub fn short(&self) -> &str {
        &self.hash[..12]
    }

    pub fn has(&self, rel: &str) -> bool {
        self.files.iter().any(|(r, _)| r == rel)
    }

    /// A list file of the recipe: one entry per line, `#` comments.
    pub fn list(&self, rel: &str) -> Result<Vec<String>> {
        let (_, content) = self
            .files
            .iter()
            .find(|(r, _)| r == rel)
            .with_context(|| format!("{} has no {rel}", self.dir.display()))?;
        Ok(debian::list_lines(&String::from_utf8_lossy(content))
            .map(str::to_string)
            .collect())
    }
}

fn collect_files(base: &Path, dir: &Path, out: &mut Vec<(String, Vec<u8>)>) -> Result<()> {
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        let path = entry.path();
        let ft = entry.file_type()?;
        if ft.is_dir() {
            collect_files(base, &path, out)?;
        } else if ft.is_file() {
            let rel = path.strip_prefix(base)?.to_string_lossy().into_owned();
            let content = fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
            out.push((rel, content));
        } else {
            bail!(
                "{}: recipes hold plain files and directories only",
                path.display()
            );
        }
    }
    Ok(())
}

fn list_recipes(recipes: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(recipes)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.path().join("packages.txt").is_file())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// The names a build of one recipe uses below `<out>`.
pub struct Paths {
    pub out: PathBuf,
    name: String,
    short: String,
    /// `<out>/<NAME>-<H12>`: the finished image.
    pub image: PathBuf,
    /// `<out>/<NAME>-<H12>.manifest.json`, written once the image is in place.
    pub manifest: PathBuf,
    /// `<out>/<NAME>-<H12>.build.log`: the tools' output of its build.
    pub log: PathBuf,
    /// `<out>/<NAME>`: the symlink the sandbox uses.
    pub link: PathBuf,
    /// `<out>/.<NAME>.new`: the symlink renamed over `link`.
    link_new: PathBuf,
    /// `<out>/<NAME>-<H12>.tmp-<pid>`: the image under construction.
    pub tmp: PathBuf,
    /// `<out>/.<NAME>-<H12>.work-<pid>`: build log and staged recipe.
    pub work: PathBuf,
    /// `<out>/.<NAME>.lock`: one build per recipe name at a time.
    lock: PathBuf,
    /// `<out>/<NAME>.failed.log`: the log of the last failed build.
    pub failed_log: PathBuf,
}

impl Paths {
    fn new(out: &Path, recipe: &Recipe) -> Paths {
        let (name, short) = (recipe.name.clone(), recipe.short().to_string());
        let image_name = format!("{name}-{short}");
        let pid = std::process::id();
        Paths {
            image: out.join(&image_name),
            manifest: out.join(format!("{image_name}.manifest.json")),
            log: out.join(format!("{image_name}.build.log")),
            link: out.join(&name),
            link_new: out.join(format!(".{name}.new")),
            tmp: out.join(format!("{image_name}.tmp-{pid}")),
            work: out.join(format!(".{image_name}.work-{pid}")),
            lock: out.join(format!(".{name}.lock")),
            failed_log: out.join(format!("{name}.failed.log")),
            out: out.to_path_buf(),
            name,
            short,
        }
    }

    pub fn image_name(&self) -> String {
        format!("{}-{}", self.name, self.short)
    }
}

/// The image is in place: renamed, with its manifest beside it.
fn is_complete(p: &Paths) -> bool {
    p.manifest.is_file()
        && p.image.join(manifest::IMAGE_PATH).is_file()
        && fs::symlink_metadata(&p.image).is_ok_and(|m| m.is_dir())
}

fn link_points_to_image(p: &Paths) -> bool {
    fs::read_link(&p.link).is_ok_and(|t| t == Path::new(&p.image_name()) || t == p.image)
}

fn up_to_date(p: &Paths) -> bool {
    is_complete(p) && link_points_to_image(p)
}

fn report_fresh(recipe: &Recipe, p: &Paths, start: Instant) {
    status(
        "Fresh",
        format!(
            "rootfs {} ({}) is up to date: {} -> {}",
            recipe.name,
            recipe.short(),
            p.link.display(),
            p.image_name()
        ),
    );
    status("Manifest", p.manifest.display());
    status("Finished", format!("in {}", secs(start.elapsed())));
}

/// `--verify`: the image `<out>/<NAME>` points to against its manifest.
fn verify(out: &Path, recipe: &str, start: Instant) -> Result<i32> {
    let link = out.join(recipe);
    let target = fs::read_link(&link).with_context(|| {
        format!(
            "{} is not an image link (build it first: cargo xtask rootfs --recipe {})",
            link.display(),
            recipe
        )
    })?;
    let image = out.join(&target);
    let name = image
        .file_name()
        .context("image link without a name")?
        .to_string_lossy()
        .into_owned();
    let beside = out.join(format!("{name}.manifest.json"));
    let text =
        fs::read_to_string(&beside).with_context(|| format!("reading {}", beside.display()))?;
    let inside = image.join(manifest::IMAGE_PATH);
    let inside_text =
        fs::read_to_string(&inside).with_context(|| format!("reading {}", inside.display()))?;
    anyhow::ensure!(
        text == inside_text,
        "{} and {} differ",
        beside.display(),
        inside.display()
    );
    let m: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", beside.display()))?;
    let want = m["content_hash"]
        .as_str()
        .context("the manifest has no content_hash")?;
    status(
        "Verifying",
        format!("{} against {}", image.display(), beside.display()),
    );
    let got = manifest::tree_stats(&image, &inside)?;
    anyhow::ensure!(
        got.content_hash == want,
        "{} does not match its manifest: content hash {} instead of {want}",
        image.display(),
        got.content_hash
    );
    status(
        "Verified",
        format!(
            "{} ({} files, {}): {want} in {}",
            name,
            got.files,
            build::human_bytes(got.size_bytes),
            secs(start.elapsed())
        ),
    );
    Ok(0)
}

/// Move the finished image into place, write the manifest beside it, switch
/// the link, remove old images.
fn install(p: &Paths, tmp: &mut TempTree, manifest_text: &str) -> Result<()> {
    if fs::symlink_metadata(&p.image).is_ok() {
        if is_complete(p) {
            // --force of an existing image: swap the two trees atomically (the
            // link keeps its target name). A sandbox may still run in the
            // replaced tree: it stays, hidden, until the next build.
            exchange(tmp.path(), &p.image)?;
            let replaced = p.out.join(format!(
                ".{}.replaced-{}",
                p.image_name(),
                std::process::id()
            ));
            rename(tmp.path(), &replaced)?;
            tmp.keep();
        } else {
            // What an interrupted install left; never linked.
            remove_tree(&p.image)?;
            rename(tmp.path(), &p.image)?;
            tmp.keep();
        }
    } else {
        rename(tmp.path(), &p.image)?;
        tmp.keep();
    }
    let manifest_tmp = p.out.join(format!(".{}.manifest.json.tmp", p.image_name()));
    fs::write(&manifest_tmp, manifest_text)?;
    rename(&manifest_tmp, &p.manifest)?;
    let previous = switch_link(p)?;
    prune(p, previous.as_deref());
    Ok(())
}

fn rename(from: &Path, to: &Path) -> Result<()> {
    fs::rename(from, to).with_context(|| format!("renaming {} to {}", from.display(), to.display()))
}

/// Swap two directories atomically (`renameat2(RENAME_EXCHANGE)`).
fn exchange(a: &Path, b: &Path) -> Result<()> {
    let ca = std::ffi::CString::new(a.as_os_str().as_bytes())?;
    let cb = std::ffi::CString::new(b.as_os_str().as_bytes())?;
    // SAFETY: valid NUL-terminated paths; AT_FDCWD resolves them as given.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("exchanging {} and {}", a.display(), b.display()));
    }
    Ok(())
}

/// Point `<out>/<NAME>` at the image: a new symlink renamed over the old
/// one, so readers see either the old or the new image. Returns the previous
/// target's name.
fn switch_link(p: &Paths) -> Result<Option<String>> {
    let previous = match fs::symlink_metadata(&p.link) {
        Ok(m) if m.file_type().is_symlink() => fs::read_link(&p.link)
            .ok()
            .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned())),
        Ok(_) => bail!(
            "{} exists and is not a symlink: move it away (the rootfs build manages that name)",
            p.link.display()
        ),
        Err(_) => None,
    };
    let _ = fs::remove_file(&p.link_new);
    std::os::unix::fs::symlink(p.image_name(), &p.link_new)
        .with_context(|| format!("creating {}", p.link_new.display()))?;
    rename(&p.link_new, &p.link)?;
    if let Ok(dir) = fs::File::open(&p.out) {
        let _ = dir.sync_all();
    }
    Ok(previous.filter(|prev| *prev != p.image_name()))
}

/// Remove images of this recipe name other than the current and the
/// previous one (with their manifests and logs), and orphaned manifests.
fn prune(p: &Paths, previous: Option<&str>) {
    let Ok(entries) = fs::read_dir(&p.out) else {
        return;
    };
    let current = p.image_name();
    for entry in entries.flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        let base = file
            .strip_suffix(".manifest.json")
            .or_else(|| file.strip_suffix(".build.log"))
            .unwrap_or(&file);
        let Some(hash) = base.strip_prefix(&p.name).and_then(|r| r.strip_prefix('-')) else {
            continue;
        };
        if hash.len() != 12 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            continue;
        }
        if base == current || Some(base) == previous {
            continue;
        }
        if base == file {
            status("Removing", format!("old image {}", entry.path().display()));
        }
        if let Err(e) = remove_tree(&entry.path()) {
            warn(format!("{e:#}"));
        }
    }
}

/// Remove what earlier builds left behind once their process is gone:
/// `*.tmp-<pid>` image trees and `.*.work-<pid>` directories of builds that
/// died, and `.*.replaced-<pid>` trees that `--force` swapped out.
fn remove_stale_builds(out: &Path) {
    let build_pid = |name: &str| {
        let (_, pid) = [".tmp-", ".work-", ".replaced-"]
            .into_iter()
            .find_map(|kind| name.rsplit_once(kind))?;
        pid.parse().ok()
    };
    for path in orphans(out, build_pid) {
        if path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().contains(".tmp-"))
        {
            // A chroot step's leftovers (never a sandbox: a .tmp- tree is never linked).
            kill_processes_rooted_in(&path);
        }
        remove_stale(&path);
    }
}

/// An exclusive `flock` on `<out>/.<NAME>.lock` for the build.
struct Lock {
    _file: fs::File,
}

impl Lock {
    fn acquire(p: &Paths) -> Result<Lock> {
        use std::os::fd::AsRawFd as _;
        fs::create_dir_all(&p.out).with_context(|| format!("creating {}", p.out.display()))?;
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&p.lock)
            .with_context(|| format!("opening {}", p.lock.display()))?;
        let fd = file.as_raw_fd();
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            status(
                "Blocking",
                format!("waiting for another build of rootfs {}", p.name),
            );
            loop {
                // SAFETY: as above.
                if unsafe { libc::flock(fd, libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                    break;
                }
                check_interrupted()?;
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        Ok(Lock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        match crate::tests::parse(&[&["rootfs"], args].concat())? {
            crate::Task::Rootfs(args) => Ok(args),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn parses_arguments() {
        let o = parse(&["--recipe", "x", "--out=/o", "--force", "-v"]).unwrap();
        assert_eq!(o.recipe, "x");
        assert_eq!(o.out(), PathBuf::from("/o"));
        assert!(o.force && o.verbose && !o.verify);
        let d = parse(&[]).unwrap();
        assert_eq!(d.recipe, Args::default().recipe);
        assert!(parse(&["--verify"]).unwrap().verify);
        for bad in [
            &["--recipe"][..],
            &["--recipe="],
            &["--out="],
            &["--bogus"],
            &["x"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn default_recipe_loads_and_hash_is_stable() {
        let a = Recipe::load(&recipes_dir(), DEFAULT_RECIPE).unwrap();
        let b = Recipe::load(&recipes_dir(), DEFAULT_RECIPE).unwrap();
        assert_eq!(a.hash, b.hash);
        assert_eq!(a.short().len(), 12);
        for f in [
            "packages.txt",
            "requirements.txt",
            "package.json",
            "package-lock.json",
        ] {
            assert!(a.has(f), "{f}");
        }
        let pkgs = a.list("packages.txt").unwrap();
        for p in ["bash", "python3", "nodejs", "ca-certificates", "tzdata"] {
            assert!(pkgs.iter().any(|x| x == p), "{p}");
        }
    }

    #[test]
    fn unknown_recipe_lists_the_known_ones() {
        let e = Recipe::load(&recipes_dir(), "no-such-recipe")
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("default"), "{e}");
        assert!(Recipe::load(&recipes_dir(), "../default").is_err());
    }
}
