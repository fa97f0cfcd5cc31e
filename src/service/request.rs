//! The service's request types: what every front end builds (the HTTP API parses them
//! from JSON, MCP from its tools' arguments).

use std::collections::BTreeMap;

use serde::Deserialize;

use codecage::knobs::Raw;
use codecage::runner::Lang;

/// `POST /v1/run`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunRequest {
    /// python, node, typescript or bash: how `code` runs (default: the profile's).
    pub language: Option<Lang>,
    /// Code to run, in `language`.
    pub code: Option<String>,
    /// A program and its arguments, instead of code.
    pub argv: Option<Vec<String>>,
    /// A profile by name (default: the language's, or bash).
    pub profile: Option<String>,
    /// What the program reads on stdin.
    pub stdin: Option<String>,
    /// Environment variables to add (not PATH or LD_*).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The network mode: none, restricted or full, no looser than the profile's.
    pub network: Option<codecage::network::Mode>,
    /// Files placed in /work before the code runs: `{"path": "data/in.csv", "data":
    /// BASE64}` (within the profile's inputs caps).
    #[serde(default)]
    pub files: Vec<codecage::files::InputFile>,
    /// Whether the output files come back with their bytes (default) or by name only.
    pub file_data: Option<bool>,
    /// The result rendered for a chat channel as well (`formatted` in the answer): a
    /// channel's name (discord, telegram, slack, whatsapp, markdown, plain) or `{channel,
    /// max_messages, language, max_chars}`.
    pub format: Option<codecage::format::FormatRequest>,
    /// Host directories under /work, as `codecage run -v` takes them:
    /// `HOST_DIR:/work/DIR[:ro|:copy]` (read-only by default, or copied into /work within
    /// `work_size`); only under the server's `volume_roots`.
    #[serde(default)]
    pub volumes: Vec<String>,
    // The limits, as in the profile (a number, or a string with a unit: "30s", "256M"):
    // fields of their own, so the body is read in one pass (no flattened map).
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub timeout: Option<Raw>,
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub memory: Option<Raw>,
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub cpus: Option<Raw>,
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub pids: Option<Raw>,
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub output_limit: Option<Raw>,
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub tmp_size: Option<Raw>,
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub work_size: Option<Raw>,
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub max_bandwidth: Option<Raw>,
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub max_connections: Option<Raw>,
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub connection_idle_timeout: Option<Raw>,
}

/// `POST /v1/sessions`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SessionRequest {
    /// python, node, typescript or bash.
    pub language: Lang,
    /// A profile by name (default: the language's).
    pub profile: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The network mode, as in `POST /v1/run`.
    pub network: Option<codecage::network::Mode>,
    // The limits, as in `POST /v1/run`; `timeout` and `output_limit` are each call's.
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub timeout: Option<Raw>,
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub memory: Option<Raw>,
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub cpus: Option<Raw>,
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub pids: Option<Raw>,
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub output_limit: Option<Raw>,
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub tmp_size: Option<Raw>,
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub work_size: Option<Raw>,
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub max_bandwidth: Option<Raw>,
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub max_connections: Option<Raw>,
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub connection_idle_timeout: Option<Raw>,
    /// The route the client sent in the cluster's route header (HTTP's front end fills it
    /// in; not a body field).
    #[serde(skip)]
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub route: Option<String>,
}

/// `POST /v1/sessions/{id}/execute`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ExecuteRequest {
    pub code: String,
    /// The context to run in: python, node, typescript (the Node context) or bash; the
    /// session's own language if absent. Each is made on first use, in the same sandbox.
    pub language: Option<String>,
    /// Files placed in /work before the call, as in `POST /v1/run`.
    #[serde(default)]
    pub files: Vec<codecage::files::InputFile>,
    /// Whether the call's output files come back with their bytes (default) or by name.
    pub file_data: Option<bool>,
    // This call's time limit (default: the session's): its schema is the knob table's.
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub timeout: Option<Raw>,
    /// Text the cell reads on stdin.
    pub stdin: Option<String>,
    /// The result rendered for a chat channel as well, as in `POST /v1/run`.
    pub format: Option<codecage::format::FormatRequest>,
}

impl SessionRequest {
    /// A session of `language` with the profile's defaults.
    pub fn new(language: Lang) -> SessionRequest {
        SessionRequest {
            language,
            profile: None,
            env: BTreeMap::new(),
            network: None,
            timeout: None,
            memory: None,
            cpus: None,
            pids: None,
            output_limit: None,
            tmp_size: None,
            work_size: None,
            max_bandwidth: None,
            max_connections: None,
            connection_idle_timeout: None,
            route: None,
        }
    }
}

/// The limit fields a request has, by their keys.
macro_rules! limits_of {
    ($t:ty) => {
        impl $t {
            /// The limits asked for, by key (the knobs' keys).
            pub fn limits(&self) -> Vec<(&'static str, &Raw)> {
                [
                    ("timeout", &self.timeout),
                    ("memory", &self.memory),
                    ("cpus", &self.cpus),
                    ("pids", &self.pids),
                    ("output_limit", &self.output_limit),
                    ("tmp_size", &self.tmp_size),
                    ("work_size", &self.work_size),
                    ("max_bandwidth", &self.max_bandwidth),
                    ("max_connections", &self.max_connections),
                    ("connection_idle_timeout", &self.connection_idle_timeout),
                ]
                .into_iter()
                .filter_map(|(key, value)| value.as_ref().map(|v| (key, v)))
                .collect()
            }
        }
    };
}
limits_of!(RunRequest);
limits_of!(SessionRequest);

/// The keys of the limit fields, for the test below.
#[cfg(test)]
pub const LIMIT_KEYS: &[&str] = &[
    "timeout",
    "memory",
    "cpus",
    "pids",
    "output_limit",
    "tmp_size",
    "work_size",
    "max_bandwidth",
    "max_connections",
    "connection_idle_timeout",
];

#[cfg(test)]
mod tests {
    use super::*;
    use codecage::knobs::Knob;

    #[test]
    fn the_limit_fields_are_the_requestable_knobs() {
        let mut requestable: Vec<&str> = Knob::all()
            .filter(|k| k.requestable())
            .map(|k| k.key())
            .collect();
        requestable.sort();
        let mut fields = LIMIT_KEYS.to_vec();
        fields.sort();
        assert_eq!(requestable, fields);
    }

    #[test]
    fn a_request_is_read_in_one_pass_and_unknown_fields_are_refused() {
        let r: RunRequest = serde_json::from_str(
            r#"{"language": "python", "code": "1", "memory": "128M", "timeout": 5}"#,
        )
        .unwrap();
        assert_eq!(
            r.limits(),
            vec![
                ("timeout", &Raw::Int(5)),
                ("memory", &Raw::Text("128M".into()))
            ]
        );
        let e = serde_json::from_str::<RunRequest>(r#"{"colour": 1}"#).unwrap_err();
        assert!(e.to_string().contains("unknown field `colour`"), "{e}");
    }
}
