//! Policy: a `Profile` (profiles/*.toml) plus a `Request` resolves into a `Spec`. A request
//! may tighten a profile, or ask for more up to the profile's `max_*`, never past it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::cgroup::Limits;
use crate::runner::Lang;
use crate::spec::{LayerMode, Rootfs, Spec, MIN_MEMORY};
use crate::units::{format_duration, format_size, parse_duration, parse_size};

/// The profiles built into the binary, by name.
pub const BUILT_IN: &[(&str, &str)] = &[
    ("python", include_str!("../profiles/python.toml")),
    ("node", include_str!("../profiles/node.toml")),
    ("typescript", include_str!("../profiles/typescript.toml")),
    ("bash", include_str!("../profiles/bash.toml")),
];

/// Where a file of the same name replaces a built-in profile.
pub const SYSTEM_DIR: &str = "/etc/codecage/profiles";

/// A size in a profile: bytes, or a string with a unit ("256M").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "NumberOrText", into = "String")]
pub struct Size(pub u64);

/// A duration in a profile: seconds, or a string with a unit ("30s").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "NumberOrText", into = "String")]
pub struct Dur(pub Duration);

#[derive(Deserialize)]
#[serde(untagged)]
enum NumberOrText {
    Number(u64),
    Text(String),
}

impl TryFrom<NumberOrText> for Size {
    type Error = String;
    fn try_from(v: NumberOrText) -> Result<Self, String> {
        match v {
            NumberOrText::Number(n) => parse_size(&n.to_string()).map(Size),
            NumberOrText::Text(t) => parse_size(&t).map(Size),
        }
    }
}

impl From<Size> for String {
    fn from(s: Size) -> String {
        format_size(s.0)
    }
}

impl TryFrom<NumberOrText> for Dur {
    type Error = String;
    fn try_from(v: NumberOrText) -> Result<Self, String> {
        match v {
            NumberOrText::Number(n) => parse_duration(&n.to_string()).map(Dur),
            NumberOrText::Text(t) => parse_duration(&t).map(Dur),
        }
    }
}

impl From<Dur> for String {
    fn from(d: Dur) -> String {
        format_duration(d.0)
    }
}

