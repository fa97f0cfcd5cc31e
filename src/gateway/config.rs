//! The host's settings for the gateway: `[network]` of the server's config and of the
//! CLI's host config (src/host_config.rs).

use std::path::PathBuf;

use serde::Deserialize;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GatewayConfig {
    /// Profiles may use network mode `full` (any public host, still no private ranges or
    /// cloud metadata).
    pub full: bool,
    /// Resolve names from this file (hosts(5) format, read at every lookup) and nowhere
    /// else, instead of the host's resolver. For tests.
    pub hosts_file: Option<PathBuf>,
    /// Open upstream connections from this network namespace (a file such as
    /// /run/netns/NAME) instead of the host's. For tests.
    pub dial_netns: Option<PathBuf>,
    /// The package index (PEP 503 simple API) that the gateway's index forwards allowed
    /// Python packages from, http:// or https://. Default https://pypi.org/simple/.
    pub python_index: Option<String>,
    /// The npm registry that the gateway's registry forwards allowed npm packages from,
    /// http:// or https://. Default https://registry.npmjs.org/.
    pub npm_registry: Option<String>,
    /// The CA certificates (PEM) the gateway trusts for https:// package indexes, instead
    /// of the host's (rustls-native-certs: SSL_CERT_FILE, else the distribution's bundle).
    /// For an internal mirror with its own CA, and for tests.
    pub index_ca_file: Option<PathBuf>,
}

impl GatewayConfig {
    pub fn python_index(&self) -> &str {
        self.python_index
            .as_deref()
            .unwrap_or("https://pypi.org/simple/")
    }

    pub fn npm_registry(&self) -> &str {
        self.npm_registry
            .as_deref()
            .unwrap_or("https://registry.npmjs.org/")
    }

    /// Checks the index URLs (http:// or https://, with a host) and the CA file.
    pub fn validate(&self) -> Result<(), String> {
        for (key, url) in [
            ("python_index", self.python_index()),
            ("npm_registry", self.npm_registry()),
        ] {
            super::client::Url::parse(url).map_err(|e| format!("network.{key}: {e}"))?;
        }
        if let Some(file) = &self.index_ca_file {
            if !file.is_file() {
                return Err(format!(
                    "network.index_ca_file: {} is not a file",
                    file.display()
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_urls_must_be_http_or_https_and_the_ca_file_must_exist() {
        let parse = |text: &str| toml::from_str::<GatewayConfig>(text).unwrap();
        let config = parse("");
        assert_eq!(config.python_index(), "https://pypi.org/simple/");
        assert_eq!(config.npm_registry(), "https://registry.npmjs.org/");
        assert!(config.validate().is_ok());
        let config = parse(
            "python_index = \"http://10.0.0.1:3141/root/pypi/+simple/\"\nnpm_registry = \"https://npm.internal/\"\n",
        );
        assert!(config.validate().is_ok());
        let err = parse("npm_registry = \"registry.npmjs.org\"\n")
            .validate()
            .unwrap_err();
        assert!(err.starts_with("network.npm_registry: "), "{err}");
        let err = parse("index_ca_file = \"/nonexistent/ca.pem\"\n")
            .validate()
            .unwrap_err();
        assert!(err.contains("index_ca_file"), "{err}");
    }
}
