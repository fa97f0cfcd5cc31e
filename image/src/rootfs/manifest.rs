//! The image manifest (`/usr/share/codecage/manifest.json` in the image and
//! `<out>/<NAME>-<H12>.manifest.json` beside it) and the content hash.
//!
//! Content hash: SHA-256 over every entry of the tree except the manifest
//! itself, sorted by relative path (byte order; the root is `.`), each entry
//! fed as five NUL-terminated fields
//!
//! ```text
//! path NUL type NUL mode NUL uid:gid NUL payload NUL
//! ```
//!
//! type is one of `d f l c b p s`; mode the permission bits in octal (with
//! setuid/setgid/sticky); payload the lowercase hex SHA-256 of a regular
//! file's contents, a symlink's target, `major,minor` of a device, and empty
//! otherwise. No field can hold a NUL, so the encoding is unambiguous.
//! Timestamps are not part of it.

use super::build::{BuildInfo, SUITE};
use super::Recipe;
use anyhow::{Context, Result};
use serde_json::{json, Map, Value};
use sha2::{Digest as _, Sha256};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs;
use std::io::Read as _;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Instant, SystemTime};

/// The manifest's place in the image.
pub const IMAGE_PATH: &str = "usr/share/codecage/manifest.json";
/// Where the recipe's npm packages go (see node.sh).
const NODE_PREFIX: &str = "opt/codecage/node";
/// The pre-built matplotlib font cache (see finish.sh).
const MPL_CACHE: &str = "usr/local/share/codecage/matplotlib";

pub const HASH_SCHEME: &str = "sha256 over all entries but the manifest, sorted by relative \
path (bytes; the root is \".\"), each as: path NUL type(d,f,l,c,b,p,s) NUL mode(octal, with \
set-id and sticky bits) NUL uid:gid NUL payload NUL; payload = sha256 hex of a regular file's \
contents, a symlink's target, major,minor of a device node, empty otherwise";

pub struct Manifest {
    pub json: Value,
    pub content_hash: String,
    pub size_bytes: u64,
    pub files: u64,
}

/// Gather everything the manifest holds.
pub fn build(root: &Path, recipe: &Recipe, info: &BuildInfo, start: Instant) -> Result<Manifest> {
    // The manifest's directory is part of the hashed tree; only the file is not.
    let manifest_dir = root.join(IMAGE_PATH);
    let manifest_dir = manifest_dir.parent().context("manifest path")?;
    fs::create_dir_all(manifest_dir)?;
    fs::set_permissions(manifest_dir, fs::Permissions::from_mode(0o755))?;
    let tree = tree_stats(root, &root.join(IMAGE_PATH))?;
    anyhow::ensure!(
        tree.setid.is_empty(),
        "set-id files left in the image: {:?}",
        tree.setid
    );
    let debian = debian_packages(root)?;
    let pypi = pypi_packages(root)?;
    let npm = npm_packages(root)?;

    let mut recipe_files = Map::new();
    for (rel, content) in &recipe.files {
        recipe_files.insert(rel.clone(), json!(format!("{:x}", Sha256::digest(content))));
    }
    let mut paths = Map::new();
    let mut env = Map::new();
    if root.join("usr/bin/python3").exists() {
        paths.insert("python".into(), json!("/usr/bin/python3"));
    }
    if let Some(site) = python_site(root) {
        paths.insert("python_packages".into(), json!(format!("/{site}")));
    }
    if root.join(NODE_PREFIX).join("node_modules").is_dir() {
        paths.insert(
            "node_modules".into(),
            json!(format!("/{NODE_PREFIX}/node_modules")),
        );
    }
    if root.join(MPL_CACHE).is_dir() {
        paths.insert(
            "matplotlib_font_cache".into(),
            json!(format!("/{MPL_CACHE}")),
        );
        env.insert("MPLBACKEND".into(), json!("Agg"));
    }
    let mut links = Map::new();
    if let Ok(entries) = fs::read_dir(root.join("usr/local/bin")) {
        for entry in entries.flatten() {
            if let Ok(target) = fs::read_link(entry.path()) {
                links.insert(
                    format!("/usr/local/bin/{}", entry.file_name().to_string_lossy()),
                    json!(target.to_string_lossy()),
                );
            }
        }
    }
    paths.insert("bin_links".into(), Value::Object(links));

    let json = json!({
        "format": "codecage-rootfs-manifest/1",
        "recipe": {
            "name": recipe.name,
            "hash": recipe.hash,
            "short_hash": recipe.short(),
            "files": recipe_files,
        },
        "image": format!("{}-{}", recipe.name, recipe.short()),
        "built_at": humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
        "build_seconds": (start.elapsed().as_secs_f64() * 10.0).round() / 10.0,
        "builder": {
            "suite": SUITE,
            "mmdebstrap": info.mmdebstrap,
            "mirrors": info.mirrors,
        },
        "debian_packages": debian,
        "pypi_packages": pypi,
        "npm_packages": npm,
        "paths": paths,
        "payload_env": env,
        "setid_bits_removed": info.setid_removed,
        "file_capabilities_removed": info.caps_removed,
        "smoke_test": info.smoke_test,
        "size_bytes": tree.size_bytes,
        "disk_usage_bytes": tree.disk_bytes,
        "entries": {
            "files": tree.files,
            "dirs": tree.dirs,
            "symlinks": tree.symlinks,
            "other": tree.other,
        },
        "content_hash": tree.content_hash,
        "content_hash_scheme": HASH_SCHEME,
    });
    Ok(Manifest {
        json,
        content_hash: tree.content_hash,
        size_bytes: tree.size_bytes,
        files: tree.files,
    })
}

