//! Policy: a `Profile` (profiles/*.toml) plus a `Request` resolves into a `Spec`. A request
//! may tighten a profile, or ask for more up to the profile's `max_*`, never past it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::exec_policy::{ExecSection, ExecSecurity};
use crate::knobs::{self, Headroom, Knob, Raw, Section, Values};
use crate::runner::Lang;
use crate::spec::{LandlockMode, LayerMode, Rootfs, Spec};

/// The profiles built into the binary, by name.
pub const BUILT_IN: &[(&str, &str)] = &[
    ("python", include_str!("../profiles/python.toml")),
    ("node", include_str!("../profiles/node.toml")),
    ("typescript", include_str!("../profiles/typescript.toml")),
    ("bash", include_str!("../profiles/bash.toml")),
    ("ci", include_str!("../profiles/ci.toml")),
];

/// Where a file of the same name replaces a built-in profile.
pub const SYSTEM_DIR: &str = "/etc/codecage/profiles";

/// One use of the sandbox: limits, rootfs, environment, hardening.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(into = "RawProfile")]
pub struct Profile {
    pub description: String,
    pub language: Option<Lang>,
    pub rootfs: String,
    /// Every knob's value (see [`crate::knobs`]).
    pub values: Values,
    /// The most a request may ask for, for the knobs with headroom.
    pub maxes: Values,
    pub network: NetworkSection,
    pub env: BTreeMap<String, String>,
    /// Extensions of the files an agent may take back.
    pub output_types: Vec<String>,
    /// Where they are taken from: a directory under /work (`outputs.dir`).
    pub output_dir: String,
    pub hardening: HardeningSection,
    /// `[exec]`: what the sandbox may execute (`security`, `allowed`, `denied`).
    pub exec: ExecSection,
    /// Modules a pre-started interpreter imports before its request (the server's warm
    /// pool; Python only): `import pandas` then costs the request nothing.
    pub preload: Vec<String>,
}

pub use crate::network::Mode as NetworkMode;

/// `[network]`: the mode and the rules (its numeric settings, `max_bandwidth`,
/// `max_connections` and `connection_idle_timeout`, are knobs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NetworkSection {
    pub mode: NetworkMode,
    /// `example.com`, `*.example.com` (subdomains, not the apex), `host:port` for one more
    /// port passed through unchecked.
    pub allowed_hosts: Vec<String>,
    /// Ports every allowed host may be reached on, TLS or HTTP checked (default 80, 443).
    pub allowed_ports: Vec<u16>,
    /// Address ranges a name may resolve to though they are not public (tests, internal
    /// services).
    pub allowed_ranges: Vec<String>,
    /// Python packages `pip install` may fetch through the gateway's index.
    pub python_packages: Vec<String>,
    /// npm packages `npm install` may fetch through the gateway's registry.
    pub npm_packages: Vec<String>,
}

impl Default for NetworkSection {
    fn default() -> Self {
        NetworkSection {
            mode: NetworkMode::None,
            allowed_hosts: Vec::new(),
            allowed_ports: crate::network::DEFAULT_PORTS.to_vec(),
            allowed_ranges: Vec::new(),
            python_packages: Vec::new(),
            npm_packages: Vec::new(),
        }
    }
}

/// The keys of `[network]` that are not knobs.
const NETWORK_KEYS: &[&str] = &[
    "mode",
    "allowed_hosts",
    "allowed_ports",
    "allowed_ranges",
    "python_packages",
    "npm_packages",
];

/// `[network]` as the file holds it: its own keys beside the knobs, each read with its
/// key in the error.
type RawNetwork = BTreeMap<String, toml::Value>;

fn read_network(raw: RawNetwork) -> Result<(NetworkSection, BTreeMap<String, Raw>), String> {
    fn field<T: serde::de::DeserializeOwned>(key: &str, value: toml::Value) -> Result<T, String> {
        value
            .try_into()
            .map_err(|e: toml::de::Error| format!("network.{key}: {}", e.message()))
    }
    let mut section = NetworkSection::default();
    let mut knobs = BTreeMap::new();
    for (key, value) in raw {
        match key.as_str() {
            "mode" => section.mode = field(&key, value)?,
            "allowed_hosts" => section.allowed_hosts = field(&key, value)?,
            "allowed_ports" => section.allowed_ports = field(&key, value)?,
            "allowed_ranges" => section.allowed_ranges = field(&key, value)?,
            "python_packages" => section.python_packages = field(&key, value)?,
            "npm_packages" => section.npm_packages = field(&key, value)?,
            _ => drop(knobs.insert(key.clone(), field::<Raw>(&key, value)?)),
        }
    }
    Ok((section, knobs))
}

