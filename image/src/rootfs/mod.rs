//! Root filesystem images: the directory trees sandboxes run in. `cargo xtask rootfs` and
//! `codecage image` are two front ends over this module.
//!
//! A recipe is data in a directory `<NAME>/` (Debian packages, pinned PyPI and npm
//! packages, a smoke test; see `rootfs/README.md` in the workspace), found on a search
//! path ([`search_path`]). The image for recipe NAME with recipe hash H is built in
//! `<out>/<NAME>-<H12>.tmp-<pid>`, renamed to `<out>/<NAME>-<H12>` when complete, and
//! `<out>/<NAME>` is a symlink switched to it atomically (a new symlink renamed over the
//! old one), so a running server never sees half an image. The previous image of the
//! recipe is kept (a server may still be using it); older ones are removed.
//!
//! H covers the recipe's name and files and the sources that decide what goes into the
//! image ([`build::SOURCES`]), so an unchanged recipe is up to date at once, and any
//! change rebuilds. (The sources are hashed by content under fixed labels, so moving the
//! files changes nothing.)
//!
//! * [`build`]: the steps (mmdebstrap, pip, npm, configuration, smoke test).
//! * [`manifest`]: the manifest and the content hash of the tree.
//! * this file: finding recipes, naming, placing, listing, verifying and cleaning up
//!   images.
//! * `crate::host` runs the tools, reports the steps, handles interrupts and removes
//!   trees safely.

pub mod build;
pub mod manifest;

use crate::host::{
    check_interrupted, debian, find_command, install_signal_handlers, is_root,
    kill_processes_rooted_in, orphans, remove_stale, remove_tree, secs, shell_quote, status, warn,
    TempTree,
};
use anyhow::{bail, Context, Result};
use sha2::{Digest as _, Sha256};
use std::fs;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

/// The recipe built when none is named.
pub const DEFAULT_RECIPE: &str = "default";
/// Where images live unless `--out` or `$CODECAGE_DATA_DIR` says otherwise.
pub const DEFAULT_OUT: &str = "/var/lib/codecage/rootfs";
/// The operator's own recipes: searched before the installed ones.
pub const OPERATOR_RECIPES: &str = "/etc/codecage/recipes";
/// The recipes the package installs.
pub const INSTALLED_RECIPES: &str = "/usr/share/codecage/recipes";

/// The environment a build reads, for the front ends' help.
pub const ENVIRONMENT: &str = "\
Environment:
  CODECAGE_DATA_DIR       data directory; images go to $CODECAGE_DATA_DIR/rootfs
  CODECAGE_ROOTFS_MIRROR  mmdebstrap mirror argument(s), one per line (default: the host's
                          bookworm sources, else deb.debian.org)";

/// `$CODECAGE_DATA_DIR/rootfs`, else `/var/lib/codecage/rootfs`: where images live.
pub fn default_out() -> PathBuf {
    std::env::var_os("CODECAGE_DATA_DIR")
        .filter(|v| !v.is_empty())
        .map(|d| PathBuf::from(d).join("rootfs"))
        .unwrap_or_else(|| PathBuf::from(DEFAULT_OUT))
}

/// Where an installed codecage looks for recipes, in order: `first` (`--recipes`), the
/// operator's [`OPERATOR_RECIPES`], the package's [`INSTALLED_RECIPES`], and the
/// `rootfs/` directory of a source checkout that holds the running binary or the current
/// directory (`target/debug/codecage` in a checkout). A recipe name is looked up in each
/// in turn; the first directory that has it wins.
pub fn search_path(first: Option<&Path>) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = first.map(Path::to_path_buf).into_iter().collect();
    dirs.push(PathBuf::from(OPERATOR_RECIPES));
    dirs.push(PathBuf::from(INSTALLED_RECIPES));
    let starts = [std::env::current_exe().ok(), std::env::current_dir().ok()];
    for start in starts.into_iter().flatten() {
        if let Some(checkout) = start.ancestors().find(|a| is_checkout(a)) {
            let recipes = checkout.join("rootfs");
            if !dirs.contains(&recipes) {
                dirs.push(recipes);
            }
        }
    }
    dirs
}

