//! `Outcome`: what one run did, the same through every front end.

use std::time::Duration;

use serde::{Deserialize, Serialize, Serializer};

/// Why a run did not simply finish. Agents branch on this; `message` says what to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The wall-clock limit passed; the whole sandbox was killed.
    Timeout,
    /// stdout plus stderr passed the output limit; the sandbox was stopped there.
    OutputLimit,
    /// The kernel's OOM killer killed a process of the sandbox: it hit the memory limit.
    Oom,
    /// The sandbox could not be built (or the launcher failed); the payload never ran.
    Setup,
    /// The request was malformed: a bad flag value, a missing argument.
    InvalidRequest,
    /// The request asked for more than its profile allows.
    Policy,
    /// A session's cell raised an exception (the session goes on).
    Exception,
    /// A session's call was interrupted by request.
    Interrupted,
    /// A session's interpreter, or its whole sandbox, ended during the call.
    SessionLost,
}

impl ErrorKind {
    /// The CLI exit status for this kind (`timeout(1)` and `docker run` conventions).
    pub fn exit_status(self) -> i32 {
        match self {
            ErrorKind::Timeout => 124,
            ErrorKind::Setup | ErrorKind::InvalidRequest | ErrorKind::Policy => 125,
            // The sandbox, or a process of it, was killed with SIGKILL.
            ErrorKind::OutputLimit | ErrorKind::Oom => 128 + libc::SIGKILL,
            ErrorKind::Exception => 1,
            ErrorKind::Interrupted => 128 + libc::SIGINT,
            ErrorKind::SessionLost => 125,
        }
    }
}

/// The result of one run. Partial output is always kept.
///
/// In JSON, `stdout` and `stderr` are text when the bytes are UTF-8 that JSON carries
/// without blowing up (`stdout_encoding: "utf-8"`), else base64 of the exact bytes
/// (`"base64"`): output is never altered, and the JSON stays within twice the output limit
/// plus a constant.
#[derive(Debug, Clone, Default, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Outcome {
    /// What the payload wrote to stdout, up to the output limit.
    #[serde(flatten, serialize_with = "stdout_fields")]
    #[cfg_attr(feature = "openapi", schema(value_type = StdoutFields, inline))]
    pub stdout: Vec<u8>,
    /// What the payload wrote to stderr, up to the output limit.
    #[serde(flatten, serialize_with = "stderr_fields")]
    #[cfg_attr(feature = "openapi", schema(value_type = StderrFields, inline))]
    pub stderr: Vec<u8>,
    /// The payload's exit status, when it exited by itself.
    pub exit_code: Option<i32>,
    /// The signal that ended the payload, when one did.
    pub signal: Option<i32>,
    /// Why the run did not simply finish, if it did not.
    pub error: Option<ErrorKind>,
    /// What happened and what to do, for a human or an agent; set with `error`.
    pub message: Option<String>,
    /// Output was cut at the output limit.
    pub truncated: bool,
    /// Wall time from launch to the end of the last sandbox process (for a pooled run, the
    /// last but its init, which exits after the answer).
    #[serde(rename = "duration_ms", serialize_with = "millis")]
    #[cfg_attr(feature = "openapi", schema(value_type = f64))]
    pub duration: Duration,
    /// CPU time (user + system) of every process of the sandbox (for a pooled run, up to
    /// the end of the code's processes: the init's exit after the answer is not counted).
    #[serde(rename = "cpu_ms", serialize_with = "millis")]
    #[cfg_attr(feature = "openapi", schema(value_type = f64))]
    pub cpu: Duration,
    /// Peak memory of the whole sandbox, in bytes (processes and the tmpfs pages they wrote).
    pub peak_memory_bytes: Option<u64>,
    /// A fork or thread creation failed because the sandbox reached its process limit.
    pub pids_limit_hit: bool,
    /// Processes of the sandbox the kernel's OOM killer killed. The run's `error` is `oom`
    /// only when that is what ended it.
    pub oom_kills: u64,
    /// The kernel's landlock ABI the payload was restricted with.
    pub landlock_abi: Option<u32>,
    /// Hardening that was not applied (the host lacks it, or the profile turned it off),
    /// each with what covers for it, if anything.
    pub skipped_layers: Vec<Skipped>,
    /// The network connections (and DNS questions) of the run through the gateway, allowed
    /// and denied, by destination: `{protocol, host, port, verdict, reason, count,
    /// bytes_out, bytes_in}`. Empty in network mode `none`.
    pub network: Vec<crate::network::Connection>,
    /// Output files taken back from the output directory.
    pub files: Vec<crate::files::OutputFile>,
    /// Files of the output directory not taken, and why.
    pub files_skipped: Vec<crate::files::SkippedFile>,
    /// Served by a sandbox built before the request (a server's warm pool); false: the
    /// sandbox was started for it.
    pub warm: bool,
    /// The result rendered for a chat channel, when the request asked for one (`format`:
    /// see [`crate::format`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub formatted: Option<crate::format::Formatted>,
    /// The init died without a word (killed from outside the sandbox's code): the launcher
    /// decides with the cgroup's counters whether the OOM killer did it.
    #[serde(skip)]
    pub(crate) init_lost: bool,
    /// Where the wall time went (`codecage run --timings`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub phases: Option<Phases>,
}

