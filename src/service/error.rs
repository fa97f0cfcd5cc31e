//! The service's one error: a kind a program branches on, a message in words (never a
//! front end's flags or status codes), and how long to wait before trying again. Front
//! ends only translate it: HTTP maps the kind to a status code, MCP to `isError`, the CLI
//! to an exit status.

use codecage::profile::PolicyError;

/// What went wrong, for a program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The request is malformed; the message names the field.
    InvalidRequest,
    /// No caller could be established (no or a bad token).
    Unauthorized,
    /// The profile or the server's policy does not allow what was asked.
    Policy,
    /// The caller's role does not allow it (the audit API without the admin role).
    Forbidden,
    /// No such session (or not the caller's: its existence is not revealed), endpoint or
    /// record.
    NotFound,
    /// The session ended (idle or maximum lifetime).
    SessionExpired,
    /// The session is running a call.
    Busy,
    /// What a file operation would create or replace exists already.
    Exists,
    /// The request body is over the server's limit.
    PayloadTooLarge,
    /// The caller is past one of its own quotas (sessions, concurrent runs).
    Quota,
    /// The server is at its own capacity.
    Capacity,
    /// The audit log cannot take the request's record (`on_full = "refuse"`).
    AuditUnavailable,
    /// The sandbox could not be built, or the server failed.
    Setup,
    /// The session's sandbox is gone.
    SessionLost,
    /// The audit database could not be read.
    Audit,
    /// Not an error: the command waits for a person's approval (`[exec] ask`); the
    /// answer is the pending approval (HTTP 202).
    ApprovalPending,
}

impl Kind {
    /// The wire name (`error` in HTTP bodies, MCP results, the audit log).
    pub fn name(self) -> &'static str {
        match self {
            Kind::InvalidRequest => "invalid_request",
            Kind::Unauthorized => "unauthorized",
            Kind::Policy => "policy",
            Kind::Forbidden => "forbidden",
            Kind::NotFound => "not_found",
            Kind::SessionExpired => "session_expired",
            Kind::Busy => "busy",
            Kind::Exists => "exists",
            Kind::PayloadTooLarge => "payload_too_large",
            Kind::Quota => "quota",
            Kind::Capacity => "capacity",
            Kind::AuditUnavailable => "audit_unavailable",
            Kind::Setup => "setup",
            Kind::SessionLost => "session_lost",
            Kind::Audit => "audit",
            Kind::ApprovalPending => "approval_pending",
        }
    }
}

/// A request the service refused or could not serve.
#[derive(Debug, Clone)]
pub struct Error {
    pub kind: Kind,
    pub message: String,
    /// Seconds to wait before trying again (capacity, quota, the audit's refusal).
    pub retry_after: Option<u64>,
    /// The request's field it is about, by its key (`memory`, `profile`, `network`), if
    /// one: the message says it in words; a front end may add its own name for it (the
    /// CLI its flag).
    pub field: Option<&'static str>,
    /// Its refusal is in the audit log already (or cannot be: the audit's own refusal).
    pub(crate) audited: bool,
    /// Code refused for its size, as measured in the request (for the audit record).
    pub(crate) code: Option<Box<super::code::Measured>>,
    /// With `ApprovalPending`: the answer's body (`status`, `approval_id`, `command`,
    /// `programs`, `reason`).
    pub pending: Option<Box<serde_json::Value>>,
}

impl Error {
    pub fn new(kind: Kind, message: impl Into<String>) -> Error {
        Error {
            kind,
            message: message.into(),
            retry_after: None,
            field: None,
            audited: false,
            code: None,
            pending: None,
        }
    }

    pub fn invalid(message: impl Into<String>) -> Error {
        Error::new(Kind::InvalidRequest, message)
    }

    pub fn retry_after(mut self, seconds: u64) -> Error {
        self.retry_after = Some(seconds.max(1));
        self
    }

    /// About the request's field `key`.
    pub fn on(mut self, key: &'static str) -> Error {
        self.field = Some(key);
        self
    }

    /// The message, the field it is about named first as a request names it (``field
    /// `profile`: ...``) unless the message starts with the field's key already.
    pub fn in_field(mut self) -> Error {
        if let Some(field) = self.field {
            if !starts_with_word(&self.message, field) {
                self.message = format!("field `{field}`: {}", self.message);
            }
        }
        self
    }

    pub(crate) fn audited(mut self) -> Error {
        self.audited = true;
        self
    }

    /// The kind's wire name (`invalid_request`, `policy`, `not_found`, ...).
    pub fn kind(&self) -> &'static str {
        self.kind.name()
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    pub fn is_audited(&self) -> bool {
        self.audited
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.kind.name(), self.message)
    }
}

impl From<PolicyError> for Error {
    fn from(e: PolicyError) -> Error {
        let kind = match e {
            PolicyError::Invalid { .. } => Kind::InvalidRequest,
            PolicyError::AboveMax { .. } | PolicyError::Forbidden { .. } => Kind::Policy,
        };
        let mut error = Error::new(kind, e.to_string());
        error.field = e.field();
        error
    }
}

/// Whether `message` starts with the word `word` (then a space or a colon).
pub fn starts_with_word(message: &str, word: &str) -> bool {
    message
        .strip_prefix(word)
        .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with(':'))
}