/// A codecage source checkout: a workspace with the recipes in `rootfs/`.
fn is_checkout(dir: &Path) -> bool {
    dir.join("Cargo.toml").is_file()
        && dir.join("image/Cargo.toml").is_file()
        && dir.join("rootfs/README.md").is_file()
}

/// A build of one recipe, as a front end asks for it.
pub struct BuildRequest<'a> {
    /// The recipe's name.
    pub recipe: &'a str,
    /// The directories the recipe is looked for in, in order.
    pub recipes: &'a [PathBuf],
    /// Where images live.
    pub out: &'a Path,
    /// Rebuild even if the image of the current recipe exists.
    pub force: bool,
    /// Stream the tools' output (otherwise it goes to the build log only).
    pub verbose: bool,
    /// The front end's command, for the message that asks to run it as root
    /// (`cargo xtask`, `codecage`): `sudo -E <program> <its arguments>`.
    pub program: &'a str,
}

/// Build the image of a recipe unless it is up to date (then only a status line).
pub fn build(req: &BuildRequest) -> Result<()> {
    let start = Instant::now();
    let recipe = Recipe::find(req.recipes, req.recipe)?;
    let paths = Paths::new(req.out, &recipe);

    if !req.force && up_to_date(&paths) {
        report_fresh(&recipe, &paths, start);
        return Ok(());
    }
    if !req.force && is_complete(&paths) {
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
        return Ok(());
    }
    if !is_root() {
        let mut msg = format!(
            "building the rootfs image {} needs root (mmdebstrap --mode=root, chroot, and mounts \
             in a private mount namespace); run it as root:\n\n    sudo -E {}{}",
            paths.image.display(),
            req.program,
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
    if !req.force && up_to_date(&paths) {
        // Another build of the same recipe finished while we waited.
        report_fresh(&recipe, &paths, start);
        return Ok(());
    }
    remove_stale_builds(&paths.out);
    build::build(&recipe, &paths, req.verbose, start)
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
    /// The recipe `name` from the first directory of `search` that has it (a
    /// `<dir>/<name>/packages.txt`). The error names the directories searched and the
    /// recipes each holds.
    pub fn find(search: &[PathBuf], name: &str) -> Result<Recipe> {
        let valid = !name.is_empty()
            && !name.starts_with('.')
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if valid {
            if let Some(dir) = search
                .iter()
                .find(|d| d.join(name).join("packages.txt").is_file())
            {
                return Recipe::load(dir, name);
            }
        }
        let mut msg = if valid {
            format!("unknown rootfs recipe {name:?}: no <dir>/{name}/packages.txt in the recipe directories")
        } else {
            format!(
                "invalid rootfs recipe name {name:?}: letters, digits, '.', '_' and '-', not \
                 starting with '.'"
            )
        };
        msg.push_str("\nsearched, in order:");
        for dir in search {
            let found = if dir.is_dir() {
                let known = list_recipes(dir);
                if known.is_empty() {
                    "(no recipes)".to_string()
                } else {
                    known.join(", ")
                }
            } else {
                "(no such directory)".to_string()
            };
            msg.push_str(&format!("\n  {}: {found}", dir.display()));
        }
        bail!(msg)
    }

    /// The recipe in `<recipes>/<name>/`, which [`Recipe::find`] found.
    fn load(recipes: &Path, name: &str) -> Result<Recipe> {
        let dir = recipes.join(name);
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

/// The recipes in a directory (the subdirectories with a `packages.txt`), sorted.
pub fn list_recipes(recipes: &Path) -> Vec<String> {
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

/// Check the image `<out>/<name>` points to against its manifest: recompute the content
/// hash of the tree and compare it with the manifest's. On a difference the error names
/// the entries changed since the image was installed (see [`changed_since`]).
/// `build_hint` is the front end's command that builds the recipe, for the error when
/// there is no image.
pub fn verify(out: &Path, name: &str, build_hint: &str) -> Result<()> {
    let start = Instant::now();
    let link = out.join(name);
    let target = fs::read_link(&link).with_context(|| {
        format!(
            "{} is not an image link (build it first: {build_hint})",
            link.display()
        )
    })?;
    let image = out.join(&target);
    let image_name = image
        .file_name()
        .context("image link without a name")?
        .to_string_lossy()
        .into_owned();
    let beside = out.join(format!("{image_name}.manifest.json"));
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
    if got.content_hash != want {
        let installed = fs::metadata(&beside)
            .and_then(|m| m.modified())
            .with_context(|| format!("reading {}", beside.display()))?;
        let changed = changed_since(&image, installed, &inside)?;
        const SHOWN: usize = 50;
        let mut msg = format!(
            "{} does not match its manifest: content hash {} instead of {want}\n",
            image.display(),
            got.content_hash
        );
        if changed.is_empty() {
            msg.push_str(&format!(
                "no entry changed after {} was written (was the tree copied or restored?)",
                beside.display()
            ));
        } else {
            msg.push_str(&format!(
                "{} entries changed after {} was written (a directory: an entry added or \
                 removed in it):",
                changed.len(),
                beside.display()
            ));
            for rel in changed.iter().take(SHOWN) {
                msg.push_str(&format!("\n  /{rel}"));
            }
            if changed.len() > SHOWN {
                msg.push_str(&format!("\n  ... and {} more", changed.len() - SHOWN));
            }
        }
        bail!(msg);
    }
    status(
        "Verified",
        format!(
            "{} ({} files, {}): {want} in {}",
            image_name,
            got.files,
            build::human_bytes(got.size_bytes),
            secs(start.elapsed())
        ),
    );
    Ok(())
}

/// The entries of the tree at `root` (but `skip`) whose inode changed after `since`
/// (their ctime, which a write, chmod, chown, link or rename sets and nothing can set
/// back), as paths relative to the root (`.` for it), sorted. An image is complete before
/// its manifest is written beside it, so with that file's time these are the changes made
/// to the image after it was installed: a file's contents or mode, a directory's entries.
pub fn changed_since(root: &Path, since: SystemTime, skip: &Path) -> Result<Vec<String>> {
    let after = |meta: &fs::Metadata| {
        let ctime = SystemTime::UNIX_EPOCH
            + Duration::new(
                u64::try_from(meta.ctime()).unwrap_or(0),
                u32::try_from(meta.ctime_nsec()).unwrap_or(0),
            );
        ctime > since
    };
    let mut changed = Vec::new();
    if after(&fs::symlink_metadata(root)?) {
        changed.push(".".to_string());
    }
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let path = entry?.path();
            if path == skip {
                continue;
            }
            let meta = fs::symlink_metadata(&path)?;
            if meta.is_dir() {
                stack.push(path.clone());
            }
            if after(&meta) {
                changed.push(path.strip_prefix(root)?.to_string_lossy().into_owned());
            }
        }
    }
    changed.sort();
    Ok(changed)
}

/// An image below `<out>`, as [`list`] finds it.
pub struct Image {
    /// The recipe's name (the name of the link `<out>/<NAME>`).
    pub recipe: String,
    /// `<NAME>-<H12>`.
    pub name: String,
    pub path: PathBuf,
    /// The recipe hash (64 hex digits), from the manifest.
    pub hash: String,
    /// When its build ended (RFC 3339), from the manifest.
    pub built_at: String,
    /// Apparent size of its files, from the manifest.
    pub size_bytes: u64,
    /// `<out>/<NAME>` points to it.
    pub current: bool,
    /// Its manifest beside it.
    pub manifest: PathBuf,
}

impl Image {
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "recipe": self.recipe,
            "image": self.name,
            "path": self.path,
            "hash": self.hash,
            "short_hash": &self.name[self.name.len() - 12..],
            "built_at": self.built_at,
            "size_bytes": self.size_bytes,
            "current": self.current,
            "manifest": self.manifest,
        })
    }
}