fn write_network(section: NetworkSection) -> RawNetwork {
    let mut raw = RawNetwork::new();
    let mut put = |key: &str, value: Result<toml::Value, toml::ser::Error>| {
        if let Ok(value) = value {
            raw.insert(key.to_string(), value);
        }
    };
    put("mode", toml::Value::try_from(section.mode));
    put(
        "allowed_hosts",
        toml::Value::try_from(section.allowed_hosts),
    );
    put(
        "allowed_ports",
        toml::Value::try_from(section.allowed_ports),
    );
    put(
        "allowed_ranges",
        toml::Value::try_from(section.allowed_ranges),
    );
    put(
        "python_packages",
        toml::Value::try_from(section.python_packages),
    );
    put("npm_packages", toml::Value::try_from(section.npm_packages));
    raw
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct HardeningSection {
    pub landlock: LandlockMode,
    pub seccomp: LayerMode,
    /// The memory, CPU and pids limits' cgroup.
    pub cgroup: LayerMode,
}

const DEFAULT_OUTPUT_TYPES: &[&str] = &[
    "png", "jpg", "jpeg", "gif", "svg", "csv", "tsv", "json", "txt", "md", "html", "pdf",
    "parquet", "xlsx",
];
/// Where output files are taken from, by default.
pub const DEFAULT_OUTPUT_DIR: &str = "/work/out";

impl Default for Profile {
    fn default() -> Self {
        let (values, maxes) = knobs::defaults();
        Profile {
            description: String::new(),
            language: None,
            rootfs: "default".into(),
            values,
            maxes,
            network: NetworkSection::default(),
            env: BTreeMap::new(),
            output_types: DEFAULT_OUTPUT_TYPES.iter().map(|t| t.to_string()).collect(),
            output_dir: DEFAULT_OUTPUT_DIR.to_string(),
            hardening: HardeningSection::default(),
            exec: ExecSection::default(),
            preload: Vec::new(),
        }
    }
}

/// A profile as the TOML file holds it; the knob tables are checked against
/// [`crate::knobs::KNOBS`] when it becomes a [`Profile`].
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawProfile {
    description: String,
    language: Option<Lang>,
    rootfs: Option<String>,
    limits: BTreeMap<String, Raw>,
    filesystem: BTreeMap<String, Raw>,
    inputs: BTreeMap<String, Raw>,
    network: RawNetwork,
    env: BTreeMap<String, String>,
    outputs: BTreeMap<String, OutputsEntry>,
    session: BTreeMap<String, Raw>,
    hardening: HardeningSection,
    exec: ExecSection,
    preload: Vec<String>,
}

/// `[outputs]` holds knobs (`max_size`, ...), a list (`types`) and a path (`dir`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
enum OutputsEntry {
    Types(Vec<String>),
    Knob(Raw),
}

impl From<Profile> for RawProfile {
    fn from(p: Profile) -> RawProfile {
        let mut raw = RawProfile {
            description: p.description,
            language: p.language,
            rootfs: Some(p.rootfs),
            network: write_network(p.network),
            env: p.env,
            hardening: p.hardening,
            exec: p.exec,
            preload: p.preload,
            ..RawProfile::default()
        };
        raw.outputs
            .insert("types".into(), OutputsEntry::Types(p.output_types));
        raw.outputs
            .insert("dir".into(), OutputsEntry::Knob(Raw::Text(p.output_dir)));
        for knob in Knob::all() {
            let def = knob.def();
            let mut entries = vec![(knob.key().to_string(), p.values[&knob])];
            if let (Some(key), Some(max)) = (knob.max_key(), p.maxes.get(&knob)) {
                entries.push((key, *max));
            }
            for (key, value) in entries {
                let value = knob.to_raw(value);
                match def.section {
                    Section::Limits => drop(raw.limits.insert(key, value)),
                    Section::Filesystem => drop(raw.filesystem.insert(key, value)),
                    Section::Inputs => drop(raw.inputs.insert(key, value)),
                    Section::Session => drop(raw.session.insert(key, value)),
                    Section::Network => drop(raw.network.insert(
                        key,
                        toml::Value::try_from(value).unwrap_or(toml::Value::Integer(0)),
                    )),
                    Section::Outputs => drop(raw.outputs.insert(key, OutputsEntry::Knob(value))),
                }
            }
        }
        raw
    }
}

impl RawProfile {
    /// Checks every knob table against the declarations and builds the Profile.
    fn into_profile(self) -> Result<Profile, String> {
        let (network, network_knobs) = read_network(self.network)?;
        let mut profile = Profile {
            description: self.description,
            language: self.language,
            network,
            env: self.env,
            hardening: self.hardening,
            exec: self.exec,
            preload: self.preload,
            ..Profile::default()
        };
        if let Some(rootfs) = self.rootfs {
            profile.rootfs = rootfs;
        }
        let mut outputs = BTreeMap::new();
        for (key, entry) in self.outputs {
            match (key.as_str(), entry) {
                ("types", OutputsEntry::Types(types)) => profile.output_types = types,
                ("dir", OutputsEntry::Knob(Raw::Text(dir))) => profile.output_dir = dir,
                ("dir", _) => {
                    return Err("outputs.dir must be a path under /work, e.g. \"/work/out\"".into())
                }
                ("types", OutputsEntry::Knob(_)) => {
                    return Err(
                        "outputs.types must be a list of file extensions, e.g. [\"png\", \"csv\"]"
                            .into(),
                    )
                }
                (_, OutputsEntry::Knob(raw)) => drop(outputs.insert(key, raw)),
                (_, OutputsEntry::Types(_)) => {
                    return Err(format!(
                        "outputs.{key} is not a list: {}",
                        section_keys(Section::Outputs, &["types", "dir"])
                    ))
                }
            }
        }
        for (section, table) in [
            (Section::Limits, self.limits),
            (Section::Filesystem, self.filesystem),
            (Section::Inputs, self.inputs),
            (Section::Outputs, outputs),
            (Section::Session, self.session),
            (Section::Network, network_knobs),
        ] {
            read_section(&mut profile, section, table)?;
        }
        profile.validate()?;
        Ok(profile)
    }
}

/// Reads one knob table: every key must be a knob of that section or its `max_` key.
fn read_section(
    profile: &mut Profile,
    section: Section,
    table: BTreeMap<String, Raw>,
) -> Result<(), String> {
    for (key, raw) in table {
        let (knob, is_max) = match Knob::in_section_by_key(section, &key) {
            Some(knob) => (knob, false),
            _ => match key
                .strip_prefix("max_")
                .and_then(|k| Knob::in_section_by_key(section, k))
            {
                Some(knob) if knob.max_key().is_some() => (knob, true),
                _ => {
                    let extra: &[&str] = match section {
                        Section::Outputs => &["types", "dir"],
                        Section::Network => NETWORK_KEYS,
                        _ => &[],
                    };
                    return Err(format!(
                        "{}.{key} is not a known key: {}",
                        section.name(),
                        section_keys(section, extra)
                    ));
                }
            },
        };
        let value = knob
            .from_raw(&raw)
            .map_err(|e| format!("{}.{key}: {e}", section.name()))?;
        let target = if is_max {
            &mut profile.maxes
        } else {
            &mut profile.values
        };
        target.insert(knob, value);
    }
    Ok(())
}

/// "[limits] takes timeout, max_timeout, ..." for error messages.
fn section_keys(section: Section, extra: &[&str]) -> String {
    let mut keys: Vec<String> = extra.iter().map(|k| k.to_string()).collect();
    for knob in Knob::in_section(section) {
        keys.push(knob.key().to_string());
        keys.extend(knob.max_key());
    }
    format!("[{}] takes {}", section.name(), keys.join(", "))
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
        let raw: RawProfile =
            toml::from_str(text).map_err(|e| error(e.to_string().trim_end().to_string()))?;
        raw.into_profile().map_err(error)
    }

    /// Loads a profile by name (`/etc/codecage/profiles/NAME.toml`, else built in) or from a
    /// file (a path with a `/`, or ending in `.toml`).
    pub fn load(name_or_file: &str) -> Result<Profile, ProfileError> {
        Profile::load_in(name_or_file, Path::new(SYSTEM_DIR))
    }

    /// As [`Profile::load`], with the installed profiles in `dir` instead of
    /// /etc/codecage/profiles.
    pub fn load_in(name_or_file: &str, dir: &Path) -> Result<Profile, ProfileError> {
        let (text, source_name) = Profile::text_in(name_or_file, dir)?;
        Profile::parse(&text, &source_name)
    }

    /// What [`Profile::load_in`] parses: the text of the profile `name_or_file` (a file's
    /// path, else `<dir>/<name>.toml`, else the built-in one of that name) and the name its
    /// errors give its source.
    pub fn text_in(
        name_or_file: &str,
        dir: &Path,
    ) -> Result<(std::borrow::Cow<'static, str>, String), ProfileError> {
        let error = |message: String| ProfileError {
            source_name: name_or_file.to_string(),
            message,
        };
        if name_or_file.contains('/') || name_or_file.ends_with(".toml") {
            let text = std::fs::read_to_string(name_or_file)
                .map_err(|e| error(format!("cannot read it: {e}")))?;
            return Ok((text.into(), name_or_file.to_string()));
        }
        let system = dir.join(format!("{name_or_file}.toml"));
        if let Ok(text) = std::fs::read_to_string(&system) {
            return Ok((text.into(), system.display().to_string()));
        }
        match BUILT_IN.iter().find(|(name, _)| *name == name_or_file) {
            Some((name, text)) => Ok(((*text).into(), format!("profiles/{name}.toml (built in)"))),
            None => Err(error(format!(
                "no such profile; the profiles are {}",
                names_in(dir).join(", ")
            ))),
        }
    }

    /// What may be taken back from runs and calls under this profile.
    pub fn output_rules(&self) -> crate::files::OutputRules {
        crate::files::OutputRules {
            dir: self
                .output_dir
                .trim_start_matches("/work")
                .trim_start_matches('/')
                .to_string(),
            types: self
                .output_types
                .iter()
                .map(|t| t.to_ascii_lowercase())
                .collect(),
            max_file: self.value(Knob::OutputFileSize),
            max_total: self.value(Knob::OutputTotalSize),
            max_files: self.value(Knob::OutputFiles),
        }
    }

    /// A knob's value in this profile.
    pub fn value(&self, knob: Knob) -> u64 {
        self.values[&knob]
    }

    /// The most a request may ask of `knob` under this profile.
    pub fn max(&self, knob: Knob) -> u64 {
        match knob.def().headroom {
            Headroom::UpToMax(_) => self.maxes[&knob],
            Headroom::LowerOnly | Headroom::ProfileOnly => self.values[&knob],
        }
    }

    /// The network part of a sandbox built from this profile.
    pub fn network_spec(&self) -> crate::network::NetworkSpec {
        let n = &self.network;
        let mut spec = crate::network::NetworkSpec {
            mode: n.mode,
            allowed_hosts: n.allowed_hosts.clone(),
            allowed_ports: n.allowed_ports.clone(),
            allowed_ranges: n.allowed_ranges.clone(),
            python_packages: n.python_packages.clone(),
            npm_packages: n.npm_packages.clone(),
            ..Default::default()
        };
        spec.max_bandwidth = self.value(Knob::MaxBandwidth);
        spec.max_connections = self.value(Knob::MaxConnections);
        spec.connection_idle_timeout_ms = self.value(Knob::ConnectionIdleTimeout);
        spec
    }

    /// What the knob ranges do not say: a value above its own maximum, the network mode,
    /// the rootfs, the environment.
    fn validate(&self) -> Result<(), String> {
        self.exec.validate()?;
        if self.exec.security == ExecSecurity::Allowlist
            && self.hardening.landlock == LandlockMode::Off
        {
            return Err(
                "exec.security = \"allowlist\" needs landlock (hardening.landlock = \"off\" here): the kernel's \
                 EXECUTE check is half of its enforcement"
                    .into(),
            );
        }
        for knob in Knob::all() {
            let (Some(key), Some(max)) = (knob.max_key(), self.maxes.get(&knob)) else {
                continue;
            };
            let (section, value) = (knob.def().section.name(), self.value(knob));
            if value > *max {
                return Err(format!(
                    "{section}.{knob} ({}) is above {section}.{key} ({}); raise {key} or lower {knob}",
                    knob.show(value),
                    knob.show(*max)
                ));
            }
        }
        self.network_spec().validate()?;
        let dir = std::path::Path::new(&self.output_dir);
        let under_work = dir.strip_prefix("/work").is_ok_and(|rest| {
            rest.components()
                .all(|c| matches!(c, std::path::Component::Normal(_)))
        });
        if !under_work || self.output_dir.contains('\0') {
            return Err(format!(
                "outputs.dir = {:?} is not a directory under /work: use e.g. \"/work/out\" (no \"..\")",
                self.output_dir
            ));
        }
        let module = |m: &String| {
            !m.is_empty()
                && m.len() <= 64
                && m.split('.').all(|part| {
                    part.chars()
                        .next()
                        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                        && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                })
        };
        if let Some(m) = self.preload.iter().find(|m| !module(m)) {
            return Err(format!(
                "preload has {m:?}: give Python module names, e.g. [\"numpy\", \"pandas\"]"
            ));
        }
        if self.preload.len() > 32 {
            return Err(format!(
                "preload lists {} modules: at most 32",
                self.preload.len()
            ));
        }
        if let Some(t) = self
            .output_types
            .iter()
            .find(|t| t.is_empty() || t.len() > 16 || !t.bytes().all(|b| b.is_ascii_alphanumeric()))
        {
            return Err(format!(
                "outputs.types has {t:?}: give file extensions without the dot, e.g. \"png\""
            ));
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
    names_in(Path::new(SYSTEM_DIR))
}

/// The names of every profile: built in and in `dir`.
pub fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = BUILT_IN.iter().map(|(n, _)| n.to_string()).collect();
    if let Ok(entries) = std::fs::read_dir(dir) {
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
pub fn check_env_name(key: &str) -> Result<(), String> {
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
    /// Knobs the request sets (each within its range; policy decides if it is allowed).
    pub knobs: Values,
    /// Files to place in /work before the code runs.
    pub files: Vec<crate::files::InputFile>,
    pub rootfs: Option<String>,
    pub env: Vec<(String, String)>,
    /// A network mode no looser than the profile's.
    pub network: Option<NetworkMode>,
}

/// What a sandbox built ahead of requests for `profile` is: the profile resolved with
/// nothing asked (its language's program on an empty file, every value the profile's).
/// A request whose spec has the same sandbox can take it.
pub fn pool_spec(profile: &Profile, name: &str, data: &DataDir) -> Result<Spec, PolicyError> {
    let request = Request {
        code: Some(String::new()),
        lang: profile.language,
        ..Request::default()
    };
    resolve(profile, name, &request, data)
}

/// Why a request cannot run under a profile. Messages are in words and name the request's
/// field by its key (`memory`, `env`, `language`), never one front end's flag: a front end
/// adds its own name for [`PolicyError::field`] (the CLI its flag).
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// It asks for more than the profile allows: the knob, what was asked, the most allowed.
    #[error("{} {} is more than the profile {profile} allows (at most {}); ask for less, or use a profile that allows more", knob.key(), knob.show(*asked), knob.show(*allowed))]
    AboveMax {
        profile: String,
        knob: Knob,
        asked: u64,
        allowed: u64,
    },
    /// It sets something only a profile may set, or looser than the profile allows.
    #[error("{message}")]
    Forbidden {
        field: &'static str,
        message: String,
    },
    /// It is malformed, or names something that does not exist.
    #[error("{message}")]
    Invalid {
        field: Option<&'static str>,
        message: String,
    },
}

impl PolicyError {
    fn invalid(field: Option<&'static str>, message: impl Into<String>) -> PolicyError {
        PolicyError::Invalid {
            field,
            message: message.into(),
        }
    }

    /// The request's field it is about, by its key (a limit's key, `language`, `env`,
    /// `network`, `files`, `rootfs`), if one.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            PolicyError::AboveMax { knob, .. } => Some(knob.key()),
            PolicyError::Forbidden { field, .. } => Some(field),
            PolicyError::Invalid { field, .. } => *field,
        }
    }
}

