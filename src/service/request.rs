//! The service's request types: what every front end builds (the HTTP API parses them
//! from JSON, MCP from its tools' arguments).

use std::collections::BTreeMap;

use serde::Deserialize;

use codecage::knobs::Raw;
use codecage::runner::Lang;

/// `POST /v1/run`.
#[derive(Debug, Deserialize)]
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
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub network: Option<codecage::network::Mode>,
    /// Files placed in /work before the code runs: `{"path": "data/in.csv", "data":
    /// BASE64}` (within the profile's inputs caps).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<Object>))]
    pub files: Vec<codecage::files::InputFile>,
    /// Whether the output files come back with their bytes (default) or by name only.
    pub file_data: Option<bool>,
    /// Host directories under /work, as `codecage run -v` takes them:
    /// `HOST_DIR:/work/DIR[:ro|:copy]` (read-only by default, or copied into /work within
    /// `work_size`); only under the server's `volume_roots`.
    #[serde(default)]
    pub volumes: Vec<String>,
    /// The limits, as in the profile: timeout, memory, cpus, pids, output_limit,
    /// tmp_size, work_size (a number, or a string with a unit: "30s", "256M").
    #[serde(flatten)]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub limits: BTreeMap<String, serde_json::Value>,
}

/// `POST /v1/sessions`.
#[derive(Debug, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SessionRequest {
    /// python, node, typescript or bash.
    pub language: Lang,
    /// A profile by name (default: the language's).
    pub profile: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The network mode, as in `POST /v1/run`.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub network: Option<codecage::network::Mode>,
    /// The limits, as in `POST /v1/run`; `timeout` and `output_limit` are each call's.
    #[serde(flatten)]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub limits: BTreeMap<String, serde_json::Value>,
}

/// `POST /v1/sessions/{id}/execute`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ExecuteRequest {
    pub code: String,
    /// Files placed in /work before the call, as in `POST /v1/run`.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<Object>))]
    pub files: Vec<codecage::files::InputFile>,
    /// Whether the call's output files come back with their bytes (default) or by name.
    pub file_data: Option<bool>,
    /// This call's time limit (default: the session's), e.g. "10s".
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub timeout: Option<Raw>,
    /// Text the cell reads on stdin.
    pub stdin: Option<String>,
}