/// Write the manifest into the image (world-readable).
pub fn write_into_image(root: &Path, text: &str) -> Result<()> {
    let path = root.join(IMAGE_PATH);
    let dir = path.parent().context("manifest path")?;
    fs::create_dir_all(dir)?;
    fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    fs::set_permissions(&path, fs::Permissions::from_mode(0o644))?;
    Ok(())
}

pub struct TreeStats {
    pub content_hash: String,
    /// Apparent size of the regular files, hard links counted once.
    pub size_bytes: u64,
    /// Allocated blocks of all entries, hard links counted once.
    pub disk_bytes: u64,
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub other: u64,
    /// Entries with a setuid or setgid bit.
    pub setid: Vec<String>,
}

/// Walk the tree: content hash, sizes, counts.
pub fn tree_stats(root: &Path, skip: &Path) -> Result<TreeStats> {
    let mut entries: Vec<(Vec<u8>, PathBuf, fs::Metadata)> = Vec::new();
    let root_meta = fs::symlink_metadata(root)?;
    entries.push((b".".to_vec(), root.to_path_buf(), root_meta));
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
            let rel = path.strip_prefix(root)?.as_os_str().as_bytes().to_vec();
            entries.push((rel, path, meta));
        }
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));

    // File contents first, on all cores (distinct inodes only).
    let mut files: Vec<(Inode, &Path)> = entries
        .iter()
        .filter(|(_, _, m)| m.file_type().is_file())
        .map(|(_, p, m)| ((m.dev(), m.ino()), p.as_path()))
        .collect();
    files.sort_by_key(|(k, _)| *k);
    files.dedup_by_key(|(k, _)| *k);
    let digests = hash_files(&files)?;

    let mut outer = Sha256::new();
    let mut seen: HashSet<Inode> = HashSet::new();
    let mut stats = TreeStats {
        content_hash: String::new(),
        size_bytes: 0,
        disk_bytes: 0,
        files: 0,
        dirs: 0,
        symlinks: 0,
        other: 0,
        setid: Vec::new(),
    };
    for (rel, path, meta) in &entries {
        let ft = meta.file_type();
        let key = (meta.dev(), meta.ino());
        let first_link = seen.insert(key);
        if first_link {
            stats.disk_bytes += meta.blocks() * 512;
        }
        let (kind, payload) = if ft.is_dir() {
            stats.dirs += 1;
            ('d', String::new())
        } else if ft.is_symlink() {
            stats.symlinks += 1;
            let target = fs::read_link(path)?;
            (
                'l',
                String::from_utf8_lossy(target.as_os_str().as_bytes()).into_owned(),
            )
        } else if ft.is_file() {
            stats.files += 1;
            if first_link {
                stats.size_bytes += meta.len();
            }
            let digest = digests.get(&key).context("file digest missing")?;
            ('f', digest.clone())
        } else {
            stats.other += 1;
            let dev = meta.rdev();
            let kind = if ft.is_char_device() {
                'c'
            } else if ft.is_block_device() {
                'b'
            } else if ft.is_fifo() {
                'p'
            } else {
                's'
            };
            (kind, format!("{},{}", libc::major(dev), libc::minor(dev)))
        };
        let mode = meta.mode() & 0o7777;
        if kind != 'l' && mode & 0o6000 != 0 {
            stats.setid.push(String::from_utf8_lossy(rel).into_owned());
        }
        outer.update(rel);
        outer.update([0]);
        outer.update(format!("{kind}\0{mode:o}\0{}:{}\0", meta.uid(), meta.gid()));
        outer.update(payload.as_bytes());
        outer.update([0]);
    }
    stats.content_hash = format!("sha256:{:x}", outer.finalize());
    Ok(stats)
}

