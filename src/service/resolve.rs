//! What a run decides that needs none of the server's shared state, written once for the
//! service ([`super::runs`], [`super::sessions`]) and `codecage run` (src/cli/run.rs): the
//! profile a request names and where it may come from, the request resolved into a Spec
//! under it (the profile's policy errors as service error kinds), the network mode
//! against the host's config, and the audit records of a run. Errors name the request's
//! field by its key ([`Error::field`]); each front end adds its own name for it (the CLI
//! its flag).

use std::path::Path;

use codecage::network::Mode;
use codecage::profile::{self, DataDir, Profile, Request as PolicyRequest};
use codecage::runner::Lang;
use codecage::Spec;

use super::{Error, Kind};
use crate::audit::{End, Kind as AuditKind, Start};
use crate::gateway::GatewayConfig;

/// Where a request's profile may come from.
#[derive(Debug, Clone, Copy)]
pub struct ProfileSource<'a> {
    /// The installed profiles (`NAME.toml`), besides the built-in ones.
    pub dir: &'a Path,
    /// Whether a TOML file's path may be given instead of a name: the CLI, for the user
    /// running it. Never through the server (its administrator chooses what profiles
    /// exist) nor through sudo (a profile file could turn every layer off).
    pub files: bool,
}

impl ProfileSource<'_> {
    /// The installed profiles only, by name.
    pub fn installed(dir: &Path) -> ProfileSource<'_> {
        ProfileSource { dir, files: false }
    }
}

/// Whether `name` is written as a profile file's path rather than a profile's name.
pub fn is_profile_path(name: &str) -> bool {
    name.contains('/') || name.ends_with(".toml")
}

/// The profile a run asks for: the one it names, else its language's, else bash for a
/// program.
pub fn profile_name(
    asked: Option<&str>,
    lang: Option<Lang>,
    program: bool,
) -> Result<String, Error> {
    match (asked, lang) {
        (Some(name), _) => Ok(name.to_string()),
        (None, Some(lang)) => Ok(lang.name().to_string()),
        (None, None) if program => Ok("bash".to_string()),
        (None, None) => Err(Error::invalid(
            "cannot tell the language of the code: name python, node, typescript or bash (or a profile, or a \
             program to run)",
        )
        .on("language")),
    }
}

/// The profile `name`, from `source`: a name of an installed or built-in profile, or a
/// file's path where the source allows files.
pub fn load_profile(name: &str, source: ProfileSource<'_>) -> Result<Profile, Error> {
    if name.is_empty() || (is_profile_path(name) && !source.files) {
        return Err(Error::invalid(format!(
            "{name:?} is not a profile name; the profiles are {}",
            profile::names_in(source.dir).join(", ")
        ))
        .on("profile"));
    }
    let invalid = |e: profile::ProfileError| Error::invalid(e.to_string()).on("profile");
    let (text, source_name) = Profile::text_in(name, source.dir).map_err(invalid)?;
    parsed(&text, &source_name).map_err(invalid)
}

/// The profile `text` parsed, from the last parse of the same source if its text is the
/// same: every request reads its profile's file (an edit counts from the next request), and
/// parsing it again each time was 2-3 % of the server's CPU in a burst of sessions.
fn parsed(text: &str, source_name: &str) -> Result<Profile, profile::ProfileError> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    /// Per source name, its last text and what it parsed into. Only sources that exist and
    /// parse get in: the installed profiles, the built-in ones and files a caller may name.
    static LAST: OnceLock<Mutex<HashMap<String, (String, Profile)>>> = OnceLock::new();
    let last = LAST.get_or_init(Default::default);
    if let Some((seen, profile)) = last.lock().ok().as_ref().and_then(|m| m.get(source_name)) {
        if seen == text {
            return Ok(profile.clone());
        }
    }
    let profile = Profile::parse(text, source_name)?;
    if let Ok(mut map) = last.lock() {
        map.insert(source_name.to_string(), (text.to_string(), profile.clone()));
    }
    Ok(profile)
}

/// A run's request resolved under its profile into a Spec, whose network mode the host
/// allows: the profile's refusals as `policy` (what it does not allow) or
/// `invalid_request`, a mode the host's config does not enable as `policy`.
pub fn resolve_run(
    profile: &Profile,
    name: &str,
    request: &PolicyRequest,
    data: &DataDir,
    network: &GatewayConfig,
) -> Result<Spec, Error> {
    if profile.exec.security == codecage::exec_policy::ExecSecurity::Deny {
        let what = match (&request.argv, request.lang.or(profile.language)) {
            (Some(_), _) => Some("a run of a program"),
            (None, Some(Lang::Bash)) => Some("a run of bash code"),
            _ => None,
        };
        if let Some(what) = what {
            return Err(
                Error::new(Kind::Policy, codecage::exec_policy::denied(name, what)).on("exec"),
            );
        }
    }
    let spec = profile::resolve(profile, name, request, data)?;
    network_allowed(network, spec.sandbox.network.mode)?;
    Ok(spec)
}

/// Network mode `full` only where the host's config enables it (the server's, or
/// /etc/codecage/config.toml for the CLI): `policy` otherwise.
pub fn network_allowed(network: &GatewayConfig, mode: Mode) -> Result<(), Error> {
    crate::gateway::Gateway::check_mode(network, mode)
        .map_err(|m| Error::new(Kind::Policy, m).on("network"))
}

/// What the audit knows of a run as it starts: what it was asked to run, how, by whom.
pub fn run_start(
    via: crate::audit::Via,
    caller: String,
    language: Option<Lang>,
    profile: Option<String>,
) -> Start {
    let mut start = Start::new(AuditKind::Run, via, caller);
    start.language = language.map(|l| l.name().to_string());
    start.profile = profile;
    start
}