/// Where codecage keeps its data on the host (images under `rootfs/`).
#[derive(Debug, Clone)]
pub struct DataDir(pub PathBuf);

impl DataDir {
    /// `$CODECAGE_DATA_DIR`, else /var/lib/codecage.
    pub fn from_env() -> DataDir {
        DataDir(
            std::env::var_os("CODECAGE_DATA_DIR")
                .map_or_else(|| PathBuf::from("/var/lib/codecage"), PathBuf::from),
        )
    }
}

/// Resolves `request` under `profile` into a Spec.
pub fn resolve(
    profile: &Profile,
    profile_name: &str,
    request: &Request,
    data: &DataDir,
) -> Result<Spec, PolicyError> {
    let (argv, files) = match (&request.code, &request.argv) {
        (Some(code), None) => {
            let lang = request.lang.or(profile.language).ok_or_else(|| {
                PolicyError::invalid(
                    Some("language"),
                    format!("the profile {profile_name} has no language: name one (python, node, typescript or bash)"),
                )
            })?;
            lang.program(code)
        }
        (None, Some(argv)) => (argv.clone(), Vec::new()),
        _ => {
            return Err(PolicyError::invalid(
                None,
                "give either code or a program to run",
            ))
        }
    };
    let mut spec = Spec::new(argv);
    crate::files::check_inputs(
        &request.files,
        profile.value(Knob::InputFiles),
        profile.value(Knob::InputTotalSize),
    )
    .map_err(|e| PolicyError::invalid(Some("files"), e))?;
    if let Some(clash) = request
        .files
        .iter()
        .find(|f| files.iter().any(|c| c.path == f.path))
    {
        return Err(PolicyError::invalid(
            Some("files"),
            format!(
                "file {:?}: that is where the code goes; give the file another name",
                clash.path
            ),
        ));
    }
    spec.exec.files = files;
    spec.exec.files.extend(request.files.iter().cloned());
    spec.exec.outputs = Some(profile.output_rules());
    for knob in Knob::all() {
        let value = match request.knobs.get(&knob) {
            None => profile.value(knob),
            Some(_) if !knob.requestable() => {
                return Err(PolicyError::Forbidden {
                    field: knob.key(),
                    message: format!(
                        "{knob} is set by the profile only (profile {profile_name}: {})",
                        knob.show(profile.value(knob))
                    ),
                })
            }
            Some(&asked) => {
                knob.check(asked).map_err(|e| {
                    PolicyError::invalid(Some(knob.key()), format!("{}: {e}", knob.key()))
                })?;
                let allowed = profile.max(knob);
                if asked > allowed {
                    return Err(PolicyError::AboveMax {
                        profile: profile_name.to_string(),
                        knob,
                        asked,
                        allowed,
                    });
                }
                asked
            }
        };
        spec.set(knob, value);
    }
    let network = spec.sandbox.network.clone();
    spec.sandbox.network = crate::network::NetworkSpec {
        max_bandwidth: network.max_bandwidth,
        max_connections: network.max_connections,
        connection_idle_timeout_ms: network.connection_idle_timeout_ms,
        ..profile.network_spec()
    };
    if let Some(mode) = request.network {
        if mode > profile.network.mode {
            return Err(PolicyError::Forbidden {
                field: "network",
                message: format!(
                    "network {} is looser than the profile {profile_name} allows ({}); ask for {} or less, or use a \
                     profile whose [network] allows it",
                    mode.name(),
                    profile.network.mode.name(),
                    profile.network.mode.name()
                ),
            });
        }
        spec.sandbox.network.mode = mode;
    }
    for (key, value) in spec.sandbox.network.package_env() {
        spec.set_env(&key, &value);
    }
    spec.sandbox.landlock = profile.hardening.landlock;
    spec.sandbox.seccomp = profile.hardening.seccomp;
    spec.sandbox.cgroup = profile.hardening.cgroup;
    for (key, value) in profile.env.iter().map(|(k, v)| (k.as_str(), v.as_str())) {
        spec.set_env(key, value);
    }
    for (key, value) in &request.env {
        check_env_name(key).map_err(|e| PolicyError::Forbidden {
            field: "env",
            message: format!("env {e}"),
        })?;
        spec.set_env(key, value);
    }
    spec.sandbox.rootfs =
        resolve_rootfs(request.rootfs.as_deref().unwrap_or(&profile.rootfs), data)?;
    if profile.exec.security == ExecSecurity::Allowlist {
        let allowlist = resolve_allowlist(profile, profile_name, &spec)?;
        // The language's interpreter runs the code: it must be allowed (and then, for
        // python3 or node, anything may run; see README's "Exec policy"), or allowed to
        // this run's payload alone (`interpreter = "context"`).
        if request.code.is_some() {
            if let Some(program) = spec.exec.argv.first().cloned() {
                spec.exec.exec_extra = interpreter_ruleset(profile, &spec, &allowlist, &program)
                    .map_err(|e| {
                        exec_error(profile_name, format!("the language's interpreter: {e}"))
                    })?;
            }
        }
        spec.sandbox.exec = Some(allowlist);
    }
    spec.validate().map_err(|e| PolicyError::invalid(None, e))?;
    Ok(spec)
}