/// (device, inode): a file's identity, for hard links.
type Inode = (u64, u64);

/// SHA-256 (hex) of each file, on as many threads as there are cores.
fn hash_files(files: &[(Inode, &Path)]) -> Result<HashMap<Inode, String>> {
    let next = AtomicUsize::new(0);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
    let results: Vec<Result<Vec<(Inode, String)>>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut out = Vec::new();
                    let mut buf = vec![0u8; 1 << 20];
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some((key, path)) = files.get(i) else {
                            return Ok(out);
                        };
                        let mut h = Sha256::new();
                        let mut f = fs::File::open(path)
                            .with_context(|| format!("reading {}", path.display()))?;
                        loop {
                            let n = f.read(&mut buf)?;
                            if n == 0 {
                                break;
                            }
                            h.update(&buf[..n]);
                        }
                        out.push((*key, format!("{:x}", h.finalize())));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("hash thread panicked")))
            })
            .collect()
    });
    let mut map = HashMap::with_capacity(files.len());
    for r in results {
        map.extend(r?);
    }
    Ok(map)
}

/// Installed Debian packages (name -> version) from the image's dpkg status.
pub fn debian_packages(root: &Path) -> Result<BTreeMap<String, String>> {
    let status = fs::read_to_string(root.join("var/lib/dpkg/status"))
        .context("reading the image's /var/lib/dpkg/status")?;
    let mut out = BTreeMap::new();
    for para in status.split("\n\n") {
        let field = |name: &str| {
            para.lines()
                .find_map(|l| l.strip_prefix(name).map(str::trim))
                .unwrap_or("")
        };
        let (name, version, arch, state) = (
            field("Package:"),
            field("Version:"),
            field("Architecture:"),
            field("Status:"),
        );
        if name.is_empty() || !state.ends_with(" installed") {
            continue;
        }
        let key = if out.contains_key(name) {
            format!("{name}:{arch}")
        } else {
            name.to_string()
        };
        out.insert(key, version.to_string());
    }
    anyhow::ensure!(!out.is_empty(), "no installed packages in the dpkg status");
    Ok(out)
}

/// `usr/local/lib/python3.X/dist-packages`, where pip put the recipe's packages.
fn python_site(root: &Path) -> Option<String> {
    let lib = root.join("usr/local/lib");
    let mut sites: Vec<String> = fs::read_dir(&lib)
        .ok()?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("python3"))
        .map(|n| format!("usr/local/lib/{n}/dist-packages"))
        .filter(|s| root.join(s).is_dir())
        .collect();
    sites.sort();
    sites.pop()
}

/// PyPI distributions (name -> version) pip installed into the image.
pub fn pypi_packages(root: &Path) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let Some(site) = python_site(root) else {
        return Ok(out);
    };
    for entry in fs::read_dir(root.join(site))?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.ends_with(".dist-info") {
            continue;
        }
        let Ok(meta) = fs::read_to_string(entry.path().join("METADATA")) else {
            continue;
        };
        let header = |key: &str| {
            meta.lines()
                .take_while(|l| !l.is_empty())
                .find_map(|l| l.strip_prefix(key).map(str::trim).map(str::to_string))
        };
        if let (Some(n), Some(v)) = (header("Name:"), header("Version:")) {
            out.insert(n, v);
        }
    }
    Ok(out)
}

/// npm packages installed by `npm ci` (from node_modules/.package-lock.json):
/// the name for a top-level package, the install path for a nested one.
pub fn npm_packages(root: &Path) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let lock = root
        .join(NODE_PREFIX)
        .join("node_modules/.package-lock.json");
    let Ok(text) = fs::read_to_string(&lock) else {
        return Ok(out);
    };
    let v: Value =
        serde_json::from_str(&text).context("parsing node_modules/.package-lock.json")?;
    if let Some(packages) = v.get("packages").and_then(Value::as_object) {
        for (path, p) in packages {
            let Some(rest) = path.strip_prefix("node_modules/") else {
                continue;
            };
            let version = p.get("version").and_then(Value::as_str).unwrap_or("");
            out.insert(rest.to_string(), version.to_string());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_lowercase_hex() {
        assert_eq!(
            format!("{:x}", Sha256::digest(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn build_dates_are_rfc3339_in_seconds() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_795_560_860);
        assert_eq!(
            humantime::format_rfc3339_seconds(t).to_string(),
            "2026-11-24T22:54:20Z"
        );
    }
}