/// The record of an execution about to start under `spec`: its input files (names, sizes,
/// sha256), limits and layers.
pub fn starting(start: Start, spec: &Spec) -> Start {
    start
        .input_files(&spec.exec.files)
        .spec(&spec.sandbox, Some(&spec.exec))
}

/// The record of a refused request: what it asked (`start`), kind `refused`, and the
/// error; `details.request` says what kind of request it was.
pub fn refusal(mut start: Start, error: &Error) -> (Start, End) {
    let end = End::error(error.kind(), &error.message).details(serde_json::json!({
        "request": start.kind.name(),
    }));
    start.kind = AuditKind::Refused;
    (start, end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profile_is_the_named_one_else_the_language_else_bash_for_a_program() {
        assert_eq!(
            profile_name(Some("ci"), Some(Lang::Python), false).unwrap(),
            "ci"
        );
        assert_eq!(profile_name(None, Some(Lang::Node), false).unwrap(), "node");
        assert_eq!(profile_name(None, None, true).unwrap(), "bash");
        let e = profile_name(None, None, false).unwrap_err();
        assert_eq!((e.kind, e.field), (Kind::InvalidRequest, Some("language")));
        assert!(!e.message.contains("--"), "{e}");
    }

    #[test]
    fn a_path_is_a_profile_only_where_the_source_allows_files() {
        let dir = std::env::temp_dir().join(format!("codecage-resolve-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("tight.toml");
        std::fs::write(&file, "language = \"bash\"\n").unwrap();
        let path = file.to_str().unwrap();
        let e = load_profile(path, ProfileSource::installed(&dir)).unwrap_err();
        assert_eq!((e.kind, e.field), (Kind::InvalidRequest, Some("profile")));
        assert!(
            e.message.contains("is not a profile name") && e.message.contains("python"),
            "{e}"
        );
        let local = ProfileSource {
            dir: &dir,
            files: true,
        };
        assert!(load_profile(path, local).is_ok());
        assert!(load_profile("python", ProfileSource::installed(&dir)).is_ok());
        let e = load_profile("cobol", local).unwrap_err();
        assert!(
            e.message.contains("no such profile") && !e.message.contains("--"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A profile parsed once is given again while its file is unchanged; an edit counts
    /// from the next load, and a broken edit is refused, not hidden by the last good parse.
    #[test]
    fn an_installed_profile_edited_counts_from_the_next_load() {
        let dir = std::env::temp_dir().join(format!("codecage-parsed-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let installed = ProfileSource::installed(&dir);
        let file = dir.join("edited.toml");
        std::fs::write(&file, "language = \"bash\"\n").unwrap();
        let first = load_profile("edited", installed).unwrap();
        assert_eq!(load_profile("edited", installed).unwrap(), first);
        assert_eq!(first.language, Some(Lang::Bash));
        std::fs::write(&file, "language = \"python\"\n").unwrap();
        assert_eq!(
            load_profile("edited", installed).unwrap().language,
            Some(Lang::Python)
        );
        std::fs::write(&file, "language = \"cobol\"\n").unwrap();
        let e = load_profile("edited", installed).unwrap_err();
        assert_eq!((e.kind, e.field), (Kind::InvalidRequest, Some("profile")));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn policy_errors_keep_their_kind_and_field() {
        let profile = Profile::load("python").unwrap();
        let mut request = PolicyRequest {
            code: Some("1".into()),
            rootfs: Some("host".into()),
            ..PolicyRequest::default()
        };
        let data = DataDir("/nonexistent".into());
        let network = GatewayConfig::default();
        request
            .knobs
            .insert(codecage::knobs::Knob::Memory, 64 << 30);
        let e = resolve_run(&profile, "python", &request, &data, &network).unwrap_err();
        assert_eq!((e.kind, e.field), (Kind::Policy, Some("memory")));
        request.knobs.clear();
        request.network = Some(Mode::Full);
        let e = resolve_run(&profile, "python", &request, &data, &network).unwrap_err();
        assert_eq!((e.kind, e.field), (Kind::Policy, Some("network")));
    }

    #[test]
    fn a_deny_profile_refuses_bash_and_programs_as_policy() {
        let mut profile = Profile::load("python").unwrap();
        profile.exec.security = codecage::exec_policy::ExecSecurity::Deny;
        let data = DataDir("/nonexistent".into());
        let network = GatewayConfig::default();
        for request in [
            PolicyRequest {
                code: Some("ls".into()),
                lang: Some(Lang::Bash),
                rootfs: Some("host".into()),
                ..PolicyRequest::default()
            },
            PolicyRequest {
                argv: Some(vec!["ls".into()]),
                rootfs: Some("host".into()),
                ..PolicyRequest::default()
            },
        ] {
            let e = resolve_run(&profile, "p", &request, &data, &network).unwrap_err();
            assert_eq!((e.kind, e.field), (Kind::Policy, Some("exec")), "{e}");
            assert!(e.message.contains("deny"), "{e}");
        }
        let python = PolicyRequest {
            code: Some("1".into()),
            rootfs: Some("host".into()),
            ..PolicyRequest::default()
        };
        assert!(resolve_run(&profile, "p", &python, &data, &network).is_ok());
    }

    #[test]
    fn a_refusal_is_recorded_as_refused_with_its_request_kind() {
        let start = run_start(
            crate::audit::Via::Cli,
            "uid:0".into(),
            Some(Lang::Bash),
            None,
        );
        let (start, end) = refusal(start, &Error::new(Kind::Policy, "no"));
        assert_eq!(start.kind.name(), "refused");
        assert_eq!(end.details["request"], "run");
    }
}
