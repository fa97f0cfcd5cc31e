//! A record as it is read back (`codecage audit`, `GET /v1/audit`), and the filters.

use serde::Serialize;
use serde_json::Value;

/// One audit record. Times are RFC 3339 (UTC); `code`, `argv`, `stdout` and `stderr` are
/// null when the operator's `log_code` / `log_output` were off (their sha256 and size are
/// kept), and in lists.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[cfg_attr(feature = "openapi", schema(as = AuditRecord))]
pub struct Record {
    pub id: String,
    /// `run`, `call` (in a session), `session` (its life), `reset`, or `refused`.
    pub kind: String,
    /// `running`, `complete`, or `incomplete` (the process recording it died first).
    pub status: String,
    pub started_at: String,
    pub ended_at: Option<String>,
    /// The front end: `api`, `mcp` or `cli`.
    pub via: String,
    /// `token:NAME`, `uid:N` (a unix socket peer, or the CLI's user), or `unauthenticated`.
    pub caller: String,
    pub profile: Option<String>,
    pub language: Option<String>,
    pub session: Option<String>,
    pub code_sha256: Option<String>,
    pub code_size: Option<u64>,
    pub code: Option<String>,
    pub argv: Option<Vec<String>>,
    pub stdin_sha256: Option<String>,
    pub stdin_size: Option<u64>,
    pub exit_code: Option<i64>,
    pub signal: Option<i64>,
    /// The error kind: a run's (`timeout`, `oom`, ...), or a refusal's (`policy`,
    /// `invalid_request`, `unauthorized`, ...).
    pub error: Option<String>,
    pub message: Option<String>,
    pub duration_ms: Option<f64>,
    pub cpu_ms: Option<f64>,
    pub peak_memory_bytes: Option<u64>,
    /// The limits it ran under.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub limits: Option<Value>,
    /// Which were hit: `timeout`, `output`, `memory`, `pids`.
    pub limits_hit: Vec<String>,
    /// The hardening asked for, and the landlock ABI applied.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub layers: Option<Value>,
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Vec<codecage::outcome::Skipped>>))]
    pub skipped_layers: Option<Value>,
    /// `{path, size, sha256}` each.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<InputFileDigest>))]
    pub input_files: Value,
    /// `{path, size, media_type, sha256}` each (without `data`).
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<codecage::files::OutputFile>))]
    pub output_files: Value,
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<codecage::files::SkippedFile>))]
    pub files_skipped: Value,
    /// The network gateway's verdicts, as in a run's result.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<codecage::network::Connection>))]
    pub network: Value,
    pub stdout: Option<String>,
    /// `utf-8` or `base64`.
    pub stdout_encoding: Option<String>,
    pub stdout_size: Option<u64>,
    pub stdout_sha256: Option<String>,
    /// The kept stdout is cut at the audit's `output_cap`.
    pub stdout_cut: bool,
    pub stderr: Option<String>,
    pub stderr_encoding: Option<String>,
    pub stderr_size: Option<u64>,
    pub stderr_sha256: Option<String>,
    pub stderr_cut: bool,
    /// What else is known: the endpoint and HTTP status of a refusal, a call's execution
    /// count, exception and state.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub details: Value,
    /// The process that wrote it: `BOOT:PIDNS:PID:START`.
    pub writer: String,
}

/// An input file as the audit keeps it: its digest, not its bytes.
#[cfg(feature = "openapi")]
#[derive(utoipa::ToSchema)]
#[schema(as = AuditInputFile)]
#[allow(dead_code)]
struct InputFileDigest {
    /// Relative to /work.
    path: String,
    size: u64,
    sha256: String,
}

/// Which records: every field narrows.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// Started at or after (Unix ms).
    pub since: Option<i64>,
    /// Started before (Unix ms).
    pub until: Option<i64>,
    pub profile: Option<String>,
    /// An error kind; `none` for records without one.
    pub error: Option<String>,
    pub session: Option<String>,
    pub kind: Option<String>,
    pub caller: Option<String>,
    pub status: Option<String>,
    /// At most this many (newest first); None: all (oldest first, for export).
    pub limit: Option<u64>,
}