/// How `Outcome.stdout` is carried in JSON (its OpenAPI schema).
#[cfg(feature = "openapi")]
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
struct StdoutFields {
    /// What the payload wrote to stdout, up to the output limit: text, or base64 of the
    /// bytes (`stdout_encoding`).
    stdout: String,
    stdout_encoding: Encoding,
}

/// How `Outcome.stderr` is carried in JSON (its OpenAPI schema).
#[cfg(feature = "openapi")]
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
struct StderrFields {
    /// What the payload wrote to stderr, up to the output limit: text, or base64 of the
    /// bytes (`stderr_encoding`).
    stderr: String,
    stderr_encoding: Encoding,
}

/// A piece of hardening that was not applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Skipped {
    /// `landlock`, `seccomp` or `cgroup`.
    pub layer: String,
    /// What of the layer: "TCP bind and connect rules (landlock ABI 4, Linux 6.7)",
    /// "pids limit", "the whole layer".
    pub feature: String,
    /// Why: "this kernel has landlock ABI 2", "turned off by the profile", an error.
    pub reason: String,
    /// The layer that still enforces what this feature would have, if any.
    pub covered_by: Option<String>,
}

impl Skipped {
    pub fn new(layer: &str, feature: impl Into<String>, reason: impl Into<String>) -> Skipped {
        Skipped {
            layer: layer.to_string(),
            feature: feature.into(),
            reason: reason.into(),
            covered_by: None,
        }
    }

    pub fn covered_by(mut self, layer: impl Into<String>) -> Skipped {
        self.covered_by = Some(layer.into());
        self
    }
}

impl std::fmt::Display for Skipped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.layer, self.feature, self.reason)?;
        if let Some(cover) = &self.covered_by {
            write!(f, " (covered by {cover})")?;
        }
        Ok(())
    }
}

/// The run's wall time by phase, in milliseconds. A phase the run did not reach is null.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Phases {
    /// Validation, fds, the cgroup clone3 puts the init in (v2: with the limits): until
    /// clone3.
    pub prepare_ms: Option<f64>,
    /// clone3; while the child makes its network namespace, the v1 cgroups, the tmpfs file
    /// systems, cgroup attach, id maps; "go".
    pub clone_ms: Option<f64>,
    /// The rest of the child's network namespace, its v1 cgroups, the exec of codecage as
    /// the sandbox's init.
    pub init_exec_ms: Option<f64>,
    /// cgroup namespace, mounts, pivot_root, host name, loopback.
    pub sandbox_ms: Option<f64>,
    /// Fork, capabilities, ids, landlock, seccomp: until the payload's execve.
    pub payload_setup_ms: Option<f64>,
    /// The payload itself, from its execve to its exit.
    pub run_ms: Option<f64>,
    /// Killing what is left, the init's exit, the namespaces' teardown, the reap.
    pub teardown_ms: Option<f64>,
    /// Reading and removing the cgroup.
    pub cleanup_ms: Option<f64>,
}

impl Outcome {
    /// An outcome for a run that failed before or during setup.
    pub fn failed(kind: ErrorKind, message: impl Into<String>) -> Outcome {
        Outcome {
            error: Some(kind),
            message: Some(message.into()),
            ..Outcome::default()
        }
    }

