//! The gateway's package index: `pip install` in a sandbox asks it (PIP_INDEX_URL points
//! at the gateway's port 80), and it forwards only the projects the profile lists
//! (`python_packages`) to the index the host is configured with, rewriting every file link
//! to one of its own. A file is served only through a link of an allowed project's page,
//! so a program that builds a download URL itself gets nothing here, and the index's hosts
//! are not in `allowed_hosts`, so it gets nothing there either.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use codecage::network::Verdict;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use ipstack::IpStackTcpStream;

use super::log::Log;
use super::upstream::Upstream;

type Body = BoxBody<Bytes, hyper::Error>;

/// The most a project page may be (pages of big projects run to a few MiB).
const MAX_PAGE: usize = 32 << 20;

pub struct Index {
    /// PEP 503-normalized names.
    allowed: BTreeSet<String>,
    /// The upstream simple index, ending in `/`.
    upstream_index: String,
    /// The upstream URLs of the files the pages linked to, by link number.
    files: Mutex<Vec<String>>,
    upstream: Arc<Upstream>,
    log: Arc<Log>,
}

/// PEP 503: lowercase, runs of `-`, `_`, `.` as one `-`.
pub fn normalize(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            if !out.ends_with('-') {
                out.push('-');
            }
        } else {
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

fn text(status: StatusCode, body: String) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(body)).map_err(|e| match e {}).boxed());
    *response.status_mut() = status;
    response
}

impl Index {
    pub fn new(packages: &[String], index: &str, upstream: Arc<Upstream>, log: Arc<Log>) -> Index {
        let mut upstream_index = index.to_string();
        if !upstream_index.ends_with('/') {
            upstream_index.push('/');
        }
        Index {
            allowed: packages.iter().map(|p| normalize(p)).collect(),
            upstream_index,
            files: Mutex::new(Vec::new()),
            upstream,
            log,
        }
    }

