//! Files in and out of a sandbox. Inputs are written into /work before the code runs;
//! outputs are taken from the profile's output directory (default /work/out) after a run or
//! a session's call. Both are done by the sandbox's init, inside the sandbox's own mount
//! namespace after pivot_root, walking one component at a time with O_NOFOLLOW and never
//! leaving /work's file system: a planted symlink can point nowhere but into the sandbox,
//! and is refused anyway; a FIFO or device is never opened for reading; a file that grows
//! while it is read is read up to its cap and no further. The launcher gets the bytes over
//! the channel, caps them again, and hashes them.

use serde::{Deserialize, Serialize};

/// One entry of a session's directory listing.
pub use crate::sandbox::DirEntry;

/// The longest path of an input or output file, and of one of its components.
pub const MAX_PATH: usize = 1024;
pub const MAX_COMPONENT: usize = 255;

/// A file to place in /work: its path relative to /work, and its bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct InputFile {
    /// Relative to /work (no `..`).
    pub path: String,
    /// The bytes, base64.
    #[serde(with = "base64_bytes")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, format = Byte))]
    pub data: Vec<u8>,
}

impl InputFile {
    pub fn new(path: impl Into<String>, data: impl Into<Vec<u8>>) -> InputFile {
        InputFile {
            path: path.into(),
            data: data.into(),
        }
    }
}

/// What may be taken back, and how much.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputRules {
    /// The directory, relative to /work (`out` for /work/out).
    pub dir: String,
    /// Allowed extensions, without the dot, lowercase.
    pub types: Vec<String>,
    pub max_file: u64,
    pub max_total: u64,
    pub max_files: u64,
}

/// A file taken back from the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OutputFile {
    /// Relative to the output directory.
    pub path: String,
    pub size: u64,
    pub media_type: String,
    pub sha256: String,
    /// The bytes, base64 (left out when the caller asked for names only).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "optional_base64"
    )]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub data: Option<Vec<u8>>,
}

/// A file of the output directory that was not taken, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SkippedFile {
    pub path: String,
    pub reason: SkipReason,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum SkipReason {
    /// Its extension is not among the profile's output types.
    Pattern,
    /// Over the per-file cap (or it grew past it while read).
    Size,
    /// A symbolic link.
    Symlink,
    /// A FIFO, socket or device.
    NotRegular,
    /// A hard link (more than one name).
    HardLink,
    /// The run's output files passed their total size.
    TotalCap,
    /// The run's output files passed their count.
    CountCap,
    /// On another file system than /work's.
    OtherMount,
    /// The name is not valid UTF-8, or too long.
    BadName,
}

impl SkipReason {
    /// Why, in words, for the CLI.
    pub fn describe(self, rules: Option<&OutputRules>) -> String {
        let cap = |f: fn(&OutputRules) -> u64, show: fn(u64) -> String| {
            rules.map_or(String::new(), |r| format!(" ({})", show(f(r))))
        };
        let size = |n: u64| crate::knobs::Knob::OutputFileSize.show(n);
        match self {
            SkipReason::Pattern => format!(
                "its type is not an allowed output type{}",
                rules.map_or(String::new(), |r| format!(" ({})", r.types.join(", ")))
            ),
            SkipReason::Size => {
                format!("larger than the per-file cap{}", cap(|r| r.max_file, size))
            }
            SkipReason::Symlink => "a symbolic link (never followed)".into(),
            SkipReason::NotRegular => "not a regular file (a FIFO, socket or device)".into(),
            SkipReason::HardLink => "a hard link (the file has another name)".into(),
            SkipReason::TotalCap => {
                format!("past the total size cap{}", cap(|r| r.max_total, size))
            }
            SkipReason::CountCap => {
                format!(
                    "past the cap on the number of files{}",
                    cap(|r| r.max_files, |n| n.to_string())
                )
            }
            SkipReason::OtherMount => "on another file system than /work".into(),
            SkipReason::BadName => "its name is not UTF-8 or is too long".into(),
        }
    }
}

/// Checks an input file's path: relative to /work, no `.` or `..`, no empty component,
/// no NUL or control character, within the length caps. The message names the rule.
pub fn check_input_path(path: &str) -> Result<(), String> {
    let bad = |rule: &str| Err(format!("file {path:?}: {rule}"));
    if path.is_empty() {
        return bad("the path is empty");
    }
    if path.len() > MAX_PATH {
        return bad(&format!("the path is longer than {MAX_PATH} bytes"));
    }
    if path.starts_with('/') {
        return bad("the path is absolute: give it relative to /work");
    }
    if path.chars().any(|c| c.is_control()) {
        return bad("the path has a NUL or control character");
    }
    for component in path.split('/') {
        match component {
            "" => return bad("the path has an empty component (`//` or a trailing `/`)"),
            "." | ".." => return bad("the path has a `.` or `..` component"),
            c if c.len() > MAX_COMPONENT => {
                return bad(&format!("a component is longer than {MAX_COMPONENT} bytes"))
            }
            _ => {}
        }
    }
    Ok(())
}

