//! The gateway's own HTTP client, for the package indexes: GET over http:// or https://
//! (rustls, the host's CA certificates or the file `index_ca_file` names), through the
//! gateway's upstream (its resolver and the namespace it dials from), one connection per
//! request, redirects followed with every hop's addresses judged again.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http_body_util::Empty;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::rustls;

use super::upstream::{Upstream, UPSTREAM_TIMEOUT};

/// How long an index may take to send a response's headers.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(60);
/// Redirects followed for one GET.
const MAX_REDIRECTS: usize = 5;

/// An http:// or https:// URL, as the gateway needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    pub https: bool,
    /// Lowercase; an IPv6 address without its brackets.
    pub host: String,
    pub port: u16,
    /// The path and query, starting with `/`.
    pub path: String,
}

impl Url {
    pub fn parse(text: &str) -> Result<Url, String> {
        let (https, rest) = if let Some(rest) = strip_prefix_ci(text, "https://") {
            (true, rest)
        } else if let Some(rest) = strip_prefix_ci(text, "http://") {
            (false, rest)
        } else {
            return Err(format!("{text:?} is not an http:// or https:// URL"));
        };
        let rest = rest.split('#').next().unwrap_or_default();
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) if rest[i..].starts_with('/') => (&rest[..i], rest[i..].to_string()),
            Some(i) => (&rest[..i], format!("/{}", &rest[i..])),
            None => (rest, "/".to_string()),
        };
        if authority.contains('@') {
            return Err(format!(
                "{text:?}: credentials in the URL are not supported"
            ));
        }
        let default_port = if https { 443 } else { 80 };
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (host, tail) = v6
                .split_once(']')
                .ok_or_else(|| format!("{text:?}: unclosed [ in the host"))?;
            let port = match tail.strip_prefix(':') {
                Some(p) => parse_port(text, p)?,
                None if tail.is_empty() => default_port,
                None => return Err(format!("{text:?}: bad host")),
            };
            (host.to_string(), port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), parse_port(text, p)?),
                None => (authority.to_string(), default_port),
            }
        };
        if host.is_empty() {
            return Err(format!("{text:?} has no host"));
        }
        Ok(Url {
            https,
            host: host.to_ascii_lowercase(),
            port,
            path,
        })
    }

    /// The Host header: the host, with the port when it is not the scheme's.
    pub fn authority(&self) -> String {
        let host = match self.host.contains(':') {
            true => format!("[{}]", self.host),
            false => self.host.clone(),
        };
        match self.port == if self.https { 443 } else { 80 } {
            true => host,
            false => format!("{host}:{}", self.port),
        }
    }

    /// The URL `location` (absolute, or relative to this one) names.
    pub fn join(&self, location: &str) -> Result<Url, String> {
        if super::packages::has_scheme(location) {
            return Url::parse(location);
        }
        let scheme = if self.https { "https" } else { "http" };
        if let Some(rest) = location.strip_prefix("//") {
            return Url::parse(&format!("{scheme}://{rest}"));
        }
        let base = format!("{scheme}://{}{}", self.authority(), self.path);
        Url::parse(&super::packages::join(&base, location))
    }
}

impl std::fmt::Display for Url {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = if self.https { "https" } else { "http" };
        write!(f, "{scheme}://{}{}", self.authority(), self.path)
    }
}

fn strip_prefix_ci<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    match text.get(..prefix.len()) {
        Some(head) if head.eq_ignore_ascii_case(prefix) => Some(&text[prefix.len()..]),
        _ => None,
    }
}

fn parse_port(text: &str, port: &str) -> Result<u16, String> {
    port.parse::<u16>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("{text:?}: {port:?} is not a port"))
}

/// Loads the CA certificates the client trusts: the PEM file, or the host's.
fn root_store(ca_file: Option<&PathBuf>) -> Result<rustls::RootCertStore, String> {
    use rustls::pki_types::{pem::PemObject, CertificateDer};
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => {
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
                .map_err(|e| format!("cannot read index_ca_file {}: {e}", path.display()))?
                .collect::<Result<_, _>>()
                .map_err(|e| format!("index_ca_file {}: {e}", path.display()))?;
            let (added, _) = roots.add_parsable_certificates(certs);
            if added == 0 {
                return Err(format!(
                    "index_ca_file {} holds no usable certificate",
                    path.display()
                ));
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(format!(
                    "the host has no CA certificates the gateway could load for https:// indexes ({}); \
                     install ca-certificates or name a PEM file with index_ca_file",
                    found
                        .errors
                        .first()
                        .map_or("none found".to_string(), |e| e.to_string())
                ));
            }
        }
    }
    Ok(roots)
}

/// Checks the addresses a request may go to: `Err(reason)` refuses one.
pub type Admit<'a> = &'a (dyn Fn(&Url, IpAddr) -> Result<(), String> + Send + Sync);

pub struct Client {
    upstream: Arc<Upstream>,
    ca_file: Option<PathBuf>,
    tls: OnceLock<Result<tokio_rustls::TlsConnector, String>>,
}

impl Client {
    pub fn new(upstream: Arc<Upstream>, ca_file: Option<PathBuf>) -> Client {
        Client {
            upstream,
            ca_file,
            tls: OnceLock::new(),
        }
    }