/// The images in `out` (`<NAME>-<H12>/` with `<NAME>-<H12>.manifest.json` beside it),
/// by recipe name, newest first; none when `out` does not exist.
pub fn list(out: &Path) -> Result<Vec<Image>> {
    let entries = match fs::read_dir(out) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", out.display())),
    };
    let mut images = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some((recipe, hash)) = name.rsplit_once('-') else {
            continue;
        };
        if recipe.is_empty()
            || recipe.starts_with('.')
            || hash.len() != 12
            || !hash.bytes().all(|b| b.is_ascii_hexdigit())
            || !entry.file_type().is_ok_and(|t| t.is_dir())
        {
            continue;
        }
        let manifest = out.join(format!("{name}.manifest.json"));
        let Ok(text) = fs::read_to_string(&manifest) else {
            continue;
        };
        let m: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("parsing {}", manifest.display()))?;
        let current = fs::read_link(out.join(recipe))
            .is_ok_and(|t| t == Path::new(&name) || t == entry.path());
        images.push(Image {
            recipe: recipe.to_string(),
            path: entry.path(),
            hash: m["recipe"]["hash"].as_str().unwrap_or(hash).to_string(),
            built_at: m["built_at"].as_str().unwrap_or_default().to_string(),
            size_bytes: m["size_bytes"].as_u64().unwrap_or(0),
            current,
            manifest,
            name,
        });
    }
    images.sort_by(|a, b| {
        (a.recipe.as_str(), std::cmp::Reverse(a.built_at.as_str()))
            .cmp(&(b.recipe.as_str(), std::cmp::Reverse(b.built_at.as_str())))
    });
    Ok(images)
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

    /// The workspace's recipes.
    fn recipes_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../rootfs")
    }

    #[test]
    fn default_recipe_loads_and_hash_is_stable() {
        let a = Recipe::find(&[recipes_dir()], DEFAULT_RECIPE).unwrap();
        let b = Recipe::find(&[recipes_dir()], DEFAULT_RECIPE).unwrap();
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
    fn the_first_directory_with_the_recipe_wins() {
        let dir = TempTree::create_in(&std::env::temp_dir(), "codecage-image-recipes-").unwrap();
        let mine = dir.path().join("mine");
        fs::create_dir_all(mine.join(DEFAULT_RECIPE)).unwrap();
        fs::write(mine.join(DEFAULT_RECIPE).join("packages.txt"), "bash\n").unwrap();
        let search = [mine.clone(), recipes_dir()];
        let r = Recipe::find(&search, DEFAULT_RECIPE).unwrap();
        assert_eq!(r.dir, mine.join(DEFAULT_RECIPE));
        assert_eq!(r.list("packages.txt").unwrap(), ["bash"]);
        // The same files under another directory: the same hash.
        let theirs = Recipe::find(&[recipes_dir()], DEFAULT_RECIPE).unwrap();
        fs::remove_dir_all(mine.join(DEFAULT_RECIPE)).unwrap();
        let copy = mine.join(DEFAULT_RECIPE);
        fs::create_dir(&copy).unwrap();
        for (rel, content) in &theirs.files {
            fs::write(copy.join(rel), content).unwrap();
        }
        assert_eq!(
            Recipe::find(&search, DEFAULT_RECIPE).unwrap().hash,
            theirs.hash
        );
    }

    #[test]
    fn unknown_recipe_names_the_directories_and_their_recipes() {
        let missing = PathBuf::from("/nonexistent/codecage-recipes");
        let search = [missing.clone(), recipes_dir()];
        let e = Recipe::find(&search, "no-such-recipe")
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("unknown rootfs recipe \"no-such-recipe\""),
            "{e}"
        );
        assert!(
            e.contains(&format!("{}: (no such directory)", missing.display())),
            "{e}"
        );
        assert!(
            e.contains(&format!("{}: default", recipes_dir().display())),
            "{e}"
        );
        for bad in ["../default", ".hidden", "", "a/b"] {
            let e = Recipe::find(&search, bad).err().unwrap().to_string();
            assert!(e.contains("invalid rootfs recipe name"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_search_path_starts_with_the_given_directory_then_etc_then_usr_share() {
        let dirs = search_path(Some(Path::new("/x")));
        assert_eq!(
            dirs[..3],
            [
                PathBuf::from("/x"),
                PathBuf::from(OPERATOR_RECIPES),
                PathBuf::from(INSTALLED_RECIPES)
            ]
        );
        // The test binary runs in target/ of this checkout.
        let checkout = recipes_dir().canonicalize().unwrap();
        assert!(dirs[3..].contains(&checkout), "{dirs:?}");
        assert_eq!(search_path(None)[0], PathBuf::from(OPERATOR_RECIPES));
    }
}