/// What a language's interpreter `program` needs beyond `allowlist` to run: nothing when
/// the allowlist has it, its own ruleset (the program, its loader and libraries) under
/// `interpreter = "context"`, else an error naming both ways to allow it.
pub fn interpreter_ruleset(
    profile: &Profile,
    spec: &Spec,
    allowlist: &crate::exec_policy::ExecAllowlist,
    program: &str,
) -> Result<Option<crate::exec_policy::ExecAllowlist>, String> {
    let root = rootfs_dir(&spec.sandbox.rootfs);
    let path = payload_path(spec);
    let Err(missing) = allowlist.allows(&root, &path, program) else {
        return Ok(None);
    };
    match profile.exec.interpreter {
        crate::exec_policy::InterpreterScope::Context => {
            crate::exec_policy::resolve_interpreter(program, &root, &path)
                .map(Some)
                .map_err(|e| format!("{program} (exec.interpreter = \"context\"): {e}"))
        }
        crate::exec_policy::InterpreterScope::Listed => Err(format!(
            "{missing}; allow it to its own context only with exec.interpreter = \"context\", or to every \
             process by listing it in exec.allowed"
        )),
    }
}

/// The profile's `[exec]` allowlist resolved in the spec's image, along the payload's PATH.
fn resolve_allowlist(
    profile: &Profile,
    profile_name: &str,
    spec: &Spec,
) -> Result<crate::exec_policy::ExecAllowlist, PolicyError> {
    if profile.hardening.landlock == LandlockMode::Off {
        return Err(exec_error(
            profile_name,
            "exec.security = \"allowlist\" needs landlock, which this profile turns off".into(),
        ));
    }
    crate::exec_policy::resolve(
        &profile.exec,
        &rootfs_dir(&spec.sandbox.rootfs),
        &payload_path(spec),
    )
    .map_err(|e| exec_error(profile_name, e))
}