    /// The TLS connector, made at the first https:// request (loading the host's CA
    /// bundle takes a few milliseconds that a gateway serving only http:// need not spend).
    fn tls(&self) -> Result<tokio_rustls::TlsConnector, String> {
        self.tls
            .get_or_init(|| {
                let roots = root_store(self.ca_file.as_ref())?;
                let provider = Arc::new(rustls::crypto::ring::default_provider());
                let mut config = rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .map_err(|e| format!("TLS: {e}"))?
                    .with_root_certificates(roots)
                    .with_no_client_auth();
                config.alpn_protocols = vec![b"http/1.1".to_vec()];
                Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
            })
            .clone()
    }

    /// GET `url` with `accept`, following redirects; `admit` judges every address dialed.
    pub async fn get(
        &self,
        url: &Url,
        accept: &str,
        admit: Admit<'_>,
    ) -> Result<Response<Incoming>, String> {
        let mut url = url.clone();
        for _ in 0..=MAX_REDIRECTS {
            let response = self.get_once(&url, accept, admit).await?;
            if !response.status().is_redirection() {
                return Ok(response);
            }
            let Some(location) = response
                .headers()
                .get(hyper::header::LOCATION)
                .and_then(|l| l.to_str().ok())
            else {
                return Ok(response);
            };
            url = url
                .join(location)
                .map_err(|e| format!("{url} redirects to {location}: {e}"))?;
        }
        Err(format!("{url}: more than {MAX_REDIRECTS} redirects"))
    }

    async fn get_once(
        &self,
        url: &Url,
        accept: &str,
        admit: Admit<'_>,
    ) -> Result<Response<Incoming>, String> {
        let addrs: Vec<IpAddr> = match url.host.parse() {
            Ok(ip) => vec![ip],
            Err(_) => self.upstream.resolve(&url.host).await?,
        };
        let mut last = format!("{} has no address", url.host);
        for ip in addrs {
            if let Err(reason) = admit(url, ip) {
                last = reason;
                continue;
            }
            let tcp = match self.upstream.connect((ip, url.port).into()).await {
                Ok(s) => s,
                Err(e) => {
                    last = format!("{url}: connecting to {ip} port {}: {e}", url.port);
                    continue;
                }
            };
            if !url.https {
                return send(tcp, url, accept).await;
            }
            let connector = self.tls()?;
            let name = rustls::pki_types::ServerName::try_from(url.host.clone())
                .map_err(|e| format!("{url}: {e}"))?;
            let tls =
                match tokio::time::timeout(UPSTREAM_TIMEOUT, connector.connect(name, tcp)).await {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(e)) => {
                        let hint = match (e.to_string().contains("certificate"), &self.ca_file) {
                        (false, _) => String::new(),
                        (true, Some(file)) => {
                            format!(" (the gateway trusts the CAs of {})", file.display())
                        }
                        (true, None) => {
                            " (the gateway trusts the host's CAs, or the file index_ca_file names)"
                                .into()
                        }
                    };
                        return Err(format!("{url}: TLS: {e}{hint}"));
                    }
                    Err(_) => {
                        return Err(format!(
                            "{url}: the TLS handshake took longer than {UPSTREAM_TIMEOUT:?}"
                        ))
                    }
                };
            return send(tls, url, accept).await;
        }
        Err(last)
    }
}

/// Sends one GET on `stream` and returns the response; the connection is driven by a task
/// of its own until the body is read or dropped.
async fn send<S>(stream: S, url: &Url, accept: &str) -> Result<Response<Incoming>, String>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(stream))
            .await
            .map_err(|e| format!("{url}: {e}"))?;
    tokio::spawn(connection);
    let request = Request::get(url.path.as_str())
        .header(hyper::header::HOST, url.authority())
        .header(hyper::header::ACCEPT, accept)
        .header(hyper::header::USER_AGENT, "codecage-gateway")
        .body(Empty::new())
        .map_err(|e| format!("{url}: {e}"))?;
    match tokio::time::timeout(RESPONSE_TIMEOUT, sender.send_request(request)).await {
        Ok(result) => result.map_err(|e| format!("{url}: {e}")),
        Err(_) => Err(format!("{url}: no response within {RESPONSE_TIMEOUT:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_with_their_default_ports() {
        let u = Url::parse("https://PyPI.org/simple/").unwrap();
        assert_eq!(
            (u.https, u.host.as_str(), u.port, u.path.as_str()),
            (true, "pypi.org", 443, "/simple/")
        );
        assert_eq!(u.authority(), "pypi.org");
        let u = Url::parse("http://198.51.100.20:8080").unwrap();
        assert_eq!((u.port, u.path.as_str()), (8080, "/"));
        assert_eq!(u.authority(), "198.51.100.20:8080");
        let u = Url::parse("https://[2001:db8::1]:8443/x?y=1#frag").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str()),
            ("2001:db8::1", 8443, "/x?y=1")
        );
        assert_eq!(u.to_string(), "https://[2001:db8::1]:8443/x?y=1");
        for bad in [
            "ftp://x/",
            "https://",
            "http://a:0/",
            "http://u@a/",
            "pypi.org",
        ] {
            assert!(Url::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn redirects_resolve_against_the_url() {
        let u = Url::parse("https://index.test/simple/foo").unwrap();
        assert_eq!(
            u.join("/simple/foo/").unwrap().to_string(),
            "https://index.test/simple/foo/"
        );
        assert_eq!(
            u.join("//files.test/a.whl").unwrap().to_string(),
            "https://files.test/a.whl"
        );
        assert_eq!(
            u.join("http://other.test:81/b").unwrap().to_string(),
            "http://other.test:81/b"
        );
    }
}
