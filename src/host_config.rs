//! The CLI's host configuration (/etc/codecage/config.toml, or `$CODECAGE_CONFIG`): what
//! the host's administrator allows every `codecage run`, and where it records them. The
//! server reads its own config (src/server/config.rs); both take the gateway's
//! `[network]` settings from src/gateway/config.rs.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::gateway::GatewayConfig;

/// Where the CLI reads the host's configuration.
pub const HOST_CONFIG: &str = "/etc/codecage/config.toml";

/// The CLI's host configuration: what the host's administrator allows every run.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HostConfig {
    pub network: GatewayConfig,
    /// `[audit]`: with this section, `codecage run` records each run in the audit log
    /// (the same database as the server's when the paths agree).
    pub audit: Option<crate::audit::AuditConfig>,
}

impl HostConfig {
    /// `$CODECAGE_CONFIG`, else /etc/codecage/config.toml; a missing default file is an
    /// empty config.
    pub fn load() -> Result<HostConfig, String> {
        let (path, explicit) = match std::env::var_os("CODECAGE_CONFIG") {
            Some(p) => (PathBuf::from(p), true),
            None => (PathBuf::from(HOST_CONFIG), false),
        };
        HostConfig::load_from(&path, explicit)
    }

    fn load_from(path: &Path, must_exist: bool) -> Result<HostConfig, String> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !must_exist => {
                return Ok(HostConfig::default())
            }
            Err(e) => {
                return Err(format!(
                    "cannot read the host config {}: {e}",
                    path.display()
                ))
            }
        };
        let config: HostConfig = toml::from_str(&text).map_err(|e| {
            format!(
                "host config {}: {}",
                path.display(),
                e.to_string().trim_end()
            )
        })?;
        config
            .network
            .validate()
            .map_err(|e| format!("host config {}: {e}", path.display()))?;
        if let Some(audit) = &config.audit {
            audit
                .validate()
                .map_err(|e| format!("host config {}: {e}", path.display()))?;
        }
        Ok(config)
    }
}