    /// Serves HTTP/1.1 on one connection from the sandbox.
    pub async fn serve(self: Arc<Self>, flow: IpStackTcpStream) {
        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
            let index = self.clone();
            async move { Ok::<_, std::convert::Infallible>(index.handle(request).await) }
        });
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(flow), service)
            .await;
    }

    async fn handle(&self, request: Request<Incoming>) -> Response<Body> {
        let path = request.uri().path().to_string();
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        match parts.as_slice() {
            ["simple", project] => self.project(project).await,
            ["files", n, _name] => self.file(n).await,
            _ => text(
                StatusCode::NOT_FOUND,
                "codecage's package index serves /simple/PROJECT/ for the profile's python_packages\n".into(),
            ),
        }
    }

    async fn project(&self, asked: &str) -> Response<Body> {
        let name = normalize(asked);
        if !self.allowed.contains(&name) {
            let reason = format!(
                "the Python package {name} is not in the profile's python_packages: codecage's index answers 404"
            );
            self.log
                .record("pip", &name, 80, Verdict::Denied, Some(reason.clone()));
            return text(StatusCode::NOT_FOUND, format!("{reason}\n"));
        }
        let url = format!("{}{name}/", self.upstream_index);
        let page = match self.fetch(&url).await {
            Ok(response) if response.status() == StatusCode::OK => {
                match http_body_util::Limited::new(response.into_body(), MAX_PAGE)
                    .collect()
                    .await
                {
                    Ok(body) => body.to_bytes(),
                    Err(e) => return self.failed(&name, format!("reading {url}: {e}")),
                }
            }
            Ok(response) => {
                return self.failed(&name, format!("{url} answered {}", response.status()))
            }
            Err(e) => return self.failed(&name, e),
        };
        self.log.record("pip", &name, 80, Verdict::Allowed, None);
        let page = String::from_utf8_lossy(&page);
        let rewritten = self.rewrite(&page, &url);
        let mut response = text(StatusCode::OK, rewritten);
        response.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("text/html"),
        );
        response
    }

    fn failed(&self, name: &str, reason: String) -> Response<Body> {
        self.log
            .record("pip", name, 80, Verdict::Failed, Some(reason.clone()));
        text(StatusCode::BAD_GATEWAY, format!("{reason}\n"))
    }

    /// Every `href="..."` of the page becomes a link of the gateway's own, numbered.
    fn rewrite(&self, page: &str, base: &str) -> String {
        let mut out = String::with_capacity(page.len());
        let mut rest = page;
        while let Some(at) = rest.find("href=\"") {
            let (head, tail) = rest.split_at(at + 6);
            out.push_str(head);
            let Some(end) = tail.find('"') else {
                rest = tail;
                break;
            };
            let href = tail[..end].replace("&amp;", "&");
            let (link, fragment) = match href.split_once('#') {
                Some((l, f)) => (l.to_string(), format!("#{f}")),
                None => (href.clone(), String::new()),
            };
            let absolute = join(base, &link);
            let file_name = absolute
                .rsplit('/')
                .next()
                .unwrap_or("file")
                .split('?')
                .next()
                .unwrap_or("file")
                .to_string();
            let n = match self.files.lock() {
                Ok(mut files) => {
                    files.push(absolute);
                    files.len() - 1
                }
                Err(_) => 0,
            };
            out.push_str(&format!("/files/{n}/{file_name}{fragment}"));
            rest = &tail[end..];
        }
        out.push_str(rest);
        out
    }

    async fn file(&self, n: &str) -> Response<Body> {
        let url = n
            .parse::<usize>()
            .ok()
            .and_then(|n| self.files.lock().ok().and_then(|f| f.get(n).cloned()));
        let Some(url) = url else {
            return text(
                StatusCode::NOT_FOUND,
                "codecage's index serves only the files its project pages link to\n".into(),
            );
        };
        let name = url.rsplit('/').next().unwrap_or_default().to_string();
        match self.fetch(&url).await {
            Ok(response) => {
                let verdict = match response.status().is_success() {
                    true => Verdict::Allowed,
                    false => Verdict::Failed,
                };
                let bytes = self.log.record("pip", &name, 80, verdict, None);
                if let Some(len) = response
                    .headers()
                    .get(hyper::header::CONTENT_LENGTH)
                    .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
                {
                    bytes
                        .inn
                        .fetch_add(len, std::sync::atomic::Ordering::Relaxed);
                }
                response.map(|b| b.boxed())
            }
            Err(e) => self.failed(&name, e),
        }
    }

    /// GET `url` (http:// only) from the configured index.
    async fn fetch(&self, url: &str) -> Result<Response<Incoming>, String> {
        let rest = url.strip_prefix("http://").ok_or_else(|| {
            format!("{url}: the gateway's index forwards to http:// indexes only (https:// is not done yet)")
        })?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) => (h, p.parse::<u16>().map_err(|_| format!("{url}: bad port"))?),
            None => (authority, 80),
        };
        let addrs: Vec<std::net::IpAddr> = match host.parse() {
            Ok(ip) => vec![ip],
            Err(_) => self.upstream.resolve(host).await?,
        };
        let mut last = format!("{host} has no address");
        for ip in addrs {
            let stream = match self.upstream.connect((ip, port).into()).await {
                Ok(s) => s,
                Err(e) => {
                    last = format!("connecting to {ip} port {port}: {e}");
                    continue;
                }
            };
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(stream))
                    .await
                    .map_err(|e| format!("{url}: {e}"))?;
            tokio::spawn(connection);
            let request = Request::get(path)
                .header(hyper::header::HOST, authority)
                .header(hyper::header::ACCEPT, "text/html")
                .header(hyper::header::USER_AGENT, "codecage-gateway")
                .body(Full::new(Bytes::new()))
                .map_err(|e| e.to_string())?;
            return sender
                .send_request(request)
                .await
                .map_err(|e| format!("{url}: {e}"));
        }
        Err(last)
    }
}

/// `href` relative to the page at `base`.
fn join(base: &str, href: &str) -> String {
    if href.contains("://") {
        return href.to_string();
    }
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let origin_end = base[scheme_end..]
        .find('/')
        .map_or(base.len(), |i| scheme_end + i);
    let origin = &base[..origin_end];
    if let Some(absolute) = href.strip_prefix('/') {
        return format!("{origin}/{absolute}");
    }
    let dir = &base[origin_end..base.rfind('/').map_or(origin_end, |i| i.max(origin_end))];
    let mut segments: Vec<&str> = dir.split('/').filter(|s| !s.is_empty()).collect();
    for part in href.split('/') {
        match part {
            "." | "" => {}
            ".." => drop(segments.pop()),
            p => segments.push(p),
        }
    }
    format!("{origin}/{}", segments.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_normalize_as_pep_503_says() {
        assert_eq!(normalize("Foo.Bar__baz-1"), "foo-bar-baz-1");
        assert_eq!(normalize("requests"), "requests");
    }

    #[test]
    fn links_resolve_against_the_page() {
        let base = "http://index.test/simple/foo/";
        assert_eq!(
            join(base, "foo-1.whl"),
            "http://index.test/simple/foo/foo-1.whl"
        );
        assert_eq!(
            join(base, "../../packages/foo-1.whl"),
            "http://index.test/packages/foo-1.whl"
        );
        assert_eq!(join(base, "/p/foo-1.whl"), "http://index.test/p/foo-1.whl");
        assert_eq!(
            join(base, "https://files.test/foo-1.whl"),
            "https://files.test/foo-1.whl"
        );
    }
}