/// Where an exec policy's names are looked up on the host: the image's directory, or `/`
/// for the host rootfs (whose /usr the sandbox binds).
pub fn rootfs_dir(rootfs: &Rootfs) -> PathBuf {
    match rootfs {
        Rootfs::Host => PathBuf::from("/"),
        Rootfs::Dir(dir) => dir.clone(),
    }
}

/// The PATH the payload starts with.
pub fn payload_path(spec: &Spec) -> String {
    spec.exec
        .env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map_or_else(|| crate::spec::SANDBOX_PATH.to_string(), |(_, v)| v.clone())
}

/// An exec policy that does not hold in this image: the profile's error.
pub fn exec_error(profile_name: &str, message: String) -> PolicyError {
    PolicyError::invalid(Some("exec"), format!("profile {profile_name}: {message}"))
}

/// "host", an image name under `<data_dir>/rootfs`, or an absolute path. A name is resolved
/// to the image directory it points to now, so that a rebuild switching the name mid-run
/// does not change this run's root.
pub fn resolve_rootfs(value: &str, data: &DataDir) -> Result<Rootfs, PolicyError> {
    if value == "host" {
        return Ok(Rootfs::Host);
    }
    if value.contains('/') {
        let path = std::path::absolute(value)
            .map_err(|e| PolicyError::invalid(Some("rootfs"), format!("rootfs {value}: {e}")))?;
        return Ok(Rootfs::Dir(path));
    }
    let link = data.0.join("rootfs").join(value);
    match std::fs::canonicalize(&link) {
        Ok(dir) if dir.is_dir() => Ok(Rootfs::Dir(dir)),
        _ => Err(PolicyError::invalid(
            Some("rootfs"),
            format!(
                "no image named {value:?} is built (looked for {}): build it with `cargo xtask rootfs`{}, or use \
                 the host's /usr instead (rootfs = \"host\" in the profile)",
                link.display(),
                if value == "default" { String::new() } else { format!(" --recipe {value}") }
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data() -> DataDir {
        DataDir("/nonexistent/codecage-data".into())
    }

    fn err(text: &str) -> String {
        Profile::parse(text, "test.toml").unwrap_err().to_string()
    }

    #[test]
    fn every_built_in_profile_parses() {
        for (name, text) in BUILT_IN {
            let profile = Profile::parse(text, name).unwrap();
            if *name == "ci" {
                assert_eq!(profile.language.map(|l| l.name()), Some("bash"));
                continue;
            }
            assert_eq!(profile.language.map(|l| l.name()), Some(*name));
            assert_eq!(profile.value(Knob::Timeout), 30_000);
        }
    }

    /// The ci profile runs test suites: an hour at most, thousands of files, and room in
    /// /work for a copied project; a request still cannot pass its maxima.
    #[test]
    fn the_ci_profile_allows_what_test_suites_need() {
        let p = Profile::load("ci").unwrap();
        assert_eq!(p.max(Knob::Timeout), 3600 * 1000);
        assert!(p.value(Knob::Nofile) >= 4096);
        assert!(p.max(Knob::Pids) >= 2048);
        assert!(p.value(Knob::WorkSize) >= 1 << 30);
        let mut r = Request {
            argv: Some(vec!["true".into()]),
            rootfs: Some("host".into()),
            ..Request::default()
        };
        r.knobs.insert(Knob::Timeout, 3600 * 1000);
        assert!(resolve(&p, "ci", &r, &data()).is_ok());
        r.knobs.insert(Knob::Timeout, 3601 * 1000);
        assert!(matches!(
            resolve(&p, "ci", &r, &data()),
            Err(PolicyError::AboveMax { .. })
        ));
    }

    #[test]
    fn an_empty_profile_has_the_safe_defaults() {
        let p = Profile::parse("", "empty.toml").unwrap();
        assert_eq!(p.value(Knob::Memory), 256 << 20);
        assert_eq!(p.value(Knob::Cpus), 500);
        assert_eq!(p.value(Knob::OutputLimit), 1 << 20);
        assert_eq!(p.max(Knob::Timeout), 120_000);
        assert_eq!(p.max(Knob::TmpSize), 64 << 20);
        assert_eq!(p.network.mode, NetworkMode::None);
        assert_eq!(p.hardening.landlock, LandlockMode::Required);
        assert!(p.output_types.contains(&"png".to_string()));
    }

    #[test]
    fn a_profile_reads_back_from_its_own_serialization() {
        for (name, text) in BUILT_IN {
            let p = Profile::parse(text, name).unwrap();
            let again = toml::to_string(&p).unwrap();
            assert_eq!(Profile::parse(&again, name).unwrap(), p, "{again}");
        }
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
        let e = err("[filesystem]\nmax_tmp_size = \"1G\"\n");
        assert!(e.contains("max_tmp_size") && e.contains("work_size"), "{e}");
        let e = err("[limits]\ntmp_size = \"1G\"\n");
        assert!(e.contains("limits.tmp_size is not a known key"), "{e}");
    }

    #[test]
    fn wrong_types_are_errors() {
        let e = err("[limits]\npids = \"many\"\n");
        assert!(e.contains("limits.pids") && e.contains("test.toml"), "{e}");
        let e = err("[limits]\nmemory = \"12Q\"\n");
        assert!(e.contains("memory") && e.contains("256M"), "{e}");
        let e = err("[hardening]\nlandlock = \"sometimes\"\n");
        assert!(e.contains("landlock") && e.contains("best-effort"), "{e}");
        let e = err("[outputs]\ntypes = \"png\"\n");
        assert!(e.contains("outputs.types"), "{e}");
    }

    #[test]
    fn out_of_range_values_are_errors() {
        assert!(err("[limits]\ntimeout = \"5m\"\n")
            .contains("limits.timeout (300s) is above limits.max_timeout (120s)"));
        assert!(err("[limits]\nmemory = \"1M\"\n").contains("8M"));
        assert!(err("[limits]\ncpus = 0\n").contains("limits.cpus"));
        assert!(err("[limits]\npids = 0\n").contains("limits.pids"));
        assert!(err("[limits]\nmax_pids = 5000000\n").contains("4194304"));
        assert!(err("[limits]\nnofile = 1\n").contains("limits.nofile"));
        assert!(err("[network]\nmode = \"open\"\n").contains("mode"));
        assert!(err("[network]\nallowed_hosts = [\"a b\"]\n").contains("allowed_hosts"));
        assert!(err("[network]\nallowed_ranges = [\"10.0.0.0/40\"]\n").contains("allowed_ranges"));
        assert!(err("[network]\nmax_bandwidth = \"1\"\n").contains("network.max_bandwidth"));
        assert!(err("[network]\nmax_bandwith = \"1M\"\n").contains("max_connections"));
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
        r.knobs.insert(Knob::Timeout, 60_000);
        r.knobs.insert(Knob::Memory, 64 << 20);
        let spec = resolve(&p, "python", &r, &data()).unwrap();
        assert_eq!(spec.exec.timeout, std::time::Duration::from_secs(60));
        assert_eq!(spec.sandbox.limits.unwrap().memory, 64 << 20);
        assert!(spec.exec.env.contains(&("MPLBACKEND".into(), "Agg".into())));
        r.knobs.insert(Knob::Memory, 4 << 30);
        let e = resolve(&p, "python", &r, &data()).unwrap_err();
        assert!(matches!(e, PolicyError::AboveMax { .. }));
        // In words, the field by its key: a front end adds its own name for it.
        assert!(
            e.to_string().starts_with("memory 4G") && e.to_string().contains("at most 2G"),
            "{e}"
        );
        assert!(!e.to_string().contains("--"), "{e}");
        assert_eq!(e.field(), Some("memory"));
        r.knobs.remove(&Knob::Memory);
        r.knobs.insert(Knob::TmpSize, 128 << 20);
        let e = resolve(&p, "python", &r, &data()).unwrap_err();
        assert!(e.to_string().starts_with("tmp_size "), "{e}");
        assert_eq!(e.field(), Some("tmp_size"));
        r.knobs.remove(&Knob::TmpSize);
        r.knobs.insert(Knob::Nofile, 1024);
        assert!(matches!(
            resolve(&p, "python", &r, &data()),
            Err(PolicyError::Forbidden { .. })
        ));
        r.knobs.remove(&Knob::Nofile);
        r.env = vec![("PATH".into(), "/evil".into())];
        let e = resolve(&p, "python", &r, &data()).unwrap_err();
        assert!(
            matches!(e, PolicyError::Forbidden { field: "env", .. }),
            "{e}"
        );
        assert!(e.to_string().starts_with("env PATH"), "{e}");
    }

    #[test]
    fn a_missing_image_says_how_to_build_it() {
        let e = resolve_rootfs("default", &data()).unwrap_err().to_string();
        assert!(
            e.contains("cargo xtask rootfs")
                && e.contains("rootfs = \"host\"")
                && !e.contains("--rootfs"),
            "{e}"
        );
        assert_eq!(resolve_rootfs("host", &data()).unwrap(), Rootfs::Host);
    }

    #[test]
    fn unknown_profile_names_list_the_known_ones() {
        let e = Profile::load("cobol").unwrap_err().to_string();
        assert!(e.contains("python") && e.contains("bash"), "{e}");
    }
}