/// One use of the sandbox: limits, rootfs, environment, hardening.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Profile {
    pub description: String,
    pub language: Option<Lang>,
    pub rootfs: String,
    pub limits: LimitsSection,
    pub filesystem: FilesystemSection,
    pub network: NetworkSection,
    pub env: BTreeMap<String, String>,
    pub outputs: OutputsSection,
    pub session: SessionSection,
    pub hardening: HardeningSection,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsSection {
    pub timeout: Dur,
    pub max_timeout: Dur,
    pub memory: Size,
    pub max_memory: Size,
    pub cpus: f64,
    pub max_cpus: f64,
    pub pids: u64,
    pub max_pids: u64,
    pub output_limit: Size,
    pub max_output_limit: Size,
    pub nofile: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FilesystemSection {
    pub tmp_size: Size,
    pub work_size: Size,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    /// Loopback only.
    #[default]
    None,
    /// Only `allowed_hosts` (not available yet).
    Restricted,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct NetworkSection {
    pub mode: NetworkMode,
    pub allowed_hosts: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OutputsSection {
    pub types: Vec<String>,
    pub max_size: Size,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SessionSection {
    pub idle_timeout: Dur,
    pub max_duration: Dur,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct HardeningSection {
    pub landlock: LayerMode,
    pub seccomp: LayerMode,
    /// The memory, CPU and pids limits' cgroup.
    pub cgroup: LayerMode,
}

impl Default for Profile {
    fn default() -> Self {
        Profile {
            description: String::new(),
            language: None,
            rootfs: "default".into(),
            limits: LimitsSection::default(),
            filesystem: FilesystemSection::default(),
            network: NetworkSection::default(),
            env: BTreeMap::new(),
            outputs: OutputsSection::default(),
            session: SessionSection::default(),
            hardening: HardeningSection::default(),
        }
    }
}

impl Default for LimitsSection {
    fn default() -> Self {
        let limits = Limits::default();
        LimitsSection {
            timeout: Dur(Duration::from_secs(30)),
            max_timeout: Dur(Duration::from_secs(120)),
            memory: Size(limits.memory),
            max_memory: Size(2 << 30),
            cpus: limits.cpus(),
            max_cpus: 2.0,
            pids: limits.pids,
            max_pids: 512,
            output_limit: Size(1 << 20),
            max_output_limit: Size(10 << 20),
            nofile: 256,
        }
    }
}

impl Default for FilesystemSection {
    fn default() -> Self {
        FilesystemSection {
            tmp_size: Size(64 << 20),
            work_size: Size(64 << 20),
        }
    }
}

impl Default for OutputsSection {
    fn default() -> Self {
        let types = ["png", "jpg", "svg", "csv", "json", "txt", "md", "html"];
        OutputsSection {
            types: types.iter().map(|t| t.to_string()).collect(),
            max_size: Size(5 << 20),
        }
    }
}

impl Default for SessionSection {
    fn default() -> Self {
        SessionSection {
            idle_timeout: Dur(Duration::from_secs(600)),
            max_duration: Dur(Duration::from_secs(3600)),
        }
    }
}

/// A profile that could not be loaded: the file, and what is wrong with which key.
#[derive(Debug, thiserror::Error)]
#[error("profile {source_name}: {message}")]
pub struct ProfileError {
    pub source_name: String,
    pub message: String,
}

impl Profile {
    /// Parses and validates a profile; `source_name` (a file name) goes into errors.
    pub fn parse(text: &str, source_name: &str) -> Result<Profile, ProfileError> {
        let error = |message: String| ProfileError {
            source_name: source_name.to_string(),
            message,
        };
        let profile: Profile =
            toml::from_str(text).map_err(|e| error(e.to_string().trim_end().to_string()))?;
        profile.validate().map_err(error)?;
        Ok(profile)
    }

    /// Loads a profile by name (`/etc/codecage/profiles/NAME.toml`, else built in) or from a
    /// file (a path with a `/`, or ending in `.toml`).
    pub fn load(name_or_file: &str) -> Result<Profile, ProfileError> {
        let error = |message: String| ProfileError {
            source_name: name_or_file.to_string(),
            message,
        };
        if name_or_file.contains('/') || name_or_file.ends_with(".toml") {
            let text = std::fs::read_to_string(name_or_file)
                .map_err(|e| error(format!("cannot read it: {e}")))?;
            return Profile::parse(&text, name_or_file);
        }
        let system = Path::new(SYSTEM_DIR).join(format!("{name_or_file}.toml"));
        if let Ok(text) = std::fs::read_to_string(&system) {
            return Profile::parse(&text, &system.display().to_string());
        }
        match BUILT_IN.iter().find(|(name, _)| *name == name_or_file) {
            Some((name, text)) => Profile::parse(text, &format!("profiles/{name}.toml (built in)")),
            None => Err(error(format!(
                "no such profile; the profiles are {} (or give a file path)",
                names().join(", ")
            ))),
        }
    }

    fn validate(&self) -> Result<(), String> {
        let l = &self.limits;
        let above = |key: &str, value: String, max_key: &str, max: String| {
            format!("limits.{key} ({value}) is above limits.{max_key} ({max}); raise {max_key} or lower {key}")
        };
        if l.timeout.0 > l.max_timeout.0 {
            return Err(above(
                "timeout",
                format_duration(l.timeout.0),
                "max_timeout",
                format_duration(l.max_timeout.0),
            ));
        }
        for (key, size) in [("memory", l.memory), ("max_memory", l.max_memory)] {
            if size.0 < MIN_MEMORY {
                return Err(format!(
                    "limits.{key} ({}) is below the minimum of {}",
                    format_size(size.0),
                    format_size(MIN_MEMORY)
                ));
            }
        }
        if l.memory.0 > l.max_memory.0 {
            return Err(above(
                "memory",
                format_size(l.memory.0),
                "max_memory",
                format_size(l.max_memory.0),
            ));
        }
        for (key, cpus) in [("cpus", l.cpus), ("max_cpus", l.max_cpus)] {
            if !(0.01..=4096.0).contains(&cpus) {
                return Err(format!("limits.{key} = {cpus} is out of range: use a number of CPUs from 0.01 up (0.5, 1, 2)"));
            }
        }
        if l.cpus > l.max_cpus {
            return Err(above(
                "cpus",
                l.cpus.to_string(),
                "max_cpus",
                l.max_cpus.to_string(),
            ));
        }
        for (key, pids) in [("pids", l.pids), ("max_pids", l.max_pids)] {
            if pids == 0 {
                return Err(format!(
                    "limits.{key} = 0 could not even start the program: use 1 or more"
                ));
            }
        }
        if l.pids > l.max_pids {
            return Err(above(
                "pids",
                l.pids.to_string(),
                "max_pids",
                l.max_pids.to_string(),
            ));
        }
        if l.output_limit.0 > l.max_output_limit.0 {
            let (v, m) = (
                format_size(l.output_limit.0),
                format_size(l.max_output_limit.0),
            );
            return Err(above("output_limit", v, "max_output_limit", m));
        }
        if !(16..=1 << 20).contains(&l.nofile) {
            return Err(format!(
                "limits.nofile = {} is out of range: use 16 to 1048576",
                l.nofile
            ));
        }
        if self.network.mode == NetworkMode::Restricted {
            return Err(
                "network.mode = \"restricted\" is not available yet: use \"none\" (loopback only)"
                    .into(),
            );
        }
        if self.rootfs.is_empty() {
            return Err(
                "rootfs is empty: use \"default\" (the built image), \"host\", or an absolute path"
                    .into(),
            );
        }
        for key in self.env.keys() {
            check_env_name(key).map_err(|e| format!("env: {e}"))?;
        }
        Ok(())
    }
}

/// The names of every profile: built in and in /etc/codecage/profiles.
pub fn names() -> Vec<String> {
    let mut names: Vec<String> = BUILT_IN.iter().map(|(n, _)| n.to_string()).collect();
    if let Ok(entries) = std::fs::read_dir(SYSTEM_DIR) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            if let Some(stem) = name.strip_suffix(".toml") {
                if !names.iter().any(|n| n == stem) {
                    names.push(stem.to_string());
                }
            }
        }
    }
    names
}

/// Variables no profile or request may set: they would change which code runs.
fn check_env_name(key: &str) -> Result<(), String> {
    if key.is_empty() || key.contains('=') || key.contains('\0') {
        return Err(format!("{key:?} is not a valid variable name"));
    }
    if key == "PATH" || key.starts_with("LD_") {
        return Err(format!(
            "{key} may not be set: it would change which programs and libraries run"
        ));
    }
    Ok(())
}

/// What a front end asks for, before policy.
#[derive(Debug, Clone, Default)]
pub struct Request {
    /// `-c CODE` or a file's contents, in the profile's (or `lang`'s) language.
    pub code: Option<String>,
    pub lang: Option<Lang>,
    /// A program and its arguments instead of code.
    pub argv: Option<Vec<String>>,
    pub timeout: Option<Duration>,
    pub memory: Option<u64>,
    pub cpus: Option<f64>,
    pub pids: Option<u64>,
    pub output_limit: Option<u64>,
    pub tmp_size: Option<u64>,
    pub work_size: Option<u64>,
    pub rootfs: Option<String>,
    pub env: Vec<(String, String)>,
}

/// Why a request cannot run under a profile.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// It asks for more than the profile allows.
    #[error("{0}")]
    Policy(String),
    /// It is malformed, or names something that does not exist.
    #[error("{0}")]
    Invalid(String),
}

/// Where things live on the host, for resolving names.
#[derive(Debug, Clone)]
pub struct Host {
    /// Built images are `<data_dir>/rootfs/<name>`.
    pub data_dir: PathBuf,
}

impl Host {
    /// `$CODECAGE_DATA_DIR`, else /var/lib/codecage.
    pub fn from_env() -> Host {
        let data_dir = std::env::var_os("CODECAGE_DATA_DIR")
            .map_or_else(|| PathBuf::from("/var/lib/codecage"), PathBuf::from);
        Host { data_dir }
    }
}

/// Resolves `request` under `profile` into a Spec.
pub fn resolve(
    profile: &Profile,
    profile_name: &str,
    request: &Request,
    host: &Host,
) -> Result<Spec, PolicyError> {
    let l = &profile.limits;
    let fs = &profile.filesystem;
    // The request's value, or the profile's; refused past `max`.
    let within = |flag: &str,
                  asked: Option<u64>,
                  default: u64,
                  max: u64,
                  show: fn(u64) -> String| {
        let value = asked.unwrap_or(default);
        if value > max {
            return Err(PolicyError::Policy(format!(
                "{flag} {} is more than the profile {profile_name} allows (at most {}); ask for less, or use a \
                 profile that allows more",
                show(value),
                show(max)
            )));
        }
        Ok(value)
    };
    let nanos = |d: Duration| d.as_nanos() as u64;
    let show_duration: fn(u64) -> String = |n| format_duration(Duration::from_nanos(n));
    let show_number: fn(u64) -> String = |n| n.to_string();
    let show_cpus: fn(u64) -> String = |q| (q as f64 / 1e6).to_string();
    let micro_cpus = |c: f64| (c * 1e6).round() as u64;
    let timeout = within(
        "--timeout",
        request.timeout.map(nanos),
        nanos(l.timeout.0),
        nanos(l.max_timeout.0),
        show_duration,
    )?;
    let memory = within(
        "--memory",
        request.memory,
        l.memory.0,
        l.max_memory.0,
        format_size,
    )?;
    let cpus = within(
        "--cpus",
        request.cpus.map(micro_cpus),
        micro_cpus(l.cpus),
        micro_cpus(l.max_cpus),
        show_cpus,
    )?;
    let pids = within("--pids", request.pids, l.pids, l.max_pids, show_number)?;
    let output_limit = within(
        "--output-limit",
        request.output_limit,
        l.output_limit.0,
        l.max_output_limit.0,
        format_size,
    )?;
    // The tmpfs sizes have no headroom: a request may only ask for less.
    let tmp_size = within(
        "--tmp-size",
        request.tmp_size,
        fs.tmp_size.0,
        fs.tmp_size.0,
        format_size,
    )?;
    let work_size = within(
        "--work-size",
        request.work_size,
        fs.work_size.0,
        fs.work_size.0,
        format_size,
    )?;
    let (timeout, cpus) = (Duration::from_nanos(timeout), cpus as f64 / 1e6);

    let (argv, files) = match (&request.code, &request.argv) {
        (Some(code), None) => {
            let lang = request.lang.or(profile.language).ok_or_else(|| {
                PolicyError::Invalid(format!("the profile {profile_name} has no language: give --lang python|node|typescript|bash"))
            })?;
            lang.program(code)
        }
        (None, Some(argv)) => (argv.clone(), Vec::new()),
        _ => {
            return Err(PolicyError::Invalid(
                "give either code or a program to run".into(),
            ))
        }
    };

    let mut spec = Spec::new(argv);
    spec.files = files;
    spec.timeout = timeout;
    spec.output_limit = output_limit;
    spec.tmp_size = tmp_size;
    spec.work_size = work_size;
    spec.limits = Some(Limits {
        memory,
        cpu_quota_us: Limits::quota_for_cpus(cpus),
        pids,
    });
    spec.nofile = l.nofile;
    spec.landlock = profile.hardening.landlock;
    spec.seccomp = profile.hardening.seccomp;
    spec.cgroup = profile.hardening.cgroup;
    for (key, value) in profile.env.iter().map(|(k, v)| (k.as_str(), v.as_str())) {
        spec.set_env(key, value);
    }
    for (key, value) in &request.env {
        check_env_name(key).map_err(|e| PolicyError::Policy(format!("--env {e}")))?;
        spec.set_env(key, value);
    }
    spec.rootfs = resolve_rootfs(request.rootfs.as_deref().unwrap_or(&profile.rootfs), host)?;
    spec.validate().map_err(PolicyError::Invalid)?;
    Ok(spec)
}

/// "host", an image name under `<data_dir>/rootfs`, or an absolute path. A name is resolved
/// to the image directory it points to now, so that a rebuild switching the name mid-run
/// does not change this run's root.
pub fn resolve_rootfs(value: &str, host: &Host) -> Result<Rootfs, PolicyError> {
    if value == "host" {
        return Ok(Rootfs::Host);
    }
    if value.contains('/') {
        let path = std::path::absolute(value)
            .map_err(|e| PolicyError::Invalid(format!("rootfs {value}: {e}")))?;
        return Ok(Rootfs::Dir(path));
    }
    let link = host.data_dir.join("rootfs").join(value);
    match std::fs::canonicalize(&link) {
        Ok(dir) if dir.is_dir() => Ok(Rootfs::Dir(dir)),
        _ => Err(PolicyError::Invalid(format!(
            "no image named {value:?} is built (looked for {}): build it with `cargo xtask rootfs`{}, or use the host's \
             /usr instead (--rootfs host, or rootfs = \"host\" in the profile)",
            link.display(),
            if value == "default" { String::new() } else { format!(" --recipe {value}") }
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> Host {
        Host {
            data_dir: "/nonexistent/codecage-data".into(),
        }
    }

    fn err(text: &str) -> String {
        Profile::parse(text, "test.toml").unwrap_err().to_string()
    }

    #[test]
    fn every_built_in_profile_parses() {
        for (name, text) in BUILT_IN {
            let profile = Profile::parse(text, name).unwrap();
            assert_eq!(profile.language.map(|l| l.name()), Some(*name));
            assert_eq!(profile.limits.timeout.0, Duration::from_secs(30));
        }
    }

    #[test]
    fn an_empty_profile_has_the_safe_defaults() {
        let p = Profile::parse("", "empty.toml").unwrap();
        assert_eq!(p.limits.memory.0, 256 << 20);
        assert_eq!(p.limits.cpus, 0.5);
        assert_eq!(p.limits.output_limit.0, 1 << 20);
        assert_eq!(p.network.mode, NetworkMode::None);
        assert_eq!(p.hardening.landlock, LayerMode::Required);
    }

    #[test]
    fn unknown_keys_are_errors_naming_the_file_and_key() {
        let e = err("[limits]\nmemroy = \"1G\"\n");
        assert!(
            e.contains("test.toml") && e.contains("memroy") && e.contains("max_memory"),
            "{e}"
        );
        let e = err("colour = 1\n");
        assert!(e.contains("colour"), "{e}");
    }

    #[test]
    fn wrong_types_are_errors() {
        let e = err("[limits]\npids = \"many\"\n");
        assert!(e.contains("pids") && e.contains("test.toml"), "{e}");
        let e = err("[limits]\nmemory = \"12Q\"\n");
        assert!(e.contains("memory") && e.contains("256M"), "{e}");
        let e = err("[hardening]\nlandlock = \"sometimes\"\n");
        assert!(e.contains("landlock") && e.contains("best-effort"), "{e}");
    }

    #[test]
    fn out_of_range_values_are_errors() {
        assert!(err("[limits]\ntimeout = \"5m\"\n")
            .contains("limits.timeout (300s) is above limits.max_timeout (120s)"));
        assert!(err("[limits]\nmemory = \"1M\"\n").contains("below the minimum"));
        assert!(err("[limits]\ncpus = 0\n").contains("limits.cpus"));
        assert!(err("[limits]\npids = 0\n").contains("limits.pids"));
        assert!(err("[limits]\nnofile = 1\n").contains("limits.nofile"));
        assert!(err("[network]\nmode = \"restricted\"\n").contains("not available yet"));
        assert!(err("[network]\nmode = \"open\"\n").contains("mode"));
        assert!(err("[env]\nLD_PRELOAD = \"/x.so\"\n").contains("LD_PRELOAD may not be set"));
    }

    #[test]
    fn a_request_may_tighten_or_use_the_headroom_but_not_pass_the_max() {
        let p = Profile::load("python").unwrap();
        let mut r = Request {
            code: Some("print(1)".into()),
            rootfs: Some("host".into()),
            ..Request::default()
        };
        r.timeout = Some(Duration::from_secs(60));
        r.memory = Some(64 << 20);
        let spec = resolve(&p, "python", &r, &host()).unwrap();
        assert_eq!(spec.timeout, Duration::from_secs(60));
        assert_eq!(spec.limits.unwrap().memory, 64 << 20);
        assert!(spec.env.contains(&("MPLBACKEND".into(), "Agg".into())));
        r.memory = Some(4 << 30);
        let e = resolve(&p, "python", &r, &host()).unwrap_err();
        assert!(matches!(e, PolicyError::Policy(_)));
        assert!(
            e.to_string().contains("--memory 4G") && e.to_string().contains("at most 2G"),
            "{e}"
        );
        r.memory = None;
        r.tmp_size = Some(128 << 20);
        assert!(resolve(&p, "python", &r, &host())
            .unwrap_err()
            .to_string()
            .contains("--tmp-size"));
        r.tmp_size = None;
        r.env = vec![("PATH".into(), "/evil".into())];
        assert!(matches!(
            resolve(&p, "python", &r, &host()),
            Err(PolicyError::Policy(_))
        ));
    }

    #[test]
    fn a_missing_image_says_how_to_build_it() {
        let e = resolve_rootfs("default", &host()).unwrap_err().to_string();
        assert!(
            e.contains("cargo xtask rootfs") && e.contains("--rootfs host"),
            "{e}"
        );
        assert_eq!(resolve_rootfs("host", &host()).unwrap(), Rootfs::Host);
    }

    #[test]
    fn unknown_profile_names_list_the_known_ones() {
        let e = Profile::load("cobol").unwrap_err().to_string();
        assert!(e.contains("python") && e.contains("bash"), "{e}");
    }
}