    /// The exit status `codecage run` ends with: the payload's own, 124 on timeout, 125 when
    /// the sandbox could not be built, 128+N when a signal N ended it.
    pub fn exit_status(&self) -> i32 {
        if let Some(kind) = self.error {
            return kind.exit_status();
        }
        match (self.exit_code, self.signal) {
            (Some(code), _) => code,
            (None, Some(signal)) => 128 + signal,
            (None, None) => ErrorKind::Setup.exit_status(),
        }
    }
}

/// How a stream's bytes are carried in JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Encoding {
    #[serde(rename = "utf-8")]
    Utf8,
    #[serde(rename = "base64")]
    Base64,
}

/// Text when the bytes are UTF-8 whose JSON escaping at most doubles them (control
/// characters cost 6 bytes each in JSON; colours and tabs in ordinary output stay well
/// below), else base64.
pub fn encode_stream(bytes: &[u8]) -> (Encoding, String) {
    use base64::Engine as _;
    if let Ok(text) = std::str::from_utf8(bytes) {
        let escaped: usize = text
            .bytes()
            .map(|b| match b {
                b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
                0..=0x1f => 6,
                _ => 1,
            })
            .sum();
        if escaped <= 2 * bytes.len() {
            return (Encoding::Utf8, text.to_string());
        }
    }
    (
        Encoding::Base64,
        base64::engine::general_purpose::STANDARD.encode(bytes),
    )
}

fn stream_fields<S: Serializer>(name: &str, bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let (encoding, value) = encode_stream(bytes);
    let mut map = s.serialize_map(Some(2))?;
    map.serialize_entry(name, &value)?;
    map.serialize_entry(&format!("{name}_encoding"), &encoding)?;
    map.end()
}

fn stdout_fields<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
    stream_fields("stdout", bytes, s)
}

fn stderr_fields<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
    stream_fields("stderr", bytes, s)
}

fn millis<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64((d.as_secs_f64() * 1e6).round() / 1e3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_has_the_documented_fields() {
        let outcome = Outcome {
            stdout: b"hi\n".to_vec(),
            exit_code: Some(0),
            duration: Duration::from_micros(12_500),
            ..Outcome::default()
        };
        let json: serde_json::Value = serde_json::to_value(&outcome).unwrap();
        for key in [
            "stdout",
            "stderr",
            "exit_code",
            "signal",
            "error",
            "message",
            "truncated",
            "duration_ms",
            "cpu_ms",
            "peak_memory_bytes",
        ] {
            assert!(json.get(key).is_some(), "missing {key}");
        }
        assert_eq!(json["duration_ms"], 12.5);
        assert_eq!(json["stdout"], "hi\n");
        assert_eq!(json["stdout_encoding"], "utf-8");
        assert_eq!(json["stderr_encoding"], "utf-8");
    }

    #[test]
    fn output_that_is_not_text_is_carried_exactly_and_the_json_stays_bounded() {
        use base64::Engine as _;
        let binary = vec![0xffu8, 0xfe, 0x00, 0x41];
        assert_eq!(encode_stream(&binary).0, Encoding::Base64);
        let nuls = vec![0u8; 1 << 20];
        let outcome = Outcome {
            stdout: nuls.clone(),
            stderr: binary.clone(),
            ..Outcome::default()
        };
        let text = serde_json::to_string(&outcome).unwrap();
        assert!(text.len() < (1 << 20) * 4 / 3 + 1024, "{}", text.len());
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(json["stdout_encoding"], "base64");
        let back = base64::engine::general_purpose::STANDARD
            .decode(json["stdout"].as_str().unwrap())
            .unwrap();
        assert_eq!(back, nuls);
        // Ordinary text with colours and tabs stays text.
        assert_eq!(
            encode_stream("\x1b[1mbold\x1b[0m\tok\n".repeat(10).as_bytes()).0,
            Encoding::Utf8
        );
    }

    #[test]
    fn exit_status_follows_timeout_and_docker_conventions() {
        assert_eq!(
            Outcome {
                exit_code: Some(3),
                ..Outcome::default()
            }
            .exit_status(),
            3
        );
        assert_eq!(
            Outcome {
                signal: Some(15),
                ..Outcome::default()
            }
            .exit_status(),
            143
        );
        assert_eq!(Outcome::failed(ErrorKind::Timeout, "").exit_status(), 124);
        assert_eq!(Outcome::failed(ErrorKind::Setup, "").exit_status(), 125);
        assert_eq!(
            serde_json::to_value(ErrorKind::OutputLimit).unwrap(),
            "output_limit"
        );
    }
}