/// Checks a set of input files against the caps: each path, the count, the total bytes.
pub fn check_inputs(files: &[InputFile], max_files: u64, max_total: u64) -> Result<(), String> {
    if files.len() as u64 > max_files {
        return Err(format!(
            "{} files were given; the profile allows {max_files} (inputs.max_files)",
            files.len()
        ));
    }
    let total: u64 = files.iter().map(|f| f.data.len() as u64).sum();
    if total > max_total {
        return Err(format!(
            "the files are {} in all; the profile allows {} (inputs.max_total_size)",
            crate::units::format_size(total),
            crate::units::format_size(max_total)
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for file in files {
        check_input_path(&file.path)?;
        if !seen.insert(file.path.as_str()) {
            return Err(format!("file {:?} is given twice", file.path));
        }
    }
    Ok(())
}

/// The media type of a file, by its extension.
pub fn media_type(path: &str) -> &'static str {
    let ext = path.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
    match ext.as_deref() {
        Some("png") => "image/png",
        Some("jpg" | "jpeg") => "image/jpeg",
        Some("gif") => "image/gif",
        Some("webp") => "image/webp",
        Some("svg") => "image/svg+xml",
        Some("csv") => "text/csv",
        Some("tsv") => "text/tab-separated-values",
        Some("json") => "application/json",
        Some("txt" | "log") => "text/plain",
        Some("md") => "text/markdown",
        Some("html" | "htm") => "text/html",
        Some("pdf") => "application/pdf",
        Some("parquet") => "application/vnd.apache.parquet",
        Some("xlsx") => "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
        _ => "application/octet-stream",
    }
}

/// sha256 of `data`, hex.
pub fn sha256(data: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Saves output files under `dir` on the host (created if missing): each at its relative
/// path, never outside `dir` whatever the names (checked as input paths are, then walked
/// one component at a time without following a symlink), never over a symlink. Returns
/// the paths written.
pub fn save_under(
    dir: &std::path::Path,
    files: &[OutputFile],
) -> Result<Vec<std::path::PathBuf>, String> {
    use nix::fcntl::{openat, OFlag};
    use nix::sys::stat::Mode;
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let root = nix::fcntl::open(
        dir,
        OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("cannot open {}: {e}", dir.display()))?;
    let mut written = Vec::new();
    for file in files {
        let Some(data) = &file.data else { continue };
        check_input_path(&file.path)?;
        let fail = |e: &dyn std::fmt::Display| {
            format!("cannot write {}/{}: {e}", dir.display(), file.path)
        };
        let mut components: Vec<&str> = file.path.split('/').collect();
        let name = components.pop().expect("a checked path has a name");
        let mut at = nix::fcntl::openat(
            &root,
            ".",
            OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| fail(&e))?;
        for component in components {
            match nix::sys::stat::mkdirat(&at, component, Mode::from_bits_truncate(0o755)) {
                Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
                Err(e) => return Err(fail(&e)),
            }
            at = openat(
                &at,
                component,
                OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| fail(&e))?;
        }
        match nix::unistd::unlinkat(&at, name, nix::unistd::UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(nix::errno::Errno::ENOENT) => {}
            Err(e) => return Err(fail(&e)),
        }
        let fd = openat(
            &at,
            name,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o644),
        )
        .map_err(|e| fail(&e))?;
        std::io::Write::write_all(&mut std::fs::File::from(fd), data).map_err(|e| fail(&e))?;
        written.push(dir.join(&file.path));
    }
    Ok(written)
}

/// Bytes as base64 in JSON.
pub(crate) mod base64_bytes {
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(serde::de::Error::custom)
    }
}

mod optional_base64 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match bytes {
            Some(b) => super::base64_bytes::serialize(b, s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        #[derive(Deserialize)]
        struct Wrapped(#[serde(with = "super::base64_bytes")] Vec<u8>);
        Ok(Option::<Wrapped>::deserialize(d)?.map(|w| w.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_paths_are_refused_by_the_rule_they_break() {
        for (path, rule) in [
            ("../../etc/x", ".."),
            ("/abs", "absolute"),
            ("a\0b", "control"),
            ("a\nb", "control"),
            ("a//b", "empty component"),
            ("", "empty"),
            ("./x", "`.`"),
        ] {
            let e = check_input_path(path).unwrap_err();
            assert!(e.contains(rule), "{path:?}: {e}");
        }
        assert!(check_input_path(&"x".repeat(300))
            .unwrap_err()
            .contains("255"));
        assert!(check_input_path("data/in.csv").is_ok());
        assert!(check_input_path("ünïcode name.txt").is_ok());
    }

    #[test]
    fn inputs_are_counted_and_sized() {
        let files = vec![
            InputFile::new("a", vec![0; 10]),
            InputFile::new("b", vec![0; 10]),
        ];
        assert!(check_inputs(&files, 1, 100)
            .unwrap_err()
            .contains("inputs.max_files"));
        assert!(check_inputs(&files, 10, 15)
            .unwrap_err()
            .contains("inputs.max_total_size"));
        assert!(check_inputs(&files, 10, 100).is_ok());
        let twice = vec![InputFile::new("a", vec![]), InputFile::new("a", vec![])];
        assert!(check_inputs(&twice, 10, 100).unwrap_err().contains("twice"));
    }

    #[test]
    fn media_types_and_hashes() {
        assert_eq!(media_type("plot.PNG"), "image/png");
        assert_eq!(media_type("noext"), "application/octet-stream");
        assert_eq!(
            sha256(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn input_files_carry_bytes_as_base64() {
        let f = InputFile::new("x.bin", vec![0u8, 255]);
        let json = serde_json::to_string(&f).unwrap();
        assert_eq!(json, r#"{"path":"x.bin","data":"AP8="}"#);
        assert_eq!(serde_json::from_str::<InputFile>(&json).unwrap(), f);
    }
}
